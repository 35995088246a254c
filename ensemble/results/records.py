"""A member's record and the run's events, typed: the one meaning of every journal line.

Workers send their results as JSON-able dicts (the MPI boundary) and the journal holds
one JSON line each (the disk boundary); everything in between, and every reader (the
leaderboard, ``search.csv``, ``ensemble.json``, the report, ``ensemble.status``), works
on ``MemberRecord`` and derives its rows and counts from ``Status`` and ``Counts``, so two
outputs of one run cannot disagree about what happened to a member.

Older journals stay readable: their discarded candidates were ``status: "ok"`` with a
``discarded`` entry, and members stopped by ``train.member_time_limit`` were ``failed``
with the error kind ``time_limit``; ``MemberRecord.from_json`` reads both as they are
meant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    """What became of a member. Only ``OK`` members are ranked, kept and selected."""

    OK = "ok"                  #: trained to the end (or to early stopping by its own patience)
    FAILED = "failed"          #: training raised (NaN loss, a builder error, a lost rank, ...)
    DISCARDED = "discarded"    #: stopped by early discarding: a low-fidelity evaluation, never ranked
    STOPPED = "stopped"        #: stopped by the master for another reason (the run's end, a population's stop)
    LIMIT = "limit"            #: stopped by `train.member_time_limit`

    @property
    def ranked(self) -> bool:
        """Whether the member enters the leaderboard's ranking and the ensemble's candidates."""
        return self is Status.OK

    @property
    def evaluated(self) -> bool:
        """Whether the member has a fitness a search learns from (a discarded one, at low fidelity)."""
        return self in (Status.OK, Status.DISCARDED)

    @property
    def label(self) -> str:
        """The status in words, for tables and the report."""
        return _LABELS[self]


_LABELS = {Status.OK: "ok", Status.FAILED: "failed", Status.DISCARDED: "discarded",
           Status.STOPPED: "stopped by the master", Status.LIMIT: "stopped by its time limit"}

#: the error kind a worker gives a member stopped by its time limit (``train.member``)
TIME_LIMIT_KIND = "time_limit"
#: the error kind of a member given up after its worker process died with it twice
#: (``results.crashes``): no ``--resume`` trains it again
WORKER_DIED_KIND = "worker_died"
#: the error kind of a member whose data could not be read any more (a file deleted or made
#: unreadable while the run reads it): the run stops handing out members (``runtime.budget``)
DATA_UNREADABLE_KIND = "data_unreadable"
#: the error kind of a member whose files could not be written for want of space (a full disk or
#: quota, ``runtime.storage``): every member would fail alike, so the run stops handing them out
STORAGE_FULL_KIND = "storage_full"


#: what a run stopped by a fatal failure says (``fatal_failure``), as sub-masters pass it on
FATAL_STOP = "stopping: every member would fail the same way"


def fatal_failure(record: "MemberRecord") -> str | None:
    """Why a member's failure stops the run (every member would fail alike), or None."""
    error = record.error or {}
    if error.get("kind") == DATA_UNREADABLE_KIND:
        return (f"{record.id}: {error.get('message', 'the data could not be read')}; {FATAL_STOP}. Restore the "
                "files, then continue with --resume")
    if error.get("kind") == STORAGE_FULL_KIND:
        return (f"{record.id}: {error.get('message', 'no space left on the device')}; {FATAL_STOP}. Free space "
                "or make it writable (or move the run directory), then continue with --resume: finished members are "
                "kept")
    return None
#: the record key (true, else absent) of a member trained on a worker's kept model, whose
#: steps were traced before it started (``train.traced``)
REUSED_TRACE = "reused_trace"
#: the record key (a count, else absent) of a member that idle workers helped at the end of the
#: run: how many helper ranks trained it beside its own at the end (``runtime.tail``)
HELPERS = "helpers"
#: the record key of a helped member: the seconds its helper ranks spent in its crew, in all
#: (counted as training time in the run's utilisation, ``results.timeline``)
HELPER_SECONDS = "helper_seconds"


def helped_fields(helpers: int, seconds: float) -> dict:
    """A helped member's record fields (``HELPERS``, ``HELPER_SECONDS``); {} if it had none."""
    return {HELPERS: helpers, HELPER_SECONDS: round(seconds, 3)} if helpers else {}

#: the record key of a search's candidate (mode "evolve"): ``search_entry``
SEARCH = "search"


def search_entry(evaluation: int, wall: float, fitness: float | None) -> dict:
    """A search candidate's ``SEARCH`` entry: its evaluation (the number in its id), the
    search's clock when it ended (seconds, over the run's jobs) and the fitness its strategy was
    told (None: failed)."""
    return {"evaluation": evaluation, "wall": round(wall, 3), "fitness": fitness}


def searched_seconds(records: Iterable[MemberRecord]) -> float:
    """The search's own clock so far, over the run's jobs: the latest ``wall`` of its records'
    ``SEARCH`` entries."""
    return max((float(r.extra[SEARCH]["wall"]) for r in records if SEARCH in r.extra), default=0.0)

#: the fields ``MemberRecord`` reads from a JSON line itself; every other key is kept in ``extra``
_FIELDS = ("id", "status", "arch", "seed", "val", "test", "epochs", "params", "train_seconds", "rank", "host",
           "started", "ended", "dispatched", "received", "error", "discarded", "genome", "summary", "costs")


@dataclass(frozen=True)
class MemberRecord:
    """One member's result, as the master and every reader see it.

    ``val`` and ``test`` map metric names to values (empty unless the member finished or
    was discarded); ``error`` holds ``kind``, ``message`` (and ``traceback``) of a member
    that failed or hit its limit; ``discarded`` where early discarding stopped it (epoch,
    rung); ``extra`` everything else the trainer recorded (costs, scaling, model path,
    the early-stopping epoch ``stopped``), kept as it came."""

    id: str
    status: Status
    arch: str | None = None
    seed: int | None = None
    val: Mapping[str, float] = field(default_factory=dict)
    test: Mapping[str, float] = field(default_factory=dict)
    epochs: int | None = None
    params: int | None = None
    train_seconds: float | None = None
    rank: int | None = None
    host: str | None = None
    started: float | None = None
    ended: float | None = None
    dispatched: float | None = None
    received: float | None = None
    error: Mapping[str, Any] | None = None
    discarded: Mapping[str, Any] | None = None
    genome: Any = None
    summary: str | None = None
    costs: Mapping[str, float] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, line: Mapping[str, Any]) -> MemberRecord:
        """A record from a worker's result or a journal line (older journals included)."""
        status = str(line.get("status", "failed"))
        error = line.get("error")
        if status == "ok" and line.get("discarded"):
            status = Status.DISCARDED.value
        elif status == "failed" and isinstance(error, Mapping) and error.get("kind") == TIME_LIMIT_KIND:
            status = Status.LIMIT.value
        try:
            kind = Status(status)
        except ValueError:
            kind = Status.FAILED
        values = {k: line[k] for k in _FIELDS if k in line and k != "status"}
        values["id"] = str(line.get("id"))
        for key in ("val", "test"):
            if values.get(key) is None:
                values.pop(key, None)
        return cls(status=kind, extra={k: v for k, v in line.items() if k not in _FIELDS}, **values)

    def to_json(self) -> dict[str, Any]:
        """The record as its journal line (and as it crosses MPI)."""
        out: dict[str, Any] = {"id": self.id, "status": self.status.value}
        for f in dataclasses.fields(self):
            if f.name in ("id", "status", "extra"):
                continue
            value = getattr(self, f.name)
            if value is None or (f.name in ("val", "test") and not value):
                continue
            out[f.name] = dict(value) if isinstance(value, Mapping) else value
        out.update(self.extra)
        return out

    def replace(self, **changes: Any) -> MemberRecord:
        return dataclasses.replace(self, **changes)

    # -- what readers ask ------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def given_up(self) -> bool:
        """Failed for good: its worker process died with it twice (``results.crashes``)."""
        return self.status is Status.FAILED and (self.error or {}).get("kind") == WORKER_DIED_KIND

    @property
    def reused_trace(self) -> bool:
        """Trained on a kept model: no tracing of its own (``runtime.traced_models``, ``pretrace``)."""
        return bool(self.extra.get(REUSED_TRACE))

    @property
    def helpers(self) -> int:
        """Helper ranks that trained it with its worker at the end of the run (``runtime.tail``)."""
        return int(self.extra.get(HELPERS, 0) or 0)

    @property
    def helper_seconds(self) -> float:
        """Seconds its helper ranks trained it, in all (0 for a member not helped)."""
        return float(self.extra.get(HELPER_SECONDS, 0.0) or 0.0)

    @property
    def error_kind(self) -> str:
        return str((self.error or {}).get("kind", "")) if self.status not in (Status.OK, Status.DISCARDED) else ""

    @property
    def error_message(self) -> str:
        return str((self.error or {}).get("message", ""))

    def metric(self, name: str, split: str = "val") -> float | None:
        """The member's ``split`` value of ``name``, or None (not finished, or not measured)."""
        value = (self.val if split == "val" else self.test).get(name)
        return None if value is None else float(value)

    @property
    def stored(self) -> bool:
        """Whether the master stored the member's predictions (a selection candidate)."""
        return bool(self.extra.get("stored"))

    @property
    def has_model(self) -> bool:
        """Whether the member's model file is kept (``models/<id>.keras``)."""
        return bool(self.extra.get("model"))

    @property
    def model_file(self) -> dict[str, Any] | None:
        """The size and SHA-256 the record holds for its model file (``RunDirectory.save_model``),
        or None (a run written before they were recorded: its file is only checked to be there)."""
        digest = self.extra.get("model_file")
        return dict(digest) if isinstance(digest, Mapping) else None

    def with_extra(self, drop: Iterable[str] = (), **values: Any) -> MemberRecord:
        """A copy whose ``extra`` has ``values`` set and the keys ``drop`` removed."""
        gone = set(drop)
        return self.replace(extra={**{k: v for k, v in self.extra.items() if k not in gone}, **values})


def as_record(item: MemberRecord | Mapping[str, Any]) -> MemberRecord:
    """``item`` as a record: a journal line or a worker's result is read with ``from_json``."""
    return item if isinstance(item, MemberRecord) else MemberRecord.from_json(item)


def as_records(items: Iterable[MemberRecord | Mapping[str, Any]]) -> list[MemberRecord]:
    """Records of ``items``, event lines among them left out (a journal's lines as read)."""
    return [as_record(x) for x in items if isinstance(x, MemberRecord) or "event" not in x]


def latest(records: Iterable[MemberRecord]) -> dict[str, MemberRecord]:
    """Each member's final word, by id: an ``OK`` record wins over any other (a member failed
    once and trained again on resume is ok), else the last one journalled."""
    out: dict[str, MemberRecord] = {}
    for r in records:
        if r.id not in out or not out[r.id].ok:
            out[r.id] = r
    return out


#: how ``Counts.summary`` (and the progress line) names each status it counts
COUNTED = {Status.OK: "finished", Status.FAILED: "failed", Status.DISCARDED: "discarded early",
           Status.STOPPED: "stopped by the master", Status.LIMIT: "stopped by their time limit"}


@dataclass(frozen=True)
class Counts:
    """What became of a run's members, counted once for every output.

    ``ended`` counts members with a final record (by id, each once); ``issued`` members
    handed out (at least ``ended``: a member in flight when the run stopped was issued but
    has no record)."""

    ok: int = 0
    failed: int = 0
    discarded: int = 0
    stopped: int = 0
    limit: int = 0
    issued: int = 0

    @property
    def ended(self) -> int:
        return self.ok + self.failed + self.discarded + self.stopped + self.limit

    @property
    def not_ok(self) -> int:
        """Members that ended without a result to rank (failed, stopped or at their limit)."""
        return self.failed + self.stopped + self.limit

    def of(self, status: Status) -> int:
        return getattr(self, status.value)

    def as_dict(self) -> dict[str, int]:
        """For JSON outputs (``ensemble.json``, ``status --json``): one key per status, plus
        ``ended`` and ``issued``."""
        return {**{s.value: self.of(s) for s in Status}, "ended": self.ended, "issued": self.issued}

    def summary(self) -> str:
        """The counts in words, as ``ensemble.status`` and the report say them: finished (ok) and
        failed always, the other statuses when there are any."""
        parts = [f"{self.ok} finished", f"{self.failed} failed"]
        parts += [f"{self.of(s)} {COUNTED[s]}" for s in (Status.DISCARDED, Status.LIMIT, Status.STOPPED)
                  if self.of(s)]
        return ", ".join(parts)

    @classmethod
    def from_dict(cls, counts: Mapping[str, int]) -> Counts:
        """The counts ``as_dict`` wrote (ensemble.json's or ``ensemble.status --json``'s ``counts``)."""
        return cls(**{s.value: int(counts.get(s.value, 0)) for s in Status}, issued=int(counts.get("issued", 0)))

    @classmethod
    def of_records(cls, records: Iterable[MemberRecord], issued: int | None = None) -> Counts:
        """The counts of ``records`` (each member once, by its final word: ``latest``); ``issued``:
        members handed out, when the caller knows (a search's ``issued`` events)."""
        final = latest(records)
        by = {s: 0 for s in Status}
        for r in final.values():
            by[r.status] += 1
        ended = len(final)
        return cls(**{s.value: n for s, n in by.items()}, issued=max(ended, issued or 0))


def split_lines(lines: Iterable[Mapping[str, Any]]) -> tuple[list[MemberRecord], list[Mapping[str, Any]]]:
    """Journal lines as (member records, event lines), in order."""
    records: list[MemberRecord] = []
    events: list[Mapping[str, Any]] = []
    for line in lines:
        if "event" in line:
            events.append(line)
        elif "id" in line:
            records.append(MemberRecord.from_json(line))
    return records, events


def journal_shortfall(summary: Mapping[str, Any] | None, records: Iterable[MemberRecord]) -> str | None:
    """Why the journal cannot be the whole run when it holds fewer finished members than the
    run's ``ensemble.json`` counted (the journal cut short or replaced), else None."""
    recorded = ((summary or {}).get("counts") or {}).get(Status.OK.value)
    have = Counts.of_records(records).ok
    if isinstance(recorded, int) and have < recorded:
        return (f"journal.jsonl holds {have} finished member(s), but ensemble.json counted {recorded}: the journal "
                "was cut short or replaced")
    return None
