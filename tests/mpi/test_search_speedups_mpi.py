"""The search's speed-ups with real ranks: early discarding (asha) and weight inheritance
together, the job killed -9 mid-search and resumed: every candidate is evaluated once,
discarded candidates are journalled with their epoch and never selected, inherited
children say from whom and which layers."""

from __future__ import annotations

import json

import pytest

from ensemble.results.journal import read_lines
from tests.conftest import kill_when, run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
name = "fast"
mode = "evolve"
seed = 3
[data]
source = "digits"
[train]
epochs = 8
patience = 3
[evolve]
strategy = "regularized"
evaluations = 14
population_size = 5
sample_size = 3
discard = "asha"
discard_epochs = 2
discard_factor = 2
discard_grace = 3
inherit = true
[search]
max_depth = 2
units = [8, 48]
learning_rate = [1e-5, 1e-2]
"""


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_discarding_and_inheritance_survive_a_kill_and_resume(tmp_path):
    cfg = tmp_path / "fast.toml"
    cfg.write_text(CONFIG)
    run_dir = tmp_path / "run"
    journal = run_dir / "journal.jsonl"
    kill_when(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)],
              lambda: journal.exists() and sum("event" not in x for x in read_lines(journal)) >= 7,
              180, "7 finished candidates")
    proc = run_mpi(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    records = [x for x in read_lines(run_dir / "journal.jsonl") if "event" not in x]
    evaluated = ("ok", "discarded")                               # a discarded candidate: a low-fidelity evaluation
    ok = {r["id"]: r for r in records if r["status"] in evaluated}
    assert len(ok) == 14                                          # each candidate evaluated, none twice
    assert len([r for r in records if r["status"] in evaluated]) == 14
    discarded = [r for r in ok.values() if r["status"] == "discarded"]
    assert all(r.get("discarded") for r in discarded)
    assert discarded, "with learning rates down to 1e-5 some candidates must be stopped at a rung"
    for r in discarded:
        assert r["discarded"]["rule"] == "asha" and r["epochs"] == r["discarded"]["epoch"] in (2, 4)
        assert not r["stored"] and not r["model"]
    summary = json.loads((run_dir / "ensemble.json").read_text())
    chosen = {m["id"] for m in summary["members"]}
    assert chosen and not chosen & {r["id"] for r in discarded}
    assert summary["best_member"]["id"] not in {r["id"] for r in discarded}
    assert summary["n_discarded"] == len(discarded)
    inherited = [r for r in ok.values() if r.get("inherited")]
    assert inherited, "a regularized search bred children whose parents' models are kept"
    for r in inherited:
        assert r["inherited"]["from"] in ok and r["inherited"]["of_layers"] >= len(r["inherited"]["layers"])
    import pandas as pd
    board = pd.read_csv(run_dir / "leaderboard.csv")
    assert set(board.loc[board["status"] == "discarded", "id"]) == {r["id"] for r in discarded}
