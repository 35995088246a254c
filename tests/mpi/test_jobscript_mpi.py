"""Generated job scripts run to completion here, through stand-ins for the scheduler.

``srun`` and PALS-style ``mpiexec`` stand-ins record what the script gave them (arguments,
the job's end, the thread limits) and start the ranks with the project's ``mpirun``; an
``sbatch`` stand-in runs the jobs of a chain one after another, each under the time limit
the test gives it (``timeout``: SIGTERM, then SIGKILL, as Slurm does at a time limit). So the
scripts' own logic is exercised (arguments, environment, end time, resume), not just their
syntax. Rehearsal members (they sleep) need no TensorFlow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from ensemble import jobscript
from ensemble.results.journal import read_journal
from tests.conftest import ROOT

pytestmark = pytest.mark.mpi

BASH = shutil.which("bash")
MPIRUN = Path(sys.executable).parent / "mpirun"

#: a launcher stand-in: records the call, then starts the ranks with the project's mpirun.
#: The scheduler's own variables are left out of the ranks' environment, so that MPICH's
#: mpirun does not take itself for a Slurm or PBS launcher.
LAUNCHER = """\
#!{python}
import json, os, sys, time
args = sys.argv[1:]
ranks = None
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if flag.startswith("--ntasks="):
        ranks = flag.split("=", 1)[1]
    elif flag in ("-n", "--ppn"):
        value = args.pop(0)
        ranks = value if flag == "-n" else ranks
seen = ("ENSEMBLE_JOB_END_TIME", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "SLURM_JOB_ID", "PBS_JOBID")
call = {{"launcher": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "time": time.time(),
        "env": {{k: os.environ.get(k) for k in seen}}}}
with open(os.path.join(os.environ["STANDIN_LOG"], "launches.jsonl"), "a") as log:
    log.write(json.dumps(call) + "\\n")
env = {{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}}
os.execve({mpirun!r}, [{mpirun!r}, "-launcher", "fork", "-n", ranks, *args], env)
"""

#: an sbatch stand-in that runs each job at once, to its end, under the next time limit in
#: STANDIN_LIMITS (seconds, 0: none); the chain's next sbatch comes only after, so "afterany"
#: holds. It waits for the killed job's ranks to be gone, as a scheduler frees the nodes.
SBATCH = """\
#!{python}
import json, os, subprocess, sys, time


def running(run_dir):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if run_dir in open(f"/proc/{{pid}}/cmdline", errors="replace").read():
                return True
        except OSError:
            pass
    return False


log_dir = os.environ["STANDIN_LOG"]
log = os.path.join(log_dir, "sbatch.jsonl")
jobs = open(log).read().splitlines() if os.path.exists(log) else []
job_id = str(101 + len(jobs))
dependency = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--dependency=")), None)
limit = [int(x) for x in os.environ["STANDIN_LIMITS"].split(",")][len(jobs)]
cmd = (["timeout", "-s", "TERM", "-k", "5", str(limit)] if limit else []) + ["bash", sys.argv[-1]]
env = {{**os.environ, "SLURM_JOB_ID": job_id, "SLURM_NNODES": "1", "SLURM_SUBMIT_DIR": os.getcwd()}}
started = time.time()
with open(os.path.join(log_dir, f"job-{{job_id}}.out"), "w") as out:
    rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
deadline = time.time() + 20
while running(os.environ["STANDIN_RUN_DIR"]) and time.time() < deadline:
    time.sleep(0.2)
with open(log, "a") as f:
    f.write(json.dumps({{"id": job_id, "dependency": dependency, "rc": rc, "limit": limit, "started": started,
                        "argv": sys.argv[1:]}}) + "\\n")
print(job_id if "--parsable" in sys.argv else f"Submitted batch job {{job_id}}")
"""

QSTAT = """\
#!/bin/bash
echo "Job Id: $2"
echo "    Job_Name = standin"
echo "    Resource_List.walltime = 00:30:00"
"""


def config(folder: Path, members: int, seconds: float) -> Path:
    cfg = folder / "standin.toml"
    cfg.write_text(textwrap.dedent(f"""
        name = "standin"
        [data]
        source = "iris"
        [[architectures]]
        members = {members}
        layers = [{{type = "Dense", units = 4}}]
        [runtime]
        trainer = "rehearsal"        # members sleep: no TensorFlow, seconds per member known
        journal_sync_seconds = 0
        [rehearsal]
        seconds = {seconds}
    """))
    return cfg


def stand_ins(folder: Path) -> Path:
    bin_dir = folder / "standin-bin"
    bin_dir.mkdir()
    tools = {"srun": LAUNCHER, "mpiexec": LAUNCHER, "sbatch": SBATCH, "qstat": QSTAT}
    for name, text in tools.items():
        (bin_dir / name).write_text(text.format(python=sys.executable, mpirun=str(MPIRUN)))
        (bin_dir / name).chmod(0o755)
    return bin_dir


def job_env(folder: Path, **extra: str) -> dict:
    """The job's environment: the stand-ins first on PATH, no scheduler variable of this shell."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "ENSEMBLE_"))}
    return {**keep, "PATH": f"{folder / 'standin-bin'}:{os.environ['PATH']}", "STANDIN_LOG": str(folder),
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def run_script(script: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([BASH, str(script)], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script} did not finish in {timeout} s (hang?)\nstdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")


def finished(run_dir: Path) -> Counter:
    return Counter(r["id"] for r in read_journal(run_dir / "journal.jsonl") if r.get("status") == "ok")


def launches(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "launches.jsonl").read_text().splitlines()]


def generate(folder: Path, monkeypatch, scheduler: str, *args: str) -> Path:
    monkeypatch.chdir(folder)
    assert jobscript.main(["standin.toml", "--scheduler", scheduler, "--nodes", "1", "--gpus-per-node", "3",
                           *args]) == 0
    return folder / f"standin.{scheduler}.sh"


def test_slurm_script_runs_the_ensemble_with_slurms_end_time(tmp_path, monkeypatch):
    config(tmp_path, members=8, seconds=0.3)
    stand_ins(tmp_path)
    script = generate(tmp_path, monkeypatch, "slurm", "--hours", "1")
    end = int(time.time()) + 3600
    done = run_script(script, job_env(tmp_path, SLURM_JOB_ID="7", SLURM_JOB_END_TIME=str(end)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "starting the run in" in done.stdout and "wrote " in done.stdout
    run_dir = tmp_path / "runs" / "standin"
    assert finished(run_dir) == Counter({f"arch0-{i:03d}": 1 for i in range(8)})
    assert (run_dir / "ensemble.json").is_file()
    (call,) = launches(tmp_path)
    assert call["launcher"] == "srun" and call["argv"][:7] == [
        "--nodes=1", "--ntasks=3", "--ntasks-per-node=3", "--cpus-per-task=1", "--cpu-bind=cores",
        "--gpus-per-task=1", "--gpu-bind=closest"]
    assert call["argv"][7:] == [sys.executable, "-m", "ensemble.run", str(tmp_path / "standin.toml"),
                                "--run-dir", str(run_dir)]
    assert call["env"] == {"ENSEMBLE_JOB_END_TIME": str(end), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                           "SLURM_JOB_ID": "7", "PBS_JOBID": None}


@pytest.mark.long          # make test-long: Slurm's script above takes the same path
def test_pbs_script_runs_the_ensemble_with_the_walltime_pbs_holds(tmp_path, monkeypatch):
    config(tmp_path, members=8, seconds=0.3)
    stand_ins(tmp_path)
    script = generate(tmp_path, monkeypatch, "pbs", "--hours", "2", "--account", "prj")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("localhost\n")
    started = time.time()
    done = run_script(script, job_env(tmp_path, PBS_JOBID="42.pbs01", PBS_NODEFILE=str(nodefile),
                                      PBS_O_WORKDIR=str(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = tmp_path / "runs" / "standin"
    assert finished(run_dir) == Counter({f"arch0-{i:03d}": 1 for i in range(8)})
    (call,) = launches(tmp_path)
    assert call["launcher"] == "mpiexec"
    assert call["argv"][:6] == ["-n", "3", "--ppn", "3", "--depth=1", "--cpu-bind=depth"]
    assert call["env"]["PBS_JOBID"] == "42.pbs01"
    end = int(call["env"]["ENSEMBLE_JOB_END_TIME"])
    assert int(started) <= end - 1800 <= call["time"]     # the script's start + qstat's walltime, not the 2 h


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_a_chain_killed_by_its_time_limit_continues_and_trains_every_member_once(tmp_path, monkeypatch):
    members = 20
    config(tmp_path, members=members, seconds=1.0)       # 10 s of training on 2 workers, cut at 9 s
    stand_ins(tmp_path)
    script = generate(tmp_path, monkeypatch, "slurm", "--hours", str(1 / 60), "--chain", "3")
    submit = script.with_name("standin.slurm.submit.sh")
    assert script.is_file() and submit.is_file()          # the job script and the chain that submits it
    run_dir = tmp_path / "runs" / "standin"
    env = job_env(tmp_path, STANDIN_LIMITS="9,0,0", STANDIN_RUN_DIR=str(run_dir))
    done = run_script(submit, env, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = [json.loads(line) for line in (tmp_path / "sbatch.jsonl").read_text().splitlines()]
    outputs = [(tmp_path / f"job-{job['id']}.out").read_text() for job in jobs]
    assert [job["dependency"] for job in jobs] == [None, "afterany:101", "afterany:102"], done.stdout
    assert [job["rc"] for job in jobs] == [124, 0, 0], outputs     # the first was killed at its limit
    calls = launches(tmp_path)
    assert len(calls) == 3 and [c["argv"][-1] for c in calls] == [str(run_dir), "--resume", "--resume"]
    for job, call in zip(jobs, calls):                    # no Slurm end here: the script's start + 1 minute
        assert int(job["started"]) <= int(call["env"]["ENSEMBLE_JOB_END_TIME"]) - 60 <= call["time"]

    records = [r for r in read_journal(run_dir / "journal.jsonl") if r.get("status") == "ok"]
    before = int(outputs[1].split("resuming with ")[1].split()[0])
    assert 0 < before < members, outputs                  # the kill came mid-run
    assert "continuing the run in" in outputs[1] and "continuing the run in" in outputs[2]
    assert Counter(r["id"] for r in records) == Counter({f"arch0-{i:03d}": 1 for i in range(members)})
    assert f"resuming with {members} finished" in outputs[2]          # the last link trained nothing
    assert (run_dir / "ensemble.json").is_file()


def test_a_malformed_job_end_stops_every_rank_at_once_with_the_variable_named(tmp_path):
    from tests.conftest import run_mpi
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[architectures]]\nlayers = [{type = "Dense", units = 4}]\n[runtime]\ntrainer = "rehearsal"\n')
    proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(tmp_path / "run")], timeout=120,
                   env={"ENSEMBLE_JOB_END_TIME": "tomorrow"})
    assert proc.returncode == 2 and "ENSEMBLE_JOB_END_TIME" in proc.stderr + proc.stdout
    assert not (tmp_path / "run" / "journal.jsonl").exists()
