"""The run-directory lock: one job at a time writes a run.

``run.lock`` is created atomically (``O_CREAT | O_EXCL``, which holds on local file
systems and on NFSv3+, Lustre and GPFS) and holds its owner: host, PID, the scheduler's
job id and when it was taken. While the job runs, a thread touches it every
``REFRESH_SECONDS`` (its modification time is the owner's sign of life). A second job
on the same run directory (a resubmitted job script while the first still runs, two
``--resume`` of one killed run) finds the lock and refuses at once, naming the holder.

The lock is broken only when provably stale: its owner is on this host and its PID is
gone, the batch scheduler says the owner's job has ended (Slurm, LSF, Flux: the next job
of a chain, on other nodes, after its predecessor was killed at its time limit), or it
has not been touched for ``STALE_SECONDS`` (the owner's node died: a kill -9
of a job on another node is recovered from after that time, or at once by removing
``run.lock`` by hand once the job is known to be gone). A stale lock is removed under a
guard file (``run.lock.break``, also ``O_EXCL``): of two jobs breaking it at once one
removes it, and the other never removes the fresh lock the first then took.

Readers (``ensemble.predict``, ``.report``, ``.status``) take no lock: they read files the
run replaces atomically. ``ensemble.reselect`` writes, so it takes the lock.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: the lock file's name in the run directory
LOCK_NAME = "run.lock"
#: how often the owner touches its lock
REFRESH_SECONDS = 30.0
#: a lock not touched for this long belongs to a job that is gone (10 missed refreshes)
STALE_SECONDS = 300.0
#: attempts to take a lock that others are breaking or taking at the same moment
ACQUIRE_TRIES = 100
#: a break guard older than this belongs to a breaker that died (breaking takes milliseconds)
GUARD_STALE_SECONDS = 60.0
#: environment variables that name the scheduler's job (Slurm, PBS, LSF, Flux)
JOB_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID")


class RunLocked(RuntimeError):
    """Another job holds the run directory; the message names it and says what to do."""


def _job_id() -> str | None:
    return next((os.environ[v] for v in JOB_VARIABLES if os.environ.get(v)), None)


#: per scheduler: the job-id variable, the query of a job's state, and the states of a job still alive
SCHEDULER_QUERIES = {
    "SLURM_JOB_ID": (["squeue", "-h", "-o", "%T", "-j"], {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING",
                                                          "CONFIGURING", "RESIZING", "REQUEUED", "STOPPED"}),
    "LSB_JOBID": (["bjobs", "-noheader", "-o", "stat"], {"PEND", "RUN", "PSUSP", "USUSP", "SSUSP", "WAIT"}),
    "FLUX_JOB_ID": (["flux", "jobs", "-n", "-o", "{state}"], {"DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP"}),
}


def job_ended(job: str) -> bool:
    """Whether the batch scheduler this job runs under says job ``job`` has ended (True only
    on a clear answer: a job it no longer lists, or one in a final state). A chained job
    (``ensemble.jobscript --chain``) starts once the one before has ended however it ended,
    perhaps on other nodes, so this is how it takes over a lock its SIGKILLed predecessor
    left behind."""
    import subprocess
    for variable, (command, alive) in SCHEDULER_QUERIES.items():
        if not os.environ.get(variable):
            continue
        try:
            out = subprocess.run([*command, job], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return False
        state = out.stdout.strip().split("\n")[0].strip().upper() if out.stdout.strip() else ""
        if out.returncode == 0 and state:
            return state not in alive
        return out.returncode == 0 or "invalid job id" in out.stderr.lower() or "not found" in out.stderr.lower()
    return False


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists and runs (someone else's counts as alive).
    A zombie is dead: a rank killed with kill -9 stays one until its parent reaps it, and in
    a container whose first process reaps nothing that is forever."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:                     # someone else's process: alive
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:                             # no /proc (macOS) or gone meanwhile
        return not Path("/proc").is_dir()
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


class RunLock:
    """The lock of the run directory ``run_dir``: ``acquire()`` or raise ``RunLocked``;
    ``release()`` (only the owner's own lock is removed). As a context manager, held for
    the block."""

    def __init__(self, run_dir: str | Path, *, stale_seconds: float = STALE_SECONDS,
                 refresh_seconds: float = REFRESH_SECONDS, what: str = "ensemble.run") -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.stale_seconds, self.refresh_seconds, self.what = stale_seconds, refresh_seconds, what
        self.owner: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the holder ---------------------------------------------------------------------
    def holder(self) -> dict[str, Any] | None:
        """Who holds the lock (with ``age``, seconds since it was last touched), or None."""
        try:
            text = self.path.read_text(errors="replace")
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        try:
            owner = json.loads(text)
            owner = owner if isinstance(owner, dict) else {}
        except json.JSONDecodeError:            # torn while written: its age still tells
            owner = {}
        return {**owner, "age": age}

    def stale_because(self, holder: dict[str, Any]) -> str | None:
        """Why ``holder``'s lock is provably stale, or None while it may be alive."""
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            if holder["pid"] == os.getpid() and holder.get("token") != self.owner.get("token"):
                return None                     # this process, another lock object: not stale
            if not pid_alive(holder["pid"]):
                return f"its process {holder['pid']} on this host is gone"
            return None
        job = holder.get("job")
        if job and job != _job_id() and job_ended(str(job)):
            return f"the scheduler says its job {job} has ended"
        if holder["age"] > self.stale_seconds:
            return f"it was last refreshed {holder['age']:.0f} s ago (> {self.stale_seconds:.0f} s)"
        return None

    def describe(self, holder: dict[str, Any]) -> str:
        job = f", job {holder['job']}" if holder.get("job") else ""
        since = (f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder['time']))}"
                 if isinstance(holder.get("time"), int | float) else "")
        return (f"{holder.get('what', 'a job')} on host {holder.get('host', '?')}, PID {holder.get('pid', '?')}"
                f"{job}{since}, last refreshed {holder['age']:.0f} s ago")

    # -- taking and giving back -----------------------------------------------------------
    def acquire(self) -> None:
        for _ in range(ACQUIRE_TRIES):
            if self._create():
                self._start_refreshing()
                return
            holder = self.holder()
            if holder is None:                  # released between our try and our look
                continue
            why = self.stale_because(holder)
            if why is None:
                raise RunLocked(
                    f"the run directory {str(self.path.parent)!r} is in use by {self.describe(holder)}; "
                    "two jobs on one run would train members twice and overwrite each other's files. Wait "
                    "for that job to end (or cancel it); if it is gone (its node died), the lock is taken over "
                    f"{self.stale_seconds:.0f} s after its last refresh, or remove {str(self.path)!r} by hand")
            self._break(holder, why)
        raise RunLocked(f"could not take the lock {str(self.path)!r}: other jobs keep taking it")

    def _break(self, holder: dict[str, Any], why: str) -> None:
        """Remove the stale lock of ``holder``, under a guard file so that of two jobs
        breaking it at once only one does, and never the fresh lock the other then took."""
        guard = self.path.with_name(LOCK_NAME + ".break")
        try:
            os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:                 # another job is breaking it: look again shortly
            try:
                if time.time() - guard.stat().st_mtime > GUARD_STALE_SECONDS:
                    guard.unlink(missing_ok=True)   # a breaker that died inside its few milliseconds
            except FileNotFoundError:
                pass
            time.sleep(0.05)
            return
        try:
            again = self.holder()
            same = again is not None and all(again.get(k) == holder.get(k) for k in ("host", "pid", "time", "token"))
            if same and again is not None and self.stale_because(again) is not None:
                self.path.unlink(missing_ok=True)
                log.warning(f"took over the stale lock of {self.describe(holder)}: {why}")
        finally:
            guard.unlink(missing_ok=True)

    def _create(self) -> bool:
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "job": _job_id(), "what": self.what,
                      "time": round(time.time(), 3), "token": os.urandom(8).hex()}
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, json.dumps(self.owner).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _start_refreshing(self) -> None:
        self._stop.clear()

        def refresh() -> None:
            while not self._stop.wait(self.refresh_seconds):
                self.refresh()
        self._thread = threading.Thread(target=refresh, name="run-lock", daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        """Touch the lock (its modification time is the owner's sign of life)."""
        try:
            os.utime(self.path)
        except OSError:
            pass                                # removed by hand: nothing to keep alive

    def owned(self) -> bool:
        holder = self.holder()
        return holder is not None and holder.get("token") == self.owner.get("token")

    def release(self) -> None:
        """Stop refreshing and remove the lock if it is still this one's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            if self.owner and self.owned():
                self.path.unlink(missing_ok=True)
        except OSError:                 # a file system gone read-only: the lock stays, and is broken as stale
            pass                        # (its process gone) by the next job; no second error on the way out

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
