"""``python -m ensemble.jobscript --scheduler {slurm,pbs,lsf,flux} --nodes N --gpus-per-node G
[--hours H] CONFIG [--chain K]``: write a ready job script for a cluster's batch scheduler.
CPU-only nodes: ``--gpus-per-node 0 --ranks-per-node R``.

The script asks for N whole nodes for H hours and starts ``python -m ensemble.run`` with one
rank per GPU (``runtime.ranks_per_gpu`` ranks per GPU when the config says so) through the
scheduler's own launcher: ``srun`` (Slurm: Frontier, Perlmutter), PALS ``mpiexec`` (PBS:
Polaris, Aurora), ``jsrun`` (LSF: Summit) or ``flux run`` (Flux: El Capitan), each rank
bound to its cores and, where the launcher can, its GPU (elsewhere the run binds a GPU by
node-local rank itself, ``runtime.env``).

- **Ranks**: N x G in all. Rank 0, the master, shares node 0 with the workers and gets a
  GPU like them, and trains members on it (``runtime.master_trains = "auto"``), so no GPU
  idles. An extra master rank would need cores and a GPU outside the one-GPU-per-rank
  binding, for a process that only hands out specs and appends to the journal.
- **Resume**: the script passes ``--resume`` when the run directory already holds a
  journal, so the first job starts the run and submitting the same script again continues
  it. On a finished run, ``--resume`` trains nothing: it selects the ensemble again and ends.
- **Time limit**: the script exports ``ENSEMBLE_JOB_END_TIME`` (UNIX seconds), read by
  ``runtime.scheduler.job_end_time``, from what its scheduler tells a job (see each
  ``*_END_TIME`` below), so the master stops handing out members in time to write the
  ensemble before the job is killed.
- ``--chain K`` also writes ``<script>.submit.sh``, which submits the script K times, each
  job waiting for the one before to end however it ended (afterany).

Pure text rendering (``render_job_script``, ``render_submit_script``) plus a CLI; nothing here
talks to a scheduler.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ensemble.results.rundir import RunDirectory

EXIT_USAGE = 2
#: the cores for applications per GPU on the machines docs/hpc.md lists
CORES_PER_GPU = "7 on Frontier and Summit, 8 on Polaris, about 16 on Aurora, 32 on Perlmutter (hardware threads)"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                    "TF_NUM_INTEROP_THREADS")


class JobScriptError(ValueError):
    """The job script cannot be written as asked; the message says what to change."""


@dataclass(frozen=True)
class Job:
    """What one job script holds. Paths are absolute, so the script runs from any folder."""
    scheduler: str
    name: str                  # job name and file stem: the config's name, safe in a directive
    config: str
    run_dir: str
    workdir: str               # the job works here, as the run would have from the command line
    nodes: int
    gpus_per_node: int
    ranks_per_gpu: int         # runtime.ranks_per_gpu
    threads: int               # runtime.threads
    cpus_per_rank: int
    minutes: int
    python: str
    account: str | None = None
    queue: str | None = None
    setup: tuple[str, ...] = ()
    directives: tuple[str, ...] = ()
    command: str = ""          # the ensemble.jobscript command line that wrote the script
    stage_env: str | None = None    # node-local folder the environment is copied to first (runtime/stage.py)
    cpu_ranks_per_node: int = 0     # CPU-only nodes (gpus_per_node = 0): --ranks-per-node
    master_trains: str = ""         # why the master trains members or not, for the script's comment
    left_out: int = 0               # rank slots (GPUs) launched without a rank, so that runtime.group_size
                                    # divides the workers (``group_fit``)
    continues: str | None = None    # the run already in run_dir the first job continues (``existing_run``)
    data_note: str | None = None    # a data path not here that the job itself may make (``missing_data``)

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node * self.ranks_per_gpu if self.gpus_per_node else self.cpu_ranks_per_node

    @property
    def binds_gpus(self) -> bool:
        """The launcher gives each rank a GPU of its own (one rank per GPU)."""
        return self.gpus_per_node > 0 and self.ranks_per_gpu == 1

    @property
    def one_per_node(self) -> Job:
        """The same job with one rank a node (the staging launch)."""
        if self.gpus_per_node:
            return replace(self, gpus_per_node=1, ranks_per_gpu=1, left_out=0)
        return replace(self, cpu_ranks_per_node=1, left_out=0)

    @property
    def hardware(self) -> str:
        if self.gpus_per_node:
            return f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s)"
        return f"{self.nodes} CPU-only node(s) x {self.cpu_ranks_per_node} rank(s)"

    @property
    def slots(self) -> int:
        """Ranks the nodes hold: one per GPU (or ``ranks_per_gpu``), or ``--ranks-per-node``."""
        return self.nodes * self.ranks_per_node

    @property
    def ranks(self) -> int:
        """Ranks launched: every slot but those ``left_out``."""
        return self.slots - self.left_out

    @property
    def walltime(self) -> str:
        return f"{self.minutes // 60}:{self.minutes % 60:02d}:00"


# --- Slurm (Frontier, Perlmutter) ---------------------------------------------------------

def slurm_directives(job: Job) -> list[str]:
    lines = [f"--job-name={job.name}", f"--nodes={job.nodes}", f"--ntasks-per-node={job.ranks_per_node}",
             *[f"--gpus-per-node={job.gpus_per_node}"] * bool(job.gpus_per_node),
             f"--cpus-per-task={job.cpus_per_rank}", f"--time={job.walltime}", f"--output={job.name}-%j.out"]
    lines += [f"--account={job.account}"] * bool(job.account) + [f"--partition={job.queue}"] * bool(job.queue)
    return [f"#SBATCH {line}" for line in [*lines, *job.directives]]


def slurm_launcher(job: Job) -> list[str]:
    """``srun`` in Slurm 22.05 and after takes no ``--cpus-per-task`` from ``sbatch``, so it is
    given again; ``--gpus-per-task=1 --gpu-bind=closest`` gives each rank the GPU nearest its cores.
    Ranks sharing GPUs see the node's list, which the run narrows by node-local rank."""
    gpus = ["--gpus-per-task=1", "--gpu-bind=closest"] if job.binds_gpus else []
    return ["srun", f"--nodes={job.nodes}", f"--ntasks={job.ranks}", f"--ntasks-per-node={job.ranks_per_node}",
            f"--cpus-per-task={job.cpus_per_rank}", "--cpu-bind=cores", *gpus]


SLURM_END_TIME = """\
# Slurm's own end for the job: SLURM_JOB_END_TIME where Slurm sets it, else squeue's end time
# (either follows a time limit changed on the command line or with scontrol), else this
# script's start plus the time asked for above.
job_end_time() {
    if [[ "${SLURM_JOB_END_TIME:-}" =~ ^[0-9]+$ ]]; then
        echo "$SLURM_JOB_END_TIME"
        return
    fi
    local end
    end=$(squeue -h -j "${SLURM_JOB_ID:-}" -o %e 2>/dev/null || true)
    if [[ -n "$end" ]] && date -d "$end" +%s 2>/dev/null; then
        return
    fi
    echo $((JOB_START + WALLTIME_SECONDS))
}"""

SLURM_SUBMIT = """\
submit() {    # sbatch --parsable prints ID or ID;CLUSTER
    local out
    if [[ -n "$1" ]]; then
        out=$(sbatch --parsable --dependency="afterany:$1" "$SCRIPT")
    else
        out=$(sbatch --parsable "$SCRIPT")
    fi
    echo "${out%%;*}"
}"""


# --- PBS Pro with PALS (Polaris, Aurora) ----------------------------------------------------

def pbs_directives(job: Job) -> list[str]:
    """Whole nodes spread one chunk per node; a site's extra resources (ALCF's
    ``-l filesystems=home:eagle``) come from ``--directive``."""
    lines = [f"-N {job.name}", f"-l select={job.nodes}", "-l place=scatter", f"-l walltime={job.walltime}",
             "-j oe"]
    lines += [f"-A {job.account}"] * bool(job.account) + [f"-q {job.queue}"] * bool(job.queue)
    return [f"#PBS {line}" for line in [*lines, *job.directives]]


def pbs_launcher(job: Job) -> list[str]:
    """PALS ``mpiexec``: ``--ppn`` ranks per node, ``--depth`` cores per rank bound with
    ``--cpu-bind=depth``. PALS binds no GPU: the run does, by node-local rank
    (``PALS_LOCAL_RANKID`` cross-checked), so no affinity wrapper script is needed."""
    return ["mpiexec", "-n", str(job.ranks), "--ppn", str(job.ranks_per_node), f"--depth={job.cpus_per_rank}",
            "--cpu-bind=depth"]


PBS_END_TIME = """\
# PBS tells a job no end time: this script's start (seconds after the job's) plus the walltime
# PBS holds for the job (qstat: a `qsub -l walltime=` on the command line overrides the line
# above), else the walltime above.
job_end_time() {
    local walltime
    walltime=$(qstat -f "${PBS_JOBID:-}" 2>/dev/null | sed -n 's/^ *Resource_List\\.walltime = *//p' || true)
    if [[ "$walltime" =~ ^[0-9]+(:[0-9]+){0,2}$ ]]; then
        echo $((JOB_START + $(hms_seconds "$walltime")))
    else
        echo $((JOB_START + WALLTIME_SECONDS))
    fi
}"""

PBS_SUBMIT = """\
submit() {    # qsub prints the job's id
    if [[ -n "$1" ]]; then
        qsub -W "depend=afterany:$1" "$SCRIPT"
    else
        qsub "$SCRIPT"
    fi
}"""


# --- LSF with jsrun (Summit) ------------------------------------------------------------------

def lsf_directives(job: Job) -> list[str]:
    """``-nnodes`` is the CSM form of LSF that Summit runs (whole nodes, then jsrun)."""
    lines = [f"-J {job.name}", f"-nnodes {job.nodes}", f"-W {job.minutes // 60}:{job.minutes % 60:02d}",
             f"-o {job.name}.%J.out"]
    lines += [f"-P {job.account}"] * bool(job.account) + [f"-q {job.queue}"] * bool(job.queue)
    return [f"#BSUB {line}" for line in [*lines, *job.directives]]


def lsf_launcher(job: Job) -> list[str]:
    """One jsrun resource set per GPU (``-g 1``) with its ranks (``-a``) and their cores
    (``-c``), ``-r`` sets per node, each rank bound to its cores (``-b packed:C``); on CPU-only
    nodes one set per rank, with no GPU (``-g 0``)."""
    k, sets = (job.ranks_per_gpu, job.gpus_per_node) if job.gpus_per_node else (1, job.cpu_ranks_per_node)
    return ["jsrun", "-n", str(job.nodes * sets - job.left_out // k), "-r", str(sets), "-a", str(k),
            "-c", str(job.cpus_per_rank * k), "-g", str(int(job.gpus_per_node > 0)), "-b",
            f"packed:{job.cpus_per_rank}"]


LSF_END_TIME = """\
# LSF tells a job no end time: this script's start (seconds after the job's) plus the run
# limit LSF holds for the job (bjobs: a `bsub -W` on the command line overrides the line
# above), else the limit above.
job_end_time() {
    local limit
    limit=$(bjobs -noheader -hms -o runtimelimit "${LSB_JOBID:-}" 2>/dev/null | awk '{print $1}' || true)
    if [[ "$limit" =~ ^[0-9]+(:[0-9]+){0,2}$ ]]; then
        echo $((JOB_START + $(hms_seconds "$limit")))
    else
        echo $((JOB_START + WALLTIME_SECONDS))
    fi
}"""

LSF_SUBMIT = """\
submit() {    # bsub reads the #BSUB lines from a script on its input; prints "Job <ID> is submitted ..."
    local out
    if [[ -n "$1" ]]; then
        out=$(bsub -w "ended($1)" < "$SCRIPT")
    else
        out=$(bsub < "$SCRIPT")
    fi
    sed -n 's/^Job <\\([0-9][0-9]*\\)> is submitted.*/\\1/p' <<<"$out"
}"""


# --- Flux (El Capitan) --------------------------------------------------------------------------

def flux_directives(job: Job) -> list[str]:
    lines = [f"--job-name={job.name}", f"-N {job.nodes}", "--exclusive", f"--time-limit={job.minutes}m",
             f"--output={job.name}-{{{{id}}}}.out"]
    lines += [f"--bank={job.account}"] * bool(job.account) + [f"--queue={job.queue}"] * bool(job.queue)
    return [f"#flux: {line}" for line in [*lines, *job.directives]]


def flux_launcher(job: Job) -> list[str]:
    """``-g 1`` and ``gpu-affinity=per-task``: each task sees its own GPU; ranks sharing GPUs
    get none assigned and see the node's, which the run narrows by node-local rank."""
    gpus = (["-g", "1", "-o", "gpu-affinity=per-task"] if job.binds_gpus
            else ["-o", "gpu-affinity=off"] if job.gpus_per_node else [])
    return ["flux", "run", "-N", str(job.nodes), "-n", str(job.ranks), "-c", str(job.cpus_per_rank), *gpus,
            "-o", "cpu-affinity=per-task"]


FLUX_END_TIME = """\
# Flux's time left for this job (`flux job timeleft`: whole seconds; 4294967295 when the job
# has no limit) from now, else this script's start plus the time asked for above.
job_end_time() {
    local left
    left=$(flux job timeleft 2>/dev/null || true)
    if [[ "$left" =~ ^[0-9]+$ ]] && ((left < 4294967295)); then
        echo $(($(date +%s) + left))
    else
        echo $((JOB_START + WALLTIME_SECONDS))
    fi
}"""

FLUX_SUBMIT = """\
submit() {    # flux batch prints the job's id
    if [[ -n "$1" ]]; then
        flux batch --dependency="afterany:$1" "$SCRIPT"
    else
        flux batch "$SCRIPT"
    fi
}"""

HMS_SECONDS = """\
hms_seconds() {    # [[HH:]MM:]SS -> seconds
    local parts part total=0
    IFS=: read -ra parts <<<"$1"
    for part in "${parts[@]}"; do
        total=$((total * 60 + 10#$part))
    done
    echo "$total"
}"""


@dataclass(frozen=True)
class Scheduler:
    """What differs between schedulers; the rest of a job script is the same for all."""
    directives: Callable[[Job], list[str]]
    launcher: Callable[[Job], list[str]]
    end_time: str              # a shell function ``job_end_time`` printing the job's end
    submit: str                # a shell function ``submit [AFTER_ID]`` printing the new job's id
    submit_once: str           # how a user submits the job script by hand ({} is its path)


SCHEDULERS = {
    "slurm": Scheduler(slurm_directives, slurm_launcher, SLURM_END_TIME, SLURM_SUBMIT, "sbatch {}"),
    "pbs": Scheduler(pbs_directives, pbs_launcher, PBS_END_TIME, PBS_SUBMIT, "qsub {}"),
    "lsf": Scheduler(lsf_directives, lsf_launcher, LSF_END_TIME, LSF_SUBMIT, "bsub < {}"),
    "flux": Scheduler(flux_directives, flux_launcher, FLUX_END_TIME, FLUX_SUBMIT, "flux batch {}"),
}


def stage_lines(job: Job) -> list[str]:
    """With ``--stage-env``: one rank per node (the scheduler's launcher, one task per node)
    copies the environment to node-local storage, rank 0 reading it once from the shared file
    system; the run then starts from that copy."""
    if not job.stage_env:
        return []
    script = Path(__file__).resolve().parent / "runtime" / "stage.py"
    return [
        "# The Python environment, read once from the shared file system by rank 0 and copied to each",
        "# node's local storage, so that no rank imports TensorFlow from the shared file system (docs/hpc.md)",
        f"STAGED=\"{job.stage_env}\"",
        *[f"[[ -n \"${{{name}:-}}\" ]] || {{ echo \"--stage-env {job.stage_env.replace('$', chr(92) + '$')}: "
          f"\\${name} is not set in this job; "
          f"name a node-local folder that is\" >&2; exit 1; }}"
          for name in dict.fromkeys(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", job.stage_env))],
        f"{' '.join(map(shlex.quote, SCHEDULERS[job.scheduler].launcher(job.one_per_node)))} \\",
        f"    \"$PYTHON\" -S -P {shlex.quote(str(script))} --to \"$STAGED\"",
        "PYTHON=\"$STAGED/python\"",
    ]


def render_job_script(job: Job) -> str:
    """The job script's text: directives, then the environment, the job's end, and the run."""
    s, q = SCHEDULERS[job.scheduler], shlex.quote
    per_gpu = ("no GPUs" if not job.gpus_per_node else "one per GPU" if job.ranks_per_gpu == 1
               else f"{job.ranks_per_gpu} per GPU (runtime.ranks_per_gpu)")
    device = "a GPU" if job.gpus_per_node else "cores"
    helpers = [HMS_SECONDS, ""] if "hms_seconds" in s.end_time else []
    threads = " ".join(f"{v}={job.threads}" for v in THREAD_VARIABLES)
    launch = " ".join(map(q, s.launcher(job)))
    lines = [
        "#!/bin/bash",
        *s.directives(job),
        f"# python -m ensemble.run for the config {job.name!r} on {job.hardware}: {job.ranks} ranks,",
        *([f"# ({job.left_out} slot(s) of the last node left empty: runtime.group_size divides the "
           f"{job.ranks - 1} workers only so),"] if job.left_out else []),
        f"# {per_gpu}, {job.cpus_per_rank} core(s) each. Rank 0, the master, shares node 0 with the workers",
        f"# and has {device} like them; {job.master_trains}.",
        "# Submitting this script again continues the same run (--resume) until it is done; on a",
        "# finished run a job selects the ensemble again and ends. Written by",
        f"#   {job.command}",
        "# (run that again with other options rather than editing this file).",
        "set -eo pipefail",
        "JOB_START=$(date +%s)",
        f"WALLTIME_SECONDS={job.minutes * 60}    # the time limit asked for above",
        f"CONFIG={q(job.config)}",
        f"RUN_DIR={q(job.run_dir)}",
        f"cd {q(job.workdir)}",
        "",
        *job.setup,
        "# A venv's python needs no activation; activating one would also put its own mpiexec (the",
        "# mpich wheel's) before the site's launcher.",
        f"PYTHON=\"{job.python}\"" if "$" in job.python else f"PYTHON={q(job.python)}",
        "# runtime.threads of the config, before Python starts: numpy's thread pool starts while the config is read",
        f"export {threads}",
        "export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1",
        *stage_lines(job),
        "set -u    # only now: site module scripts are not all written for it",
        "",
        *helpers,
        s.end_time,
        "ENSEMBLE_JOB_END_TIME=$(job_end_time)",
        "export ENSEMBLE_JOB_END_TIME    # the master stops handing out members in time to write the ensemble",
        "",
        "# The first job starts the run; a later one (submitted again, or the next of a chain) continues it.",
        "RESUME=",
        "WHAT=starting",
        f"if [[ -e \"$RUN_DIR/{RunDirectory.JOURNAL}\" ]]; then",
        "    RESUME=--resume",
        "    WHAT=continuing",
        "fi",
        f"echo \"$(date): $WHAT the run in $RUN_DIR on {job.ranks} ranks; "
        "the job ends $(date -d \"@$ENSEMBLE_JOB_END_TIME\")\"",
        f"{launch} \\",
        "    \"$PYTHON\" -m ensemble.run \"$CONFIG\" --run-dir \"$RUN_DIR\" ${RESUME:+\"$RESUME\"}",
    ]
    return "\n".join(lines) + "\n"


def render_submit_script(job: Job, script: str, jobs: int) -> str:
    """A script that submits ``script`` ``jobs`` times, each job after the one before ends,
    however it ended (afterany): the next continues a run the time limit cut short."""
    s = SCHEDULERS[job.scheduler]
    lines = [
        "#!/bin/bash",
        f"# Submits {Path(script).name} {jobs} times, each job starting once the one before has ended, however it",
        "# ended: a job its time limit killed is continued by the next (--resume); once the run is done,",
        "# the jobs left select the ensemble again and end. Written by",
        f"#   {job.command}",
        "set -euo pipefail",
        f"SCRIPT={shlex.quote(script)}",
        f"JOBS={jobs}",
        "",
        s.submit,
        "",
        "prev=",
        "for ((i = 1; i <= JOBS; i++)); do",
        "    id=$(submit \"$prev\")",
        "    if [[ -z \"$id\" ]]; then",
        "        echo \"job $i of $JOBS: the scheduler printed no job id; stopping here\" >&2",
        "        exit 1",
        "    fi",
        "    echo \"job $i of $JOBS: $id${prev:+ (starts after $prev ends)}\"",
        "    prev=$id",
        "done",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m ensemble.jobscript",
        description="Write a job script that runs CONFIG with one rank per GPU (or --ranks-per-node on CPU-only nodes) "
                    "under a batch scheduler; "
                    "submitting it again continues the run. --chain K also writes a script that submits it "
                    "K times, each job after the one before.")
    p.add_argument("config", help="TOML config file (checked now, not after the queue wait)")
    p.add_argument("--scheduler", required=True, choices=sorted(SCHEDULERS),
                   help="slurm (srun), pbs (PALS mpiexec), lsf (jsrun), flux (flux run)")
    p.add_argument("--nodes", type=int, required=True, help="whole nodes to ask for")
    p.add_argument("--gpus-per-node", type=int, required=True,
                   help="GPUs on each node: one rank each (runtime.ranks_per_gpu); 0 for CPU-only nodes, with "
                        "--ranks-per-node")
    p.add_argument("--ranks-per-node", type=int, metavar="R",
                   help="CPU-only nodes (--gpus-per-node 0): ranks on each node, e.g. cores per node / "
                        "runtime.threads")
    p.add_argument("--hours", type=hours, default=2.0,
                   help="the job's time limit: hours (default 2; whole minutes), or a walltime H:MM:SS or "
                        "D-H[:MM[:SS]] as Slurm writes it")
    p.add_argument("--cpus-per-rank", type=int,
                   help="cores each rank is bound to (default: the config's runtime.threads); cores per node / "
                        f"ranks per node uses them all, e.g. {CORES_PER_GPU}")
    p.add_argument("--chain", type=int, metavar="K",
                   help="also write <script>.submit.sh, which submits the script K times, each after the one "
                        "before ends (for runs longer than one job's time limit)")
    p.add_argument("--out", help="the job script's path (default: <name>.<scheduler>.sh here)")
    p.add_argument("--run-dir", help="the run directory (default: <output_dir>/<name> from here)")
    p.add_argument("--account", help="the project charged (Slurm --account, PBS -A, LSF -P, Flux --bank)")
    p.add_argument("--queue", "--partition", dest="queue", help="queue or partition")
    p.add_argument("--setup", action="append", default=[], metavar="CMD",
                   help="a shell line run before Python starts, e.g. \"module load cray-mpich\" (repeatable)")
    p.add_argument("--directive", action="append", default=[], metavar="TEXT",
                   help="one more scheduler directive, e.g. --directive=\"-l filesystems=home:eagle\" (repeatable)")
    p.add_argument("--stage-env", metavar="DEST",
                   help="copy the Python environment to node-local storage first (read once from the shared file "
                        "system, broadcast to one rank per node) and run from there; DEST is expanded by the job's "
                        "shell, e.g. '$TMPDIR/env' or /dev/shm/env (docs/hpc.md)")
    p.add_argument("--python", default=sys.executable,
                   help="the Python that runs the ranks (default: this one, e.g. the venv's)")
    return p.parse_args(argv)


def hours(text: str) -> float:
    """``--hours``: a number of hours, or a walltime as Slurm and PBS write it: H:MM:SS, D-H,
    D-H:MM, D-H:MM:SS (two fields alone, MM:SS to them, are refused as too easily misread)."""
    m = re.fullmatch(r"\s*(?:(\d+)-(\d+)(?::(\d{1,2})(?::(\d{1,2}))?)?|(\d+):(\d{1,2}):(\d{1,2}))\s*", text)
    if m:
        days, h1, m1, s1, h2, m2, s2 = (int(g) if g else 0 for g in m.groups())
        h, mins, secs = (h1, m1, s1) if m.group(1) else (h2, m2, s2)
        if mins > 59 or secs > 59:
            raise argparse.ArgumentTypeError(f"{text!r}: minutes and seconds must be below 60")
        return days * 24 + h + mins / 60 + secs / 3600
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected hours (1.5) or a walltime (1:30:00, 1-00:00:00), got {text!r}; "
                                         "MM:SS is not taken (schedulers disagree on it)") from None
    return value


def missing_data(cfg) -> tuple[str, str] | None:
    """The first data path of ``cfg`` that is not there (the job would fail on it after its queue
    wait) and what to say of it, with its setting; None when every one is (or the run writes its
    source itself)."""
    from datafeed.readers import BUILTINS, unset_note
    from datafeed.shards import is_many
    from ensemble.modes import mode_of
    for key in ("source", "test_source", "val_source", "split_file"):
        src = getattr(cfg.data, key)
        if not src or src in BUILTINS or (key == "source" and mode_of(cfg).writes_source):
            continue
        there = bool(glob.glob(src)) if is_many(src) and not Path(src).is_dir() else Path(src).exists()
        if not there:
            return src, f"`data.{key}` {src!r} does not exist{unset_note(src)}"
    return None


def master_trains_text(cfg, gpus_per_node: int) -> str:
    """Whether the job's master trains members beside its loop, and why (``run.trains_on_master``
    decides it at the run's start from the same settings), for the script's comment."""
    from ensemble.modes import mode_of
    setting, mode = cfg.runtime.master_trains, mode_of(cfg)
    if not mode.master_may_train:
        device = "GPU" if gpus_per_node else "core"
        return f"it trains nothing in mode {cfg.mode!r} (its members talk MPI), so its {device} idles"
    if setting != "auto":
        return ("it trains members too (runtime.master_trains = true)" if setting else
                "it trains nothing (runtime.master_trains = false), so its device idles")
    if cfg.runtime.group_size > 1:
        return "it trains nothing (runtime.group_size > 1: members are groups)"
    if not gpus_per_node:
        return ("on CPU-only nodes it trains nothing: its core runs the scheduling loop "
                "(runtime.master_trains = \"auto\")")
    return "it trains members on its GPU too (runtime.master_trains = \"auto\"), so nothing idles"


def build_job(args: argparse.Namespace, cwd: Path, command: str) -> Job:
    """Check the request against the config and make the ``Job``; ``JobScriptError`` says what
    to change. Everything the queue wait would otherwise reveal is checked here."""
    from ensemble.config import ConfigError, load_config
    for flag, value in (("--nodes", args.nodes), ("--chain", args.chain), ("--cpus-per-rank", args.cpus_per_rank),
                        ("--ranks-per-node", args.ranks_per_node)):
        if value is not None and value < 1:
            raise JobScriptError(f"{flag} must be a positive integer, but got {value}")
    if args.gpus_per_node < 0:
        raise JobScriptError(f"--gpus-per-node must be 0 (CPU-only nodes) or more, but got {args.gpus_per_node}")
    if args.gpus_per_node == 0 and args.ranks_per_node is None:
        raise JobScriptError("CPU-only nodes (--gpus-per-node 0) need --ranks-per-node R: the ranks on each node, "
                             "e.g. its cores / the config's runtime.threads")
    if args.gpus_per_node and args.ranks_per_node is not None:
        raise JobScriptError(f"--ranks-per-node is for CPU-only nodes (--gpus-per-node 0); with "
                             f"--gpus-per-node {args.gpus_per_node} the ranks per node are the GPUs times the "
                             "config's runtime.ranks_per_gpu")
    minutes = round(args.hours * 60) if math.isfinite(args.hours) else 0
    if minutes < 1:
        raise JobScriptError(f"--hours must give the job at least a minute, but got {args.hours * 3600:.0f} s")
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        raise JobScriptError(f"config error in {args.config}: {exc}") from None
    missing = missing_data(cfg)           # a path the job may make: its --setup lines, a variable set there
    if missing and not args.setup and "$" not in missing[0]:
        raise JobScriptError(f"{missing[1]}: the job would fail on it after its queue wait; give the path the compute "
                             "nodes read (the same file systems as here), or make the data first (or in the job: "
                             "a --setup line that stages it)")
    rt = cfg.runtime
    cpus = args.cpus_per_rank or rt.threads
    if cpus < rt.threads:
        raise JobScriptError(f"--cpus-per-rank {cpus} is fewer than the config's `runtime.threads` = {rt.threads}: "
                             "each rank would run more threads than it has cores; raise --cpus-per-rank or lower "
                             "runtime.threads")
    python = job_python(args.python, cwd, bool(args.setup))
    if args.stage_env is not None and (not args.stage_env.strip() or '"' in args.stage_env):
        raise JobScriptError(f"--stage-env {args.stage_env!r} must be a node-local folder without double quotes, "
                             "e.g. '$TMPDIR/env' or /dev/shm/env")
    run_dir = Path(os.path.abspath(cwd / (Path(args.run_dir) if args.run_dir else Path(cfg.output_dir) / cfg.name)))
    continues = existing_run(cfg, run_dir)
    data_note = f"{missing[1]}: the job's --setup lines or environment must make it" if missing else None
    job = Job(scheduler=args.scheduler, name=re.sub(r"[^A-Za-z0-9._-]", "_", cfg.name),
               config=str((cwd / args.config).resolve()), run_dir=str(run_dir), continues=continues,
               data_note=data_note, workdir=str(cwd), nodes=args.nodes, gpus_per_node=args.gpus_per_node,
               ranks_per_gpu=rt.ranks_per_gpu, threads=rt.threads, cpus_per_rank=cpus, minutes=minutes,
               python=python, account=args.account, queue=args.queue, setup=tuple(args.setup),
               directives=directives(args.directive, args.scheduler), command=command, stage_env=args.stage_env,
               cpu_ranks_per_node=0 if args.gpus_per_node else args.ranks_per_node,
               master_trains=master_trains_text(cfg, args.gpus_per_node))
    return group_fit(job, rt.group_size)


#: what begins a directive line in each scheduler's script (``--directive`` may repeat it)
DIRECTIVE_PREFIXES = {"slurm": "#SBATCH", "pbs": "#PBS", "lsf": "#BSUB", "flux": "#flux:"}


def directives(given: list[str], scheduler: str) -> tuple[str, ...]:
    """``--directive`` texts as the directive lines take them: a repeated prefix of this
    scheduler ("#SBATCH") dropped, another scheduler's refused; each must be an option ("-l ...",
    "--qos=x": a text such as "constraint=gpu" made a line the scheduler refuses after the
    queue wait)."""
    out = []
    for text in given:
        line = text.strip()
        own = DIRECTIVE_PREFIXES[scheduler]
        other = next((p for p in DIRECTIVE_PREFIXES.values() if p != own and line.startswith(p)), None)
        if other:
            raise JobScriptError(f"--directive {text!r} is a {other} line, but the script is for {scheduler} "
                                 f"({own}): give the {scheduler} option")
        line = line.removeprefix(own).strip()
        if not line.startswith("-") or "\n" in line:
            raise JobScriptError(f"--directive {text!r} must be one scheduler option, beginning with '-' "
                                 "(e.g. --directive=--constraint=gpu, --directive=\"-l filesystems=home:eagle\")")
        out.append(line)
    return tuple(out)


def job_python(given: str, cwd: Path, setup: bool) -> str:
    """The script's ``PYTHON``: a path, made absolute from here (not resolved: a venv's python is a
    symlink); a path naming a shell variable (``$CONDA_PREFIX/bin/python``) or, with ``--setup``, a
    bare name (``python3``) as given, for the job's shell to expand or find on the PATH its setup
    lines make; a bare name without setup as this shell finds it now."""
    given = os.path.expanduser(given)                  # ~/env/bin/python: this user's home, as the job's
    if "$" in given or (setup and os.sep not in given):
        if '"' in given or "`" in given:
            raise JobScriptError(f"--python {given!r}: a path the job's shell expands holds no quotes or backquotes")
        return given
    python = Path(os.path.abspath(cwd / given))
    if not python.exists() and os.sep not in given and shutil.which(given):
        python = Path(str(shutil.which(given)))             # a bare name, as a shell finds it on PATH
    if not python.exists() and not setup:
        raise JobScriptError(f"--python {given!r} does not exist; give the Python the ranks should run (the "
                             "venv or conda environment built against the cluster's MPI), or the --setup line that "
                             "makes it in the job (an environment unpacked on node-local storage, a conda "
                             "environment it activates: then --python '$CONDA_PREFIX/bin/python' or a bare name)")
    return str(python)


def existing_run(cfg, run_dir: Path) -> str | None:
    """What the job would do with a run already in ``run_dir`` (the script passes --resume when it
    holds a journal): None when none is there; the note that the first job continues it when it
    was made with this config's settings; ``JobScriptError`` when it was not (every job of a chain
    would stop at once after its queue wait, refusing to mix two configs' members)."""
    from ensemble.orchestrate.prepare import config_differences
    if not (run_dir / RunDirectory.JOURNAL).exists():
        return None
    differ = config_differences(cfg, run_dir)
    if differ:
        raise JobScriptError(f"{str(run_dir)!r} already holds a run made with other settings ({differ}): the job "
                             "would continue it (--resume: the script does so whenever the run directory holds a "
                             "journal) and stop at once, after its queue wait. Give the new run its own directory "
                             "(--run-dir, or another `name` in the config), or move the old run away")
    return (f"{str(run_dir)!r} already holds a run of this config: the first job continues it (--resume); "
            "give --run-dir another folder to start afresh")


def group_fit(job: Job, group: int) -> Job:
    """``runtime.group_size`` > 1: the master trains nothing, and the workers (every rank but it) form
    groups of ``group``; one rank per GPU leaves N x G - 1 workers, which an even group never divides,
    so the launch leaves the last node's (N x G - 1) mod group slots empty (their GPUs idle, with the
    master's: one group's worth). The run cuts the groups inside a node where they fit
    (``runtime.hierarchy.node_groups``): every group but the one of the master's node's workers."""
    if group <= 1:
        return job
    if job.slots - 1 < group:
        raise JobScriptError(f"`runtime.group_size` = {group} needs at least {group} worker ranks beside the master, "
                             f"but {job.hardware} hold {job.slots} ranks; ask for more --nodes, or a smaller "
                             "group_size")
    spare = (job.slots - 1) % group
    if spare and job.ranks_per_gpu > 1 and job.gpus_per_node:
        raise JobScriptError(f"`runtime.group_size` = {group} must divide the {job.slots - 1} worker ranks "
                             f"({job.slots} ranks less the master) with `runtime.ranks_per_gpu` = {job.ranks_per_gpu}"
                             + ("; the ranks are even, so the workers are odd and no even group_size divides them: "
                                "an odd group_size, or `runtime.ranks_per_gpu` = 1 (slots are then left empty)"
                                if job.slots % 2 == 0 and group % 2 == 0 else
                                "; choose --nodes and --gpus-per-node so that it does, or another group_size"))
    return replace(job, left_out=spare)


def mpich_wheel(python: str) -> str | None:
    """The version of the MPICH wheel from PyPI that ``python``'s environment holds (its mpi4py
    then runs on it, not on the site's MPI), or None: none, or a python this machine cannot run."""
    if not Path(python).exists():
        return None
    try:
        out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('mpich'))"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    cwd = Path.cwd()
    try:
        job = build_job(args, cwd, shlex.join(["python", "-m", "ensemble.jobscript", *argv]))
    except JobScriptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    script = cwd / (args.out or f"{job.name}.{job.scheduler}.sh")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(render_job_script(job))
    script.chmod(0o755)
    written = [script]
    if args.chain:
        chain = script.with_name(f"{script.name.removesuffix('.sh')}.submit.sh")
        chain.write_text(render_submit_script(job, str(script), args.chain))
        chain.chmod(0o755)
        written.append(chain)
    rel = [os.path.relpath(p, cwd) for p in written]
    wheel = mpich_wheel(job.python)
    if wheel:
        print(f"warning: {job.python}'s mpi4py runs on the MPICH wheel from PyPI ({wheel}, the local default): under "
              f"the cluster's launcher its ranks would each start alone; build mpi4py against the site's MPI "
              "(docs/cluster.md: MPICC=$(which mpicc) pip install --no-binary=mpi4py mpi4py) and pass that "
              "environment's python with --python", file=sys.stderr)
    print(f"wrote {' and '.join(rel)}: {job.scheduler}, {job.nodes} node(s) x {job.ranks_per_node} ranks"
          + (f" less {job.left_out} (runtime.group_size)" if job.left_out else "") + " = "
          f"{job.ranks} ranks, {job.walltime} each job, run directory {job.run_dir}")
    if job.gpus_per_node and args.cpus_per_rank is None and job.cpus_per_rank == 1:
        print("note: each rank is bound to 1 core (the config's runtime.threads = 1); a GPU node has several cores "
              f"per GPU ({CORES_PER_GPU}): --cpus-per-rank gives each rank its share")
    if args.hours > 48:
        print(f"note: --hours {args.hours:g} asks for {job.walltime} (hours, not minutes)")
    for note in (job.continues, job.data_note):
        if note:
            print(f"note: {note}")
    print(f"check the config first:  python -m ensemble.run {shlex.quote(args.config)} --check")
    if args.chain:
        print(f"submit {args.chain} job(s), each after the one before ends:  bash {shlex.quote(rel[1])}")
    else:
        print(f"submit:  {SCHEDULERS[job.scheduler].submit_once.format(shlex.quote(rel[0]))}   "
              "(submitting it again continues the run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
