"""The one place the run imports mpi4py (with ``datafeed.distribute``): world, message
tags, abort-on-error, polite polling, topology.

MPICH busy-polls inside blocking receives, so an idle rank would burn a core. Every
wait here probes without blocking and sleeps with a growing back-off instead.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable

from ensemble.runtime import stopping
from ensemble.runtime.storage import full_message, storage_full


def _pipes() -> dict[int, int]:
    """This process's open pipe descriptors: {fd: inode}."""
    found = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:                     # no /proc (macOS): nothing to let go of but stdout and stderr
        names = [str(fd) for fd in (1, 2)]
    for name in names:
        try:
            st = os.fstat(int(name))
        except (OSError, ValueError):
            continue
        if stat.S_ISFIFO(st.st_mode):
            found[int(name)] = st.st_ino
    return found


#: the pipes this rank inherited from the launcher, taken before MPI starts: MPICH's hydra proxy
#: forks every rank with copies of the ranks' stdout and stderr pipes created before it, so a
#: rank's output stays open until every rank holding a copy has gone (see ``_let_go_of_the_launcher``)
_INHERITED_PIPES = {} if "mpi4py.MPI" in sys.modules else _pipes()

from mpi4py import MPI  # noqa: E402 - after the launcher's pipes are taken

ANY_SOURCE = MPI.ANY_SOURCE
ANY_TAG = MPI.ANY_TAG
TAG_SPEC, TAG_RESULT, TAG_STOP = 11, 12, 13
TAG_REPORT, TAG_DECISION = 14, 15        # a worker's in-training report and the master's answer
TAG_STATE = 16                           # a member's weights and optimizer state, worker to worker (PBT)
TAG_HELP, TAG_JOIN = 17, 18              # the run's end (runtime.tail): master -> helper, leader; leader -> helper
TAG_INSITU_REQUEST, TAG_INSITU_REPLY, TAG_INSITU_DONE = 21, 22, 23   # in-situ inference, client <-> server
TAG_ONLINE_UP, TAG_ONLINE_DOWN = 31, 32  # online training (MPMD): simulation -> ensemble master, and back

world = MPI.COMM_WORLD


#: seconds a rank other than 0 waits on Ctrl-C before it exits (see ``abort_on_exception``)
INTERRUPT_GRACE = 1.0


def library_version() -> str:
    """The MPI library's own name and version (its first line: MPICH, Open MPI, Cray MPICH ...)."""
    return MPI.Get_library_version().strip().splitlines()[0].strip()


def where() -> str:
    return f"rank {world.Get_rank()} on {socket.gethostname()}"


EXIT_INTERRUPTED = 130          # 128 + SIGINT: what a shell reports for Ctrl-C
EXIT_TERMINATED = 143           # 128 + SIGTERM: a scheduler ending the job


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so it ends as an interrupt does."""


#: a worker rank still running this many seconds after Ctrl-C or SIGTERM leaves anyway: the
#: KeyboardInterrupt can be lost (raised inside a ``__del__`` that TensorFlow's garbage runs,
#: "Exception ignored in ... KeyboardInterrupt"), and mpiexec would then kill the rank (exit 9)
WORKER_STOP_LIMIT = 10 * INTERRUPT_GRACE
_exit_armed: list[threading.Timer] = []


def exit_after(seconds: float, code: int) -> None:
    """Leave the process with ``code`` ``seconds`` from now, whatever it is doing then (a
    daemon timer, armed once; the normal way out comes first)."""
    if _exit_armed:
        return

    def leave() -> None:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()
    _exit_armed.append(timer)


def _leads() -> bool:
    """Whether this process is rank 0 of its own program: the master (in an MPMD job, the
    ensemble program's rank 0 is not COMM_WORLD's, which is the simulation's: on Ctrl-C the
    master took itself for a worker, could be cut short, and the resume line was never said)."""
    return (_coupled["app"] if _coupled else world).Get_rank() == 0


def abort_on_exception(interrupted: Callable[[], str] | None = None) -> None:
    """An uncaught exception on any rank prints with its rank and host, then aborts the job.

    Without this, one rank dies and the others wait forever in a collective.
    Ctrl-C is not an error: MPICH's mpiexec (hydra) forwards SIGINT to every rank (each in
    its own process group, so the terminal signals mpiexec only), each raises KeyboardInterrupt,
    the ``with`` blocks on the way up close (the journal is flushed, status.json says
    "stopped"), and then, instead of a traceback per rank, rank 0 prints the one line
    ``interrupted()`` returns and every rank exits with 130. A rank that is still running
    when another leaves is stopped by mpiexec, as after any exit without MPI_Finalize, so
    the workers wait ``INTERRUPT_GRACE`` before leaving (rank 0 has closed its files by
    then) and rank 0 twice that.

    SIGTERM (what batch schedulers send at the time limit, then SIGKILL after a grace period,
    30 s on Slurm by default) is taken the same way: it raises ``Terminated``, a
    KeyboardInterrupt, so the run closes its journal, writes "stopped" and prints the resume
    hint in the same milliseconds; the exit status is then 143 (128 + SIGTERM).
    """
    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # one is enough: a second (the scheduler signals
        if not _leads():                                # every process, mpiexec forwards too) cuts no cleanup
            exit_after(WORKER_STOP_LIMIT, EXIT_TERMINATED)
        stop = Terminated(f"signal {signum}")
        stopping.ask(stop)                              # raised again by the master's loop if dropped
        raise stop

    def on_int(signum, frame):
        if not _leads():
            exit_after(WORKER_STOP_LIMIT, EXIT_INTERRUPTED)
        stop = KeyboardInterrupt()
        stopping.ask(stop)
        raise stop
    try:
        signal.signal(signal.SIGTERM, on_term)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, on_int)
    except ValueError:                  # not the main thread (an embedding host): keep its handler
        pass

    def hook(kind, value, tb):
        for sig in (signal.SIGINT, signal.SIGTERM):     # leaving already: a second signal must not cut it
            try:
                signal.signal(sig, signal.SIG_IGN)
            except ValueError:
                pass
        try:                            # the node's shared data: not left behind in /dev/shm
            from ensemble.runtime.shm import remove_mapped_segments
            remove_mapped_segments()
        except Exception:               # noqa: BLE001 - never a second error on the way out
            pass
        if issubclass(kind, KeyboardInterrupt):
            stopping.forget()
            if _leads():
                try:
                    line = interrupted() if interrupted else "interrupted"
                except Exception:       # noqa: BLE001 - never a traceback on the way out
                    line = "interrupted"
                sys.stderr.write(line + "\n")
            sys.stdout.flush()
            sys.stderr.flush()
            if world.Get_size() > 1:
                # the launcher stops every rank once one has left: the workers leave after
                # INTERRUPT_GRACE, by when rank 0 has closed its journal and status.json (it
                # takes milliseconds), and rank 0 after them, so the job's status is theirs, 130
                _let_go_of_the_launcher()
                time.sleep(INTERRUPT_GRACE * (2 if _leads() else 1))
            os._exit(EXIT_TERMINATED if issubclass(kind, Terminated) else EXIT_INTERRUPTED)
        full = storage_full(value)
        if full is not None:            # the storage's fault, not the code's: one line with the way on
            text = (f"{full_message(full)}; free space or make it writable (or move the run directory), then "
                    "continue with `--resume`: finished members are kept\n")
        else:
            text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write(f"[{where()}] fatal error, aborting the job:\n{text}")
        sys.stderr.flush()
        if world.Get_size() > 1:
            time.sleep(1.0)             # let mpiexec forward the message before Abort tears down I/O
            world.Abort(1)
        os._exit(1)
    sys.excepthook = hook


def _let_go_of_the_launcher() -> None:
    """Close this rank's end of the launcher's output pipes (stdout, stderr, their copies and
    the copies of other ranks' pipes inherited at start), pointing them at /dev/null.

    Why: hydra's proxy reaps ranks while any rank's output is open, and then records a rank
    it stopped itself (SIGKILL, once the first rank has left) as killed, which makes the job's
    status 9 instead of 130/143. Once every rank's output has closed, it records those ranks
    as it should (0), so the status is the leavers' own. Only on the way out; never raises."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        now = _pipes()
        ours = {now.get(1), now.get(2)} - {None}
        for fd, inode in now.items():
            if inode in ours or (fd != 0 and _INHERITED_PIPES.get(fd) == inode):
                os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass


def try_recv(comm, source: int = ANY_SOURCE, tag: int = ANY_TAG):
    """(message, source, tag) of a pickled message that has arrived, or None; never waits.
    One matched probe-and-receive (MPI_Improbe/Mrecv): no second search of the queue."""
    status = MPI.Status()
    handle = comm.improbe(source=source, tag=tag, status=status)
    if handle is None:
        return None
    return handle.recv(), status.Get_source(), status.Get_tag()


def poll_recv(comm, source: int = ANY_SOURCE, tag: int = ANY_TAG, max_sleep: float = 0.05):
    """Receive a pickled message without spinning a core: probe, sleep, back off to max_sleep."""
    sleep = 1e-4
    while True:
        got = try_recv(comm, source, tag)
        if got is not None:
            return got
        time.sleep(sleep)
        sleep = min(sleep * 2, max_sleep)


_coupled: dict = {}      # app_world's answer, once per process: (this program's communicator, the peer link)


def app_world():
    """This program's communicator: ``COMM_WORLD`` in a job of one program; in an MPMD job
    (``mpirun -n S sim.py : -n E python -m ensemble.run ...``) the ranks of this program
    only (``COMM_WORLD`` split by ``MPI.APPNUM``), and ``peer()`` is then the
    intercommunicator to the other program (its leaders linked through ``COMM_WORLD``).

    Collective over ``COMM_WORLD`` the first time: every program of the job must call it
    (or ``couple``, which does the same) before any other collective on ``COMM_WORLD``."""
    if not _coupled:
        _coupled["app"], _coupled["peer"] = couple(MPI.COMM_WORLD)
    return _coupled["app"]


def peer():
    """The intercommunicator to the other program of an MPMD job (``app_world``), or None."""
    app_world()
    return _coupled["peer"]


def couple(comm=MPI.COMM_WORLD):
    """(this program's communicator, intercommunicator to the other program or None): the
    split of ``comm`` by application number and the link between the two leaders. One
    program: ``(comm, None)``. More than two programs is an error (raised on every rank)."""
    appnum = comm.Get_attr(MPI.APPNUM)
    appnum = 0 if appnum is None or appnum < 0 else int(appnum)
    apps = comm.allgather(appnum)
    programs = sorted(set(apps))
    if len(programs) == 1:
        return comm, None
    if len(programs) > 2:
        raise RuntimeError(f"an MPMD job of {len(programs)} programs; online coupling links two "
                           "(`mpirun -n S sim.py : -n E python -m ensemble.run config.toml`)")
    app = comm.Split(appnum, comm.Get_rank())
    other = next(p for p in programs if p != appnum)
    inter = app.Create_intercomm(0, comm, apps.index(other), TAG_ONLINE_UP + 100)
    return app, inter


def polite_wait(requests, max_sleep: float = 0.05) -> None:
    """Wait until every request of ``requests`` has completed, sleeping (1e-4 s, doubling up
    to ``max_sleep``) instead of busy-polling."""
    sleep = 1e-4
    pending = list(requests)
    while pending:
        pending = [r for r in pending if not r.Test()]
        if pending:
            time.sleep(sleep)
            sleep = min(sleep * 2, max_sleep)


def polite_barrier(comm, max_sleep: float = 0.05) -> None:
    """A barrier that sleeps while waiting instead of busy-polling."""
    polite_wait([comm.Ibarrier()], max_sleep)


def polite_bcast(comm, obj, root: int = 0, max_sleep: float = 0.05):
    """Broadcast a small pickled object; ranks that wait (e.g. while root reads data) sleep."""
    if comm.Get_size() == 1:
        return obj
    if comm.Get_rank() == root:
        for dest in range(comm.Get_size()):
            if dest != root:
                comm.send(obj, dest=dest, tag=TAG_SPEC + 100)
        return obj
    return poll_recv(comm, root, TAG_SPEC + 100, max_sleep)[0]


def node_local_rank(comm=world) -> int:
    """This rank's index among the ranks on its node (for binding one GPU per rank)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    rank = node.Get_rank()
    node.Free()
    return rank


def split_node(comm=world):
    """The ranks of ``comm`` that share this rank's node (shared memory), ordered as in ``comm``."""
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def split_groups(comm, group_size: int, node=None):
    """Cut the worker ranks (1..P-1) into member groups of ``group_size`` (``node_groups``: inside
    a node where they can be, by ``node``, the communicator of this rank's node; None: contiguous
    ranks).

    Returns (group communicator or None on the master, world ranks of the group leaders).
    Every rank must call it; ``group_size`` must divide the number of workers.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    nodes = comm.allgather(node.allreduce(rank, op=MPI.MIN)) if node is not None else [0] * size
    from ensemble.runtime.hierarchy import node_groups
    groups = node_groups(nodes, group_size) if size > 1 else []
    leaders = [g[0] for g in groups]
    color = next((i for i, g in enumerate(groups) if rank in g), MPI.UNDEFINED)
    group = comm.Split(color, key=rank)
    return (None if group == MPI.COMM_NULL else group), leaders
