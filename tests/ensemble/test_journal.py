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
