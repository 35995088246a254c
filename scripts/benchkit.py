"""What the run benchmarks share: the launcher, a folder for their runs that is removed
afterwards unless kept (``--keep DIR``), and a local MLflow tracking server (also started by
tests/mpi/test_tracking_mpi.py)."""

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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 (SQLite backend and artifacts under ``base``; one
    uvicorn worker, no job runner) in its own process group, for the tracking tests and
    ``bench_dispatch.py --tracking``. Needs MLflow's full package (the ``test`` extra).
    ``start`` waits until it answers (``RuntimeError`` with its log if it does not);
    ``stop`` kills it and every process it started. ``nice``: its CPU priority (a benchmark
    runs it at 19, as a stand-in for a server on another machine)."""

    def __init__(self, base: Path, start_seconds: float = 300.0, nice: int = 0):
        self.base, self.start_seconds, self.nice = Path(base), start_seconds, nice
        self.proc = None
        self.port, self.uri = 0, ""

    @staticmethod
    def available() -> bool:
        import importlib.util
        return all(importlib.util.find_spec(m) for m in ("mlflow", "flask", "sqlalchemy", "alembic", "uvicorn"))

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> MlflowServer:
        import os
        import subprocess
        import time
        import urllib.request
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.base.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.base / "server.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", "1", "--backend-store-uri", f"sqlite:///{self.base / 'db.sqlite'}",
                 "--artifacts-destination", str(self.base / "artifacts")],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.base, env=env,
                preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)
        end = time.monotonic() + self.start_seconds
        while time.monotonic() < end and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer within {self.start_seconds:g} s:\n"
                           f"{(self.base / 'server.log').read_text()[-3000:]}")

    def stop(self) -> None:
        import os
        import signal
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)

    def __enter__(self) -> MlflowServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def write_block(page: Path, mark: str, text: str) -> None:
    """Replace what lies between ``<!-- MARK -->`` and ``<!-- /MARK -->`` in ``page`` (a
    benchmark's generated table in the docs)."""
    begin, end = f"<!-- {mark} -->", f"<!-- /{mark} -->"
    content = Path(page).read_text()
    if begin not in content or end not in content:
        raise SystemExit(f"{page} has no {begin} ... {end} block to write into")
    head, rest = content.split(begin, 1)
    Path(page).write_text(head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1])
