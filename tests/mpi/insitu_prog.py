"""MPI program behind tests/mpi/test_insitu_mpi.py: ``mpiexec -n K python insitu_prog.py OUT RUN...``.

For each placement ("node" with one server per node, then "local"): first a missing run
directory, on which every rank must raise the same PredictError (none waits); then for each
RUN: load it in-situ, and on each simulation rank ask three time steps about its own rows
(a different count per rank and step, a seed per rank); each rank writes its inputs and
answers to OUT/<placement>-<run>-<sim rank>-<step>.npz, its graph's tracing count and (a
server) what it served to OUT/<placement>-<run>-w<world rank>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mpi4py import MPI

from ensemble.inference import insitu
from ensemble.inference.load import PredictError

world = MPI.COMM_WORLD
out, runs = Path(sys.argv[1]), sys.argv[2:]


def one(placement: str, run_dir: Path, missing: str) -> None:
    session = insitu.load(run_dir, world, placement, servers_per_node=1, buckets=(16, 64, 256),
                           batch_wait=30.0)                # the server waits for all its clients
    info = {"missing": missing, "serving": session.serving, "traces_at_load": session.traces}
    if session.serving:
        stats = session.serve()
        info.update(batches=stats.batches, requests=stats.requests, rows=stats.rows,
                    largest_batch=stats.largest_batch)
    else:
        rank = session.comm.Get_rank()
        rng = np.random.default_rng(100 + rank)
        width = int(np.prod(session.run.input_shape))
        with session:
            for step in range(3):
                x = rng.normal(2.0, 3.0, size=(1 + 13 * rank + 40 * step, width)).astype(np.float32)
                got = session.predict(x)
                flat = {f"{k}.{kk}": vv for k, v in got.items() if isinstance(v, dict) for kk, vv in v.items()}
                flat.update({k: v for k, v in got.items() if not isinstance(v, dict)})
                np.savez(out / f"{placement}-{run_dir.name}-{rank}-{step}.npz", x=x, **flat)
        info.update(sim_rank=rank, sim_size=session.comm.Get_size(), calls=session.timings.calls)
    info["traces"] = session.traces
    info["tensorflow"] = "tensorflow" in sys.modules
    (out / f"{placement}-{run_dir.name}-w{world.Get_rank()}.json").write_text(json.dumps(info))


for placement in ("node", "local"):          # "node" first: its clients never import TensorFlow
    try:
        insitu.load(out / "no-such-run", world, placement)
        missing = "loaded"
    except PredictError as exc:
        missing = str(exc)
    for run_dir in map(Path, runs):
        one(placement, run_dir, missing)
