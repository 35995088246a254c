"""``mpirun -n P python -m ensemble.run CONFIG``: the whole run, on every rank.

1. every rank validates the config (a bad one fails everywhere, rank 0 says why);
2. rank 0 reads and prepares the data, every rank receives it into node shared memory;
3. rank 0 hands member specs to free workers and journals each result as it arrives;
4. rank 0 ranks the members, selects and averages the ensemble, writes the run directory.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

EXIT_CONFIG, EXIT_DATA = 2, 3
log = logging.getLogger("ensemble.run")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ensemble.run",
                                description="Train an ensemble (or run an architecture search) under MPI.")
    p.add_argument("config", help="TOML config file")
    p.add_argument("--run-dir", help="run directory (default: <output_dir>/<name>, suffixed if it exists)")
    which = p.add_mutually_exclusive_group()     # continue a run, or delete it: never both
    which.add_argument("--resume", action="store_true",
                       help="continue the run in its directory: finished members are not retrained")
    which.add_argument("--overwrite", action="store_true", help="delete an existing run directory first")
    p.add_argument("--check", action="store_true",
                   help="check the config, the data and every architecture without training (no mpirun "
                        "needed): run it before submitting a job")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, *, config: dict | None = None, made: list | None = None) -> int:
    """The run, on every rank. ``config``: an already loaded config (``ensemble.run_config``,
    in-process on one rank); ``argv``'s config path then only names it in messages.
    ``made`` receives the run directory's path once it exists."""
    job_started = time.time()
    args = parse_args(argv)
    stamps = {"main": round(job_started, 3)}            # start-up phases (results.timeline)
    if args.check:
        from ensemble.orchestrate.check import check_main
        return check_main(args.config, resume=args.resume, run_dir=args.run_dir)
    from ensemble.runtime.env import set_thread_env
    set_thread_env(config.runtime.threads if config is not None else configured_threads(args.config))
    from ensemble.config import ConfigError, load_config
    from ensemble.runtime import mpi
    from ensemble.runtime.env import bind_gpu, hide_gpus
    from ensemble.runtime.logs import setup_logging

    made = [] if made is None else made                  # the run directory, once rank 0 has made it
    comm = mpi.app_world()                               # COMM_WORLD, or this program's ranks in an MPMD job
    rank, size = comm.Get_rank(), comm.Get_size()
    if config is None:                                   # in-process (a notebook): keep its own hook
        mpi.abort_on_exception(lambda: interrupted_line(made[0] if made else None))
    setup_logging(rank)
    try:
        cfg = config if config is not None else load_config(args.config)
    except ConfigError as exc:
        log.error(f"config error in {args.config}: {exc}")
        return EXIT_CONFIG
    setup_logging(rank, cfg.runtime.log_level)
    from ensemble.orchestrate.prepare import check_world
    try:
        check_world(cfg, size - 1)
    except ConfigError as exc:
        log.error(f"config error in {args.config}: {exc}")
        if rank == 0:
            from ensemble.modes import mode_of
            mode_of(cfg).abandon(f"config error: {exc}")     # mode "online": the simulation is told at once
        return EXIT_CONFIG
    from ensemble.runtime.env import process_started
    from ensemble.runtime.scheduler import job_end_time
    stamps.update(process=process_started(), mpi_and_config=round(time.time(), 3))
    try:
        job_end_time()                                  # a malformed end fails now, on every rank alike
    except ValueError as exc:
        log.error(f"error: {exc}")
        return EXIT_CONFIG
    from ensemble.train.architecture import ArchitectureError, use_builder_folders
    try:
        use_builder_folders(cfg.architectures)          # every rank imports the user's builder from there
    except ArchitectureError as exc:                    # the same on every rank: all leave alike
        log.error(f"config error in {args.config}: {exc}")
        return EXIT_CONFIG
    local_rank = mpi.node_local_rank(comm)              # collective: every rank calls it
    if local_rank == 0:                                 # what crashed jobs left in this node's memory
        from ensemble.runtime.shm import clean_stale_segments
        clean_stale_segments()
    binding = bind_gpu(local_rank, cfg.runtime.ranks_per_gpu)
    from ensemble.modes import mode_of
    master_trains = (rank == 0 and size > 1 and mode_of(cfg).master_may_train
                     and trains_on_master(cfg.runtime, binding))
    if rank == 0 and size > 1 and not master_trains:
        hide_gpus()                                     # the master trains nothing: its build check
        binding = None                                  # runs on the CPU, taking no worker's GPU memory
    report_bindings(comm, binding)

    # Rank 0 reads, checks and prepares; everyone learns the outcome before going on.
    arrays, status, lock = None, None, None
    if rank == 0:
        from ensemble.modes import unread_tables
        from ensemble.orchestrate.prepare import RunDirError, prepare_run
        for note in unread_tables(cfg, args.config):   # [evolve] in a pbt config: said, as check says it
            log.warning(f"config: {note}")
        try:
            mode_of(cfg).before_prepare(cfg, args)      # mode "online": the simulation's first samples
            arrays, meta, run_dir, lock = prepare_run(cfg, args)
            status = ("ok", meta, str(run_dir.path))
        except RunDirError as exc:                      # in use, another run there, nothing to resume
            status = ("error", f"run directory: {exc}", EXIT_CONFIG)
        except ConfigError as exc:                      # a setting that does not suit the data: the config's
            status = ("error", f"config error in {args.config}: {exc}", EXIT_CONFIG)
        except ValueError as exc:
            status = ("error", f"{type(exc).__name__.replace('Error', ' error').lower()}: {exc}", EXIT_DATA)
        except OSError as exc:                           # a read-only or full file system: said once
            where = exc.filename or args.run_dir or os.path.join(cfg.output_dir, cfg.name)
            status = ("error", f"cannot write the run directory {str(where)!r}: {exc.strerror or exc}; "
                               "choose a writable `output_dir` (or --run-dir) with free space", EXIT_DATA)
        if status[0] == "error":
            mode_of(cfg).abandon(status[1])             # mode "online": the simulation is told at once
    held = [arrays]                                      # handed over: rank 0 keeps the shared copy only
    del arrays
    try:
        return _run(comm, cfg, args, argv, status, held, made, stamps, job_started, master_trains)
    finally:
        if lock is not None:                             # this job's hold on the run directory
            lock.release()


def _run(comm, cfg, args, argv, status, held: list, made, stamps, job_started, master_trains) -> int:
    """Every rank, once rank 0 has prepared (``status``): the data broadcast (``held``: rank
    0's prepared arrays, taken out so that nothing else references them), then the master
    side on rank 0 and the worker side elsewhere."""
    arrays = held.pop()
    from datafeed.distribute import broadcast_arrays
    from ensemble.modes.trainers import KERAS
    from ensemble.orchestrate.session import run_master_side, run_worker_side
    from ensemble.orchestrate.submasters import run_hierarchy, shape_on_every_rank
    from ensemble.results.rundir import RunDirectory
    from ensemble.runtime import mpi
    from ensemble.runtime.env import preload_tensorflow
    from ensemble.runtime.logs import add_debug_file
    rank, max_sleep, group_size = comm.Get_rank(), cfg.runtime.poll_max_sleep, cfg.runtime.group_size
    if rank != 0 and cfg.runtime.trainer == KERAS:     # workers import TensorFlow while rank 0 prepares
        preload_tensorflow()                           # (the run's own imports done first, in this thread)
    status = mpi.polite_bcast(comm, status, 0, max_sleep)
    if status[0] != "ok":
        log.error(status[1])
        return int(status[2])                            # EXIT_CONFIG or EXIT_DATA
    _, meta, run_dir = status
    made.append(run_dir)
    run_dir = RunDirectory(run_dir)
    if cfg.runtime.debug_log:
        add_debug_file(run_dir.path, rank)

    rt = cfg.runtime
    data = broadcast_arrays(comm, arrays, pretend_nodes=rt.pretend_nodes,
                            verify=rt.verify_broadcast or os.environ.get("ENSEMBLE_VERIFY_BROADCAST") == "1")
    del arrays                                           # rank 0 keeps the shared copy only
    stamps["data"] = round(time.time(), 3)

    command = ["-m", "ensemble.run", *(argv if argv is not None else sys.argv[1:])]
    subs = shape_on_every_rank(comm, cfg, run_dir, args.resume)      # runtime.sub_masters: 0 is one master
    if subs:
        code = run_hierarchy(comm, cfg, meta, data, run_dir, args.resume, subs, job_started, command, stamps)
        mpi.polite_barrier(comm, max_sleep)
        data.free()
        return code
    group, leaders = mpi.split_groups(comm, group_size, data.node_comm)     # groups inside a node where they fit
    if rank == 0:
        from ensemble.config import ConfigError
        try:
            code = run_master_side(comm, cfg, meta, data, run_dir, args.resume, leaders, job_started, command,
                                   master_trains)
        except ConfigError as exc:                       # the run's journal does not suit this job (its workers
            log.error(f"config error: {exc}")            # were stopped): one line, no traceback
            code = EXIT_CONFIG
    else:
        run_worker_side(comm, cfg, meta, data, run_dir, group, stamps)
        code = 0
    mpi.polite_barrier(comm, max_sleep)
    data.free()
    return code


def configured_threads(path: str) -> int:
    """``runtime.threads`` read straight from the TOML, before anything imports numpy (the
    config's own loading does): thread pools size themselves once, at import. A file that
    cannot be read gives 1; ``load_config`` then says what is wrong with it."""
    import tomllib
    try:
        with open(path, "rb") as fh:
            threads = tomllib.load(fh).get("runtime", {}).get("threads", 1)
    except (OSError, ValueError, AttributeError):       # TOMLDecodeError, UnicodeDecodeError: load_config says
        return 1
    return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else 1


def trains_on_master(runtime, binding) -> bool:
    """``runtime.master_trains``: "auto" trains on rank 0 when it has a GPU of its own (a
    binding that names a device) and members are not data-parallel groups; on CPU-only
    nodes the master's core stays with the scheduling loop (the workers use the others)."""
    setting = runtime.master_trains
    if setting != "auto":
        return bool(setting)
    return runtime.group_size == 1 and binding is not None and binding.device.strip() not in ("", "-1")


def report_bindings(comm, binding) -> None:
    """Rank 0 logs every rank's device (debug) and, as warnings, what a user should know
    about them (ranks sharing a GPU, a launcher that disagrees with MPI on local ranks)."""
    import socket
    said = comm.gather((comm.Get_rank(), socket.gethostname(), binding.line() if binding else "no GPU",
                        binding.note if binding else None), root=0)
    if comm.Get_rank() != 0:
        return
    for rank, host, line, _ in said:
        log.debug(f"rank {rank} on {host}: {line}")
    notes: dict[str, list[int]] = {}
    for rank, _, _, note in said:
        if note:
            notes.setdefault(note, []).append(rank)
    for note, ranks in notes.items():
        log.warning(f"GPU binding, rank(s) {', '.join(map(str, ranks[:8]))}{' ...' if len(ranks) > 8 else ''}: {note}")


def interrupted_line(run_dir: str | None) -> str:
    """What rank 0 prints on Ctrl-C, instead of a traceback per rank (``runtime.mpi``)."""
    if run_dir is None:
        return "interrupted before the run directory was made; nothing to resume"
    from ensemble.results.rundir import RunDirectory
    if not RunDirectory(run_dir).has_journal():
        return f"interrupted before training began in {run_dir}; nothing to resume, start again"
    return (f"interrupted; `--resume` continues: the same command with `--run-dir {run_dir} --resume` "
            "(finished members are kept)")


if __name__ == "__main__":
    sys.exit(main())
