"""How fast one master hands out members and journals results, against plain MPI.

    python scripts/bench_dispatch.py [--ranks 4 8 16 32 64] [--members 20000] [--idle-seconds 10]
    python scripts/bench_dispatch.py --tracking --ranks 4 --reps 5 [--write docs/tracking.md]   # [tracking] off vs on

For each rank count: a real ``python -m ensemble.run`` (all of it: data broadcast, dispatch,
journal with group commit, leaderboard) with null members (``runtime.trainer =
"rehearsal"``, 0 s, no predictions), then ``scripts/pingpong.py`` exchanging the same two
messages (a real spec, a real journal record) the same number of times with nothing else
done per message. Prints the run's members/s, the master's CPU share and CPU microseconds
per result (from ensemble.json, i.e. from the journal's close event), the ping-pong's, and
their ratio. "steady/s" counts only from the moment the last worker started its first
member (64 ranks on 2 cores finish importing seconds apart; see ``steady_rate``). Last, an
idle master: members of ``--idle-seconds`` at -n 4, the master's CPU share while it waits.
Both are ratios measured in one sitting, so a noisy machine shifts both sides alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = """
name = "bench"
[[architectures]]
name = "null"
members = {members}
layers = [{{type = "Dense", units = 8}}]
[runtime]
trainer = "rehearsal"
journal_sync_seconds = {sync}
progress_seconds = 1e9
[rehearsal]
seconds = {seconds}
predictions = false
"""


def with_root() -> dict[str, str]:
    """This environment with the project first on PYTHONPATH (packages already there stay)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}


def launcher() -> list[str]:
    here = Path(sys.executable).parent
    for name in ("mpiexec", "mpirun"):
        if (here / name).exists():
            return [str(here / name)]
    return [shutil.which("mpiexec") or "mpiexec"]


def run(ranks: int, members: int, seconds: float, sync: float, tmp: Path, tracking: str = "") -> dict:
    tag = f"{ranks}_{seconds}_{sync}{'_tracked' if tracking else ''}"
    cfg = tmp / f"bench_{tag}.toml"
    cfg.write_text(CONFIG.format(members=members, seconds=seconds, sync=sync) + tracking)
    run_dir = tmp / f"run_{tag}"
    env = with_root()
    out = subprocess.run(launcher() + ["-n", str(ranks), sys.executable, "-m", "ensemble.run", str(cfg),
                                       "--run-dir", str(run_dir), "--overwrite"],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode:
        raise SystemExit(f"ensemble.run -n {ranks} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    stats = json.loads((run_dir / "ensemble.json").read_text())["run"]
    stats["run_dir"], stats["config"] = run_dir, cfg
    stats["steady_per_second"] = steady_rate(run_dir)
    return stats


def steady_rate(run_dir: Path) -> float:
    """Members/s once every worker has started its first member. With 64 ranks on 2 cores the
    ranks finish importing many seconds apart, and a run of null members can be over before
    the last worker joins: the run's own figure (from the first member's start) mixes that
    start-up stagger in; this one measures the master and the messages."""
    from ensemble.results.journal import read_journal
    records = read_journal(run_dir / "journal.jsonl")
    first: dict[int, float] = {}
    for r in records:
        first[r["worker"]] = min(first.get(r["worker"], r["started"]), r["started"])
    joined = max(first.values())
    late = [r["received"] for r in records if r["received"] >= joined]
    return len(late) / max(max(late) - joined, 1e-9) if len(late) > 1 else float("nan")


def pingpong(ranks: int, stats: dict, tmp: Path) -> dict:
    from ensemble.config import load_config
    from ensemble.results.journal import read_journal
    from ensemble.sources import member_specs
    spec = next(member_specs(load_config(stats["config"])))
    record = read_journal(stats["run_dir"] / "journal.jsonl")[-1]
    for key in ("dispatched", "received", "worker"):        # the master adds these, a worker does not send them
        record.pop(key, None)
    messages, out = tmp / "messages.pkl", tmp / f"pingpong_{ranks}.json"
    messages.write_bytes(pickle.dumps((spec, record)))
    proc = subprocess.run(launcher() + ["-n", str(ranks), sys.executable, str(ROOT / "scripts" / "pingpong.py"),
                                        str(messages), str(stats["members"]), "2", str(out)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"pingpong -n {ranks} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


#: --tracking's sides: what each adds to the config (the live URI is filled in when the server is up)
TENSORBOARD = "\n[tracking]\ntensorboard = true\nfinish_seconds = 5\ngive_up_seconds = 2\n"
TRACKING = TENSORBOARD + 'mlflow = "{uri}"\nmlflow_experiment = "bench_dispatch"\n'
#: --write's marks in the page, unless --block names others
BLOCK = "bench_dispatch tracking"
#: --sides: what each is called in the table
SIDES = {"off": "off", "tensorboard": "TensorBoard only", "live": "TensorBoard + MLflow, live local server",
         "dead": "TensorBoard + MLflow, dead URI"}
#: --sides unless given
DEFAULT_SIDES = ["off", "live", "dead"]


def sides_arg(text: str) -> list[str]:
    """--sides: comma-separated names of ``SIDES``."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SIDES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown side(s) {', '.join(unknown) or '(none given)'}; "
                                         f"choose from {', '.join(SIDES)}")
    return names


def master_calls_us(tmp: Path, n: int = 20000) -> float:
    """CPU microseconds per result of what tracking adds to the master's loop (``Tracking.results``
    for each result and three idle calls), against a live writer process (TensorBoard); the
    top of its cProfile is printed."""
    import cProfile
    import pstats
    import time

    from ensemble.config.schema import resolve_config
    from ensemble.results.records import MemberRecord
    from ensemble.results.tracking import Tracking
    cfg = resolve_config({"architectures": [{"name": "null", "members": n, "layers": [{"type": "Dense", "units": 8}]}],
                          "tracking": {"tensorboard": True, "finish_seconds": 1}})
    records = [MemberRecord.from_json({"id": f"null-{i:05d}", "status": "ok", "arch": "null", "seed": i,
                                       "params": 5000, "epochs": 1, "train_seconds": 0.0, "ended": 1.7e9 + i,
                                       "val": {"accuracy": 0.8, "log_loss": 0.4},
                                       "test": {"accuracy": 0.79, "log_loss": 0.41}}) for i in range(n)]
    tracking = Tracking(cfg, tmp / "calls", {"task": "classification"})
    try:
        def loop() -> float:
            start = time.process_time()
            for record in records:
                tracking.results([record])
                for _ in range(3):
                    tracking.idle()
            return time.process_time() - start
        seconds = loop()
        profile = cProfile.Profile()
        profile.runcall(loop)
        pstats.Stats(profile).sort_stats("tottime").print_stats(6)
    finally:
        logging.getLogger("ensemble.tracking").setLevel(logging.ERROR)       # the writer is cut short: no matter
        tracking.finish_seconds = 0.0
        tracking.close()
    return 1e6 * seconds / n


def writer_start_cpu() -> float:
    """CPU seconds the writer process spends once, at its start: the interpreter and the
    sinks' imports (TensorBoard's protos and HParams summaries, MLflow's client)."""
    code = ("import time\nimport ensemble.results.tracking\nfrom ensemble.results import tensorboard_sink\n"
            "from tensorboard.plugins.hparams import summary_v2\nimport mlflow\nprint(time.process_time())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=with_root())
    return float(out.stdout.split()[-1])


def tracking_sides(args, tmp: Path) -> None:
    """[tracking] off / on against a live local server / on against a dead URI, interleaved
    (the order rotates each repetition), so a noisy machine shifts every side alike; the
    ratios are to the off run of the same repetition."""
    import datetime
    import statistics

    from benchkit import MlflowServer, free_port, write_block
    ranks, load0 = args.ranks[0], os.getloadavg()[0]
    calls_us = master_calls_us(tmp)
    print(f"the master's own tracking calls: {calls_us:.1f} us per result (in-process, profiled below)")
    start_cpu = writer_start_cpu()
    print(f"the writer's start (its imports, once per job): {start_cpu:.1f} s of CPU")
    sides = ["off"] + [side for side in args.sides if side != "off"]      # every ratio is to off
    with contextlib.ExitStack() as stack:
        live = stack.enter_context(MlflowServer(tmp / "mlflow", nice=19)).uri if "live" in sides else ""
        configs = {"off": "", "tensorboard": TENSORBOARD, "live": TRACKING.format(uri=live),
                   "dead": TRACKING.format(uri=f"http://127.0.0.1:{free_port()}")}
        configs = {side: configs[side] for side in sides}
        rows = []
        print(f"{'rep':>3} {'side':>11} {'members/s':>9} {'CPU us/result':>13}", flush=True)
        for rep in range(args.reps):
            got = {}
            for side in sides[rep % len(sides):] + sides[:rep % len(sides)]:
                folder = tmp / f"{side}{rep}"
                folder.mkdir()
                stats = run(ranks, args.members, 0.0, args.sync[0], folder, configs[side])
                shutil.rmtree(folder, ignore_errors=True)
                got[side] = (stats["members_per_second"], stats["master_cpu_us_per_result"])
                print(f"{rep:>3} {side:>11} {got[side][0]:>9.0f} {got[side][1]:>13.1f}", flush=True)
            rows.append(got)
    load1 = os.getloadavg()[0]
    lines = [f"Measured {datetime.date.today().isoformat()} on {os.cpu_count()} cores (load {load0:.1f} before, "
             f"{load1:.1f} after), rehearsal members of 0 s, -n {ranks}, {args.members} members a run, "
             f"{args.reps} repetitions of the {len(sides)} sides in rotating order:", "",
             "```bash", f"python scripts/bench_dispatch.py --tracking --ranks {ranks} --members {args.members} "
             f"--reps {args.reps}" + (f" --sides {','.join(sides)}" if sides != DEFAULT_SIDES else "")
             + (f" --write {args.write}" if args.write else "")
             + (f" --block '{args.block}'" if args.block != BLOCK else ""), "```", "",
             f"The master's own tracking calls (`Tracking.results` and its idle calls, in-process, 20,000 "
             f"results): {calls_us:.1f} µs per result. The writer's start (the interpreter and the sinks' "
             f"imports, once per job, at nice 19 beside the ranks): {start_cpu:.1f} s of CPU.", "",
             "| tracking | members/s (median) | on/off members/s: median (min-max) "
             "| master CPU µs/result (median) | on/off CPU per result: median (min-max) |",
             "|---|---|---|---|---|"]
    for side in configs:
        rate = [r[side][0] for r in rows]
        cpu = [r[side][1] for r in rows]
        if side == "off":
            lines.append(f"| {SIDES[side]} | {statistics.median(rate):.0f} | 1 | {statistics.median(cpu):.0f} | 1 |")
            continue
        rr = [r[side][0] / r["off"][0] for r in rows]
        cr = [r[side][1] / r["off"][1] for r in rows]
        lines.append(f"| {SIDES[side]} | {statistics.median(rate):.0f} | {statistics.median(rr):.2f} "
                     f"({min(rr):.2f}-{max(rr):.2f}) | {statistics.median(cpu):.0f} | {statistics.median(cr):.2f} "
                     f"({min(cr):.2f}-{max(cr):.2f}) |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_block(Path(args.write), args.block, table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    p.add_argument("--members", type=int, default=20000)
    p.add_argument("--sync", type=float, nargs="+", default=[1.0],
                   help="runtime.journal_sync_seconds to try (0: fsync every result)")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="member length of the idle-master run (0: skip)")
    p.add_argument("--tracking", action="store_true",
                   help="instead: [tracking] off, on (TensorBoard and MLflow to a local mlflow server this script "
                        "starts) and on with a dead MLflow URI, interleaved --reps times at the first --ranks; "
                        "each on side's ratio to the off run of its repetition")
    p.add_argument("--reps", type=int, default=5, help="repetitions of --tracking's sides")
    p.add_argument("--sides", type=sides_arg, default=DEFAULT_SIDES,
                   help=f"with --tracking: which of {', '.join(SIDES)} to run, comma separated (off always first "
                        "in the table; 'live' starts a local mlflow server, which needs MLflow's full package)")
    p.add_argument("--write", metavar="PAGE", help="with --tracking: write the table into PAGE (docs/tracking.md) "
                   "between its <!-- BLOCK --> marks")
    p.add_argument("--block", default=BLOCK, help=f"with --write: the marks' name (default {BLOCK!r})")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_dispatch_"))
    if args.tracking:
        tracking_sides(args, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    print(f"{'ranks':>5} {'sync s':>6} {'members/s':>10} {'steady/s':>9} {'master CPU':>10} {'us/result':>10} "
          f"{'pingpong/s':>10} {'pp us/msg':>10} {'master/pp':>9} {'utilisation':>11} {'fsyncs':>7}", flush=True)
    for ranks in args.ranks:
        for sync in args.sync:
            stats = run(ranks, args.members, 0.0, sync, tmp)
            ref = pingpong(ranks, stats, tmp)
            print(f"{ranks:>5} {sync:>6g} {stats['members_per_second']:>10.0f} {stats['steady_per_second']:>9.0f} "
                  f"{100 * stats['master_cpu_share']:>9.1f}% {stats['master_cpu_us_per_result']:>10.1f} "
                  f"{ref['per_second']:>10.0f} {ref['cpu_us_per_result']:>10.1f} "
                  f"{stats['master_cpu_us_per_result'] / ref['cpu_us_per_result']:>9.2f} "
                  f"{100 * stats['utilisation']:>10.1f}% {stats['journal_syncs']:>7}", flush=True)
    if args.idle_seconds:
        stats = run(4, 6, args.idle_seconds, 1.0, tmp)
        print(f"idle master: -n 4, 6 members of {args.idle_seconds:g} s: master CPU "
              f"{100 * stats['master_cpu_share']:.2f}% of a core, busy {100 * stats['master_busy_share']:.2f}%, "
              f"utilisation {100 * stats['utilisation']:.1f}%")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
