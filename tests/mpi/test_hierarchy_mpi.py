"""A master hierarchy (``runtime.sub_masters``) under real mpiexec with rehearsal members (no
TensorFlow): at -n 9 with 2 sub-masters, each running its own share of the list with its
own journal, the run trains the flat run's members, each once, on the 6 worker ranks only,
and leaves one journal; killed with kill -9 (a sub-master, or the whole job) and resumed
(the killed job's sub-master journals absorbed first), it finishes every member with none
journalled twice and none of the finished handed out again. Whether sub-masters raise the
results per second is measured by scripts/bench_hierarchy.py, not asserted here."""

from __future__ import annotations

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

from ensemble.results.rundir import RunDirectory
from tests.conftest import ROOT, kill_when, mpiexec, run_mpi
from tests.mpi.test_resilience import find_rank_pid

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CONFIG = """
name = "hier"
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
sub_masters = {subs}
[rehearsal]
seconds = {seconds}
spread = 0.3
"""


def config(tmp_path: Path, subs: int, members: int = 40, seconds: float = 0.01) -> Path:
    path = tmp_path / f"c{subs}.toml"
    path.write_text(textwrap.dedent(CONFIG.format(subs=subs, members=members, seconds=seconds)))
    return path


def run(tmp_path: Path, name: str, subs: int, resume: bool = False, **kw) -> Path:
    run_dir = tmp_path / name
    proc = run_mpi(9, ["-m", "ensemble.run", str(config(tmp_path, subs, **kw)), "--run-dir", str(run_dir),
                       *(["--resume"] if resume else [])], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def journal(run_dir: Path) -> tuple[list[dict], list[dict]]:
    return RunDirectory(run_dir).read_journal(events=True)


def by_id(records: list[dict]) -> dict[str, tuple]:
    """What a member is, apart from where and when it trained: its spec's outcome."""
    return {r["id"]: (r["status"], r["arch"], r["seed"], r["epochs"], repr(r["val"])) for r in records}


def test_two_sub_masters_at_n9_train_the_flat_runs_members_once_each_on_the_workers(tmp_path):
    flat, hier = run(tmp_path, "flat", 0), run(tmp_path, "hier", 2)
    flat_records, _ = journal(flat)
    records, events = journal(hier)
    assert Counter(Counter(r["id"] for r in records).values()) == {1: 80}
    assert by_id(records) == by_id(flat_records)                     # the same members, the same outcomes
    opened = next(e for e in events if e["event"] == "open")
    assert (opened["sub_masters"], opened["shares"], opened["workers"]) == (2, [3, 3], 6)
    assert {r["rank"] for r in records} <= set(range(3, 9))          # ranks 1, 2 deal; they train nothing
    assert {r["worker"] for r in records} == set(range(6))           # every worker of both shares had work
    closed = next(e for e in events if e["event"] == "close")
    assert closed["results"] == 80
    assert [share["results"] for share in closed["shares"]] == [                  # each ran its own share
        sum(1 for r in records if (r["worker"] < 3) == (k == 0)) for k in range(2)]
    assert not (hier / "journals").exists()                           # absorbed: one journal, as a flat run's


def ok_ids(run_dir: Path) -> list[str]:
    return [r["id"] for r in RunDirectory(run_dir).read_journal() if r["status"] == "ok"]


def start_killed(tmp_path: Path, cfg: Path, run_dir: Path, at: int, sub_master: bool) -> None:
    """Start -n 9, kill -9 a sub-master (rank 1) or the whole job once ``at`` members are journalled."""
    args = ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)]
    if not sub_master:
        kill_when(9, args, lambda: len(ok_ids(run_dir)) >= at, what=f"{at} members journalled")
        return
    tag = uuid.uuid4().hex
    env = {**os.environ, "ENSEMBLE_TEST_TAG": tag, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([mpiexec(), "-n", "9", sys.executable, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 180
        while len(ok_ids(run_dir)) < at:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, f"{at} members were not journalled in time"
            time.sleep(0.02)
        os.kill(find_rank_pid(tag, 1), signal.SIGKILL)
        proc.communicate(timeout=60)                     # the whole job goes down, it does not hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
            pytest.fail("the job did not exit after its sub-master was killed")
    assert proc.returncode != 0


@pytest.mark.long          # make test-long: the -n 9 run above stays in make test
@pytest.mark.parametrize("sub_master", [True, False],
                         ids=["sub-master", "whole-job"])
def test_kill_9_mid_run_then_resume_trains_every_member_exactly_once(tmp_path, sub_master):
    members, total = 60, 120
    cfg = config(tmp_path, 2, members=members, seconds=0.1)
    run_dir = tmp_path / "run"
    start_killed(tmp_path, cfg, run_dir, 12, sub_master)
    before = ok_ids(run_dir)
    assert 12 <= len(before) < total, "the kill came too late to test resume"

    proc = run_mpi(9, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = re.search(r"resuming with (\d+) finished", proc.stdout)
    # the killed sub-masters' own journals are absorbed first: members they had journalled and
    # not yet forwarded count too (the top journal read right after the kill may lack them)
    assert said and int(said.group(1)) >= len(before), proc.stdout[-2000:]
    after = ok_ids(run_dir)
    assert len(after) == len(set(after)) == total                     # nothing lost, nothing journalled twice
    resumed = after[len(before):]
    assert not set(resumed) & set(before)                             # no finished member handed out again
    records, events = journal(run_dir)
    # the members in flight when the job was lost are crash suspects: the resume runs with one master,
    # which hands them out a few at a time (shares each on its own could not tell one trains alone)
    assert [e.get("sub_masters") for e in events if e["event"] == "open"] == [2, None]
    assert "this job runs with one master (`runtime.sub_masters` ignored for it)" in proc.stderr + proc.stdout


EVOLVE = """
name = "ev"
mode = "evolve"
seed = 3
[evolve]
strategy = "regularized"
evaluations = 30
population_size = 8
sample_size = 3
discard = "off"
[runtime]
trainer = "rehearsal"
sub_masters = 2
[rehearsal]
seconds = 0.02
spread = 0.3
"""


def test_a_search_with_two_sub_masters_forwards_its_results_and_evaluates_each_candidate_once(tmp_path):
    """A search breeds from every result, so its shares cannot run on their own: the top master
    deals every candidate and journals the results its sub-masters forward."""
    cfg = tmp_path / "ev.toml"
    cfg.write_text(textwrap.dedent(EVOLVE))
    run_dir = tmp_path / "ev"
    proc = run_mpi(9, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records, events = journal(run_dir)
    opened = next(e for e in events if e["event"] == "open")
    assert (opened["sub_masters"], opened["own_shares"]) == (2, False)
    assert Counter(Counter(r["id"] for r in records).values()) == {1: 30}
    assert {r["rank"] for r in records} <= set(range(3, 9))
    assert all("search" in r for r in records)                       # the top's source saw every result
