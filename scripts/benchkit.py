"""What the run benchmarks share: the launcher, and a folder for their runs that is
removed afterwards unless kept (``--keep DIR``)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def mpiexec() -> str:
    """The venv's mpiexec (the MPICH wheel's) if there is one, else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


@contextmanager
def workspace(keep: str | None, prefix: str) -> Iterator[Path]:
    """``keep`` (made if missing, left afterwards), or a temporary folder removed afterwards."""
    folder = Path(keep) if keep else Path(tempfile.mkdtemp(prefix=prefix))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
