"""Packed, append-only store of member arrays: a few files for any number of members.

A run keeps the validation and test predictions (and variances, and training history) of
its candidate members, the ones ensemble selection may pick (``results.retention``). A
file per member and array would put millions of files on a parallel file system at
100,000 members; the store appends them instead to ``store/predictions-NNN.pack``, one
writer (the master), a new file every ``roll_bytes``.

Each entry is self-describing and checked::

    b"EPK1" | header length (u32) | payload length (u64) | crc32 of header + payload (u32)
    | header (JSON: member id, meta, [name, dtype, shape, offset, nbytes] per array) | payload

An entry is written with one ``write`` and flushed; ``sync`` fsyncs it (the run calls it
just before the journal's fsync, so a journal line that is on disk never names an entry
that is not). Opening the store reads every entry's header and checks every checksum: a
torn or zero-filled tail (a crash mid-append, a node that lost its page cache) is cut off
and what was before it stays whole; a damaged entry in the middle of a file (a flipped
bit in its magic, length or payload) is skipped by resynchronising on the next valid
entry, never by cutting the valid ones after it. The index (member id -> file, offset)
lives in memory and is rebuilt on open, so the journal never has to name offsets, and
``compact`` can rewrite the live entries into a fresh file (written and fsynced before
the old ones are removed: a crash in between leaves duplicates, and the later copy wins).

Several writers share one folder without locks (a master hierarchy's sub-masters, each
keeping its own members' books): writer ``w`` numbers its files from ``w * WRITER_FILES``
on, so no two processes append to one file. Writer 0 (the master) reads every writer's
files, and so sees the union; writer ``w > 0`` indexes only its own, and never cuts the
tail of a file another process may be appending to.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import zlib
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"EPK1"
PREFIX = struct.Struct("<4sIQI")          # magic, header length, payload length, crc32
ROLL_BYTES = 1 << 30                       # a new pack file after 1 GiB
WRITER_FILES = 1_000_000                   # file numbers each writer has: writer w's start at w * WRITER_FILES
_NAME = "predictions-{:03d}.pack"


class PackStore:
    """Member id -> (arrays, meta) in append-only pack files under ``folder``."""

    def __init__(self, folder: str | Path, roll_bytes: int = ROLL_BYTES, read_only: bool = False,
                 writer: int = 0):
        """``read_only``: another process may be appending (the master, while its tracking
        writer reads the histories of earlier members): a torn tail is left alone, not cut,
        and ``put`` refuses. ``writer``: which writer's files this one appends to (0, the
        master, reads every writer's; another reads only its own)."""
        self.folder = Path(folder)
        self.roll_bytes = roll_bytes
        self.read_only = read_only
        self.writer = writer
        self._own = range(writer * WRITER_FILES, (writer + 1) * WRITER_FILES)
        self.index: dict[str, tuple[int, int, int]] = {}     # id -> (file number, offset, length)
        self.lost_bytes = 0                                    # torn tails cut, bad entries skipped
        self._sizes: dict[int, int] = {}
        self._fh = None
        self._current = -1
        self._dirty = False
        if self.folder.is_dir():
            for path in sorted(self.folder.glob("predictions-*.pack")):
                try:
                    number = int(path.stem.rsplit("-", 1)[1])
                except ValueError:
                    continue
                if writer == 0 or number in self._own:
                    self._scan(number, path)

    # -- paths ----------------------------------------------------------------------
    def path(self, number: int) -> Path:
        return self.folder / _NAME.format(number)

    @property
    def files(self) -> list[Path]:
        return [self.path(n) for n in sorted(self._sizes)]

    @property
    def bytes(self) -> int:
        return sum(self._sizes.values())

    def live_bytes(self) -> int:
        return sum(length for _, _, length in self.index.values())

    def __contains__(self, member_id: str) -> bool:
        return member_id in self.index

    def __len__(self) -> int:
        return len(self.index)

    # -- reading --------------------------------------------------------------------
    def _scan(self, number: int, path: Path) -> None:
        """Index one pack file. A damaged entry (bad magic, length or checksum: a flipped bit,
        a zeroed block) is skipped by resynchronising on the next valid entry, so one bad
        byte costs one entry; only what lies past the last valid entry (a torn tail) is cut."""
        size = path.stat().st_size
        keep = good_bytes = 0
        with open(path, "rb") as fh:
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            try:
                pos = 0
                while pos < size:
                    entry = _entry_at(data, pos, size)
                    if entry is None:
                        nxt = data.find(MAGIC, pos + 1)
                        while nxt != -1 and _entry_at(data, nxt, size) is None:
                            nxt = data.find(MAGIC, nxt + 1)
                        if nxt == -1:
                            break                          # nothing valid after it: a torn tail
                        log.warning("%s: %d damaged byte(s) at byte %d skipped; the entries after them are "
                                    "whole", path, nxt - pos, pos)
                        pos = nxt
                        continue
                    end, member_id = entry
                    self.index[member_id] = (number, pos, end - pos)     # a later copy wins
                    keep, good_bytes, pos = end, good_bytes + end - pos, end
            finally:
                if isinstance(data, mmap.mmap):
                    data.close()
        self.lost_bytes += size - good_bytes
        if keep < size and not self.read_only:    # past the last valid entry: a torn or zero-filled tail
            log.warning("%s: cut %d bytes of torn tail (a crash mid-append); entries before it are whole",
                        path, size - keep)
            with open(path, "r+b") as fh:
                fh.truncate(keep)
                fh.flush()
                os.fsync(fh.fileno())
        self._sizes[number] = keep

    def get(self, member_id: str) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, meta) of ``member_id``; KeyError if the store does not hold it."""
        number, offset, length = self.index[member_id]
        if self._fh is not None and number == self._current and self._dirty:
            self._fh.flush()
        with open(self.path(number), "rb") as fh:
            fh.seek(offset)
            blob = fh.read(length)
        magic, hlen, plen, crc = PREFIX.unpack_from(blob)
        body = memoryview(blob)[PREFIX.size:]
        if magic != MAGIC or len(body) != hlen + plen or zlib.crc32(body) != crc:
            raise ValueError(f"{self.path(number)}: entry of {member_id!r} at byte {offset} is damaged")
        header = json.loads(bytes(body[:hlen]))
        payload = body[hlen:]
        arrays = {}
        for name, dtype, shape, start, nbytes in header["arrays"]:
            arrays[name] = np.frombuffer(payload[start:start + nbytes], dtype=np.dtype(dtype)).reshape(shape).copy()
        return arrays, header.get("meta", {})

    # -- writing --------------------------------------------------------------------
    def _open_for_append(self, length: int) -> None:
        """The file to append ``length`` bytes to: the last one, or a new one past ``roll_bytes``."""
        if self._fh is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._current = self._last_own()
            self._sizes.setdefault(self._current, 0)
            self._fh = open(self.path(self._current), "ab")
        if self._sizes[self._current] and self._sizes[self._current] + length > self.roll_bytes:
            self.sync()
            self._fh.close()
            self._current += 1
            self._sizes[self._current] = 0
            self._fh = open(self.path(self._current), "ab")

    def _last_own(self) -> int:
        """The number of this writer's last file (its first when it has none)."""
        return max((n for n in self._sizes if n in self._own), default=self._own.start)

    def put(self, member_id: str, arrays: dict[str, np.ndarray], meta: dict | None = None) -> None:
        """Append ``member_id``'s arrays in one write (flushed, not yet fsynced)."""
        if self.read_only:
            raise ValueError(f"{self.folder}: this store was opened read-only")
        blob = encode(member_id, arrays, meta)
        self._open_for_append(len(blob))
        offset = self._sizes[self._current]
        self._fh.write(blob)
        self._fh.flush()
        self._sizes[self._current] = offset + len(blob)
        self.index[member_id] = (self._current, offset, len(blob))
        self._dirty = True

    def sync(self) -> None:
        if self._fh is not None and self._dirty:
            os.fsync(self._fh.fileno())
            self._dirty = False

    def close(self) -> None:
        if self._fh is not None:
            self.sync()
            self._fh.close()
            self._fh = None

    def compact(self, live: set[str]) -> int:
        """Keep only the entries of ``live`` ids: copy them into a new pack file (fsynced)
        and remove the old files. Returns the bytes freed."""
        before = self.bytes
        keep = sorted(i for i in live if i in self.index)
        old = sorted(self._sizes)
        self.close()
        number = self._last_own() + (self._last_own() in self._sizes)
        path = self.path(number)
        index, offset = {}, 0
        if keep:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as out:
                for member_id in keep:
                    n, start, length = self.index[member_id]
                    with open(self.path(n), "rb") as fh:
                        fh.seek(start)
                        out.write(fh.read(length))
                    index[member_id] = (number, offset, length)
                    offset += length
                out.flush()
                os.fsync(out.fileno())
        for n in old:
            self.path(n).unlink(missing_ok=True)
        self.index = index
        self._sizes = {number: offset} if keep else {}
        return before - offset


def _entry_at(data, pos: int, size: int) -> tuple[int, str] | None:
    """(end, member id) of a valid entry at ``pos`` of ``data`` (a pack file's bytes), or
    None: the magic, lengths within the file, checksum and JSON header must all hold."""
    if pos + PREFIX.size > size:
        return None
    magic, hlen, plen, crc = PREFIX.unpack(data[pos:pos + PREFIX.size])
    end = pos + PREFIX.size + hlen + plen
    if magic != MAGIC or end > size:
        return None
    body = data[pos + PREFIX.size:end]
    if zlib.crc32(body) != crc:
        return None
    try:
        return end, str(json.loads(body[:hlen])["id"])
    except (ValueError, KeyError, TypeError):
        return None


def encode(member_id: str, arrays: dict[str, np.ndarray], meta: dict | None = None) -> bytes:
    """One entry: prefix, JSON header, the arrays' bytes back to back."""
    specs, chunks, offset = [], [], 0
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        data = array.tobytes()
        specs.append([name, array.dtype.str, list(array.shape), offset, len(data)])
        chunks.append(data)
        offset += len(data)
    header = json.dumps({"id": member_id, "meta": meta or {}, "arrays": specs}, allow_nan=True).encode("utf-8")
    body = header + b"".join(chunks)
    return PREFIX.pack(MAGIC, len(header), offset, zlib.crc32(body)) + body
