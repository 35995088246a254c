"""A master hierarchy in the real run (``runtime.sub_masters``): its shape and its roles.

The shape is ``fastsim.hierarchy_shape``, the function the simulator's ``--sub-masters
auto`` uses: sub-masters enough to keep each under half busy by the recorded master cost
(``simulate.MASTER_COST_US``) and the members' mean seconds, at most one per
``fastsim.MIN_SHARE`` groups, none below two. The ranks' roles are fixed when the job
starts, so "auto" reads the member time of what the run has measured so far: a resumed
run's finished members, or a rehearsal's own median seconds; a fresh run of trained
members has measured nothing yet and starts flat. ``runtime.hierarchy`` holds the
executor, the sub-master's loop and the layout; this module chooses the shape on rank 0,
tells every rank, and starts each rank's role, and holds ``SubBooks``, a sub-master's
own books where the mode allows them (``Mode.sub_master_books``).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

from ensemble.config import Problems, RunConfig
from ensemble.modes import make_trainer, mode_of
from ensemble.orchestrate.fastsim import hierarchy_shape
from ensemble.orchestrate.session import in_hand, run_master_side
from ensemble.orchestrate.simulate import master_cost
from ensemble.results.artifacts import Artifacts
from ensemble.results.journal import Journal
from ensemble.results.records import MemberRecord
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import serve
from ensemble.runtime.hierarchy import HierarchyExecutor, Layout, serve_sub_master, share_leaders, split

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
    """Sub-master ``k``'s own books: it journals its members' records in its own journal
    (``RunDirectory.sub_journal``, the same group commit as the master's) and keeps the
    candidates among them in its own files of the store (``Artifacts`` as writer ``k + 1``,
    with its own retention bars in the specs it hands out), and sends up only each result's
    brief (``MemberRecord.brief``). The master reads the whole records when it absorbs the
    journal (``RunDirectory.absorb``) and selects among every writer's kept candidates.
    Opened at the first spec, so a resume's absorb of a killed job's journals (before any
    spec is dealt) is over before a sub-master writes."""

    def __init__(self, cfg: RunConfig, meta: dict, run_dir: RunDirectory, k: int, offset: int = 0,
                 clock: Callable[[], float] = time.time):
        """``offset``: the share's first worker among all the job's (records name the job's worker)."""
        from ensemble.task import get_task
        self.cfg, self.meta, self.run_dir, self.k, self.clock = cfg, meta, run_dir, k, clock
        self.offset = offset
        self.metric = get_task(meta["task"]).default_metric(cfg.ensemble.metric)
        self.artifacts: Artifacts | None = None
        self.journal: Journal | None = None
        self.sent: dict[str, float] = {}

    def _open(self) -> Artifacts:
        if self.artifacts is None:
            ens = self.cfg.ensemble
            self.artifacts = Artifacts(self.run_dir, self.metric, ens.candidates, ens.keep_models,
                                       mode_of(self.cfg).pareto(self.cfg, self.meta), writer=self.k + 1)
            self.journal = Journal(self.run_dir.sub_journal(self.k), self.cfg.runtime.journal_sync_seconds,
                                   clock=self.clock, before_sync=self.artifacts.store.sync)
        return self.artifacts

    def hand_out(self, spec: dict) -> dict:
        artifacts = self._open()
        self.sent[str(spec["id"])] = round(self.clock(), 4)
        return artifacts.stamp(spec)

    def take(self, results: list[dict]) -> list[dict]:
        artifacts = self._open()
        now = round(self.clock(), 4)
        for r in results:
            r["worker"] += self.offset
        out = [MemberRecord.from_json(r).replace(dispatched=self.sent.pop(str(r["id"]), None), received=now).to_json()
               for r in results]
        released = artifacts.accept(out)              # candidates' arrays to the store; payloads dropped
        self.journal.extend(out + released)
        artifacts.remove_released()                   # after the line that says so
        return [MemberRecord.brief(line, self.metric) for line in out]

    def idle(self) -> None:
        if self.journal is not None:
            self.journal.sync_if_due()

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()                      # the store first (before_sync), then the journal
        if self.artifacts is not None:
            self.artifacts.close()


def check_hierarchy(cfg: RunConfig, workers: int, found: Problems) -> int:
    """Every rank, with the config's checks: a fixed number of sub-masters must suit the
    config and the job's ``workers`` ranks (besides rank 0). Returns the ranks they take
    from the workers (0 for "auto", which fits itself to the job)."""
    subs = cfg.runtime.sub_masters
    if subs == AUTO or subs == 0:
        return 0
    why = unsuited(cfg)
    if why is not None:
        found.add(f"`runtime.sub_masters = {subs}` cannot be used: {why}; set `runtime.sub_masters = 0`",
                  "runtime.sub_masters")
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
    (``fastsim.hierarchy_shape``) fitted to the job (0 when it does not fit or suit)."""
    setting = cfg.runtime.sub_masters
    if setting != AUTO:
        return int(setting)
    if unsuited(cfg) is not None:
        return 0
    g = cfg.runtime.group_size
    subs = hierarchy_shape((size - 1) // g, mean_seconds, master_cost(cfg.mode))
    while subs >= 2 and Layout(size, subs, g).problem() is not None:
        subs -= 1
    return subs if subs >= 2 else 0


def shape_on_every_rank(comm, cfg: RunConfig, run_dir: RunDirectory | None, resume: bool) -> int:
    """Every rank: how many sub-masters this job has. A fixed setting needs no message;
    "auto" is chosen on rank 0 (it reads the journal) and broadcast."""
    if cfg.runtime.sub_masters != AUTO:
        return int(cfg.runtime.sub_masters)
    from ensemble.runtime.mpi import polite_bcast
    subs = None
    if comm.Get_rank() == 0:
        mean = measured_seconds(cfg, run_dir, resume) if run_dir is not None else None
        subs = choose(cfg, comm.Get_size(), mean)
        if subs:
            log.info(f"runtime.sub_masters = \"auto\": {subs} sub-masters for members of {mean:.3g} s "
                     f"on {comm.Get_size() - 1 - subs} workers")
    return polite_bcast(comm, subs, 0, cfg.runtime.poll_max_sleep)


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
    books = mode_of(cfg).sub_master_books(cfg)
    if role == "top":
        executor = HierarchyExecutor(comm, layout.sub_ranks, layout.shares(), hand, rt.poll_max_sleep, books=books)
        return run_master_side(comm, cfg, meta, data, run_dir, resume, [], job_started, command, executor=executor,
                               fields={"sub_masters": subs, "shares": layout.shares(), "sub_master_books": books},
                               sub_books=books)
    if role == "sub":
        serve_sub_master(comm, share, share_leaders(layout, k), hand, rt.poll_max_sleep,
                         helpers=mode_of(cfg).tail_helpers(cfg, layout.groups),
                         books=SubBooks(cfg, meta, run_dir, k, sum(layout.shares()[:k])) if books else None)
        return 0
    trainer = make_trainer(cfg, meta, data, run_dir, comm.Get_rank(), group, comm)
    serve(share, trainer, rt.poll_max_sleep, group, startup={**(stamps or {}), "trainer": round(time.time(), 3)})
    return 0
