"""What reusing a worker's traced training step buys (``runtime.traced_models``), and tracing
the next one ahead (``runtime.pretrace``), in real runs.

    python scripts/bench_traced.py [--reps 3] [--ranks 2] [--write docs/scale.md]

For each workload, real ``mpiexec -n R python -m ensemble.run`` runs of its two sides, in
alternating order, ``--reps`` pairs in one sitting (this machine is shared: a pair's two runs
see the same load). ``demo`` and ``short`` compare ``runtime.traced_models = 0`` (every
member traces its train and test steps) with the default (a worker's next member of the same
architecture trains on its kept model); ``search`` compares ``runtime.pretrace`` off and on
(the next candidate traced in a background thread while one trains; both with
``specs_in_hand = 2``, so that the worker holds the next candidate). Per run, from the
journal: the mean seconds a member took (its ``train_seconds``: build, epochs, prediction,
writing), its first epoch's (where tracing is),
and the run's members per second (first start to last end). Reported: the median and range
over pairs of off/on, and whether the two runs' ensembles are the same (they must be: a
member on a kept model ends bit for bit as on a new one).

Memory (``--memory N``): N small members of one architecture trained one after the other
in one process (``train.member.run_member``, as a worker does), with ``traced_models`` 2
and 0, each in a fresh process; the process's resident memory after 10, N/2 and N members.

Workloads: ``demo``, the README's ``configs/digits.toml`` (4 MLP and 4 CNN members, up to 40
epochs); ``short``, the same data with 24 members of its CNN at 8 epochs (short members, as
at the largest scale, where a fixed cost per member weighs most); ``search``, the README's
``configs/digits_evolve.toml`` (regularized evolution over convolutional and dense networks)
for 24 candidates of at most 8 epochs. At ``-n 2`` the master leaves a core mostly idle,
as a GPU leaves its host's cores: the background trace has a core to run on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from benchkit import mpiexec, workspace, write_block  # noqa: E402

from ensemble.config import load_config  # noqa: E402
from ensemble.config.schema import dump_toml  # noqa: E402
from ensemble.results.journal import read_journal  # noqa: E402
from ensemble.results.records import MemberRecord  # noqa: E402

#: workload -> its sides' [runtime] settings (off, on)
SIDES = {"demo": ({"traced_models": 0}, {}), "short": ({"traced_models": 0}, {}),
         "search": ({"pretrace": False, "specs_in_hand": 2}, {"pretrace": True, "specs_in_hand": 2})}


def workload(name: str, run_root: Path) -> dict:
    """The config (as a dict) of workload ``name``."""
    cfg = load_config(ROOT / "configs" / ("digits_evolve.toml" if name == "search" else "digits.toml")).to_dict()
    cfg["output_dir"] = str(run_root)
    if name == "short":
        cnn = next(a for a in cfg["architectures"] if a["name"] == "cnn")
        cfg["architectures"] = [{**cnn, "members": 24}]
        cfg["train"]["epochs"] = 8
    if name == "search":
        cfg["evolve"]["evaluations"] = 24
        cfg["train"]["epochs"] = 8
    return cfg


def run(cfg: dict, name: str, side: str, ranks: int, folder: Path) -> dict:
    cfg = json.loads(json.dumps(cfg))
    cfg.setdefault("runtime", {}).update(SIDES[name][side == "on"])
    path = folder / f"{side}.toml"
    path.write_text(dump_toml(cfg))
    run_dir = folder / f"run_{side}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    started = time.monotonic()
    out = subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, "-m", "ensemble.run", str(path),
                          "--run-dir", str(run_dir), "--overwrite"], capture_output=True, text=True, env=env,
                         timeout=1800)
    if out.returncode:
        raise SystemExit(f"ensemble.run failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    records = [r for r in read_journal(run_dir / "journal.jsonl") if MemberRecord.from_json(r).ok]
    ensemble = json.loads((run_dir / "ensemble.json").read_text())
    span = max(r["ended"] for r in records) - min(r["started"] for r in records)
    return {"members": len(records), "wall": time.monotonic() - started,
            "member_s": statistics.mean(r["train_seconds"] for r in records),
            "first_epoch_s": statistics.mean(r["costs"]["first_epoch"] for r in records),
            "reused": sum(MemberRecord.from_json(r).reused_trace for r in records),
            "per_second": len(records) / span,
            "selected": [(m["id"], m["weight"]) for m in ensemble["members"]], "ensemble": ensemble["ensemble"],
            "results": sorted((r["id"], r["epochs"], json.dumps(r["val"]), json.dumps(r["test"])) for r in records)}


MEMORY_CHILD = """
import os, sys
sys.path.insert(0, {root!r})
from ensemble.runtime.env import configure_tensorflow
configure_tensorflow(1, traced_models={kept})
from ensemble.results.rundir import RunDirectory
from ensemble.train.member import run_member
from tests.ensemble.test_traced import make_data, spec
data, meta = make_data("classification")
marks, rss = {{10, {n} // 2, {n}}}, []
for i in range({n}):
    run_member(spec(i, epochs=2), data, meta, RunDirectory({folder!r}), 0)
    if i + 1 in marks:
        rss.append(int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20)
print(" ".join(f"{{r:.0f}}" for r in rss))
"""


def memory(n: int, root: Path) -> str:
    """Resident MiB after 10, n/2 and n members, kept models on (2) and off (0)."""
    lines = [f"| traced_models | resident MiB after 10 / {n // 2} / {n} members | growth per member |",
             "|---|---|---|"]
    for kept in (2, 0):
        code = MEMORY_CHILD.format(root=str(ROOT), kept=kept, n=n, folder=str(root / f"mem{kept}"))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        if out.returncode:
            raise SystemExit(f"the memory run failed:\n{out.stderr[-2000:]}")
        mib = [float(v) for v in out.stdout.split()[-3:]]
        lines.append(f"| {kept} | {' / '.join(f'{v:.0f}' for v in mib)} | {(mib[-1] - mib[0]) / (n - 10):.2f} MiB |")
    return "\n".join(lines)


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarise(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3, help="alternating pairs of runs per workload")
    p.add_argument("--ranks", type=int, default=2, help="MPI ranks of each run (one is the master)")
    p.add_argument("--workloads", default="demo,short,search")
    p.add_argument("--keep", help="folder to keep the runs in")
    p.add_argument("--write", help="a docs page to write the table into (between <!-- bench_traced --> marks)")
    p.add_argument("--memory", type=int, metavar="N", help="the memory of N members in one process, and stop")
    args = p.parse_args()
    if args.memory:
        with workspace(args.keep, "bench_traced_") as root:
            print(f"Measured {datetime.date.today()}: python scripts/bench_traced.py --memory {args.memory}\n")
            print(memory(args.memory, root))
        return
    load = os.getloadavg()[0]
    lines = ["| workload | members | reused (on) | member s off / on | first epoch s off / on | "
             "member time off/on: median (range) | members/s on/off: median (range) | same results |",
             "|---|---|---|---|---|---|---|---|"]
    with workspace(args.keep, "bench_traced_") as root:
        for name in args.workloads.split(","):
            got: dict[str, list[dict]] = {"off": [], "on": []}
            for rep in range(args.reps):
                for side in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                    folder = root / name / f"rep{rep}"
                    folder.mkdir(parents=True, exist_ok=True)
                    got[side].append(run(workload(name, root), name, side, args.ranks, folder))
                    r = got[side][-1]
                    print(f"{name} rep {rep} {side}: {r['members']} members, {r['member_s']:.2f} s each "
                          f"(first epoch {r['first_epoch_s']:.2f} s), {r['per_second']:.3f} members/s, "
                          f"{r['reused']} reused", flush=True)
            off, on = got["off"], got["on"]
            same = all(a[k] == b[k] for a, b in zip(off, on) for k in ("results", "selected", "ensemble"))
            # a search with several workers breeds from results in the order they arrive: no two
            # runs are the same candidate for candidate, with or without the setting
            verdict = "n/a (2+ workers)" if name == "search" and args.ranks > 2 else "yes" if same else "NO"
            lines.append(
                f"| {name} | {on[0]['members']} | {on[0]['reused']} | "
                f"{median(off, 'member_s'):.2f} / {median(on, 'member_s'):.2f} | "
                f"{median(off, 'first_epoch_s'):.2f} / {median(on, 'first_epoch_s'):.2f} | "
                f"{summarise([a['member_s'] / b['member_s'] for a, b in zip(off, on)])} | "
                f"{summarise([b['per_second'] / a['per_second'] for a, b in zip(off, on)])} | "
                f"{verdict} |")
    head = (f"Measured {datetime.date.today()} on {os.cpu_count()} cores (load {load:.1f} before), "
            f"`-n {args.ranks}`, {args.reps} alternating pairs per workload:\n\n"
            f"```bash\npython scripts/bench_traced.py --reps {args.reps} --ranks {args.ranks}\n```\n\n")
    text = head + "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_block(Path(args.write), "bench_traced", text)


if __name__ == "__main__":
    main()
