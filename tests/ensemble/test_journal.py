"""The journal survives a torn last line: skipped on read, cut before the next append."""

import json

from ensemble.results.journal import Journal, read_journal


def test_append_is_one_whole_line_per_record(tmp_path):
    path = tmp_path / "journal.jsonl"
    with Journal(path) as j:
        j.append({"id": "a", "status": "ok", "val": {"accuracy": 0.5}})
        j.append({"id": "b", "status": "failed"})
    assert [r["id"] for r in read_journal(path)] == ["a", "b"]
    assert path.read_text().count("\n") == 2


def test_torn_last_line_is_skipped_and_cut_on_resume(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps({"id": "a", "status": "ok"}) + "\n" + '{"id": "b", "sta')
    assert [r["id"] for r in read_journal(path)] == ["a"]
    with Journal(path) as j:                          # reopening (a resume) cuts the torn tail
        j.append({"id": "c", "status": "ok"})
    assert [r["id"] for r in read_journal(path)] == ["a", "c"]
    assert path.read_text().splitlines()[1].startswith('{"id": "c"')


def test_missing_journal_reads_empty(tmp_path):
    assert read_journal(tmp_path / "none.jsonl") == []


def test_records_and_events_are_written_as_json_and_read_back_typed(tmp_path):
    """The journal is the disk boundary: typed in, JSON on disk, typed out (older lines read
    as meant: "ok" with ``discarded`` is DISCARDED, failed with kind time_limit is LIMIT)."""
    from ensemble.results.events import Event, EventKind
    from ensemble.results.records import Counts, MemberRecord, Status
    from ensemble.results.rundir import RunDirectory
    rd = RunDirectory(tmp_path)
    with rd.journal() as j:
        j.event(Event(EventKind.OPEN, {"time": 1.0, "workers": 2}))
        j.extend([MemberRecord("a", Status.OK, val={"accuracy": 0.5}),
                  {"id": "b", "status": "ok", "discarded": {"epoch": 2}},
                  {"id": "c", "status": "failed", "error": {"kind": "time_limit", "message": "slow"}},
                  {"event": "nobody_knows_this_kind"}])
    assert [json.loads(x).get("status") for x in (tmp_path / rd.JOURNAL).read_text().splitlines()] == \
        [None, "ok", "ok", "failed", None]
    history = rd.history()
    assert [type(x).__name__ for x in history] == ["Event", "MemberRecord", "MemberRecord", "MemberRecord"]
    records, events = rd.records()
    assert [r.status for r in records] == [Status.OK, Status.DISCARDED, Status.LIMIT]
    assert [e.kind for e in events] == [EventKind.OPEN] and records[0].val == {"accuracy": 0.5}
    assert Counts.of_records(records).as_dict() == {"ok": 1, "failed": 0, "discarded": 1, "stopped": 0,
                                                    "limit": 1, "ended": 3, "issued": 3}
