"""Cost-aware ordering under real mpiexec (rehearsal members, no TensorFlow): every member
is trained exactly once, the predicted longest architecture first."""

from __future__ import annotations

import textwrap
from collections import Counter

import pytest

from ensemble.results.journal import read_journal
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
name = "ordering"
[[architectures]]
name = "narrow"
members = 12
layers = [{type = "Dense", units = 4}]
[[architectures]]
name = "wide"
members = 12
layers = [{type = "Dense", units = 512}]
[runtime]
trainer = "rehearsal"
order = "cost"
[rehearsal]
seconds = 0.02
spread = 0.3
predictions = false
"""


def test_cost_order_trains_every_member_once_the_predicted_longest_first(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    records = read_journal(run_dir / "journal.jsonl")
    ids = Counter(r["id"] for r in records)
    assert len(ids) == 24 and set(ids.values()) == {1}
    assert {r["status"] for r in records} == {"ok"}
    first = sorted(records, key=lambda r: r["dispatched"])[:2]     # the first fill, before any result
    assert {r["arch"] for r in first} == {"wide"}
