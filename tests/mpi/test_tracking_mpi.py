"""``[tracking] mlflow`` against a real MLflow tracking server (``mlflow server`` on 127.0.0.1,
SQLite backend, in a temp dir), with rehearsal members under ``mpiexec -n 3``:

- the server holds one parent run, one nested run per member with its metrics and status,
  the ensemble's metrics and report.html and ensemble.json as artifacts; ``--resume``
  continues the same parent run;
- a server stopped halfway: the run finishes with the same results as without tracking
  and warns once.

The server needs MLflow's server dependencies (``pip install mlflow``, not the client-only
``mlflow-skinny`` of the extra); point ``ENSEMBLE_MLFLOW_SERVER`` at an ``mlflow``
executable of another environment if this one has only the client. Without one the
tests are skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, mpiexec, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.long]

CONFIG = """
name = "tracked"
seed = 7
[[architectures]]
name = "null"
members = {members}
layers = [{{type = "Dense", units = 8}}]
[runtime]
trainer = "rehearsal"
[rehearsal]
seconds = {seconds}
[ensemble]
k = 3
method = "top_k"
{tracking}
"""


def server_command() -> list[str] | None:
    given = os.environ.get("ENSEMBLE_MLFLOW_SERVER")
    if given:
        return [given]
    if all(importlib.util.find_spec(m) for m in ("mlflow", "flask", "sqlalchemy", "alembic")):
        return [sys.executable, "-m", "mlflow"]
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real ``mlflow server`` in its own process group, on a free port."""

    def __init__(self, base: Path):
        command = server_command()
        if command is None:
            pytest.skip("no MLflow server: pip install mlflow (the full package), or set ENSEMBLE_MLFLOW_SERVER")
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        base.mkdir(parents=True, exist_ok=True)
        self.log = open(base / "server.log", "w")
        self.proc = subprocess.Popen([*command, "server", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--workers", "1", "--backend-store-uri", f"sqlite:///{base / 'db.sqlite'}",
                                      "--artifacts-destination", str(base / "artifacts")],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=base)
        end = time.monotonic() + 180
        while time.monotonic() < end:
            try:
                if urllib.request.urlopen(f"{self.uri}/health", timeout=2).status == 200:
                    return
            except OSError:
                time.sleep(1)
            if self.proc.poll() is not None:
                break
        self.stop()
        pytest.fail(f"mlflow server did not start: {(base / 'server.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("mlflow"))
    yield s
    s.stop()


def write_config(path: Path, members: int, seconds: float, tracking: str = "") -> Path:
    path.write_text(textwrap.dedent(CONFIG.format(members=members, seconds=seconds, tracking=tracking)))
    return path


def tracked(uri: str, experiment: str, **more) -> str:
    lines = ["[tracking]", f'mlflow = "{uri}"', f'mlflow_experiment = "{experiment}"', "batch_seconds = 0.2"]
    lines += [f"{k} = {v}" for k, v in more.items()]
    return "\n".join(lines)


def client(uri: str):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def test_the_server_holds_parent_members_metrics_and_artifacts(server, tmp_path):
    cfg = write_config(tmp_path / "c.toml", 6, 0.05, tracked(server.uri, "ens", finish_seconds=60))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dropped" not in proc.stdout + proc.stderr
    c = client(server.uri)
    exp = c.get_experiment_by_name("ens")
    runs = c.search_runs([exp.experiment_id])
    parent_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    members = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]
    assert [r.info.run_id for r in parents] == [parent_id]
    journal = [json.loads(x) for x in (run_dir / "journal.jsonl").read_text().splitlines()]
    ids = {x["id"] for x in journal if "id" in x}
    assert {r.info.run_name for r in members} == ids and len(members) == 6
    for r in members:
        record = next(x for x in journal if x.get("id") == r.info.run_name)
        assert r.info.status == "FINISHED" and r.data.params["arch"] == "null"
        assert r.data.metrics["val_accuracy"] == pytest.approx(record["val"]["accuracy"])
    summary = json.loads((run_dir / "ensemble.json").read_text())
    parent = c.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["test_accuracy"] == pytest.approx(summary["ensemble"]["test"]["accuracy"])
    assert {a.path for a in c.list_artifacts(parent_id)} >= {"ensemble.json", "report.html"}
    # --resume continues the same parent run
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = c.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs if "mlflow.parentRunId" not in r.data.tags] == [parent_id]
    assert json.loads((run_dir / "mlflow.json").read_text())["run_id"] == parent_id


def test_a_server_stopped_halfway_costs_nothing_but_one_warning(tmp_path):
    server = Server(tmp_path / "mlflow")
    members = 16
    plain = write_config(tmp_path / "plain.toml", members, 0.25)
    cfg = write_config(tmp_path / "c.toml", members, 0.25,
                       tracked(server.uri, "fault", give_up_seconds=2, finish_seconds=5))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([mpiexec(), "-n", "3", sys.executable, "-m", "ensemble.run", str(cfg), "--run-dir",
                             str(run_dir)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        journal = run_dir / "journal.jsonl"
        end = time.monotonic() + 180
        while time.monotonic() < end and proc.poll() is None:
            if journal.exists() and journal.read_text().count('"id"') >= members // 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before the server could be stopped"
        server.stop()                                                # halfway
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        server.stop()
    assert proc.returncode == 0, out
    warnings = [line for line in out.splitlines() if "tracking: mlflow" in line
                and ("given up" in line or "did not finish" in line)]
    assert len(warnings) == 1, out
    assert "dropped" in out
    ref = run_mpi(3, ["-m", "ensemble.run", str(plain), "--run-dir", str(tmp_path / "plain")], timeout=240)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    got, want = (json.loads((d / "ensemble.json").read_text()) for d in (run_dir, tmp_path / "plain"))
    assert got["ensemble"] == want["ensemble"] and got["counts"] == want["counts"]
    assert [m["id"] for m in got["members"]] == [m["id"] for m in want["members"]]


def test_no_server_at_all_is_one_warning(tmp_path):
    """A URI nothing listens on: the run does not wait for it beyond `finish_seconds`."""
    if shutil.which(mpiexec()) is None and not Path(mpiexec()).exists():
        pytest.skip("no mpiexec")
    cfg = write_config(tmp_path / "c.toml", 4, 0.01,
                       tracked(f"http://127.0.0.1:{free_port()}", "none", give_up_seconds=1, finish_seconds=3))
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(tmp_path / "run")], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    warnings = [x for x in out.splitlines() if "tracking: mlflow" in x and ("given up" in x or "did not finish" in x)]
    assert len(warnings) == 1, out
    assert "writes dropped" in out and "experiment 'none'" not in out
