"""Two jobs on one run directory (issue 29): a killed run resumed twice at the same moment
(a job script resubmitted while its first copy still starts): one job refuses at once,
naming the other, and the one that runs trains every member exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from tests.conftest import ROOT, kill_when, mpiexec

pytestmark = pytest.mark.mpi

MEMBERS = 12


def rehearsal_config(path, members: int, seconds: float, head: str = ""):
    """A config whose members sleep `seconds` (no TensorFlow), every journal line fsynced."""
    path.write_text(head + textwrap.dedent(f"""
        [data]
        source = "iris"
        [[architectures]]
        members = {members}
        layers = [{{type = "Dense", units = 4}}]
        [runtime]
        trainer = "rehearsal"        # members sleep: no TensorFlow
        journal_sync_seconds = 0
        [rehearsal]
        seconds = {seconds}
    """))
    return path


def test_two_resumes_of_one_killed_run_one_refuses_the_other_trains_each_member_once(tmp_path):
    cfg = rehearsal_config(tmp_path / "c.toml", MEMBERS, 0.6)
    run_dir = tmp_path / "run"
    journal = run_dir / "journal.jsonl"

    def finished() -> int:
        return journal.read_text().count('"status": "ok"') if journal.exists() else 0
    kill_when(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], lambda: finished() >= 3,
              120, "3 finished members")
    assert (run_dir / "run.lock").exists()                # kill -9 left the lock behind: provably stale
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [mpiexec(), "-n", "3", sys.executable, "-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir),
           "--resume"]
    jobs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    try:
        outs = [job.communicate(timeout=180) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
    codes = sorted(job.returncode for job in jobs)
    refused = [err for job, (_, err) in zip(jobs, outs) if job.returncode != 0]
    assert codes[0] == 0 and codes[1] != 0, outs
    assert len(refused) == 1 and "is in use by ensemble.run on host" in refused[0], refused
    assert "run directory: " in refused[0] and "config error" not in refused[0]     # not the config's mistake
    assert refused[0].count("is in use by") == 1                                      # said once, not per rank
    ok = Counter(r["id"] for r in map(json.loads, journal.read_text().splitlines())
                 if r.get("status") == "ok")
    assert len(ok) == MEMBERS and set(ok.values()) == {1}, ok        # every member exactly once
    assert not (run_dir / "run.lock").exists()
    assert json.loads((run_dir / "ensemble.json").read_text())["members"]


def test_resume_without_run_dir_continues_the_killed_run_beside_a_finished_one(tmp_path):
    """Issue 32: `runs/demo` is finished, a second run of the config went to `runs/demo-2`
    and was killed with kill -9; the command `mpirun ... ensemble run CONFIG --resume`
    (no --run-dir) continues `runs/demo-2`, says so, and every member is trained once."""
    cfg = rehearsal_config(tmp_path / "demo.toml", 6, 0.3, f'name = "demo"\noutput_dir = "{tmp_path / "runs"}"\n')
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = [mpiexec(), "-n", "2", sys.executable, "-m", "ensemble.cli", "run", str(cfg)]
    first = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr
    journal = tmp_path / "runs" / "demo-2" / "journal.jsonl"

    def finished() -> int:
        return journal.read_text().count('"status": "ok"') if journal.exists() else 0
    kill_when(2, ["-m", "ensemble.cli", "run", str(cfg)], lambda: finished() >= 2, 120, "2 finished members")
    resumed = subprocess.run(run + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout + resumed.stderr and "demo-2" in resumed.stdout + resumed.stderr
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    ok = Counter(r["id"] for r in lines if r.get("status") == "ok")
    assert len(ok) == 6 and set(ok.values()) == {1}
    assert (tmp_path / "runs" / "demo-2" / "ensemble.json").is_file()
    assert not (tmp_path / "runs" / "demo-3").exists()
