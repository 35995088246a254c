"""The physical reference for scripts/bench_dispatch.py: plain mpi4py send/recv of the same
messages the run's master exchanges, with nothing else done per message.

    mpiexec -n P python scripts/pingpong.py MESSAGES.pkl COUNT IN_HAND OUT.json

Rank 0 sends every other rank IN_HAND spec messages, then for each result message it
receives (blocking ``comm.recv`` from any rank) sends that rank one more spec, COUNT
results in all; the workers answer every spec with the result message (a real journal
record), receiving politely (probe and sleep, as the run's workers). Rank 0 writes its
wall time, CPU time and CPU microseconds per exchanged pair to OUT.json.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path

from mpi4py import MPI

TAG_SPEC, TAG_RESULT, TAG_STOP = 11, 12, 13


def main() -> None:
    spec, result = pickle.loads(Path(sys.argv[1]).read_bytes())
    count, in_hand, out = int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    comm.Barrier()
    if rank == 0:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        sent = 0
        for _ in range(in_hand):
            for worker in range(1, size):
                comm.send(spec, dest=worker, tag=TAG_SPEC)
                sent += 1
        status = MPI.Status()
        for _ in range(count):
            comm.recv(source=MPI.ANY_SOURCE, tag=TAG_RESULT, status=status)
            if sent < count:
                comm.send(spec, dest=status.Get_source(), tag=TAG_SPEC)
                sent += 1
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        for worker in range(1, size):
            comm.send(None, dest=worker, tag=TAG_STOP)
        out.write_text(json.dumps({"ranks": size, "results": count, "wall_seconds": wall, "cpu_seconds": cpu,
                                   "per_second": count / wall, "cpu_us_per_result": 1e6 * cpu / count}))
    else:
        status = MPI.Status()
        while True:
            sleep = 1e-4
            while not comm.Iprobe(source=0, tag=MPI.ANY_TAG, status=status):
                time.sleep(sleep)
                sleep = min(2 * sleep, 0.05)
            comm.recv(source=0, tag=status.Get_tag())
            if status.Get_tag() == TAG_STOP:
                break
            comm.send(result, dest=0, tag=TAG_RESULT)
    comm.Barrier()


if __name__ == "__main__":
    main()
