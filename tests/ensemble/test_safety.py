"""Nothing lost, nothing run, nothing outside the run (issue 29), without MPI: the run
directory's lock, names that become paths, files a record names, a journal with damaged
bytes, ``--overwrite`` of a folder that is not a run."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from ensemble.config import ConfigError, resolve_config
from ensemble.orchestrate.prepare import choose_run_dir, is_run_directory
from ensemble.results.journal import read_history, read_lines
from ensemble.results.lock import LOCK_NAME, RunLock, RunLocked
from ensemble.results.rundir import RunDirectory, member_file_name

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
ARCH = {"layers": [{"type": "Dense", "units": 2}]}


# -- the run directory's lock -----------------------------------------------------------------
def test_a_second_holder_is_refused_and_named(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunLocked) as info:
            RunLock(tmp_path).acquire()
        text = str(info.value)
        assert socket.gethostname() in text and f"PID {os.getpid()}" in text and "in use by" in text
    assert not (tmp_path / LOCK_NAME).exists()                      # released by its owner
    with RunLock(tmp_path):                                         # and free again
        pass


def test_a_lock_whose_process_is_gone_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    pid = int(dead.stdout)                                          # a PID that has exited
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "time": time.time()}))
    lock = RunLock(tmp_path)
    lock.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_another_hosts_lock_holds_until_it_is_stale(tmp_path):
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps({"host": "elsewhere-node-7", "pid": 1, "job": "4242", "time": time.time()}))
    with pytest.raises(RunLocked, match="elsewhere-node-7.*job 4242"):
        RunLock(tmp_path, stale_seconds=60).acquire()
    old = time.time() - 120                                         # its refreshes stopped 2 min ago
    os.utime(path, (old, old))
    lock = RunLock(tmp_path, stale_seconds=60)
    lock.acquire()
    assert lock.owned()
    lock.release()


def test_the_owner_refreshes_and_releases_only_its_own_lock(tmp_path):
    lock = RunLock(tmp_path, refresh_seconds=0.05)
    lock.acquire()
    path = tmp_path / LOCK_NAME
    old = time.time() - 1000
    os.utime(path, (old, old))
    for _ in range(100):                                            # the refresh thread touches it
        if path.stat().st_mtime > old + 500:
            break
        time.sleep(0.02)
    assert path.stat().st_mtime > old + 500
    path.unlink()                                                   # removed by hand, taken by another
    other = RunLock(tmp_path)
    other.acquire()
    lock.release()                                                  # not this one's any more: kept
    assert other.owned()
    other.release()


# -- names that become paths --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["..", ".", "../../escaped", "a/b", "a\\b", " x", ""])
def test_names_that_would_leave_the_run_are_config_errors(name):
    with pytest.raises(ConfigError, match="`name` must be a plain name"):
        resolve_config({"name": name, "architectures": [ARCH]})
    with pytest.raises(ConfigError, match=r"`architectures\[0\].name` must be a plain name"):
        resolve_config({"architectures": [{**ARCH, "name": name}]})


def test_member_ids_from_a_journal_never_name_a_path_outside(tmp_path):
    rd = RunDirectory(tmp_path)
    assert rd.model_path("mlp-000") == tmp_path / "models" / "mlp-000.keras"
    for bad in ("../../x", "/etc/passwd", "..", "a/b"):
        with pytest.raises(ValueError, match="not a plain name"):
            rd.model_path(bad)
        with pytest.raises(ValueError, match="not a plain name"):
            rd.state_path(bad, 1)


def test_files_a_record_names_must_lie_inside_the_run(tmp_path):
    rd = RunDirectory(tmp_path)
    assert rd.inside("models/a.keras") == (tmp_path / "models" / "a.keras").resolve()
    for bad in ("/etc/passwd", "../other/models/a.keras", "models/../../x.keras"):
        with pytest.raises(ValueError, match="outside the run directory"):
            rd.inside(bad)
    assert member_file_name("arch0-003") == "arch0-003"


# -- --overwrite and new runs ------------------------------------------------------------------
def args(run_dir=None, resume=False, overwrite=False):
    return argparse.Namespace(run_dir=run_dir and str(run_dir), resume=resume, overwrite=overwrite)


def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path):
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("years of work")
    cfg = resolve_config({"architectures": [ARCH]})
    with pytest.raises(ConfigError, match="--overwrite: .* not a run directory"):
        choose_run_dir(cfg, args(precious, overwrite=True))
    assert (precious / "chapter1.tex").read_text() == "years of work"
    assert not is_run_directory(precious)


def test_overwrite_replaces_a_run_and_keeps_its_lock(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.toml", "journal.jsonl"):
        (run / name).write_text("x\n")
    (run / "models").mkdir()
    (run / "models" / "a.keras").write_text("x")
    assert is_run_directory(run)
    path, lock = choose_run_dir(resolve_config({"architectures": [ARCH]}), args(run, overwrite=True))
    try:
        assert path == run and sorted(p.name for p in run.iterdir()) == [LOCK_NAME]
    finally:
        lock.release()


def test_overwrite_refuses_the_run_a_search_starts_from(tmp_path):
    """evolve.start_from = "runs/ev" with the same name and --overwrite: the earlier search (its models,
    journal and ensemble) was deleted, then the start failed with a traceback."""
    run = tmp_path / "runs" / "ev"
    run.mkdir(parents=True)
    for name in ("config.toml", "journal.jsonl"):
        (run / name).write_text("x\n")
    cfg = resolve_config({"name": "ev", "output_dir": str(tmp_path / "runs"), "mode": "evolve",
                          "evolve": {"start_from": str(run)}})
    with pytest.raises(ConfigError, match="--overwrite would delete .*ev', the run `evolve.start_from` starts from"):
        choose_run_dir(cfg, args(overwrite=True))
    assert sorted(p.name for p in run.iterdir()) == ["config.toml", "journal.jsonl"]


def test_a_run_held_by_another_job_is_refused_before_anything_is_touched(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("x\n")
    (run / "journal.jsonl").write_text("{}\n")
    cfg = resolve_config({"architectures": [ARCH]})
    with RunLock(run, what="another job"):
        for a in (args(run, resume=True), args(run, overwrite=True)):
            with pytest.raises(ConfigError, match="in use by another job"):
                choose_run_dir(cfg, a)
    assert (run / "journal.jsonl").read_text() == "{}\n"


def test_two_new_jobs_of_one_config_take_a_folder_each(tmp_path):
    """Two jobs of one config started together (a job array): the second found runs/<name> locked by
    the first's start-up (no journal yet) and was refused instead of taking runs/<name>-2."""
    cfg = resolve_config({"name": "arr", "output_dir": str(tmp_path / "runs"), "architectures": [ARCH]})
    first, held = choose_run_dir(cfg, args())
    second, also = choose_run_dir(cfg, args())
    try:
        assert (first.name, second.name) == ("arr", "arr-2")
    finally:
        held.release()
        also.release()
    (tmp_path / "mine").mkdir()
    with RunLock(tmp_path / "mine", what="another job"):               # --run-dir names one: still refused
        with pytest.raises(ConfigError, match="in use by another job"):
            choose_run_dir(cfg, args(tmp_path / "mine"))


# -- a journal with damaged bytes -----------------------------------------------------------------
def test_a_journal_with_invalid_bytes_skips_those_lines_and_warns_once(tmp_path, caplog):
    path = tmp_path / "journal.jsonl"
    good = [{"id": "a", "status": "ok"}, {"id": "b", "status": "failed"}]
    path.write_bytes(json.dumps(good[0]).encode() + b"\n" + b'{"id": "\xff\xfe", "status": "ok"}\n'
                     + b"[1, 2]\n" + json.dumps(good[1]).encode() + b"\n" + b'{"id": "c", "sta')
    with caplog.at_level("WARNING"):
        lines = read_lines(path)
    assert lines == good                                 # the torn tail is not a damaged line
    assert sum("2 damaged line(s) skipped" in r.message for r in caplog.records) == 1
    assert [r.id for r in read_history(path)] == ["a", "b"]


@pytest.mark.slow                       # five processes: make test runs it
def test_of_many_jobs_breaking_one_stale_lock_at_once_exactly_one_holds_it(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout),
                                                  "time": time.time()}))
    stop = tmp_path / "stop"
    code = ("import sys, time, pathlib\n"
            "from ensemble.results.lock import RunLock, RunLocked\n"
            f"lock = RunLock({str(tmp_path)!r})\n"
            "time.sleep(max(0.0, float(sys.argv[1]) - time.time()))\n"   # all try together
            "out = pathlib.Path(sys.argv[2])\n"
            "try:\n    lock.acquire()\nexcept RunLocked:\n    out.write_text('refused'); sys.exit(0)\n"
            "out.write_text('holds')\n"
            f"while not pathlib.Path({str(stop)!r}).exists():\n    time.sleep(0.05)\n"   # held until all said
            "lock.release()\n")
    start = time.time() + 3
    outs = [tmp_path / f"out{i}" for i in range(5)]
    procs = [subprocess.Popen([sys.executable, "-c", code, str(start), str(out)],
                              env={**os.environ, "PYTHONPATH": str(REPO)}) for out in outs]
    try:
        deadline = time.time() + 120
        while not all(o.exists() for o in outs) and time.time() < deadline:
            time.sleep(0.05)
    finally:
        stop.write_text("")
        for p in procs:
            p.wait(timeout=60)
    said = sorted(o.read_text() for o in outs if o.exists())
    assert said == ["holds"] + ["refused"] * 4, said


# -- model files are verified ---------------------------------------------------------------------
def test_a_truncated_or_altered_model_file_is_told_from_a_good_one(tmp_path):
    from ensemble.results.rundir import file_digest, file_matches
    rd = RunDirectory(tmp_path)
    path = rd.model_path("m-000")
    path.parent.mkdir()
    path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 40)
    digest = file_digest(path)
    assert rd.model_intact("m-000", digest) and rd.model_intact("m-000", None)
    with open(path, "r+b") as fh:                                   # a crash before the disk had it all
        fh.truncate(digest["bytes"] // 2)
    assert not rd.model_intact("m-000", digest) and rd.model_intact("m-000", None)
    path.write_bytes(b"PK\x03\x04" + bytes(range(255, -1, -1)) * 40)   # same size, other bytes
    assert not file_matches(path, digest)
    assert not rd.model_intact("m-001", None)                       # no file at all


# -- shared memory left by crashed jobs -------------------------------------------------------------
@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.path.exists("/proc/self/maps"),
                    reason="Linux /dev/shm and /proc only")
def test_stale_segments_are_removed_and_live_or_young_ones_kept():
    import mmap

    from ensemble.runtime import shm
    tag = f"mpich_shm_test{os.getpid()}_"
    old, young, mapped = (shm.SHM / f"{tag}{n}" for n in ("old", "young", "mapped"))
    for path in (old, young, mapped):
        path.write_bytes(bytes(4096))
    then = time.time() - 10 * shm.STALE_AGE
    for path in (old, mapped):
        os.utime(path, (then, then))
    with open(mapped, "r+b") as fh:
        view = mmap.mmap(fh.fileno(), 4096)                          # a running job's segment
    try:
        assert mapped in shm.mapped_segments()
        files, size = shm.clean_stale_segments()
        assert files >= 1 and size >= 4096
        assert not old.exists() and young.exists() and mapped.exists()
        assert shm.remove_mapped_segments() >= 1 and not mapped.exists()   # a failing rank's own
    finally:
        view.close()
        for path in (old, young, mapped):
            path.unlink(missing_ok=True)


# -- a builder's folder does not shadow what the run imports --------------------------------------
def test_a_builder_folder_that_would_shadow_an_installed_module_is_refused(tmp_path, monkeypatch):
    from ensemble.train.architecture import ArchitectureError, use_builder_folders
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "mine.py").write_text("def build(shape, n):\n    return None\n")
    (tmp_path / "numpy.py").write_text("raise SystemExit('shadowed')\n")
    arch = {"model": "mine:build", "model_dir": str(tmp_path)}
    with pytest.raises(ArchitectureError, match=r"holds 'numpy.py', which would be imported instead of the module "
                                                r"'numpy'"):
        use_builder_folders([arch])
    assert str(tmp_path) not in sys.path
    (tmp_path / "numpy.py").unlink()
    assert use_builder_folders([arch]) == [str(tmp_path)]


# -- data and config errors name the setting and the file, quickly, in one line ---------------
def bad_file(tmp_path, name, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("name, content, message", [
    ("empty.npz", b"", "is empty (0 bytes)"),
    ("empty.csv", b"\n", "holds no columns"),
    ("header.csv", b"a,b,label\n", "has a header (a, b, label) but no data rows"),
    ("latin.csv", "a,b,label\n1,2,caf\u00e9\n".encode("latin-1"), "is not UTF-8 text"),
    ("zeros.csv", bytes(3 << 20), "holds NUL bytes"),
    ("zeros.npy", bytes(4096), "cannot be read as npy"),
    ("broken.npz", b"PK\x03\x04 not really a zip", "cannot be read as npz"),
])
def test_unreadable_data_names_the_setting_and_the_file_in_one_short_line(tmp_path, name, content, message):
    from datafeed.readers import DataError, read_dataset
    path = bad_file(tmp_path, name, content)
    if name.endswith(".npy"):
        __import__("numpy").save(tmp_path / "y.npy", __import__("numpy").zeros(12))   # the targets beside it
    data = resolve_config({"data": {"source": str(path)}, "architectures": [ARCH]}).data
    with pytest.raises(DataError) as info:
        read_dataset(data)
    text = str(info.value)
    assert "`data.source`" in text and str(path) in text and message in text, text
    assert "\n" not in text and len(text) < 600


def test_object_arrays_are_refused_not_unpickled(tmp_path):
    import numpy as np

    from datafeed.readers import DataError, read_dataset
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}] * 12, dtype=object), y=np.zeros(12))
    data = resolve_config({"data": {"source": str(tmp_path / "obj.npz")}, "architectures": [ARCH]}).data
    with pytest.raises(DataError, match="`data.source` .*obj.npz.* cannot be read as npz: ValueError"):
        read_dataset(data)


def test_a_config_that_is_not_utf8_is_a_config_error(tmp_path):
    from ensemble.config import load_config
    path = bad_file(tmp_path, "c.toml", 'name = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(path)


@pytest.mark.parametrize("squeue_says, taken", [("RUNNING", False), ("", True), ("TIMEOUT", True)])
def test_a_chained_job_takes_over_the_lock_of_a_predecessor_the_scheduler_says_ended(
        tmp_path, monkeypatch, squeue_says, taken):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "squeue"                                       # Slurm's answer about job 41
    fake.write_text(f"#!/bin/sh\necho '{squeue_says}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text(json.dumps({"host": "other-node", "pid": 7, "job": "41", "time": time.time()}))
    lock = RunLock(run)
    if taken:
        lock.acquire()
        assert lock.owned() and json.loads((run / LOCK_NAME).read_text())["job"] == "42"
        lock.release()
    else:
        with pytest.raises(RunLocked, match="job 41"):
            lock.acquire()


# -- --resume finds the run that is not done ---------------------------------------------------------
def fake_run(path, state=None, ensemble=False):
    path.mkdir(parents=True)
    (path / "journal.jsonl").write_text('{"id": "m", "status": "ok"}\n')
    if state:
        (path / "status.json").write_text(json.dumps({"state": state}))
    if ensemble:
        (path / "ensemble.json").write_text("{}")


def test_resume_without_run_dir_takes_the_unfinished_run_not_the_finished_one(tmp_path):
    cfg = resolve_config({"name": "demo", "output_dir": str(tmp_path), "architectures": [ARCH]})
    fake_run(tmp_path / "demo", "done", ensemble=True)                # finished before
    fake_run(tmp_path / "demo-2", "running")                         # killed with kill -9
    path, lock = choose_run_dir(cfg, args(resume=True))
    lock.release()
    assert path == tmp_path / "demo-2"
    fake_run(tmp_path / "demo-3", "stopped", ensemble=True)          # a time limit stopped it: unfinished too
    with pytest.raises(ConfigError, match="2 runs of 'demo' are unfinished .*demo-2.*demo-3.*--run-dir"):
        choose_run_dir(cfg, args(resume=True))
    for name in ("demo-2", "demo-3"):
        (tmp_path / name / "status.json").write_text(json.dumps({"state": "done"}))
        (tmp_path / name / "ensemble.json").write_text("{}")
    path, lock = choose_run_dir(cfg, args(resume=True))                # all done: the latest
    lock.release()
    assert path == tmp_path / "demo-3"


def test_a_zombie_holds_no_lock():
    """A rank killed with kill -9 stays a zombie until its parent reaps it (forever under a
    container's first process that reaps nothing): its pid exists, but it is dead."""
    import signal
    from pathlib import Path

    from ensemble.results.lock import pid_alive
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(child.pid) and time.monotonic() < deadline:   # not reaped: a zombie
            time.sleep(0.01)
        assert not pid_alive(child.pid)
        if Path("/proc").is_dir():
            assert Path(f"/proc/{child.pid}").exists()                 # it was a zombie, not gone
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)


def test_an_atomic_write_that_fails_leaves_no_part_file(tmp_path):
    """A full disk left status.json.part (empty) and splits.npz.part.npz beside the run's files."""
    import pytest as _pytest

    from ensemble.results.rundir import atomic_write

    def full(p):
        p.write_bytes(b"half")
        raise OSError(28, "No space left on device")
    with _pytest.raises(OSError):
        atomic_write(tmp_path / "splits.npz", full)
    assert list(tmp_path.iterdir()) == []
