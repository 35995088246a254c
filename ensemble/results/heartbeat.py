"""``status.json``: the master's small, regularly rewritten account of a running job.

The journal says what finished; only the master knows what is in flight, what is left
and when the job must end. It writes that here, atomically (temporary file and rename,
so a reader on a login node never sees half a file and takes no lock), when the job
opens, at most every ``runtime.progress_seconds`` while it runs (from the idle hook of
the dispatch loop and on results, so a quiet master writes nothing and never spins),
and when it ends. A few hundred bytes whatever the run's size. ``ensemble.status``
reads it with the journal.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

STATES = ("running", "finishing", "done", "stopped", "failed")


class Heartbeat:
    """Write ``status.json`` for the run directory ``path``: ``beat(**fields)`` when due,
    ``final(state, **fields)`` at the end. Fields are merged into what was written last."""

    def __init__(self, path: str | Path, every: float, clock: Callable[[], float] = time.time, **fixed):
        self.path = Path(path) / "status.json"
        self.every, self.clock = every, clock
        self.last = -float("inf")
        self.fields = {"state": "running", "host": socket.gethostname(), "pid": os.getpid(), **fixed}
        self.writes = 0

    def due(self) -> bool:
        return self.clock() - self.last >= self.every

    def beat(self, force: bool = False, **fields) -> None:
        if force or self.due():
            self._write(fields)

    def final(self, state: str, **fields) -> None:
        assert state in STATES, state
        self._write({**fields, "state": state})

    def _write(self, fields: dict) -> None:
        now = self.clock()
        self.fields.update(fields, time=round(now, 3), every=self.every)
        tmp = self.path.with_name(self.path.name + ".part")
        tmp.write_text(json.dumps(self.fields, default=str))
        os.replace(tmp, self.path)              # no fsync: a lost beat is rewritten in `every` seconds
        self.last = now
        self.writes += 1


def read_heartbeat(run_dir: str | Path) -> dict | None:
    """The last ``status.json`` written, or None (none yet, or a run from before it existed)."""
    try:
        return json.loads((Path(run_dir) / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
