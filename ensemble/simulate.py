"""``python -m ensemble.simulate CONFIG --workers N [N ...]``: size an allocation before paying for it.

Runs the config's real master (spec source, budget, journal, statistics) against N
simulated workers on a virtual clock (``ensemble.orchestrate.simulate``): no MPI, no
TensorFlow, no sleeping. Member durations come from the config's ``[rehearsal]`` table
(log-normal: median ``seconds``, spread ``spread``) or from an earlier run's journal
(``--replay``). Prints, per worker count: utilisation after start-up, the master's busy
share, members/s, the simulated wall time and the journal's size.

The master's cost comes from its recorded cost model (``--master-cost model``, the
default: the same command gives the same figure on any machine, however loaded) or from
its real time on this machine (``--master-cost measured``). ``--engine fast`` models the
dispatch loop instead of running the master's code (``orchestrate.fastsim``, 1-2 us a
member instead of 300; no journal): the engine of the scenario tables, up to 12.7 million
members.

    python -m ensemble.simulate configs/digits.toml --workers 1000 18688 27648 --per-worker 40 \\
        --seconds 60 --spread 0.5
    python -m ensemble.simulate configs/digits.toml --engine fast --workers 27648 127488 \\
        --per-worker 100 --seconds 60 --spread 0.5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ensemble.simulate", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="TOML config file (its mode, members or search, budget and [runtime])")
    p.add_argument("--workers", type=_positive(int), nargs="+", required=True,
                   help="simulated workers (member groups)")
    many = p.add_mutually_exclusive_group()
    many.add_argument("--members", type=_positive(int), help="members (ensemble) or evaluations (evolve) in all")
    many.add_argument("--per-worker", type=_positive(float), help="members per worker (instead of --members)")
    p.add_argument("--seconds", type=_positive(float), help="median member seconds (default: rehearsal.seconds)")
    p.add_argument("--spread", type=_positive(float, zero=True),
                   help="log-normal sigma of member seconds (default: rehearsal.spread)")
    p.add_argument("--replay", help="journal.jsonl (or run directory) whose train_seconds to replay")
    p.add_argument("--latency", type=_positive(float, zero=True), default=0.0005,
                   help="one-way message latency, seconds")
    p.add_argument("--message-us", type=_positive(float, zero=True), default=10.0,
                   help="the master's cost of one send or receive, microseconds (scripts/bench_dispatch.py "
                        "measures it as the ping-pong)")
    p.add_argument("--master-cost", default="model",
                   help='"model": the recorded cost model of the mode\'s master (reproducible); "measured": its '
                        'real time on this machine; or "RESULT_US,DISPATCH_US": microseconds per result and per spec')
    p.add_argument("--master-slowdown", type=_positive(float, zero=True), default=1.0,
                   help="--master-cost measured: the master's measured time is multiplied by this (1: as fast as "
                        "this machine; 0: a master that costs nothing, to see what the rest costs; 2: twice as slow)")
    p.add_argument("--engine", choices=("session", "fast"), default="session",
                   help="session: the real master code; fast: a model of its dispatch loop, for millions of members")
    p.add_argument("--order", choices=("cost", "list"), help="override runtime.order")
    p.add_argument("--stop-quantile", type=_share,
                   help="override runtime.stop_quantile, in [0, 1] (0: the slowest seen)")
    p.add_argument("--time-limit", type=_positive(float), help="override runtime.time_limit, seconds")
    p.add_argument("--arch-costs", type=_positive(float), nargs="+",
                   help="--engine fast: members dealt round-robin over architectures whose median seconds are "
                        "--seconds times these (default: one architecture)")
    p.add_argument("--tail", choices=("none", "helpers"), default=None,
                   help="--engine fast: what idle workers do once the list is dry; helpers: join the longest-running "
                        "straggler as data-parallel helpers, as the runtime does (`runtime.tail_helpers`); default: "
                        "what the config's `runtime.tail_helpers` gives at each worker count (\"auto\": helpers "
                        "from 32 workers)")
    p.add_argument("--seed", type=int, help="--engine fast: the seed of the members' durations (default 0)")
    p.add_argument("--sub-masters", type=_auto_or(0),
                   help="--engine fast: a master hierarchy whose sub-masters each run their own static share of "
                        "the members with its bookkeeping, as the runtime's `runtime.sub_masters` does in mode "
                        'ensemble (docs/scale.md): "auto" (the runtime\'s own choice: as many as keep '
                        'each under 50%% busy, 0 below 64 workers each) or a number; 0 or 1: one master')
    p.add_argument("--specs-in-hand", type=_auto_or(1), help='override runtime.specs_in_hand ("auto" or a number)')
    p.add_argument("--run-dir", help="keep the simulated journal here (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print each row's full statistics as a JSON line")
    return p.parse_args(argv)


def _positive(kind, zero: bool = False):
    """An argparse type: a number of ``kind`` above 0 (or at least 0), else a usage error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"must be {'at least 0' if zero else 'above 0'}, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def _auto_or(least: int):
    """An argparse type: "auto", or a whole number of at least ``least``, else a usage error."""
    def parse(text: str):
        if text == "auto":
            return text
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f'expected "auto" or a whole number, got {text!r}') from None
        if value < least:
            raise argparse.ArgumentTypeError(f'must be "auto" or at least {least}, got {text}')
        return value
    parse.__name__ = "auto_or_int"
    return parse


#: options only ``--engine fast`` reads (the session engine runs the config's own runtime settings)
FAST_ONLY = {"arch_costs": "--arch-costs", "tail": "--tail", "seed": "--seed", "sub_masters": "--sub-masters"}


def _share(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def with_members(cfg, total: int):
    """``cfg`` with ``total`` members: spread over its architectures, and as the budget of
    evaluations of a search (each setting is read only by the mode that uses it)."""
    archs = cfg.architectures
    spread = tuple(arch.replace(members=max(1, total // len(archs) + (i < total % len(archs))))
                   for i, arch in enumerate(archs))
    return cfg.replace(architectures=spread, evolve=cfg.evolve.replace(evaluations=total))


def cost_model(value: str, mode: str):
    """``--master-cost``: a ``MasterCost``, or None for the master's measured time."""
    from ensemble.orchestrate.simulate import MasterCost, master_cost
    if value == "measured":
        return None
    if value == "model":
        return master_cost(mode)
    try:
        result_us, dispatch_us = (float(x) for x in value.split(","))
    except ValueError:
        raise SystemExit(f'--master-cost: expected "model", "measured" or "RESULT_US,DISPATCH_US", '
                         f'got {value!r}') from None
    return MasterCost(result_us * 1e-6, dispatch_us * 1e-6)


def assumptions(cfg, args) -> str:
    """What the table's figures rest on, said above it: the members' durations and the
    master's cost (a reader took "23% at 20,000 workers" for a forecast of their own run)."""
    from ensemble.orchestrate.simulate import cost_source
    members = (f"members replayed from {args.replay}" if getattr(args, "replay", None) else
               f"members of made-up duration: log-normal, median {cfg.rehearsal.seconds:g} s, spread "
               f"{cfg.rehearsal.spread:g} (`[rehearsal]`, or --seconds/--spread; --replay a run's journal for "
               "its own)")
    cost = {"measured": "the master's own code timed here", "model": cost_source(cfg.mode)}.get(
        args.master_cost, f"{args.master_cost} us a result, a dispatch")
    group = cfg.runtime.group_size
    workers = (f"; a worker is a member group of {group} ranks (`runtime.group_size`): ranks = 1 + {group} x workers"
               if group > 1 else "")
    from ensemble.modes import mode_of
    counts = sorted(getattr(args, "workers", None) or [])
    given = getattr(args, "tail", None)
    tail = [w for w in counts if (given == "helpers" if given else mode_of(cfg).tail_helpers(cfg, w))]
    helpers = (f"; at the end, idle workers join the last members as helpers (`runtime.tail_helpers` "
               f"{cfg.runtime.tail_helpers!r}: at {', '.join(map(str, tail))} workers), which may end a run "
               "sooner than its longest member" if tail else "")
    if getattr(args, "replay", None) and getattr(args, "engine", "session") == "fast":
        members += " (in the journal's order; members beyond it drawn from `[rehearsal]`)"
    return (f"assumed: {members}; master cost: {cost}; message latency {args.latency * 1e3:g} ms one way "
            f"(--latency){workers}{helpers}")


def fast_rows(cfg, args) -> int:
    """``--engine fast``: one row per worker count (``orchestrate.fastsim``)."""
    import time

    from ensemble.modes import mode_of
    from ensemble.orchestrate import fastsim
    from ensemble.runtime.tail import AUTO_HELPERS
    rt = cfg.runtime
    if not mode_of(cfg).one_shot_members:
        raise SystemExit(f"--engine fast models independent members (modes ensemble and evolve); mode {cfg.mode!r} "
                         "does not train so: leave out --engine fast (the default engine runs its own master code)")
    cost = cost_model(args.master_cost, cfg.mode)
    if cost is None:
        raise SystemExit("--engine fast models the master: give --master-cost model or RESULT_US,DISPATCH_US")
    arch_costs, seed, sub_masters = args.arch_costs or [1.0], args.seed or 0, args.sub_masters or 1
    replayed = None
    if args.replay:
        from ensemble.train.rehearsal import replay_durations
        try:
            replayed = np.array(list(replay_durations(args.replay).values()), dtype=np.float64)
        except ValueError as exc:
            raise SystemExit(f"--replay: {exc}") from None
    if not args.json:
        print(assumptions(cfg, args))
        print(f"{'workers':>8} {'members':>9} {'utilisation':>12} {'master busy':>12} {'members/s':>10} "
              f"{'simulated':>10} {'real s':>8}")
    for workers in args.workers:
        members = args.members or (max(1, round(args.per_worker * workers)) if args.per_worker else None) \
            or mode_of(cfg).expected_members(cfg, workers) or workers    # the config's own count
        members = max(1, members)
        durations, arch = fastsim.lognormal_durations(members, cfg.rehearsal.seconds, cfg.rehearsal.spread,
                                                      seed, tuple(arch_costs))
        if replayed is not None:                  # as the session engine: by the journal's members, then drawn
            durations[:len(replayed)] = replayed[:members]
        elif rt.order == "cost" and len(arch_costs) > 1:
            rank = -np.asarray(arch_costs)[arch]           # the architectures' measured means, longest first
            durations = durations[np.argsort(rank, kind="stable")]
        hand = None if rt.specs_in_hand == "auto" else int(rt.specs_in_hand)
        helpers = mode_of(cfg).tail_helpers(cfg, workers)
        tail = args.tail or ("helpers" if helpers else "none")
        scenario = fastsim.Scenario(workers, cost, message_seconds=args.message_us * 1e-6, latency=args.latency,
                                    in_hand=hand, tail=tail, max_group=1 + (helpers or AUTO_HELPERS),
                                    time_limit=None if rt.time_limit is None else rt.time_limit - rt.finish_reserve,
                                    stop_quantile=rt.stop_quantile)
        subs = (fastsim.hierarchy_shape(workers, float(np.mean(durations)), cost, scenario.message_seconds)
                if sub_masters == "auto" else min(int(sub_masters), workers))    # the runtime's own choice
        t0 = time.perf_counter()
        stats = fastsim.run_hierarchy(scenario, durations, subs)
        stats.update(real_seconds=round(time.perf_counter() - t0, 2), mode=cfg.mode, order=rt.order, tail=tail,
                     seconds=cfg.rehearsal.seconds, spread=cfg.rehearsal.spread,
                     cost_us=[round(cost.result * 1e6, 2), round(cost.dispatch * 1e6, 2)])
        if args.json:
            print(json.dumps(stats), flush=True)
            continue
        print(f"{workers:>8} {stats['members']:>9} {100 * stats['utilisation']:>11.1f}% "
              f"{100 * stats['master_busy_share']:>11.2f}% {stats['members_per_second']:>10.1f} "
              f"{stats['simulated_seconds']:>9.1f}s {stats['real_seconds']:>8.1f}", flush=True)
    return 0


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
    if args.order:
        cfg = cfg.replace(runtime=cfg.runtime.replace(order=args.order))
    if args.stop_quantile is not None:
        cfg = cfg.replace(runtime=cfg.runtime.replace(stop_quantile=args.stop_quantile or None))
    if args.time_limit is not None:
        if args.time_limit <= cfg.runtime.finish_reserve:
            print(f"error: --time-limit {args.time_limit:g} is not more than the config's `runtime.finish_reserve` = "
                  f"{cfg.runtime.finish_reserve:g} s, kept at the end for the outputs: no member could start",
                  file=sys.stderr)
            return 2
        cfg = cfg.replace(runtime=cfg.runtime.replace(time_limit=args.time_limit))
    if args.replay and not Path(args.replay).exists():
        print(f"error: --replay {args.replay!r} does not exist; give a run's journal.jsonl or its directory",
              file=sys.stderr)
        return 2
    if args.run_dir and (Path(args.run_dir) / "journal.jsonl").exists():
        print(f"error: --run-dir {args.run_dir!r} is a run's directory; give a new folder for the simulated "
              "journals (one per worker count)", file=sys.stderr)
        return 2
    if args.engine == "fast":
        return fast_rows(cfg, args)
    given = [flag for key, flag in FAST_ONLY.items() if getattr(args, key) is not None]
    if given:
        print(f"error: {', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --engine fast only: the session "
              "engine runs the config's own master and settings (`runtime.tail_helpers`, `runtime.sub_masters`, "
              "its architectures); add --engine fast, or set them in the config", file=sys.stderr)
        return 2
    from datafeed.prepare import prepare_with_rows
    from datafeed.splits import read_data
    from ensemble.modes import mode_of
    from ensemble.orchestrate.simulate import simulate
    from ensemble.results.rundir import RunDirectory
    if mode_of(cfg).writes_source and not Path(cfg.data.source).exists():
        print(f"data error: `data.source` {cfg.data.source!r} does not exist yet: mode {cfg.mode!r} writes it from "
              "the simulation's first samples at a run's start, and the simulator needs its shapes; simulate "
              "after a run has started, or with samples there", file=sys.stderr)
        return 3
    try:
        got = read_data(cfg.data)
        data, meta, _ = prepare_with_rows(got.x, got.y, got.info, cfg.data, cfg.seed, got.rows)
    except (ConfigError, ValueError) as exc:
        print(f"data error: {exc}", file=sys.stderr)
        return 3
    if not args.json:
        print(assumptions(cfg, args))
        print(f"{'workers':>8} {'members':>9} {'utilisation':>12} {'master busy':>12} {'members/s':>10} "
              f"{'simulated':>10} {'journal MB':>11} {'real s':>8}")
    for workers in args.workers:
        run = cfg
        if args.members or args.per_worker:
            run = with_members(cfg, args.members or max(1, round(args.per_worker * workers)))
        shm = Path("/dev/shm")                 # memory: the journal's fsyncs cost nothing there
        with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None) as tmp:
            path = Path(args.run_dir) / f"workers{workers}" if args.run_dir else Path(tmp)
            path.mkdir(parents=True, exist_ok=True)
            (path / RunDirectory.JOURNAL).unlink(missing_ok=True)
            stats = simulate(run, meta, data, RunDirectory(path), workers, report=True, latency=args.latency,
                             message_seconds=args.message_us * 1e-6, replay=args.replay,
                             speed=args.master_slowdown, cost=cost_model(args.master_cost, cfg.mode))
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
