"""The control plane under real mpiexec with rehearsal members (no TensorFlow): hundreds of
members journalled once each, utilisation from the journal, group commit survives kill -9 of
the master, and the simulator replays a real run's members. How fast the control plane is
(members/s) and how close the simulator comes to a real run's wall time are measured by
scripts/ benchmarks, not asserted here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from ensemble.results.journal import read_journal
from ensemble.results.timeline import run_stats
from tests.conftest import ROOT, mpiexec, run_mpi
from tests.mpi.test_resilience import find_rank_pid

pytestmark = pytest.mark.mpi

ENSEMBLE = """
name = "rehearse"
[[architectures]]
name = "a"
members = {members}
layers = [{{type = "Dense", units = 8}}]
[[architectures]]
name = "b"
members = {members}
layers = [{{type = "Dense", units = 16}}]
[runtime]
trainer = "rehearsal"
progress_lines = 50
progress_seconds = 0.5
journal_sync_seconds = {sync}
[rehearsal]
seconds = {seconds}
spread = {spread}
"""

SEARCH = """
name = "rehearse-search"
mode = "evolve"
[evolve]
strategy = "regularized"
evaluations = 200
population_size = 20
sample_size = 5
[runtime]
trainer = "rehearsal"
[rehearsal]
seconds = 0.005
spread = 0.5
"""


def config(tmp_path: Path, text: str, **fields) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(textwrap.dedent(text.format(**fields) if fields else text))
    return path


def test_rehearsal_ensemble_of_200_journals_each_member_once_and_prints_the_journal_utilisation(tmp_path):
    run_dir = tmp_path / "run"
    cfg = config(tmp_path, ENSEMBLE, members=100, seconds=0.01, spread=0.3, sync=1.0)
    proc = run_mpi(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    records, events = read_journal(run_dir / "journal.jsonl", events=True)
    assert Counter(r["id"] for r in records).most_common(1)[0][1] == 1 and len(records) == 200
    assert all({"dispatched", "started", "ended", "received", "rank", "host", "worker"} <= set(r) for r in records)
    assert all(r["dispatched"] <= r["received"] and r["started"] <= r["ended"] for r in records)
    stats = run_stats(records, events)
    summary = json.loads((run_dir / "ensemble.json").read_text())
    assert summary["run"].pop("finalize_seconds") >= 0 and summary["run"].pop("selection_seconds") >= 0
    assert summary["run"] == stats                                 # ensemble.json = the journal's account
    printed = re.search(r"utilisation ([\d.]+)%, startup", proc.stdout)
    assert printed and float(printed.group(1)) == pytest.approx(100 * stats["utilisation"], abs=0.05)
    assert 0.3 < stats["utilisation"] <= 1.0 and stats["workers"] == 3
    assert "[200/200]" in proc.stdout and "members/s" in proc.stdout      # summary lines, not 200 lines
    assert proc.stdout.count("val accuracy") == 0
    assert len(summary["members"]) >= 1                            # selection ran on the made-up predictions


def test_rehearsal_search_of_200_evaluations_at_n4(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_mpi(4, ["-m", "ensemble.run", str(config(tmp_path, SEARCH)), "--run-dir", str(run_dir)],
                   timeout=180)
    assert proc.returncode == 0, proc.stderr
    records = read_journal(run_dir / "journal.jsonl")
    ids = Counter(r["id"] for r in records)
    assert len(ids) == 200 and max(ids.values()) == 1
    assert sorted(r["search"]["evaluation"] for r in records) == list(range(1, 201))


def test_kill_master_with_group_commit_then_resume_loses_and_retrains_nothing(tmp_path):
    run_dir, tag = tmp_path / "run", uuid.uuid4().hex
    cfg = config(tmp_path, ENSEMBLE, members=150, seconds=0.03, spread=0.2, sync=5.0)
    env = {**os.environ, "ENSEMBLE_TEST_TAG": tag, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([mpiexec(), "-n", "4", sys.executable, "-m", "ensemble.run", str(cfg),
                             "--run-dir", str(run_dir)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        while len(read_journal(run_dir / "journal.jsonl")) < 40:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "no members journalled in time"
            time.sleep(0.05)
        os.kill(find_rank_pid(tag, 0), signal.SIGKILL)       # within 5 s of the last fsync
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
            pytest.fail("the job did not exit after the master was killed")
    before = {r["id"] for r in read_journal(run_dir / "journal.jsonl")}
    assert 40 <= len(before) < 300, "kill came too late to test resume"
    proc = run_mpi(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    records, events = read_journal(run_dir / "journal.jsonl", events=True)
    counts = Counter(r["id"] for r in records)
    assert len(counts) == 300 and max(counts.values()) == 1          # nothing lost, nothing trained twice
    assert [e["event"] for e in events].count("open") == 2
    assert run_stats(records, events)["segments"] == 2


@pytest.mark.long          # make test-long: bench_scale.py validate-* compares simulator and real runs
def test_simulator_replays_the_real_runs_members_on_its_workers(tmp_path):
    """Each simulated member takes the time its namesake took in the journal, on as many
    workers: the simulated dispatch can be no shorter than the longest member nor than the
    members' time spread evenly over the workers."""
    run_dir = tmp_path / "run"
    cfg = config(tmp_path, ENSEMBLE, members=20, seconds=0.25, spread=0.5, sync=1.0)
    proc = run_mpi(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    real = json.loads((run_dir / "ensemble.json").read_text())["run"]
    out = subprocess.run([sys.executable, "-m", "ensemble.simulate", str(cfg), "--workers", "3",
                          "--replay", str(run_dir / "journal.jsonl"), "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    simulated = json.loads(out.stdout.strip().splitlines()[-1])
    assert simulated["members"] == real["members"] == 40 and simulated["workers"] == real["workers"] == 3
    # what the simulator replays: each member's time on its worker (ended - started), which is a little
    # more than its train_seconds, more so on a loaded machine (0.011 s over 40 members failed abs=0.01)
    seconds = [r["ended"] - r["started"] for r in read_journal(run_dir / "journal.jsonl")]
    assert len(seconds) == 40 and min(seconds) > 0
    assert simulated["training_seconds"] == pytest.approx(sum(seconds), abs=0.01), (simulated, sum(seconds))
    assert simulated["dispatch_seconds"] >= max(max(seconds), sum(seconds) / 3) - 0.01, (simulated, seconds)
