"""``ensemble.status`` on a run that is still going: a rehearsal run (members sleep, no
TensorFlow) under mpiexec -n 3 in the background, polled with ``--json`` from another
process, as a login node would; then the same command once the run has ended, and
after Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ensemble.results.journal import read_journal
from tests.conftest import ROOT, mpiexec

pytestmark = pytest.mark.mpi

CONFIG = """
name = "watched"
seed = 2
[data]
source = "digits"
[[architectures]]
name = "m"
members = 12
layers = [{type = "Dense", units = 8}]
[runtime]
trainer = "rehearsal"
progress_seconds = 0.3
heartbeat_seconds = 0.3
[rehearsal]
seconds = 1.2
"""


def status(run_dir) -> dict:
    proc = subprocess.run([sys.executable, "-m", "ensemble.status", str(run_dir), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def start(tmp_path, members: int = 12) -> tuple[subprocess.Popen, object]:
    """The rehearsal run under ``mpiexec -n 3`` in the background: (process, run directory)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent(CONFIG).replace("members = 12", f"members = {members}"))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen([mpiexec(), "-n", "3", sys.executable, "-m", "ensemble.run", str(cfg), "--run-dir",
                            str(run_dir)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    return job, run_dir


def test_status_of_a_running_run_has_consistent_counts(tmp_path):
    job, run_dir = start(tmp_path)
    seen_midway = None
    try:
        deadline = time.time() + 90
        while job.poll() is None and time.time() < deadline:
            if (run_dir / "status.json").is_file():
                s = status(run_dir)
                assert s["total"] == 12 and s["workers"] == 2
                if s["state"] == "running":
                    assert s["running"] <= 2 and s["done"] + s["running"] + s["queued"] == 12
                    assert s["ends_by"] == "evaluations" and s["done"] == s["counts"]["ended"]
                    assert s["finished"] <= len(read_journal(run_dir / "journal.jsonl"))   # the journal may be ahead
                    if 0 < s["finished"] < 12 and s["running"] > 0:
                        seen_midway = s
            time.sleep(0.3)
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, out + err
    assert seen_midway is not None, "never saw the run midway"
    assert seen_midway["eta_seconds"] is not None and seen_midway["best"] is not None
    final = status(run_dir)
    assert final["state"] == "done" and final["finished"] == 12 and final["ensemble"]["members"] >= 1
    assert final["counts"] == json.loads((run_dir / "ensemble.json").read_text())["counts"]
    text = subprocess.run([sys.executable, "-m", "ensemble.status", str(run_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60).stdout
    assert "done" in text and "12 finished, 0 failed of 12" in text and "best member: " in text   # not "so far"


def test_status_after_ctrl_c_says_stopped_and_how_to_resume(tmp_path):
    job, run_dir = start(tmp_path, members=8)
    try:
        deadline = time.time() + 60
        while not read_journal(run_dir / "journal.jsonl"):           # a member has finished
            assert job.poll() is None and time.time() < deadline, job.communicate()
            time.sleep(0.2)
        job.send_signal(signal.SIGINT)                              # what Ctrl-C does to mpiexec
        out, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 130, out + err
    s = status(run_dir)
    assert s["state"] == "stopped" and s["reason"] == "interrupted by Ctrl-C or a signal"
    assert 0 < s["finished"] < 8 and s["running"] == 0 and s["queued"] is None and s["left"] == 8 - s["done"]
    text = subprocess.run([sys.executable, "-m", "ensemble.status", str(run_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60).stdout
    assert f"{8 - s['done']} of 8 members not trained yet; --resume trains them" in text
    assert "run: stopped early after" in text and ("interrupted by Ctrl-C or a signal; the same command with "
                                                    f"`--run-dir {run_dir} --resume` continues it") in text, text
