"""The scale scenarios of docs/scale.md: utilisation from Titan to Aurora, the master's cost
model, the journal's cost per line, and the reproducible mode.

    python scripts/bench_scale.py table [--rows acceptance|grid|all] [--per-worker 100]
    python scripts/bench_scale.py calibrate [--repeats 3]
    python scripts/bench_scale.py journal [--lines 20000]
    python scripts/bench_scale.py twice
    python scripts/bench_scale.py validate [--ranks 16 32] [--per-worker 16] [--seeds 1 2 3] [--write docs/scale.md]
    python scripts/bench_scale.py validate-hierarchy [--ranks 16 32] [--subs 2] [--per-worker 16] [--seeds 1 2 3]

``table``: ``python -m ensemble.simulate --engine fast`` rows (the master's recorded cost
model, ``orchestrate.simulate.MASTER_COST_US``); "acceptance" = the issue's rows (60 s
members, spread 0.5, all four machines, both modes, with and without helpers; 10 s members
at Aurora), "grid" = those plus every member time and spread at Summit's size, "all" =
every machine x member time x spread x mode (72 rows, about 450 million members); "summit" =
the grid's Summit rows alone; "evolve" = the acceptance rows of mode "evolve", without helpers.
``calibrate``: the real master code's CPU per result and per spec handed out, from the
session engine (``SimExecutor.calibrate``), the least of ``--repeats`` runs, per mode.
``journal``: what one journal line costs: bytes, and microseconds to encode and write it.
``twice``: the same session-engine command twice in the reproducible mode, and once
measured, to show the figure does not move with the machine's load.
``validate``: the simulator against real oversubscribed runs of the new scheduling. For each
rank count and each ``runtime.order`` (``list``, ``cost``): a real ``mpiexec -n R python -m
ensemble.run`` of rehearsal members of two architectures, listed short first (median 0.5 s
and 4 s, ``rehearsal.arch_seconds``, spread 0.5, ``--per-worker`` members per worker, half
of each; the long one is the wider, so ``cost`` can tell before measuring), then
``python -m ensemble.simulate`` of the same config, the same workers, and the
real run's member times (``--replay``, the session engine: the real master code on a virtual
clock, the recorded cost model). Both journals are read by one function: utilisation as
``ensemble.json`` reports it and after start-up (from the moment the last worker started
its first member; the simulator does not model start-up, and 32 ranks on 2 cores finish
importing seconds apart), the time from that moment to the last result, and the workers'
idle time after their last member. Prints sim/real ratios (median and range over ``--seeds``:
each seed draws other member times).
``validate-hierarchy``: the same for a master hierarchy of mode ensemble (``--subs``
sub-masters, each running its own share) against the fast engine run per share on the real
members' durations (``validate_hierarchy``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MACHINES = {"Titan": 18688, "Summit": 27648, "Frontier": 75264, "Aurora": 127488}
CONFIGS = {"ensemble": "configs/digits.toml", "evolve": "configs/digits_evolve.toml"}


def rows(which: str) -> list[dict]:
    out: list[dict] = []
    modes = {"acceptance": ("ensemble", "evolve"), "grid": ("ensemble", "evolve"), "all": ("ensemble", "evolve"),
             "evolve": ("evolve",)}.get(which, ())
    for mode in modes:
        for name in MACHINES:
            out.append({"mode": mode, "machine": name, "seconds": 60.0, "spread": 0.5, "tail": "none"})
            if which != "evolve":
                out.append({"mode": mode, "machine": name, "seconds": 60.0, "spread": 0.5, "tail": "helpers"})
        out.append({"mode": mode, "machine": "Aurora", "seconds": 10.0, "spread": 0.5, "tail": "none"})
        out.append({"mode": mode, "machine": "Aurora", "seconds": 10.0, "spread": 0.5, "tail": "none", "subs": "auto"})
    if which in ("grid", "all", "summit"):
        for mode in ("ensemble", "evolve"):
            for name in (MACHINES if which == "all" else ["Summit"]):
                for seconds in (10.0, 60.0, 600.0):
                    for spread in (0.25, 0.5, 1.0):
                        row = {"mode": mode, "machine": name, "seconds": seconds, "spread": spread, "tail": "none"}
                        if row not in out:
                            out.append(row)
    return out


def table(args) -> None:
    t0 = time.perf_counter()
    print("| mode | machine | workers | members | member s | spread | tail | masters | utilisation | master busy | "
          "members/s | simulated h | real s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows(args.rows):
        cmd = [sys.executable, "-m", "ensemble.simulate", CONFIGS[row["mode"]], "--engine", "fast", "--workers",
               str(MACHINES[row["machine"]]), "--per-worker", str(args.per_worker), "--seconds", str(row["seconds"]),
               "--spread", str(row["spread"]), "--tail", row["tail"], "--sub-masters", row.get("subs", "1"), "--json"]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
        r = json.loads(out.splitlines()[-1])
        print(f"| {row['mode']} | {row['machine']} | {r['workers']:,} | {r['members']:,} | {row['seconds']:g} | "
              f"{row['spread']:g} | {row['tail']} | {r['sub_masters']} | {100 * r['utilisation']:.2f}% | "
              f"{100 * r['master_busy_share']:.1f}% | {r['members_per_second']:,.0f} | "
              f"{r['simulated_seconds'] / 3600:.2f} | {r['real_seconds']:.0f} |", flush=True)
    print(f"total real time: {time.perf_counter() - t0:.0f} s")


def session_data(config: str):
    from datafeed.prepare import prepare_with_rows
    from datafeed.splits import read_data
    from ensemble.config import load_config
    from ensemble.runtime.logs import setup_logging
    setup_logging(0, "warning")
    cfg = load_config(ROOT / config)
    cfg = cfg.replace(rehearsal=cfg.rehearsal.replace(seconds=60.0, spread=0.5))
    got = read_data(cfg.data)
    data, meta, _ = prepare_with_rows(got.x, got.y, got.info, cfg.data, cfg.seed, got.rows)
    return cfg, data, meta


def session_run(cfg, data, meta, workers: int, per_worker: int, cost) -> dict:
    from ensemble.orchestrate.simulate import simulate
    from ensemble.results.rundir import RunDirectory
    from ensemble.simulate import with_members
    run = with_members(cfg, workers * per_worker)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        return simulate(run, meta, data, RunDirectory(Path(tmp)), workers, latency=0.0005, message_seconds=10e-6,
                        cost=cost)


def calibrate(args) -> None:
    for mode, config in CONFIGS.items():
        cfg, data, meta = session_data(config)
        per = 50 if mode == "ensemble" else 10
        got = [session_run(cfg, data, meta, 200, per, None) for _ in range(args.repeats)]
        res = [g["master_code_us_per_result"] for g in got]
        disp = [g["master_code_us_per_dispatch"] for g in got]
        print(f"{mode}: {200 * per} members on 200 workers, CPU us per result {res} -> {min(res)}, "
              f"per spec {disp} -> {min(disp)}", flush=True)


def journal(args) -> None:
    import io

    from ensemble.orchestrate.simulate import simulate  # noqa: F401  (the same imports as a run)
    from ensemble.results.journal import line_of
    from ensemble.results.records import MemberRecord
    from ensemble.sources.members import member_specs
    from ensemble.train.rehearsal import RehearsalTrainer
    cfg, data, meta = session_data(CONFIGS["ensemble"])
    from ensemble.simulate import with_members
    run = with_members(cfg, args.lines)
    run = run.replace(rehearsal=run.rehearsal.replace(predictions=False))
    trainer = RehearsalTrainer(run, meta, data)
    records = []
    for spec in member_specs(run):
        r = trainer.record(spec, 60.0, 10, "epochs")
        r.update(started=1.0, ended=61.0, worker=1, rank=2, host="sim1", dispatched=0.5, received=61.5)
        records.append(MemberRecord.from_json(r))
    sink = io.StringIO()
    t = time.thread_time()                       # CPU time: the machine's load of the moment left out
    for rec in records:
        sink.write(json.dumps(line_of(rec), sort_keys=True, allow_nan=True) + "\n")
    us = 1e6 * (time.thread_time() - t) / len(records)
    size = len(sink.getvalue().encode()) / len(records)
    print(f"journal line: {size:.0f} bytes, {us:.1f} us of CPU to encode and write (to_json + json.dumps), "
          f"{len(records)} rehearsal records; at 2,764,800 members: {size * 2764800 / 1e9:.2f} GB, "
          f"at 12,748,800: {size * 12748800 / 1e9:.2f} GB")
    print("one line:", sink.getvalue().splitlines()[0][:400])


def twice(args) -> None:
    from ensemble.orchestrate.simulate import master_cost
    cfg, data, meta = session_data(CONFIGS["ensemble"])
    for label, cost in (("model", master_cost("ensemble")), ("model", master_cost("ensemble")), ("measured", None)):
        t = time.perf_counter()
        r = session_run(cfg, data, meta, args.workers, 20, cost)
        print(f"{label:>9}: {args.workers} workers x 20, utilisation {100 * r['utilisation']:.2f}%, master busy "
              f"{100 * r['master_busy_share']:.2f}%, simulated {r['simulated_seconds']:.1f} s, real "
              f"{time.perf_counter() - t:.1f} s", flush=True)


VALIDATE = """
name = "validate"
seed = {seed}
[[architectures]]
name = "short"
members = {short}
layers = [{{type = "Dense", units = 8}}]
[[architectures]]
name = "long"
members = {long}
layers = [{{type = "Dense", units = 64}}, {{type = "Dense", units = 64}}]
[runtime]
trainer = "rehearsal"
order = "{order}"
progress_seconds = 1e9
[rehearsal]
seconds = 0.5
spread = 0.5
predictions = false
arch_seconds = {{long = 4.0}}
"""


def journal_figures(run_dir: Path) -> dict:
    """From a run's journal (real or simulated): utilisation as ``ensemble.json`` reports it,
    and over the steady part (from the moment the last worker started its first member to the
    last result, member time clipped to it), that span, and the mean idle time of a worker
    after its last member ended."""
    from ensemble.results.rundir import RunDirectory
    from ensemble.results.timeline import run_stats
    rd = RunDirectory(run_dir)
    lines = rd.read_lines()
    records = [r for r in lines if "event" not in r and r.get("started") is not None]
    stats = run_stats(records, [r for r in lines if "event" in r])
    firsts, lasts = {}, {}
    for r in records:
        w = r.get("worker", r.get("rank"))
        firsts[w] = min(firsts.get(w, r["started"]), r["started"])
        lasts[w] = max(lasts.get(w, r["ended"]), r["ended"])
    start, end = max(firsts.values()), max(r["received"] for r in records)
    busy = sum(max(0.0, min(r["ended"], end) - max(r["started"], start)) for r in records)
    return {"workers": stats["workers"], "members": stats["members"], "utilisation": stats["utilisation"],
            "steady": busy / (len(firsts) * (end - start)), "span": end - start,
            "span_all": end - min(firsts.values()),
            "tail_idle": sum(end - t for t in lasts.values()) / len(lasts)}


def _ratio_cell(real: list[float], sim: list[float], scale: float = 1.0, unit: str = "") -> str:
    """Median real / median simulated, then the sim/real ratio's median and range over the seeds."""
    import statistics
    ratios = [b / a for a, b in zip(real, sim)]
    return (f"{scale * statistics.median(real):.1f}{unit} / {scale * statistics.median(sim):.1f}{unit} "
            f"({statistics.median(ratios):.3f}; {min(ratios):.3f}-{max(ratios):.3f})")


def real_run(cfg: Path, ranks: int, run_dir: Path, env: dict) -> None:
    """A real oversubscribed ``mpiexec -n ranks python -m ensemble.run cfg`` into ``run_dir``."""
    from bench_dispatch import launcher
    out = subprocess.run(launcher() + ["-n", str(ranks), sys.executable, "-m", "ensemble.run", str(cfg),
                                       "--run-dir", str(run_dir), "--overwrite"],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode:
        raise SystemExit(f"ensemble.run -n {ranks} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def simulated_run(cfg: Path, workers: int, run_dir: Path, env: dict, *extra: str) -> None:
    """``python -m ensemble.simulate cfg`` (the session engine) on ``workers`` into ``run_dir``."""
    out = subprocess.run([sys.executable, "-m", "ensemble.simulate", str(cfg), "--workers", str(workers),
                          *extra, "--run-dir", str(run_dir), "--json"],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode:
        raise SystemExit(f"ensemble.simulate failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def validate(args) -> None:
    import datetime
    import statistics

    from benchkit import write_block
    tmp = Path(tempfile.mkdtemp(prefix="validate_"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: dict[tuple[int, str], list[tuple[dict, dict]]] = {}
    load0 = os.getloadavg()[0]
    for seed in args.seeds:
        for ranks in args.ranks:
            for order in ("list", "cost"):
                members = (ranks - 1) * args.per_worker
                cfg = tmp / f"n{ranks}_{order}_s{seed}.toml"
                cfg.write_text(VALIDATE.format(seed=seed, short=members // 2, long=members - members // 2,
                                               order=order))
                real, sim = tmp / f"real_n{ranks}_{order}_s{seed}", tmp / f"sim_n{ranks}_{order}_s{seed}"
                real_run(cfg, ranks, real, env)
                r = journal_figures(real)
                simulated_run(cfg, r["workers"], sim, env, "--replay", str(real))
                s_ = journal_figures(sim / f"workers{r['workers']}")
                results.setdefault((ranks, order), []).append((r, s_))
                print(f"seed {seed} -n {ranks} order {order}: real {r}, simulated {s_}", flush=True)
    lines = [f"Measured {datetime.date.today().isoformat()} on {os.cpu_count()} cores (load "
             f"{load0:.1f} before), every rank oversubscribed; rehearsal members of two architectures listed short "
             f"first (medians 0.5 s and 4 s, spread 0.5), {args.per_worker} members per worker, seeds "
             f"{', '.join(map(str, args.seeds))} (each cell: the medians over the seeds, real / simulated, then the "
             "simulated-over-real ratio's median and range):",
             "", "```bash", f"python scripts/bench_scale.py validate --ranks {' '.join(map(str, args.ranks))} "
             f"--per-worker {args.per_worker} --seeds {' '.join(map(str, args.seeds))}"
             + (f" --write {args.write}" if args.write else ""), "```", "",
             "| ranks | order | workers | members | utilisation | after start-up | span after start-up | idle after a "
             "worker's last member | cost order's gain, points: real / simulated |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (ranks, order), pairs in results.items():
        real, sim = [p[0] for p in pairs], [p[1] for p in pairs]
        gain = ""
        if order == "cost":
            base = results[(ranks, "list")]
            gains_r = [100 * (a[0]["utilisation"] - b[0]["utilisation"]) for a, b in zip(pairs, base)]
            gains_s = [100 * (a[1]["utilisation"] - b[1]["utilisation"]) for a, b in zip(pairs, base)]
            gain = f"{statistics.median(gains_r):+.1f} / {statistics.median(gains_s):+.1f}"
        lines.append(f"| {ranks} | {order} | {real[0]['workers']} | {real[0]['members']} | "
                     + _ratio_cell([x["utilisation"] for x in real], [x["utilisation"] for x in sim], 100, "%") + " | "
                     + _ratio_cell([x["steady"] for x in real], [x["steady"] for x in sim], 100, "%") + " | "
                     + _ratio_cell([x["span"] for x in real], [x["span"] for x in sim], 1, " s") + " | "
                     + _ratio_cell([x["tail_idle"] for x in real], [x["tail_idle"] for x in sim], 1, " s")
                     + f" | {gain} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_block(Path(args.write), "bench_scale validate", table)
    shutil.rmtree(tmp, ignore_errors=True)


VALIDATE_TAIL = """
name = "validate_tail"
seed = {seed}
[[architectures]]
name = "a"
members = {members}
epochs = 10
layers = [{{type = "Dense", units = 8}}]
[runtime]
trainer = "rehearsal"
tail_helpers = {helpers}
progress_seconds = 1e9
[rehearsal]
seconds = 1.0
spread = 1.0
predictions = false
"""


def validate_tail(args) -> None:
    """Idle workers as helpers (``runtime.tail_helpers``): real oversubscribed rehearsal runs
    against the session engine, helpers off and on, the same drawn member durations."""
    import datetime
    import statistics

    from benchkit import write_block

    from ensemble.results.rundir import RunDirectory
    from ensemble.results.timeline import run_stats
    tmp = Path(tempfile.mkdtemp(prefix="validate_tail_"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: dict[tuple[int, int], list[tuple[dict, dict]]] = {}
    load0 = os.getloadavg()[0]

    def figures(run_dir: Path) -> dict:
        lines = RunDirectory(run_dir).read_lines()
        records = [r for r in lines if "event" not in r and r.get("started") is not None]
        stats = run_stats(records, [r for r in lines if "event" in r])
        start = min(r["started"] for r in records)
        return {"workers": stats["workers"], "members": stats["members"], "utilisation": stats["utilisation"],
                "span": max(r["received"] for r in records) - start,
                "helped": sum(1 for r in records if r.get("helpers"))}

    for seed in args.seeds:
        for ranks in args.ranks:
            for helpers in (0, args.helpers):
                cfg = tmp / f"n{ranks}_h{helpers}_s{seed}.toml"
                cfg.write_text(VALIDATE_TAIL.format(seed=seed, members=(ranks - 1) * args.per_worker,
                                                    helpers=helpers))
                real, sim = tmp / f"real_{cfg.stem}", tmp / f"sim_{cfg.stem}"
                real_run(cfg, ranks, real, env)
                r = figures(real)
                simulated_run(cfg, r["workers"], sim, env)
                s_ = figures(sim / f"workers{r['workers']}")
                results.setdefault((ranks, helpers), []).append((r, s_))
                print(f"seed {seed} -n {ranks} helpers {helpers}: real {r}, simulated {s_}", flush=True)
    lines = [f"Measured {datetime.date.today().isoformat()} on {os.cpu_count()} cores (load {load0:.1f} before), "
             f"every rank oversubscribed; rehearsal members of one architecture (median 1 s, spread 1.0, 10 epochs), "
             f"{args.per_worker} members per worker, seeds {', '.join(map(str, args.seeds))}; the simulator draws "
             "the same durations (each cell: the medians over the seeds, real / simulated, then the "
             "simulated-over-real ratio's median and range):",
             "", "```bash", f"python scripts/bench_scale.py validate-tail --ranks {' '.join(map(str, args.ranks))} "
             f"--per-worker {args.per_worker} --helpers {args.helpers} --seeds {' '.join(map(str, args.seeds))}"
             + (f" --write {args.write}" if args.write else ""), "```", "",
             "| ranks | tail_helpers | workers | members | utilisation | span | members helped | helpers' gain, "
             "points: real / simulated |", "|---|---|---|---|---|---|---|---|"]
    for (ranks, helpers), pairs in results.items():
        real, sim = [p[0] for p in pairs], [p[1] for p in pairs]
        gain = ""
        if helpers:
            base = results[(ranks, 0)]
            gains_r = [100 * (a[0]["utilisation"] - b[0]["utilisation"]) for a, b in zip(pairs, base)]
            gains_s = [100 * (a[1]["utilisation"] - b[1]["utilisation"]) for a, b in zip(pairs, base)]
            gain = f"{statistics.median(gains_r):+.1f} / {statistics.median(gains_s):+.1f}"
        lines.append(f"| {ranks} | {helpers} | {real[0]['workers']} | {real[0]['members']} | "
                     + _ratio_cell([x["utilisation"] for x in real], [x["utilisation"] for x in sim], 100, "%") + " | "
                     + _ratio_cell([x["span"] for x in real], [x["span"] for x in sim], 1, " s") + " | "
                     + f"{statistics.median(x['helped'] for x in real):g} / "
                       f"{statistics.median(x['helped'] for x in sim):g} | {gain} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_block(Path(args.write), "bench_scale validate-tail", table)
    shutil.rmtree(tmp, ignore_errors=True)


def validate_hierarchy(args) -> None:
    """A master hierarchy whose sub-masters run their own shares (``runtime.sub_masters``,
    mode ensemble): real oversubscribed rehearsal runs against the fast engine's hierarchy
    (``fastsim.run`` per share: the share's workers, its members' real durations in the order
    its sub-master handed them out, the recorded cost model), combined as
    ``fastsim.run_hierarchy`` combines its shares."""
    import datetime

    import numpy as np
    from benchkit import write_block

    from ensemble.orchestrate.fastsim import Scenario, run
    from ensemble.orchestrate.simulate import master_cost
    from ensemble.results.rundir import RunDirectory
    tmp = Path(tempfile.mkdtemp(prefix="validate_hierarchy_"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: dict[int, list[tuple[dict, dict]]] = {}
    load0 = os.getloadavg()[0]
    for seed in args.seeds:
        for ranks in args.ranks:
            members = (ranks - 1 - args.subs) * args.per_worker
            cfg = tmp / f"n{ranks}_s{seed}.toml"
            cfg.write_text(VALIDATE.format(seed=seed, short=members // 2, long=members - members // 2, order="cost")
                           .replace('order = "cost"', f'order = "cost"\nsub_masters = {args.subs}'))
            real = tmp / f"real_n{ranks}_s{seed}"
            real_run(cfg, ranks, real, env)
            r = journal_figures(real)
            lines = RunDirectory(real).read_lines()
            shares = next(x for x in lines if x.get("event") == "open")["shares"]
            edges = np.cumsum(shares)
            records = sorted((x for x in lines if "event" not in x and x.get("started") is not None),
                             key=lambda x: x["dispatched"])
            parts = []
            for k, n in enumerate(shares):
                mine = [x for x in records if int(np.searchsorted(edges, x["worker"], side="right")) == k]
                parts.append(run(Scenario(workers=n, cost=master_cost("ensemble")),
                                 np.array([x["ended"] - x["started"] for x in mine])))
            span = max(q["simulated_seconds"] for q in parts)
            sim = {"utilisation": sum(q["utilisation"] * q["workers"] * q["simulated_seconds"] for q in parts)
                   / (sum(shares) * span), "span": span}
            results.setdefault(ranks, []).append((r, sim))
            print(f"seed {seed} -n {ranks}: real {r}, simulated {sim}", flush=True)
    lines = [f"Measured {datetime.date.today().isoformat()} on {os.cpu_count()} cores (load {load0:.1f} before), "
             f"every rank oversubscribed; {args.subs} sub-masters each running its own share; rehearsal members of "
             f"two architectures (medians 0.5 s and 4 s, spread 0.5, `runtime.order = \"cost\"`), "
             f"{args.per_worker} members per worker, seeds {', '.join(map(str, args.seeds))} (each cell: the medians "
             "over the seeds, real / simulated, then the simulated-over-real ratio's median and range):",
             "", "```bash", "python scripts/bench_scale.py validate-hierarchy "
             f"--ranks {' '.join(map(str, args.ranks))} --subs {args.subs} --per-worker {args.per_worker} "
             f"--seeds {' '.join(map(str, args.seeds))}"
             + (f" --write {args.write}" if args.write else ""), "```", "",
             "| ranks | sub-masters | workers | members | utilisation | span (first start to last result) |",
             "|---|---|---|---|---|---|"]
    for ranks, pairs in results.items():
        real_, sim_ = [q[0] for q in pairs], [q[1] for q in pairs]
        lines.append(f"| {ranks} | {args.subs} | {real_[0]['workers']} | {real_[0]['members']} | "
                     + _ratio_cell([x["utilisation"] for x in real_], [x["utilisation"] for x in sim_], 100, "%")
                     + " | " + _ratio_cell([x["span_all"] for x in real_], [x["span"] for x in sim_], 1, " s") + " |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_block(Path(args.write), "bench_scale validate-hierarchy", table)
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("table")
    t.add_argument("--rows", choices=("acceptance", "grid", "summit", "evolve", "all"), default="acceptance")
    t.add_argument("--per-worker", type=int, default=100)
    c = sub.add_parser("calibrate")
    c.add_argument("--repeats", type=int, default=3)
    j = sub.add_parser("journal")
    j.add_argument("--lines", type=int, default=20000)
    w = sub.add_parser("twice")
    w.add_argument("--workers", type=int, default=1000)
    vt = sub.add_parser("validate-tail")
    vt.add_argument("--ranks", type=int, nargs="+", default=[16, 32])
    vt.add_argument("--per-worker", type=int, default=8)
    vt.add_argument("--helpers", type=int, default=7)
    vt.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    vt.add_argument("--write", metavar="PAGE", help="write the table into PAGE between its bench_scale markers")
    vh = sub.add_parser("validate-hierarchy")
    vh.add_argument("--ranks", type=int, nargs="+", default=[16, 32])
    vh.add_argument("--subs", type=int, default=2)
    vh.add_argument("--per-worker", type=int, default=16)
    vh.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    vh.add_argument("--write", metavar="PAGE", help="write the table into PAGE between its bench_scale markers")
    v = sub.add_parser("validate")
    v.add_argument("--ranks", type=int, nargs="+", default=[16, 32])
    v.add_argument("--per-worker", type=int, default=16)
    v.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    v.add_argument("--write", metavar="PAGE",
                   help="write the table into PAGE between its <!-- bench_scale validate --> marks")
    args = p.parse_args()
    {"table": table, "calibrate": calibrate, "journal": journal, "twice": twice,
     "validate": validate, "validate-tail": validate_tail, "validate-hierarchy": validate_hierarchy}[args.what](args)


if __name__ == "__main__":
    main()
