"""Retention under real mpiexec with rehearsal members (no TensorFlow): a bounded run
directory, and a resume after the packed store lost its tail that retrains exactly the
members whose kept predictions were lost and ends with the same ensemble."""

from __future__ import annotations

import json
import textwrap
from collections import Counter

import pytest

from ensemble.results.journal import read_journal, read_lines
from ensemble.results.store import PackStore
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
name = "retain"
[[architectures]]
name = "a"
members = 150
layers = [{type = "Dense", units = 8}]
[ensemble]
candidates = 12
keep_models = 4
method = "greedy"
metric = "log_loss"
[runtime]
trainer = "rehearsal"
[rehearsal]
seconds = 0.0
accuracy = 0.7
"""


def chosen(summary: dict) -> list[dict]:
    """ensemble.json's members less their model files' digests (a retrained member's file is
    new bytes: a .keras zip holds its write time)."""
    return [{k: v for k, v in m.items() if k != "model_file"} for m in summary["members"]]


def test_bounded_run_directory_then_torn_store_resume_retrains_only_the_lost(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    first = json.loads((run_dir / "ensemble.json").read_text())
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) <= 17, files                 # 150 members, a handful of files (the report's 7 included)
    records = read_journal(run_dir / "journal.jsonl")
    stored = [r["id"] for r in records if r["stored"]]
    assert len(records) == 150 and 12 <= len(stored) < 150           # the bars kept most arrays home
    selected = [m["id"] for m in first["members"]]
    store = PackStore(run_dir / "store")
    assert set(selected) <= set(store.index) and len(store.index) <= 12   # compacted: the kept ones only
    # lose the last entries of the pack (a node crash before the disk had them)
    entries = sorted(store.index.items(), key=lambda kv: kv[1][1])
    lost = {i for i, _ in entries[-2:]}
    path, offset = store.files[0], entries[-2][1][1]
    with open(path, "r+b") as fh:
        fh.truncate(offset + 7)
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "trained again" in proc.stdout + proc.stderr
    counts = Counter(r["id"] for r in read_journal(run_dir / "journal.jsonl") if r["status"] == "ok")
    assert {i for i, n in counts.items() if n == 2} == lost and max(counts.values()) == 2
    again = json.loads((run_dir / "ensemble.json").read_text())
    assert chosen(again) == chosen(first)                              # the same ensemble, the same weights
    assert again["ensemble"]["test"] == pytest.approx(first["ensemble"]["test"], rel=1e-12)
    opened = [x for x in read_lines(run_dir / "journal.jsonl") if x.get("event") == "open"]
    assert len(opened) == 2 and opened[-1]["resume_seconds"] is not None   # the resumed job says so


SEARCH = """
name = "retain-search"
mode = "evolve"
[evolve]
strategy = "regularized"
evaluations = 80
population_size = 10
sample_size = 3
[ensemble]
candidates = 6
keep_models = 2
[runtime]
trainer = "rehearsal"
[rehearsal]
seconds = 0.0
"""


def test_search_resume_retrains_lost_candidates_with_their_own_genome(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text(textwrap.dedent(SEARCH))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    first = json.loads((run_dir / "ensemble.json").read_text())
    store = PackStore(run_dir / "store")
    entries = sorted(store.index.items(), key=lambda kv: kv[1][1])
    lost = entries[-1][0]
    with open(store.files[0], "r+b") as fh:
        fh.truncate(entries[-1][1][1] + 3)
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    records = [r for r in read_journal(run_dir / "journal.jsonl") if r["status"] == "ok"]
    counts = Counter(r["id"] for r in records)
    assert {i for i, n in counts.items() if n == 2} == {lost} and len(counts) == 80   # no new evaluation
    twice = [r for r in records if r["id"] == lost]
    assert twice[0]["genome"] == twice[1]["genome"] and twice[0]["seed"] == twice[1]["seed"]
    assert twice[0]["val"] == twice[1]["val"]
    assert chosen(json.loads((run_dir / "ensemble.json").read_text())) == chosen(first)
