"""In-situ inference against today's shapes, side by side in one MPI job.

    mpirun -n 4 python scripts/bench_insitu.py --run-dir runs/heat --out bench_out/insitu.json

(``runs/heat``: the ensemble of examples/heat_insitu.py, docs/insitu.md.) Every simulation
rank holds ``n`` rows of its own and needs the ensemble's answer for them. Per-call latency
(the slowest rank's median over repeats, all ranks asking at once, as a simulation in
lockstep does) for ``n`` = 1 ... 4096 rows per rank, for:

- ``local``: ``insitu`` placement "local": every rank runs the whole ensemble itself;
- ``node``: placement "node": the node's first rank serves the other ranks (one batch per
  round; this job then has one simulation rank fewer);
- ``gather``: today's shape: gather the rows to rank 0, broadcast them, ``predict_arrays``
  over the ranks (members spread, sums reduced to rank 0), scatter the answers back;
- ``file``: write the rows to a file, rank 0 reads them all and predicts (its models
  already loaded: no process start, which a real offline predict also pays), writes the
  answers, every rank reads its own.

Then the example's overhead: one time step of examples/heat_insitu.py at its default size
(256x256 cells per rank, 256 patches of 16x16) against one call of each on its patches,
and that call spread over the example's default interval (a call every 20 steps).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from heat_insitu import GrayScott  # noqa: E402

from ensemble.inference import insitu  # noqa: E402
from ensemble.inference.combine import predict_arrays  # noqa: E402
from ensemble.inference.inputs import prepare_features  # noqa: E402

SIZES = (1, 16, 64, 256, 1024, 4096)


def timed(comm, call, reps: int) -> tuple[float, float]:
    """(median, best) seconds per call of the slowest rank, every rank calling at once. On a
    shared machine the median carries the other loads' waits; the best is the cost itself."""
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    got = comm.allgather((statistics.median(times), min(times)))
    return max(m for m, _ in got), max(b for _, b in got)


def interleaved(comm, calls: dict, reps: int) -> dict[str, tuple[float, float]]:
    """``timed`` for several calls taken in turn, round after round, so that each sees the
    same load on a shared machine (their ratios are then fair): name -> (median, best)."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(reps):
        for name, call in calls.items():
            comm.Barrier()
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    got = comm.allgather({k: (statistics.median(v), min(v)) for k, v in times.items()})
    return {k: (max(g[k][0] for g in got), max(g[k][1] for g in got)) for k in calls}


def gather_shape(run, comm, models: dict):
    """Today's shape: rows to rank 0, to every rank, ``predict_arrays`` over the ranks, scatter back."""
    def call(x):
        parts = comm.gather(prepare_features(run, x), root=0)
        whole = comm.bcast(np.concatenate(parts) if comm.Get_rank() == 0 else None, root=0)
        result = predict_arrays(run, whole, comm, models)
        if comm.Get_rank() == 0:
            bounds = np.cumsum([0, *(len(p) for p in parts)])
            pieces = [insitu.rows(result, a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        return comm.scatter(pieces if comm.Get_rank() == 0 else None, root=0)
    return call


def file_shape(run, comm, folder: Path, models: dict):
    """Offline: each rank writes its rows, rank 0 predicts on all of them, each reads its answer."""
    rank, size = comm.Get_rank(), comm.Get_size()

    def call(x):
        np.save(folder / f"in-{rank}.npy", x)
        comm.Barrier()
        if rank == 0:
            parts = [np.load(folder / f"in-{r}.npy") for r in range(size)]
            result = predict_arrays(run, prepare_features(run, np.concatenate(parts)), None, models)
            bounds = np.cumsum([0, *(len(p) for p in parts)])
            for r, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
                np.savez(folder / f"out-{r}.npz", **{k: v for k, v in insitu.rows(result, a, b).items()
                                                      if not isinstance(v, dict)})
        comm.Barrier()
        return dict(np.load(folder / f"out-{rank}.npz"))
    return call


def sample(run, n: int, rng) -> np.ndarray:
    """``n`` rows like the training data (its normalisation's mean and spread)."""
    return (run.shift.reshape(-1) + run.scale.reshape(-1) * rng.standard_normal((n, run.shift.size))).astype(np.float32)


def reps_for(n: int) -> int:
    return 20 if n <= 256 else 8 if n <= 1024 else 4


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", default="runs/heat")
    p.add_argument("--out", default="bench_out/insitu.json")
    p.add_argument("--local", type=int, default=256, help="the example's cells per rank along each axis")
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--every", type=int, default=20, help="the example's steps between two predictions")
    p.add_argument("--reps", type=int, default=30, help="rounds of the example's step and calls")
    args = p.parse_args()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    rng = np.random.default_rng(rank)
    latency: dict[str, dict[int, tuple[float, float]]] = {"local": {}, "node": {}, "gather": {}, "file": {}}
    example: dict[str, dict[str, tuple[float, float]]] = {}

    session = insitu.load(args.run_dir, world, "local")
    run, models = session.run, {}
    sim = GrayScott(world, args.local, args.patch, seed=5)
    for _ in range(200):                       # patterns under way, as in the example's run
        sim.step()
    feats = sim.features()
    folder = Path(world.bcast(tempfile.mkdtemp(prefix="bench_insitu") if rank == 0 else None, root=0))
    try:
        shapes = {"local": session.predict, "gather": gather_shape(run, world, models),
                  "file": file_shape(run, world, folder, models)}
        for call in shapes.values():
            call(feats)                             # the first call of each (models loaded) is not timed
        got = interleaved(world, {"step": sim.step, "features": sim.features,
                                  **{k: (lambda c=c: c(feats)) for k, c in shapes.items()}}, args.reps)
        for name in shapes:
            example[name] = {"step": got["step"], "features": got["features"], "call": got[name]}
        for name, call in shapes.items():
            for n in SIZES:
                x = sample(run, n, rng)
                latency[name][n] = timed(world, lambda c=call, x=x: c(x), reps_for(n))
        world.Barrier()
    finally:
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    session.close()

    node = insitu.load(args.run_dir, world, "node")
    if node.serving:
        node.serve()
    else:
        comm = node.comm
        sim = GrayScott(comm, args.local, args.patch, seed=5)
        for _ in range(200):
            sim.step()
        feats = sim.features()
        got = interleaved(comm, {"step": sim.step, "features": sim.features, "call": lambda: node.predict(feats)},
                          args.reps)
        example["node"] = got
        for n in SIZES:
            x = sample(run, n, rng)
            latency["node"][n] = timed(comm, lambda x=x: node.predict(x), reps_for(n))
        node.close()
    got = world.gather((latency, example), root=0)
    if rank == 0:
        latency["node"], example["node"] = got[1][0]["node"], got[1][1]["node"]
        report(args, world.Get_size(), latency, example, len(feats))


def report(args, ranks: int, latency: dict, example: dict, patches: int) -> None:
    names = ("local", "node", "gather", "file")
    for which, label in ((0, "median"), (1, "best")):
        print(f"\nper-call latency, ms, {label} (slowest rank; {ranks} ranks; node: 1 server + {ranks - 1} clients)")
        print("| rows per rank | " + " | ".join(names) + " |")
        print("|---:|" + "---:|" * len(names))
        for n in SIZES:
            print(f"| {n} | " + " | ".join(f"{1e3 * latency[k][n][which]:.2f}" for k in names) + " |")
    print(f"\nthe example ({args.local}x{args.local} cells, {patches} patches per rank): a time step, the "
          f"patches' features and one call, taken in turn (same load); node: on its {ranks - 1} simulation ranks")
    print(f"| shape | time step, ms | features, ms | call, ms | call / time step | call every {args.every} steps | "
          "with the features |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for which, label in ((0, "median"), (1, "best")):
        for k in names:
            e = example[k]
            step, feats, call = e["step"][which], e["features"][which], e["call"][which]
            every = args.every * step
            print(f"| {k}, {label} | {1e3 * step:.2f} | {1e3 * feats:.2f} | {1e3 * call:.2f} | "
                  f"{100 * call / step:.0f}% | {100 * call / every:.1f}% | {100 * (call + feats) / every:.1f}% |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "ranks": ranks, "load": os.getloadavg(),
                               "latency_s_median_best": latency, "example_s_median_best": example,
                               "patches_per_rank": patches, "every": args.every}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
