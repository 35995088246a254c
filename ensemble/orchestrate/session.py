"""One master session for real and simulated runs, and the workers' side.

``MasterSession`` is the master (rank 0) of every run: it reads the journal on resume,
asks the run's mode for its Source and Decider, binds them to the journal and the
executor (``Hooks``), journals the segment's ``open`` and ``close`` events, runs the
dispatch loop with the budget, retention and progress, and selects and writes the
ensemble. What differs between a real and a simulated run is injected: the executor
(serial, MPI, or ``orchestrate.simulate.SimExecutor``), the clock (the wall clock or a
virtual one) and whether a heartbeat (``status.json``) is kept. So ``ensemble.simulate``
runs any config the real run accepts: early discarding, PBT rounds, retention.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np

from ensemble.config import ConfigError, RunConfig
from ensemble.modes import Mode, RunContext, make_trainer, mode_of
from ensemble.orchestrate.dispatch import dispatch
from ensemble.orchestrate.progress import Progress
from ensemble.results.artifacts import Artifacts
from ensemble.results.crashes import REPEATS, CrashBook, Quarantine, handed_event, with_genomes
from ensemble.results.events import Event, EventKind, close_event, open_event
from ensemble.results.heartbeat import Heartbeat
from ensemble.results.journal import Journal, typed_history
from ensemble.results.records import FATAL_STOP, Counts, MemberRecord, fatal_failure, latest
from ensemble.results.report import report_line
from ensemble.results.rundir import RunDirectory
from ensemble.results.summary import finalize, format_comparison
from ensemble.results.timeline import format_stats, run_stats
from ensemble.results.tracking import Tracking
from ensemble.runtime import stopping, storage
from ensemble.runtime.budget import RunBudget
from ensemble.runtime.executor import Executor, MpiExecutor, SerialExecutor, serve
from ensemble.runtime.scheduler import job_end_time
from ensemble.sources.base import Hooks
from ensemble.task import get_task

log = logging.getLogger(__name__)


def in_hand(cfg: RunConfig, mode: Mode) -> int | None:
    """Specs a worker holds ahead (None: auto); a worker that packs holds a pack in
    training and the next one in hand."""
    rt = cfg.runtime
    hand = None if rt.specs_in_hand == "auto" else int(rt.specs_in_hand)
    return max(2 * rt.members_per_rank, hand or 1) if mode.packs(cfg) else hand


def baseline_section(meta: dict, data: Any, seed: int) -> dict:
    """The linear baseline's row for ensemble.json (``task.baseline``); never fails the run."""
    from ensemble.task.baseline import NAMES, linear_baseline
    if meta.get("stream"):                    # datafeed.streaming: no training rows in the master's memory
        return {"model": NAMES.get(meta["task"], "linear model"),
                "skipped": "the data streams (`data.stream`); the linear baseline is fitted on the training rows "
                           "in memory, so it is not fitted here"}
    try:
        return linear_baseline(meta["task"], data, meta["n_outputs"], seed)
    except Exception as exc:                  # noqa: BLE001 - a baseline must not cost the ensemble
        return {"model": NAMES.get(meta["task"], "linear model"), "skipped": f"{type(exc).__name__}: {exc}"}


def run_artifacts(cfg: RunConfig, meta: dict, run_dir: RunDirectory, writer: int = 0) -> Artifacts:
    """The run's retention and packed store (``results.artifacts``) on its ranking metric;
    ``writer``: whose files of the store it appends to (a hierarchy's sub-master k: k + 1)."""
    ens = cfg.ensemble
    return Artifacts(run_dir, get_task(meta["task"]).default_metric(ens.metric), ens.candidates, ens.keep_models,
                     mode_of(cfg).pareto(cfg, meta), writer=writer)


class MasterSession:
    """Rank 0 of a run (real or simulated). ``executor`` trains; ``clock`` is the master's;
    ``budget`` must use the same clock; ``heartbeat``: keep ``status.json`` (a real job);
    ``predictions``: members return predictions, so an ensemble is selected; ``report``:
    write report.html at the end; ``shares``: a master hierarchy whose sub-masters each run
    their own share (``runtime.hierarchy.ShareCoordinator``, also the ``executor``): no
    dispatch here, their tallies for the console and status.json, and at the end their
    journals absorbed into this one and the whole records read from them."""

    def __init__(self, cfg: RunConfig, meta: dict, data: Any, run_dir: RunDirectory, executor: Executor,
                 budget: RunBudget, *, resume: bool = False, clock: Callable[[], float] = time.time,
                 heartbeat: bool = True, predictions: bool = True, report: bool = True,
                 open_fields: dict | None = None,
                 job_started: float | None = None, serial: bool = False, master_trains: bool = False,
                 shares: Any = None):
        self.cfg, self.meta, self.data, self.run_dir = cfg, meta, data, run_dir
        self.executor, self.budget, self.clock = executor, budget, clock
        self.resume, self.keep_beat, self.predictions, self.serial = resume, heartbeat, predictions, serial
        self.master_trains, self.report, self.shares = master_trains, report, shares
        self.mode = mode_of(cfg)
        self.job_started = clock() if job_started is None else job_started
        self.open_fields = open_fields or {}
        self.records: list[MemberRecord] = []
        self.events: list[dict] = []
        self.account: dict = {}
        self.select_among: frozenset[str] | None = None    # set by ``Hooks.publish`` (mode "online")

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> int:
        """Dispatch until the source runs dry or the budget ends, then select and write the
        ensemble. Returns the process's exit code (0, or 4 when too many members failed)."""
        cfg, rt = self.cfg, self.cfg.runtime
        t0 = time.monotonic()
        t_resume = time.perf_counter()
        if self.resume:
            self.run_dir.absorb()                     # a killed hierarchical job's sub-master journals
        journal_path = self.run_dir.path / self.run_dir.JOURNAL
        known_upto = journal_path.stat().st_size if self.resume and journal_path.exists() else None
        lines = self.run_dir.read_lines() if self.resume else []
        artifacts = run_artifacts(cfg, self.meta, self.run_dir)
        metric = artifacts.metric
        lost = artifacts.restore(lines) if self.resume else set()
        history = typed_history(lines)
        del lines
        crashes = self.mode.crash_book(history) if self.resume else CrashBook()
        given_up = with_genomes(crashes.records(), history)     # journalled once the journal is open
        history += given_up
        previous = [x for x in history if isinstance(x, MemberRecord)]
        self.events = [x.to_json() for x in history if isinstance(x, Event)]
        done_ids = {r.id for r in previous if r.ok} - lost
        workers = self.executor.workers
        try:
            source, decider = self.mode.make(RunContext(cfg, self.meta, self.run_dir, history, frozenset(lost),
                                                        workers, metric))
        except ConfigError:                           # what the run's own journal says does not suit this job
            self.executor.shutdown()                  # (a population of 2 resumed on 1 worker): every worker
            raise                                     # stops, nothing was handed out; ensemble.run says it
        del history
        if crashes.suspects:                          # members in flight when an earlier job was lost
            names = ", ".join(sorted(crashes.suspects)[:5]) + (", ..." if len(crashes.suspects) > 5 else "")
            if self.mode.quarantines:
                source = Quarantine(source, crashes.suspects)
                how = (f"they go out at most {source.limit} at a time (halved after each lost job they are in "
                       "flight in), and one lost with the job again alone is given up")
            else:
                how = (f"they go out again; one lost with the job again alone, or in flight each of {REPEATS} "
                       "lost jobs, is given up")
            log.warning(f"resume: {len(crashes.suspects)} member(s) were training when an earlier job was lost "
                        f"({names}); {how}")
        total = source.total
        resume_seconds = round(time.perf_counter() - t_resume, 3)
        self._announce(total, len(done_ids), resume_seconds if self.resume else None)
        self.records = list(previous)
        left = self.mode.search_seconds_left(cfg, previous)
        ends = [t for t in (self.budget.deadline, None if left is None else self.clock() + left) if t is not None]
        progress = Progress(total, metric, workers, len(done_ids), rt.progress_lines, rt.progress_seconds,
                            clock=self.clock, ends_at=min(ends) if ends else None)
        beat = Heartbeat(self.run_dir.path, rt.heartbeat_seconds, progress.counts,
                         job_started=round(self.job_started, 3), total=total, workers=workers, metric=metric,
                         deadline=self.budget.deadline, time_limit=rt.time_limit,
                         members_end_apart=self.mode.members_end_apart,
                         resumed_with=len(done_ids)) if self.keep_beat else None
        self.tracking = Tracking(cfg, self.run_dir.path, self.meta, resume=self.resume,   # TensorBoard, MLflow
                                 known_upto=known_upto)    # earlier jobs' members the destinations lack
        journal_cm = Journal(self.run_dir.path / self.run_dir.JOURNAL, rt.journal_sync_seconds, clock=self.clock,
                             before_sync=artifacts.store.sync)
        with beat if beat is not None else nullcontext(), journal_cm as journal:
            opened = open_event(workers=workers, group_size=rt.group_size, ranks=self.open_fields.pop("ranks", 1),
                                host=self.open_fields.pop("host", socket.gethostname()), trainer=rt.trainer,
                                specs_in_hand=rt.specs_in_hand, job_started=self.job_started, now=self.clock(),
                                **self.open_fields, **({"resume_seconds": resume_seconds} if self.resume else {}))
            journal.event(opened)
            if self.keep_beat:                      # a real job: room to say it stopped if the disk fills
                storage.reserve(self.run_dir.path)
            if given_up:
                journal.extend([r.to_json() for r in given_up])
                for r in given_up:
                    log.warning(f"resume: {r.id} given up: {r.error_message}")

            def handed(spec: dict) -> dict:
                if self.keep_beat:                    # a real job: who is in flight if it is lost
                    journal.append(handed_event(spec["id"], self.clock()))     # flushed; fsynced with the next batch
                return spec
            def publish(extra: dict, among: frozenset[str] | None = None) -> dict:   # mode "online": mid-run
                self.select_among = among                     # the end selects among the same members
                journal.sync()
                return finalize(self.run_dir, self.records, cfg, self.meta, np.asarray(self.data["y_val"]),
                                np.asarray(self.data["y_test"]), extra, ensemble=self.predictions,
                                artifacts=artifacts, prune=False, pool=self._pool(artifacts))

            hooks = Hooks(event=journal.event, answer=self.executor.answer, deadline=lambda: self.budget.deadline,
                          clock=self.clock, publish=publish)
            source.bind(hooks)
            decider.bind(hooks)

            def idle() -> None:
                stopping.take()                               # a signal's stop dropped on its way
                journal.sync_if_due()
                self.tracking.idle()                          # members gathered before a lull go out
                if beat is not None:
                    beat.beat()

            def on_results(records: list[MemberRecord]) -> None:
                self.tracking.results(records)                # queued; written by its own thread
                out = [r.to_json() for r in records]
                released = artifacts.accept(out)              # candidates' arrays to the store
                journal.extend(out + released)
                artifacts.remove_released()                   # after the line that says so
                kept = [MemberRecord.from_json(x) for x in out]   # as journalled: without the arrays
                self.records.extend(kept)
                for record in kept:
                    self.budget.observe(record.status.evaluated, record.train_seconds, fatal_failure(record))
                progress.add(kept)
                if beat is not None:
                    beat.beat(late=True)      # a loop never idle (results always waiting) still beats, if less often

            alive = beat.kept_alive("running") if beat is not None and self.serial else nullcontext()
            dispatched = False
            try:
                with alive:  # a serial master trains the members itself, with no idle moments: a thread beats
                    if self.shares is not None:
                        self.account = self._coordinate(lost, progress, idle, beat)
                    else:
                        self.account = dispatch(
                            self.executor, source, on_results, decider=decider, should_stop=self.budget.should_stop,
                            adjust=lambda spec: handed(progress.hand_out(artifacts.stamp(self.budget.cap(spec)))),
                            idle=idle, clock=self.clock)
                dispatched = True
            except KeyboardInterrupt:                 # Ctrl-C, SIGTERM: a stop, not a crash (results.crashes)
                journal.append(Event(EventKind.INTERRUPTED, {"time": round(self.clock(), 4)}).to_json())
                raise
            except OSError as exc:                    # a full disk is no member's crash either: said through
                full = storage.storage_full(exc)      # the reserve's room (the journal's buffer holds the failed write)
                if full is not None and self.keep_beat:
                    stop = Event(EventKind.INTERRUPTED, {"time": round(self.clock(), 4),
                                                         "reason": storage.full_message(full)})
                    storage.append_last_line(journal.path, json.dumps(stop.to_json(), sort_keys=True))
                raise
            finally:
                if self.keep_beat and not dispatched:
                    storage.release(self.run_dir.path)
            account = dict(self.account)
            if account["master_busy_seconds"] is None:          # the serial master trains: no master share
                account["master_wall_seconds"] = None
            closed = close_event(account, journal_syncs=journal.syncs + 1, journal_bytes=journal.bytes,
                                 now=self.clock())
            journal.event(closed)
            self.journal_bytes = journal.bytes
        self.events += [opened, closed]
        try:
            if self.shares is not None:
                artifacts = self._absorb(previous, artifacts)
            with beat.kept_alive("finishing") if beat is not None else nullcontext():
                try:
                    code = self._finish(source, progress, artifacts, beat, t0)
                except OSError as exc:                # a full disk while writing the outputs: the reserve's
                    if storage.storage_full(exc) is not None:     # room lets status.json say the run failed
                        storage.release(self.run_dir.path)       # and why (it was left at "finishing": "dead")
                    raise
        finally:
            if self.keep_beat:
                storage.release(self.run_dir.path)
        self.tracking.close(ok=code == 0)                    # bounded by tracking.finish_seconds
        return code

    def _coordinate(self, lost: set[str], progress: Progress, idle: Callable[[], None],
                    beat: Heartbeat | None) -> dict:
        """A hierarchy whose sub-masters run their own shares: start them, follow their
        tallies; the budget's outcome is theirs (the first reason any gave, their counts)."""
        def on_tallies(tallies: list[dict]) -> None:
            progress.take_tallies(tallies)
            if beat is not None:
                beat.beat(late=True)
        account = self.shares.run({"lost": sorted(lost), "deadline": self.budget.deadline}, on_tallies, idle,
                                  self.clock)
        shares = account["shares"]
        self.budget.n_ok = sum(s["ok"] for s in shares)
        self.budget.n_failed = sum(s["failed"] for s in shares)
        self.budget.reason = next((s["reason"] for s in shares if s["reason"]), None)
        self.budget.failures_stopped = bool(self.budget.n_failed and self.budget.reason
                                            and ("max_failed_share" in self.budget.reason
                                                 or FATAL_STOP in self.budget.reason))
        return account

    def _absorb(self, previous: list[MemberRecord], artifacts: Artifacts) -> Artifacts:
        """A hierarchy whose sub-masters kept the books: their journals into this one, their
        whole records, and the kept candidates of every writer of the store (read again: the
        sub-masters wrote to it) as the run's retention."""
        lines = self.run_dir.absorb()
        mine = [x for x in typed_history(lines) if isinstance(x, MemberRecord)]
        self.records = previous + mine
        self.tracking.results(mine)
        artifacts.close()
        merged = run_artifacts(self.cfg, self.meta, self.run_dir)
        merged.restore(self.run_dir.read_lines())
        return merged

    def _pool(self, artifacts: Artifacts) -> list[str] | None:
        """The candidates selection chooses from: all kept, or those ``Hooks.publish`` named."""
        among = self.select_among
        return None if among is None else [i for i in artifacts.pool() if i in among]

    def _announce(self, total: int | None, done: int, resume_seconds: float | None) -> None:
        rt = self.cfg.runtime
        workers = self.executor.workers - self.master_trains
        from datafeed.splits import describe_split
        log.info(f"run {self.run_dir.path}: {self.meta['task']} on {self.meta['sizes']} samples (split "
                 f"{describe_split(self.meta, self.cfg.data, self.cfg.seed)}), "
                 + (f"{total} member{'s' if total != 1 else ''}, " if total else "members until it is ended, ")
                 + f"{workers} {'group' if rt.group_size > 1 else 'worker'}{'s' if workers != 1 else ''}"
                 f"{' of ' + str(rt.group_size) + ' ranks' if rt.group_size > 1 else ''}"
                 f"{' (serial)' if self.serial else ''}{' and the master' if self.master_trains else ''}"
                 + (f", resuming with {done} finished (state read in {resume_seconds:.1f} s)"
                    if resume_seconds is not None else "")
                 + (" [rehearsal: members sleep, nothing is trained]" if rt.trainer == "rehearsal" else ""))

    def _finish(self, source, progress: Progress, artifacts: Artifacts, beat: Heartbeat | None, t0: float) -> int:
        cfg = self.cfg
        budget, records = self.budget, self.records
        if not progress.per_result:
            log.info(progress.summary())
        code = 0
        final = Counts.of_records(records)                                          # a retried member once
        again = self.mode.resume_trains(cfg, records, source.total)     # what a --resume trains (the report says)
        kinds = sorted({r.error_kind for r in latest(records).values() if not r.status.evaluated and r.error_kind})
        failures = (f"\nended without a result: {final.not_ok} of {final.ended} members ({', '.join(kinds)})"
                    if final.not_ok else "")
        tried = source.total is not None and len({r.id for r in records}) >= source.total    # none left to hand out
        if budget.failures_stopped and tried:
            if final.ok:                              # else finalize says no member finished
                log.warning(f"{budget.reason.split(';')[0]}, but every member was tried (nothing was left to "
                            f"hand out): the run is complete, its ensemble made of the {final.ok} that finished; "
                            "`--resume` would train the others again" + failures)
            budget.reason, code = None, 4
        elif budget.reason and not budget.failures_stopped and tried:
            budget.reason = None                      # the time limit neared once every member was out: complete
        elif budget.reason:
            log.warning(f"stopped early: {budget.reason}" + failures)
            code = 4 if budget.failures_stopped else 0
        if not records and budget.reason and not budget.failures_stopped:     # the deadline came before any start
            left = None if budget.deadline is None else budget.deadline - time.time()
            when = f"passed {-left:.0f} s ago" if left is not None and left <= 0 else "left too little time for one"
            log.error(f"error: no member was started: the deadline, the job's time limit less `runtime.finish_reserve` "
                      f"({cfg.runtime.finish_reserve:g} s), {when}; give the job more time, or lower "
                      "`runtime.finish_reserve`, then --resume")
            if beat is not None:
                beat.final("stopped", reason=budget.reason, resume_trains=again)
            artifacts.close()
            return 1
        stats = run_stats(records, self.events)
        log.info(format_stats(stats))
        extra: dict = {"run": stats, **source.finish(records), "master_report_bytes": self.executor.report_bytes}
        if self.predictions:
            extra["baseline"] = baseline_section(self.meta, self.data, cfg.seed)
        try:
            summary = finalize(self.run_dir, records, cfg, self.meta, np.asarray(self.data["y_val"]),
                               np.asarray(self.data["y_test"]), extra, ensemble=self.predictions,
                               artifacts=artifacts, prune=not budget.reason, pool=self._pool(artifacts))
        except RuntimeError as exc:
            log.error(f"error: {exc}")
            if beat is not None:
                beat.final("failed", error=str(exc), resume_trains=again)
            if self.report:
                log.info(report_line(self.run_dir.path))          # the failures, listed with their messages
            return code or 1
        finally:
            artifacts.close()
        self.summary = summary
        if self.predictions:
            log.info(format_comparison(summary))
        else:
            log.info("no predictions (a rehearsal with `rehearsal.predictions = false`, or a simulation): "
                     "no ensemble selected")
        log.info(f"wrote {self.run_dir.path}/ensemble.json, leaderboard.csv, journal.jsonl  "
                 f"({time.monotonic() - t0:.1f} s)")
        if beat is not None:
            beat.final("stopped" if budget.reason else "done", reason=budget.reason, resume_trains=again)
        if self.report:
            log.info(report_line(self.run_dir.path))
        self.tracking.finish(summary)
        return code


def run_master_side(comm, cfg: RunConfig, meta: dict, data, run_dir: RunDirectory, resume: bool,
                    leaders: list[int], job_started: float | None = None, command: list[str] | None = None,
                    master_trains: bool = False, executor: Executor | None = None,
                    fields: dict | None = None, shares: Any = None) -> int:
    """Rank 0 of a real job: the MPI executor over the worker groups (or, alone, the serial
    one), the wall clock, the job's budget; then the master session. ``command``: the job's
    arguments, for the journal (default ``sys.argv[1:]``); ``master_trains``: rank 0 also
    trains, in a thread (``runtime.executor.LocalWorker``); ``executor``: another executor
    over the job's ranks (a master hierarchy's, ``orchestrate.submasters``), with ``fields``
    for the journal's ``open`` line; ``shares``: a hierarchy's coordinator whose sub-masters
    run their own shares (``runtime.hierarchy.ShareCoordinator``)."""
    from ensemble.runtime.env import environment
    from ensemble.runtime.mpi import library_version
    rt = cfg.runtime
    mode = mode_of(cfg)
    chosen: Executor
    if shares is not None:
        chosen = shares
    elif executor is not None:
        chosen = executor
    elif leaders:
        local = (lambda: make_trainer(cfg, meta, data, run_dir, 0)) if master_trains else None
        chosen = MpiExecutor(comm, leaders, rt.poll_max_sleep, in_hand(cfg, mode), local=local,
                             block=rt.members_per_rank if mode.packs(cfg) else 1,
                             helpers=mode.tail_helpers(cfg, len(leaders)))
    else:
        chosen = SerialExecutor(lambda: make_trainer(cfg, meta, data, run_dir, 0))
    budget = RunBudget(rt.time_limit, rt.finish_reserve, rt.max_failed_share, end_time=job_end_time(),
                       stop_quantile=rt.stop_quantile)
    predictions = rt.trainer != "rehearsal" or cfg.rehearsal.predictions
    fields = {"ranks": comm.Get_size(), "host": socket.gethostname(),
              "environment": environment(command if command is not None else sys.argv[1:], library_version()),
              **(fields or {})}
    session = MasterSession(cfg, meta, data, run_dir, chosen, budget, resume=resume, predictions=predictions,
                            open_fields=fields, job_started=job_started, serial=isinstance(chosen, SerialExecutor),
                            master_trains=master_trains, shares=shares)
    return session.run()


def run_worker_side(comm, cfg: RunConfig, meta: dict, data, run_dir: RunDirectory, group,
                    stamps: dict | None = None) -> None:
    """Ranks > 0: train what the master (through the group leader) sends until it says stop.
    ``stamps``: when this process reached each start-up step; the first result carries them
    with the trainer's set-up (TensorFlow imported) added (``results.timeline``)."""
    trainer = make_trainer(cfg, meta, data, run_dir, comm.Get_rank(), group, comm)
    stamps = {**(stamps or {}), "trainer": round(time.time(), 3)}
    serve(comm, trainer, cfg.runtime.poll_max_sleep, group, startup=stamps)
