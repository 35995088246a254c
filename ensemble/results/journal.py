"""The results journal: one JSON line per finished or failed member, append-only.

Durability (group commit): every line is written whole and handed to the operating system
(``flush``) the moment its result arrives, so a crash of the master process loses nothing;
``fsync`` (the disk, or the parallel file system's servers, have it) runs at most every
``sync_seconds`` for all the lines since the last one, and at once when ``sync_seconds`` is
0. A crash of the node or of the file system therefore loses at most the results of the
last ``sync_seconds`` (plus one poll), and ``--resume`` trains those members again. A torn
last line (the job killed mid-write) is cut when the journal is reopened and skipped when
it is read.

Besides member records (they have an ``id``), the journal holds a few event lines (they
have an ``event``): when dispatch opened and closed, on how many workers; which members'
files were released (``released``, retention); in a search, each candidate's genome when
it is handed out (``issued``, so a resume re-issues the ones in flight). With the
members' ``dispatched``/``started``/``ended`` times they make a run's utilisation
computable from the journal alone (``ensemble.results.timeline``).

Lines are JSON only here: ``extend`` takes ``MemberRecord`` and ``Event`` objects (or plain
dicts) and writes their JSON; ``read_history`` gives them back typed, in order, and is what
every reader of a run uses (``RunDirectory.history`` / ``RunDirectory.records``).
``read_lines`` and ``read_journal`` return the raw dicts, for tools that want the lines as
written.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ensemble.results.events import Event
from ensemble.results.records import MemberRecord

log = logging.getLogger(__name__)

#: a journal line as the code sees it: a member's record or a run event
Entry = MemberRecord | Event


def line_of(item: Entry | Mapping[str, Any]) -> Mapping[str, Any]:
    """The JSON-able line of a record, an event or an already plain dict."""
    return item.to_json() if isinstance(item, MemberRecord | Event) else item


class Journal:
    def __init__(self, path: str | Path, sync_seconds: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 before_sync: Callable[[], None] | None = None):
        self.path = Path(path)
        self.before_sync = before_sync         # e.g. the packed store's fsync: what a line names is on disk first
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sync_seconds, self.clock = sync_seconds, clock
        self._repair_tail()
        self._fh = open(self.path, "a", encoding="utf-8")
        self._dirty = False
        self._last_sync = -float("inf")
        self.syncs = 0
        self.bytes = self.path.stat().st_size

    def _repair_tail(self) -> None:
        """Cut a torn last line so the next append starts on a fresh line."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb") as fh:               # only the tail: a big journal is not read whole
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - 1))
            if fh.read(1) == b"\n":
                return
            step, pos = 1 << 16, size
            while pos > 0:
                pos = max(0, pos - step)
                fh.seek(pos)
                cut = fh.read(size - pos).rfind(b"\n")
                if cut >= 0:
                    keep = pos + cut + 1
                    break
            else:
                keep = 0
        with open(self.path, "r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())

    def extend(self, records: Iterable[Entry | Mapping[str, Any]]) -> None:
        """Append ``records`` (member records, events or their plain lines) in one write; fsync
        now if the last one is older than ``sync_seconds``."""
        text = "".join(json.dumps(line_of(r), sort_keys=True, allow_nan=True) + "\n" for r in records)
        if not text:
            return
        self._fh.write(text)
        self._fh.flush()
        self.bytes += len(text.encode("utf-8"))
        self._dirty = True
        self.sync_if_due()

    def append(self, record: Entry | Mapping[str, Any]) -> None:
        self.extend([record])

    def event(self, record: Event | Mapping[str, Any]) -> None:
        """A run event line (not a member; it has an ``event`` key), synced at once."""
        self.extend([record])
        self.sync()

    def sync_if_due(self) -> None:
        if self._dirty and self.clock() - self._last_sync >= self.sync_seconds:
            self.sync()

    def sync(self) -> None:
        if self._dirty:
            if self.before_sync is not None:
                self.before_sync()
            os.fsync(self._fh.fileno())
            self.syncs += 1
            self._dirty = False
        self._last_sync = self.clock()

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_lines(path: str | Path, upto: int | None = None) -> list[dict]:
    """Every whole line (member records and event lines) in order; a torn or corrupt line
    (not JSON, not UTF-8, not an object) is skipped, not fatal, and one warning counts them
    (the torn last line of a killed job is expected and not counted). ``upto``: only the
    lines within the file's first ``upto`` bytes (what it held when a job began)."""
    path = Path(path)
    out = []
    bad = 0
    if path.exists():
        loads = json.loads
        with open(path, "rb") as fh:
            lines = fh if upto is None else io.BytesIO(fh.read(upto))
            for line in lines:
                try:
                    item = loads(line)
                except ValueError:               # JSONDecodeError, UnicodeDecodeError
                    bad += line.endswith(b"\n") and bool(line.strip())
                    continue
                if isinstance(item, dict):
                    out.append(item)
                else:
                    bad += 1
    if bad:
        log.warning(f"{path}: {bad} damaged line(s) skipped (not JSON or not UTF-8); the members they held, "
                    "if any, count as not run and are trained again on resume")
    return out


def read_journal(path: str | Path, events: bool = False) -> list[dict] | tuple[list[dict], list[dict]]:
    """All whole member records in order (a torn or corrupt line is skipped, not fatal);
    with ``events``, (records, event lines)."""
    return split_lines(read_lines(path), events)


def split_lines(lines: Iterable[dict], events: bool = False) -> list[dict] | tuple[list[dict], list[dict]]:
    """Journal lines as raw dicts: the member records in order; with ``events``, (records,
    event lines)."""
    records: list[dict] = []
    marks: list[dict] = []
    for item in lines:
        (marks if "event" in item else records).append(item)
    return (records, marks) if events else records


def read_history(path: str | Path) -> list[Entry]:
    """The journal typed, in order (``typed_history``); torn or corrupt lines are skipped."""
    return typed_history(read_lines(path))


def typed_history(lines: Iterable[Mapping[str, Any]]) -> list[Entry]:
    """Journal lines typed, in order: a ``MemberRecord`` per member line (older journals read
    as meant, ``MemberRecord.from_json``) and an ``Event`` per event line (kinds this version
    does not know are left out)."""
    out: list[Entry] = []
    for item in lines:
        if "event" in item:
            event = Event.from_json(item)
            if event is not None:
                out.append(event)
        elif "id" in item:
            out.append(MemberRecord.from_json(item))
    return out


def split_history(history: Iterable[Entry]) -> tuple[list[MemberRecord], list[Event]]:
    """(member records, events) of a typed journal, each in order."""
    records: list[MemberRecord] = []
    events: list[Event] = []
    for item in history:
        if isinstance(item, MemberRecord):
            records.append(item)
        else:
            events.append(item)
    return records, events
