"""A full disk is the storage's fault, not a member's (``ensemble.runtime.storage``): a member that
finds it fails with kind ``storage_full``, which stops the run (every member would fail alike), and
a master whose own write finds it journals that the job stopped, through its reserve's room, so a
``--resume`` takes no member then training for a crash suspect (two full disks gave a healthy
member up as the crasher, ``worker_died``, for good). And a signal's stop that Python dropped
(``runtime.stopping``) is raised again by the master's loop: the job would otherwise look lost too."""

from __future__ import annotations

import errno

import pytest

import ensemble
from ensemble.results import journal as J
from ensemble.results.crashes import read_crashes
from ensemble.results.records import MemberRecord, fatal_failure
from ensemble.results.rundir import RunDirectory
from ensemble.runtime import storage
from ensemble.train.member import root_cause


def full_error(name: str = "models/m.keras") -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", name)


def test_a_full_disk_is_found_behind_the_error_that_wraps_it():
    try:
        try:
            raise full_error()
        except OSError as exc:
            raise RuntimeError("could not save the model") from exc
    except RuntimeError as wrapped:
        assert storage.storage_full(wrapped).filename == "models/m.keras"
        kind, message = root_cause(wrapped)
    assert kind == "storage_full" and message.startswith("no space left on the device writing 'models/m.keras'")
    record = MemberRecord.from_json({"id": "m", "status": "failed", "error": {"kind": kind, "message": message}})
    assert "stopping: every member would fail the same way. Free space" in fatal_failure(record)
    assert storage.storage_full(OSError(errno.EACCES, "denied")) is None
    assert storage.storage_full(OSError(errno.EDQUOT, "Disk quota exceeded")) is not None


def test_the_master_says_its_job_stopped_when_its_own_write_finds_the_disk_full(tmp_path, monkeypatch):
    real = J.Journal.extend
    results = {"n": 0}

    def extend(self, records):
        records = list(records)
        if any("event" not in J.line_of(r) for r in records):          # a member's result line
            results["n"] += 1
            if results["n"] == 3:
                raise full_error(str(self.path))
        return real(self, records)
    monkeypatch.setattr(J.Journal, "extend", extend)
    run = tmp_path / "run"
    cfg = {"name": "full", "data": {"source": "iris"}, "runtime": {"trainer": "rehearsal"},
           "rehearsal": {"seconds": 0.01},
           "architectures": [{"name": "a", "members": 6, "layers": [{"type": "Dense", "units": 4}]}]}
    with pytest.raises(OSError, match="No space left"):
        ensemble.run_config(cfg, run_dir=run)
    history = RunDirectory(run).history()
    stops = [x for x in history if getattr(x, "kind", None) is not None and x.kind.value == "interrupted"]
    assert stops and "no space left on the device writing" in stops[-1].data["reason"]
    book = read_crashes(history)
    assert not book.suspects and not book.given_up                   # in flight then: no crash suspect
    assert not (run / storage.RESERVE_NAME).exists()                  # the reserve given back


def test_a_run_directory_gone_read_only_ends_with_one_error_not_a_chain(tmp_path, monkeypatch):
    """The heartbeat's tidying and the lock's release raised again on a read-only file system: three
    to five chained tracebacks instead of the one line the full-disk path gives."""
    import os
    from pathlib import Path

    from ensemble.results.heartbeat import Heartbeat
    from ensemble.results.lock import RunLock
    lock = RunLock(tmp_path)
    lock.acquire()
    beat = Heartbeat(tmp_path, 5.0)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "status.json"))
    monkeypatch.setattr(os, "replace", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(OSError) as raised:
        beat.final("failed", error="x")
    assert raised.value.errno == errno.EROFS and raised.value.__context__ is None
    lock.release()                                                    # no second error on the way out
    assert storage.full_message(storage.storage_full(raised.value)).startswith(
        "the file system holding '") and "became read-only" in storage.full_message(raised.value)


def test_a_stop_a_signal_asked_for_and_that_was_dropped_is_raised_again_by_the_loop():
    """SIGTERM's KeyboardInterrupt, raised inside a weakref callback, was printed as "Exception ignored"
    and dropped: the master went on, the launcher killed it, and the job looked lost. The handler notes
    the stop (``runtime.stopping``) and the dispatch loop raises it again."""
    from ensemble.orchestrate.dispatch import dispatch
    from ensemble.runtime import stopping
    from ensemble.runtime.executor import SerialExecutor
    from ensemble.sources.members import SpecList

    class Stop(KeyboardInterrupt):
        pass
    trained = []

    def train(spec, report):
        trained.append(spec["id"])
        if len(trained) == 2:
            stopping.ask(Stop("signal 15"))        # the handler's raise, dropped where it landed
        return {"id": spec["id"], "status": "ok", "val": {"accuracy": 1.0}, "seed": spec["seed"]}
    specs = [{"id": f"m{i}", "seed": i} for i in range(5)]
    with pytest.raises(Stop):
        dispatch(SerialExecutor(lambda: train), SpecList(specs), lambda records: None)
    assert trained == ["m0", "m1"]
    stopping.take()                                  # taken once: nothing left to raise


def test_a_full_disk_while_the_outputs_are_written_leaves_status_json_saying_so(tmp_path, monkeypatch):
    """The disk filled while ensemble.json was written: status.json stayed at "finishing" (the reserve
    was given back before) and `ensemble status` called the job killed."""
    from ensemble.orchestrate import session
    from ensemble.results.heartbeat import read_heartbeat

    def finalize(*args, **kwargs):
        raise full_error(str(tmp_path / "run" / "ensemble.json"))
    monkeypatch.setattr(session, "finalize", finalize)
    cfg = {"name": "full", "data": {"source": "iris"}, "runtime": {"trainer": "rehearsal"},
           "rehearsal": {"seconds": 0.01},
           "architectures": [{"name": "a", "members": 2, "layers": [{"type": "Dense", "units": 4}]}]}
    with pytest.raises(OSError, match="No space left"):
        ensemble.run_config(cfg, run_dir=tmp_path / "run")
    beat = read_heartbeat(tmp_path / "run")
    assert beat["state"] == "failed" and beat["error"].startswith("no space left on the device writing ")
    assert not (tmp_path / "run" / storage.RESERVE_NAME).exists()
