"""The two sides of a run once the config is valid: master (rank 0) and workers.

Kept apart from ``ensemble.run`` so the CLI module stays a thin sequence of steps and
so these pieces can be driven from tests without a command line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tomllib
import sys
import time
from pathlib import Path

import numpy as np

from ensemble.budget import RunBudget, slurm_end_time
from ensemble.config import ConfigError, dump_toml, resolve_config
from ensemble.journal import Journal, read_journal


def prepare_run(cfg: dict, args) -> tuple[dict, dict, Path]:
    """Rank 0: read, check and prepare the data, check architectures, create the run directory."""
    from datafeed.prepare import prepare
    from datafeed.readers import read_dataset
    from ensemble.layers import check_input_rank

    x, y, info = read_dataset(cfg["data"])
    arrays, meta = prepare(x, y, info, cfg["data"], cfg["seed"])
    if meta["task"] == "classification" and "gaussian_nll" in (
            [cfg["train"]["loss"]] + [a["loss"] for a in cfg["architectures"]]):
        raise ConfigError("`train.loss` \"gaussian_nll\" is for regression, but the labels make this "
                          "a classification task; remove it or set `data.task = \"regression\"`")
    for i, arch in enumerate(cfg["architectures"]):
        if arch["layers"]:
            msg = check_input_rank(arch["layers"], meta["input_shape"], f"architectures[{i}].layers")
            if msg:
                raise ConfigError(msg)
        else:
            from ensemble.architecture import ArchitectureError, load_builder
            try:
                load_builder(arch["model"])
            except ArchitectureError as exc:
                raise ConfigError(f"`architectures[{i}].model`: {exc}") from None
    if cfg["mode"] == "evolve":
        from ensemble.search import check_search
        check_search(cfg, meta)
    run_dir = choose_run_dir(cfg, args)
    if args.resume:
        check_same_run(cfg, run_dir)
    (run_dir / "config.toml").write_text(dump_toml(cfg))
    (run_dir / "data.json").write_text(json.dumps(meta, indent=2))
    np.savez(run_dir / "normalization.npz", shift=arrays["x_mean"], scale=arrays["x_scale"])
    return arrays, meta, run_dir


RESULT_SETTINGS = ("mode", "seed", "data", "train", "architectures", "evolve", "search", "ensemble")


def check_same_run(cfg: dict, run_dir: Path) -> None:
    """--resume must not mix members of two different configs in one run."""
    saved_path = run_dir / "config.toml"
    if not saved_path.exists():
        return
    saved = resolve_config(tomllib.loads(saved_path.read_text()))
    for key in RESULT_SETTINGS:
        if saved[key] != cfg[key]:
            raise ConfigError(f"--resume: `{key}` differs from the run's saved config.toml in "
                              f"{str(run_dir)!r}; resume with the config the run started with "
                              "(only [runtime] settings may change)")


def choose_run_dir(cfg: dict, args: argparse.Namespace) -> Path:
    """Where this run writes; never silently mixes two runs in one directory."""
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        run_dir = Path(cfg["output_dir"]) / cfg["name"]
    has_results = (run_dir / "journal.jsonl").exists()
    if args.resume:
        if not has_results:
            raise ConfigError(f"--resume: {str(run_dir)!r} holds no journal.jsonl to resume from; "
                              "start the run without --resume")
        return run_dir
    if run_dir.exists() and args.overwrite:
        shutil.rmtree(run_dir)
    elif has_results and args.run_dir:
        raise ConfigError(f"--run-dir {str(run_dir)!r} already holds a run; add --resume to continue it "
                          "or --overwrite to replace it")
    elif has_results:
        n = 2
        while (run_dir.parent / f"{run_dir.name}-{n}").exists():
            n += 1
        run_dir = run_dir.parent / f"{run_dir.name}-{n}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def make_trainer(cfg: dict, meta: dict, data, run_dir: Path, rank: int, group=None):
    """A function spec -> result that trains on this rank (imports TensorFlow once)."""
    from ensemble.member import configure_tensorflow, run_member
    configure_tensorflow(cfg["runtime"]["threads"])
    if group is not None and group.Get_size() == 1:
        group = None                                  # G = 1: no communication at all
    return lambda spec: run_member(spec, data, meta, run_dir, rank, group)


def _progress(result: dict, done: int, total: int | None, metric: str, t0: float) -> str:
    head = f"[{done:>4}/{total if total else '?'}] {result['id']:<24}"
    if result["status"] == "ok":
        val = result["val"].get(metric, float("nan"))
        body = (f"val {metric} {val:.4f}  {result['epochs']:>3} epochs  {result['params']:>8} params  "
                f"{result['train_seconds']:6.1f} s")
    else:
        body = f"FAILED {result['error']['kind']}: {result['error']['message'][:120]}"
    return f"{head} {body}  rank {result.get('rank')}  +{time.monotonic() - t0:6.1f} s"


def run_master_side(comm, cfg: dict, meta: dict, data, run_dir: Path, resume: bool,
                    leaders: list[int]) -> int:
    """Rank 0: schedule members, journal results, build and report the ensemble."""
    from ensemble.report import default_metric, finalize, format_comparison
    from ensemble.scheduler import SpecList, run_master
    from ensemble.specs import member_specs

    t0 = time.monotonic()
    journal_path = run_dir / "journal.jsonl"
    previous = read_journal(journal_path) if resume else []
    done_ids = {r["id"] for r in previous if r.get("status") == "ok"}
    metric = default_metric(meta["task"], cfg["ensemble"]["metric"])
    if cfg["mode"] == "evolve":
        from ensemble.search import SearchSource
        source = SearchSource(cfg, meta, run_dir, previous)
        total = source.total
    else:
        specs = member_specs(cfg)
        source = SpecList(specs, done_ids)
        total = len(specs)
    group_size = cfg["runtime"]["group_size"]
    print(f"run {run_dir}: {meta['task']} on {meta['sizes']} samples, {total or '?'} members, "
          f"{len(leaders) or 'no'} {'groups of ' + str(group_size) + ' ranks' if group_size > 1 else 'workers'}"
          f"{' (serial)' if not leaders else ''}"
          + (f", resuming with {len(done_ids)} finished" if resume else ""), flush=True)
    records = list(previous)
    trainer = None

    def train_local(spec):
        nonlocal trainer
        if trainer is None:
            trainer = make_trainer(cfg, meta, data, run_dir, 0)
        return trainer(spec)

    rt = cfg["runtime"]
    budget = RunBudget(rt["time_limit"], rt["finish_reserve"], rt["max_failed_share"], end_time=slurm_end_time())
    with Journal(journal_path) as journal:
        def on_result(result: dict) -> None:
            journal.append(result)
            records.append(result)
            budget.observe(result)
            print(_progress(result, len(records), total, metric, t0), flush=True)
        run_master(comm, source, on_result, train_local, rt["poll_max_sleep"],
                   should_stop=budget.should_stop, adjust=budget.cap, workers=leaders)
    code = 0
    if budget.reason:
        failed = [r for r in records if r.get("status") != "ok"]
        kinds = sorted({r["error"]["kind"] for r in failed if "error" in r})
        print(f"stopped early: {budget.reason}" + (f"\nfailures: {len(failed)} ({', '.join(kinds)})"
                                                  if failed else ""), file=sys.stderr, flush=True)
        code = 4 if budget.n_failed and "failed" in budget.reason else 0
    extra = {"search": source.finish(records)} if cfg["mode"] == "evolve" else {}
    try:
        summary = finalize(run_dir, records, cfg, meta, np.asarray(data["y_val"]), np.asarray(data["y_test"]),
                           extra)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return code or 1
    print(format_comparison(summary), flush=True)
    print(f"wrote {run_dir}/ensemble.json, leaderboard.csv, journal.jsonl  "
          f"({time.monotonic() - t0:.1f} s)", flush=True)
    return code


def run_worker_side(comm, cfg: dict, meta: dict, data, run_dir: Path, group) -> None:
    """Ranks > 0: train what the master (through the group leader) sends until it says stop."""
    from ensemble.scheduler import run_worker
    trainer = make_trainer(cfg, meta, data, run_dir, comm.Get_rank(), group)
    run_worker(comm, trainer, cfg["runtime"]["poll_max_sleep"], group)
