"""A master hierarchy's sub-masters keeping their own books, without MPI: the store's writers
(each appends to its own files, the master reads them all), the run directory's readers
(the journal and the sub-master journals not absorbed yet), the absorb (crash safe), the
shares (every member in one, skipped by the others), and ``SubBooks`` journalling results
and keeping their candidates where the master finds them.
tests/mpi/test_hierarchy_mpi.py runs it under mpiexec, killed and resumed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ensemble.config import resolve_config
from ensemble.orchestrate.progress import Progress
from ensemble.orchestrate.submasters import SubBooks
from ensemble.results.artifacts import Artifacts
from ensemble.results.journal import Journal
from ensemble.results.records import MemberRecord
from ensemble.results.rundir import RunDirectory
from ensemble.results.store import WRITER_FILES, PackStore
from ensemble.runtime.budget import RunBudget
from ensemble.runtime.hierarchy import owner


def arrays(value: float) -> dict:
    return {"val_pred": np.full((4, 2), value, dtype=np.float32)}


def test_each_writer_appends_to_its_own_files_and_the_master_reads_them_all(tmp_path):
    master = PackStore(tmp_path)
    one, two = PackStore(tmp_path, writer=1), PackStore(tmp_path, writer=2)
    one.put("a", arrays(1.0))
    two.put("b", arrays(2.0))
    master.put("c", arrays(3.0))
    for store in (one, two, master):
        store.close()
    names = sorted(p.name for p in tmp_path.glob("*.pack"))
    assert names == ["predictions-000.pack", f"predictions-{WRITER_FILES}.pack", f"predictions-{2 * WRITER_FILES}.pack"]
    union = PackStore(tmp_path)
    assert {i: float(union.get(i)[0]["val_pred"][0, 0]) for i in "abc"} == {"a": 1.0, "b": 2.0, "c": 3.0}
    assert set(PackStore(tmp_path, writer=1).index) == {"a"}       # a sub-master indexes only its own files


def test_a_sub_master_never_cuts_the_tail_of_another_writers_file(tmp_path):
    PackStore(tmp_path, writer=2).put("b", arrays(2.0))
    path = tmp_path / f"predictions-{2 * WRITER_FILES}.pack"
    with open(path, "ab") as fh:
        fh.write(b"EPK1\x00\x00")                                   # another process mid-append
    size = path.stat().st_size
    PackStore(tmp_path, writer=1).put("a", arrays(1.0))
    assert path.stat().st_size == size


def test_compaction_keeps_the_live_entries_of_every_writer_in_the_masters_files(tmp_path):
    for writer, member in ((1, "a"), (2, "b"), (2, "x")):
        store = PackStore(tmp_path, writer=writer)
        store.put(member, arrays(float(writer)))
        store.close()
    master = PackStore(tmp_path)
    master.compact({"a", "b"})
    assert sorted(p.name for p in tmp_path.glob("*.pack")) == ["predictions-000.pack"]
    assert set(PackStore(tmp_path).index) == {"a", "b"}


def line(member_id: str, value: float = 0.9, **extra) -> dict:
    return {"id": member_id, "status": "ok", "arch": "a", "seed": 1, "val": {"accuracy": value, "log_loss": 0.3},
            "test": {"accuracy": value}, "train_seconds": 1.0, "started": 10.0, "ended": 11.0, "worker": 0,
            "rank": 3, **extra}


def write_sub(run_dir: RunDirectory, k: int, lines: list[dict]) -> None:
    with Journal(run_dir.sub_journal(k)) as journal:
        journal.extend(lines)


def test_readers_see_the_journal_then_the_sub_master_journals_and_absorb_makes_it_one(tmp_path):
    run_dir = RunDirectory(tmp_path)
    with run_dir.journal() as journal:
        journal.extend([{"event": "open", "workers": 4}, line("a")])
    write_sub(run_dir, 1, [line("c")])
    write_sub(run_dir, 0, [line("b")])
    with open(run_dir.sub_journal(0), "a") as fh:
        fh.write('{"id": "torn", "sta')                           # killed mid-write: not read, not absorbed
    upto = (tmp_path / run_dir.JOURNAL).stat().st_size
    assert [r.id for r in run_dir.records()[0]] == ["a", "b", "c"]
    assert [x["id"] for x in run_dir.read_lines(upto) if "id" in x] == ["a"]     # what the journal held
    absorbed = run_dir.absorb()
    assert [x["id"] for x in absorbed] == ["b", "c"]
    assert not (tmp_path / run_dir.SUB_JOURNALS).exists()
    assert [r.id for r in run_dir.records()[0]] == ["a", "b", "c"]
    assert run_dir.absorb() == []


def test_an_absorb_cut_short_is_undone_and_done_again_and_never_read_twice(tmp_path):
    run_dir = RunDirectory(tmp_path)
    with run_dir.journal() as journal:
        journal.extend([line("a")])
    write_sub(run_dir, 0, [line("b"), line("c")])
    size = (tmp_path / run_dir.JOURNAL).stat().st_size
    # the absorb wrote its mark and part of the copy, then the job died
    (tmp_path / run_dir.SUB_JOURNALS / run_dir.ABSORBING).write_text(json.dumps({"journal_bytes": size}))
    with open(tmp_path / run_dir.JOURNAL, "a") as fh:
        fh.write(json.dumps(line("b")) + "\n")
    assert [r.id for r in run_dir.records()[0]] == ["a", "b", "c"]   # the partial copy is not read
    run_dir.absorb()
    assert [r.id for r in run_dir.records()[0]] == ["a", "b", "c"]
    assert not (tmp_path / run_dir.SUB_JOURNALS).exists()


def test_shares_follow_the_workers_and_every_member_has_one_owner():
    ids = [f"a-{j:05d}" for j in range(20000)]
    counts = [0, 0, 0]
    for i in ids:
        counts[owner(i, [1, 2, 1])] += 1
    assert abs(counts[1] / len(ids) - 0.5) < 0.02 and abs(counts[0] / len(ids) - 0.25) < 0.02
    assert [owner(i, [1, 2, 1]) for i in ids[:50]] == [owner(i, [1, 2, 1]) for i in ids[:50]]


def test_a_share_hands_out_only_its_own_members_and_not_the_finished_ones(cfg, tmp_path):
    from ensemble.modes import RunContext, mode_of
    done = MemberRecord.from_json(line("a-000"))
    for order in ("list", "cost"):
        c = resolve_config({**cfg.to_dict(), "runtime": {"order": order}})
        got = []
        for k in range(2):
            ctx = RunContext(c, {"task": "classification"}, RunDirectory(tmp_path), [done], frozenset(), 2, "accuracy",
                             mine=lambda i, k=k: owner(i, [1, 1]) == k)
            source, _ = mode_of(c).make(ctx)
            mine = []
            while (spec := source.next_spec()) is not None:
                mine.append(spec["id"])
            assert all(owner(i, [1, 1]) == k for i in mine)
            got += mine
        assert sorted(got) == [f"a-{j:03d}" for j in range(1, 8)]        # each once, a-000 is done


@pytest.fixture
def cfg():
    return resolve_config({"architectures": [{"name": "a", "members": 8, "layers": [{"type": "Dense", "units": 4}]}],
                           "ensemble": {"candidates": 2, "keep_models": 2}})


def test_sub_books_journal_their_results_and_keep_the_best_candidates_where_the_master_finds_them(tmp_path, cfg):
    run_dir = RunDirectory(tmp_path)
    sent = []
    budget = RunBudget(None, 0.0, 0.5)
    books = SubBooks(cfg, {"task": "classification"}, run_dir, 1, budget, Progress(None, "accuracy", 2, lines=0),
                     offset=3, send=sent.append)
    for n in range(4):
        spec = books.stamp({"id": f"m{n}"})
        assert spec["retain"]["metric"] == "accuracy"                  # its own bars
    results = [MemberRecord.from_json({**line(f"m{n}", 0.5 + 0.1 * n), "payload": {"arrays": arrays(n)}})
               for n in range(4)]
    books.on_results(results)
    books.close()
    assert sent and sent[-1]["tally"]["new"] == 4 and budget.n_ok == 4
    journalled = [x for x in run_dir.read_lines() if "id" in x]
    assert [x["id"] for x in journalled] == ["m0", "m1", "m2", "m3"]
    assert {x["worker"] for x in journalled} == {3}                     # the job's worker, not the share's
    assert all("payload" not in x and x["test"] for x in journalled)
    merged = Artifacts(run_dir, "accuracy", 2, 2)
    merged.restore(run_dir.read_lines())
    assert merged.pool() == ["m3", "m2"]                               # the sub-master's store, read by the master
    assert float(merged.load("m3")["val_pred"][0, 0]) == 3.0


def test_the_merged_retention_releases_in_the_journal_what_it_no_longer_keeps(tmp_path, cfg):
    """Each sub-master kept its own best 2; the run keeps the best 2 of all: the others are
    journalled as released before their files go, so a later resume takes none for lost."""
    run_dir = RunDirectory(tmp_path)
    for k in range(2):
        books = SubBooks(cfg, {"task": "classification"}, run_dir, k, RunBudget(None, 0.0, 0.5),
                         Progress(None, "accuracy", 1, lines=0))
        for n in range(3):
            books.stamp({"id": f"s{k}-{n}"})
        books.on_results([MemberRecord.from_json({**line(f"s{k}-{n}", 0.5 + 0.1 * n + 0.01 * k),
                                                  "payload": {"arrays": arrays(n)}}) for n in range(3)])
        books.close()
    run_dir.absorb()
    merged = Artifacts(run_dir, "accuracy", 2, 2)
    assert merged.restore(run_dir.read_lines()) == set()
    assert merged.pool() == ["s1-2", "s0-2"]
    released = [e for e in run_dir.records()[1] if e.data.get("reason") == "merged"]
    assert released and set(released[-1].data["predictions"]) == {"s0-1", "s1-1"}
    merged.compact()                                                   # the final prune's: only the kept stay
    merged.close()
    assert Artifacts(run_dir, "accuracy", 2, 2).restore(run_dir.read_lines()) == set()


def test_an_absorb_cut_after_its_copy_leaves_one_copy_to_read(tmp_path):
    """The copy is on disk and the folder with the sub journals and the mark was renamed away,
    then the job died before removing it: readers read the journal alone, and the next absorb
    only clears the leftover."""
    run_dir = RunDirectory(tmp_path)
    with run_dir.journal() as journal:
        journal.extend([line("a")])
    write_sub(run_dir, 0, [line("b")])
    run_dir.absorb()
    leftover = tmp_path / (run_dir.SUB_JOURNALS + ".absorbed")
    leftover.mkdir()
    (leftover / "sub-0.jsonl").write_text(json.dumps(line("b")) + "\n")
    assert [r.id for r in run_dir.records()[0]] == ["a", "b"]
    assert run_dir.absorb() == [] and not leftover.exists()
    assert [r.id for r in run_dir.records()[0]] == ["a", "b"]


def test_a_share_journals_what_it_hands_out_so_a_resume_finds_its_crash_suspects(tmp_path):
    """A hierarchy's sub-masters journalled no `handed` lines: a member that killed its worker took
    every resumed job with it (9 jobs, rc 9 each), never a suspect, never given up. Absorbed after a
    lost job, a share's lines name the members in flight, and the crash book finds them."""
    from ensemble.results.crashes import read_crashes
    cfg = resolve_config({"name": "x", "architectures": [{"name": "m", "members": 4,
                                                          "layers": [{"type": "Dense", "units": 2}]}]})
    run_dir = RunDirectory(tmp_path)
    with run_dir.journal() as journal:
        journal.event({"event": "open", "time": 1.0, "workers": 2})
    books = SubBooks(cfg, {"task": "classification"}, run_dir, 0, RunBudget(None, 0.0, 0.5),
                     Progress(None, "accuracy", 2, lines=0))
    for n in range(3):
        books.stamp({"id": f"m{n}"})
    books.on_results([MemberRecord.from_json({**line("m0", 0.5), "payload": {"arrays": arrays(0)}})])
    books.journal.close()                                # the job lost here: no close, no interrupted
    run_dir.absorb()
    assert set(read_crashes(run_dir.history()).suspects) == {"m1", "m2"}
    # so the resume runs with one master, which hands them out a few at a time (shares could not tell
    # that one trains alone: the same member lost nine resumed jobs in a row)
    from ensemble.orchestrate.submasters import flat_for_suspects
    assert flat_for_suspects(cfg, run_dir)
    with run_dir.journal() as journal:
        journal.extend([line("m1"), line("m2")])
    assert not flat_for_suspects(cfg, run_dir)
