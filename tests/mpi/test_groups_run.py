"""Member groups at -n 5 (master + 2 groups of 2): an ensemble run and an evolve run complete,
and a group's members equal the same members trained by single ranks."""

from __future__ import annotations

import json
import textwrap

import pandas as pd
import pytest

from ensemble.results.journal import read_journal
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

ENSEMBLE = """
seed = 4
[data]
source = "digits"
[train]
epochs = 4
batch_size = 64
[[architectures]]
members = 3
layers = [{type = "Dense", units = 24, activation = "relu"}]
[ensemble]
k = 3
method = "top_k"
[runtime]
group_size = GROUP
"""


def run(tmp_path, n, text):
    cfg = tmp_path / f"c{n}.toml"
    cfg.write_text(textwrap.dedent(text))
    run_dir = tmp_path / f"run{n}"
    proc = run_mpi(n, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir, proc


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_ensemble_run_with_groups_matches_single_rank_members(tmp_path):
    grouped, proc = run(tmp_path, 5, ENSEMBLE.replace("GROUP", "2"))
    assert "2 groups of 2 ranks" in proc.stdout
    journal = read_journal(grouped / "journal.jsonl")
    assert len(journal) == 3 and all(r["status"] == "ok" for r in journal)
    assert {r["rank"] for r in journal} <= {1, 3}                 # only leaders report
    single, _ = run(tmp_path, 2, ENSEMBLE.replace("GROUP", "1"))
    ref = {r["id"]: r for r in read_journal(single / "journal.jsonl")}
    for r in journal:                                             # same global batch, same result
        assert r["val"]["log_loss"] == pytest.approx(ref[r["id"]]["val"]["log_loss"], rel=1e-5)
        assert r["epochs"] == ref[r["id"]]["epochs"]
    assert (grouped / "ensemble.json").exists()


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_evolve_run_with_groups(tmp_path):
    run_dir, _ = run(tmp_path, 5, """
        mode = "evolve"
        [data]
        source = "digits"
        [train]
        epochs = 3
        [evolve]
        evaluations = 5
        population_size = 3
        sample_size = 2
        [search]
        max_depth = 2
        units = [8, 32]
        [runtime]
        group_size = 2
    """)
    assert len(read_journal(run_dir / "journal.jsonl")) == 5
    assert len(pd.read_csv(run_dir / "search.csv")) == 5
    assert json.loads((run_dir / "ensemble.json").read_text())["members"]
