"""Online training's cost, measured: the simulation alone, then the same simulation with an
ensemble training beside it (one MPMD job), and the time from a sample leaving the
simulation to a published ensemble that trained on it.

    python scripts/bench_online.py --sim-ranks 2 --ensemble-ranks 3 --steps 4000

runs, in turn (the example of docs/insitu.md, examples/heat_online.py):

1. ``mpiexec -n S python examples/heat_online.py --alone``: the simulation only;
2. ``mpiexec -n S python examples/heat_online.py : -n E python -m ensemble.run
   examples/heat_online.toml``: with online training (a fresh seed file and run directory
   under ``--out``).

and prints: the time step (the slowest rank's mean of ``GrayScott.step``, the simulation's
own work) and the wall time per step (with the checks: features, ``send``, ``ensemble()``,
the prediction and the snapshots), alone and coupled, and their ratios (the slowdown);
``send``'s own cost per call; the samples streamed and dropped; and the latency from a
sample's ``send`` to the announcement, on the same rank, of a published ensemble whose
members trained on it (every generation the rank loaded, so the first one includes the
ensemble program's start-up: TensorFlow's import and the first members). The table is
markdown, with the date and the command, for docs/insitu.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from scripts.benchkit import mpiexec  # noqa: E402


def run(cmd: list[str], timeout: float) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    print(out.stdout[-1500:], flush=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sim-ranks", type=int, default=2)
    p.add_argument("--ensemble-ranks", type=int, default=3)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--out", default="bench_out/online")
    p.add_argument("--timeout", type=float, default=1800)
    a = p.parse_args(argv)
    out = (ROOT / a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    py, sim = sys.executable, str(ROOT / "examples" / "heat_online.py")
    config = (ROOT / "examples" / "heat_online.toml").read_text()
    seed = out / "seed.npz"
    seed.unlink(missing_ok=True)
    lines = [line if not line.startswith("source =") else f'source = "{seed}"' for line in config.splitlines()]
    (out / "heat_online.toml").write_text("\n".join(lines) + "\n")
    common = ["--steps", str(a.steps)]
    alone_s = run([mpiexec(), "-n", str(a.sim_ranks), py, sim, "--alone", *common, "--out", str(out / "alone")],
                  a.timeout)
    coupled_s = run([mpiexec(), "-n", str(a.sim_ranks), py, sim, *common, "--out", str(out / "coupled"), ":",
                     "-n", str(a.ensemble_ranks), py, "-m", "ensemble.run", str(out / "heat_online.toml"),
                     "--run-dir", str(out / "run"), "--overwrite"], a.timeout)
    alone = json.loads((out / "alone" / "online.json").read_text())
    coupled = json.loads((out / "coupled" / "online.json").read_text())
    summary = json.loads((out / "run" / "ensemble.json").read_text())

    def per_step(res: dict, key: str) -> float:
        return max(r[key] for r in res["ranks"]) / (key == "wall_s" and a.steps + 1 or 1)

    step_alone, step_coupled = per_step(alone, "step_s"), per_step(coupled, "step_s")
    wall_alone, wall_coupled = per_step(alone, "wall_s"), per_step(coupled, "wall_s")
    ranks = coupled["ranks"]
    send_ms = 1e3 * max(r["send_s"] / max(r["sends"], 1) for r in ranks)
    lat = sorted(x for r in ranks for x in r["latencies"])
    sent = sum(r["sent"] for r in ranks)
    dropped = sum(r["dropped"] for r in ranks)
    dropped_remote = sum(r["dropped_remote"] for r in ranks)
    log = coupled["log"]
    scored = [r for r in log if "mae" in r]
    first_gen = next((r for r in log if r["generation"] > 0), None)
    date = datetime.date.today().isoformat()
    cmd = (f"python scripts/bench_online.py --sim-ranks {a.sim_ranks} --ensemble-ranks {a.ensemble_ranks} "
           f"--steps {a.steps}")
    table = [
        f"Measured {date} on {platform.machine()} ({len(os.sched_getaffinity(0))} cores, no GPU; load average "
        f"{os.getloadavg()[0]:.0f} at the end), `{cmd}`: {a.sim_ranks} simulation ranks (256x256 cells "
        f"each, 256 patches), {a.ensemble_ranks} ensemble ranks (master + {a.ensemble_ranks - 1} workers).",
        "",
        "| | alone | with online training | ratio |",
        "|---|---:|---:|---:|",
        f"| time step, ms (slowest rank) | {1e3 * step_alone:.2f} | {1e3 * step_coupled:.2f} | "
        f"{step_coupled / step_alone:.2f} |",
        f"| wall per step with the checks, ms | {1e3 * wall_alone:.2f} | {1e3 * wall_coupled:.2f} | "
        f"{wall_coupled / wall_alone:.2f} |",
        f"| job, s | {alone_s:.0f} | {coupled_s:.0f} | |",
        "",
        f"- `send`: {send_ms:.3f} ms per call (mean, slowest rank); {sent} samples streamed, {dropped} dropped on "
        f"the simulation side (window full), {dropped_remote} by the ensemble side;",
        f"- generations published: {summary['online']['generation']} (the last at the end); loaded by rank 0: "
        f"{ranks[0]['loaded']}; first used at step {first_gen['step'] if first_gen else '-'} "
        f"({first_gen['seconds'] if first_gen else '-'} s into the simulation);",
        "- sample -> published ensemble trained on it (s, every loaded generation on every rank): "
        + (f"first {lat[0]:.1f}, median {float(np.median(lat)):.1f}, max {lat[-1]:.1f} (n = {len(lat)})"
           if lat else "none measured"),
    ]
    if scored:
        head, tail = scored[: max(1, len(scored) // 5)], scored[-max(1, len(scored) // 5):]
        table.append(f"- the ensemble's forecast error (MAE of v) and mean predicted std, first fifth of the "
                     f"scored checks -> last fifth: {np.mean([r['mae'] for r in head]):.4f} -> "
                     f"{np.mean([r['mae'] for r in tail]):.4f}, {np.mean([r['mean_std'] for r in head]):.4f} -> "
                     f"{np.mean([r['mean_std'] for r in tail]):.4f}; patches written in full: "
                     f"{sum(r['snapshots'] for r in log)} of {sum(r['patches'] for r in log)}")
    table += ["", "Per generation in use (rank 0's view at each check; 0: no ensemble yet, every patch written):", "",
              "| generation | from step | checks | patches written | MAE of v | mean predicted std |",
              "|---:|---:|---:|---:|---:|---:|"]
    for g in sorted({r["generation"] for r in log}):
        rows = [r for r in log if r["generation"] == g]
        sc = [r for r in rows if "mae" in r]
        share = sum(r["snapshots"] for r in rows) / max(sum(r["patches"] for r in rows), 1)
        table.append(f"| {g} | {rows[0]['step']} | {len(rows)} | {100 * share:.0f}% | "
                     + (f"{np.mean([r['mae'] for r in sc]):.4f} | {np.mean([r['mean_std'] for r in sc]):.4f} |"
                        if sc else "- | - |"))
    text = "\n".join(table)
    print(text)
    (out / "bench_online.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
