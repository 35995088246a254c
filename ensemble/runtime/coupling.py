"""Online training's wire (mode "online"): the messages between a simulation's ranks and the
ensemble's master over the intercommunicator ``mpi.couple`` made, and the master's end of it.

Up (simulation rank -> ensemble master, ``mpi.TAG_ONLINE_UP``), pickled dicts:
``{"kind": "samples", "seq", "sent", "x", "y"}`` and ``{"kind": "close", "sent", "dropped"}``.
Down (master -> one simulation rank, ``mpi.TAG_ONLINE_DOWN``, in order):
``{"kind": "ack", "seq", "taken", "generation", "run_dir"}`` (one per samples message: it
returns the sender's credit; with ``"error"`` when the batch was refused, as a batch of
another sample shape is: the link goes on), ``{"kind": "generation", "generation", "run_dir", "seq",
"published"}`` (a new ensemble; ``seq``: this rank's newest message it trained on),
``{"kind": "failed", "generation", "error"}`` (a publish that failed) and, last,
``{"kind": "bye"}`` (the answer to "close": nothing more comes), or ``{"kind": "ended",
"reason"}`` when the ensemble's run ends while the simulation still streams.

``Inlet`` is the master's end: a thread that receives, hands samples to a callback (the
replay buffer), answers each with an ack at once, and sends the announcements; the master's
loop never waits on the simulation and the simulation never waits on training. ``Window``
is the simulation's bound on messages in flight (pure; ``inference.online`` uses it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

SAMPLES, CLOSE = "samples", "close"
ACK, GENERATION, FAILED, BYE, ENDED = "ack", "generation", "failed", "bye", "ended"


@dataclass
class Window:
    """The simulation side's bound: at most ``limit`` sample messages sent and not yet
    acknowledged. A batch offered while the window is full is dropped and counted: the
    simulation never waits for the ensemble."""
    limit: int
    in_flight: dict[int, tuple[float, int]] = field(default_factory=dict)    # seq -> (time sent, samples)
    next_seq: int = 0
    sent: int = 0             # samples sent
    dropped: int = 0          # samples dropped here (window full)
    dropped_remote: int = 0   # samples the ensemble side refused (``online.when_behind = "drop"``)
    sent_at: dict[int, float] = field(default_factory=dict)     # the newest messages' send times (bounded)
    remember: int = 100_000

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"in_flight must be at least 1, but got {self.limit}")

    def open(self) -> bool:
        return len(self.in_flight) < self.limit

    def take(self, n: int, now: float) -> int | None:
        """A message number for a batch of ``n`` samples, or None: the window is full, the
        batch is dropped (counted)."""
        if not self.open():
            self.dropped += n
            return None
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.in_flight[seq] = (now, n)
        self.sent_at[seq] = now
        if len(self.sent_at) > self.remember:
            self.sent_at.pop(next(iter(self.sent_at)))
        self.sent += n
        return seq

    def acked(self, seq: int, taken: int) -> None:
        """The ensemble received message ``seq`` and took ``taken`` of its samples."""
        _, n = self.in_flight.pop(seq, (0.0, taken))
        self.dropped_remote += max(0, n - taken)


def _length(x) -> int:
    try:
        return len(x)
    except TypeError:
        return 1


def refusal_kind(error: str) -> str:
    """What a refused batch's reason says without its counts ("...: the batch is refused (3 of
    its 32, ...)"): the two ends say each kind of refusal once, not once a batch."""
    return error.split(" (")[0]


def tell_ended(inter, ranks, reason: str) -> None:
    """Tell the simulation ``ranks`` (on the intercommunicator ``inter``) that the ensemble side
    ended (``reason``): they drop what they would send and their close() returns at once."""
    from ensemble.runtime import mpi
    for rank in ranks:
        try:
            inter.send({"kind": ENDED, "reason": reason}, dest=rank, tag=mpi.TAG_ONLINE_DOWN)
        except Exception as exc:                # noqa: BLE001 - the run's end is not held up by the link
            log.warning(f"online: could not tell simulation rank {rank} the run ended: {exc}")


class Inlet:
    """The ensemble master's end of the link: a thread that receives the simulation's
    messages on ``inter`` and answers them. ``take(rank, seq, x, y) -> taken`` is called
    (under ``lock``) for every batch. ``announce`` tells every open simulation rank of a new
    ensemble. ``closed`` is set once every simulation rank has said "close"."""

    def __init__(self, inter, take: Callable[..., int], max_sleep: float = 0.01):
        from ensemble.runtime import mpi
        self._mpi, self.inter, self.take, self.max_sleep = mpi, inter, take, max_sleep
        self.ranks = inter.Get_remote_size()
        self.open = set(range(self.ranks))
        self.lock = threading.RLock()            # the buffer and the link's state
        self.closed = threading.Event()
        self.generation, self.run_dir = 0, ""
        self.messages = self.samples = 0
        self.first_sent: float | None = None     # the simulation's clock, first sample message
        self.sim_counts: dict[int, dict] = {}    # what each simulation rank said at "close"
        self.error: BaseException | None = None
        self.refused = 0                          # samples in batches the buffer could not take
        self.refused_error: str | None = None    # why, the latest
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="online-inlet", daemon=True)
        self._thread.start()

    def _send(self, rank: int, msg: dict) -> None:
        self.inter.send(msg, dest=rank, tag=self._mpi.TAG_ONLINE_DOWN)

    def _loop(self) -> None:
        sleep = 1e-4
        try:
            while not self._stop.is_set() and self.open:
                got = self._mpi.try_recv(self.inter, self._mpi.ANY_SOURCE, self._mpi.TAG_ONLINE_UP)
                if got is None:
                    time.sleep(sleep)
                    sleep = min(sleep * 2, self.max_sleep)
                    continue
                sleep = 1e-4
                msg, rank, _ = got
                with self.lock:
                    self._handle(msg, rank)
        except BaseException as exc:            # noqa: BLE001 - said by the master (``check``), never a hang
            self.error = exc
            log.error(f"online: the link to the simulation failed: {type(exc).__name__}: {exc}")
        finally:
            self.closed.set()

    def _handle(self, msg: dict, rank: int) -> None:
        if msg["kind"] == SAMPLES:
            error = None
            try:
                taken = self.take(rank, msg["seq"], msg["x"], msg["y"])
            except (ValueError, TypeError) as exc:    # a batch the buffer cannot hold: refused, said, counted
                taken, error = 0, f"{type(exc).__name__}: {exc}"
                self.refused += _length(msg["x"])
                if refusal_kind(error) != refusal_kind(self.refused_error or ""):     # said once a kind
                    log.warning(f"online: a batch from simulation rank {rank} was refused ({error}); "
                                "the link goes on")
                self.refused_error = error
            self.messages += 1
            self.samples += _length(msg["x"])
            if self.first_sent is None:
                self.first_sent = msg["sent"]
            self._send(rank, {"kind": ACK, "seq": msg["seq"], "taken": int(taken),
                              "generation": self.generation, "run_dir": self.run_dir,
                              **({"error": error} if error else {})})
        elif msg["kind"] == CLOSE:
            self.sim_counts[rank] = {k: v for k, v in msg.items() if k != "kind"}
            self._send(rank, {"kind": BYE})
            self.open.discard(rank)
            log.info(f"online: simulation rank {rank} closed ({len(self.open)} still streaming)")

    def announce(self, generation: int, run_dir: str, seqs: dict[int, int] | None = None) -> None:
        """A new ensemble is published: every simulation rank still streaming is told
        (``seqs``: rank -> its newest message the ensemble trained on)."""
        with self.lock:
            self.generation, self.run_dir = generation, run_dir
            for rank in sorted(self.open):
                self._send(rank, {"kind": GENERATION, "generation": generation, "run_dir": run_dir,
                                  "seq": (seqs or {}).get(rank), "published": time.time()})

    def failed(self, generation: int, error: str) -> None:
        """A publish failed: the simulation ranks keep the last ensemble, and are told why."""
        with self.lock:
            for rank in sorted(self.open):
                self._send(rank, {"kind": FAILED, "generation": generation, "error": error})

    def wait_closed(self, timeout: float | None = None) -> bool:
        return self.closed.wait(timeout)

    def stop(self, reason: str = "") -> None:
        """End the thread (the run is over); simulation ranks still streaming are told
        ``reason`` ("ended") and get nothing more."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        with self.lock:
            tell_ended(self.inter, sorted(self.open), reason)
