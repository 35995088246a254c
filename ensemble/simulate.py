"""``python -m ensemble.simulate CONFIG --workers N [N ...]``: size an allocation before paying for it.

Runs the config's real master (spec source, budget, journal, statistics) against N
simulated workers on a virtual clock (``ensemble.orchestrate.simulate``): no MPI, no
TensorFlow, no sleeping. Member durations come from the config's ``[rehearsal]`` table
(log-normal: median ``seconds``, spread ``spread``) or from an earlier run's journal
(``--replay``). Prints, per worker count: utilisation after start-up, the master's busy
share, members/s, the simulated wall time and the journal's size.

    python -m ensemble.simulate configs/digits.toml --workers 1000 18688 27648 --per-worker 40 \\
        --seconds 60 --spread 0.5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ensemble.simulate", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="TOML config file (its mode, members or search, budget and [runtime])")
    p.add_argument("--workers", type=int, nargs="+", required=True, help="simulated workers (member groups)")
    p.add_argument("--members", type=int, help="members (ensemble) or evaluations (evolve) in all")
    p.add_argument("--per-worker", type=float, help="members per worker (instead of --members)")
    p.add_argument("--seconds", type=float, help="median member seconds (default: rehearsal.seconds)")
    p.add_argument("--spread", type=float, help="log-normal sigma of member seconds (default: rehearsal.spread)")
    p.add_argument("--replay", help="journal.jsonl (or run directory) whose train_seconds to replay")
    p.add_argument("--latency", type=float, default=0.0005, help="one-way message latency, seconds")
    p.add_argument("--message-us", type=float, default=10.0,
                   help="the master's cost of one send or receive, microseconds (scripts/bench_dispatch.py "
                        "measures it as the ping-pong)")
    p.add_argument("--master-slowdown", type=float, default=1.0,
                   help="the master's measured time is multiplied by this (1: as fast as this machine; "
                        "0: a master that costs nothing, to see what the rest costs; 2: twice as slow)")
    p.add_argument("--specs-in-hand", help='override runtime.specs_in_hand ("auto" or a number)')
    p.add_argument("--run-dir", help="keep the simulated journal here (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print each row's full statistics as a JSON line")
    return p.parse_args(argv)


def with_members(cfg, total: int):
    """``cfg`` with ``total`` members: spread over its architectures, and as the budget of
    evaluations of a search (each setting is read only by the mode that uses it)."""
    archs = cfg.architectures
    spread = tuple(arch.replace(members=max(1, total // len(archs) + (i < total % len(archs))))
                   for i, arch in enumerate(archs))
    return cfg.replace(architectures=spread, evolve=cfg.evolve.replace(evaluations=total))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ensemble.config import ConfigError, load_config
    from ensemble.runtime.logs import setup_logging
    setup_logging(0, "warning")
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"config error in {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.seconds is not None:
        cfg = cfg.replace(rehearsal=cfg.rehearsal.replace(seconds=args.seconds))
    if args.spread is not None:
        cfg = cfg.replace(rehearsal=cfg.rehearsal.replace(spread=args.spread))
    if args.specs_in_hand:
        hand = "auto" if args.specs_in_hand == "auto" else int(args.specs_in_hand)
        cfg = cfg.replace(runtime=cfg.runtime.replace(specs_in_hand=hand))
    from datafeed.prepare import prepare_with_rows
    from datafeed.splits import read_data
    from ensemble.orchestrate.simulate import simulate
    from ensemble.results.rundir import RunDirectory
    try:
        got = read_data(cfg.data)
        data, meta, _ = prepare_with_rows(got.x, got.y, got.info, cfg.data, cfg.seed, got.rows)
    except (ConfigError, ValueError) as exc:
        print(f"data error: {exc}", file=sys.stderr)
        return 3
    if not args.json:
        print(f"{'workers':>8} {'members':>9} {'utilisation':>12} {'master busy':>12} {'members/s':>10} "
              f"{'simulated':>10} {'journal MB':>11} {'real s':>8}")
    for workers in args.workers:
        run = cfg
        if args.members or args.per_worker:
            run = with_members(cfg, args.members or max(1, round(args.per_worker * workers)))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(args.run_dir) / f"workers{workers}" if args.run_dir else Path(tmp)
            path.mkdir(parents=True, exist_ok=True)
            (path / RunDirectory.JOURNAL).unlink(missing_ok=True)
            stats = simulate(run, meta, data, RunDirectory(path), workers, report=True, latency=args.latency,
                             message_seconds=args.message_us * 1e-6, replay=args.replay,
                             speed=args.master_slowdown)
        if args.json:
            print(json.dumps(stats), flush=True)
            continue
        print(f"{workers:>8} {stats['members']:>9} {100 * stats['utilisation']:>11.1f}% "
              f"{100 * stats['master_busy_share']:>11.2f}% {stats['members_per_second']:>10.1f} "
              f"{stats['simulated_seconds']:>9.1f}s {stats['journal_bytes'] / 1e6:>11.1f} "
              f"{stats['real_seconds']:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
