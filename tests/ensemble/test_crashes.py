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
    source = Quarantine(SpecList(specs), {"a": 2, "c": 2, "d": 2})       # ceil(3 / 2 ** 2): one at a time
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


def test_a_fixed_list_quarantines_a_search_gives_up_repeats_and_a_population_neither():
    """A search re-issues its candidates in order (a resumed search equals the uninterrupted one;
    holding one back let the strategy breed early): it gives up repeats instead; a population
    trains in synchronous rounds (one member at a time hung the round): it gives up none."""
    from ensemble.modes import MODES
    assert {name for name, mode in MODES.items() if mode.gives_up_crashers} == {"ensemble", "evolve"}
    assert {name for name, mode in MODES.items() if mode.gives_up_crashers and mode.quarantines} == {"ensemble"}


def test_without_quarantine_suspects_lost_together_again_and_again_are_given_up_at_the_third():
    """A candidate that kills its worker at once, re-issued with the others in flight when the
    job was lost: every resumed job is lost with all of them out. At the third loss they are
    given up together (which one killed its worker is not known); the others go on."""
    first = [opened(), *handed("a", "b"), ok("a"), *handed("c", "d")]          # lost with b, c, d out
    second = first + [opened(), *handed("b", "c", "d")]                        # all three out: lost again
    assert read_crashes(second, repeats=3).given_up == []                     # two suspects or more: none
    third = second + [opened(), *handed("b", "c", "d"), ok("d")]               # d finished, then lost again
    book = read_crashes(third, repeats=3)
    assert book.given_up == ["b", "c"] and book.repeated == {"b", "c"} and book.suspects == {}
    assert all("lost 3 times" in r.error_message and r.given_up for r in book.records())
    assert read_crashes(third).given_up == [] and read_crashes(third).suspects == {"b": 3, "c": 3}
    lone = second + [opened(), *handed("b", "e")]                              # b the only suspect out
    assert read_crashes(lone, repeats=3).given_up == ["b"] and read_crashes(lone, repeats=3).repeated == set()


def test_a_given_up_candidate_carries_its_genome_from_its_issued_line():
    from ensemble.results.crashes import with_genomes
    issued = Event(EventKind.ISSUED, {"id": "e0003", "genome": {"layers": []}, "evaluation": 3})
    records = [MemberRecord("e0003", Status.FAILED), MemberRecord("m-1", Status.FAILED)]
    out = with_genomes(records, [opened(), issued])
    assert out[0].genome == {"layers": []} and out[1].genome is None


def test_quarantine_halves_the_suspects_in_flight_with_each_lost_job():
    """After a node failure of a large job every member in flight was a suspect, and they went out
    one after another (a group worker's kill -9 serialised its run's tail)."""
    from ensemble.results.crashes import quarantine_limit
    assert quarantine_limit({f"m{i}": 1 for i in range(2000)}) == 1000
    assert quarantine_limit({f"m{i}": 2 for i in range(2000)}) == 500
    assert quarantine_limit({"a": 1, "b": 3}) == 1 and quarantine_limit({"a": 1}) == 1
    specs = [{"id": i} for i in "abcdef"]
    source = Quarantine(SpecList(specs), {i: 1 for i in "abcd"})            # 4 suspects: 2 at a time
    assert [source.next_spec()["id"] for _ in range(4)] == ["a", "b", "e", "f"]
    assert source.next_spec() is None
    source.tell(ok("a"))
    assert source.next_spec()["id"] == "c" and source.next_spec() is None
    # a poisonous member among them is found: lost with c (both in flight), then alone
    first = [opened(), *handed("a", "b", "c", "d")]
    second = first + [opened(), *handed("a", "b"), ok("a"), *handed("c")]
    book = read_crashes(second)
    assert book.suspects == {"b": 2, "c": 2, "d": 1} and not book.given_up
    assert quarantine_limit(book.suspects) == 1
    third = second + [opened(), *handed("b")]
    assert read_crashes(third).given_up == ["b"]
