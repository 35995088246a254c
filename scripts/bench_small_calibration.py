"""Coverage of the regression intervals on a small table, measured on fresh rows.

    python scripts/bench_small_calibration.py [--seeds 1 2 3 4 5] [--keep DIR] [--write]

A 150-row heteroscedastic table (6 features, two of them irrelevant: y = 2 x0 + sin(2 x1) +
x2 x3 + noise of spread 0.2 + |x0|) trained as the README's config trains one (8 MLPs of 64
units, 30 epochs, `mpirun -n 3`), one run per split seed; its validation split holds 23 rows,
too few to keep some for the calibration alone (``task.calibration.holdout_rows``). Each
run's ensemble predicts 3,000 fresh rows of the same generator; the observed coverage of its
50/80/90/95% intervals is printed for the default calibration ("auto"), for none and for
conformal fitted as asked on those 23 rows (the same run re-selected with
``ensemble.calibration`` "none" and "conformal"), per seed and as the mean.
``--write`` puts the table, dated, in docs/ensembles.md. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import mpiexec, workspace, write_block  # noqa: E402

LEVELS = (50, 80, 90, 95)
#: beside the default: no calibration, and conformal fitted as asked on the rows that also stopped training
OTHERS = ("none", "conformal")
ROWS, FRESH = 150, 3000


def table(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of the generator (features, target)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6))
    mean = 2 * x[:, 0] + np.sin(2 * x[:, 1]) + x[:, 2] * x[:, 3]
    return x, mean + (0.2 + np.abs(x[:, 0])) * rng.normal(size=n)


def coverage(run: Path, x: np.ndarray, y: np.ndarray) -> list[float]:
    from ensemble import load
    out = load(run).predict_details(x.astype(np.float32))
    return [float(np.mean(np.abs(y - out["mean"]) <= out["intervals"][str(level)])) for level in LEVELS]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--keep", help="keep the runs in this folder")
    p.add_argument("--write", action="store_true", help="write the table into docs/ensembles.md")
    args = p.parse_args()
    import pandas as pd

    from ensemble.reselect import reselect
    rows = []
    with workspace(args.keep, "small_calibration_") as work:
        x, y = table(ROWS, 0)
        frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(6)])
        frame["target"] = y
        frame.to_csv(work / "table.csv", index=False)
        fresh_x, fresh_y = table(FRESH, 123)
        for seed in args.seeds:
            cfg = work / f"s{seed}.toml"
            cfg.write_text(textwrap.dedent(f"""
                name = "s{seed}"
                seed = {seed}
                output_dir = "{work / 'runs'}"
                [data]
                source = "table.csv"
                label = "target"
                [train]
                epochs = 30
                [[architectures]]
                name = "mlp"
                members = 8
                layers = [{{type = "Dense", units = 64, activation = "relu"}}, {{type = "Dropout", rate = 0.1}}]
            """))
            run = work / "runs" / f"s{seed}"
            shutil.rmtree(run, ignore_errors=True)
            proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-m", "ensemble.run", str(cfg),
                                   "--run-dir", str(run)], capture_output=True, text=True, timeout=900)
            if proc.returncode:
                raise SystemExit(f"seed {seed}: the run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
            got = [coverage(run, fresh_x, fresh_y)]
            for other in OTHERS:
                copy = run.with_name(f"s{seed}-{other}")
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(run, copy)
                reselect(copy, {"calibration": other})
                got.append(coverage(copy, fresh_x, fresh_y))
            rows.append((seed, got))
            print(f"seed {seed}: " + "   ".join(f"{name} " + " ".join(f"{v:.3f}" for v in g)
                                                for name, g in zip(("auto", *OTHERS), got)), flush=True)
    names = ("auto", *OTHERS)
    head = "| seed | " + " | ".join(f"{name} {lv}%" for name in names for lv in LEVELS) + " |"
    lines = [head, "|" + "---|" * (1 + len(names) * len(LEVELS))]
    lines += [f"| {seed} | " + " | ".join(f"{v:.3f}" for g in got for v in g) + " |" for seed, got in rows]
    means = np.mean([[v for g in got for v in g] for _, got in rows], axis=0)
    lines.append("| mean | " + " | ".join(f"{v:.3f}" for v in means) + " |")
    text = (f"Measured {datetime.date.today().isoformat()} (`python scripts/bench_small_calibration.py --write`; "
            f"{FRESH:,} fresh rows per seed):\n\n" + "\n".join(lines))
    print(text)
    if args.write:
        write_block(ROOT / "docs" / "ensembles.md", "small-calibration", text)


if __name__ == "__main__":
    main()
