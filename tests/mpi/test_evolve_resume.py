"""An evolve run killed mid-search (the whole job, kill -9) and resumed equals the
uninterrupted run: search.csv has the same ids, genomes and metrics in the same order; one
started from an earlier run's genomes (``evolve.start_from``) resumes with every candidate once,
its earlier run moved away meanwhile."""

from __future__ import annotations

import json
import shutil
import textwrap

import pandas as pd
import pytest

from ensemble.results.journal import read_lines
from tests.conftest import kill_when, run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
name = "evr"
mode = "evolve"
seed = 3
[data]
source = "digits"
[train]
epochs = 2
patience = 1
[evolve]
strategy = "regularized"
evaluations = 7
population_size = 3
sample_size = 2
[search]
max_depth = 2
units = [8, 32]
[ensemble]
k = 2
"""


def kill_after(cfg, run_dir, finished: int) -> list[dict]:
    """Run until ``finished`` members are journalled and the candidates bred after them have
    gone out, then kill -9 the whole job (every rank at once, as a scheduler does)."""
    def ready() -> bool:
        lines = read_lines(run_dir / "journal.jsonl") if (run_dir / "journal.jsonl").exists() else []
        lines = [x for x in lines if x.get("event") != "handed"]        # each issued line is followed by one
        return sum("event" not in x for x in lines) >= finished and lines[-1].get("event") == "issued"
    kill_when(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], ready, 120, "the members")
    return read_lines(run_dir / "journal.jsonl")


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_evolve_killed_and_resumed_equals_the_uninterrupted_run(tmp_path):
    cfg = tmp_path / "evr.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    full = tmp_path / "full"
    proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(full)], timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    run_dir = tmp_path / "resumed"
    lines = kill_after(cfg, run_dir, finished=3)
    done = {x["id"] for x in lines if "event" not in x}
    issued = {x["id"]: x for x in lines if x.get("event") == "issued"}
    out = [i for i in issued if i not in done]
    assert 3 <= len(done) < 7 and out, "the kill must leave candidates in flight"
    proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    after = read_lines(run_dir / "journal.jsonl")
    records = {x["id"]: x for x in after if "event" not in x}
    for i in out:                                       # re-issued as they were, not bred anew
        assert records[i]["genome"] == issued[i]["genome"] and records[i]["seed"] == issued[i]["seed"]
    assert sorted(x["id"] for x in after if x.get("event") == "issued") == [f"e{i:04d}" for i in range(1, 8)]
    a, b = (pd.read_csv(d / "search.csv").drop(columns="wall_seconds") for d in (full, run_dir))
    assert len(a) == 7
    metrics = ["val_accuracy", "best_val_accuracy"]
    pd.testing.assert_frame_equal(a.drop(columns=metrics), b.drop(columns=metrics))
    pd.testing.assert_frame_equal(a[metrics], b[metrics], rtol=1e-6)


@pytest.mark.long
def test_a_search_started_from_an_earlier_run_resumes_after_kill_9_with_every_candidate_once(tmp_path):
    earlier = tmp_path / "earlier"
    first = tmp_path / "first.toml"
    first.write_text(textwrap.dedent(CONFIG).replace("evaluations = 7", "evaluations = 4"))
    proc = run_mpi(2, ["-m", "ensemble.run", str(first), "--run-dir", str(earlier)], timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = tmp_path / "next.toml"
    cfg.write_text(textwrap.dedent(CONFIG).replace('sample_size = 2', f'sample_size = 2\nstart_from = "{earlier}"'))

    run_dir = tmp_path / "next"
    lines = kill_after(cfg, run_dir, finished=2)
    done = {x["id"] for x in lines if "event" not in x}
    assert 2 <= len(done) < 7
    archived = tmp_path / "archived"             # moved away (a scratch purge): the run kept its start
    shutil.move(str(earlier), str(archived))
    proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    after = read_lines(run_dir / "journal.jsonl")
    issued = [x for x in after if x.get("event") == "issued"]
    records = [x for x in after if "event" not in x]
    assert sorted(x["id"] for x in issued) == [f"e{i:04d}" for i in range(1, 8)]      # each handed out once
    assert sorted(x["id"] for x in records if x["status"] == "ok") == [f"e{i:04d}" for i in range(1, 8)]
    keys = [json.dumps(x["genome"], sort_keys=True) for x in issued]
    assert len(set(keys)) == len(keys)                                                  # no genome twice
    table = pd.read_csv(archived / "search.csv")                                        # it started from the
    top = table[table["val_accuracy"] == table["val_accuracy"].max()]["id"]            # earlier run's best
    assert keys[0] in {json.dumps(read_genome(archived, i), sort_keys=True) for i in top}


def read_genome(run_dir, member_id: str) -> dict:
    """The genome an earlier run's journal holds for ``member_id``."""
    return next(x["genome"] for x in read_lines(run_dir / "journal.jsonl")
                if "event" not in x and x["id"] == member_id)
