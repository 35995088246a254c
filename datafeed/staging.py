"""Node-local staging: copy a streamed dataset's files once per node before reading them.

Parallel file systems serve many small reads from many nodes badly; a node-local disk
(``$TMPDIR``, a burst buffer) serves them at local speed. ``stage_files`` copies the files to
``data.stage_dir`` once per node: the first rank of the node to arrive takes a lock file
(``O_CREAT | O_EXCL``, atomic on a local file system) and copies each file to a temporary
name then renames it; the other ranks of the node wait for its ``done`` marker (a sleep
that grows to 0.5 s), so no MPI is needed and a node's ranks agree without a collective.
A copy that is already complete (same names and sizes) is reused; a lock whose process
is gone (a killed job on this host) is taken over.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

from datafeed.readers import DataError
from datafeed.shards import ShardSet

#: how long a rank waits for another rank of its node to finish the copy
WAIT_SECONDS = 6 * 3600.0


def stage_root(stage_dir: str, source: str) -> Path:
    """This dataset's folder under ``stage_dir`` (``$VARS`` expanded), one per source."""
    base = os.path.expandvars(os.path.expanduser(stage_dir))
    if "$" in base:
        raise DataError(f"`data.stage_dir` {stage_dir!r} names an unset environment variable; set it or give a path")
    return Path(base) / ("ensemble-stage-" + hashlib.sha1(str(source).encode()).hexdigest()[:12])


def stage_files(ss: ShardSet, stage_dir: str) -> dict[str, str]:
    """Copy ``ss``'s files (and npy targets files) to node-local ``stage_dir`` once per node;
    returns original path -> staged path."""
    root = stage_root(stage_dir, ss.source)
    files = [s.path for s in ss.shards] + [s.y_path for s in ss.shards if s.y_path]
    moved = {f: str(root / f"{i:06d}-{Path(f).name}") for i, f in enumerate(files)}
    want = {moved[f]: os.path.getsize(f) for f in files}
    done, lock = root / "done.json", root / "lock"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"`data.stage_dir` {stage_dir!r}: cannot make {str(root)!r}: {exc.strerror or exc}") from None
    deadline = time.monotonic() + WAIT_SECONDS
    delay = 0.01
    while not _complete(done, want):
        if _take(lock):
            try:
                done.unlink(missing_ok=True)
                for src, dst in moved.items():
                    tmp = f"{dst}.part-{os.getpid()}"
                    shutil.copyfile(src, tmp)
                    os.replace(tmp, dst)
                done.write_text(json.dumps(want))
            except OSError as exc:
                raise DataError(f"`data.stage_dir` {stage_dir!r}: copying the data to {str(root)!r} failed: "
                                f"{exc.strerror or exc}; free space there or unset `data.stage_dir`") from None
            finally:
                lock.unlink(missing_ok=True)
            break
        if time.monotonic() > deadline:
            raise DataError(f"`data.stage_dir`: waited {WAIT_SECONDS:.0f} s for another rank to copy the data to "
                            f"{str(root)!r}; remove {str(lock)!r} if no job is using it")
        time.sleep(delay)
        delay = min(2 * delay, 0.5)
    return moved


def _complete(done: Path, want: dict[str, int]) -> bool:
    try:
        return json.loads(done.read_text()) == want and all(os.path.getsize(p) == n for p, n in want.items())
    except (OSError, ValueError):
        return False


def _take(lock: Path) -> bool:
    """Take the node's copy lock; a lock left by a dead process of this host is taken over."""
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            host, pid = lock.read_text().split()
            if host == socket.gethostname() and not _alive(int(pid)):
                lock.unlink(missing_ok=True)
        except (OSError, ValueError):
            pass
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{socket.gethostname()} {os.getpid()}")
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
