"""``status.json``: the master's small, regularly rewritten account of a running job.

The journal says what finished; only the master knows what is in flight, what is left
and when the job must end. It writes that here, atomically (temporary file and rename,
so a reader on a login node never sees half a file and takes no lock), when the job
opens, at most every ``runtime.heartbeat_seconds`` while it runs (from the idle hook of
the dispatch loop, after the free workers have been handed specs, so the counts are
right; on results only when the loop is never idle; a quiet master writes nothing and
never spins), every ``heartbeat_seconds`` from a thread while no loop can (a serial
master training a member; the ensemble being selected and written), and when it ends,
Ctrl-C and a crash included. A few hundred bytes whatever the run's size.
``ensemble.status`` reads it with the journal: of the heartbeat it takes only what the
journal cannot say (``state``, ``time``, ``every``, ``running``, ``workers``, ``total``,
``metric``, ``deadline``, ``job_started``, ``reason``, ``error``); the counts of members by
status it takes from the journal (``records.Counts``), as ensemble.json and the report do,
so a beat a moment old never makes them disagree.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ensemble.results.rundir import RunDirectory
from ensemble.runtime.storage import full_message, storage_full

STATES = ("running", "finishing", "done", "stopped", "failed")
FINAL = ("done", "stopped", "failed")


#: the counts a final status.json sets to 0: nothing runs or is held once the job is over
ENDED_ZERO = ("running", "held_ahead")


class Heartbeat:
    """Write ``status.json`` for the run directory ``path``: ``beat()`` when due, ``final(state)``
    at the end. Each write takes ``counts()`` (the progress so far) and merges its fields
    into what was written last. As a context manager, an exception that ends the job is
    written as its state: ``stopped`` on Ctrl-C, ``failed`` with the error otherwise, so
    ``ensemble.status`` says so at once instead of when the heartbeat has gone stale."""

    def __init__(self, path: str | Path, every: float, counts: Callable[[], dict] = dict,
                 clock: Callable[[], float] = time.time, **fixed):
        self.path = Path(path) / RunDirectory.STATUS
        self.every, self.counts, self.clock = every, counts, clock
        self.last = -float("inf")
        self.fields = {"state": "running", "host": socket.gethostname(), "pid": os.getpid(), **fixed}
        self.writes = 0
        self._lock = threading.RLock()              # the keep-alive thread and the master write in turn

    @property
    def ended(self) -> bool:
        return self.fields["state"] in FINAL

    def due(self, late: bool = False) -> bool:
        return self.clock() - self.last >= self.every * (2 if late else 1)

    def beat(self, force: bool = False, late: bool = False, **fields) -> None:
        """Write if ``every`` seconds have passed (``late``: twice that, for a caller whose
        counts may be a moment off, such as results back and their workers not yet refilled)."""
        if force or self.due(late):
            self._write(fields)

    def final(self, state: str, **fields) -> None:
        """The run's last word: nothing runs or is held any more, whatever the last counts said
        of specs out (a stopped run's workers were told to stop)."""
        assert state in FINAL, state
        self._write({**fields, "state": state, **{k: 0 for k in ENDED_ZERO if k in self.counts()}})

    def __enter__(self) -> "Heartbeat":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None or self.ended:
            return
        full = storage_full(value)
        if issubclass(kind, KeyboardInterrupt):
            self.final("stopped", reason="interrupted by Ctrl-C or a signal")
        elif full is not None:                  # as the console says it, with the way on
            self.final("failed", error=f"{full_message(full)}; free space or make it writable, then `--resume`")
        else:
            self.final("failed", error=f"{kind.__name__}: {value}")

    @contextmanager
    def kept_alive(self, state: str) -> Iterator["Heartbeat"]:
        """Write ``state`` now, then every ``every`` seconds from a thread until the block
        ends or ``final`` is written: the master's last steps (baseline, selection, outputs)
        wait for no result, and a long one must not look like a dead job. An exception in
        the block is written as for ``with heartbeat``."""
        self.beat(force=True, state=state)
        stop = threading.Event()

        def keep() -> None:
            while not stop.wait(self.every):
                with self._lock:
                    if self.ended:
                        return
                    self._write({})
        thread = threading.Thread(target=keep, name="heartbeat", daemon=True)
        thread.start()
        try:
            with self:
                yield self
        finally:
            stop.set()
            thread.join()

    def _write(self, fields: dict) -> None:
        with self._lock:
            now = self.clock()
            self.fields.update(self.counts(), **fields, time=round(now, 3), every=self.every)
            tmp = self.path.with_name(self.path.name + ".part")
            try:
                tmp.write_text(json.dumps(self.fields, default=str))
                os.replace(tmp, self.path)      # no fsync: a lost beat is rewritten in `every` seconds
            except OSError:                     # a full disk: no empty .part left behind
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:                 # a read-only one: nothing to tidy, and no second error
                    pass
                raise
            self.last = now
            self.writes += 1


def read_heartbeat(run_dir: str | Path) -> dict | None:
    """The last ``status.json`` written, or None (none yet, or a run from before it existed)."""
    try:
        return json.loads((Path(run_dir) / RunDirectory.STATUS).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def duration_words(seconds: float | None) -> str:
    """A duration as ``ensemble.status`` and the report say it: 45 s, 3.5 min, 2.1 h; "?" unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def state_words(s: Mapping[str, Any]) -> tuple[str, str | None]:
    """A run's state in words, and what to know or do about it (None: nothing), from a status
    (``ensemble.status.run_status``, or the report's own from status.json: ``state``,
    ``reason``, ``error``, ``run_dir``, ``pid``, ``heartbeat_age_seconds``): what ``ensemble
    status`` heads its block with and the report says."""
    resume = f"the same command with `--run-dir {s['run_dir']} --resume` continues it"
    return {"running": ("running", None),
            "finishing": ("finishing", "selecting the ensemble, writing the outputs"),
            "done": ("done", None),
            "stopped": ("stopped early", f"{s.get('reason')}; {resume}"),
            "failed": ("failed", s.get("error")),
            "starting": ("starting", "no heartbeat and no member yet; if that lasts, see the job's log"),
            "unknown": ("state unknown", "its status.json cannot be read (cut short by a kill while written?); "
                                         f"if the job is gone, {resume}" if s.get("status_unreadable") else
                                         "no status.json: a run from before it, or one killed before its "
                                         "first heartbeat"),
            "silent": ("silent", f"no heartbeat for {duration_words(s.get('heartbeat_age_seconds'))}: the job "
                                 f"looks dead; {resume}"),
            "dead": ("dead", f"its master (process {s.get('pid')} on this host) is gone without writing "
                             f"its end: killed (kill -9, out of memory, a node failure); {resume}")
            }.get(s["state"], (s["state"], None))


def untrained_lines(s: Mapping[str, Any], apart: bool | None) -> list[str]:
    """Why a run that is over trained fewer members than it was to (a status's ``state``,
    ``left``, ``total``, ``time_limit`` and ``resume_trains``: what a --resume would train,
    ``Mode.resume_trains``, failed members it tries again included). ``apart``: its members end
    one by one (``Mode.members_end_apart``; False: a population's, which --resume continues from
    their last round; None: not known)."""
    state, total, left = s["state"], s.get("total"), s.get("left")
    if state == "done" and left and s.get("time_limit"):          # "64 finished of 500": why not 500
        return [f"the other {left} were never started: {s['time_limit']} ended the run first"]
    untried, left = left or 0, s["resume_trains"] if s.get("resume_trains") is not None else left
    again = (left or 0) - untried                      # ended without a result, tried again
    if state in ("stopped", "silent", "failed") and left and apart and again > 0:
        return [f"{untried} of {total} members not trained yet and {again} that ended without a result; "
                f"--resume trains these {left}"]
    if state in ("stopped", "silent", "failed") and left:
        return [f"{left} of {total} members not trained yet; --resume trains them" if apart else
                f"{left} of {total} members not finished; --resume continues them from their last round"
                if apart is False else f"{left} of {total} members not trained or not finished; --resume goes on"]
    return []
