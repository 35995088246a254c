"""In-situ inference in a running MPI simulation: keep high-resolution data only where the
ensemble is unsure.

A 2-D reaction-diffusion simulation (Gray-Scott: two species, u and v, that react and
diffuse; patterns grow, split and spread, so a region's future is easy to predict in some
places and hard in others) runs domain-decomposed on a Cartesian grid of MPI ranks with a
one-cell halo. Each rank's block is cut into square patches. Every ``--every`` steps every
rank describes its patches by eight numbers (means, spreads, extremes, the local diffusion
and the neighbours' v) and asks an ensemble, on its own rank (``ensemble.inference.insitu``),
for the mean of v in that patch ``HORIZON`` steps ahead, with its uncertainty. Patches whose
predictive standard deviation is above ``--threshold`` are written in full resolution;
everything else is kept only as the ensemble's summary. ``HORIZON`` steps later each rank
scores the forecast it made, so the log shows how the uncertainty tracks the error.

Three commands (see docs/insitu.md):

    # 1. simulate once (another seed) and keep (patch features, v HORIZON steps later)
    mpirun -n 4 python examples/heat_insitu.py collect --out runs/heat-data/patches.npz
    # 2. train an ensemble on it, offline
    mpirun -n 3 python -m ensemble.run examples/heat_insitu.toml --run-dir runs/heat
    # 3. the simulation with the ensemble inside it
    mpirun -n 4 python examples/heat_insitu.py run --run-dir runs/heat --out runs/heat-insitu

The simulation itself (``GrayScott``) is plain numpy + mpi4py; ``scripts/bench_insitu.py``
times it with and without the ensemble.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: diffusion of u and v, feed and kill rates: spots that grow and split until they fill the domain
DU, DV, FEED, KILL = 0.16, 0.08, 0.0367, 0.0649
#: steps between a patch's features and the value the ensemble predicts for it
HORIZON = 40
FEATURES = ("mean_u", "mean_v", "std_u", "std_v", "max_v", "min_u", "diffusion_v", "neighbours_v")


class GrayScott:
    """One rank's block of a periodic 2-D Gray-Scott simulation on a Cartesian communicator."""

    def __init__(self, comm, local: int = 256, patch: int = 16, seed: int = 0):
        if local % patch:
            raise SystemExit(f"--local {local} must be a multiple of --patch {patch}")
        dims = MPI.Compute_dims(comm.Get_size(), 2)
        self.cart = comm.Create_cart(dims, periods=[True, True], reorder=False)
        self.coords = self.cart.Get_coords(self.cart.Get_rank())
        self.local, self.patch = local, patch
        self.uv = np.zeros((2, local + 2, local + 2))
        self.uv[0] = 1.0
        rng = np.random.default_rng([seed, self.cart.Get_rank()])
        for _ in range(max(1, local * local // 1024)):          # random seeds of v
            y, x = rng.integers(1, local - 8, size=2)
            w = int(rng.integers(3, 9))
            self.uv[0, y:y + w, x:x + w], self.uv[1, y:y + w, x:x + w] = 0.5, 0.25
        self.uv[:, 1:-1, 1:-1] += 0.02 * rng.random((2, local, local))
        self._up, self._down = self.cart.Shift(0, 1)
        self._left, self._right = self.cart.Shift(1, 1)

    def exchange(self) -> None:
        """The one-cell halo of both fields from the four neighbours (periodic)."""
        a, c = self.uv, self.cart
        recv = np.empty((2, self.local + 2))
        c.Sendrecv(np.ascontiguousarray(a[:, 1, :]), self._up, 0, recv, self._down, 0)
        a[:, -1, :] = recv
        c.Sendrecv(np.ascontiguousarray(a[:, -2, :]), self._down, 1, recv, self._up, 1)
        a[:, 0, :] = recv
        c.Sendrecv(np.ascontiguousarray(a[:, :, 1]), self._left, 2, recv, self._right, 2)
        a[:, :, -1] = recv
        c.Sendrecv(np.ascontiguousarray(a[:, :, -2]), self._right, 3, recv, self._left, 3)
        a[:, :, 0] = recv

    def step(self) -> None:
        """One explicit Euler step (dt = 1) after a halo exchange."""
        self.exchange()
        a = self.uv
        core = a[:, 1:-1, 1:-1]
        lap = a[:, :-2, 1:-1] + a[:, 2:, 1:-1] + a[:, 1:-1, :-2] + a[:, 1:-1, 2:] - 4 * core
        u, v = core[0], core[1]
        uvv = u * v * v
        u += DU * lap[0] - uvv + FEED * (1 - u)
        v += DV * lap[1] + uvv - (FEED + KILL) * v

    def _patches(self, field: np.ndarray) -> np.ndarray:
        """``field`` (local, local) as (rows, p, cols, p): reduce over axes (1, 3) for per-patch values."""
        n, p = self.local // self.patch, self.patch
        return field.reshape(n, p, n, p)

    def patch_means_v(self) -> np.ndarray:
        """The mean of v in every patch, (patches,)."""
        return self._patches(np.ascontiguousarray(self.uv[1, 1:-1, 1:-1])).mean(axis=(1, 3)).reshape(-1)

    def features(self) -> np.ndarray:
        """Eight numbers per patch (``FEATURES``), (patches, 8) float32."""
        self.exchange()
        a = self.uv
        u, v = np.ascontiguousarray(a[0, 1:-1, 1:-1]), np.ascontiguousarray(a[1, 1:-1, 1:-1])
        lap_v = a[1, :-2, 1:-1] + a[1, 2:, 1:-1] + a[1, 1:-1, :-2] + a[1, 1:-1, 2:] - 4 * v
        pu, pv = self._patches(u), self._patches(v)
        mean_u, mean_v = pu.mean(axis=(1, 3)), pv.mean(axis=(1, 3))
        std_u = np.sqrt(np.maximum(self._patches(u * u).mean(axis=(1, 3)) - mean_u ** 2, 0.0))
        std_v = np.sqrt(np.maximum(self._patches(v * v).mean(axis=(1, 3)) - mean_v ** 2, 0.0))
        padded = np.pad(mean_v, 1, mode="edge")                  # the rank's edge patches repeat
        neighbours = (padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]) / 4
        cols = [mean_u, mean_v, std_u, std_v, pv.max(axis=(1, 3)), pu.min(axis=(1, 3)),
                self._patches(lap_v).mean(axis=(1, 3)), neighbours]
        return np.stack([c.reshape(-1) for c in cols], axis=1).astype(np.float32)

    def patch_cells(self, index: int) -> np.ndarray:
        """Patch ``index`` of both fields in full resolution, (2, p, p) float32."""
        n, p = self.local // self.patch, self.patch
        r, c = divmod(index, n)
        return self.uv[:, 1 + r * p:1 + (r + 1) * p, 1 + c * p:1 + (c + 1) * p].astype(np.float32)


def collect(args) -> None:
    """Simulate and keep (features, mean v ``HORIZON`` steps later) every ``--every`` steps."""
    world = MPI.COMM_WORLD
    sim = GrayScott(world, args.local, args.patch, args.seed)
    xs, ys, pending = [], [], {}
    for t in range(args.steps + 1):
        if t >= args.warm and t % args.every == 0:
            pending[t + HORIZON] = sim.features()
        if t in pending:
            xs.append(pending.pop(t))
            ys.append(sim.patch_means_v())
        sim.step()
    x = world.gather(np.concatenate(xs), root=0)
    y = world.gather(np.concatenate(ys), root=0)
    if world.Get_rank() == 0:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        np.savez(out, x=np.concatenate(x), y=np.concatenate(y).astype(np.float32))
        print(f"wrote {sum(len(a) for a in x)} patch samples ({len(FEATURES)} features) to {out}")


def run(args) -> None:
    """The simulation with the ensemble inside: snapshots of the patches it is unsure about."""
    from ensemble.inference import insitu
    world = MPI.COMM_WORLD
    session = insitu.load(args.run_dir, world, args.placement, servers_per_node=args.servers_per_node)
    if session.serving:                       # placement "node": this rank answers its node's ranks
        stats = session.serve()
        print(f"[server {world.Get_rank()}] {stats.requests} requests in {stats.batches} batches", flush=True)
        return
    comm = session.comm
    sim = GrayScott(comm, args.local, args.patch, args.seed)
    snap_dir = Path(args.out) / "snapshots"
    if comm.Get_rank() == 0:
        snap_dir.mkdir(parents=True, exist_ok=True)
    comm.Barrier()
    log, forecasts = [], {}
    step_time = feature_time = 0.0
    with session:
        for t in range(args.steps + 1):
            if t in forecasts:                # score the forecast made HORIZON steps ago
                mean, std, flagged = forecasts.pop(t)
                err = np.abs(sim.patch_means_v() - mean)
                row = next(r for r in log if r["step"] == t - HORIZON)
                row.update(_scores(comm, err, std, flagged))
            if t >= args.warm and t % args.every == 0:
                t0 = time.perf_counter()
                features = sim.features()
                feature_time += time.perf_counter() - t0
                mean, std = session.predict_mean_spread(features)        # timed in session.timings
                flagged = np.flatnonzero(std > args.threshold)
                if len(flagged):
                    np.savez(snap_dir / f"step{t:06d}-rank{comm.Get_rank():04d}.npz", step=t,
                             coords=np.array(sim.coords), patches=flagged,
                             fields=np.stack([sim.patch_cells(i) for i in flagged]))
                forecasts[t + HORIZON] = (mean, std, flagged)
                counts = comm.allreduce(np.array([len(flagged), len(std)]))
                log.append({"step": t, "snapshots": int(counts[0]), "patches": int(counts[1])})
            t0 = time.perf_counter()
            sim.step()
            step_time += time.perf_counter() - t0
    _report(comm, args, log, step_time, feature_time, session.timings.seconds)


def _scores(comm, err: np.ndarray, std: np.ndarray, flagged: np.ndarray) -> dict:
    """Mean absolute error over all patches, the flagged and the others; mean predicted std."""
    mask = np.zeros(len(err), bool)
    mask[flagged] = True
    sums = comm.allreduce(np.array([err.sum(), len(err), err[mask].sum(), mask.sum(), err[~mask].sum(),
                                    (~mask).sum(), std.sum()]))
    return {"mae": sums[0] / sums[1], "mae_flagged": sums[2] / max(sums[3], 1),
            "mae_unflagged": sums[4] / max(sums[5], 1), "mean_std": sums[6] / sums[1]}


def _report(comm, args, log: list[dict], step_time: float, feature_time: float, infer_time: float) -> None:
    """Rank 0 prints the table and the slowest rank's times, writes snapshots.json and the plot."""
    times = comm.gather((step_time, feature_time, infer_time), root=0)
    if comm.Get_rank() != 0:
        return
    step_s = max(t[0] for t in times) / (args.steps + 1)
    feature_s, infer_s = (max(t[i] for t in times) / max(len(log), 1) for i in (1, 2))
    out = Path(args.out)
    (out / "snapshots.json").write_text(json.dumps({"log": log, "step_s": step_s, "inference_s": infer_s,
                                                    "features_s": feature_s,
                                                    "every": args.every, "threshold": args.threshold}, indent=1))
    print(f"{'step':>6} {'snapshots':>10} {'of':>6} {'mean std':>9} {'MAE':>8} {'MAE flagged':>12} "
          f"{'MAE others':>11}")
    for r in log:
        extra = (f"{r['mean_std']:9.4f} {r['mae']:8.4f} {r['mae_flagged']:12.4f} {r['mae_unflagged']:11.4f}"
                 if "mae" in r else "")
        print(f"{r['step']:>6} {r['snapshots']:>10} {r['patches']:>6} {extra}")
    taken = sum(r["snapshots"] for r in log)
    total = sum(r["patches"] for r in log)
    print(f"{taken} of {total} patches written in full resolution ({100 * taken / max(total, 1):.1f}%); "
          f"time step {1e3 * step_s:.2f} ms; every {args.every} steps the patches' features "
          f"{1e3 * feature_s:.2f} ms and the in-situ inference {1e3 * infer_s:.2f} ms "
          f"({100 * infer_s / (args.every * step_s):.1f}% of the simulation's time; with the features "
          f"{100 * (infer_s + feature_s) / (args.every * step_s):.1f}%)")
    _plot(out, log)


def _plot(out: Path, log: list[dict]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.plot([r["step"] for r in log], [r["snapshots"] for r in log], marker=".")
    a.set(xlabel="time step", ylabel="patches", title="patches written in full resolution")
    scored = [r for r in log if "mae" in r]
    for key, label in (("mae_flagged", "error, flagged patches"), ("mae_unflagged", "error, other patches"),
                       ("mean_std", "mean predicted std")):
        b.plot([r["step"] for r in scored], [r[key] for r in scored], label=label)
    b.set(xlabel="time step (of the forecast)", yscale="log",
          title=f"|forecast - outcome| of v, {HORIZON} steps ahead")
    b.legend()
    fig.tight_layout()
    fig.savefig(out / "snapshots.png", dpi=90)
    print(f"plot: {out / 'snapshots.png'}")


def main(argv: list[str] | None = None) -> None:
    from ensemble.runtime.mpi import abort_on_exception
    abort_on_exception()                 # an error on one rank ends the job, never a hang in a halo exchange
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("collect", "run"))
    p.add_argument("--local", type=int, default=256, help="grid cells per rank along each axis")
    p.add_argument("--patch", type=int, default=16, help="cells per patch along each axis")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warm", type=int, default=100, help="steps before the first prediction")
    p.add_argument("--every", type=int, default=20, help="steps between two predictions")
    p.add_argument("--seed", type=int, default=None, help="default: 1 for collect, 2 for run")
    p.add_argument("--out", default=None)
    p.add_argument("--run-dir", help="the trained run (command run)")
    p.add_argument("--placement", default="local", choices=("local", "node"))
    p.add_argument("--servers-per-node", type=int, default=1)
    p.add_argument("--threshold", type=float, default=0.0015,
                   help="predicted standard deviation of v above which a patch is kept in full")
    args = p.parse_args(argv)
    if args.steps < args.warm + HORIZON:             # said on every rank before any exchange: no abort
        p.error(f"--steps {args.steps} leaves no prediction: it needs at least --warm ({args.warm}) + "
                f"{HORIZON} steps (the forecast's horizon)")
    if args.command == "collect":
        args.seed = 1 if args.seed is None else args.seed
        args.every = min(args.every, 5)
        args.out = args.out or "runs/heat-data/patches.npz"
        collect(args)
    else:
        if not args.run_dir:
            p.error("run needs --run-dir (a run trained on `collect`'s data)")
        args.seed = 2 if args.seed is None else args.seed
        args.out = args.out or "runs/heat-insitu"
        run(args)


if __name__ == "__main__":
    main()
