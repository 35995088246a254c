"""The end of the run under real mpiexec (``runtime.tail_helpers``): idle workers join the
members still training, every member is trained and recorded once, and no rank waits forever
(a helper sent to a member that ends first goes back)."""

from __future__ import annotations

import textwrap
from collections import Counter

import pytest

from ensemble.results.journal import read_journal
from ensemble.results.records import HELPER_SECONDS, HELPERS
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

REHEARSAL = """
name = "tail"
[[architectures]]
name = "a"
members = 16
epochs = 10
layers = [{type = "Dense", units = 4}]
[runtime]
trainer = "rehearsal"
tail_helpers = 3
[rehearsal]
seconds = 0.6
spread = 1.0
predictions = false
"""

KERAS = """
name = "tailk"
seed = 3
[data]
source = "digits"
task = "classification"
[train]
epochs = 6
batch_size = 256
patience = 40
[[architectures]]
name = "small"
members = 1
layers = [{type = "Dense", units = 16, activation = "relu"}]
[[architectures]]
name = "big"
members = 1
epochs = 30
layers = [{type = "Dense", units = 2048, activation = "relu"}, {type = "Dropout", rate = 0.1},
          {type = "Dense", units = 2048, activation = "relu"}]
[runtime]
tail_helpers = 1
order = "list"
"""


def members(run_dir) -> list[dict]:
    return [r for r in read_journal(run_dir / "journal.jsonl") if "id" in r]


def test_rehearsal_members_take_helpers_and_each_is_recorded_once(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent(REHEARSAL))
    run_dir = tmp_path / "run"
    proc = run_mpi(6, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=180)
    assert proc.returncode == 0, proc.stderr
    records = members(run_dir)
    assert Counter(r["id"] for r in records) == Counter({f"a-{i:03d}": 1 for i in range(16)})
    assert {r["status"] for r in records} == {"ok"}
    helped = [r for r in records if r.get(HELPERS)]
    assert helped, "no member took a helper"
    assert all(1 <= r[HELPERS] <= 3 and r[HELPER_SECONDS] > 0 for r in helped)


@pytest.mark.long          # make test-long: the rehearsal tail tests above cover the helpers' protocol
def test_a_keras_member_takes_a_helper_and_ends_as_a_valid_member(tmp_path):
    cfg = tmp_path / "k.toml"
    cfg.write_text(textwrap.dedent(KERAS))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = {r["id"]: r for r in members(run_dir)}
    assert set(records) == {"small-000", "big-000"}
    big = records["big-000"]
    assert big["status"] == "ok"
    assert big.get(HELPERS) == 1 and big[HELPER_SECONDS] > 0        # the idle worker joined it
    assert big["val"]["accuracy"] > 0.85                             # a member that learned
    assert (run_dir / "ensemble.json").exists()


@pytest.mark.long          # make test-long: the rehearsal tail test above covers the helpers' protocol
def test_a_hierarchy_lets_each_share_help_its_own_members(tmp_path):
    """-n 9, two sub-masters of three workers: once the top has nothing more, each sub-master's
    idle workers help its members; every member is still recorded once."""
    cfg = tmp_path / "h.toml"
    cfg.write_text(textwrap.dedent(REHEARSAL.replace("members = 16", "members = 24")
                                   .replace("tail_helpers = 3", "tail_helpers = 2\nsub_masters = 2")))
    run_dir = tmp_path / "run"
    proc = run_mpi(9, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=180)
    assert proc.returncode == 0, proc.stderr
    records = members(run_dir)
    assert Counter(r["id"] for r in records) == Counter({f"a-{i:03d}": 1 for i in range(24)})
    helped = [r for r in records if r.get(HELPERS)]
    assert helped and all(1 <= r[HELPERS] <= 2 for r in helped)
