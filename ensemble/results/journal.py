"""The results journal: one JSON line per finished or failed member, append-only, fsynced.

A line is the unit of durability: it is written whole, flushed and fsynced before the
master moves on, so a result that reached the journal survives any later failure. A torn
last line (the job killed mid-write) is skipped when the journal is read back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class Journal:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _repair_tail(self) -> None:
        """Cut a torn last line so the next append starts on a fresh line."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        with open(self.path, "r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, record: dict) -> None:
        self._fh.write(json.dumps(record, sort_keys=True, allow_nan=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_journal(path: str | Path) -> list[dict]:
    """All whole records in order; a torn or corrupt line is skipped, not fatal."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
