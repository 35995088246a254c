"""The two seams of the master's decisions, declared in full: Source and Decider.

As the best tuners separate the searcher (what to try next) from the scheduler (what to
stop or change while it trains), the master session holds one of each:

- a ``Source`` hands out member specs (``next_spec``) and learns from every finished
  member (``tell``, which returns the record as the journal should keep it);
- a ``Decider`` stamps specs as they go out (``stamp``: e.g. report every 2 epochs),
  answers in-training reports (``decide``: continue, stop, update, or None to hold the
  member until ``Hooks.answer``), marks the record of a member it stopped (``mark``), and
  rebuilds its state from a resumed journal (``replay``).

Everything the session gives them is in ``Hooks`` (bound once, before dispatch starts);
everything the session reads from them is declared here. ``tests/ensemble/test_seams.py``
runs one contract suite against every implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ensemble.results.records import MemberRecord
from ensemble.runtime.executor import CONTINUE


@dataclass(frozen=True)
class Hooks:
    """What the master session lends its source and decider.

    ``event``: journal an event line now (fsynced); ``answer``: deliver a decision to a
    held member (``executor.answer``); ``deadline``: the run's deadline (the clock's
    seconds) or None; ``clock``: the master's clock (real or virtual); ``publish(extra,
    among=None)``: select and write ensemble.json now, among the members whose ids are in
    ``among`` (None: every member so far), with the given extra sections, and return its
    summary; the run's end then selects among the same (mode "online"; None where the session
    cannot)."""

    event: Callable[[dict], None]
    answer: Callable[[str, dict], None]
    deadline: Callable[[], float | None]
    clock: Callable[[], float]
    publish: Callable[..., dict] | None = None


@runtime_checkable
class Source(Protocol):
    """What to train next (ask/tell)."""

    #: members the source will hand out in all, or None when it cannot say (a time budget)
    total: int | None

    def bind(self, hooks: Hooks) -> None:
        """Before dispatch: the session's hooks (journal events, answers, deadline)."""

    def next_spec(self) -> dict | None:
        """The next spec to train, or None when nothing can be handed out now."""

    def dry(self) -> bool:
        """Whether nothing more will ever be handed out (the members still training are the
        run's last: idle workers may help them, ``runtime.tail``)."""

    def tell(self, record: MemberRecord) -> MemberRecord:
        """A member ended (any status); returns its record as the journal keeps it."""

    def finish(self, records: list[MemberRecord]) -> dict[str, Any]:
        """The run is over: write the source's own tables; return its ensemble.json section."""


@runtime_checkable
class Decider(Protocol):
    """What to stop or change while members train."""

    def bind(self, hooks: Hooks) -> None:
        """Before dispatch: the session's hooks."""

    def stamp(self, spec: dict) -> dict:
        """The spec as it goes out (e.g. how often it reports)."""

    def decide(self, spec: dict, payload: dict) -> dict | None:
        """A member's in-training report -> a decision, or None: hold it until ``Hooks.answer``."""

    def mark(self, record: MemberRecord) -> MemberRecord:
        """The record of a member that ended, with what the decider did to it."""

    def replay(self, records: Iterable[MemberRecord]) -> None:
        """``--resume``: the decider's state as the journal's records left it."""


class GoOn:
    """The decider of a run that changes nothing while members train."""

    def bind(self, hooks: Hooks) -> None:
        pass

    def stamp(self, spec: dict) -> dict:
        return spec

    def decide(self, spec: dict, payload: dict) -> dict | None:
        return CONTINUE

    def mark(self, record: MemberRecord) -> MemberRecord:
        return record

    def replay(self, records: Iterable[MemberRecord]) -> None:
        pass
