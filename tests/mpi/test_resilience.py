"""Nothing lost: member failures, kill -9 of a worker or the master then --resume, stop rules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from ensemble.results.journal import read_journal
from ensemble.results.records import TIME_LIMIT_KIND, Status
from tests.conftest import ROOT, mpiexec, run_mpi
from tests.mpi import faults

pytestmark = pytest.mark.mpi

CONFIG = """
name = "res"
seed = 11
[data]
source = "digits"
[train]
epochs = 12
patience = 3
batch_size = 32
[[architectures]]
name = "mlp"
members = 6
layers = [{type = "Dense", units = 32, activation = "relu"}]
[ensemble]
k = 3
method = "top_k"
[runtime]
max_failed_share = 0.9
"""


#: the runtime setting that trains with the fault-injecting test trainer (tests/mpi/faults.py)
FAULTY = '[runtime]\ntrainer = "tests.mpi.faults:trainer"\n'


def with_faults(text: str) -> str:
    """``text`` trained by the fault-injecting trainer (which fails the members ``faults.env`` names)."""
    text = textwrap.dedent(text)
    return text.replace("[runtime]\n", FAULTY) if "[runtime]\n" in text else text + FAULTY


def write_config(tmp_path: Path, text: str = CONFIG) -> Path:
    cfg = tmp_path / "res.toml"
    cfg.write_text(textwrap.dedent(text))
    return cfg


def ok_lines(run_dir: Path) -> list[dict]:
    return [r for r in read_journal(run_dir / "journal.jsonl") if r["status"] == Status.OK.value]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run every interrupted one must equal."""
    base = tmp_path_factory.mktemp("ref")
    run_dir = base / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(write_config(base)), "--run-dir", str(run_dir)])
    assert proc.returncode == 0, proc.stderr
    return run_dir


def find_rank_pid(tag: str, rank: int, timeout: float = 60) -> int:
    """The pid of MPI rank ``rank`` of the job started with ENSEMBLE_TEST_TAG=tag."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"ENSEMBLE_TEST_TAG={tag}".encode() in env and f"PMI_RANK={rank}".encode() in env:
                return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} of job {tag} not found")


def kill_mid_run(tmp_path: Path, rank: int, text: str = CONFIG, total: int = 6) -> Path:
    """Start a -n 3 run, kill -9 ``rank`` once two members have finished; return the run dir."""
    run_dir = tmp_path / "run"
    tag = uuid.uuid4().hex
    env = {**os.environ, "ENSEMBLE_TEST_TAG": tag, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([mpiexec(), "-n", "3", sys.executable, "-m", "ensemble.run",
                             str(write_config(tmp_path, text)), "--run-dir", str(run_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 240
        while len(ok_lines(run_dir)) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "no member finished in time"
            time.sleep(0.2)
        os.kill(find_rank_pid(tag, rank), signal.SIGKILL)
        proc.communicate(timeout=60)                 # the whole job must go down, not hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
            pytest.fail("the job did not exit after a rank was killed")
    assert proc.returncode != 0
    done = ok_lines(run_dir)
    assert 2 <= len(done) < total, "kill came too late to test resume"
    return run_dir


# make test-long, both (about 60 s with the reference run): killing the master and resuming, nothing lost or
# retrained, stays in make test as test_control_plane_mpi.py's group-commit test
@pytest.mark.long
@pytest.mark.parametrize("rank", [1, 0], ids=["worker", "master"])
def test_kill_then_resume_equals_uninterrupted(tmp_path, reference, rank):
    run_dir = kill_mid_run(tmp_path, rank)
    before = {r["id"]: (run_dir / r["path"]).stat().st_mtime_ns for r in ok_lines(run_dir)}
    proc = run_mpi(3, ["-m", "ensemble.run", str(write_config(tmp_path)), "--run-dir", str(run_dir), "--resume"])
    assert proc.returncode == 0, proc.stderr
    assert f"resuming with {len(before)} finished" in proc.stdout

    lines = ok_lines(run_dir)
    ids = [r["id"] for r in lines]
    assert len(ids) == len(set(ids)) == 6                        # no member finished twice
    for member_id, mtime in before.items():                       # and none was retrained
        assert (run_dir / "models" / f"{member_id}.keras").stat().st_mtime_ns == mtime

    ref = {r["id"]: r for r in ok_lines(reference)}
    for r in lines:
        assert r["val"] == pytest.approx(ref[r["id"]]["val"], rel=1e-6)
        assert r["test"] == pytest.approx(ref[r["id"]]["test"], rel=1e-6)
    ens = json.loads((run_dir / "ensemble.json").read_text())
    ref_ens = json.loads((reference / "ensemble.json").read_text())
    def chosen(summary):                 # a model file's digest is its own (a .keras zip holds its write time)
        return [{k: v for k, v in m.items() if k != "model_file"} for m in summary["members"]]
    assert chosen(ens) == chosen(ref_ens)
    assert all(m["model_file"]["bytes"] > 0 for m in ens["members"])
    assert ens["ensemble"]["test"] == pytest.approx(ref_ens["ensemble"]["test"], rel=1e-6)
    pd.testing.assert_frame_equal(pd.read_csv(run_dir / "leaderboard.csv")[["id", "val_accuracy"]],
                                  pd.read_csv(reference / "leaderboard.csv")[["id", "val_accuracy"]])


EVOLVE = """
mode = "evolve"
seed = 2
[data]
source = "digits"
[train]
epochs = 6
[evolve]
evaluations = 8
population_size = 4
sample_size = 2
[search]
max_depth = 2
units = [16, 64]
"""


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_evolve_kill_then_resume_finishes_the_budget_without_retraining(tmp_path):
    run_dir = kill_mid_run(tmp_path, 1, EVOLVE, total=8)
    before = {r["id"]: (run_dir / r["path"]).stat().st_mtime_ns for r in ok_lines(run_dir)}
    genomes = {r["id"]: r["genome"] for r in ok_lines(run_dir)}
    proc = run_mpi(3, ["-m", "ensemble.run", str(write_config(tmp_path, EVOLVE)), "--run-dir", str(run_dir),
                       "--resume"])
    assert proc.returncode == 0, proc.stderr
    journal = read_journal(run_dir / "journal.jsonl")
    finished = [r["id"] for r in journal if r["status"] == Status.OK.value]
    assert len(finished) == len(set(finished))                       # no member finished twice
    for member_id, mtime in before.items():                           # none retrained, same genome
        assert (run_dir / "models" / f"{member_id}.keras").stat().st_mtime_ns == mtime
        assert next(r for r in journal if r["id"] == member_id)["genome"] == genomes[member_id]
    keys = [json.dumps(r["genome"], sort_keys=True) for r in journal if r["status"] == Status.OK.value]
    assert len(keys) == len(set(keys))                                # no genome trained twice
    search = pd.read_csv(run_dir / "search.csv")
    assert len(search) == len(journal) == 8                           # the budget; in-flight ones re-issued
    assert sorted(r["search"]["evaluation"] for r in journal) == list(range(1, 9))
    assert json.loads((run_dir / "ensemble.json").read_text())["members"]


def test_member_failures_are_journaled_and_the_run_goes_on(tmp_path):
    cfg = write_config(tmp_path, with_faults(CONFIG.replace("members = 6", "members = 4") + textwrap.dedent("""
        [[architectures]]
        name = "slow"
        members = 1
        member_time_limit = 0.001
        layers = [{type = "Dense", units = 8}]
    """)))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)],
                   env=faults.env(**{"mlp-001": "raise", "mlp-002": "nan"}))
    assert proc.returncode == 0, proc.stderr
    journal = {r["id"]: r for r in read_journal(run_dir / "journal.jsonl")}
    assert len(journal) == 5
    kinds = {i: r["error"]["kind"] for i, r in journal.items() if r["status"] != Status.OK.value}
    assert kinds == {"mlp-001": "RuntimeError", "mlp-002": "nan_loss", "slow-000": TIME_LIMIT_KIND}
    statuses = {i: r["status"] for i, r in journal.items() if i in kinds}      # the time limit is no failure
    assert statuses == {"mlp-001": Status.FAILED.value, "mlp-002": Status.FAILED.value,
                        "slow-000": Status.LIMIT.value}
    for member_id in kinds:
        err = journal[member_id]
        assert err["error"]["message"] and "Traceback" in err["error"]["traceback"]
        assert err["rank"] in (1, 2) and err["host"]
    board = pd.read_csv(run_dir / "leaderboard.csv")
    assert list(board["status"])[:2] == [Status.OK.value] * 2
    assert sorted(board["status"][2:]) == sorted([Status.FAILED.value, Status.FAILED.value, Status.LIMIT.value])
    ens = json.loads((run_dir / "ensemble.json").read_text())
    assert {m["id"] for m in ens["members"]} == {"mlp-000", "mlp-003"} and ens["n_failed"] == 3


def test_a_member_that_kills_its_worker_is_given_up_at_its_second_crash(tmp_path):
    """mlp-001 ends its worker process (os._exit, as an out-of-memory kill or a segfault would):
    every job it trains in is lost. It was handed out again by every --resume, for ever; now each
    resumed job hands out at most half the suspects at a time (halving again after each lost job),
    until it is in flight alone among them and, lost again, the next job gives it up and finishes the
    run with every other member trained once."""
    cfg = write_config(tmp_path, with_faults(CONFIG.replace("members = 6", "members = 4")
                                             .replace("epochs = 12", "epochs = 3")))
    run_dir = tmp_path / "run"
    args = ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)]
    fault = faults.env(**{"mlp-001": "exit"})
    assert run_mpi(3, args, env=fault).returncode != 0
    second = run_mpi(3, [*args, "--resume"], env=fault)
    assert second.returncode != 0 and "they go out at most" in second.stderr
    for _ in range(3):                          # suspects halved each lost job: log2 of the first ones' count
        last = run_mpi(3, [*args, "--resume"], env=fault)
        if last.returncode == 0:
            break
    assert last.returncode == 0, last.stderr
    assert "mlp-001 given up: the job was lost twice while mlp-001 trained" in last.stderr
    records = [r for r in read_journal(run_dir / "journal.jsonl") if "id" in r]
    assert sorted(r["id"] for r in records if r["status"] == Status.OK.value) == ["mlp-000", "mlp-002", "mlp-003"]
    assert [r["error"]["kind"] for r in records if r["id"] == "mlp-001"] == ["worker_died"]
    ens = json.loads((run_dir / "ensemble.json").read_text())
    assert "mlp-001" not in {m["id"] for m in ens["members"]}


#: a small search of the fault tests (``top``: top-level keys before the tables)
SEARCH = """
mode = "evolve"
{top}
[data]
source = "digits"
[train]
epochs = 2
[evolve]
evaluations = {evaluations}
population_size = 3
sample_size = 2
[search]
max_depth = 2
units = [8, 16]
"""


@pytest.mark.long          # make test-long: an ensemble's failed members above take the same path
def test_evolve_run_survives_failed_candidates(tmp_path):
    cfg = write_config(tmp_path, with_faults(SEARCH.format(top="", evaluations=6)))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)],
                   env=faults.env(e0002="raise", e0004="nan"))
    assert proc.returncode == 0, proc.stderr
    journal = {r["id"]: r for r in read_journal(run_dir / "journal.jsonl")}
    failed = {i for i, r in journal.items() if r["status"] == Status.FAILED.value}
    assert len(journal) == 6 and failed == {"e0002", "e0004"}
    assert journal["e0002"]["error"]["kind"] == "RuntimeError" and journal["e0004"]["error"]["kind"] == "nan_loss"
    search = pd.read_csv(run_dir / "search.csv")
    assert sorted(search.loc[search["status"] == Status.FAILED.value, "id"]) == ["e0002", "e0004"]
    ens = json.loads((run_dir / "ensemble.json").read_text())
    assert not {m["id"] for m in ens["members"]} & {"e0002", "e0004"}


@pytest.mark.long          # make test-long: four jobs of a search
def test_a_search_candidate_that_kills_its_worker_is_given_up_and_the_search_finishes(tmp_path):
    """A search's candidate e0002 ends its worker process in every job (os._exit: an
    out-of-memory kill, a segfault). A search hands its candidates out again in order (no
    quarantine), so the resumed jobs are lost too, until e0002 (and whoever was in flight with
    it each time) is given up at its third lost job; the next --resume finishes the budget with
    every other candidate trained once, and the strategy was told the failure."""
    cfg = write_config(tmp_path, with_faults(SEARCH.format(top="seed = 5", evaluations=7)))
    run_dir = tmp_path / "run"
    args = ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)]
    fault = faults.env(e0002="exit")
    lost = [run_mpi(3, args, env=fault).returncode]
    while lost[-1] != 0 and len(lost) < 5:
        lost.append(run_mpi(3, [*args, "--resume"], env=fault).returncode)
    assert lost[-1] == 0 and len(lost) <= 4, lost            # three lost jobs at most, then the end
    records = [r for r in read_journal(run_dir / "journal.jsonl") if "id" in r]
    given_up = [r for r in records if r["status"] == Status.FAILED.value]
    assert "e0002" in {r["id"] for r in given_up}
    assert {r["error"]["kind"] for r in given_up} == {"worker_died"}
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == 7                   # every candidate once: none retrained
    search = pd.read_csv(run_dir / "search.csv")
    assert len(search) == 7 and set(search.loc[search["status"] == Status.FAILED.value, "id"]) == \
        {r["id"] for r in given_up}
    ens = json.loads((run_dir / "ensemble.json").read_text())
    assert not {m["id"] for m in ens["members"]} & {r["id"] for r in given_up}


def test_a_full_disk_stops_the_run_at_the_first_member_it_fails(tmp_path):
    """A member whose model could not be written for want of space failed with kind OSError, and
    every member after it too (6 of 8 trainings wasted), then the run said it was complete. A full
    disk fails every member alike: the run stops handing them out at the first, with one line."""
    cfg = write_config(tmp_path, with_faults(CONFIG))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)],
                   env=faults.env(**{"mlp-001": "full"}))
    assert proc.returncode == 4, proc.stderr
    records = read_journal(run_dir / "journal.jsonl")
    full = [r for r in records if (r.get("error") or {}).get("kind") == "storage_full"]
    assert [r["id"] for r in full] == ["mlp-001"] and "no space left on the device writing 'models/mlp-001.keras'" \
        in full[0]["error"]["message"]
    assert "stopping: every member would fail the same way. Free space" in proc.stderr
    assert len(records) < 6 and not os.path.exists(run_dir / ".space_reserve")      # the reserve given back


def test_too_many_failures_stop_the_run_with_a_summary(tmp_path):
    cfg = write_config(tmp_path, with_faults(CONFIG.replace("max_failed_share = 0.9", "max_failed_share = 0.5")))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)],
                   env=faults.env(**{f"mlp-{i:03d}": "raise" for i in range(6)}))
    assert proc.returncode == 4
    assert "max_failed_share" in proc.stderr and "ended without a result:" in proc.stderr
    assert len(read_journal(run_dir / "journal.jsonl")) < 6          # it stopped handing out work


def test_too_many_failures_with_every_member_tried_end_the_run_as_done(tmp_path):
    """3 of 4 members fail (more than the share) but none was left to hand out: the run is
    complete (status done, the ensemble of the one that trained, exit 4 for the failures), not a
    stop that asks for --resume (which only trained the same failures again, for ever)."""
    cfg = write_config(tmp_path, with_faults(CONFIG.replace("max_failed_share = 0.9", "max_failed_share = 0.5")
                                             .replace("members = 6", "members = 4").replace("k = 3", "k = 1")))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)],
                   env=faults.env(**{f"mlp-{i:03d}": "raise" for i in range(1, 4)}))
    assert proc.returncode == 4, proc.stderr
    assert "every member was tried" in proc.stderr and "stopped early" not in proc.stderr
    assert "its ensemble made of the 1 that finished" in proc.stderr          # final counts, not the moment's
    assert "ended without a result: 3 of 4 members (RuntimeError)" in proc.stderr
    assert json.loads((run_dir / "status.json").read_text())["state"] == "done"
    assert [m["id"] for m in json.loads((run_dir / "ensemble.json").read_text())["members"]] == ["mlp-000"]
    # every member fails: no promise of "an ensemble made of the others", one error with the counts
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(tmp_path / "all")],
                   env=faults.env(**{f"mlp-{i:03d}": "raise" for i in range(4)}))
    assert proc.returncode == 4, proc.stderr
    assert "ensemble made of" not in proc.stderr and "error: no member finished (0 finished, 4 failed)" in proc.stderr
    status = json.loads((tmp_path / "all" / "status.json").read_text())
    assert status["state"] == "failed" and "no member finished" in status["error"]
    assert "<b class='state'>failed</b>: no member finished" in (tmp_path / "all" / "report.html").read_text()


def test_run_time_limit_stops_handing_out_work_and_still_writes_results(tmp_path):
    # 120 members of 1 s cannot all end in 10 s on 2 workers (fewer than 20 do): the limit, not the list,
    # ends the run (rehearsal members: the stop rule is the master's, the same for trained members)
    text = CONFIG.replace("members = 6", "members = 120").replace(
        "[runtime]\n", "[runtime]\ntime_limit = 10\nfinish_reserve = 2\ntrainer = \"rehearsal\"\n")
    text += "[rehearsal]\nseconds = 1.0\n"
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(write_config(tmp_path, text)), "--run-dir", str(run_dir)])
    assert proc.returncode == 0, proc.stderr
    assert "time limit is near" in proc.stderr
    assert 0 < len(read_journal(run_dir / "journal.jsonl")) < 120
    assert (run_dir / "ensemble.json").exists() and (run_dir / "leaderboard.csv").exists()


def test_a_time_limit_near_once_every_member_is_out_ends_the_run_as_done(tmp_path):
    """Every member handed out at once and finished inside the limit: the time limit neared as they
    ended, and the run said "stopped early", status "stopped", asking for a --resume with nothing left."""
    text = CONFIG.replace("members = 6", "members = 2").replace("k = 3", "k = 1").replace(
        "[runtime]\n", "[runtime]\ntime_limit = 12\nfinish_reserve = 6\ntrainer = \"rehearsal\"\n")
    text += "[rehearsal]\nseconds = 3.0\n"
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(write_config(tmp_path, text)), "--run-dir", str(run_dir)])
    assert proc.returncode == 0, proc.stderr
    assert "stopped early" not in proc.stderr and len(read_journal(run_dir / "journal.jsonl")) == 2
    assert json.loads((run_dir / "status.json").read_text())["state"] == "done"


def test_specs_held_ahead_never_start_after_the_runs_deadline(tmp_path):
    """specs_in_hand = 6: the master stopped handing out at its deadline, but each worker still started
    the six it held, one after another, up to 7 s past it (a 20 s run took 28 s)."""
    text = CONFIG.replace("members = 6", "members = 60").replace(
        "[runtime]\n", "[runtime]\ntime_limit = 9\nfinish_reserve = 3\nspecs_in_hand = 6\n"
                        "trainer = \"rehearsal\"\n")
    text += "[rehearsal]\nseconds = 1.0\nspread = 0.0\n"
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(write_config(tmp_path, text)), "--run-dir", str(run_dir)])
    assert proc.returncode == 0, proc.stderr
    deadline = json.loads((run_dir / "status.json").read_text())["deadline"]
    records = read_journal(run_dir / "journal.jsonl")
    assert 0 < len(records) < 60 and all(r["status"] == "ok" for r in records)
    assert max(r["started"] for r in records) <= deadline                  # none began past the deadline
    assert max(r["ended"] for r in records) <= deadline + 0.5               # nor ran far past it


def test_a_job_that_ends_before_its_finish_reserve_says_so(tmp_path):
    """A job's end 20 s away with the default 30 s finish_reserve: "no member finished (0 finished, 0 failed);
    see journal.jsonl for each failure", state failed, though nothing failed."""
    import time
    text = CONFIG.replace("[runtime]\n", "[runtime]\ntrainer = \"rehearsal\"\n") + "[rehearsal]\nseconds = 1.0\n"
    run_dir = tmp_path / "run"
    proc = run_mpi(2, ["-m", "ensemble.run", str(write_config(tmp_path, text)), "--run-dir", str(run_dir)],
                   env={"ENSEMBLE_JOB_END_TIME": str(int(time.time()) + 20)})
    assert proc.returncode == 1 and "no member finished" not in proc.stderr
    assert "no member was started: the deadline, the job's time limit less `runtime.finish_reserve` (30 s)" \
        in proc.stderr and "--resume" in proc.stderr
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"


STUCK = """
name = "stuck"
seed = 3
[data]
source = "iris"
[train]
epochs = 2
member_time_limit = 2
[[architectures]]
name = "mlp"
members = 2
layers = [{type = "Dense", units = 8, activation = "relu"}]
[[architectures]]
name = "stuck"
members = 1
model = "tests.mpi.user_models:BUILDER"
"""


@pytest.mark.long          # make test-long: three jobs stuck for a minute each, one that ends (about 220 s)
def test_a_member_whose_builder_never_returns_ends_the_job_and_is_given_up_on_resume(tmp_path):
    """A builder that never returns held its worker, and the job, for ever (member_time_limit
    stops training only at a batch's end). The rank ends itself past twice the limit and as much
    again (a minute at least: the limit counts training only); resumes hand the member out again
    among the suspects and give it up when it is stuck again; the run ends with the others. On
    rank 0's check before any member trains, the job ends at once, naming the builder."""
    cfg = write_config(tmp_path, STUCK.replace("BUILDER", "stuck_on_workers"))
    run_dir = tmp_path / "run"
    args = ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)]
    first = run_mpi(2, args, timeout=120)
    assert first.returncode != 0 and "stuck-000 is still running 64 s after it started" in first.stderr, first.stderr
    assert "every thread's stack" in first.stderr
    for _ in range(3):
        last = run_mpi(2, [*args, "--resume"], timeout=120)
        if last.returncode == 0:
            break
    assert last.returncode == 0, last.stderr
    assert "stuck-000 given up" in last.stderr
    records = [r for r in read_journal(run_dir / "journal.jsonl") if "id" in r]
    assert sorted(r["id"] for r in records if r["status"] == Status.OK.value) == ["mlp-000", "mlp-001"]
    everywhere = write_config(tmp_path, STUCK.replace("BUILDER", "stuck_everywhere"))
    early = run_mpi(2, ["-m", "ensemble.run", str(everywhere), "--run-dir", str(tmp_path / "early")], timeout=120)
    assert early.returncode != 0 and "its builder 'tests.mpi.user_models:stuck_everywhere' did not return within 64 s" \
        in early.stderr, early.stderr
