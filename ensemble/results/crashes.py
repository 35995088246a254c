"""Members that kill their worker process (out of memory, a segfault, ``os._exit`` in a
user's builder): found from the journal, handed out a few at a time, given up after two crashes
(the modes whose ``Mode.gives_up_crashers`` says so: a fixed member list); or, where the
mode hands its members out again in their order (``Mode.quarantines`` false: a search), given up at
the second crash with it the only suspect in flight, or else at its ``REPEATS``-th.

A worker process that dies takes the MPI job with it (MPICH ends every rank) before any
record of its member is written, so ``--resume`` would hand that member out again and lose
the job again, for ever. So the master journals a ``handed`` line for every member as it
hands it out (a real job; the simulator does not). A segment of the journal with an
``open`` line and no ``close`` ended in a crash, and the members handed out in it with no
record after were in flight then: each such member is a *suspect* (a job stopped by
Ctrl-C or SIGTERM, a scheduler's time limit, journals ``interrupted``: no crash). A resumed job hands its
suspects out at most half of them at a time, halving again after each lost job they were in
flight in (``Quarantine``, ``quarantine_limit``), beside members that are not suspects, so
that when the job is lost again while one suspect trains alone, that suspect is the one most
likely to blame: it is *given up*, journalled as failed with kind ``worker_died``, and no
later ``--resume`` trains it again (``MemberRecord.given_up``). A suspect that finishes is
cleared. Two crashes caused by something else (kill -9 twice, two node failures) while the
same lone suspect trains give it up too; the record says so, and the rest of the run is kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ensemble.results.events import Event, EventKind
from ensemble.results.records import SEARCH, WORKER_DIED_KIND, MemberRecord, Status, search_entry, searched_seconds

#: a member in flight each time a job was lost this many times is given up, however many
#: others were in flight with it (``read_crashes(..., repeats=REPEATS)``: modes that do not
#: quarantine, whose suspects all go out again at once)
REPEATS = 3


@dataclass
class CrashBook:
    """What the journal says of crashes: ``suspects`` (id -> crashed jobs it was in flight
    in) and ``given_up`` (ids to journal as failed now: a second crash with each of them the
    only suspect in flight)."""
    suspects: dict[str, int] = field(default_factory=dict)
    given_up: list[str] = field(default_factory=list)
    repeated: set[str] = field(default_factory=set)     # of ``given_up``: at its REPEATS-th crash, not alone

    def records(self) -> list[MemberRecord]:
        """The failed records of the members given up now."""
        return [MemberRecord(i, Status.FAILED, error={"kind": WORKER_DIED_KIND, "message": self._why(i)})
                for i in self.given_up]

    def _why(self, i: str) -> str:
        if i in self.repeated:
            return (f"the job was lost {REPEATS} times while {i} trained (with others each time, so which one "
                    "killed its worker is not known): given up with them, its worker process having died (out "
                    "of memory, a segfault, os._exit?) or not; not handed out again")
        return (f"the job was lost twice while {i} trained (the second time the only member under suspicion in "
                "flight): its worker process died (out of memory, a segfault, os._exit?); not handed out again")


def read_crashes(history: Iterable[MemberRecord | Event], repeats: int | None = None) -> CrashBook:
    """The crash book of a journal (its records and events, in order). ``repeats``: also give
    up every member in flight at its ``repeats``-th lost job (modes that do not quarantine)."""
    counts: dict[str, int] = {}
    given_up: dict[str, bool] = {}          # id -> already journalled
    repeated: set[str] = set()
    in_flight: dict[str, None] | None = None        # ids in the order they were handed out
    closed = True

    def crashed() -> None:
        suspects = [i for i in in_flight if counts.get(i, 0) >= 1 and i not in given_up]
        if len(suspects) == 1:
            given_up[suspects[0]] = False
        elif repeats is not None:
            for i in suspects:
                if counts[i] + 1 >= repeats:
                    given_up[i] = False
                    repeated.add(i)
        for i in in_flight:
            counts[i] = counts.get(i, 0) + 1

    for item in history:
        if isinstance(item, Event):
            if item.kind is EventKind.OPEN:
                if in_flight is not None and not closed:
                    crashed()
                in_flight, closed = {}, False
            elif item.kind in (EventKind.CLOSE, EventKind.INTERRUPTED):     # a stop is no crash
                closed = True
            elif item.kind is EventKind.HANDED and in_flight is not None:
                in_flight[str(item.data.get("member"))] = None
        elif isinstance(item, MemberRecord):
            if in_flight is not None:
                in_flight.pop(item.id, None)
            if item.given_up:
                given_up[item.id] = True
            elif item.ok:
                counts.pop(item.id, None)
    if in_flight is not None and not closed:
        crashed()
    now = [i for i, journalled in given_up.items() if not journalled]
    return CrashBook({i: c for i, c in counts.items() if i not in given_up}, now, repeated & set(now))


def with_genomes(records: list[MemberRecord], history: list[MemberRecord | Event]) -> list[MemberRecord]:
    """Given-up records of a search's candidates with what their ``issued`` line holds: the
    genome (a resumed search tells its strategy the failure, and hands the candidate out no
    more) and the ``search`` entry a finished candidate gets (its evaluation, the search's
    clock so far, no fitness), so that search.csv lists it."""
    if not records:
        return records
    issued = {str(x.data.get("id")): x.data for x in history
              if isinstance(x, Event) and x.kind is EventKind.ISSUED and x.data.get("genome") is not None}
    wall = searched_seconds(x for x in history if isinstance(x, MemberRecord))
    return [r.replace(genome=issued[r.id]["genome"],
                      extra={**r.extra, SEARCH: search_entry(int(issued[r.id]["evaluation"]), wall, None)})
            if r.id in issued else r for r in records]


def handed_event(member_id: str, now: float) -> dict[str, Any]:
    """The journal line of a member handed out; its key is ``member``, not ``id`` (the key of
    a member's record, by which readers of the journal tell records from events)."""
    return Event(EventKind.HANDED, {"member": member_id, "time": round(now, 4)}).to_json()


def quarantine_limit(suspects: Mapping[str, int]) -> int:
    """How many suspects may be in flight at once: half of them after one lost job, a quarter
    after two in which the most suspect were in flight, ... (``ceil(S / 2 ** most)``, at least
    one). One at a time found the member to blame at the next loss, but after a node failure of a
    large job (thousands of members in flight, none to blame) it trained them one after another;
    halving finds a member that kills its worker in about log2(S) more lost jobs and leaves a
    job that only lost a node nearly its full width."""
    if not suspects:
        return 1
    return max(1, math.ceil(len(suspects) / 2 ** max(1, max(suspects.values()))))


class Quarantine:
    """A source whose suspects go out at most ``limit`` at a time (``quarantine_limit``): a
    suspect met while ``limit`` others are in flight is held back and handed out when one of
    them has ended; everything else passes."""

    def __init__(self, source: Any, suspects: Mapping[str, int] | Iterable[str], limit: int | None = None):
        counts = dict(suspects) if isinstance(suspects, Mapping) else dict.fromkeys(suspects, 1)
        self.source = source
        self.suspects = set(counts)
        self.limit = quarantine_limit(counts) if limit is None else max(1, limit)
        self.held: list[dict] = []
        self.out: set[str] = set()

    def __getattr__(self, name: str) -> Any:       # total, bind, finish, compare, ...: the source's
        return getattr(self.source, name)

    def next_spec(self) -> dict | None:
        if self.held and len(self.out) < self.limit:
            spec = self.held.pop(0)
            self.out.add(spec["id"])
            return spec
        spec = self.source.next_spec()
        while spec is not None and spec["id"] in self.suspects:
            if len(self.out) < self.limit:
                self.out.add(spec["id"])
                return spec
            self.held.append(spec)
            spec = self.source.next_spec()
        return spec

    def dry(self) -> bool:
        return not self.held and self.source.dry()

    def tell(self, record: MemberRecord) -> MemberRecord:
        self.out.discard(record.id)
        return self.source.tell(record)
