"""Members that kill their worker process: who was in flight when a job was lost, suspects
handed out one at a time, given up at a second crash (``ensemble.results.crashes``)."""

from __future__ import annotations

from ensemble.results.crashes import Quarantine, handed_event, read_crashes
from ensemble.results.events import Event, EventKind
from ensemble.results.records import WORKER_DIED_KIND, MemberRecord, Status
from ensemble.sources.members import SpecList


def opened() -> Event:
    return Event(EventKind.OPEN, {"time": 0.0})


def closed() -> Event:
    return Event(EventKind.CLOSE, {"time": 1.0})


def handed(*ids: str) -> list[Event]:
    return [Event.from_json(handed_event(i, 0.5)) for i in ids]


def ok(i: str) -> MemberRecord:
    return MemberRecord(i, Status.OK)


def test_members_in_flight_when_a_job_was_lost_are_suspects_and_a_lone_one_lost_again_is_given_up():
    first = [opened(), *handed("a", "b"), ok("a"), *handed("c", "d")]          # lost with b, c, d out
    book = read_crashes(first)
    assert book.suspects == {"b": 1, "c": 1, "d": 1} and book.given_up == []
    second = first + [opened(), *handed("b", "e"), ok("e"), ok("b"), *handed("c", "f")]   # lost again: c alone
    book = read_crashes(second)
    assert book.given_up == ["c"] and book.suspects == {"d": 1, "f": 1}       # b finished: cleared
    [record] = book.records()
    assert record.given_up and record.error_kind == WORKER_DIED_KIND and "os._exit" in record.error_message
    assert read_crashes(second + [record]).given_up == []                    # journalled once


def test_two_suspects_in_flight_at_a_crash_give_up_neither():
    history = [opened(), *handed("a", "b"), opened(), *handed("a", "b")]
    assert read_crashes(history).given_up == [] and read_crashes(history).suspects == {"a": 2, "b": 2}


def test_a_closed_or_interrupted_segment_is_no_crash_and_a_journal_without_handed_lines_has_no_suspects():
    """A job stopped by Ctrl-C or SIGTERM (a scheduler's time limit, again and again in a chain of
    jobs while one long member trains) writes `interrupted`: its members are no suspects."""
    assert read_crashes([opened(), *handed("a"), closed(), opened(), *handed("a"), closed()]).suspects == {}
    stopped = Event(EventKind.INTERRUPTED, {"time": 1.0})
    assert read_crashes([opened(), *handed("a"), stopped, opened(), *handed("a"), stopped, opened()]).suspects == {}
    assert read_crashes([opened(), ok("a"), opened()]).suspects == {}


def test_quarantine_hands_suspects_out_one_at_a_time_and_every_spec_once():
    specs = [{"id": i} for i in "abcde"]
    source = Quarantine(SpecList(specs), {"a", "c", "d"})
    out = [source.next_spec()["id"] for _ in range(3)]
    assert out == ["a", "b", "e"]                           # c, d held while a trains
    assert source.next_spec() is None and not source.dry()
    source.tell(ok("b"))
    assert source.next_spec() is None                       # a still out
    source.tell(ok("a"))
    assert source.next_spec()["id"] == "c" and source.next_spec() is None
    source.tell(MemberRecord("c", Status.FAILED))
    assert source.next_spec()["id"] == "d" and source.next_spec() is None
    source.tell(ok("d"))
    assert source.next_spec() is None and source.dry() and source.total is None


def test_only_a_fixed_member_list_gives_up_crashers():
    """A search re-issues its candidates in order (a resumed search equals the uninterrupted one;
    holding one back let the strategy breed early) and a population trains in synchronous rounds
    (one member at a time hung the round): neither quarantines."""
    from ensemble.modes import MODES
    assert {name for name, mode in MODES.items() if mode.gives_up_crashers} == {"ensemble"}
