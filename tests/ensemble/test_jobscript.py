"""``python -m ensemble.jobscript``: each scheduler's job script and chain, checked as text, by
``shellcheck``, and run by bash against stand-ins for the scheduler's tools (no MPI here:
tests/mpi/test_jobscript_mpi.py runs real ranks); and ``runtime.scheduler.job_end_time``."""

from __future__ import annotations

import calendar
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ensemble import jobscript
from ensemble.runtime.scheduler import job_end_time

SCHEDULERS = sorted(jobscript.SCHEDULERS)
SHELLCHECK = shutil.which("shellcheck")
BASH = shutil.which("bash")


def write_config(folder: Path, runtime: str = "", name: str = "tiny") -> Path:
    cfg = folder / "tiny.toml"
    cfg.write_text(textwrap.dedent(f"""
        name = "{name}"
        [data]
        source = "iris"
        [[architectures]]
        members = 4
        layers = [{{type = "Dense", units = 4}}]
        [runtime]
        trainer = "rehearsal"
    """) + textwrap.dedent(runtime))
    return cfg


def generate(folder: Path, monkeypatch, *args: str, runtime: str = "") -> tuple[int, Path]:
    """Run ``ensemble.jobscript`` in ``folder``; (exit code, the folder)."""
    cfg = write_config(folder, runtime)
    monkeypatch.chdir(folder)
    return jobscript.main([cfg.name, *args]), folder


# --- job_end_time ---------------------------------------------------------------------------

def test_job_end_time_prefers_ours_then_slurms():
    assert job_end_time({"ENSEMBLE_JOB_END_TIME": "2000000000", "SLURM_JOB_END_TIME": "1900000000"}) == 2e9
    assert job_end_time({"SLURM_JOB_END_TIME": "1900000000"}) == 1.9e9
    assert job_end_time({"ENSEMBLE_JOB_END_TIME": " 1700000000.5\n"}) == 1700000000.5
    assert job_end_time({}) is None
    assert job_end_time({"ENSEMBLE_JOB_END_TIME": ""}) is None          # empty: as if unset


@pytest.mark.parametrize("value", ["Mon 2 Jan", "0", "-5", "nan", "inf"])
def test_a_bad_end_time_of_ours_is_an_error_naming_the_variable(value):
    with pytest.raises(ValueError, match=r"ENSEMBLE_JOB_END_TIME must be the job's end in UNIX seconds"):
        job_end_time({"ENSEMBLE_JOB_END_TIME": value, "SLURM_JOB_END_TIME": "1900000000"})


@pytest.mark.parametrize("value", ["", "N/A", "0", "-1", "inf"])
def test_an_odd_slurm_end_time_means_no_end(value):
    assert job_end_time({"SLURM_JOB_END_TIME": value}) is None


def test_job_end_time_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    monkeypatch.setenv("ENSEMBLE_JOB_END_TIME", "1800000000")
    assert job_end_time() == 1.8e9


# --- rendering --------------------------------------------------------------------------------

LAUNCH = {"slurm": "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=7 --cpu-bind=cores "
                   "--gpus-per-task=1 --gpu-bind=closest \\",
          "pbs": "mpiexec -n 8 --ppn 4 --depth=7 --cpu-bind=depth \\",
          "lsf": "jsrun -n 8 -r 4 -a 1 -c 7 -g 1 -b packed:7 \\",
          "flux": "flux run -N 2 -n 8 -c 7 -g 1 -o gpu-affinity=per-task -o cpu-affinity=per-task \\"}
DIRECTIVES = {"slurm": ["#SBATCH --job-name=tiny", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
                        "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=7", "#SBATCH --time=1:30:00",
                        "#SBATCH --output=tiny-%j.out", "#SBATCH --account=prj", "#SBATCH --partition=batch",
                        "#SBATCH --constraint=gpu"],
              "pbs": ["#PBS -N tiny", "#PBS -l select=2", "#PBS -l place=scatter", "#PBS -l walltime=1:30:00",
                      "#PBS -j oe", "#PBS -A prj", "#PBS -q batch", "#PBS --constraint=gpu"],
              "lsf": ["#BSUB -J tiny", "#BSUB -nnodes 2", "#BSUB -W 1:30", "#BSUB -o tiny.%J.out", "#BSUB -P prj",
                      "#BSUB -q batch", "#BSUB --constraint=gpu"],
              "flux": ["#flux: --job-name=tiny", "#flux: -N 2", "#flux: --exclusive", "#flux: --time-limit=90m",
                       "#flux: --output=tiny-{{id}}.out", "#flux: --bank=prj", "#flux: --queue=batch",
                       "#flux: --constraint=gpu"]}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_each_scheduler_gets_its_directives_launcher_and_the_run(scheduler, tmp_path, monkeypatch, capsys):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", scheduler, "--nodes", "2", "--gpus-per-node", "4",
                          "--hours", "1.5", "--cpus-per-rank", "7", "--account", "prj", "--queue", "batch",
                          "--setup", "module load cray-mpich", "--directive=--constraint=gpu")
    assert code == 0
    script = here / f"tiny.{scheduler}.sh"
    text = script.read_text()
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash" and lines[1:1 + len(DIRECTIVES[scheduler])] == DIRECTIVES[scheduler]
    assert LAUNCH[scheduler] in lines
    assert lines[-1] == '    "$PYTHON" -m ensemble.run "$CONFIG" --run-dir "$RUN_DIR" ${RESUME:+"$RESUME"}'
    assert f"CONFIG={here / 'tiny.toml'}" in lines and f"RUN_DIR={here / 'runs' / 'tiny'}" in lines
    assert "WALLTIME_SECONDS=5400    # the time limit asked for above" in lines
    assert "module load cray-mpich" in lines and f"PYTHON={sys.executable}" in lines
    assert "export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 " \
           "TF_NUM_INTEROP_THREADS=1" in lines
    assert "2 node(s) x 4 GPU(s): 8 ranks" in text and "Rank 0, the master, shares node 0" in text
    assert "it trains members on its GPU too" in text
    assert os.access(script, os.X_OK) and not (here / f"tiny.{scheduler}.submit.sh").exists()
    out = capsys.readouterr().out
    submit = jobscript.SCHEDULERS[scheduler].submit_once.format(f"tiny.{scheduler}.sh")
    assert f"submit:  {submit}" in out and "--check" in out and "8 ranks, 1:30:00 each job" in out


def test_ranks_sharing_a_gpu_leave_the_gpu_binding_to_the_run(tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "2", "--gpus-per-node", "4",
                          runtime="ranks_per_gpu = 2\nthreads = 3\n")
    assert code == 0
    text = (here / "tiny.slurm.sh").read_text()
    assert "srun --nodes=2 --ntasks=16 --ntasks-per-node=8 --cpus-per-task=3 --cpu-bind=cores \\" in text
    assert "#SBATCH --gpus-per-node=4" in text and "--gpus-per-task" not in text
    assert "export OMP_NUM_THREADS=3 " in text and "2 per GPU (runtime.ranks_per_gpu)" in text
    job = jobscript.Job(scheduler="lsf", name="x", config="/c.toml", run_dir="/r", workdir="/", nodes=2,
                        gpus_per_node=6, ranks_per_gpu=2, threads=3, cpus_per_rank=3, minutes=60, python="/p")
    assert jobscript.lsf_launcher(job) == ["jsrun", "-n", "12", "-r", "6", "-a", "2", "-c", "6", "-g", "1",
                                           "-b", "packed:3"]
    assert jobscript.flux_launcher(job)[-6:] == ["-c", "3", "-o", "gpu-affinity=off", "-o", "cpu-affinity=per-task"]
    assert jobscript.pbs_launcher(job)[:5] == ["mpiexec", "-n", "24", "--ppn", "12"]


CPU_LAUNCH = {"slurm": "srun --nodes=2 --ntasks=32 --ntasks-per-node=16 --cpus-per-task=3 --cpu-bind=cores \\",
              "pbs": "mpiexec -n 32 --ppn 16 --depth=3 --cpu-bind=depth \\",
              "lsf": "jsrun -n 32 -r 16 -a 1 -c 3 -g 0 -b packed:3 \\",
              "flux": "flux run -N 2 -n 32 -c 3 -o cpu-affinity=per-task \\"}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_cpu_only_nodes_get_their_ranks_and_no_gpu_request(scheduler, tmp_path, monkeypatch, capsys):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", scheduler, "--nodes", "2", "--gpus-per-node", "0",
                          "--ranks-per-node", "16", "--stage-env", "/dev/shm/env", runtime="threads = 3\n")
    assert code == 0
    text = (here / f"tiny.{scheduler}.sh").read_text()
    lines = text.splitlines()
    assert CPU_LAUNCH[scheduler] in lines
    assert "gpu" not in "\n".join(line for line in lines if not line.startswith("#")).replace("gpu-affinity", "")
    assert "on 2 CPU-only node(s) x 16 rank(s): 32 ranks," in text and "no GPUs, 3 core(s) each" in text
    assert "on CPU-only nodes it trains nothing" in text and "trains members" not in text   # it said it did
    staging = next(line for line in lines if line.startswith(CPU_LAUNCH[scheduler].split()[0]))
    assert "32" not in staging and "16" not in staging    # the staging launch: one rank a node
    if scheduler == "slurm":
        assert "#SBATCH --ntasks-per-node=16" in lines and not any(line.startswith("#SBATCH --gpus") for line in lines)
    assert "2 node(s) x 16 ranks = 32 ranks" in capsys.readouterr().out


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "lsf", "flux"])
def test_an_even_group_size_leaves_slots_of_the_last_node_empty(tmp_path, monkeypatch, capsys, scheduler):
    """One rank per GPU leaves N x G - 1 workers, which group_size = 2 never divides: every job
    script was refused ("choose --nodes and --gpus-per-node so that it does", which none could)."""
    code, text = generate(tmp_path, monkeypatch, "--scheduler", scheduler, "--nodes", "4", "--gpus-per-node", "4",
                          runtime="group_size = 4\n")
    assert code == 0
    script = next(text.glob("*.sh")).read_text()
    assert "13 ranks" in script and "(3 slot(s) of the last node left empty" in script
    launch = {"slurm": "--ntasks=13 ", "pbs": "mpiexec -n 13 ", "lsf": "jsrun -n 13 ", "flux": " -n 13 "}[scheduler]
    assert launch in script
    assert "4 node(s) x 4 ranks less 3 (runtime.group_size) = 13 ranks" in capsys.readouterr().out
    code, _ = generate(tmp_path, monkeypatch, "--scheduler", scheduler, "--nodes", "1", "--gpus-per-node", "4",
                       runtime="group_size = 4\n")
    assert code == 2 and "needs at least 4 worker ranks beside the master" in capsys.readouterr().err


def test_another_python_is_used_as_given(tmp_path, monkeypatch):
    python = tmp_path / "env" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("")
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "pbs", "--nodes", "1", "--gpus-per-node", "4",
                          "--python", "env/bin/python3", "--run-dir", "elsewhere", "--out", "job.sh")
    assert code == 0
    text = (here / "job.sh").read_text()
    assert f"PYTHON={python}" in text and f"RUN_DIR={here / 'elsewhere'}" in text


def test_a_bare_python_name_is_found_on_path_as_a_shell_finds_it(tmp_path, monkeypatch):
    import shutil
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4",
                          "--python", "python3")
    assert code == 0 and f"PYTHON={shutil.which('python3')}" in (here / "tiny.slurm.sh").read_text()


def test_a_python_the_setup_lines_make_is_left_for_the_jobs_shell(tmp_path, monkeypatch):
    """'$CONDA_PREFIX/bin/python' became '<here>/$CONDA_PREFIX/bin/python', single-quoted (never
    found), and a bare name the login shell's python, not the environment --setup activates."""
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4",
                          "--setup", "conda activate /lus/proj/env", "--python", "$CONDA_PREFIX/bin/python")
    assert code == 0 and 'PYTHON="$CONDA_PREFIX/bin/python"\n' in (here / "tiny.slurm.sh").read_text()
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4",
                          "--setup", "conda activate /lus/proj/env", "--python", "python3")
    assert code == 0 and "PYTHON=python3\n" in (here / "tiny.slurm.sh").read_text()


def test_a_run_already_in_the_run_directory_is_checked_now(tmp_path, monkeypatch, capsys):
    """A test run left in runs/tiny: the script resumed it, and with the members raised every job
    of a chain stopped after its queue wait ("the config differs"), unwarned."""
    from ensemble.config import dump_toml, load_config
    cfg = write_config(tmp_path)
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    (run / "journal.jsonl").write_text("")
    (run / "config.toml").write_text(dump_toml(load_config(cfg).to_dict()))
    code, _ = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4")
    out = capsys.readouterr().out
    assert code == 0 and "already holds a run of this config: the first job continues it (--resume)" in out
    text = cfg.read_text().replace("members = 4", "members = 400")
    (run / "config.toml").write_text(dump_toml(load_config(cfg).to_dict()))     # the run of 4 members
    cfg.write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "write_config", lambda folder, runtime="": cfg)
    code, _ = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4")
    err = capsys.readouterr().err
    assert code == 2 and "already holds a run made with other settings" in err and "members" in err
    assert "--run-dir" in err


def test_a_python_the_job_makes_itself_need_not_exist_yet(tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4",
                          "--python", "/tmp/env/bin/python",
                          "--setup", "srun --ntasks-per-node=1 tar xf env.tar -C /tmp")
    text = (here / "tiny.slurm.sh").read_text()
    assert code == 0 and "PYTHON=/tmp/env/bin/python" in text
    assert text.index("srun --ntasks-per-node=1 tar xf") < text.index("PYTHON=")


def test_a_name_is_made_safe_for_directives_and_file_names(tmp_path, monkeypatch):
    write_config(tmp_path, name="my run (v2)")
    monkeypatch.chdir(tmp_path)
    assert jobscript.main(["tiny.toml", "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "1"]) == 0
    text = (tmp_path / "my_run__v2_.slurm.sh").read_text()
    assert "#SBATCH --job-name=my_run__v2_" in text and f"RUN_DIR='{tmp_path}/runs/my run (v2)'" in text


@pytest.mark.parametrize("args, message", [
    (["--nodes", "0"], "--nodes must be a positive integer, but got 0"),
    (["--gpus-per-node", "-1"], "--gpus-per-node must be 0 (CPU-only nodes) or more, but got -1"),
    (["--gpus-per-node", "0"], "CPU-only nodes (--gpus-per-node 0) need --ranks-per-node R"),
    (["--ranks-per-node", "8"], "--ranks-per-node is for CPU-only nodes (--gpus-per-node 0)"),
    (["--gpus-per-node", "0", "--ranks-per-node", "0"], "--ranks-per-node must be a positive integer, but got 0"),
    (["--chain", "0"], "--chain must be a positive integer, but got 0"),
    (["--hours", "0.001"], "--hours must give the job at least a minute, but got 4 s"),
    (["--hours", "0:30"], "MM:SS is not taken"),
    (["--hours", "1:61:00"], "minutes and seconds must be below 60"),
    (["--directive", "#PBS -l filesystems=home:eagle"], "is a #PBS line, but the script is for slurm"),
    (["--cpus-per-rank", "1"], "--cpus-per-rank 1 is fewer than the config's `runtime.threads` = 2"),
    (["--python", "no/such/python"], "--python 'no/such/python' does not exist"),
    (["--hours", "2h"], "expected hours (1.5) or a walltime (1:30:00, 1-00:00:00), got '2h'"),
    (["--directive", "constraint=gpu"], "--directive 'constraint=gpu' must be one scheduler option, beginning"),
])
def test_bad_requests_fail_before_anything_is_written(args, message, tmp_path, monkeypatch, capsys):
    base = {"--nodes": "2", "--gpus-per-node": "4"}
    base.update(dict(zip(args[::2], args[1::2])))
    try:
        code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", *[x for kv in base.items() for x in kv],
                              runtime="threads = 2\n")
    except SystemExit as exc:                 # argparse's usage error
        code, here = exc.code, tmp_path
    assert code == jobscript.EXIT_USAGE and message in capsys.readouterr().err
    assert not list(here.glob("*.sh"))


def test_a_directive_given_with_its_prefix_is_written_once(tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4",
                          "--directive", "#SBATCH --qos=regular")
    text = (here / "tiny.slurm.sh").read_text()
    assert code == 0 and "#SBATCH --qos=regular\n" in text and "#SBATCH #SBATCH" not in text


@pytest.mark.parametrize("given, walltime", [("1.5", "1:30:00"), ("2:00:00", "2:00:00"), ("0:45:00", "0:45:00"),
                                             ("1-00:00:00", "24:00:00"), ("1-2", "26:00:00"), ("0-1:30", "1:30:00")])
def test_hours_take_a_schedulers_walltime_too(tmp_path, monkeypatch, given, walltime):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4",
                          "--hours", given)
    assert code == 0 and f"#SBATCH --time={walltime}" in (here / "tiny.slurm.sh").read_text()


def test_missing_data_is_said_now_not_after_the_queue_wait(tmp_path, monkeypatch, capsys):
    cfg = write_config(tmp_path)
    cfg.write_text(cfg.read_text().replace('source = "iris"', 'source = "/lus/project/data/train.h5"'))
    monkeypatch.setattr(sys.modules[__name__], "write_config", lambda folder, runtime="": cfg)
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4")
    assert code == 2 and "`data.source` '/lus/project/data/train.h5' does not exist" in capsys.readouterr().err
    assert not list(here.glob("*.sh"))
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "4",
                          "--setup", "tar xf /lus/project/data.tar -C /lus/project/data")    # the job makes it
    said = capsys.readouterr().out
    assert code == 0 and "does not exist: the job's --setup lines or environment must make it" in said


def test_a_config_that_does_not_validate_or_exist_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert jobscript.main(["missing.toml", "--scheduler", "pbs", "--nodes", "1", "--gpus-per-node", "4"]) == 2
    assert "config error in missing.toml: config file 'missing.toml' does not exist" in capsys.readouterr().err
    write_config(tmp_path, runtime="group_size = 4\n")
    assert jobscript.main(["tiny.toml", "--scheduler", "pbs", "--nodes", "1", "--gpus-per-node", "4"]) == 2
    assert "`runtime.group_size` = 4 needs at least 4 worker ranks" in capsys.readouterr().err
    assert jobscript.main(["tiny.toml", "--scheduler", "pbs", "--nodes", "1", "--gpus-per-node", "5"]) == 0
    (tmp_path / "tiny.toml").write_text("[train]\nepocs = 3\n")
    assert jobscript.main(["tiny.toml", "--scheduler", "pbs", "--nodes", "1", "--gpus-per-node", "3"]) == 2
    assert "unknown setting `train.epocs`" in capsys.readouterr().err


def test_an_unknown_scheduler_is_refused_with_the_choices(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exc:
        generate(tmp_path, monkeypatch, "--scheduler", "sge", "--nodes", "1", "--gpus-per-node", "1")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "invalid choice: 'sge'" in err and "slurm" in err and "flux" in err


# --- shellcheck ---------------------------------------------------------------------------------

@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (apt-get install shellcheck); "
                                                "the generated scripts are not linted here")
@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("runtime", ["", "ranks_per_gpu = 2\n"])
def test_every_generated_script_passes_shellcheck(scheduler, runtime, tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", scheduler, "--nodes", "3", "--gpus-per-node", "4",
                          "--chain", "3", "--account", "a b", "--setup", "module load x", runtime=runtime)
    assert code == 0
    scripts = [here / f"tiny.{scheduler}.sh", here / f"tiny.{scheduler}.submit.sh"]
    done = subprocess.run([SHELLCHECK, "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the scripts' shell logic, against stand-ins for the scheduler's tools ----------------------

def fake_tools(folder: Path, tools: dict[str, str]) -> dict:
    """A bin folder of bash stand-ins and an environment whose PATH holds only it and the
    system's basics (no real squeue, qstat, bjobs or flux can answer)."""
    bin_dir = folder / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + textwrap.dedent(body))
        (bin_dir / name).chmod(0o755)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "LSB_", "FLUX_", "ENSEMBLE_"))}
    return {**keep, "PATH": f"{bin_dir}:/usr/bin:/bin", "TZ": "UTC", "FAKE_OUT": str(folder)}


RECORD = """\
{ printf '%s\\n' "$*"; echo "END=$ENSEMBLE_JOB_END_TIME"; echo "OMP=$OMP_NUM_THREADS"; } > "$FAKE_OUT/launch.txt"
"""
LAUNCHERS = {"slurm": "srun", "pbs": "mpiexec", "lsf": "jsrun"}
FLUX = """\
if [[ "$1 $2" == "job timeleft" ]]; then
    [[ -n "${FAKE_TIMELEFT:-}" ]] || { echo "flux-job: not in a Flux job" >&2; exit 1; }
    echo "$FAKE_TIMELEFT"
    exit 0
fi
shift
""" + RECORD

UTC_2031 = calendar.timegm((2031, 1, 2, 3, 4, 5))


@pytest.mark.parametrize("scheduler, tools, env, expected", [
    ("slurm", {}, {"SLURM_JOB_END_TIME": "2000000000"}, 2_000_000_000),
    ("slurm", {"squeue": 'echo "2031-01-02T03:04:05"'}, {"SLURM_JOB_ID": "7"}, UTC_2031),
    ("slurm", {"squeue": "echo N/A"}, {}, "start+5400"),
    ("slurm", {}, {}, "start+5400"),
    ("pbs", {"qstat": 'echo "Job Id: 1.pbs"; echo "    Resource_List.walltime = 00:30:00"; echo "    x = 1"'},
     {"PBS_JOBID": "1.pbs"}, "start+1800"),
    ("pbs", {"qstat": "exit 1"}, {}, "start+5400"),
    ("lsf", {"bjobs": 'echo "00:45:00   "'}, {"LSB_JOBID": "3"}, "start+2700"),
    ("lsf", {}, {}, "start+5400"),
    ("flux", {}, {"FAKE_TIMELEFT": "600"}, "start+600"),
    ("flux", {}, {"FAKE_TIMELEFT": "4294967295"}, "start+5400"),
    ("flux", {}, {}, "start+5400"),
])
def test_the_job_end_comes_from_the_scheduler_else_the_scripts_start_and_walltime(
        scheduler, tools, env, expected, tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", scheduler, "--nodes", "1", "--gpus-per-node", "2",
                          "--hours", "1.5")
    assert code == 0
    launcher = {"flux": FLUX}.get(scheduler, RECORD)
    full_env = {**fake_tools(here, {LAUNCHERS.get(scheduler, "flux"): launcher, **tools}), **env}
    t0 = time.time()
    done = subprocess.run([BASH, str(here / f"tiny.{scheduler}.sh")], env=full_env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    args, end, omp = (here / "launch.txt").read_text().splitlines()
    assert omp == "OMP=1" and args.endswith(f"-m ensemble.run {here / 'tiny.toml'} --run-dir {here / 'runs/tiny'}")
    end = int(end.removeprefix("END="))
    if isinstance(expected, str):
        assert abs(end - (t0 + int(expected.removeprefix("start+")))) <= 3
    else:
        assert end == expected
    assert "starting the run in" in done.stdout


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_script_resumes_once_the_run_directory_holds_a_journal(scheduler, tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", scheduler, "--nodes", "1", "--gpus-per-node", "2")
    assert code == 0
    env = fake_tools(here, {LAUNCHERS.get(scheduler, "flux"): {"flux": FLUX}.get(scheduler, RECORD)})
    run = [BASH, str(here / f"tiny.{scheduler}.sh")]
    first = subprocess.run(run, env=env, capture_output=True, text=True, timeout=30)
    assert first.returncode == 0 and not (here / "launch.txt").read_text().splitlines()[0].endswith("--resume")
    (here / "runs" / "tiny").mkdir(parents=True)
    (here / "runs" / "tiny" / "journal.jsonl").write_text("")
    again = subprocess.run(run, env=env, capture_output=True, text=True, timeout=30)
    assert again.returncode == 0 and (here / "launch.txt").read_text().splitlines()[0].endswith(
        f"--run-dir {here / 'runs/tiny'} --resume")
    assert "continuing the run in" in again.stdout


def test_the_scripts_exit_status_is_the_runs(tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "2")
    env = fake_tools(here, {"srun": "exit 3\n"})
    done = subprocess.run([BASH, str(here / "tiny.slurm.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert code == 0 and done.returncode == 3


#: each scheduler's submit command as a stand-in: logs its arguments (and, for bsub, the
#: script it read), prints a job id in the scheduler's own form
SUBMITTERS = {
    "slurm": ("sbatch", 'n=$(wc -l < "$FAKE_OUT/submits.txt" 2>/dev/null || echo 0)\n'
                        'echo "$*" >> "$FAKE_OUT/submits.txt"\necho "$((100 + n));frontier"\n',
              ["--parsable {s}", "--parsable --dependency=afterany:100 {s}",
               "--parsable --dependency=afterany:101 {s}"]),
    "pbs": ("qsub", 'n=$(wc -l < "$FAKE_OUT/submits.txt" 2>/dev/null || echo 0)\n'
                    'echo "$*" >> "$FAKE_OUT/submits.txt"\necho "$((100 + n)).polaris-pbs-01"\n',
            ["{s}", "-W depend=afterany:100.polaris-pbs-01 {s}", "-W depend=afterany:101.polaris-pbs-01 {s}"]),
    "lsf": ("bsub", 'n=$(wc -l < "$FAKE_OUT/submits.txt" 2>/dev/null || echo 0)\n'
                    'echo "${*:+$* }< $(grep -c "^#BSUB" -)" >> "$FAKE_OUT/submits.txt"\n'
                    'echo "Job <$((100 + n))> is submitted to queue <batch>."\n',
            ["< 4", "-w ended(100) < 4", "-w ended(101) < 4"]),
    "flux": ("flux", 'n=$(wc -l < "$FAKE_OUT/submits.txt" 2>/dev/null || echo 0)\n'
                     'echo "$*" >> "$FAKE_OUT/submits.txt"\necho "ƒ$((100 + n))Zq"\n',
             ["batch {s}", "batch --dependency=afterany:ƒ100Zq {s}", "batch --dependency=afterany:ƒ101Zq {s}"]),
}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_chain_submits_each_job_after_the_one_before(scheduler, tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", scheduler, "--nodes", "1", "--gpus-per-node", "2",
                          "--chain", "3")
    assert code == 0
    tool, body, expected = SUBMITTERS[scheduler]
    chain = here / f"tiny.{scheduler}.submit.sh"
    done = subprocess.run([BASH, str(chain)], env=fake_tools(here, {tool: body}), capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    script = str(here / f"tiny.{scheduler}.sh")
    assert (here / "submits.txt").read_text().splitlines() == [e.format(s=script) for e in expected]
    assert done.stdout.splitlines()[-1].startswith("job 3 of 3: ") and "(starts after " in done.stdout


def test_the_chain_stops_when_the_scheduler_prints_no_id(tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "lsf", "--nodes", "1", "--gpus-per-node", "2",
                          "--chain", "2")
    done = subprocess.run([BASH, str(here / "tiny.lsf.submit.sh")],
                          env=fake_tools(here, {"bsub": "cat > /dev/null; echo 'Request aborted by esub.'\n"}),
                          capture_output=True, text=True, timeout=30)
    assert code == 0 and done.returncode == 1
    assert "job 1 of 2: the scheduler printed no job id; stopping here" in done.stderr


def test_a_staged_environment_is_copied_first_and_the_run_starts_from_it(tmp_path, monkeypatch):
    code, here = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "2", "--gpus-per-node", "2",
                          "--stage-env", "$TMPDIR/env")
    assert code == 0
    env = {**fake_tools(here, {"srun": 'printf "%s\\n" "$*" >> "$FAKE_OUT/launches.txt"\n'}), "TMPDIR": "/node/tmp"}
    done = subprocess.run([BASH, str(here / "tiny.slurm.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    staging, run = (here / "launches.txt").read_text().splitlines()
    script = Path(jobscript.__file__).resolve().parent / "runtime" / "stage.py"
    assert staging == (f"--nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=1 --cpu-bind=cores --gpus-per-task=1 "
                       f"--gpu-bind=closest {sys.executable} -S -P {script} --to /node/tmp/env")   # one per node
    assert run == (f"--nodes=2 --ntasks=4 --ntasks-per-node=2 --cpus-per-task=1 --cpu-bind=cores --gpus-per-task=1 "
                   f"--gpu-bind=closest /node/tmp/env/python -m ensemble.run {here / 'tiny.toml'} "
                   f"--run-dir {here / 'runs' / 'tiny'}")
    env.pop("TMPDIR")                       # a variable the job lacks: it staged to /env (and ran from there)
    (here / "launches.txt").unlink()
    done = subprocess.run([BASH, str(here / "tiny.slurm.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "--stage-env $TMPDIR/env: $TMPDIR is not set in this job" in done.stderr
    assert not (here / "launches.txt").exists()


def test_a_stage_env_with_a_double_quote_is_refused(tmp_path, monkeypatch, capsys):
    code, _ = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "2",
                       "--stage-env", 'a"b')
    assert code == 2 and "--stage-env" in capsys.readouterr().err


def test_the_masters_part_is_said_as_the_mode_and_settings_decide_it():
    """Every script said the master trains members too, also in mode pbt (it never does) and
    on CPU-only nodes ("auto" does not there)."""
    from ensemble.config import resolve_config
    layers = [{"type": "Dense", "units": 4}]
    pbt = resolve_config({"mode": "pbt", "architectures": [{"layers": layers}]})
    plain = resolve_config({"architectures": [{"layers": layers}]})
    assert "trains nothing in mode 'pbt'" in jobscript.master_trains_text(pbt, 4)
    assert "trains members on its GPU too" in jobscript.master_trains_text(plain, 4)
    assert "CPU-only nodes it trains nothing" in jobscript.master_trains_text(plain, 0)
    grouped = plain.replace(runtime=plain.runtime.replace(group_size=2))
    assert "group_size > 1" in jobscript.master_trains_text(grouped, 4)


def test_a_python_on_the_mpich_wheel_is_warned_of(tmp_path, monkeypatch, capsys):
    """This venv's mpi4py runs on the MPICH wheel from PyPI: a job script with it would start
    every rank alone under srun; it was written without a word."""
    import importlib.metadata
    try:
        wheel = importlib.metadata.version("mpich")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("this environment has no MPICH wheel")
    assert jobscript.mpich_wheel(sys.executable) == wheel
    code, _ = generate(tmp_path, monkeypatch, "--scheduler", "slurm", "--nodes", "1", "--gpus-per-node", "1")
    assert code == 0 and "runs on the MPICH wheel from PyPI" in capsys.readouterr().err
    assert jobscript.mpich_wheel(str(tmp_path / "no-python")) is None
