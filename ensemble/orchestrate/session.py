"""The two sides of a run once the config is valid and the data is shared: the master
(rank 0) and the workers. Kept apart from ``ensemble.run`` so the entry point stays a
thin sequence of steps and these pieces can be driven from tests without a command line.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from contextlib import nullcontext

import numpy as np

from ensemble.orchestrate.dispatch import dispatch
from ensemble.orchestrate.progress import Progress
from ensemble.results.artifacts import Artifacts
from ensemble.results.heartbeat import Heartbeat
from ensemble.results.report import report_line
from ensemble.results.rundir import RunDirectory
from ensemble.results.summary import finalize, format_comparison
from ensemble.results.timeline import format_stats, run_stats
from ensemble.runtime.budget import RunBudget
from ensemble.runtime.scheduler import job_end_time
from ensemble.runtime.executor import MpiExecutor, SerialExecutor, go_on, serve
from ensemble.sources import SpecList, member_count, member_specs
from ensemble.sources.discard import EarlyDiscard
from ensemble.task import get_task

log = logging.getLogger(__name__)


def make_trainer(cfg: dict, meta: dict, data, run_dir: RunDirectory, rank: int, group=None, comm=None):
    """A function (spec, report) -> journal record that trains on this rank: Keras (imports
    TensorFlow once) or, with ``runtime.trainer = "rehearsal"``, a sleeping stand-in. In
    mode "pbt" a member trains round by round and its state travels on ``comm``."""
    from ensemble.train.member import guarded
    if cfg["runtime"]["trainer"] == "rehearsal":
        from ensemble.train.rehearsal import RehearsalTrainer
        rehearse = RehearsalTrainer(cfg, meta, data, leader=group is None or group.Get_rank() == 0)
        return lambda spec, report: guarded(lambda: rehearse(spec, report), spec, rank)
    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.member import run_member
    rt = cfg["runtime"]
    configure_tensorflow(rt["threads"], rt["precision"], rt["jit_compile"], rt["deterministic"])
    if group is not None and group.Get_size() == 1:
        group = None                                  # G = 1: no communication at all
    if cfg["mode"] == "pbt":
        from ensemble.train.population import train_population_member
        sleep = rt["poll_max_sleep"]
        return lambda spec, report: guarded(lambda: train_population_member(
            spec, data, meta, run_dir, comm, group, report, sleep), spec, rank)
    if packs(cfg) and group is None:
        return packing_trainer(cfg, data, meta, run_dir, rank)
    return lambda spec, report: run_member(spec, data, meta, run_dir, rank, group, report)


def packs(cfg: dict) -> bool:
    """Whether workers pack members (``runtime.members_per_rank`` > 1): in mode "ensemble", in
    float32. A search does not: it would breed two packs' worth of candidates per worker
    before their parents are trained (and candidates that report to the master, as early
    discarding needs, cannot pack); a population trains one member per group."""
    rt = cfg["runtime"]
    return rt["members_per_rank"] > 1 and cfg["mode"] == "ensemble" and rt["precision"] == "float32"


def packing_trainer(cfg: dict, data, meta: dict, run_dir: RunDirectory, rank: int):
    """``runtime.members_per_rank = K``: a trainer that trains one spec as usual and, through
    ``train_many``, up to K specs of equal ``pack_key`` packed into one graph
    (``ensemble.train.packed``); ``serve`` packs what the worker holds."""
    from ensemble.train.member import run_member
    from ensemble.train.packed import pack_key, train_packed

    def train(spec, report):
        return run_member(spec, data, meta, run_dir, rank, None, report)

    def train_many(specs):
        try:
            records = train_packed(specs, data, meta, run_dir, rank)
        except Exception as exc:              # noqa: BLE001 - a pack that cannot train: one by one instead
            log.warning(f"rank {rank}: packing {len(specs)} members failed ({type(exc).__name__}: {exc}); "
                        "training them one by one")
            return [run_member(spec, data, meta, run_dir, rank) for spec in specs]
        for spec, record in zip(specs, records):
            record.update({k: spec[k] for k in ("genome", "summary") if k in spec})
        return records
    train.pack, train.pack_key, train.train_many = cfg["runtime"]["members_per_rank"], pack_key, train_many
    return train


def make_source(cfg: dict, meta: dict, run_dir: RunDirectory, lines: list[dict], lost: set[str] = frozenset(),
                workers: int = 1):
    """(spec source, members expected or None) for the config's mode, from the journal's
    ``lines`` so far (records and events, in order); members in ``lost`` (finished, but
    their kept artifacts are gone) are trained again. ``workers``: the slots members train
    in (a population has at most one member per slot)."""
    if cfg["mode"] == "pbt":
        from ensemble.sources.population import PopulationSource
        source = PopulationSource(cfg, meta, run_dir, lines, workers)
        return source, source.total
    if cfg["mode"] == "evolve":
        from ensemble.sources.search import SearchSource
        source = SearchSource(cfg, meta, run_dir, lines, lost)
        return source, source.total
    done = {r["id"] for r in lines if "event" not in r and r.get("status") == "ok"} - set(lost)
    return SpecList(member_specs(cfg, done), done), member_count(cfg)


def make_artifacts(cfg: dict, meta: dict, run_dir: RunDirectory, metric: str) -> Artifacts:
    """The run's retention (``ensemble.candidates``, ``ensemble.keep_models``); a
    multi-objective search also keeps its Pareto front's models."""
    objectives = None
    if cfg["mode"] == "evolve":
        from ensemble.sources.search import pareto_objectives
        objectives = pareto_objectives(cfg, meta)
    ens = cfg["ensemble"]
    return Artifacts(run_dir, metric, ens["candidates"], ens["keep_models"], objectives)


def in_hand(runtime: dict) -> int | None:
    """``runtime.specs_in_hand`` for the executor: None is auto."""
    return None if runtime["specs_in_hand"] == "auto" else runtime["specs_in_hand"]


def open_event(cfg: dict, executor, ranks: int, job_started: float, command: list[str] | None = None) -> dict:
    """The journal line that starts a segment: when, on how many workers (see results.timeline),
    and how the job was started (command line, versions: the report's "how the run was made")."""
    from ensemble.runtime.env import environment
    from ensemble.runtime.mpi import library_version
    rt = cfg["runtime"]
    return {"event": "open", "time": round(time.time(), 4), "job_started": round(job_started, 4),
            "workers": executor.workers, "group_size": rt["group_size"], "ranks": ranks,
            "host": socket.gethostname(), "trainer": rt["trainer"], "specs_in_hand": rt["specs_in_hand"],
            "environment": environment(command if command is not None else sys.argv[1:], library_version())}


def baseline_section(meta: dict, data, seed: int) -> dict:
    """The linear baseline's row for ensemble.json (``task.baseline``); never fails the run."""
    from ensemble.task.baseline import NAMES, linear_baseline
    try:
        return linear_baseline(meta["task"], data, meta["n_outputs"], seed)
    except Exception as exc:                  # noqa: BLE001 - a baseline must not cost the ensemble
        return {"model": NAMES.get(meta["task"], "linear model"), "skipped": f"{type(exc).__name__}: {exc}"}


def run_master_side(comm, cfg: dict, meta: dict, data, run_dir: RunDirectory, resume: bool,
                    leaders: list[int], job_started: float | None = None, command: list[str] | None = None,
                    master_trains: bool = False) -> int:
    """Rank 0: schedule members, journal results, build and report the ensemble. ``command``:
    the job's arguments, for the journal (default ``sys.argv[1:]``); ``master_trains``: rank 0
    also trains, in a thread (``runtime.executor.LocalWorker``)."""
    t0 = time.monotonic()
    job_started = time.time() if job_started is None else job_started
    t_resume = time.perf_counter()
    lines = run_dir.read_lines() if resume else []
    previous = [x for x in lines if "event" not in x]
    events = [x for x in lines if "event" in x]
    metric = get_task(meta["task"]).default_metric(cfg["ensemble"]["metric"])
    artifacts = make_artifacts(cfg, meta, run_dir, metric)
    lost = artifacts.restore(lines) if resume else set()
    done_ids = {r["id"] for r in previous if r.get("status") == "ok"} - lost
    source, total = make_source(cfg, meta, run_dir, lines, lost, workers=len(leaders) + master_trains or 1)
    del lines
    resume_seconds = round(time.perf_counter() - t_resume, 3)
    rt = cfg["runtime"]
    group_size = rt["group_size"]
    log.info(f"run {run_dir.path}: {meta['task']} on {meta['sizes']} samples, {total or '?'} members, "
             f"{len(leaders) or 'no'} {'groups of ' + str(group_size) + ' ranks' if group_size > 1 else 'workers'}"
             f"{' (serial)' if not leaders else ''}{' and the master' if master_trains else ''}"
             + (f", resuming with {len(done_ids)} finished (state read in {resume_seconds:.1f} s)"
                if resume else "")
             + (" [rehearsal: members sleep, nothing is trained]" if rt["trainer"] == "rehearsal" else ""))
    records = list(previous)
    if leaders:
        local = (lambda: make_trainer(cfg, meta, data, run_dir, 0)) if master_trains else None
        hand = in_hand(rt) if not packs(cfg) else \
            max(2 * rt["members_per_rank"], in_hand(rt) or 1)     # a pack in training, the next one in hand
        executor = MpiExecutor(comm, leaders, rt["poll_max_sleep"], hand, local=local,
                               block=rt["members_per_rank"] if packs(cfg) else 1)
    else:
        executor = SerialExecutor(lambda: make_trainer(cfg, meta, data, run_dir, 0))
    budget = RunBudget(rt["time_limit"], rt["finish_reserve"], rt["max_failed_share"], end_time=job_end_time())
    progress = Progress(total, metric, executor.workers, len(done_ids), rt["progress_lines"],
                        rt["progress_seconds"])
    beat = Heartbeat(run_dir.path, rt["progress_seconds"], progress.counts, job_started=round(job_started, 3),
                     total=total, workers=executor.workers, metric=metric, deadline=budget.deadline,
                     time_limit=rt["time_limit"], resumed_with=len(done_ids))

    def idle() -> None:
        journal.sync_if_due()
        beat.beat()
    with beat, run_dir.journal(rt["journal_sync_seconds"], before_sync=artifacts.store.sync) as journal:
        opened = open_event(cfg, executor, comm.Get_size(), job_started, command)
        if resume:
            opened["resume_seconds"] = resume_seconds
        journal.event(opened)
        if cfg["mode"] == "evolve":
            source.on_issue = journal.append      # each candidate's genome as it goes out: resume re-issues it
        decide = go_on
        discard = EarlyDiscard.from_config(cfg, metric)
        if discard is not None:                   # the search stops candidates that cannot reach the top
            discard.replay(previous)
            decide, source.discard = discard.decide, discard
        if cfg["mode"] == "pbt":                  # rounds: the lineage is on disk before anyone is answered
            source.on_round, source.answer, source.deadline = journal.event, executor.answer, budget.deadline
            decide = source.decide

        def on_results(results: list[dict]) -> None:
            released = artifacts.accept(results)          # candidates' arrays to the store
            journal.extend(results + released)
            artifacts.remove_released()                   # after the line that says so
            records.extend(results)
            for result in results:
                budget.observe(result)
            progress.add(results)
            beat.beat(late=True)        # a loop never idle (results always waiting) still beats, if less often
        # a serial master trains the members itself, with no idle moments: a thread beats for it
        with beat.kept_alive("running") if not leaders else nullcontext():
            account = dispatch(executor, source, on_results, should_stop=budget.should_stop,
                               adjust=lambda spec: progress.hand_out(artifacts.stamp(budget.cap(
                                   discard.stamp(spec) if discard is not None else spec))), idle=idle,
                               decide=decide)
        closed = {"event": "close", "time": round(time.time(), 4), **account,
                  "journal_syncs": journal.syncs + 1, "journal_bytes": journal.bytes}
        if account["master_busy_seconds"] is None:          # the serial master trains: no master share
            closed["master_wall_seconds"] = None
        journal.event(closed)
    events += [opened, closed]
    with beat.kept_alive("finishing"):
        if not progress.per_result:
            log.info(progress.summary())
        code = 0
        if budget.reason:
            failed = [r for r in records if r.get("status") != "ok"]
            kinds = sorted({r["error"]["kind"] for r in failed if "error" in r})
            log.warning(f"stopped early: {budget.reason}" + (f"\nfailures: {len(failed)} ({', '.join(kinds)})"
                                                             if failed else ""))
            code = 4 if budget.n_failed and "failed" in budget.reason else 0
        stats = run_stats(records, events)
        log.info(format_stats(stats))
        extra = {"run": stats}
        if cfg["mode"] == "evolve":
            extra["search"] = source.finish(records)
        if cfg["mode"] == "pbt":
            extra["pbt"] = source.finish()
            extra["pbt"]["master_report_bytes"] = getattr(executor, "report_bytes", 0)
        predictions = rt["trainer"] != "rehearsal" or cfg["rehearsal"]["predictions"]
        if predictions:
            extra["baseline"] = baseline_section(meta, data, cfg["seed"])
        try:
            summary = finalize(run_dir, records, cfg, meta, np.asarray(data["y_val"]), np.asarray(data["y_test"]),
                               extra, ensemble=predictions, artifacts=artifacts, prune=not budget.reason)
        except RuntimeError as exc:
            log.error(f"error: {exc}")
            beat.final("failed", error=str(exc))
            log.info(report_line(run_dir.path))              # the failures, listed with their messages
            return code or 1
        finally:
            artifacts.close()
        if predictions:
            log.info(format_comparison(summary))
        else:
            log.info("rehearsal without predictions (`rehearsal.predictions = false`): no ensemble selected")
        log.info(f"wrote {run_dir.path}/ensemble.json, leaderboard.csv, journal.jsonl  "
                 f"({time.monotonic() - t0:.1f} s)")
        beat.final("stopped" if budget.reason else "done", reason=budget.reason)
        log.info(report_line(run_dir.path))
        return code


def run_worker_side(comm, cfg: dict, meta: dict, data, run_dir: RunDirectory, group,
                    stamps: dict | None = None) -> None:
    """Ranks > 0: train what the master (through the group leader) sends until it says stop.
    ``stamps``: when this process reached each start-up step; the first result carries them
    with the trainer's set-up (TensorFlow imported) added (``results.timeline``)."""
    trainer = make_trainer(cfg, meta, data, run_dir, comm.Get_rank(), group, comm)
    stamps = {**(stamps or {}), "trainer": round(time.time(), 3)}
    serve(comm, trainer, cfg["runtime"]["poll_max_sleep"], group, startup=stamps)
