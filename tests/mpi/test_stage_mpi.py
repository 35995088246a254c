"""The environment staged by ``ensemble/runtime/stage.py`` on real MPI ranks: one copy per
(pretend) node, broadcast from rank 0; a node that holds it already unpacks nothing; the copy
runs the project from itself; a bad destination fails on rank 0 and every rank exits.

The environment staged is this test's venv, less its site-packages (a few MB: its ``bin``,
the MPI wheel's libraries and the project's own packages, which are installed editable), and
without the interpreter (``--no-python``), so the test takes seconds. The whole environment is
staged, and its metadata calls counted, by ``scripts/bench_startup.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ensemble.runtime import stage
from tests.conftest import ROOT, mpiexec

pytestmark = pytest.mark.mpi

SCRIPT = ROOT / "ensemble" / "runtime" / "stage.py"
SMALL = ["--no-python", "--exclude", "lib/python3*/site-packages/*", "--exclude", "share"]


def staging(n: int, dest: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-S", "-P", str(SCRIPT), "--to", dest, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd="/")


def test_one_copy_per_node_that_runs_the_project_from_itself(tmp_path):
    dest = str(tmp_path / "node{node}" / "env")
    if not stage.editable_sources(stage.venv_of(sys.executable)):
        pytest.skip("the project is not installed editable in this venv: nothing of it outside site-packages")
    proc = staging(4, dest, "--ranks-per-node", "2", *SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "on 2 of 2 node(s)" in proc.stdout
    copies = [tmp_path / f"node{i}" / "env" for i in (0, 1)]
    for copy in copies:
        sp = next(copy.glob("venv/lib/python3*/site-packages"))
        assert (sp / "ensemble" / "runtime" / "stage.py").read_bytes() == SCRIPT.read_bytes()
        assert not list(sp.glob("__editable__*"))
        assert json.loads((copy / stage.MARKER).read_text())["stamp"]["env"] == str(stage.venv_of(sys.executable))
        assert not list(copy.parent.glob(".env.incoming-*"))
        ran = subprocess.run([str(copy / "python"), "-c", "import ensemble, sys; print(ensemble.__file__)"],
                             capture_output=True, text=True, timeout=60, cwd="/")
        assert ran.returncode == 0, ran.stderr
        assert Path(ran.stdout.strip()).is_relative_to(copy)
    # a second job step on the same nodes: nothing to unpack
    again = staging(4, dest, "--ranks-per-node", "2", *SMALL)
    assert again.returncode == 0 and "nothing (every node had it)" in again.stdout, again.stdout + again.stderr
    # one node lost its copy: only that one unpacks, the other still takes part in the broadcast
    (copies[1] / stage.MARKER).unlink()
    third = staging(4, dest, "--ranks-per-node", "2", *SMALL)
    assert third.returncode == 0 and "on 1 of 2 node(s)" in third.stdout, third.stdout + third.stderr
    assert (copies[1] / stage.MARKER).is_file()


def test_a_destination_inside_the_environment_fails_on_rank_0_and_every_rank_exits():
    inside = str(stage.venv_of(sys.executable) / "staged")
    proc = staging(3, inside, *SMALL, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count("overlaps the environment") == 1, proc.stderr
    assert not Path(inside).exists()
