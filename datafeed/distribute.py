"""Broadcast numpy arrays from one rank into one shared-memory copy per node.

Rank ``root`` holds a dict of arrays. Every node gets ONE MPI shared-memory window
with all arrays back to back; node leaders receive the bytes by chunked ``Bcast``
straight into that window (never pickled, each message far below the 2 GiB count
limit), and every rank of the node gets read-only numpy views onto it. Only the small
metadata (names, dtypes, shapes, offsets, checksums) travels pickled.

This is the only datafeed module that imports mpi4py. Waits that may be long (root
still reading, leaders still receiving) poll a non-blocking barrier with a growing
sleep, so idle ranks do not spin a core that the reading rank needs.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

PRETEND_NODES_ENV = "ENSEMBLE_PRETEND_NODES"
_CORRUPT_ENV = "_ENSEMBLE_DISTRIBUTE_CORRUPT"  # test hook: comm rank whose window gets a flipped byte
ALIGN = 64
_CRC_CHUNK = 64 * 2**20
_COPY_CHUNK = 32 * 2**20  # root copies a memmap this much at a time, then drops its pages
_MAX_CHUNK = 2**31 - 1
_MADV_DONTNEED = 4
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class _Meta:
    entries: tuple[_Entry, ...]
    total: int
    verify: bool


class SharedArrays(Mapping[str, np.ndarray]):
    """Read-only numpy views onto this node's shared window, by array name.

    Keeps the MPI window alive while it lives. ``free()`` is collective over
    ``node_comm``; views taken out of it are invalid afterwards (reading them may crash).
    """

    def __init__(self, views: dict[str, np.ndarray], win: MPI.Win, buf: MPI.buffer,
                 node_comm: MPI.Intracomm, nbytes: int) -> None:
        self._views = views
        self._win: MPI.Win | None = win
        self._buf = buf
        self._node = node_comm
        self._nbytes = nbytes

    def __getitem__(self, name: str) -> np.ndarray:
        if self._win is None:
            raise KeyError(f"{name!r}: the shared arrays were freed")
        return self._views[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    @property
    def node_comm(self) -> MPI.Intracomm:
        """The communicator of the ranks sharing this window (valid until ``free()``)."""
        return self._node

    @property
    def nbytes(self) -> int:
        """Bytes of array data held once on this node (alignment padding included)."""
        return self._nbytes

    @property
    def freed(self) -> bool:
        return self._win is None

    def free(self) -> None:
        """Free the window and the node communicator; collective over ``node_comm``."""
        if self._win is None:
            return
        self._views = {}
        self._buf = None
        self._win.Free()
        self._win = None
        self._node.Free()

    def __enter__(self) -> SharedArrays:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        if self._win is None:
            return "SharedArrays(freed)"
        parts = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self._views.items())
        return f"SharedArrays({parts}; {self._nbytes} bytes on node of {self._node.size})"


def nodes_of(comm: MPI.Intracomm, pretend_nodes: int | None = None, *,
             root: int = 0) -> tuple[MPI.Intracomm, MPI.Intracomm | None]:
    """Split ``comm`` into shared-memory nodes; return (node_comm, leaders_comm or None).

    Collective. ``root`` is rank 0 of its node and of the leaders' communicator; the
    other ranks keep their order. ``pretend_nodes=k`` (else the environment variable
    ENSEMBLE_PRETEND_NODES) cuts ``comm`` into k groups of contiguous ranks, each also
    inside one real node, so one machine can play a cluster. Leaders are node rank 0;
    the leaders' communicator is None on the other ranks. The caller frees both.
    """
    k = _pretend_nodes(comm, pretend_nodes)
    key = 0 if comm.rank == root else 1
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=key)
    if k is not None:
        real, node = node, node.Split(comm.rank * k // comm.size, key)
        real.Free()
    leaders = comm.Split(0 if node.rank == 0 else MPI.UNDEFINED, key)
    return node, (None if leaders == MPI.COMM_NULL else leaders)


def broadcast_arrays(comm: MPI.Intracomm, arrays: dict[str, np.ndarray] | None, *,
                     root: int = 0, chunk_bytes: int = 256 * 2**20,
                     pretend_nodes: int | None = None, verify: bool = False) -> SharedArrays:
    """Give every rank of ``comm`` read-only views of root's arrays, one copy per node.

    Collective. Only ``root`` passes ``arrays`` (name -> numeric array of any shape,
    layout or byte order; a read-only memmap is copied chunk by chunk and its pages are
    released as it goes); results are C-contiguous. ``chunk_bytes`` bounds each MPI
    message. ``verify`` (root's value counts) has every node leader compare CRC32
    checksums of what it received and raises RuntimeError on every rank on a mismatch.
    Invalid input raises ValueError on every rank.
    """
    if not 0 < chunk_bytes <= _MAX_CHUNK:
        raise ValueError(f"`chunk_bytes` must be between 1 and {_MAX_CHUNK}, but got {chunk_bytes}")
    _quiet_barrier(comm)  # root may still be reading its data: wait without spinning
    meta = comm.bcast(_describe(arrays, verify) if comm.rank == root else None, root=root)
    if isinstance(meta, str):
        raise ValueError(f"{meta} (raised on root rank {root}, seen on rank {comm.rank} "
                         f"on {socket.gethostname()})")
    node, leaders = nodes_of(comm, pretend_nodes, root=root)
    size = max(meta.total, ALIGN) if node.rank == 0 else 0
    win = MPI.Win.Allocate_shared(size, 1, comm=node)
    buf, _ = win.Shared_query(0)
    if node.rank == 0:
        _prefault(buf)
    failure, sums = None, None
    if comm.rank == root:
        try:
            _fill(buf, arrays, meta)
            sums = _checksums(buf, meta) if meta.verify else None
        except Exception as exc:  # noqa: BLE001 - reported on every rank below instead of a hang
            failure = (f"broadcast_arrays: root rank {root} on {socket.gethostname()} could not "
                       f"copy its arrays into shared memory: {type(exc).__name__}: {exc}")
    bad: list[str] = []
    if leaders is not None:
        _quiet_barrier(leaders)  # root is copying into its window meanwhile
        failure, sums = leaders.bcast((failure, sums), root=0)
        if failure is None:
            view = memoryview(buf)
            for lo in range(0, meta.total, chunk_bytes):
                leaders.Bcast([view[lo:min(lo + chunk_bytes, meta.total)], MPI.BYTE], root=0)
            view.release()
            if os.environ.get(_CORRUPT_ENV) == str(comm.rank):
                _flip_a_byte(buf, meta)
            if meta.verify and comm.rank != root:
                got = _checksums(buf, meta)
                bad = [f"'{e.name}' on rank {comm.rank} ({socket.gethostname()})"
                       for e, want, have in zip(meta.entries, sums, got) if want != have]
        leaders.Free()
    _quiet_barrier(node)  # the leader's writes are complete before anyone reads
    failure = node.bcast(failure, root=0)
    if failure is None and meta.verify:
        _quiet_barrier(comm)
        bad = comm.allreduce(bad, op=MPI.SUM)
        if bad:
            failure = ("broadcast_arrays: checksum mismatch after the transfer for "
                       + ", ".join(bad) + "; the received bytes differ from root's")
    if failure is not None:
        win.Free()
        node.Free()
        raise RuntimeError(failure)
    readonly = MPI.buffer.fromaddress(buf.address, len(buf), readonly=True)
    views = {e.name: _view(readonly, e) for e in meta.entries}
    return SharedArrays(views, win, buf, node, max(meta.total, ALIGN))


def _pretend_nodes(comm: MPI.Intracomm, pretend_nodes: int | None) -> int | None:
    """The pretend node count from the argument or the environment, validated."""
    source, value = "pretend_nodes", pretend_nodes
    if value is None:
        raw = os.environ.get(PRETEND_NODES_ENV, "").strip()
        if not raw:
            return None
        source = PRETEND_NODES_ENV
        try:
            value = int(raw)
        except ValueError:
            value = raw  # type: ignore[assignment]
    if not isinstance(value, int) or not 1 <= value <= comm.size:
        raise ValueError(f"`{source}` must be an integer between 1 and the {comm.size} ranks, "
                         f"but got {value!r}")
    return value


def _describe(arrays: dict[str, np.ndarray] | None, verify: bool) -> _Meta | str:
    """Root's layout of the window, or an error message every rank will raise."""
    if not isinstance(arrays, Mapping):
        return f"broadcast_arrays: root must pass a dict of name -> array, but got {type(arrays).__name__}"
    entries, offset = [], 0
    for name, arr in arrays.items():
        if not isinstance(name, str):
            return f"broadcast_arrays: array names must be str, but got {name!r}"
        dtype = np.asarray(arr).dtype if not isinstance(arr, np.ndarray) else arr.dtype
        if dtype.hasobject:
            return (f"broadcast_arrays: array '{name}' has dtype {dtype}, which holds Python "
                    "objects; only numeric dtypes can be shared")
        shape = tuple(int(n) for n in np.shape(arr))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        entries.append(_Entry(name, dtype, shape, offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return _Meta(tuple(entries), offset, bool(verify))


def _fill(buf: MPI.buffer, arrays: Mapping[str, np.ndarray], meta: _Meta) -> None:
    """Copy root's arrays into the window, C order, chunk by chunk where possible."""
    for e in meta.entries:
        if e.nbytes == 0:
            continue
        src = arrays[e.name]
        src = src if isinstance(src, np.ndarray) else np.asarray(src, dtype=e.dtype)
        dst = np.frombuffer(buf, np.uint8, e.nbytes, e.offset)
        if not src.flags.c_contiguous:
            np.copyto(dst.view(e.dtype).reshape(e.shape), src)
            continue
        flat = src.reshape(-1).view(np.uint8)
        release = isinstance(src, np.memmap) and src.mode in ("r", "r+")
        for lo in range(0, e.nbytes, _COPY_CHUNK):
            hi = min(lo + _COPY_CHUNK, e.nbytes)
            dst[lo:hi] = flat[lo:hi]
            if release:
                _drop_pages(flat.ctypes.data + lo, flat.ctypes.data + hi)


def _drop_pages(lo: int, hi: int) -> None:
    """Unmap the whole pages of a shared file mapping in [lo, hi) from this process.

    The file stays in the page cache; this only keeps root's resident memory at one
    copy (the window) instead of two while it copies a memmap.
    """
    _madvise(lo // _PAGE * _PAGE, hi // _PAGE * _PAGE, _MADV_DONTNEED)


def _prefault(buf: MPI.buffer) -> None:
    """Populate the window's pages in one call rather than one fault per page.

    On a VM, first-touch faults on shared memory made the copy into a fresh window
    ~10x slower than into a populated one; leaders do this while root is still busy.
    """
    lo = buf.address // _PAGE * _PAGE
    _madvise(lo, buf.address + len(buf), _MADV_POPULATE_WRITE)


def _madvise(lo: int, hi: int, advice: int) -> None:
    """Best-effort madvise on Linux; a kernel that refuses the advice changes nothing."""
    if _LIBC is not None and hi > lo:
        _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), advice)


def _checksums(buf: MPI.buffer, meta: _Meta) -> list[int]:
    """CRC32 of each array's bytes in the window, in chunks."""
    view, sums = memoryview(buf), []
    for e in meta.entries:
        crc = 0
        for lo in range(e.offset, e.offset + e.nbytes, _CRC_CHUNK):
            crc = zlib.crc32(view[lo:min(lo + _CRC_CHUNK, e.offset + e.nbytes)], crc)
        sums.append(crc)
    view.release()
    return sums


def _flip_a_byte(buf: MPI.buffer, meta: _Meta) -> None:
    """Test hook: corrupt the first byte of the first non-empty array."""
    for e in meta.entries:
        if e.nbytes:
            view = np.frombuffer(buf, np.uint8, 1, e.offset)
            view[0] ^= 0xFF
            return


def _view(readonly: MPI.buffer, e: _Entry) -> np.ndarray:
    """A read-only array of entry ``e`` inside the window."""
    if e.nbytes == 0:
        arr = np.empty(e.shape, e.dtype)
    else:
        arr = np.frombuffer(readonly, e.dtype, e.nbytes // e.dtype.itemsize, e.offset).reshape(e.shape)
    arr.flags.writeable = False
    return arr


def _quiet_barrier(comm: MPI.Intracomm) -> None:
    """Barrier that sleeps between polls (growing to 50 ms) instead of spinning a core."""
    req = comm.Ibarrier()
    delay = 0.0
    while not req.Test():
        if delay:
            time.sleep(delay)
        delay = min(max(delay * 2, 1e-4), 0.05)
