"""Population-based training against the same members trained independently, in one
invocation: ``configs/digits_pbt.toml`` (or ``--config``) run twice per seed, with its
``[pbt]`` exploit rule and with ``exploit = "none"``. Both start from the same population
(the seed draws the same initial learning rates and batch sizes) and train the same total
epochs on the same ranks; the only difference is copying and exploring between rounds.

    python scripts/bench_pbt.py --seeds 1 2 3 --np 5

Prints, per seed and on average, the best member's validation and test accuracy (and the
ensemble's) for both, and writes ``bench_pbt.json`` beside the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from benchkit import mpiexec, workspace  # noqa: E402

from ensemble.results.records import MemberRecord  # noqa: E402


def variant(text: str, seed: int, exploit: str | None) -> str:
    text = re.sub(r"(?m)^seed = \d+", f"seed = {seed}", text)
    if exploit is not None:
        text = re.sub(r'(?m)^exploit = "[a-z]+"', f'exploit = "{exploit}"', text)
    return text


def run(config: Path, run_dir: Path, n: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, "-m", "ensemble.run", str(config),
                           "--run-dir", str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{config} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "ensemble.json").read_text())
    metric = summary["metric"]
    records = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    members = [r for r in records if "event" not in r and MemberRecord.from_json(r).ok]
    best = max(members, key=lambda r: r["val"][metric])
    return {"wall_seconds": round(wall, 1), "members": len(members), "best_id": best["id"],
            "best_val": best["val"][metric], "best_test": best["test"][metric],
            "ensemble_test": summary["ensemble"]["test"][metric],
            "copies": summary.get("pbt", {}).get("copies"), "metric": metric}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "digits_pbt.toml"))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--np", type=int, default=5, help="ranks (the master and np-1 members)")
    p.add_argument("--keep", help="folder to keep the runs in (default: a temporary one, removed)")
    args = p.parse_args()
    text = Path(args.config).read_text()
    rule = re.search(r'(?m)^exploit = "([a-z]+)"', text)
    rule = rule.group(1) if rule else "truncation"
    rows = []
    with workspace(args.keep, "bench_pbt_") as folder:
        for seed in args.seeds:
            for name, exploit in ((rule, None), ("none", "none")):
                cfg = folder / f"pbt_{name}_{seed}.toml"
                cfg.write_text(variant(text, seed, exploit))
                out = run(cfg, folder / f"run_{name}_{seed}", args.np)
                rows.append({"seed": seed, "exploit": name, **out})
                print(f"seed {seed} exploit {name:10s} best {out['best_id']}: val {out['best_val']:.4f} "
                      f"test {out['best_test']:.4f}  ensemble test {out['ensemble_test']:.4f}  "
                      f"copies {out['copies']}  ({out['wall_seconds']:.0f} s)", flush=True)
        metric = rows[0]["metric"]
        print(f"\nmean over seeds {args.seeds}, {args.np - 1} members, {metric}:")
        print(f"{'':28s}{'best val':>10s}{'best test':>11s}{'ensemble':>10s}{'wall s':>8s}")
        means = {}
        for name in (rule, "none"):
            mine = [r for r in rows if r["exploit"] == name]
            means[name] = {k: statistics.mean(r[k] for r in mine)
                           for k in ("best_val", "best_test", "ensemble_test", "wall_seconds")}
            label = f"pbt ({name})" if name != "none" else "independent (exploit none)"
            m = means[name]
            print(f"{label:28s}{m['best_val']:10.4f}{m['best_test']:11.4f}{m['ensemble_test']:10.4f}"
                  f"{m['wall_seconds']:8.1f}")
        wins = sum(1 for s in args.seeds
                   if next(r for r in rows if r["seed"] == s and r["exploit"] == rule)["best_val"]
                   > next(r for r in rows if r["seed"] == s and r["exploit"] == "none")["best_val"])
        print(f"pbt's best member beats the independent best on validation in {wins} of {len(args.seeds)} seeds; "
              f"wall time ratio pbt/independent {means[rule]['wall_seconds'] / means['none']['wall_seconds']:.2f}")
        (folder / "bench_pbt.json").write_text(json.dumps({"rows": rows, "means": means}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
