"""A master hierarchy in the real run (``runtime.sub_masters``): its shape and its roles.

The shape is ``fastsim.hierarchy_shape``, the function the simulator's ``--sub-masters
auto`` uses: sub-masters enough to keep each under half busy by the recorded master cost
(``simulate.MASTER_COST_US``) and the members' mean seconds, at most one per
``fastsim.MIN_SHARE`` groups, none below two. The ranks' roles are fixed when the job
starts, so "auto" reads the member time of what the run has measured so far: a resumed
run's finished members, or a rehearsal's own median seconds; a fresh run of trained
members has measured nothing yet and starts flat. ``runtime.hierarchy`` holds the
executor, the sub-master's loop and the layout; this module chooses the shape on rank 0,
tells every rank, and starts each rank's role; where the mode allows it
(``Mode.sub_master_books``) each sub-master runs its own share (``serve_share``, with its
own books, ``SubBooks``) and the top master only coordinates (``ShareCoordinator``).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable

from ensemble.config import Problems, RunConfig
from ensemble.modes import RunContext, make_trainer, mode_of
from ensemble.orchestrate.dispatch import dispatch
from ensemble.orchestrate.fastsim import MIN_SHARE, hierarchy_shape
from ensemble.orchestrate.progress import Progress
from ensemble.orchestrate.session import in_hand, run_artifacts, run_master_side
from ensemble.orchestrate.simulate import master_cost
from ensemble.results.crashes import handed_event
from ensemble.results.journal import Journal, typed_history
from ensemble.results.records import MemberRecord, fatal_failure
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.budget import RunBudget
from ensemble.runtime.executor import MpiExecutor, serve
from ensemble.runtime.hierarchy import (
    TALLY_SECONDS,
    HierarchyExecutor,
    Layout,
    ShareCoordinator,
    owner,
    serve_sub_master,
    share_leaders,
    split,
)
from ensemble.sources.base import Hooks

log = logging.getLogger(__name__)

AUTO = "auto"


def unsuited(cfg: RunConfig) -> str | None:
    """Why this config's run cannot have sub-masters (they answer in-training reports with
    "continue" and hand out single specs), or None."""
    mode = mode_of(cfg)
    why = mode.hierarchy_problem(cfg)
    if why is not None:
        return why
    if mode.packs(cfg):
        return "`runtime.members_per_rank` > 1 packs specs on a worker"
    if cfg.runtime.master_trains is True:
        return "`runtime.master_trains = true` trains on rank 0, which only deals specs in a hierarchy"
    return None


class SubBooks:
    """Sub-master ``k``'s own books while it runs its share: its members' records in its own
    journal (``RunDirectory.sub_journal``, the same group commit as the master's), the
    candidates among them in its own files of the store (``Artifacts`` as writer ``k + 1``,
    its own retention bars in the specs it hands out), its budget and its counts, of which
    the top master gets a ``tally`` every ``TALLY_SECONDS``. The top reads the whole records
    when it absorbs the journal (``RunDirectory.absorb``) and selects among every writer's
    kept candidates. ``offset``: the share's first worker among the job's (records name the
    job's worker)."""

    def __init__(self, cfg: RunConfig, meta: dict, run_dir: RunDirectory, k: int, budget: RunBudget,
                 progress: Progress, offset: int = 0, send: Callable[[dict], None] | None = None,
                 clock: Callable[[], float] = time.time):
        self.run_dir, self.budget, self.progress, self.offset = run_dir, budget, progress, offset
        self.send, self.clock = send, clock
        self.artifacts = run_artifacts(cfg, meta, run_dir, writer=k + 1)
        self.journal = Journal(run_dir.sub_journal(k), cfg.runtime.journal_sync_seconds, clock=clock,
                               before_sync=self.artifacts.store.sync)
        self.last_tally = -float("inf")

    def stamp(self, spec: dict) -> dict:
        """The spec as it goes out, journalled as handed out first (``results.crashes``: a member
        that kills its worker takes the job with it; without these lines a resume had no suspect,
        and the same member lost every resumed job of a hierarchy)."""
        self.journal.append(handed_event(spec["id"], self.clock()))     # flushed; fsynced with the next batch
        return self.progress.hand_out(self.artifacts.stamp(spec))

    def on_results(self, records: list[MemberRecord]) -> None:
        out = [r.to_json() for r in records]
        for line in out:
            line["worker"] += self.offset
        released = self.artifacts.accept(out)         # candidates' arrays to the store; payloads dropped
        self.journal.extend(out + released)
        self.artifacts.remove_released()              # after the line that says so
        for record in records:
            self.budget.observe(record.status.evaluated, record.train_seconds, fatal_failure(record))
        self.progress.add(records)
        self.tally_if_due()

    def tally_if_due(self) -> None:
        if self.send is not None and self.clock() - self.last_tally >= TALLY_SECONDS:
            self.last_tally = self.clock()
            self.send({"tally": self.progress.tally()})

    def idle(self) -> None:
        self.journal.sync_if_due()
        self.tally_if_due()

    def close(self) -> None:
        self.journal.close()                          # the store first (before_sync), then the journal
        self.artifacts.close()


def serve_share(comm, share, layout: Layout, k: int, cfg: RunConfig, meta: dict, run_dir: RunDirectory) -> int:
    """Sub-master ``k`` running its own share of the run on its workers (``share``, its
    communicator, where it is rank 0): once the top says go (after its resume's absorb), the
    members ``owner`` gives it, minus those the journal has finished, through the flat
    master's dispatch loop, executor, budget and tail helpers, journalled and kept in its own
    books; then it closes them and tells the top. Returns how many results it journalled."""
    from ensemble.runtime.mpi import TAG_RESULT, TAG_SPEC, polite_wait, poll_recv
    rt = cfg.runtime
    mode = mode_of(cfg)
    go, _, _ = poll_recv(comm, 0, TAG_SPEC, rt.poll_max_sleep)
    from ensemble.task import get_task
    metric = get_task(meta["task"]).default_metric(cfg.ensemble.metric)
    shares = layout.shares()
    leaders = share_leaders(layout, k)
    history = typed_history(run_dir.read_lines())
    source, decider = mode.make(RunContext(cfg, meta, run_dir, history, frozenset(go["lost"]), len(leaders), metric,
                                           mine=lambda member_id: owner(member_id, shares) == k))
    del history
    executor = MpiExecutor(share, leaders, rt.poll_max_sleep, in_hand(cfg, mode),
                           helpers=mode.tail_helpers(cfg, layout.groups))
    budget = RunBudget(rt.time_limit, rt.finish_reserve, rt.max_failed_share, stop_quantile=rt.stop_quantile)
    budget.deadline = go["deadline"]                  # the top's, so every share stops by the same time
    sends: list = []

    def send(message: dict) -> None:
        sends.append(comm.isend(message, dest=0, tag=TAG_RESULT))
        sends[:] = [r for r in sends if not r.Test()]

    books = SubBooks(cfg, meta, run_dir, k, budget, Progress(None, metric, len(leaders), lines=0, every=math.inf),
                     offset=sum(shares[:k]), send=send)
    hooks = Hooks(event=books.journal.event, answer=executor.answer, deadline=lambda: budget.deadline, clock=time.time)
    source.bind(hooks)
    decider.bind(hooks)
    try:
        account = dispatch(executor, source, books.on_results, decider=decider, should_stop=budget.should_stop,
                           adjust=lambda spec: books.stamp(budget.cap(spec)), idle=books.idle)
    finally:
        books.close()
    polite_wait(sends, rt.poll_max_sleep)
    comm.send({"tally": books.progress.tally(),
               "closed": {**account, "reason": budget.reason, "ok": budget.n_ok, "failed": budget.n_failed}},
              dest=0, tag=TAG_RESULT)
    return account["results"]


def suited(cfg: RunConfig, found: Problems) -> bool:
    """Whether a fixed number of sub-masters suits the config's other settings, whatever the job's
    size (``unsuited``); the problem added to ``found`` if not. ``ensemble check`` asks it too."""
    subs = cfg.runtime.sub_masters
    why = None if subs == AUTO or subs == 0 else unsuited(cfg)
    if why is not None:
        found.add(f"`runtime.sub_masters = {subs}` cannot be used: {why}; set `runtime.sub_masters = 0`",
                  "runtime.sub_masters")
    return why is None


def check_hierarchy(cfg: RunConfig, workers: int, found: Problems) -> int:
    """Every rank, with the config's checks: a fixed number of sub-masters must suit the
    config and the job's ``workers`` ranks (besides rank 0). Returns the ranks they take
    from the workers (0 for "auto", which fits itself to the job)."""
    subs = cfg.runtime.sub_masters
    if not suited(cfg, found):
        return 0
    if subs == AUTO or subs == 0:
        return 0
    problem = Layout(workers + 1, int(subs), cfg.runtime.group_size).problem()
    if problem is not None:
        found.add(f"`runtime.sub_masters`: {problem}", "runtime.sub_masters")
        return 0
    return int(subs)


def measured_seconds(cfg: RunConfig, run_dir: RunDirectory, resume: bool) -> float | None:
    """The members' mean seconds as far as the run has measured them (None: not yet)."""
    if resume:
        seconds = [line["train_seconds"] for line in run_dir.read_lines()
                   if line.get("status") == "ok" and isinstance(line.get("train_seconds"), int | float)]
        if seconds:
            return statistics.fmean(seconds)
    if cfg.runtime.trainer == "rehearsal":
        return cfg.rehearsal.seconds
    return None


def choose(cfg: RunConfig, size: int, mean_seconds: float | None) -> int:
    """Sub-masters for a job of ``size`` ranks: the setting, or for "auto" the shared shape
    (``fastsim.hierarchy_shape``) fitted to the job (0 when it does not fit or suit, and in a
    mode whose shares cannot run on their own: there the top master keeps every result's
    bookkeeping, which is what saturates it, so sub-masters would only cost ranks)."""
    setting = cfg.runtime.sub_masters
    if setting != AUTO:
        return int(setting)
    if unsuited(cfg) is not None or not mode_of(cfg).sub_master_books(cfg):
        return 0
    g = cfg.runtime.group_size
    subs = hierarchy_shape((size - 1) // g, mean_seconds, master_cost(cfg.mode))
    while subs >= 2 and Layout(size, subs, g).problem() is not None:
        subs -= 1
    return subs if subs >= 2 else 0


def shape_on_every_rank(comm, cfg: RunConfig, run_dir: RunDirectory | None, resume: bool) -> int:
    """Every rank: how many sub-masters this job has, chosen on rank 0 (it reads the journal)
    and broadcast: the setting, or for "auto" the shape fitted to the job; none for a resume
    with crash suspects (``flat_for_suspects``)."""
    from ensemble.runtime.mpi import polite_bcast
    subs = None
    if comm.Get_rank() == 0:
        size = comm.Get_size()
        if cfg.runtime.sub_masters != AUTO:
            subs = int(cfg.runtime.sub_masters)
        else:
            could = (size - 1) // cfg.runtime.group_size >= 2 * MIN_SHARE     # else flat, with nothing read
            mean = measured_seconds(cfg, run_dir, resume) if could and run_dir is not None else None
            subs = choose(cfg, size, mean)
            if subs:
                log.info(f"runtime.sub_masters = \"auto\": {subs} sub-masters for members of {mean:.3g} s "
                         f"on {comm.Get_size() - 1 - subs} workers")
        if subs and resume and run_dir is not None and (size - 1) % cfg.runtime.group_size == 0 \
                and flat_for_suspects(cfg, run_dir):
            subs = 0
    return polite_bcast(comm, subs, 0, cfg.runtime.poll_max_sleep)


def flat_for_suspects(cfg: RunConfig, run_dir: RunDirectory) -> bool:
    """Whether a resume runs with one master because an earlier job was lost with members in flight
    (``results.crashes``): sub-masters that run their own shares hand them out each on its own,
    so no share can see that a suspect trains alone, and one that kills its worker took every
    resumed job with it (9 in a row). One master hands them out a few at a time and gives the
    culprit up; the next resume, with no suspect left, has its sub-masters again (said)."""
    mode = mode_of(cfg)
    if not mode.sub_master_books(cfg):
        return False
    suspects = mode.crash_book(run_dir.history()).suspects
    if suspects:
        log.warning(f"resume: {len(suspects)} member(s) were training when an earlier job was lost; this job runs "
                    "with one master (`runtime.sub_masters` ignored for it), which hands them out a few at a time "
                    "and gives up one that is lost with the job again alone")
    return bool(suspects)


def run_hierarchy(comm, cfg: RunConfig, meta: dict, data, run_dir: RunDirectory, resume: bool, subs: int,
                  job_started: float | None = None, command: list[str] | None = None,
                  stamps: dict | None = None) -> int:
    """Every rank of a job with ``subs`` sub-masters: the top master's session, a
    sub-master's loop, or a worker's ``serve`` on its share. Returns the exit code (0 off rank 0)."""
    rt = cfg.runtime
    layout = Layout(comm.Get_size(), subs, rt.group_size)
    share, group = split(comm, layout)                   # collective
    role, k = layout.role(comm.Get_rank())
    hand = in_hand(cfg, mode_of(cfg))
    own_shares = mode_of(cfg).sub_master_books(cfg)     # each sub-master runs its share on its own
    if role == "top":
        fields = {"sub_masters": subs, "shares": layout.shares(), "own_shares": own_shares}
        if own_shares:
            coordinator = ShareCoordinator(comm, layout.sub_ranks, layout.shares(), rt.poll_max_sleep)
            return run_master_side(comm, cfg, meta, data, run_dir, resume, [], job_started, command,
                                   fields=fields, shares=coordinator)
        executor = HierarchyExecutor(comm, layout.sub_ranks, layout.shares(), hand, rt.poll_max_sleep)
        return run_master_side(comm, cfg, meta, data, run_dir, resume, [], job_started, command, executor=executor,
                               fields=fields)
    if role == "sub":
        if own_shares:
            serve_share(comm, share, layout, k, cfg, meta, run_dir)
        else:
            serve_sub_master(comm, share, share_leaders(layout, k), hand, rt.poll_max_sleep,
                             helpers=mode_of(cfg).tail_helpers(cfg, layout.groups))
        return 0
    trainer = make_trainer(cfg, meta, data, run_dir, comm.Get_rank(), group, comm)
    serve(share, trainer, rt.poll_max_sleep, group, startup={**(stamps or {}), "trainer": round(time.time(), 3)})
    return 0
