"""A full (or over-quota) file system: told apart from a crash, so that nothing is blamed on it.

``storage_full(error)`` finds the out-of-space error behind an exception (a full disk fails a
write, then the close after it). A member whose training failed on it is no failure of its own
(``results.records.STORAGE_FULL_KIND``: the run stops handing out members, which would all fail
alike). The master keeps a small reserve file in the run directory while its job runs
(``reserve``/``release``): when its own write fails for want of space, it frees the reserve and
journals that the job stopped (``interrupted``), so that ``--resume`` does not take the members
then training for crash suspects and give one up as the crasher after a second full disk.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: the master's reserve in the run directory, and its size: room for the lines that end a job
RESERVE_NAME, RESERVE_BYTES = ".space_reserve", 1 << 18


#: what a file system says when it takes no more writes: no space, over quota, read-only
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def storage_full(error: BaseException | None) -> OSError | None:
    """The OSError behind ``error`` (itself, its cause or context) of a file system that takes no
    more writes (``STORAGE_ERRNOS``), preferring one that names its file; None if there is none."""
    found: list[OSError] = []
    while error is not None and len(found) < 8:
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            found.append(error)
        error = error.__cause__ or error.__context__
    return next((e for e in found if e.filename), found[0] if found else None)


def full_message(error: OSError) -> str:
    """What a full (or read-only) file system is called in a message: the file it failed to write
    and why."""
    what = repr(error.filename) if error.filename else "the run directory"
    if error.errno == errno.EROFS:
        return f"the file system holding {what} became read-only ({error.strerror})"
    return f"no space left on the device writing {what} ({error.strerror})"


def reserve(folder: str | Path) -> None:
    """Keep ``RESERVE_BYTES`` of the folder's file system (best effort: a disk already full keeps none)."""
    path = Path(folder) / RESERVE_NAME
    try:
        with open(path, "wb") as fh:
            fh.write(b"\0" * RESERVE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def release(folder: str | Path) -> None:
    """Give the reserve back (at a job's end, or to write its last lines on a full disk)."""
    try:
        (Path(folder) / RESERVE_NAME).unlink(missing_ok=True)
    except OSError:
        pass


def append_last_line(journal: str | Path, line: str) -> bool:
    """Append ``line`` (one JSON object) to the journal through a fresh descriptor, after freeing
    the reserve beside it: the journal's own buffer may hold the write that failed. A torn line
    before it is ended first (readers skip it). Whether it was written and synced."""
    journal = Path(journal)
    release(journal.parent)
    try:
        fd = os.open(journal, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, ("\n" + line + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
