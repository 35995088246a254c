"""``[tracking] mlflow`` against a real MLflow tracking server (``mlflow server`` on 127.0.0.1,
SQLite backend in a temp dir, started here and always killed), with rehearsal members under
``mpiexec -n 3``:

- the server holds one parent run, one nested run per member with its metrics and status,
  the ensemble's metrics and report.html and ensemble.json as artifacts; ``--resume``
  continues the same parent run;
- a server stopped halfway (killed once it holds some members, while the rest wait on a
  gate, ``tests/mpi/gate.py``): the run finishes with the same results as without
  tracking, warns once and says what was dropped;
- a URI where no server listens (``long``): one warning, the run does not wait.

The server is MLflow's full package (``mlflow``, in the ``test`` extra; users' ``tracking``
extra has only the client, ``mlflow-skinny``). One server serves the module (its start,
a few seconds of imports and SQLite migrations, is most of the cost); the fault test,
last, kills it, and a test after it would start it again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, mpiexec, run_mpi
from tests.mpi import gate

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CONFIG = """
name = "tracked"
seed = 7
[[architectures]]
name = "null"
members = {members}
layers = [{{type = "Dense", units = 8}}]
[runtime]
trainer = "{trainer}"
[rehearsal]
seconds = {seconds}
[ensemble]
k = 3
method = "top_k"
{tracking}
"""

#: how long a test waits for the server, or for a run, on a loaded 2-core machine
START_SECONDS, RUN_SECONDS = 300, 300
#: the lines that say a destination was given up (one per run at most)
GAVE_UP = re.compile(r"tracking: mlflow (given up|did not finish)")


def _benchkit():
    """scripts/benchkit.py, the one home of the local server (bench_dispatch.py starts it too)."""
    spec = importlib.util.spec_from_file_location("benchkit", ROOT / "scripts" / "benchkit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


benchkit = _benchkit()
free_port = benchkit.free_port


def start(server) -> None:
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    if not benchkit.MlflowServer.available():
        pytest.skip('no MLflow server: pip install "mpi-ensemble[test]" (the full mlflow package)')
    s = benchkit.MlflowServer(tmp_path_factory.mktemp("mlflow"), START_SECONDS)
    start(s)
    yield s
    s.stop()


@pytest.fixture
def server(mlflow_server):
    """The module's server, started again if a test before killed it."""
    if not mlflow_server.running:
        start(mlflow_server)
    return mlflow_server


def write_config(path: Path, members: int, seconds: float, tracking: str = "", trainer: str = "rehearsal") -> Path:
    path.write_text(textwrap.dedent(CONFIG.format(members=members, seconds=seconds, tracking=tracking,
                                                  trainer=trainer)))
    return path


def tracked(uri: str, experiment: str, **more) -> str:
    lines = ["[tracking]", f'mlflow = "{uri}"', f'mlflow_experiment = "{experiment}"', "batch_seconds = 0.2"]
    lines += [f"{k} = {v}" for k, v in more.items()]
    return "\n".join(lines)


def client(uri: str):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def finished_member_runs(c, experiment: str) -> list:
    """The nested runs the server holds whole (created, logged and ended)."""
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return [r for r in c.search_runs([exp.experiment_id])
            if "mlflow.parentRunId" in r.data.tags and r.info.status == "FINISHED"]


def test_the_server_holds_parent_members_metrics_and_artifacts(server, tmp_path):
    cfg = write_config(tmp_path / "c.toml", 6, 0.05, tracked(server.uri, "ens", finish_seconds=RUN_SECONDS))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=RUN_SECONDS + 120)
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
        assert r.data.params["seed"] == str(record["seed"])
        assert r.data.metrics["val_accuracy"] == pytest.approx(record["val"]["accuracy"])
        assert r.data.metrics["test_accuracy"] == pytest.approx(record["test"]["accuracy"])
    summary = json.loads((run_dir / "ensemble.json").read_text())
    parent = c.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.params["mode"] == "ensemble"
    assert parent.data.metrics["test_accuracy"] == pytest.approx(summary["ensemble"]["test"]["accuracy"])
    assert {a.path for a in c.list_artifacts(parent_id)} >= {"ensemble.json", "report.html"}
    kept = Path(c.download_artifacts(parent_id, "ensemble.json", str(tmp_path)))
    assert json.loads(kept.read_text())["ensemble"] == summary["ensemble"]
    # --resume continues the same parent run (and writes no member twice)
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"],
                   timeout=RUN_SECONDS + 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = c.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs if "mlflow.parentRunId" not in r.data.tags] == [parent_id]
    assert len([r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]) == 6
    assert json.loads((run_dir / "mlflow.json").read_text())["run_id"] == parent_id
    assert c.get_run(parent_id).info.status == "FINISHED"


@pytest.mark.long          # make test-long: the server test above covers sending a run
def test_a_resume_sends_the_members_earlier_jobs_did_not(server, tmp_path):
    """Tracking turned on at ``--resume`` of a run that had none: the earlier job's members
    reach the server, each once; a member whose nested run was lost, or left unfinished by a
    job that ended mid-write, is written again on the next resume, and nothing twice; a member
    the server holds only as a failed training gets its ok one beside it."""
    run_dir = tmp_path / "run"
    plain = write_config(tmp_path / "plain.toml", 6, 0.02)
    proc = run_mpi(3, ["-m", "ensemble.run", str(plain), "--run-dir", str(run_dir)], timeout=RUN_SECONDS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = write_config(tmp_path / "c.toml", 6, 0.02, tracked(server.uri, "late", finish_seconds=RUN_SECONDS))
    resume = ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"]
    journal = {x["id"]: x for x in map(json.loads, (run_dir / "journal.jsonl").read_text().splitlines()) if "id" in x}
    c = client(server.uri)

    def nested() -> dict[str, list]:
        parent = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
        exp = c.get_experiment_by_name("late")
        out: dict[str, list] = {}
        for r in c.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"):
            out.setdefault(r.info.run_name, []).append(r)
        return out

    proc = run_mpi(3, resume, timeout=RUN_SECONDS + 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = nested()
    assert set(runs) == set(journal) and all(len(v) == 1 for v in runs.values())
    for member, (r,) in runs.items():
        assert r.info.status == "FINISHED"
        assert r.data.metrics["val_accuracy"] == pytest.approx(journal[member]["val"]["accuracy"])
    lost, torn, other = sorted(journal)[:3]
    c.delete_run(runs[lost][0].info.run_id)                    # never reached the server
    c.set_terminated(runs[other][0].info.run_id, status="FAILED")   # an earlier training of it failed
    c.delete_run(runs[torn][0].info.run_id)                    # an earlier job died while writing it:
    parent = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    c.create_run(c.get_experiment_by_name("late").experiment_id, run_name=torn,
                 tags={"mlflow.parentRunId": parent, "member": torn})          # left RUNNING, no metrics
    proc = run_mpi(3, resume, timeout=RUN_SECONDS + 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = nested()
    assert set(runs) == set(journal), runs
    assert {m: sorted(r.info.status for r in v) for m, v in runs.items()} == {
        m: ["FAILED", "FINISHED"] if m == other else ["FINISHED"] for m in journal}   # the ok training too
    assert runs[torn][0].data.metrics["val_accuracy"] == pytest.approx(journal[torn]["val"]["accuracy"])


@pytest.mark.long          # make test-long: the server test above covers sending a run
def test_a_server_stopped_halfway_costs_nothing_but_one_warning(server, tmp_path):
    """Kept last: it kills the module's server."""
    members, after = 12, 4                                     # members 4.. wait until the server is killed
    opened, closed = tmp_path / "open", tmp_path / "gate"
    opened.touch()
    trainer = "tests.mpi.gate:trainer"
    plain = write_config(tmp_path / "plain.toml", members, 0.05, trainer=trainer)
    cfg = write_config(tmp_path / "c.toml", members, 0.05,
                       tracked(server.uri, "fault", give_up_seconds=2, finish_seconds=10), trainer=trainer)
    base = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

    def start(config: Path, run_dir: Path, gate_file: Path) -> subprocess.Popen:
        return subprocess.Popen([mpiexec(), "-n", "3", sys.executable, "-m", "ensemble.run", str(config),
                                 "--run-dir", str(run_dir)], cwd=ROOT, env={**base, **gate.env(gate_file, after)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    run_dir, plain_dir = tmp_path / "run", tmp_path / "plain"
    procs = [start(plain, plain_dir, opened), start(cfg, run_dir, closed)]  # side by side: the same results?
    try:
        c, written = client(server.uri), []
        end = time.monotonic() + RUN_SECONDS
        while not written and time.monotonic() < end and procs[1].poll() is None:
            written = finished_member_runs(c, "fault")
            time.sleep(0.2)
        assert procs[1].poll() is None, procs[1].communicate()[0]
        assert 1 <= len(written) <= after, "the server got no member before the gate opened"
        server.stop()                                          # halfway: some members written, most not
        closed.touch()
        out = procs[1].communicate(timeout=RUN_SECONDS)[0]
        ref = procs[0].communicate(timeout=RUN_SECONDS)[0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert procs[0].returncode == 0, ref
    assert procs[1].returncode == 0, out
    assert len(GAVE_UP.findall(out)) == 1, out                 # warns once
    dropped = re.findall(r"tracking: mlflow: (\d+) writes dropped", out)
    assert len(dropped) == 1, out                              # and says what was dropped
    assert 1 <= int(dropped[0]) <= members - len(written) + 1  # members not written whole, and the ensemble
    got, want = (json.loads((d / "ensemble.json").read_text()) for d in (run_dir, plain_dir))
    assert got["ensemble"] == want["ensemble"] and got["counts"] == want["counts"]
    assert [m["id"] for m in got["members"]] == [m["id"] for m in want["members"]]
    assert got["n_finished"] == members


@pytest.mark.long
def test_no_server_at_all_is_one_warning(tmp_path):
    """A URI nothing listens on: the run does not wait for it beyond `finish_seconds`."""
    cfg = write_config(tmp_path / "c.toml", 4, 0.01,
                       tracked(f"http://127.0.0.1:{free_port()}", "none", give_up_seconds=1, finish_seconds=3))
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(tmp_path / "run")], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert len(GAVE_UP.findall(out)) == 1, out
    assert "writes dropped" in out and "experiment 'none'" not in out
