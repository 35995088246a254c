"""Shared-memory segments that outlive their job.

The data is shared on each node through an MPI shared window; MPICH backs it with a file
in ``/dev/shm`` (``mpich_shm_*``) that it removes when the window is freed. A job that
ends abnormally frees nothing, and the file (the size of the data) holds the node's
memory until someone deletes it. Two remedies, Linux only (elsewhere they do nothing):

- ``remove_mapped_segments()``: on the way out of an interrupted or failed rank (the exit
  hook of ``runtime.mpi``), the segments this process has mapped are unlinked; the
  memory is returned once the last rank holding the mapping exits.
- ``clean_stale_segments()``: at start-up, one rank per node removes this user's segments
  that no process on the node has mapped any more (the leftovers of a kill -9, which no
  hook sees) and that are older than ``STALE_AGE`` seconds (never a segment another job
  has just created and not yet mapped).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

SHM = Path("/dev/shm")
#: MPICH's (and its derivatives') shared-memory backing files
PREFIXES = ("mpich_shm_",)
#: a segment younger than this may belong to a job that is still setting up
STALE_AGE = 120.0


def _ours(path: Path) -> bool:
    return path.name.startswith(PREFIXES)


def _maps(pid: str) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            return {line.split(maxsplit=5)[5].strip() for line in fh
                    if line.count(" ") >= 5 and "/dev/shm/" in line}
    except (OSError, IndexError):
        return set()


def mapped_segments(pid: str = "self") -> set[Path]:
    """The MPI shared-memory files process ``pid`` has mapped."""
    return {Path(p.removesuffix(" (deleted)")) for p in _maps(pid) if _ours(Path(p))}


def remove_mapped_segments() -> int:
    """Unlink the segments this process has mapped (its job is ending abnormally); returns
    how many. Mappings stay valid until each process holding one exits."""
    removed = 0
    for path in mapped_segments():
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def clean_stale_segments(now: float | None = None) -> tuple[int, int]:
    """Remove this user's segments that no process has mapped and that are older than
    ``STALE_AGE``; returns (files, bytes) removed. Processes of other users cannot be
    read, but their segments are not this user's to remove either."""
    if not SHM.is_dir() or not Path("/proc/self/maps").exists():
        return 0, 0
    now = time.time() if now is None else now
    uid = os.getuid()
    candidates = []
    for path in SHM.iterdir():
        try:
            st = path.stat()
        except OSError:
            continue
        if _ours(path) and st.st_uid == uid and now - st.st_mtime > STALE_AGE:
            candidates.append((path, st.st_size))
    if not candidates:
        return 0, 0
    in_use: set[Path] = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            in_use |= mapped_segments(pid)
    files = size = 0
    for path, nbytes in candidates:
        if path in in_use:
            continue
        try:
            path.unlink()
        except OSError:
            continue
        files, size = files + 1, size + nbytes
    if files:
        log.warning(f"removed {files} shared-memory segment(s) ({size / 2 ** 20:.0f} MiB) left in {SHM} by "
                    "earlier jobs that ended without freeing them (a kill -9 or a crash)")
    return files, size
