"""What a mode is: one object that says everything the rest of the run asks of it.

A mode (``ensemble``, ``evolve``, ``pbt``) provides its Source (what to train next), its
Decider (what to stop or change while members train), its Keras trainer choice (packed,
population), its preflight checks (those that need the data or the world size), how many
members it expects (status, progress), and how it describes itself (``--check``, status).
Adding a mode means adding one module here and registering it in ``ensemble.modes``;
nothing else in the code branches on the mode's name (a test keeps it so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ensemble.config import Problems, RunConfig, member_train_settings
from ensemble.results.crashes import REPEATS, CrashBook, read_crashes
from ensemble.results.events import Event
from ensemble.results.records import MemberRecord
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import OneByOne, Trainer
from ensemble.sources.base import Decider, Source


@dataclass(frozen=True)
class Sample:
    """A network ``--check`` builds: its name, the setting it comes from (``where``), its
    member spec (None: not built, the problem is noted already), what it is (``count``, e.g.
    "3 member(s)", and ``text``, its layers), and the architecture entry it comes from."""

    name: str
    where: str
    spec: dict | None
    count: str
    text: str = ""
    arch: Any = None


def layer_text(layer: dict) -> str:
    """``Dense(96)``, ``Conv2D(16)``, ``Dropout(0.2)``: a layer's type and its size."""
    size = next((layer[k] for k in ("units", "filters", "rate", "target_shape", "pool_size") if k in layer), None)
    return layer["type"] if size is None else f"{layer['type']}({size})"


@dataclass(frozen=True)
class RunContext:
    """What a mode's source and decider are made from: the config, the data's meta, the run
    directory, the journal so far (``history``: records and events in order; empty for a
    new run), members to train again (``lost``: finished, but their kept files are gone),
    the slots members train in (``workers``) and the ranking metric; ``mine``: which member
    ids this source hands out (a sub-master's share of the list, ``Mode.sub_master_books``;
    None: every one)."""

    cfg: RunConfig
    meta: dict
    run_dir: RunDirectory
    history: list[MemberRecord | Event]
    lost: frozenset[str]
    workers: int
    metric: str
    mine: Callable[[str], bool] | None = None


class Mode:
    """The base of every mode; subclasses override what differs."""

    name: ClassVar[str]
    #: whether rank 0 may train members beside its loop (a population's members talk MPI)
    master_may_train: ClassVar[bool] = True
    #: whether the run builds the networks of ``[[architectures]]`` (checked before training)
    uses_architectures: ClassVar[bool] = True
    #: the config tables only this mode reads (``ensemble check`` notes one set under another mode)
    tables: ClassVar[tuple[str, ...]] = ()
    #: whether its members can read streamed data (``data.stream``; a population's trainer reads memory)
    reads_streams: ClassVar[bool] = True
    #: whether idle workers may help its last members at the end of the run (``runtime.tail``;
    #: a population trains in rounds, an online run on data that keeps coming: no last members)
    takes_helpers: ClassVar[bool] = True
    #: whether ``--resume`` gives up a member that was in flight each time jobs were lost
    #: (``results.crashes``): a fixed list (independent members, handed out one at a time while
    #: suspected) and a search (see ``quarantines``); not a population, which trains in
    #: synchronous rounds of all its members (one at a time would hang a round)
    gives_up_crashers: ClassVar[bool] = False
    #: with ``gives_up_crashers``: whether the suspects go out one at a time (``Quarantine``);
    #: if not (a search, whose resumed candidates go out again in their order), a suspect is
    #: given up when it is the only one in flight at its second lost job, or at its
    #: ``crashes.REPEATS``-th with others (which of them killed its worker is not known)
    quarantines: ClassVar[bool] = True
    #: whether the run writes ``data.source`` itself when it does not exist yet (mode "online":
    #: the simulation's first ``online.warmup`` samples), so that ``check`` and ``simulate``,
    #: which run no simulation, may meet it missing
    writes_source: ClassVar[bool] = False
    #: whether its members are independent one-shot jobs, as ``simulate --engine fast`` models
    #: them (a population trains in synchronous rounds; an online run has no list of members)
    one_shot_members: ClassVar[bool] = True
    #: whether its members end one by one through the run, so that members a second and members
    #: left say how it goes (``ensemble status``); a population's end together at its last round
    members_end_apart: ClassVar[bool] = True

    def make(self, ctx: RunContext) -> tuple[Source, Decider]:
        """The run's Source and Decider (the same object when the mode's rounds are both)."""
        raise NotImplementedError

    def before_prepare(self, cfg: RunConfig, args: Any) -> None:
        """Rank 0, before the data is read and the run directory made (``ensemble.run``): what
        the mode must do first (mode "online": receive the simulation's first samples)."""

    def selection_pool(self, cfg: RunConfig, records: list) -> frozenset[str] | None:
        """The members a re-selection (``ensemble reselect``) may choose among, from the run's
        final ``records``, as the run itself chose; None: every kept candidate."""
        return None

    def abandon(self, reason: str) -> None:
        """Rank 0, when the run ends before its master starts (``reason``: what rank 0 says): undo
        what ``before_prepare`` began (mode "online": tell the simulation, which would otherwise
        stream into nothing and wait for its close())."""

    def expected_members(self, cfg: RunConfig, workers: int | None = None) -> int | None:
        """Members the run is meant to end with, from the config (and the worker count where
        the mode sizes itself by it), or None when it cannot be said in advance."""
        raise NotImplementedError

    def crash_book(self, history: list[MemberRecord | Event]) -> CrashBook:
        """What a run's journal (``history``) says of members that killed their workers, as this
        mode reads it (``gives_up_crashers``, ``quarantines``)."""
        if not self.gives_up_crashers:
            return CrashBook()
        return read_crashes(history, None if self.quarantines else REPEATS)

    def settled(self, final: dict[str, MemberRecord]) -> set[str]:
        """Of the members' final records (``records.latest``), the ids a ``--resume`` trains no
        more: every member that ended, by default."""
        return set(final)

    def resume_trains(self, cfg: RunConfig, records: list[MemberRecord], total: int | None = None) -> int | None:
        """How many members a ``--resume`` of a run whose journal holds ``records`` would train
        (``total``: the members the run is meant to end with, else ``expected_members``): those
        not ``settled``; None when it cannot be said. What ``ensemble status``, the report and
        ``check --resume`` say of a stopped run."""
        from ensemble.results.records import latest
        total = total if total is not None else self.expected_members(cfg)
        return None if not total else max(0, total - len(self.settled(latest(records))))

    def keras_trainer(self, cfg: RunConfig, meta: dict, data: Any, run_dir: RunDirectory, rank: int,
                      group: Any = None, comm: Any = None) -> Trainer:
        """The Keras trainer for this mode on one worker (TensorFlow is configured already)."""
        from ensemble.runtime.env import TENSORFLOW
        from ensemble.train.member import help_member, run_member
        from ensemble.train.traced import PRETRACE
        ahead = None
        if group is None and cfg.runtime.pretrace:
            def ahead(upcoming: dict, now: dict) -> None:
                PRETRACE.start(upcoming, now, data, meta, TENSORFLOW)
        if group is not None:                         # a member group's communicator is fixed: no helpers
            return OneByOne(lambda spec, report: run_member(spec, data, meta, run_dir, rank, group, report), ahead)
        return OneByOne(lambda spec, report, tail: run_member(spec, data, meta, run_dir, rank, None, report, tail),
                        ahead, help=lambda spec, leader, tail: help_member(spec, data, meta, leader, tail))

    def packs(self, cfg: RunConfig) -> bool:
        """Whether workers pack several members into one graph (``runtime.members_per_rank``)."""
        return False

    def tail_helpers(self, cfg: RunConfig, workers: int) -> int:
        """How many helpers may join one member at the end of the run (``runtime.tail_helpers``
        for this mode, trainer and job: 0 where its trainer cannot take them)."""
        from ensemble.modes.trainers import KERAS, REHEARSAL
        from ensemble.runtime.tail import helpers_per_member
        rt = cfg.runtime
        if not self.takes_helpers or rt.trainer not in (KERAS, REHEARSAL) or self.packs(cfg):
            return 0
        return helpers_per_member(rt.tail_helpers, workers, rt.group_size)

    def hierarchy_problem(self, cfg: RunConfig) -> str | None:
        """Why sub-masters (``runtime.sub_masters``) cannot serve this run, or None. A sub-master
        answers in-training reports with "continue" and its workers talk to it alone, so a
        mode says None only where its master decides nothing while members train."""
        return f"mode \"{self.name}\" needs its master while members train"

    def sub_master_books(self, cfg: RunConfig) -> bool:
        """Whether a master hierarchy's sub-masters may each run a share of the run on their
        own (``orchestrate.submasters.serve_share``: their share of the members, their own
        journal, retention and budget): only where the members are known in advance and none
        depends on another's result, i.e. the source honours ``RunContext.mine``. Otherwise
        (a search breeds from every result) the top master deals every spec and the results
        are forwarded to it."""
        return False

    def preflight(self, cfg: RunConfig, meta: dict | None, groups: int | None, found: Problems,
                  resumed: RunDirectory | None = None) -> None:
        """Problems only this mode has, noted in ``found``: those that need the data's
        ``meta`` (None when it could not be read) or the number of worker ``groups``
        (None under ``--check``, where the job's size is unknown). ``resumed``: the run
        ``--resume`` continues (what it kept of an earlier run, ``sources.earlier.kept``,
        is not read again)."""

    def describe(self, cfg: RunConfig) -> str:
        """What the run will do, in a few words (``--check``)."""
        n = self.expected_members(cfg)
        return f"{n} members" if n else "members"

    def sample(self, cfg: RunConfig, meta: dict, found: Problems) -> tuple[list[str], list[Sample]]:
        """What ``--check`` builds on one batch to show the run's networks build: heading
        lines, and one ``Sample`` per network (by default each ``[[architectures]]`` entry)."""
        samples = []
        for i, arch in enumerate(cfg.architectures):
            where = f"architectures[{i}]"
            if not found.ok(*(f"{where}.{k}" for k in ("layers", "model", "model_dir", "params"))):
                samples.append(Sample(arch.name, where, None, ""))
                continue
            layers = [dict(layer) for layer in arch.to_dict()["layers"]] if arch.layers else None
            spec = {"layers": layers, "model": arch.model, "params": dict(arch.params),
                    **member_train_settings(cfg, arch).to_dict()}
            what = " -> ".join(map(layer_text, layers)) + " -> head" if layers else str(arch.model)
            samples.append(Sample(arch.name, where, spec, f"{arch.members} member(s)", what, arch))
        return [], samples

    def launch(self, config_path: str) -> str:
        """The command that runs a config of this mode (``check``'s last line)."""
        return f"mpirun -n P python -m ensemble.run {config_path}"

    def notes(self, cfg: RunConfig, meta: dict) -> list[str]:
        """What ``check`` prints and the run logs of this mode's settings that will run but may
        mislead (a setting the run will not read), given the data's ``meta``; [] if none."""
        return []

    def ranks_hint(self, cfg: RunConfig) -> str:
        """What ``--check`` adds to its line about ``mpirun -n P`` (the ranks the mode wants)."""
        n, g = self.expected_members(cfg), cfg.runtime.group_size
        return (f"; -n {1 + n * g} trains all {n} members at once" if n > 1 else
                f"; -n {1 + g} trains its member" if n else "")

    def pareto(self, cfg: RunConfig, meta: dict) -> Any:
        """record -> objectives for a multi-objective search whose Pareto front keeps its
        models, else None."""
        return None

    def search_time_limit(self, cfg: RunConfig) -> tuple[float, str] | None:
        """The mode's own time budget, counted over the run's jobs (a resumed run goes on where
        it stopped): (seconds, the setting's name), or None."""
        return None

    def starts_from(self, cfg: RunConfig) -> tuple[str, str] | None:
        """The earlier run this one starts from (its directory, the setting that names it), or
        None: its networks were chosen on that run's split (``prepare.split_leak_note``)."""
        return None

    def searched_seconds(self, records: list[MemberRecord]) -> float:
        """Of ``search_time_limit``, the seconds earlier jobs spent (their records say)."""
        return 0.0

    def search_seconds_left(self, cfg: RunConfig, records: list[MemberRecord]) -> float | None:
        """What is left of ``search_time_limit`` when this job starts, or None without one
        (the console's ETA: ``orchestrate.progress``)."""
        own = self.search_time_limit(cfg)
        return None if own is None else max(0.0, own[0] - self.searched_seconds(records))

    def status_section(self, cfg: RunConfig | None, events: list[Event]) -> dict | None:
        """The mode's own part of ``ensemble.status --json`` (None: nothing to add)."""
        return None

    def status_lines(self, section: dict) -> list[str]:
        """The human lines for ``status_section``."""
        return []
