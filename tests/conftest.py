"""Shared test helpers: the venv's mpiexec and a runner that never hangs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def mpiexec() -> str:
    exe = BIN / "mpiexec"
    return str(exe) if exe.exists() else "mpiexec"


def importable(**extra: str) -> dict:
    """This process's environment with this checkout first on PYTHONPATH (a subprocess imports
    the project under test, not an installed copy), then ``extra``."""
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def run_mpi(n: int, args: list[str], timeout: float = 300, cwd: Path | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Start ``mpiexec -n n python ARGS`` with a timeout: a deadlock fails the test, never hangs CI."""
    full_env = importable(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", ENSEMBLE_VERIFY_BROADCAST="1", **(env or {}))
    cmd = [mpiexec(), "-n", str(n), sys.executable, *args]
    try:
        return subprocess.run(cmd, cwd=cwd or ROOT, env=full_env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s (hang?)\n"
                    f"stdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")


def kill_when(n: int, args: list[str], ready, timeout: float = 180, what: str = "the moment to kill") -> None:
    """Start ``mpiexec -n n python ARGS`` in its own session, poll ``ready()`` until it is true,
    then kill -9 the whole job (every rank at once, as a scheduler does). Fails the test if the
    job ends first or ``ready`` is not true within ``timeout`` seconds."""
    import signal
    import time
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([mpiexec(), "-n", str(n), sys.executable, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        end = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, f"{what} did not come within {timeout} s"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def pytest_collection_modifyitems(config, items):
    """Everything under tests/mpi starts mpiexec: mark it, so `make test-fast` (-m "not mpi")
    can never pick up a test that launches ranks even if its file forgets the mark."""
    for item in items:
        if "tests/mpi/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.mpi)
