"""An evolve run under real mpiexec -n 3 with a tiny budget: journal, search.csv, leaderboard, ensemble."""

from __future__ import annotations

import json
import textwrap

import pandas as pd
import pytest

from ensemble.results.journal import read_journal
from ensemble.results.records import MemberRecord
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
name = "evo"
mode = "evolve"
seed = 5
[data]
source = "digits"
reshape = [8, 8, 1]
[train]
epochs = 3
patience = 1
[evolve]
strategy = "regularized"
evaluations = 7
population_size = 4
sample_size = 2
[search]
max_depth = 2
filters = [4, 8]
units = [8, 32]
max_params = 20000
[ensemble]
k = 3
"""


def test_evolve_run_three_ranks(tmp_path):
    cfg = tmp_path / "evo.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    journal = read_journal(run_dir / "journal.jsonl")
    assert sorted(r["id"] for r in journal) == [f"e{i:04d}" for i in range(1, 8)]
    assert all("genome" in r and "search" in r for r in journal)
    assert len({json.dumps(r["genome"], sort_keys=True) for r in journal}) == 7     # no genome trained twice

    search = pd.read_csv(run_dir / "search.csv")
    assert len(search) == 7 and list(search.columns[:4]) == ["evaluation", "wall_seconds", "id", "status"]
    assert search["wall_seconds"].is_monotonic_increasing
    best = search["best_val_accuracy"].tolist()
    assert best == sorted(best) and best[-1] == pytest.approx(search["val_accuracy"].max())
    for plot in ("leaderboard", "classification", "search", "costs", "timeline"):   # the run's report
        assert (run_dir / "report" / f"{plot}.png").stat().st_size > 1000, plot
    page = (run_dir / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 5 and "could not be drawn" not in page

    board = pd.read_csv(run_dir / "leaderboard.csv")
    assert len(board) == 7 and board["val_accuracy"].is_monotonic_decreasing
    ens = json.loads((run_dir / "ensemble.json").read_text())
    assert ens["method"] in ("shrunk", "greedy", "bagged", "top_k") and 1 <= len(ens["members"]) <= 7
    assert set(m["id"] for m in ens["members"]) <= set(board["id"])
    assert ens["search"]["search_best"]["val"] >= ens["search"]["initial_best"]["val"]
    assert ens["best_member"]["id"] == board["id"][0]
    assert "search: best of the first population" in proc.stdout
    best_bred = int(ens["search"]["search_best"]["id"][1:]) > ens["search"]["initial_population"]
    assert ("search: best evolved after 7 evaluations" in proc.stdout) == best_bred     # else: from the first


@pytest.mark.long          # make test-long: tracing ahead: tests/ensemble/test_traced.py covers it in one process
def test_tracing_the_next_candidate_ahead_changes_no_result(tmp_path):
    """`runtime.pretrace = true` at -n 2 (one worker, holding the next candidate while it trains
    one: `specs_in_hand = 2`): candidates' steps are traced in the background and the search is
    the same, candidate for candidate, as with it off."""
    journals = {}
    for pretrace in ("false", "true"):
        cfg = tmp_path / f"evo_{pretrace}.toml"
        cfg.write_text(textwrap.dedent(CONFIG).replace("evaluations = 7", "evaluations = 6")
                       + f"[runtime]\npretrace = {pretrace}\nspecs_in_hand = 2\n")
        run_dir = tmp_path / f"run_{pretrace}"
        proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=400)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        journals[pretrace] = {r["id"]: r for r in read_journal(run_dir / "journal.jsonl")}
    off, on = journals["false"], journals["true"]
    assert sorted(off) == sorted(on) == [f"e{i:04d}" for i in range(1, 7)]
    for member, record in off.items():
        assert on[member]["genome"] == record["genome"] and on[member]["epochs"] == record["epochs"]
        assert on[member]["val"] == record["val"] and on[member]["test"] == record["test"], member
    assert not any(MemberRecord.from_json(r).reused_trace for r in off.values())   # each a new architecture
    assert sum(MemberRecord.from_json(r).reused_trace for r in on.values()) >= 2   # traced ahead, then trained
