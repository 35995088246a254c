"""The simulation's side of online training: stream samples to an ensemble that trains beside
the simulation (mode "online", one MPMD job), and use the newest ensemble it published.

    mpirun -n S python sim.py : -n E python -m ensemble.run config.toml

```python
from ensemble.inference import online
stream = online.connect()            # collective over COMM_WORLD, before any other collective on it
comm = stream.comm                   # the simulation's own ranks: decompose the domain over this
for step in range(steps):
    simulate_one_step(comm)
    stream.send(x, y)                # never waits; dropped and counted when the ensemble is behind
    ens = stream.ensemble()          # the newest published InSitu, or None before the first
    if ens is not None:
        out = ens.predict(features)
stream.close()
```

``send`` is non-blocking: at most ``in_flight`` messages per rank are on their way and not
yet acknowledged (``runtime.coupling.Window``); a batch sent beyond that is dropped and
counted. ``ensemble()`` never waits either: a newly announced generation is loaded in a
background thread (``insitu.load`` on this rank alone, placement "local"), and the previous
ensemble is returned until it is ready. A generation that fails to load, or to publish on
the ensemble side, is logged and the last good one kept.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from dataclasses import dataclass, field

from ensemble.inference.insitu import BUCKETS, InSitu
from ensemble.inference.insitu import load as load_insitu
from ensemble.inference.load import PredictError
from ensemble.runtime import coupling, mpi

log = logging.getLogger(__name__)

#: how long a stream closed as Python exits waits for the ensemble side's goodbye
CLOSE_AT_EXIT_SECONDS = 20.0
#: default: sample messages per rank in flight (``online.in_flight`` is the ensemble config's word for it)
IN_FLIGHT = 4


@dataclass
class StreamStats:
    """What this rank's stream did: samples sent, dropped here (window full) and by the
    ensemble side (training behind), generations announced and loaded, and for each loaded
    generation the latency from the newest sample of this rank it trained on leaving this
    rank to the ensemble's announcement reaching it (seconds, this rank's clock)."""
    sent: int = 0
    dropped: int = 0
    dropped_remote: int = 0
    announced: int = 0
    loaded: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    load_seconds: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    send_seconds: float = 0.0


class Stream:
    """One simulation rank's link to the ensemble program (made by ``connect``)."""

    def __init__(self, comm, inter, in_flight: int = IN_FLIGHT, threads: int = 1,
                 buckets: tuple[int, ...] = BUCKETS, background: bool = True):
        self.comm, self.inter = comm, inter
        self.window = coupling.Window(in_flight)
        self.threads, self.buckets, self.background = threads, buckets, background
        self.stats = StreamStats()
        self.generation = 0                     # of the ensemble ``ensemble()`` returns
        self.run_dir: str | None = None
        self._current: InSitu | None = None
        self._requests: list = []
        self._wanted: dict | None = None        # the newest announcement not yet loaded
        self._failed_generation = 0
        self._refusals: set[str] = set()        # why the ensemble side refused batches (said once each)
        self._loading: threading.Thread | None = None
        self._loaded: tuple[dict, InSitu | None, str | None, float] | None = None
        self._bye = self._ended = self.closed = False

    # -- sending ------------------------------------------------------------------------------
    def send(self, x, y) -> bool:
        """Send samples (``x``: inputs, ``y``: targets, one row each) to the ensemble; never
        waits. False: dropped (``in_flight`` messages already on their way), counted."""
        t0 = time.perf_counter()
        if self.closed:
            raise PredictError("send() after close()")
        self._poll()
        import numpy as np
        x, y = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(y, np.float32)
        if len(x) != len(y):
            raise PredictError(f"send(x, y): {len(x)} inputs but {len(y)} targets")
        now = time.time()
        seq = None if self._ended else self.window.take(len(x), now)
        if seq is None:
            if self._ended:
                self.window.dropped += len(x)
            self.stats.send_seconds += time.perf_counter() - t0
            return False
        msg = {"kind": coupling.SAMPLES, "seq": seq, "sent": now, "x": x, "y": y}
        self._requests.append(self.inter.isend(msg, dest=0, tag=mpi.TAG_ONLINE_UP))
        self.stats.send_seconds += time.perf_counter() - t0
        return True

    def _poll(self) -> None:
        """Everything the ensemble side said, without waiting."""
        self._requests = [r for r in self._requests if not r.Test()]
        while True:
            got = mpi.try_recv(self.inter, 0, mpi.TAG_ONLINE_DOWN)
            if got is None:
                break
            self._handle(got[0])
        w = self.window
        self.stats.sent, self.stats.dropped, self.stats.dropped_remote = w.sent, w.dropped, w.dropped_remote

    def _handle(self, msg: dict) -> None:
        kind = msg["kind"]
        if kind == coupling.ACK:
            self.window.acked(msg["seq"], msg["taken"])
            if msg.get("error") and coupling.refusal_kind(msg["error"]) not in self._refusals:
                self._refusals.add(coupling.refusal_kind(msg["error"]))
                self._say(f"the ensemble side refused a batch ({msg['error']}); it is counted in "
                          "`dropped_remote`, and later batches of the same kind are refused too")
        elif kind == coupling.GENERATION:
            self.stats.announced += 1
            msg = {**msg, "received": time.time()}
            if self._wanted is None or msg["generation"] > self._wanted["generation"]:
                self._wanted = msg
        elif kind == coupling.FAILED:
            self._say(f"the ensemble side could not publish generation {msg['generation']} ({msg['error']}); "
                      f"keeping generation {self.generation}")
        elif kind == coupling.BYE:
            self._bye = True
        elif kind == coupling.ENDED:
            self._ended = True
            self._say(f"the ensemble side ended ({msg.get('reason', '')}); keeping generation {self.generation}, "
                      "samples sent from now on are dropped")

    def _say(self, text: str) -> None:
        self.stats.failures.append(text)
        log.warning(f"online, simulation rank {self.comm.Get_rank()}: {text}")

    # -- the ensemble -------------------------------------------------------------------------
    def ensemble(self) -> InSitu | None:
        """The newest published ensemble loaded on this rank (None before the first); never
        waits for the ensemble side. Call it between time steps."""
        self._poll()
        if self._loaded is not None:
            self._take_loaded()
        wanted = self._wanted
        if wanted is not None and self._loading is None and wanted["generation"] > max(
                self.generation, self._failed_generation):
            self._wanted = None
            if self.background:
                self._loading = threading.Thread(target=self._load, args=(wanted,), name="online-load", daemon=True)
                self._loading.start()
            else:
                self._load(wanted)
                self._take_loaded()
        return self._current

    def _load(self, wanted: dict) -> None:
        t0 = time.perf_counter()
        try:
            got: InSitu | None = load_insitu(wanted["run_dir"], None, "local", buckets=self.buckets,
                                             threads=self.threads)
            error = None
        except Exception as exc:               # noqa: BLE001 - the simulation goes on with what it has
            got, error = None, f"{type(exc).__name__}: {exc}"
        self._loaded = (wanted, got, error, time.perf_counter() - t0)

    def _take_loaded(self) -> None:
        assert self._loaded is not None
        wanted, got, error, seconds = self._loaded
        self._loaded, self._loading = None, None
        if got is None:
            self._failed_generation = wanted["generation"]
            self._say(f"could not load generation {wanted['generation']} ({error}); keeping generation "
                      f"{self.generation}")
            return
        if self._current is not None:
            self._current.close()
        self._current, self.generation, self.run_dir = got, wanted["generation"], wanted["run_dir"]
        self.stats.loaded.append(self.generation)
        self.stats.load_seconds.append(round(seconds, 4))
        sent = self.window.sent_at.get(wanted["seq"]) if wanted.get("seq") is not None else None
        if sent is not None:
            self.stats.latencies.append(round(wanted["received"] - sent, 4))

    def wait_loaded(self, timeout: float = 60.0) -> InSitu | None:
        """Wait for a load in progress (if any) to finish and take it; for tests and the end."""
        if self._loading is not None:
            self._loading.join(timeout)
        return self.ensemble()

    # -- the end ------------------------------------------------------------------------------
    def close(self, timeout: float = 60.0, take_loading: bool = True) -> StreamStats:
        """This rank is done: its messages delivered, the ensemble side told (it finishes,
        publishes once more and keeps what it trained). Waits at most ``timeout`` seconds
        for the ensemble side's goodbye; ``take_loading``: and for a generation being loaded
        (not as Python exits, when TensorFlow may already be going)."""
        if self.closed:
            return self.stats
        end = time.monotonic() + timeout
        sleep = 1e-4
        while self._requests and not self._ended and time.monotonic() < end:
            self._poll()
            time.sleep(sleep)
            sleep = min(sleep * 2, 0.02)
        if not self._ended:
            w = self.window
            self.inter.send({"kind": coupling.CLOSE, "sent": w.sent, "dropped": w.dropped,
                             "dropped_remote": w.dropped_remote}, dest=0, tag=mpi.TAG_ONLINE_UP)
        while not (self._bye or self._ended) and time.monotonic() < end:
            self._poll()
            time.sleep(sleep)
            sleep = min(sleep * 2, 0.02)
        if not (self._bye or self._ended):
            self._say(f"the ensemble side did not answer close() within {timeout:.0f} s")
        if self._loading is not None and take_loading:
            self._loading.join(timeout=max(0.0, end - time.monotonic()))
            if self._loaded is not None:
                self._take_loaded()
        self._poll()
        self.closed = True
        return self.stats

    def close_at_exit(self) -> None:
        """``connect`` registers this to run as the interpreter exits: a simulation that ends
        without ``close()`` (forgotten, or an exception that ended its script) is closed here, so
        that the ensemble side finishes instead of waiting for it for ever."""
        if not self.closed:
            self._say("the simulation ended without stream.close(): closed as Python exits")
            self.close(timeout=CLOSE_AT_EXIT_SECONDS, take_loading=False)   # nothing will use it now

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(comm=None, in_flight: int = IN_FLIGHT, threads: int = 1, buckets: tuple[int, ...] = BUCKETS,
            background: bool = True) -> Stream:
    """Link this simulation to the ensemble program of the same MPMD job. Collective over
    ``COMM_WORLD`` (``comm`` must be it, or None), with the ensemble program's start-up: call it
    first, before any other collective on ``COMM_WORLD``, and use ``stream.comm`` (this
    program's ranks) for the simulation's own communication from then on. ``in_flight``:
    sample messages on their way per rank before ``send`` drops; ``threads``: TensorFlow
    threads for the loaded ensembles; ``background``: load a new generation in a thread
    (False: inside ``ensemble()``, which then takes the load's time)."""
    world = mpi.world
    if comm is not None and comm != world:
        raise PredictError("online.connect() links the programs of COMM_WORLD; pass MPI.COMM_WORLD or nothing")
    app = mpi.app_world()
    inter = mpi.peer()
    if inter is None:
        raise PredictError("online.connect(): this job runs one program; start the ensemble beside it, "
                           "`mpirun -n S python sim.py : -n E python -m ensemble.run config.toml` with "
                           "`mode = \"online\"`")
    stream = Stream(app, inter, in_flight, threads, buckets, background)
    atexit.register(stream.close_at_exit)
    return stream
