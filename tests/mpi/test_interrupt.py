"""Ctrl-C on a real run: mpiexec forwards SIGINT to every rank; rank 0 prints one line (no
traceback per rank), every rank exits, the job's status is 130, and `--resume` continues.
SIGTERM (a scheduler's time limit) ends the same way, with status 143; and while a job
holds the run directory, a second job on it refuses at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import ROOT, importable, mpiexec, run_mpi

pytestmark = pytest.mark.mpi


def worker_ranks(run_dir) -> list[int]:
    """The pids of the job's ranks other than 0 (the MPI environment says which rank a
    process is): pausing them holds the run where it is, while rank 0 keeps the run directory."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"ensemble.run" in cmd and str(run_dir).encode() in cmd and b"PMI_RANK=0" not in env \
                and any(e.startswith(b"PMI_RANK=") for e in env):
            pids.append(int(entry))
    return pids


@pytest.mark.parametrize("sig, code", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.long),   # the same path
                                       (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_prints_one_line_and_resume_continues(tmp_path, sig, code):
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent("""
        [data]
        source = "iris"
        [[architectures]]
        members = 16
        layers = [{type = "Dense", units = 4}]
        [runtime]
        trainer = "rehearsal"        # members sleep: no TensorFlow, seconds per member known
        journal_sync_seconds = 0
        [rehearsal]
        seconds = 1.5
    """))
    run_dir = tmp_path / "run"
    journal = run_dir / "journal.jsonl"
    env = importable(OMP_NUM_THREADS="1")
    proc = subprocess.Popen([mpiexec(), "-n", "3", sys.executable, "-m", "ensemble.run", str(cfg),
                             "--run-dir", str(run_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (journal.exists() and '"status"' in journal.read_text()):   # a member has finished
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        if sig == signal.SIGTERM:                        # a second job meanwhile: refused, nothing touched
            workers = worker_ranks(run_dir)              # paused meanwhile, so the run cannot end first on a
            assert len(workers) == 2, workers            # busy machine (the second job takes seconds to start)
            for pid in workers:
                os.kill(pid, signal.SIGSTOP)
            try:
                second = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"],
                                 timeout=120)
            finally:
                for pid in workers:
                    os.kill(pid, signal.SIGCONT)
            assert second.returncode != 0 and "is in use by ensemble.run on host" in second.stderr, second.stderr
        proc.send_signal(sig)                            # Ctrl-C in a terminal, or the scheduler's SIGTERM
        out, err = proc.communicate(timeout=60)          # every rank exits (a hang fails here)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "fatal error" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("interrupted")]
    assert lines == [f"interrupted; `--resume` continues: the same command with `--run-dir {run_dir} --resume` "
                     "(finished members are kept)"], err
    done = {r["id"] for r in map(json.loads, journal.read_text().splitlines()) if r.get("status") == "ok"}
    assert 0 < len(done) < 16
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "stopped", status
    assert not (run_dir / "run.lock").exists()           # the job let go of the run directory
    events = [r["event"] for r in map(json.loads, journal.read_text().splitlines()) if "event" in r]
    assert "interrupted" in events and "handed" in events    # a stop, not a crash: no suspects on resume

    again = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=120)
    assert again.returncode == 0, again.stderr
    records = [r for r in map(json.loads, journal.read_text().splitlines()) if r.get("status") == "ok"]
    assert len(records) == 16 and len({r["id"] for r in records}) == 16          # none trained twice
    assert f"resuming with {len(done)} finished" in again.stdout
    assert "were training when an earlier job was lost" not in again.stdout + again.stderr       # no crash


def test_ranks_leaving_at_different_times_still_end_the_job_with_143(tmp_path):
    """The launcher stops the ranks still running once the first has left; hydra then records a
    rank it stopped as killed (status 9) unless every rank has let go of its output first. Here
    the workers leave 0.3 s apart, as a loaded machine makes them (the flake this once was)."""
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        import ensemble.runtime.mpi as m
        rank = m.world.Get_rank()
        m.abort_on_exception(lambda: "interrupted")
        if rank:
            m.INTERRUPT_GRACE = 0.5 + 0.3 * rank
        m.world.Barrier()
        if rank == 0:
            print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """))
    env = importable()
    proc = subprocess.Popen([mpiexec(), "-n", "4", sys.executable, str(script)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (out, err)
    assert err.splitlines().count("interrupted") == 1, err


def test_a_second_sigterm_while_leaving_cuts_nothing_and_the_job_ends_with_143(tmp_path):
    """A scheduler signals every process of the job, and mpiexec forwards its own SIGTERM too,
    so a rank may get a second SIGTERM while it closes its files or waits out its grace: it
    must not raise again there (a traceback from the exit hook, status 1, then 9)."""
    script = tmp_path / "twice.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        import ensemble.runtime.mpi as m
        m.abort_on_exception(lambda: "interrupted")
        m.INTERRUPT_GRACE = 1.0
        m.world.Barrier()
        if m.world.Get_rank() == 0:
            print("ready", flush=True)
        try:
            while True:
                time.sleep(0.05)
        finally:
            time.sleep(0.5)                 # closing the journal: the second signal lands here or in the grace
    """))
    proc = subprocess.Popen([mpiexec(), "-n", "3", sys.executable, str(script)], cwd=ROOT, env=importable(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks: list[int] = []
    try:
        assert proc.stdout.readline().strip() == "ready", proc.communicate()
        ranks = [int(e) for e in os.listdir("/proc") if e.isdigit() and _cmdline_has(int(e), str(script))
                 and int(e) != proc.pid]
        proc.send_signal(signal.SIGTERM)                 # mpiexec forwards it to every rank
        for delay in (0.2, 0.6):                         # then the scheduler's own, in the cleanup and the grace
            time.sleep(delay)
            for pid in ranks:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in ranks:                                # a failed run leaves no rank behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert "Error in sys.excepthook" not in err and "Traceback" not in err, err
    assert proc.returncode == 143, (out, err)


def _cmdline_has(pid: int, text: str) -> bool:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return False
    return text.encode() in cmd and b"mpiexec" not in cmd[0] and not cmd[0].endswith(b"hydra_pmi_proxy")


def test_a_full_disk_ends_the_job_with_one_line_naming_the_file_and_the_way_on(tmp_path):
    """No space left on the device (a write fails, then the close after it: a chain of OSErrors):
    one line naming the file and saying to free space and --resume, not five chained tracebacks."""
    script = tmp_path / "full.py"
    script.write_text(textwrap.dedent("""
        import errno
        import ensemble.runtime.mpi as m
        m.abort_on_exception(lambda: "interrupted")
        m.world.Barrier()
        if m.world.Get_rank() == 0:
            try:
                raise OSError(errno.ENOSPC, "No space left on device", "run/journal.jsonl")
            except OSError:
                raise OSError(errno.ENOSPC, "No space left on device")
        m.world.Barrier()
    """))
    proc = run_mpi(2, [str(script)], timeout=60)
    assert proc.returncode != 0
    assert ("fatal error, aborting the job:\nno space left on the device writing 'run/journal.jsonl' (No space "
            "left on device); free space") in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
