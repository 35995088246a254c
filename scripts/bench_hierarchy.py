"""Does a master hierarchy (``runtime.sub_masters``) raise the top master's results per second?

    python scripts/bench_hierarchy.py [--ranks 17 33] [--subs 2 4] [--members 6000] [--seconds 0.002] [--repeats 2]
        [--write docs/scale.md]

For each rank count, real ``python -m ensemble.run`` jobs with rehearsal members (no
TensorFlow, no predictions) of ``--seconds`` (log-normal spread 0.3): one flat (one master,
P-1 workers) and one per number of sub-masters (P-1-S workers), in alternating order,
``--repeats`` times. From each run's journal: the results per second the top master took in
once every worker had started ("steady/s", as ``bench_dispatch.steady_rate``), the top
master's CPU microseconds per result and the busiest sub-master's (the journal's close
event; in mode ensemble each sub-master runs its own share, so the top only coordinates). The ratio of each
hierarchy to the flat run of the same pair is the figure (medians over the pairs); a noisy
machine shifts both sides of a pair alike. On this 2-core machine every rank is
oversubscribed, so this measures what a sub-master takes off the top master, not the
throughput of thousands of nodes (docs/scale.md: the simulator's model of that).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_dispatch import steady_rate  # noqa: E402
from benchkit import mpiexec, workspace, write_block  # noqa: E402

CONFIG = """
name = "bench-hierarchy"
[[architectures]]
name = "short"
members = {members}
layers = [{{type = "Dense", units = 8}}]
[runtime]
trainer = "rehearsal"
sub_masters = {subs}
progress_seconds = 1e9
[rehearsal]
seconds = {seconds}
spread = 0.3
predictions = false
"""


def run(ranks: int, subs: int, members: int, seconds: float, tmp: Path, tag: str) -> dict:
    cfg = tmp / f"h_{ranks}_{subs}_{tag}.toml"
    cfg.write_text(CONFIG.format(members=members, seconds=seconds, subs=subs))
    run_dir = tmp / f"run_{ranks}_{subs}_{tag}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, "-m", "ensemble.run", str(cfg),
                          "--run-dir", str(run_dir), "--overwrite"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=1800)
    if out.returncode:
        raise SystemExit(f"ensemble.run -n {ranks} sub_masters={subs} failed:\n{out.stderr[-3000:]}")
    stats = json.loads((run_dir / "ensemble.json").read_text())["run"]
    from ensemble.results.rundir import RunDirectory
    closed = [e.data for e in RunDirectory(run_dir).records()[1] if e.kind.value == "close"][-1]
    shares = closed.get("shares") or []
    return {"ranks": ranks, "subs": subs, "workers": stats["workers"], "members": stats["members"],
            "steady": steady_rate(run_dir), "per_second": stats["members_per_second"],
            "cpu_us": stats["master_cpu_us_per_result"], "busy": stats["master_busy_share"],
            "sub_cpu_us": max((1e6 * x["master_cpu_seconds"] / max(x["results"], 1) for x in shares), default=None),
            "sub_busy": stats.get("sub_master_busy_share")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[17, 33])
    p.add_argument("--subs", type=int, nargs="+", default=[2, 4])
    p.add_argument("--members", type=int, default=6000)
    p.add_argument("--seconds", type=float, default=0.002)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--keep", help="keep the runs in this folder")
    p.add_argument("--write", metavar="PAGE", help="write the table into PAGE between its bench_hierarchy marks")
    args = p.parse_args()
    rows = []
    with workspace(args.keep, "bench_hierarchy_") as tmp:
        for ranks in args.ranks:
            for rep in range(args.repeats):
                order = [0, *args.subs] if rep % 2 == 0 else [*args.subs, 0]
                got = {subs: run(ranks, subs, args.members, args.seconds, tmp, str(rep)) for subs in order}
                for subs in args.subs:
                    flat, hier = got[0], got[subs]
                    rows.append({**hier, "flat_steady": flat["steady"], "flat_cpu_us": flat["cpu_us"],
                                 "flat_workers": flat["workers"], "steady_ratio": hier["steady"] / flat["steady"],
                                 "cpu_ratio": hier["cpu_us"] / flat["cpu_us"]})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = [f"Recorded {time.strftime('%Y-%m-%d')}: {args.members} rehearsal members of {args.seconds:g} s "
           f"(spread 0.3), medians of {args.repeats} pairs, on {os.cpu_count()} cores:", "", "```bash",
           "python scripts/bench_hierarchy.py --ranks " + " ".join(map(str, args.ranks)) + " --subs "
           + " ".join(map(str, args.subs)) + f" --members {args.members} --seconds {args.seconds:g} "
           f"--repeats {args.repeats}" + (f" --write {args.write}" if args.write else ""), "```", ""]
    out.append("| ranks | sub-masters | workers (flat) | flat results/s | hierarchy results/s | ratio | "
               "flat master CPU us/result | top master CPU us/result | busiest sub-master CPU us/result |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for ranks in args.ranks:
        for subs in args.subs:
            mine = [r for r in rows if r["ranks"] == ranks and r["subs"] == subs]
            med = {k: statistics.median(r[k] for r in mine) for k in
                   ("flat_steady", "steady", "steady_ratio", "flat_cpu_us", "cpu_us")}
            sub = [r["sub_cpu_us"] for r in mine if r["sub_cpu_us"] is not None]
            busiest = f"{statistics.median(sub):.0f}" if sub else "-"
            out.append(f"| {ranks} | {subs} | {mine[0]['workers']} ({mine[0]['flat_workers']}) | "
                       f"{med['flat_steady']:.0f} | {med['steady']:.0f} | {med['steady_ratio']:.2f}x | "
                       f"{med['flat_cpu_us']:.0f} | {med['cpu_us']:.1f} | {busiest} |")
    print("\n".join(out))
    if args.write:
        write_block(Path(args.write), "bench_hierarchy", "\n".join(out))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
