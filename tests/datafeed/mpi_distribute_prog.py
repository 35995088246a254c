"""MPI program behind tests/datafeed/test_distribute.py; run it under mpiexec.

Every rank checks what it received and prints one line ``RESULT {json}``. On an
error that broadcast_arrays raised (collectively), each rank prints the message and
the program exits with status 3 after a barrier.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mpi4py import MPI

from datafeed.distribute import broadcast_arrays


def expected_arrays(npy: str | None, mmap: bool) -> dict[str, np.ndarray]:
    """The same arrays on every rank (seeded); root passes them, others compare."""
    rng = np.random.default_rng(7)
    arrays = {
        "f32_2d": rng.standard_normal((37, 13)).astype(np.float32),
        "i64_1d": rng.integers(-2**40, 2**40, size=101, dtype=np.int64),
        "u8_4d": rng.integers(0, 256, size=(2, 3, 4, 5), dtype=np.uint8),
        "empty": np.zeros((0, 7), np.float64),
        "fortran": np.asfortranarray(rng.standard_normal((5, 6))),
        "strided_be": np.arange(90, dtype=">i2")[::3].reshape(5, 6),
        "scalar": np.array(3.5, np.float16),
    }
    if npy:
        arrays["memmap"] = np.load(npy, mmap_mode="r" if mmap else None)
    return arrays


def mapping_of(address: int) -> str:
    """'dev inode path' of the memory mapping holding ``address`` (identifies the backing memory)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return " ".join(fields[3:6])
    return "?"


def fail(comm: MPI.Intracomm, exc: Exception) -> None:
    print("RESULT " + json.dumps({"rank": comm.rank, "error": f"{type(exc).__name__}: {exc}"}),
          flush=True)
    comm.Barrier()
    sys.exit(3)


def case_data(comm: MPI.Intracomm, args: argparse.Namespace) -> dict:
    want = expected_arrays(args.npy, mmap=comm.rank == 0)
    try:
        shared = broadcast_arrays(comm, want if comm.rank == 0 else None, chunk_bytes=args.chunk_bytes,
                                  pretend_nodes=args.pretend, verify=args.verify)
    except (RuntimeError, ValueError) as exc:
        fail(comm, exc)
    with shared:
        assert list(shared) == list(want), (list(shared), list(want))
        for name, ref in want.items():
            got = shared[name]
            assert got.dtype == ref.dtype and got.shape == ref.shape, (name, got.dtype, got.shape)
            assert np.array_equal(got, ref), name
            assert got.flags.c_contiguous and not got.flags.writeable, name
            try:
                got[...] = 0
                raise AssertionError(f"{name}: write did not raise")
            except ValueError:
                pass
            if got.size:
                try:
                    got.flags.writeable = True
                    raise AssertionError(f"{name}: writeable flag could be set again")
                except ValueError:
                    pass
        node = shared.node_comm
        address = shared["u8_4d"].__array_interface__["data"][0]
        # Each node leader writes a marker through the window; its ranks must see it.
        leader = node.bcast(comm.rank, root=0)
        comm.Barrier()
        if node.rank == 0:
            offset = address - shared._buf.address
            np.frombuffer(shared._buf, np.uint8, 1, offset)[0] = (leader + 1) % 256
        comm.Barrier()
        marker = int(shared["u8_4d"].flat[0])
        comm.Barrier()
        return {"rank": comm.rank, "node_rank": node.rank, "node_size": node.size, "leader": leader,
                "marker": marker, "address": address, "mapping": mapping_of(address),
                "nbytes": shared.nbytes, "names": list(shared)}


def case_big(comm: MPI.Intracomm, args: argparse.Namespace) -> dict:
    n = int(args.gib * 2**30)
    arrays = None
    if comm.rank == 0:
        big = np.empty(n, np.uint8)
        period = (np.arange(251 * 2**16) % 251).astype(np.uint8)  # big[i] == i % 251
        for lo in range(0, n, period.size):
            hi = min(lo + period.size, n)
            big[lo:hi] = period[:hi - lo]
        arrays = {"head": np.arange(10, dtype=np.int32), "big": big}
    comm.Barrier()
    t0 = time.perf_counter()
    shared = broadcast_arrays(comm, arrays, pretend_nodes=args.pretend, verify=args.verify,
                              chunk_bytes=args.chunk_bytes)
    seconds = time.perf_counter() - t0
    got = shared["big"]
    rng = np.random.default_rng(comm.rank)
    idx = np.concatenate([rng.integers(0, n, 10_000), np.arange(n - 2**20, n),
                          np.arange(2**31 - 4096, min(2**31 + 4096, n))])
    assert got.shape == (n,) and np.array_equal(got[idx], idx % 251)
    assert np.array_equal(shared["head"], np.arange(10))
    del arrays
    # No free(): the window must survive until MPI finalizes without trouble.
    return {"rank": comm.rank, "n": n, "seconds": seconds, "node_size": shared.node_comm.size,
            "mapping": mapping_of(got.__array_interface__["data"][0])}


def case_bad_input(comm: MPI.Intracomm, args: argparse.Namespace) -> dict:
    arrays = {"ok": np.zeros(3), "objects": np.array([object(), 1], dtype=object)}
    try:
        broadcast_arrays(comm, arrays if comm.rank == 0 else None)
    except ValueError as exc:
        fail(comm, exc)
    raise AssertionError("bad input was accepted")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["data", "big", "bad-input"])
    parser.add_argument("--chunk-bytes", type=int, default=256 * 2**20)
    parser.add_argument("--pretend", type=int, default=None)
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--npy", default=None)
    parser.add_argument("--gib", type=float, default=2.2)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    cases = {"data": case_data, "big": case_big, "bad-input": case_bad_input}
    result = cases[args.case](comm, args)
    result["pid"] = os.getpid()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
