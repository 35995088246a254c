"""What early discarding and weight inheritance buy the search, measured side by side in one
invocation: the same evolve config and seed run with the same wall-time budget as it is,
with ``discard = "asha"``, with ``inherit = true``, and with both.

    python scripts/bench_search_speedups.py --budget 60 --np 4

For each arm: evaluations done (and how many were discarded or inherited), the best
validation accuracy, the time (from the job's launch) to reach the plain search's final
best, and the best member's and the ensemble's test accuracy. Arms run one after another
on the same cores; run it twice to see the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from benchkit import mpiexec, workspace  # noqa: E402

from ensemble.results.records import MemberRecord, Status  # noqa: E402

ARMS = {"plain": {}, "asha": {"discard": '"asha"'}, "inherit": {"inherit": "true"},
        "asha+inherit": {"discard": '"asha"', "inherit": "true"}}


def variant(text: str, budget: float, settings: dict) -> str:
    """The config with the time budget, many evaluations, and the arm's [evolve] settings."""
    text = re.sub(r"(?m)^(evaluations|time_limit|discard|inherit)\s*=.*\n", "", text)
    extra = "".join(f"{k} = {v}\n" for k, v in {"evaluations": 100000, "time_limit": budget, **settings}.items())
    return text.replace("[evolve]\n", "[evolve]\n" + extra, 1)


def run(config: Path, run_dir: Path, n: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    launched = time.time()
    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, "-m", "ensemble.run", str(config),
                           "--run-dir", str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{config} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    done = [r for r in records if "event" not in r and MemberRecord.from_json(r).status.evaluated]
    curve, best = [], -1.0
    for r in sorted(done, key=lambda r: r["received"]):
        if MemberRecord.from_json(r).ok:
            best = max(best, r["val"]["accuracy"])
        curve.append((r["received"] - launched, best))
    summary = json.loads((run_dir / "ensemble.json").read_text())
    return {"evaluations": len(done),
            "discarded": sum(MemberRecord.from_json(r).status is Status.DISCARDED for r in done),
            "inherited": sum(bool((r.get("inherited") or {}).get("layers")) for r in done),
            "best_val": best, "curve": curve, "best_test": summary["best_member"]["test"]["accuracy"],
            "ensemble_test": summary["ensemble"]["test"]["accuracy"]}


def reached(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, best in curve if best >= target - 1e-12), None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "digits_evolve.toml"))
    p.add_argument("--budget", type=float, default=60.0, help="seconds of search per arm (evolve.time_limit)")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--keep", help="folder to keep the runs in")
    args = p.parse_args()
    text = Path(args.config).read_text()
    out = {}
    with workspace(args.keep, "bench_search_") as folder:
        for arm in args.arms.split(","):
            cfg = folder / f"{arm.replace('+', '_')}.toml"
            cfg.write_text(variant(text, args.budget, ARMS[arm]))
            out[arm] = run(cfg, folder / f"run_{arm.replace('+', '_')}", args.np)
            r = out[arm]
            print(f"{arm:14s} {r['evaluations']:4d} evaluations ({r['discarded']} discarded, {r['inherited']} "
                  f"inherited), best val {r['best_val']:.4f}, best test {r['best_test']:.4f}, ensemble test "
                  f"{r['ensemble_test']:.4f}", flush=True)
        target = out[next(iter(out))]["best_val"]
        base = next(iter(out))
        print(f"\ntime from launch to the {base!r} arm's final best validation accuracy {target:.4f}:")
        for arm, r in out.items():
            t = reached(r["curve"], target)
            print(f"  {arm:14s} {'not reached' if t is None else f'{t:6.1f} s'}")
        (folder / "bench_search_speedups.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
