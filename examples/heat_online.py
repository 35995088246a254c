"""Online training beside a running MPI simulation: the ensemble learns from the simulation
while it runs, and the simulation keeps high-resolution data only where the ensemble cannot
yet predict with confidence.

The Gray-Scott simulation of ``heat_insitu.py`` (domain-decomposed over the simulation's
ranks) and an ensemble run (mode "online") are two programs of one MPMD job:

    mpirun -n 2 python examples/heat_online.py --out runs/heat-online-sim \\
         : -n 3 python -m ensemble.run examples/heat_online.toml --run-dir runs/heat-online

Every ``--every`` steps each rank describes its patches (the eight features of
``heat_insitu``) and asks the newest published ensemble (``stream.ensemble()``) for the mean
of v ``HORIZON`` steps ahead. Patches it is unsure about (predicted std above
``--threshold``), and every patch before the first ensemble arrives, are written in full
resolution. ``HORIZON`` steps later the rank scores the forecast and sends the (features,
outcome) pairs to the ensemble (``stream.send``, never waiting), which trains new members
on them and publishes new generations. The log shows snapshots falling as the ensemble's
error and uncertainty fall. ``--alone``: the same simulation without the ensemble program
(``mpirun -n 2 python examples/heat_online.py --alone``, which writes no snapshots), for the
slowdown (``scripts/bench_online.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heat_insitu import HORIZON, GrayScott


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--local", type=int, default=256, help="grid cells per rank along each axis")
    p.add_argument("--patch", type=int, default=16, help="cells per patch along each axis")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--warm", type=int, default=100, help="steps before the first check")
    p.add_argument("--every", type=int, default=20, help="steps between two checks")
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--threshold", type=float, default=0.003,
                   help="predicted standard deviation of v above which a patch is kept in full (twice the "
                        "offline example's: members trained for minutes on a replay buffer are less sure "
                        "than an ensemble trained offline on 177,000 rows)")
    p.add_argument("--in-flight", type=int, default=4, help="sample messages per rank on their way")
    p.add_argument("--alone", action="store_true", help="no ensemble program: the simulation only")
    p.add_argument("--out", default="runs/heat-online-sim")
    args = p.parse_args(argv)
    stream = None
    if args.alone:
        comm = MPI.COMM_WORLD
    else:
        from ensemble.inference import online
        stream = online.connect(in_flight=args.in_flight)     # first, before any other collective
        comm = stream.comm
    from ensemble.runtime.mpi import abort_on_exception
    abort_on_exception()
    sim = GrayScott(comm, args.local, args.patch, args.seed)
    out = Path(args.out)
    snap_dir = out / "snapshots"
    if comm.Get_rank() == 0:
        snap_dir.mkdir(parents=True, exist_ok=True)
    comm.Barrier()
    log: list[dict] = []
    pending: dict[int, tuple] = {}          # step -> (features, mean, std, flagged, generation)
    step_time = check_time = 0.0
    sends = 0
    t_start = time.perf_counter()
    for t in range(args.steps + 1):
        t0 = time.perf_counter()
        if t in pending:                    # the outcome of a check HORIZON steps ago
            features, mean, std, flagged, _ = pending.pop(t)
            outcome = sim.patch_means_v()
            if stream is not None:
                stream.send(features, outcome)                # never waits
                sends += 1
            # collective on every rank, also one that had no ensemble yet (each rank loads its own)
            err = np.abs(outcome - mean) if mean is not None else np.zeros(0)
            scores = _scores(comm, err, std if std is not None else np.zeros(0), flagged if mean is not None else [])
            if scores is not None:
                next(r for r in log if r["step"] == t - HORIZON).update(scores)
        if t >= args.warm and t % args.every == 0:
            features = sim.features()
            ens = stream.ensemble() if stream is not None else None
            generation = stream.generation if stream is not None else 0
            if ens is not None:
                mean, std = ens.predict_mean_spread(features)
                flagged = np.flatnonzero(std > args.threshold)
            else:                           # nothing can be predicted yet: keep everything
                mean = std = None
                flagged = np.arange(len(features))
            if len(flagged) and not args.alone:             # alone: the simulation's cost only
                np.savez(snap_dir / f"step{t:06d}-rank{comm.Get_rank():04d}.npz", step=t, patches=flagged,
                         fields=np.stack([sim.patch_cells(i) for i in flagged]))
            pending[t + HORIZON] = (features, mean, std, flagged, generation)
            counts = comm.allreduce(np.array([len(flagged), len(features)]))
            gens = comm.allgather(generation)
            log.append({"step": t, "generation": min(gens), "snapshots": int(counts[0]),
                        "patches": int(counts[1]), "seconds": round(time.perf_counter() - t_start, 2)})
        check_time += time.perf_counter() - t0
        t0 = time.perf_counter()
        sim.step()
        step_time += time.perf_counter() - t0
    wall = time.perf_counter() - t_start
    stats = stream.close() if stream is not None else None
    report(comm, args, log, step_time, check_time, wall, stats, sends)


def _scores(comm, err: np.ndarray, std: np.ndarray, flagged) -> dict | None:
    """Mean absolute error and mean predicted std over the patches forecast on every rank
    (none on a rank without an ensemble yet); None when no rank had one."""
    sums = comm.allreduce(np.array([err.sum(), len(err), std.sum()]))
    return None if sums[1] == 0 else {"mae": sums[0] / sums[1], "mean_std": sums[2] / sums[1]}


def report(comm, args, log: list[dict], step_time: float, check_time: float, wall: float, stats,
           sends: int) -> None:
    """Rank 0: the table (snapshots, generation, error, uncertainty against time), the
    stream's account, and ``<out>/online.json``."""
    mine = {"step_s": step_time / (args.steps + 1), "wall_s": wall, "check_s": check_time,
            "send_s": stats.send_seconds if stats else 0.0, "sends": sends,
            "sent": stats.sent if stats else 0, "dropped": stats.dropped if stats else 0,
            "dropped_remote": stats.dropped_remote if stats else 0,
            "latencies": stats.latencies if stats else [], "loaded": stats.loaded if stats else [],
            "load_s": stats.load_seconds if stats else [], "failures": stats.failures if stats else []}
    every = comm.gather(mine, root=0)
    if comm.Get_rank() != 0:
        return
    out = Path(args.out)
    print(f"{'step':>6} {'s':>7} {'gen':>4} {'snapshots':>10} {'of':>6} {'mean std':>9} {'MAE':>8}")
    for r in log:
        extra = f"{r['mean_std']:9.4f} {r['mae']:8.4f}" if "mae" in r else ""
        print(f"{r['step']:>6} {r['seconds']:>7.1f} {r['generation']:>4} {r['snapshots']:>10} {r['patches']:>6} "
              f"{extra}")
    taken, total = sum(r["snapshots"] for r in log), sum(r["patches"] for r in log)
    step_s = max(m["step_s"] for m in every)
    print(f"{taken} of {total} patches written in full resolution ({100 * taken / max(total, 1):.1f}%); "
          f"time step {1e3 * step_s:.2f} ms (slowest rank), wall {max(m['wall_s'] for m in every):.1f} s")
    if not args.alone:
        lat = [x for m in every for x in m["latencies"]]
        sent, dropped = sum(m["sent"] for m in every), sum(m["dropped"] + m["dropped_remote"] for m in every)
        print(f"streamed {sent} samples, dropped {dropped}; generations loaded on rank 0: {every[0]['loaded']}; "
              f"sample -> published ensemble that trained on it: "
              + (f"median {np.median(lat):.1f} s, min {min(lat):.1f} s (n={len(lat)})" if lat else "none measured"))
        for m in every:
            for f in m["failures"]:
                print(f"note: {f}")
    (out / "online.json").write_text(json.dumps({"log": log, "ranks": every, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
