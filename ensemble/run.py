"""``mpirun -n P python -m ensemble.run CONFIG``: the whole run, on every rank.

1. every rank validates the config (a bad one fails everywhere, rank 0 says why);
2. rank 0 reads and prepares the data, every rank receives it into node shared memory;
3. rank 0 hands member specs to free workers and journals each result as it arrives;
4. rank 0 ranks the members, selects and averages the ensemble, writes the run directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_CONFIG, EXIT_DATA = 2, 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ensemble.run",
                                description="Train an ensemble (or run an architecture search) under MPI.")
    p.add_argument("config", help="TOML config file")
    p.add_argument("--run-dir", help="run directory (default: <output_dir>/<name>, suffixed if it exists)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in its directory: finished members are not retrained")
    p.add_argument("--overwrite", action="store_true", help="delete an existing run directory first")
    return p.parse_args(argv)


def set_thread_env(threads: int) -> None:
    """Thread limits must be in the environment before numpy/TensorFlow start their pools."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                "TF_NUM_INTEROP_THREADS"):
        os.environ.setdefault(var, str(threads))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def bind_gpu(local_rank: int) -> None:
    """One GPU per rank on the node, chosen by node-local rank, unless the user set devices."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return
    gpus = Path("/proc/driver/nvidia/gpus")
    n = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    if n:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank % n)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ensemble.config import ConfigError, load_config
    from ensemble import mpi

    mpi.abort_on_exception()
    comm = mpi.world
    rank, size = comm.Get_rank(), comm.Get_size()
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        if rank == 0:
            print(f"config error in {args.config}: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    group_size, workers = cfg["runtime"]["group_size"], size - 1
    if group_size > 1 and (workers == 0 or workers % group_size):
        if rank == 0:
            print(f"config error in {args.config}: `runtime.group_size` must divide the {workers} worker "
                  f"ranks (mpirun -n P gives P-1 workers besides the master), but got {group_size}",
                  file=sys.stderr, flush=True)
        return EXIT_CONFIG
    set_thread_env(cfg["runtime"]["threads"])
    bind_gpu(mpi.node_local_rank(comm))
    max_sleep = cfg["runtime"]["poll_max_sleep"]

    # Rank 0 reads, checks and prepares; everyone learns the outcome before going on.
    arrays, status = None, None
    if rank == 0:
        from ensemble.session import prepare_run
        try:
            arrays, meta, run_dir = prepare_run(cfg, args)
            status = ("ok", meta, str(run_dir))
        except (ConfigError, ValueError) as exc:
            status = ("error", f"{type(exc).__name__.replace('Error', ' error').lower()}: {exc}", None)
    status = mpi.polite_bcast(comm, status, 0, max_sleep)
    if status[0] != "ok":
        if rank == 0:
            print(f"{status[1]}", file=sys.stderr, flush=True)
        return EXIT_DATA
    _, meta, run_dir = status
    run_dir = Path(run_dir)

    from datafeed.distribute import broadcast_arrays
    rt = cfg["runtime"]
    data = broadcast_arrays(comm, arrays, pretend_nodes=rt["pretend_nodes"],
                            verify=rt["verify_broadcast"] or os.environ.get("ENSEMBLE_VERIFY_BROADCAST") == "1")
    del arrays                                           # rank 0 keeps the shared copy only

    from ensemble.session import run_master_side, run_worker_side
    group, leaders = mpi.split_groups(comm, group_size)
    if rank == 0:
        code = run_master_side(comm, cfg, meta, data, run_dir, args.resume, leaders)
    else:
        run_worker_side(comm, cfg, meta, data, run_dir, group)
        code = 0
    mpi.polite_barrier(comm, max_sleep)
    data.free()
    return code


if __name__ == "__main__":
    sys.exit(main())
