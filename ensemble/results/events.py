"""The run's journal events, typed: what happened to the run rather than to one member.

An event line has an ``event`` key naming its kind. ``open`` and ``close`` frame each
segment of dispatch (a job, or a simulated run): the master session builds both here, for
real and simulated runs alike, so the timeline (``results.timeline``), the status and the
report read one shape. ``issued`` (a search's candidate, as handed out), ``released``
(files retention let go), ``ask`` and ``pbt_round`` carry their own fields in ``data``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class EventKind(str, Enum):
    OPEN = "open"            #: dispatch starts: when, on how many workers, how the job was started
    CLOSE = "close"          #: dispatch ends: results, the master's wall, busy and CPU seconds, journal syncs
    ISSUED = "issued"        #: a search candidate handed out (resume re-issues those in flight)
    HANDED = "handed"        #: any member handed out, in a real job (``results.crashes``: who was in flight)
    INTERRUPTED = "interrupted"  #: the job was stopped (Ctrl-C, SIGTERM): its segment ends, but not in a crash
    RELEASED = "released"    #: a member's kept files released by retention
    ASK = "ask"              #: a search strategy's ask (its random state, for an exact resume)
    PBT_ROUND = "pbt_round"  #: a population's round: who copied whom, with which hyperparameters


@dataclass(frozen=True)
class Event:
    kind: EventKind
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, line: Mapping[str, Any]) -> Event | None:
        """The event of a journal line; None for a kind this version does not know."""
        try:
            kind = EventKind(line["event"])
        except (KeyError, ValueError):
            return None
        return cls(kind, {k: v for k, v in line.items() if k != "event"})

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind.value, **self.data}

    @property
    def time(self) -> float | None:
        value = self.data.get("time")
        return None if value is None else float(value)


def open_event(*, workers: int, group_size: int, ranks: int, host: str, trainer: str, specs_in_hand: Any,
               job_started: float, now: float | None = None, **more: Any) -> dict[str, Any]:
    """The line that starts a segment (``more``: the environment, resume seconds, ...)."""
    now = time.time() if now is None else now
    return Event(EventKind.OPEN, {"time": round(now, 4), "job_started": round(job_started, 4), "workers": workers,
                                  "group_size": group_size, "ranks": ranks, "host": host, "trainer": trainer,
                                  "specs_in_hand": specs_in_hand, **more}).to_json()


def close_event(account: Mapping[str, Any], *, journal_syncs: int, journal_bytes: int,
                now: float | None = None) -> dict[str, Any]:
    """The line that ends a segment: the dispatch loop's own account and the journal's size."""
    now = time.time() if now is None else now
    return Event(EventKind.CLOSE, {"time": round(now, 4), **account, "journal_syncs": journal_syncs,
                                   "journal_bytes": journal_bytes}).to_json()
