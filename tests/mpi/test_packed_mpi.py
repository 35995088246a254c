"""``runtime.members_per_rank`` with real ranks: a run whose members train packed equals the
same run trained one member at a time, member by member, and writes the same files."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ensemble.results.journal import read_lines
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
name = "packed"
seed = 4
[data]
source = "digits"
[train]
epochs = 6
batch_size = 64
patience = 2
[[architectures]]
name = "mlp"
members = 5
layers = [{{type = "Dense", units = 32, activation = "relu"}}, {{type = "Dropout", rate = 0.1}}]
[[architectures]]
name = "cnn"
members = 1
layers = [{{type = "Reshape", target_shape = [8, 8, 1]}}, {{type = "Conv2D", filters = 4, kernel_size = 3}}]
[runtime]
members_per_rank = {k}
order = "list"                          # the MLPs first, as listed: the hand-out the blocks below assume
"""


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_packed_members_equal_the_unpacked_run(tmp_path):
    boards = {}
    for k in (1, 4):
        cfg = tmp_path / f"k{k}.toml"
        cfg.write_text(CONFIG.format(k=k))
        run_dir = tmp_path / f"run{k}"
        proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        boards[k] = pd.read_csv(run_dir / "leaderboard.csv").set_index("id").sort_index()
        records = {r["id"]: r for r in read_lines(run_dir / "journal.jsonl") if "event" not in r}
        packed = {i for i, r in records.items() if r.get("packed")}
        if k == 1:
            assert not packed
        else:                               # 5 MLPs over 2 workers in blocks of 4: one pack of 4; the CNN alone
            assert packed and "cnn-000" not in packed
            assert max(r["packed"]["members"] for r in records.values() if r.get("packed")) == 4
        summary = json.loads((run_dir / "ensemble.json").read_text())
        assert summary["n_finished"] == 6
        assert {p.name for p in (run_dir / "models").iterdir()} >= {f"mlp-00{i}.keras" for i in range(5)}
    a, b = boards[1], boards[4]
    assert list(a.index) == list(b.index)
    for column in ("val_accuracy", "val_log_loss", "test_accuracy", "test_log_loss", "epochs"):
        pd.testing.assert_series_equal(a[column], b[column], rtol=1e-5, atol=1e-6)


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_a_packed_run_killed_and_resumed_trains_every_member_once(tmp_path):
    from tests.conftest import kill_when
    cfg = tmp_path / "k3.toml"
    # 15 MLPs: members handed out but not back when the job is killed (up to two packs held by the worker)
    # go out again one suspect at a time (``results.crashes``); those never handed out pack as before
    cfg.write_text(CONFIG.format(k=3).replace("members = 5", "members = 15").replace("epochs = 6", "epochs = 10"))
    run_dir = tmp_path / "run"
    journal = run_dir / "journal.jsonl"
    kill_when(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)],
              lambda: journal.exists() and any("event" not in x for x in read_lines(journal)), 180,
              "the first packed result")
    lines = read_lines(journal)
    before = {r["id"] for r in lines if "event" not in r}
    handed = {x["member"] for x in lines if x.get("event") == "handed"}
    assert before and len(before) < 16
    proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [r for r in read_lines(journal) if "event" not in r]
    assert sorted(r["id"] for r in records) == sorted({r["id"] for r in records})      # none trained twice
    assert len(records) == 16 and {r["status"] for r in records} == {"ok"}
    assert any(r.get("packed") for r in records if r["id"] not in handed)           # never handed out: packed
