"""A member's state (weights and optimizer state) sent straight from one worker to another.

Population-based training copies a strong member into a weak one between rounds. The
state goes from the donor's group leader to the receiver's over MPI, never through the
master (rank 0 sees only the small reports and decisions) and never through files: one
small pickled header (shapes and dtypes) and one contiguous byte buffer per copy. Inside a
member group the leader shares what it received with one broadcast. Every wait probes and
sleeps instead of spinning a core.
"""

from __future__ import annotations

import numpy as np

from ensemble.runtime.mpi import TAG_STATE, polite_bcast, polite_wait, poll_recv

Header = list[tuple[tuple[int, ...], str]]


def pack(arrays: list[np.ndarray]) -> tuple[Header, np.ndarray]:
    """(header, buffer): every array's shape and dtype, and their bytes end to end (exact
    for every dtype)."""
    arrays = [np.asarray(a, order="C") for a in arrays]        # (ascontiguousarray makes 0-d arrays 1-d)
    header = [(tuple(a.shape), a.dtype.str) for a in arrays]
    if not arrays:
        return header, np.empty(0, np.uint8)
    return header, np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays])


def unpack(header: Header, buffer: np.ndarray) -> list[np.ndarray]:
    """The arrays ``pack`` made ``buffer`` from (views of it)."""
    if header_bytes(header) != len(buffer):
        raise ValueError(f"a member state of {len(buffer)} bytes does not match its header "
                         f"({header_bytes(header)} bytes)")
    out, offset = [], 0
    for shape, dtype in header:
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        out.append(buffer[offset:offset + n].view(dt).reshape(shape))
        offset += n
    return out


def header_bytes(header: Header) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in header)


def state_bytes(arrays: list[np.ndarray]) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays))


def send_state(comm, arrays: list[np.ndarray], dests: list[int], max_sleep: float = 0.05) -> int:
    """Send the state to each rank in ``dests`` (non-blocking, all at once); returns the bytes
    sent (the buffer's size times the number of receivers)."""
    header, buffer = pack(arrays)
    requests = []
    for dest in dests:
        requests.append(comm.isend(header, dest=dest, tag=TAG_STATE))
        requests.append(comm.Isend(buffer, dest=dest, tag=TAG_STATE))
    polite_wait(requests, max_sleep)
    return len(buffer) * len(dests)


def recv_state(comm, source: int, max_sleep: float = 0.05) -> tuple[list[np.ndarray], int]:
    """(arrays, bytes received) of the state ``source`` sends with ``send_state``."""
    header, _, _ = poll_recv(comm, source, TAG_STATE, max_sleep)
    size = header_bytes(header)
    buffer = np.empty(size, np.uint8)
    polite_wait([comm.Irecv(buffer, source=source, tag=TAG_STATE)], max_sleep)
    return unpack(header, buffer), size


def share_in_group(group, arrays: list[np.ndarray] | None, max_sleep: float = 0.05) -> list[np.ndarray]:
    """The leader's (rank 0's) ``arrays`` on every rank of ``group``: one header, one
    non-blocking broadcast of the bytes. A group of one (or None) returns ``arrays``."""
    if group is None or group.Get_size() == 1:
        return arrays
    leader = group.Get_rank() == 0
    header, buffer = pack(arrays) if leader else (None, None)
    header = polite_bcast(group, header, 0, max_sleep)
    if not leader:
        buffer = np.empty(header_bytes(header), np.uint8)
    polite_wait([group.Ibcast(buffer, root=0)], max_sleep)
    return arrays if leader else unpack(header, buffer)
