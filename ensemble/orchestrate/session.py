"""The two sides of a run once the config is valid and the data is shared: the master
(rank 0) and the workers. Kept apart from ``ensemble.run`` so the entry point stays a
thin sequence of steps and these pieces can be driven from tests without a command line.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ensemble.orchestrate.dispatch import dispatch
from ensemble.results.rundir import RunDirectory
from ensemble.results.summary import finalize, format_comparison
from ensemble.runtime.budget import RunBudget, slurm_end_time
from ensemble.runtime.executor import MpiExecutor, SerialExecutor, serve
from ensemble.sources import SpecList, member_specs
from ensemble.task import get_task

log = logging.getLogger(__name__)


def make_trainer(cfg: dict, meta: dict, data, run_dir: RunDirectory, rank: int, group=None):
    """A function (spec, report) -> result that trains on this rank (imports TensorFlow once)."""
    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.member import run_member
    configure_tensorflow(cfg["runtime"]["threads"])
    if group is not None and group.Get_size() == 1:
        group = None                                  # G = 1: no communication at all
    return lambda spec, report: run_member(spec, data, meta, run_dir, rank, group, report)


def _progress(result: dict, done: int, total: int | None, metric: str, t0: float) -> str:
    head = f"[{done:>4}/{total if total else '?'}] {result['id']:<24}"
    if result["status"] == "ok":
        val = result["val"].get(metric, float("nan"))
        body = (f"val {metric} {val:.4f}  {result['epochs']:>3} epochs  {result['params']:>8} params  "
                f"{result['train_seconds']:6.1f} s")
    else:
        body = f"FAILED {result['error']['kind']}: {result['error']['message'][:120]}"
    return f"{head} {body}  rank {result.get('rank')}  +{time.monotonic() - t0:6.1f} s"


def make_source(cfg: dict, meta: dict, run_dir: RunDirectory, previous: list[dict]):
    """(spec source, members expected or None) for the config's mode."""
    if cfg["mode"] == "evolve":
        from ensemble.sources.search import SearchSource
        source = SearchSource(cfg, meta, run_dir, previous)
        return source, source.total
    specs = member_specs(cfg)
    return SpecList(specs, {r["id"] for r in previous if r.get("status") == "ok"}), len(specs)


def run_master_side(comm, cfg: dict, meta: dict, data, run_dir: RunDirectory, resume: bool,
                    leaders: list[int]) -> int:
    """Rank 0: schedule members, journal results, build and report the ensemble."""
    t0 = time.monotonic()
    previous = run_dir.read_journal() if resume else []
    done_ids = {r["id"] for r in previous if r.get("status") == "ok"}
    metric = get_task(meta["task"]).default_metric(cfg["ensemble"]["metric"])
    source, total = make_source(cfg, meta, run_dir, previous)
    group_size = cfg["runtime"]["group_size"]
    log.info(f"run {run_dir.path}: {meta['task']} on {meta['sizes']} samples, {total or '?'} members, "
             f"{len(leaders) or 'no'} {'groups of ' + str(group_size) + ' ranks' if group_size > 1 else 'workers'}"
             f"{' (serial)' if not leaders else ''}"
             + (f", resuming with {len(done_ids)} finished" if resume else ""))
    records = list(previous)
    rt = cfg["runtime"]
    if leaders:
        executor = MpiExecutor(comm, leaders, rt["poll_max_sleep"])
    else:
        executor = SerialExecutor(lambda: make_trainer(cfg, meta, data, run_dir, 0))
    budget = RunBudget(rt["time_limit"], rt["finish_reserve"], rt["max_failed_share"], end_time=slurm_end_time())
    with run_dir.journal() as journal:
        def on_result(result: dict) -> None:
            journal.append(result)
            records.append(result)
            budget.observe(result)
            log.info(_progress(result, len(records), total, metric, t0))
        dispatch(executor, source, on_result, should_stop=budget.should_stop, adjust=budget.cap)
    code = 0
    if budget.reason:
        failed = [r for r in records if r.get("status") != "ok"]
        kinds = sorted({r["error"]["kind"] for r in failed if "error" in r})
        log.warning(f"stopped early: {budget.reason}" + (f"\nfailures: {len(failed)} ({', '.join(kinds)})"
                                                         if failed else ""))
        code = 4 if budget.n_failed and "failed" in budget.reason else 0
    extra = {"search": source.finish(records)} if cfg["mode"] == "evolve" else {}
    try:
        summary = finalize(run_dir, records, cfg, meta, np.asarray(data["y_val"]), np.asarray(data["y_test"]),
                           extra)
    except RuntimeError as exc:
        log.error(f"error: {exc}")
        return code or 1
    log.info(format_comparison(summary))
    log.info(f"wrote {run_dir.path}/ensemble.json, leaderboard.csv, journal.jsonl  "
             f"({time.monotonic() - t0:.1f} s)")
    return code


def run_worker_side(comm, cfg: dict, meta: dict, data, run_dir: RunDirectory, group) -> None:
    """Ranks > 0: train what the master (through the group leader) sends until it says stop."""
    trainer = make_trainer(cfg, meta, data, run_dir, comm.Get_rank(), group)
    serve(comm, trainer, cfg["runtime"]["poll_max_sleep"], group)
