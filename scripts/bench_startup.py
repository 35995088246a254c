"""Benchmark: metadata calls each rank makes on the shared file system at start-up, with and
without the environment staged to node-local storage (``ensemble/runtime/stage.py``).

Three real MPI jobs of the same small run, every rank under ``strace`` (its file-path system
calls and directory reads, with the paths of descriptors):

1. ``shared``: ``mpiexec -n R <venv>/bin/python -m ensemble.run config.toml``, as today;
2. ``stage``:  ``mpiexec -n 2 python -S -P ensemble/runtime/stage.py --to DEST`` (rank 0 reads the
   environment once and broadcasts it to one rank per node, which unpacks it under DEST; a job
   script runs it with one rank per node, ``ensemble jobscript --stage-env``: rank 1 here
   counts what each node's staging rank reads from the shared file system);
3. ``staged``: ``mpiexec -n R DEST/python -m ensemble.run config.toml``.

"On the shared file system" means a path under the environment (the venv), the interpreter
it was made from (its ``pyvenv.cfg`` home) or the project's checkout: what a cluster keeps on
its parallel file system. The run's own files (config, run directory) are in a scratch folder
and counted apart. The two runs' results are compared: staging must change nothing.

    python scripts/bench_startup.py --ranks 8

Prints a table and, last, one JSON line. Needs ``strace``; takes a few minutes on 2 cores
(the first job stages about 2 GB for this project's venv).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ensemble.runtime.stage import venv_home

REPO = Path(__file__).resolve().parents[1]
STAGE = REPO / "ensemble" / "runtime" / "stage.py"
TRACE = "trace=%file,getdents64"
CONFIG = """name = "startup"
mode = "ensemble"
seed = 7
[data]
source = "digits"
task = "classification"
[train]
epochs = 3
batch_size = 64
[[architectures]]
name = "mlp"
members = {members}
layers = [{{type = "Dense", units = 32, activation = "relu"}}]
[runtime]
heartbeat_seconds = 60
"""


def shared_prefixes(venv: Path) -> list[str]:
    home = venv_home(venv)                   # the interpreter's prefix, as the staging step reads it
    return sorted({str(venv), str(REPO)} | ({str(home)} if home else set()))


def traced_job(ranks: int, traces: Path, tag: str, command: list[str], cwd: Path, env: dict,
               threads: bool = True) -> None:
    """Every rank under strace, its trace in ``traces/<tag>.<rank>`` (MPICH's PMI_RANK); with
    ``threads`` every thread of it (TensorFlow reads files from its own threads)."""
    follow = "-f " if threads else ""
    inner = " ".join([f"exec strace {follow}-y -qq -e", TRACE, "-o", f"{traces}/{tag}.$PMI_RANK", *command])
    mpiexec = Path(sys.executable).parent / "mpiexec"
    proc = subprocess.run([str(mpiexec), "-n", str(ranks), "sh", "-c", inner], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{tag} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else f"{tag}: done", flush=True)


def count(path: Path, prefixes: list[str], job: str) -> dict:
    """Calls touching the shared file system (a path under ``prefixes`` as an argument or as a
    descriptor's path) and calls touching the job's own folder. ``AT_FDCWD<cwd>`` (strace -y
    decorates the working directory) is no path of the call's own and is left out."""
    shared_re = re.compile("|".join(re.escape(f'"{p}') + "|" + re.escape(f"<{p}") for p in prefixes))
    job_re = re.compile(re.escape(f'"{job}') + "|" + re.escape(f"<{job}"))
    cwd_re = re.compile(r"AT_FDCWD<[^>]*>")
    shared = own = total = 0
    with path.open(errors="replace") as f:
        for line in f:
            line = cwd_re.sub("AT_FDCWD", line)
            total += 1
            if shared_re.search(line):
                shared += 1
            elif job_re.search(line):
                own += 1
    return {"shared": shared, "own": own, "total": total}


def per_rank(traces: Path, tag: str, ranks: int, prefixes: list[str], job: str) -> list[dict]:
    return [count(traces / f"{tag}.{r}", prefixes, job) for r in range(ranks)]


def results(run_dir: Path) -> dict:
    """What a run decided: the ensemble's metrics and its members with their weights."""
    ens = json.loads((run_dir / "ensemble.json").read_text())
    return {"ensemble": ens["ensemble"], "members": [(m["id"], round(m["weight"], 12)) for m in ens["members"]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--dest", default=None, help="node-local folder to stage into (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the traces and the staged copy")
    args = p.parse_args(argv)
    if shutil.which("strace") is None:
        raise SystemExit("strace is not installed (apt-get install strace)")
    venv = Path(sys.prefix)
    prefixes = shared_prefixes(venv)
    work = Path(tempfile.mkdtemp(prefix="bench_startup-"))
    traces, job = work / "traces", work / "job"
    traces.mkdir()
    job.mkdir()
    dest = Path(args.dest) if args.dest else work / "node-local" / "env"
    (job / "config.toml").write_text(CONFIG.format(members=max(args.ranks - 1, 1)))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    try:
        traced_job(args.ranks, traces, "shared", [str(venv / "bin" / "python"), "-m", "ensemble.run", "config.toml",
                                                  "--run-dir", "runs/shared"], job, env)
        traced_job(2, traces, "stage", [str(venv / "bin" / "python"), "-S", "-P", str(STAGE), "--to", str(dest)],
                   job, env, threads=False)
        traced_job(args.ranks, traces, "staged", [str(dest / "python"), "-m", "ensemble.run", "config.toml",
                                                  "--run-dir", "runs/staged"], job, env)
        figures = {tag: per_rank(traces, tag, 2 if tag == "stage" else args.ranks, prefixes, str(job))
                   for tag in ("shared", "stage", "staged")}
        same = results(job / "runs" / "shared") == results(job / "runs" / "staged")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    def med(tag: str) -> float:
        return statistics.median(r["shared"] for r in figures[tag][1:])      # rank 0 reads the data, or stages

    without, staged, per_node, root_read = med("shared"), med("staged"), figures["stage"][1]["shared"], \
        figures["stage"][0]["shared"]
    print(f"\nmetadata calls on the shared file system ({args.ranks} ranks, one node; prefixes {prefixes}):")
    print("| | calls |")
    print("|---|---|")
    print(f"| run from the shared venv, per rank (median of ranks 1-{args.ranks - 1}) | {without:,.0f} |")
    print(f"| run from the staged copy, per rank (median of ranks 1-{args.ranks - 1}) | {staged:,.0f} |")
    print(f"| staging, per node (its one staging rank) | {per_node:,} |")
    print(f"| staging, rank 0's one read of the environment (once per job) | {root_read:,} |")
    rows = {}
    for nodes, per in ((1000, 4), (1000, 8), (10000, 4), (10000, 8)):
        ranks = nodes * per
        total = root_read + nodes * per_node + ranks * staged
        rows[f"{nodes}x{per}"] = {"per_rank": total / ranks, "reduction": without / (total / ranks)}
        print(f"| {nodes:,} nodes x {per} ranks: per rank on average | {total / ranks:,.0f} "
              f"({without * ranks / total:,.0f}x fewer; the job {without * ranks / 1e6:,.1f} million calls "
              f"without, {total / 1e6:,.2f} million with) |")
    print(f"results unchanged (the ensemble's metrics, its members and weights): {same}")
    print(json.dumps({"ranks": args.ranks, "without": without, "staged": staged, "stage_per_node": per_node,
                      "root_read": root_read, "projections": rows, "same_results": same, "per_rank": figures}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
