"""Online training under real mpiexec, MPMD: ``mpiexec -n 2 python online_sim.py : -n 3
python -m ensemble.run CONFIG``. The simulation streams, the ensemble trains and publishes
(the simulation loads two generations) and both end cleanly; a member that fails on the
ensemble side never stops the simulation, nor does a publish that fails; a simulation that ends early leaves a run
directory that ``--resume`` continues (beside a new simulation)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ensemble.results.rundir import RunDirectory
from tests.conftest import ROOT, importable, mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
SIM = str(ROOT / "tests" / "mpi" / "online_sim.py")

CONFIG = """mode = "online"
name = "onl"
output_dir = "{base}/runs"
[data]
source = "{base}/seed.npz"
[train]
epochs = 2
batch_size = 32
[[architectures]]
name = "mlp"
layers = [{{type = "Dense", units = 8}}]
[online]
buffer = 512
warmup = 64
publish_every = 1
[runtime]
threads = 1
{extra}
"""


def mpmd(base: Path, sim_args: list[str], run_args: list[str], env: dict | None = None,
         timeout: float = 400) -> subprocess.CompletedProcess:
    """``mpiexec -n 2 python online_sim.py ... : -n 3 python -m ensemble.run ...``, with a timeout."""
    full_env = importable(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    cmd = [mpiexec(), "-n", "2", sys.executable, SIM, str(base / "sim"), *sim_args,
           ":", "-n", "3", sys.executable, "-m", "ensemble.run", str(base / "online.toml"), *run_args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s (hang?)\nstdout:\n{exc.stdout}\n"
                    f"stderr:\n{exc.stderr}")


def sim_stats(base: Path) -> list[dict]:
    return [json.loads((base / f"sim.rank{r}.json").read_text()) for r in range(2)]


def write_config(base: Path, extra: str = "") -> None:
    (base / "online.toml").write_text(CONFIG.format(base=base, extra=extra))


# make test-long: kept out of make test's 12 minutes; tests/ensemble/test_online.py runs the buffer,
# its policies and the simulation's stream in one process
@pytest.mark.long
def test_streams_trains_publishes_twice_and_ends_cleanly(tmp_path):
    write_config(tmp_path)
    out = mpmd(tmp_path, ["--generations", "2"], [])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for s in sim_stats(tmp_path):
        assert len(s["loaded"]) >= 2, s                      # two published ensembles, loaded in turn
        assert s["loaded"] == sorted(s["loaded"]) and s["generation"] == s["loaded"][-1]
        assert s["failures"] == [] and s["sent"] > 0 and s["predicted"]
        assert len(s["latencies"]) == len(s["loaded"]) and all(t > 0 for t in s["latencies"])
    run = RunDirectory(tmp_path / "runs" / "onl")
    summary = json.loads((run.path / run.ENSEMBLE).read_text())
    online = summary["online"]
    assert online["simulation_closed"] and online["generation"] >= 3    # the end publishes once more
    assert online["published"][-1]["generation"] in (online["generation"], online["generation"] - 1)
    ok = [r.id for r in run.records()[0] if r.ok]
    assert {m["id"] for m in summary["members"]} <= set(ok[-8:])     # selected among the newest (online.window)
    assert online["samples_received"] == sum(s["sent"] for s in sim_stats(tmp_path))
    assert set(online["simulation"]) == {"0", "1"}
    assert summary["members"] and all((run.path / m["model"]).exists() for m in summary["members"])
    from ensemble import load as load_ensemble
    ens = load_ensemble(run.path)                            # predictable afterwards
    import numpy as np
    mean, std = ens.predict(np.zeros((3, 4), np.float32))
    assert mean.shape == (3,) and np.isfinite(std).all()


@pytest.mark.long          # make test-long: about 60 s
def test_failing_member_never_stops_the_simulation_and_early_end_resumes(tmp_path):
    # the fault-injecting trainer fails the first member; the simulation stops after a few steps
    write_config(tmp_path, 'trainer = "tests.mpi.faults:trainer"')
    out = mpmd(tmp_path, ["--stop-after", "60"], [], env={"ENSEMBLE_TEST_FAULTS": "o-00000:raise"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "member o-00000 failed" in out.stderr + out.stdout
    stats = sim_stats(tmp_path)
    assert all(s["steps"] == 60 for s in stats)               # the simulation ran every step it meant to
    run = RunDirectory(tmp_path / "runs" / "onl")
    records = {r.id: r for r in run.records()[0]}
    assert records["o-00000"].status.value == "failed"
    first = json.loads((run.path / run.ENSEMBLE).read_text())["online"]
    assert first["members_failed"] == 1 and first["simulation_closed"]
    # --resume beside a new simulation: the finished members are kept, numbering goes on
    out = mpmd(tmp_path, ["--generations", "1"], ["--run-dir", str(run.path), "--resume"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    again = {r.id: r for r in run.records()[0]}
    kept = [i for i, r in records.items() if r.ok]
    assert all(again[i].ok for i in kept)
    assert len(again) > len(records)
    second = json.loads((run.path / run.ENSEMBLE).read_text())["online"]
    assert second["generation"] > first["generation"]
    assert any(s["loaded"] for s in sim_stats(tmp_path))


@pytest.mark.long          # make test-long: beside the clean MPMD job above
def test_a_simulation_that_ends_without_close_ends_the_job(tmp_path):
    """Every simulation rank left without ``stream.close()``: the ensemble side waited for their
    goodbye for ever (the job hung until killed). Now the stream closes itself as Python
    exits, says so, and the ensemble side finishes and keeps what it trained."""
    write_config(tmp_path)
    out = mpmd(tmp_path, ["--stop-after", "40", "--no-close"], [], timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ended without stream.close(): closed as Python exits" in out.stderr
    run = RunDirectory(tmp_path / "runs" / "onl")
    assert json.loads((run.path / run.ENSEMBLE).read_text())["online"]["simulation_closed"]


@pytest.mark.long          # make test-long: beside the clean MPMD job above
def test_ctrl_c_on_an_mpmd_job_stops_the_master_as_the_master_and_says_how_to_resume(tmp_path):
    """In an MPMD job the ensemble's master is not COMM_WORLD's rank 0 (the simulation's is):
    on Ctrl-C it took itself for a worker (cut short after its stop limit) and never said the
    resume line. It now leads its own program's stop, says the line, and the run resumes."""
    import os
    import signal
    import time
    write_config(tmp_path)
    cmd = [mpiexec(), "-n", "2", sys.executable, SIM, str(tmp_path / "sim"), "--max-seconds", "120",
           "--generations", "1000", ":", "-n", "3", sys.executable, "-m", "ensemble.run", str(tmp_path / "online.toml")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=importable(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    run = RunDirectory(tmp_path / "runs" / "onl")
    try:
        end = time.monotonic() + 200
        while not (run.path / run.ENSEMBLE).is_file():                # a generation published: mid-run
            assert proc.poll() is None and time.monotonic() < end, "no generation was published"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGINT)                            # Ctrl-C: mpiexec forwards it to every rank
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert f"interrupted; `--resume` continues: the same command with `--run-dir {run.path} --resume`" in err, \
        err[-3000:]
    assert any(json.loads(line).get("event") == "interrupted" for line in (run.path / run.JOURNAL).open())


@pytest.mark.long          # make test-long: beside the clean MPMD job above
def test_a_publish_that_fails_never_stops_the_simulation(tmp_path):
    """A publication that fails for real (the simulation's rank 0 puts a directory where
    ``ensemble.json`` goes once it has loaded generation 1): the ensemble side says so and
    trains on; the simulation keeps what it had, says so, and (rank 0, which put the file
    back once told) loads the generation published after the fault."""
    write_config(tmp_path)
    out = mpmd(tmp_path, ["--break-publish"], [])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = re.search(r"online: publishing generation (\d+) failed \(IsADirectoryError.*the simulation keeps "
                     r"generation (\d+)", out.stderr)
    assert said, out.stderr[-3000:]
    failed = int(said.group(1))
    rank0 = sim_stats(tmp_path)[0]
    assert rank0["publish_failed"] == failed                  # told, and it put the file back
    assert any(f"could not publish generation {failed}" in f and "keeping generation" in f
               for f in rank0["failures"]), rank0["failures"]
    assert rank0["loaded"][0] == 1 and rank0["generation"] >= failed   # the number a failure leaves free is reused
    run = RunDirectory(tmp_path / "runs" / "onl")
    online = json.loads((run.path / run.ENSEMBLE).read_text())["online"]
    assert online["publishes_failed"] >= 1 and online["simulation_closed"]
    assert online["generation"] >= rank0["generation"]
