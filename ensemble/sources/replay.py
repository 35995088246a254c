"""The replay buffer of online training (mode "online"): a bounded set of the samples a
simulation streamed, from which each new member trains. Pure numpy; no MPI.

Two policies (``online.policy``):

- ``"fifo"``: the newest ``capacity`` samples (a ring): members follow the simulation's
  present and forget its past;
- ``"reservoir"``: a uniform sample of everything offered so far (Vitter's algorithm R):
  members see the whole history in proportion, early and late alike.

And what happens when the simulation outpaces training (``online.when_behind``): every
offer goes in (``"replace"``: the policy decides what leaves), or, once ``max_unseen``
samples arrived since the last member took a snapshot, the rest are dropped and counted
(``"drop"``) until the next snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POLICIES = ("reservoir", "fifo")
WHEN_BEHIND = ("replace", "drop")


@dataclass
class BufferCounts:
    """What the buffer did with what it was offered."""
    offered: int = 0          # samples offered (received from the simulation)
    taken: int = 0            # samples that went in (then maybe replaced)
    dropped: int = 0          # samples refused because training was behind (``when_behind = "drop"``)
    snapshots: int = 0


class ReplayBuffer:
    """A bounded buffer of (x, y) samples, each with its origin (simulation rank, message
    number), so that a published ensemble can say which samples it trained on."""

    def __init__(self, capacity: int, policy: str = "reservoir", when_behind: str = "replace",
                 max_unseen: int | None = None, seed: int = 0):
        if capacity < 1:
            raise ValueError(f"`online.buffer` must be at least 1, but got {capacity}")
        if policy not in POLICIES:
            raise ValueError(f"`online.policy` must be one of {', '.join(POLICIES)}, but got {policy!r}")
        if when_behind not in WHEN_BEHIND:
            raise ValueError(f"`online.when_behind` must be one of {', '.join(WHEN_BEHIND)}, but got {when_behind!r}")
        self.capacity, self.policy, self.when_behind = int(capacity), policy, when_behind
        self.max_unseen = int(max_unseen) if max_unseen else self.capacity
        self.rng = np.random.default_rng(seed)
        self.counts = BufferCounts()
        self.size = 0
        self.unseen = 0           # samples taken since the last snapshot
        self.version = 0          # changes whenever the contents do
        self._head = 0            # fifo: the slot the next sample goes to
        self.x: np.ndarray | None = None
        self.y: np.ndarray | None = None
        self.rank = np.zeros(self.capacity, np.int32)
        self.seq = np.zeros(self.capacity, np.int64)

    def _allocate(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x = np.zeros((self.capacity, *x.shape[1:]), np.float32)
        self.y = np.zeros((self.capacity, *y.shape[1:]), y.dtype if y.dtype.kind in "iu" else np.float32)

    def offer(self, x, y, rank: int = 0, seq: int = 0) -> int:
        """Offer a batch of samples (from simulation rank ``rank``, its message ``seq``);
        returns how many went in (the rest were dropped: training is behind)."""
        x, y = np.asarray(x), np.asarray(y)
        if len(x) != len(y):
            raise ValueError(f"a batch of {len(x)} inputs but {len(y)} targets")
        for what, a in (("inputs", x), ("targets", y)):      # one such sample makes every later member NaN
            if a.dtype.kind in "fc" and len(a):
                bad = ~np.isfinite(a.reshape(len(a), -1)).all(axis=1)
                if bad.any():
                    raise ValueError(f"samples with NaN/inf {what}: the batch is refused ({int(bad.sum())} of its "
                                     f"{len(a)}, first rows {np.flatnonzero(bad)[:5].tolist()}); send finite samples")
        n = len(x)
        self.counts.offered += n
        if self.when_behind == "drop":
            room = max(0, self.max_unseen - self.unseen)
            if n > room:
                self.counts.dropped += n - room
                x, y, n = x[:room], y[:room], room
        if n == 0:
            return 0
        if self.x is None:
            self._allocate(x, y)
        elif x.shape[1:] != self.x.shape[1:] or y.shape[1:] != self.y.shape[1:]:
            raise ValueError(f"samples of shape {list(x.shape[1:])} -> {list(y.shape[1:])}, but the buffer holds "
                             f"{list(self.x.shape[1:])} -> {list(self.y.shape[1:])}")
        slots = self._slots(n)
        keep = slots >= 0
        self.x[slots[keep]] = x[keep]
        self.y[slots[keep]] = y[keep]
        self.rank[slots[keep]] = rank
        self.seq[slots[keep]] = seq
        self.counts.taken += n
        self.unseen += n
        self.version += 1
        return n

    def _slots(self, n: int) -> np.ndarray:
        """The slot of each of ``n`` new samples (-1: not kept, reservoir only); a later
        sample overwrites an earlier one given the same slot, as one by one would."""
        if self.policy == "fifo":
            slots = (self._head + np.arange(n)) % self.capacity
            self._head = int((self._head + n) % self.capacity)
            self.size = min(self.capacity, self.size + n)
            return slots
        seen = self.counts.taken                       # samples offered to the reservoir before these
        slots = np.full(n, -1, np.int64)
        fill = min(n, max(0, self.capacity - self.size))
        slots[:fill] = self.size + np.arange(fill)
        self.size += fill
        if fill < n:                                   # algorithm R: the i-th sample (0-based) stays with
            i = seen + np.arange(fill, n)              # probability capacity / (i + 1), in a random slot
            j = np.floor(self.rng.random(n - fill) * (i + 1)).astype(np.int64)
            slots[fill:] = np.where(j < self.capacity, j, -1)
        return slots

    def snapshot(self) -> dict[str, np.ndarray]:
        """A copy of the contents (``x``, ``y``, ``rank``, ``seq``); a member trains on it.
        The samples counted as unseen start again from zero."""
        if self.x is None or self.y is None:
            raise ValueError("the replay buffer is empty")
        self.unseen = 0
        self.counts.snapshots += 1
        n = self.size
        return {"x": self.x[:n].copy(), "y": self.y[:n].copy(), "rank": self.rank[:n].copy(),
                "seq": self.seq[:n].copy()}

    def restore(self, saved: dict[str, np.ndarray]) -> None:
        """Contents as a snapshot left them (``--resume``); the newest first out for fifo."""
        x, y = np.asarray(saved["x"]), np.asarray(saved["y"])
        n = min(len(x), self.capacity)
        x, y = x[-n:], y[-n:]
        self._allocate(x, y)
        assert self.x is not None and self.y is not None
        self.x[:n], self.y[:n] = x, y
        self.rank[:n] = np.asarray(saved["rank"])[-n:]
        self.seq[:n] = np.asarray(saved["seq"])[-n:]
        self.size, self._head = n, n % self.capacity
        self.counts.taken = max(self.counts.taken, n)
        self.version += 1


def newest(snapshot: dict[str, np.ndarray]) -> dict[int, int]:
    """Simulation rank -> the newest message number of its that a snapshot holds."""
    out: dict[int, int] = {}
    for r in np.unique(snapshot["rank"]):
        out[int(r)] = int(snapshot["seq"][snapshot["rank"] == r].max())
    return out
