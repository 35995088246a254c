"""Stage the Python environment on node-local storage, once per node, read once from the
shared file system: the start-up of a large job without an import storm.

    srun --ntasks-per-node=1 python -S -P .../ensemble/runtime/stage.py --to "$TMPDIR/env"
    srun "$TMPDIR/env/python" -m ensemble.run config.toml

(``ensemble jobscript --stage-env DEST`` writes both lines for Slurm, PBS, LSF and Flux.)

Every rank that imports TensorFlow from a parallel file system makes about 30,000 metadata
calls (``docs/hpc.md``); thousands of ranks doing it at once queue on the metadata server
for minutes. Here world rank 0 alone walks the environment (the venv or conda environment,
the interpreter it was made from, the editable-installed project) and streams it as a tar
archive by ``MPI_Bcast`` to one rank per node, which unpacks it under ``--to``. The run then
starts from that copy: its ranks read nothing of the environment from the shared file system.

The script is run by path with ``python -S -P``: it imports only the standard library and
mpi4py (found without the ``site`` machinery; no script folder searched first), so each
rank of this step makes a few hundred metadata calls on the shared file system, not thirty
thousand; run one rank per node (every rank works too: the others of a node wait, asleep). It is an MPI module
of its own (besides ``runtime.mpi``) because it must not import the project, whose package
imports are what it saves.

What is staged, under ``--to``:
- ``venv/``: the environment of the Python running this (``sys.prefix`` of a venv or a
  conda environment). A package installed in editable mode (``pip install -e``) is copied
  into ``venv``'s site-packages from its source folder, and its ``__editable__`` hook left
  out, so the copy does not read the source checkout.
- ``python/``: the interpreter the venv was made from (its ``pyvenv.cfg`` ``home``), less
  its own site-packages and test suite; the venv's ``bin/python*`` links and ``pyvenv.cfg``
  are pointed at it. ``--no-python`` leaves the interpreter where it is (a node image's
  system Python, or a conda environment, which holds its interpreter itself).
- ``python``: a launcher script (the python to run): the staged interpreter with its
  libraries first on ``LD_LIBRARY_PATH``.
- ``.staged``: written last, with where it came from; a node that already holds a complete
  copy of the same source skips the unpacking (a second job step on the same allocation).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import io
import json
import os
import shutil
import socket
import sys
import tarfile
import threading
import time
from pathlib import Path

#: bytes per broadcast: large enough that the per-message latency does not matter
CHUNK = 64 << 20
#: left out of every copy: bytecode caches of other Pythons are kept, test suites of the interpreter are not
DEFAULT_EXCLUDES = ("*/__pycache__/*.opt-?.pyc",)
MARKER = ".staged"


class StageError(RuntimeError):
    """The environment cannot be staged as asked; the message says what to change."""


# --- what to stage (pure: paths in, archive members out) ---------------------------------------------

def venv_of(executable: str) -> Path:
    """The environment this Python runs in: the folder holding ``pyvenv.cfg`` next to ``bin/``
    (a venv; found by path, since ``python -S`` does not set ``sys.prefix`` to it), else ``sys.prefix``."""
    env = Path(os.path.abspath(executable)).parent.parent
    return env if (env / "pyvenv.cfg").is_file() else Path(sys.prefix)


def venv_home(env: Path) -> Path | None:
    """The interpreter's prefix a venv was made from (``home`` in its ``pyvenv.cfg`` is its bin folder)."""
    cfg = env / "pyvenv.cfg"
    if not cfg.is_file():
        return None
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).parent
    return None


def site_packages(env: Path) -> list[Path]:
    return sorted(p for p in env.glob("lib/python3*/site-packages") if p.is_dir())


def editable_sources(env: Path) -> dict[str, Path]:
    """Top-level package name -> source folder of every editable install (setuptools' finder
    modules hold a literal ``MAPPING``); these are read from the checkout, not from the env."""
    found: dict[str, Path] = {}
    for sp in site_packages(env):
        for finder in sp.glob("__editable__*_finder.py"):
            for node in ast.walk(ast.parse(finder.read_text())):
                if (isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None
                        and "MAPPING" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)):
                    found.update({k: Path(v) for k, v in ast.literal_eval(node.value).items()})
    return found


def path_pth_entries(env: Path) -> list[str]:
    """Folders outside ``env`` that ``.pth`` files put on ``sys.path`` (old-style editable
    installs): not staged, so said to the user."""
    out = []
    for sp in site_packages(env):
        for pth in sp.glob("*.pth"):
            for line in pth.read_text().splitlines():
                line = line.strip()
                if line and not line.startswith(("#", "import")) and os.path.isabs(line) \
                        and not Path(line).resolve().is_relative_to(env.resolve()):
                    out.append(line)
    return out


def excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel + "/", p) for p in patterns)


STDLIB_EXCLUDES = ("site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "lib2to3/tests",
                   "config-*/*.a")


def members(env: Path, home: Path | None, excludes: tuple[str, ...]) -> list[tuple[Path, str]]:
    """(source path, name in the archive) for everything staged, in a stable order: the
    environment as ``venv/``, its editable packages inside its site-packages, and from the
    interpreter's prefix (``home``) only the interpreter (``bin/python3*``, ``lib/libpython3*``)
    and its standard library, as ``base/`` (never all of a system prefix such as ``/usr``)."""
    out: list[tuple[Path, str]] = []
    sp = site_packages(env)
    drop = {p for s in sp for p in s.glob("__editable__*")}

    def walk(root: Path, prefix: str, skip: tuple[str, ...]) -> None:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames.sort()
            keep = []
            for d in dirnames:
                rel, full = os.path.normpath(os.path.join(rel_dir, d)), Path(dirpath) / d
                if excluded(rel, skip) or full in drop:
                    continue
                if full.is_symlink():                  # a link to a folder is staged as the link
                    out.append((full, f"{prefix}/{rel}"))
                else:
                    keep.append(d)
            dirnames[:] = keep
            for f in sorted(filenames):
                rel, full = os.path.normpath(os.path.join(rel_dir, f)), Path(dirpath) / f
                if not excluded(rel, skip) and full not in drop:
                    out.append((full, f"{prefix}/{rel}"))

    walk(env, "venv", excludes)
    if sp:
        target = os.path.relpath(sp[0], env)
        for name, src in sorted(editable_sources(env).items()):
            walk(src, f"venv/{target}/{name}", excludes)
    if home is not None:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        for path in sorted((home / "bin").glob("python3*")) + sorted((home / "lib").glob("libpython3*")):
            out.append((path, f"base/{path.relative_to(home)}"))
        walk(home / "lib" / version, f"base/lib/{version}", excludes + STDLIB_EXCLUDES)
    return out


def repoint(dest: Path, env: Path, home: Path | None) -> None:
    """Make the unpacked copy at ``dest`` refer to itself: the venv's interpreter links and
    ``pyvenv.cfg`` point at the staged interpreter, and a launcher ``dest/python`` puts the
    staged interpreter's libraries first on the library path."""
    venv = dest / "venv"
    lib_path = ""
    if home is not None:
        base = dest / "base"
        for link in (venv / "bin").iterdir():
            target = os.readlink(link) if link.is_symlink() else ""
            if os.path.isabs(target) and Path(target).is_relative_to(home):
                link.unlink()
                link.symlink_to(base / Path(target).relative_to(home))
        cfg = venv / "pyvenv.cfg"
        lines = []
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            old = Path(value.strip())
            if key.strip() in ("home", "executable") and old.is_relative_to(home):
                line = f"{key.strip()} = {base / old.relative_to(home)}"
            lines.append(line)
        cfg.write_text("\n".join(lines) + "\n")
        lib_path = str(base / "lib")
    launcher = dest / "python"
    exports = f'export LD_LIBRARY_PATH="{lib_path}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n' if lib_path else ""
    launcher.write_text(f"#!/bin/sh\n# the staged copy of {env} (ensemble.runtime.stage): the job's python\n"
                        f"{exports}exec \"{venv / 'bin' / 'python'}\" \"$@\"\n")
    launcher.chmod(0o755)


# --- streaming an archive through MPI_Bcast --------------------------------------------------------------

class BcastWriter(io.RawIOBase):
    """The root's side: what tarfile writes goes out in ``CHUNK``-byte broadcasts, and to
    ``tee`` (the root's own node unpacks it from a pipe)."""

    def __init__(self, comm, mpi, tee=None):
        self.comm, self.mpi, self.tee, self.buf, self.sent = comm, mpi, tee, bytearray(), 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.buf += b
        while len(self.buf) >= CHUNK:
            self._send(bytes(self.buf[:CHUNK]))
            del self.buf[:CHUNK]
        return len(b)

    def _send(self, piece: bytes) -> None:
        self.comm.bcast(len(piece), root=0)
        if piece:
            self.comm.Bcast([piece, self.mpi.BYTE], root=0)
            self.sent += len(piece)
            if self.tee is not None:
                try:
                    self.tee.write(piece)
                except OSError:                      # the local unpacking failed; it says why
                    self.tee = None

    def finish(self) -> None:
        """Send what is left and the end (a chunk of length 0): always, so no leader waits forever."""
        if self.buf:
            self._send(bytes(self.buf))
            self.buf.clear()
        self._send(b"")
        if self.tee is not None:
            try:
                self.tee.close()
            except OSError:                          # the local unpacking stopped early; it says why
                pass


class BcastReader(io.RawIOBase):
    """A node leader's side: tarfile reads the chunks as they arrive."""

    def __init__(self, comm, mpi):
        self.comm, self.mpi, self.chunk, self.pos, self.done = comm, mpi, bytearray(), 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self.pos >= len(self.chunk) and not self.done:
            n = self.comm.bcast(None, root=0)
            if not n:
                self.done = True
                break
            self.chunk, self.pos = bytearray(n), 0
            self.comm.Bcast([self.chunk, self.mpi.BYTE], root=0)
        k = min(len(b), len(self.chunk) - self.pos)
        b[:k] = self.chunk[self.pos:self.pos + k]
        self.pos += k
        return k

    def drain(self) -> None:
        """Receive what is left: a leader that failed, or holds the copy already, still takes
        part in every broadcast."""
        while not self.done:
            self.pos = len(self.chunk)
            self.readinto(bytearray(0))


def incoming_dir(dest: Path) -> Path:
    """Where a node unpacks before the copy is moved in place (beside ``dest``, same file system)."""
    return dest.parent / f".{dest.name}.incoming-{socket.gethostname()}-{os.getpid()}"


def unpack(stream, incoming: Path) -> None:
    shutil.rmtree(incoming, ignore_errors=True)
    incoming.mkdir(parents=True)
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        tar.extractall(incoming, filter="tar")


def install(incoming: Path, dest: Path, env: Path, home: Path | None, stamp: dict) -> None:
    """Move the unpacked parts in place, make them refer to ``dest``, write the marker last."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MARKER).unlink(missing_ok=True)
    for part in ("venv", "base"):
        if (dest / part).is_symlink() or (dest / part).is_file():
            (dest / part).unlink()
        elif (dest / part).exists():
            shutil.rmtree(dest / part)
        if (incoming / part).exists():
            os.replace(incoming / part, dest / part)
    shutil.rmtree(incoming, ignore_errors=True)
    repoint(dest, env, home)
    (dest / MARKER).write_text(json.dumps({"stamp": stamp, "host": socket.gethostname(), "time": time.time()}))


def stream(leaders, MPI, todo: list[tuple[Path, str]] | None, dest: Path, have: bool) -> tuple[int, str | None]:
    """Root: archive ``todo`` and broadcast it while its own node unpacks it from a pipe; every
    other leader: receive and unpack (or only receive, when it holds the copy already). Returns
    (bytes sent, error). The stream always ends with its end chunk, so a failure never hangs."""
    incoming = incoming_dir(dest)
    error: list[str] = []

    def unpack_or_say(fileobj) -> None:
        try:
            unpack(fileobj, incoming)
        except (OSError, tarfile.TarError) as exc:
            error.append(f"unpacking into {dest} on {socket.gethostname()}: {exc}")
        finally:
            fileobj.close()          # on the root, a writer blocked on a full pipe gets an error, not a hang

    if leaders.Get_rank() == 0:
        local = None
        tee = None
        if not have:
            r, w = os.pipe()
            tee = os.fdopen(w, "wb")
            local = threading.Thread(target=unpack_or_say, args=(os.fdopen(r, "rb", buffering=CHUNK),), daemon=True)
            local.start()
        writer = BcastWriter(leaders, MPI, tee)
        try:
            with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for path, name in todo or []:
                    tar.add(str(path), arcname=name, recursive=False)
        except (OSError, tarfile.TarError) as exc:
            error.append(f"reading {todo[0][0] if todo else '?'}...: {exc}")
        finally:
            writer.finish()
        if local is not None:
            local.join()
        return writer.sent, (error[0] if error else None)
    reader = BcastReader(leaders, MPI)
    if not have:
        unpack_or_say(io.BufferedReader(reader, CHUNK))
    reader.drain()
    return 0, (error[0] if error else None)


# --- the MPI program -------------------------------------------------------------------------------------

def import_mpi():
    """mpi4py without ``site``: the environment's site-packages put on the path by hand."""
    if "site" not in sys.modules:
        env = venv_of(sys.executable)
        sys.path.extend(str(sp) for sp in site_packages(env))
        # mpi4py looks for an MPI library in a venv's lib/ through ``site``; an MPI wheel's
        # library there (the mpich wheel) is loaded first, where it would have found it
        import ctypes
        for name in ("libmpi.so.12", "libmpi.so.40", "libmpi.so"):     # mpi4py's order, by ABI
            try:
                ctypes.CDLL(str(env / "lib" / name), mode=ctypes.RTLD_GLOBAL)
                break
            except OSError:                          # absent, or a linker script: the next name
                continue
    from mpi4py import MPI
    return MPI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -S -P ensemble/runtime/stage.py",
        description="Copy this Python environment to node-local storage: read once from the shared file system "
                    "by rank 0 and broadcast to one rank per node. Then start the run with DEST/python.")
    p.add_argument("--to", required=True, metavar="DEST",
                   help="node-local folder to unpack into, e.g. \"$TMPDIR/env\" or /dev/shm/env")
    p.add_argument("--no-python", action="store_true",
                   help="stage the environment only, not the interpreter it was made from (a system Python on "
                        "every node's image, or a conda environment, which holds its own)")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="leave out paths matching GLOB, relative to the environment (repeatable), e.g. "
                        "'lib/python3*/site-packages/mypy*'")
    p.add_argument("--ranks-per-node", type=int, default=0,
                   help=argparse.SUPPRESS)       # tests: pretend nodes of this many ranks on one host; {node} in --to
    return p.parse_args(argv)


def source_stamp(env: Path, home: Path | None) -> dict:
    """What a complete copy came from: the same stamp on a node means nothing to unpack."""
    return {"env": str(env), "home": str(home) if home else None, "env_mtime": os.stat(env).st_mtime_ns,
            "site_mtime": [os.stat(p).st_mtime_ns for p in site_packages(env)],
            "editable": {k: str(v) for k, v in sorted(editable_sources(env).items())}}


def polite_barrier(comm, MPI) -> None:
    """Wait for every rank without spinning a core (MPICH busy-polls in a blocking barrier):
    the node's other ranks sleep while their leader unpacks."""
    req = comm.Ibarrier()
    pause = 0.001
    while not req.Test():
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    MPI = import_mpi()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    node = (world.Split(rank // args.ranks_per_node, rank) if args.ranks_per_node > 0
            else world.Split_type(MPI.COMM_TYPE_SHARED, key=rank))
    leader = node.Get_rank() == 0
    leaders = world.Split(0 if leader else MPI.UNDEFINED, rank)
    node_index = node.bcast(leaders.Get_rank() if leader else None, root=0)
    dest = Path(args.to.replace("{node}", str(node_index))).absolute()

    t0 = time.perf_counter()
    env = venv_of(sys.executable)
    home = None if args.no_python else venv_home(env)
    error, stamp, todo, outside = None, None, None, []
    if rank == 0:
        try:
            if dest.resolve().is_relative_to(env.resolve()) or env.resolve().is_relative_to(dest.resolve()):
                raise StageError(f"--to {args.to} overlaps the environment {env}; give a node-local folder elsewhere, "
                                 "e.g. \"$TMPDIR/env\"")
            stamp = source_stamp(env, home)
            todo = members(env, home, DEFAULT_EXCLUDES + tuple(args.exclude))
            outside = path_pth_entries(env)
        except (OSError, ValueError, SyntaxError, StageError) as exc:
            error = f"--to {args.to}: {exc}" if not isinstance(exc, StageError) else str(exc)
    error, stamp = world.bcast((error, stamp), root=0)
    if error:
        if rank == 0:
            print(f"error: stage: {error}", file=sys.stderr)
        return 2

    sent, failure, unpacked, nodes, failures = 0, None, 0, 0, []
    if leader:
        try:
            have = json.loads((dest / MARKER).read_text()).get("stamp") == stamp
        except (OSError, ValueError):
            have = False
        unpacked = leaders.allreduce(0 if have else 1, op=MPI.SUM)
        nodes = leaders.Get_size()
        if unpacked:
            sent, failure = stream(leaders, MPI, todo, dest, have)
            if not have and failure is None:
                try:
                    install(incoming_dir(dest), dest, env, home, stamp)
                except OSError as exc:
                    failure = f"installing into {dest} on {socket.gethostname()}: {exc}"
        failures = [f for f in leaders.gather(failure, root=0) or [] if f]
    polite_barrier(world, MPI)
    if rank == 0:
        if failures:
            print(f"error: stage: {len(failures)} of {nodes} node(s) failed; first: {failures[0]}", file=sys.stderr)
        else:
            what = f"{len(todo or [])} files ({sent / 2**20:.0f} MiB)" if unpacked else "nothing (every node had it)"
            print(f"staged {what} from {env}{' and ' + str(home) if home else ''} to {args.to} on {unpacked} of "
                  f"{nodes} node(s) in {time.perf_counter() - t0:.1f} s; start the run with {args.to}/python")
            for line in outside:
                print(f"warning: not staged, read from the shared file system: {line} (a path in a .pth file)")
    ok = world.bcast(rank != 0 or not failures, root=0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
