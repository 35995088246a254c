"""A search whose children are screened ahead by a helper process (``evolve.surrogate_ahead``)
under real ranks: killed with -9 (the helper with it), resumed, every candidate handed out and
trained once, and the resumed job's helper screened children. Members are rehearsed (no
TensorFlow), so the job is about the master, its helper and the journal."""

from __future__ import annotations

import json
import textwrap

import pytest

from ensemble.results.journal import read_lines
from tests.conftest import kill_when, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.long]

EVALUATIONS = 60
CONFIG = f"""
name = "ahead"
mode = "evolve"
seed = 5
[data]
source = "digits"
reshape = [8, 8, 1]
[evolve]
strategy = "regularized"
evaluations = {EVALUATIONS}
population_size = 4
sample_size = 2
surrogate = "forest"
surrogate_candidates = 6
surrogate_min_results = 4
surrogate_ahead = 4
[search]
space = "structured"
max_params = 20000
[runtime]
trainer = "rehearsal"
[rehearsal]
seconds = 0.5
"""


def test_a_search_screened_ahead_resumes_after_kill_9_with_every_candidate_once(tmp_path):
    cfg = tmp_path / "ahead.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    run_dir = tmp_path / "run"
    journal = run_dir / "journal.jsonl"

    def finished() -> int:
        return sum("event" not in x for x in read_lines(journal)) if journal.exists() else 0
    kill_when(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], lambda: finished() >= 20, 180,
              "20 finished candidates")
    assert finished() < EVALUATIONS
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    lines = read_lines(journal)
    issued = [x for x in lines if x.get("event") == "issued"]
    ids = [f"e{i:04d}" for i in range(1, EVALUATIONS + 1)]
    assert sorted(x["id"] for x in issued) == ids                                    # each handed out once
    assert sorted(x["id"] for x in lines if "event" not in x) == ids                 # and trained once
    keys = [json.dumps(x["genome"], sort_keys=True) for x in issued]
    assert len(set(keys)) == len(keys)                                               # no genome twice
    stats = json.loads((run_dir / "ensemble.json").read_text())["search"]["surrogate"]
    assert stats["surrogate_ahead"] == 4 and stats["surrogate_served"] >= 1, stats
    assert "screened ahead by 1 helper process(es)" in proc.stdout + proc.stderr
