"""A run directory at 1,000, 10,000 and 100,000 members: files, bytes, master memory,
finalisation and resume.

    python scripts/bench_run_scale.py [--sizes 1000 10000 100000] [--ranks 3]

For each size: a real ``mpirun -n R python -m ensemble.run`` on the built-in digits data
(validation and test predictions of 270 x 10 per member) with rehearsal members
(``runtime.trainer = "rehearsal"``, 0 s, ``predictions = true``: every member makes
up digits-shaped predictions and scores them, as a trained one does, and sends them only
when it can enter the candidate set), the default retention (``ensemble.candidates`` 500,
``keep_models`` 100) and greedy selection; then the same run again with ``--resume``
(everything finished: the resume reads the state back, trains nothing and finalises
again). Prints per size: files in the run directory, bytes on disk, the journal's size,
peak resident memory of the master (rank 0's ``ru_maxrss``, all of the run), the
finalisation time (leaderboard, selection over the candidates, ensemble, pruning; from
ensemble.json), the resume's state-reading time (journal, store, kept sets; from the
journal's open line) and the resume job's wall time. The last columns are ratios against
the smallest size in the same sitting: a time that does not grow with the members stays
near 1x while the members grow 100x. "files before" is what the per-member layout that
retention replaced would have written for trained members (computed: model, two
prediction files, history and scaling per member, plus the run's own 7 files).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = """
name = "scale"
[[architectures]]
name = "m"
members = {members}
layers = [{{type = "Dense", units = 8}}]
[ensemble]
method = "greedy"
[runtime]
trainer = "rehearsal"
progress_seconds = 30
[rehearsal]
seconds = 0.0
predictions = true
accuracy = 0.85
"""


def child(argv: list[str]) -> int:
    """One rank of the run; rank 0 leaves its peak memory where the parent reads it."""
    from ensemble.run import main
    code = main(argv)
    from ensemble.runtime import mpi
    if mpi.world.Get_rank() == 0:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        Path(os.environ["BENCH_RSS_FILE"]).write_text(json.dumps({"peak_mb": peak_kb / 1024}))
    return code


def mpirun() -> str:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else "mpirun"


def launch(ranks: int, cfg: Path, run_dir: Path, rss: Path, resume: bool) -> tuple[float, float]:
    args = [mpirun(), "-n", str(ranks), sys.executable, __file__, "--child", str(cfg), "--run-dir", str(run_dir)]
    if resume:
        args.append("--resume")
    env = {**os.environ, "BENCH_RSS_FILE": str(rss), "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"run failed ({' '.join(args)}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, json.loads(rss.read_text())["peak_mb"]


def measure(members: int, ranks: int, base: Path) -> dict:
    from ensemble.results.journal import read_lines
    work = base / f"n{members}"
    work.mkdir(parents=True)
    cfg = work / "scale.toml"
    cfg.write_text(CONFIG.format(members=members))
    run_dir = work / "run"
    wall, peak = launch(ranks, cfg, run_dir, work / "rss.json", resume=False)
    summary = json.loads((run_dir / "ensemble.json").read_text())
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    row = {"members": members, "wall_s": wall, "files": len(files),
           "bytes": sum(p.stat().st_size for p in files),
           "journal_bytes": (run_dir / "journal.jsonl").stat().st_size,
           "store_bytes": summary["kept"]["store_bytes"], "candidates": summary["n_candidates"],
           "peak_mb": peak, "finalize_s": summary["run"]["finalize_seconds"],
           "selection_s": summary["run"]["selection_seconds"],
           "stored_in_run": sum(1 for x in read_lines(run_dir / "journal.jsonl") if x.get("stored")),
           "ensemble": len(summary["members"])}
    wall, peak = launch(ranks, cfg, run_dir, work / "rss2.json", resume=True)
    opened = [x for x in read_lines(run_dir / "journal.jsonl") if x.get("event") == "open"]
    again = json.loads((run_dir / "ensemble.json").read_text())
    assert again["members"] == summary["members"], "the resumed run chose another ensemble"
    row.update(resume_state_s=opened[-1]["resume_seconds"], resume_wall_s=wall, resume_peak_mb=peak,
               resume_finalize_s=again["run"]["finalize_seconds"])
    return row


def table(rows: list[dict]) -> str:
    base = rows[0]
    head = ("| members | files | files before | MB on disk | journal MB | stored (of members) | master peak MiB "
            "| finalise s | of which selection s | resume: state s | resume: job s | selection vs smallest "
            "| finalise vs smallest | resume state vs smallest |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['members']:,} | {r['files']} | {5 * r['members'] + 7:,} | {r['bytes'] / 1e6:.1f} "
            f"| {r['journal_bytes'] / 1e6:.1f} | {r['stored_in_run']:,} | {max(r['peak_mb'], r['resume_peak_mb']):.0f} "
            f"| {r['finalize_s']:.2f} | {r['selection_s']:.2f} | {r['resume_state_s']:.2f} | {r['resume_wall_s']:.1f} "
            f"| {r['selection_s'] / base['selection_s']:.1f}x | {r['finalize_s'] / base['finalize_s']:.1f}x "
            f"| {r['resume_state_s'] / max(base['resume_state_s'], 1e-3):.1f}x |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--ranks", type=int, default=3, help="mpirun -n (the master and R-1 workers)")
    p.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench_run_scale_"))
    rows = []
    try:
        for members in args.sizes:
            row = measure(members, args.ranks, base)
            rows.append(row)
            print(json.dumps(row), flush=True)
        print()
        print(table(rows))
    finally:
        if args.keep:
            print(f"run directories under {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
