"""Children bred and screened ahead, off the master's loop (``evolve.surrogate_ahead``).

Screening in the loop (``Strategy._breed`` with a ``Surrogate``) costs the master about
``candidates x 0.45 ms`` per bred child (docs/search-benchmark.md): at 12 candidates a master
that did nothing else could hand out about 120 children a second, fewer than 20,000 workers
whose candidates train for a few minutes ask for. Here a helper process does that work
instead, on another core, while the master dispatches:

- the helper holds a **twin** of the master's strategy (the same class, settings, seed and
  starting points) and the surrogate; the master sends it every ask and every tell as they
  happen (``Strategy.attach``: a genome pickled onto a pipe by a writer thread, a few
  microseconds of the master's time), so the twin's population and the surrogate's data are
  the master's, a few messages late;
- while fewer than its share of ``ahead`` children wait on the master's side, the twin breeds a batch of
  up to ``BATCH`` children's worth of candidates (``candidates`` each, all new: never asked,
  trained or offered before) and screens them with **one** prediction of the forest
  (``Surrogate.choose_many``: the best ``n`` by expected improvement), and sends them with
  the parent each was bred from (weight inheritance) and the strategy's ``lineage``;
- the master's ``_breed`` takes the next child that is still new and of the current lineage
  (a generation's parents replaced: the ones bred from the old parents are dropped), or,
  when none is ready, breeds a plain child itself: the loop never waits for the helper.

What it gives up: a search whose children come from a helper depends on timing (which
results the twin had when it bred), so the same seed no longer gives the same search, and a
resumed search goes on from the journal's state rather than the uninterrupted one's path
(every candidate is still trained once: the journal's asks and results rebuild both the
master's strategy and the twin). ``evolve.surrogate_ahead = 0`` screens in the loop,
reproducibly; ``"auto"`` does that below ``AHEAD_WORKERS`` workers.

The helper is ``python -m evolve.screening`` started with the master's interpreter; it
imports neither MPI nor TensorFlow, reads its stdin until the master closes it (or dies:
end of file), and if it fails the master logs it once and breeds plain children. One helper
screens about as many children a second as the master could in its loop (the breeding, not
the forest, is most of the cost); ``evolve.surrogate_helpers`` starts several, each with
its own twin and random stream, for a master node with cores to spare.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import IO, Any

import numpy as np

from evolve.structured import AnyGenome

log = logging.getLogger(__name__)

#: children screened with one prediction, at most (a batch the helper sends at once)
BATCH = 8
#: ``evolve.surrogate_ahead = "auto"``: screen ahead from this many workers on
AHEAD_WORKERS = 256
#: ... keeping this many children ready
AHEAD_CHILDREN = 64
_HEADER = struct.Struct("<Q")


def ahead_children(setting: str | int, workers: int) -> int:
    """Children kept screened ahead for ``evolve.surrogate_ahead`` (0: screen in the loop)."""
    if setting == "auto":
        return AHEAD_CHILDREN if workers >= AHEAD_WORKERS else 0
    return int(setting)


def _send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _recv(stream: IO[bytes]) -> Any:
    """The next message, or None at end of file."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    size = _HEADER.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def _env() -> dict[str, str]:
    """The helper's environment: this package importable, one thread per numeric library."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    return env


class _Helper:
    """One helper process, the thread that writes to it and the one that reads from it."""

    def __init__(self, index: int, twin: dict, ahead: "Ahead"):
        self.index, self.ahead = index, ahead
        self.state: dict = {}                          # its surrogate's counts, as it last sent them
        self.failed: str | None = None
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.proc = subprocess.Popen([sys.executable, "-m", "evolve.screening"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=_env())
        self.outbox.put(pickle.dumps(("init", {**twin, "index": index}), protocol=pickle.HIGHEST_PROTOCOL))
        self.writer = threading.Thread(target=self._write, name=f"screening-writer-{index}", daemon=True)
        self.reader = threading.Thread(target=self._read, name=f"screening-reader-{index}", daemon=True)
        self.writer.start()
        self.reader.start()

    def _write(self) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            while (data := self.outbox.get()) is not None:
                stdin.write(_HEADER.pack(len(data)) + data)
                stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass                                        # the helper is gone: the reader says so
        finally:
            try:
                stdin.close()
            except (BrokenPipeError, OSError):
                pass

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        while (msg := _recv(stdout)) is not None:
            if msg[0] == "children":
                _, lineage, children, state = msg
                self.ahead.ready.extend((lineage, child, parent, self.index) for child, parent in children)
                self.state = state
            elif msg[0] == "error":
                self.failed = msg[1]
        code = self.proc.wait()
        if code != 0 and self.failed is None:
            self.failed = f"the screening helper ended with status {code}"
        if self.failed:
            log.warning(f"search: {self.failed}; " + (
                "bred children go out unscreened from now on" if all(h.failed for h in self.ahead.helpers)
                else "the other helper(s) go on"))

    def close(self, timeout: float) -> None:
        self.outbox.put(None)
        self.writer.join(timeout)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout)


class Ahead:
    """The master's side: the helper processes, the children they screened, and counts.

    ``strategy``: the master's (its class, settings, seed and starting points make each twin);
    ``surrogate``: a fresh ``Surrogate`` (each helper gets a copy); ``ahead``: children kept
    ready, shared among ``helpers`` processes (each breeds its own: another random stream)."""

    def __init__(self, strategy: Any, surrogate: Any, ahead: int, helpers: int = 1):
        for name, value in (("ahead", ahead), ("helpers", helpers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1, but got {value!r}")
        self.ahead = ahead
        self.ready: deque[tuple[int, AnyGenome, AnyGenome | None, int]] = deque()
        self.counts = {"served": 0, "missed": 0, "dropped": 0}
        twin = {"strategy": strategy.name, "space": strategy.space, "input_shape": strategy.input_shape,
                "n_outputs": strategy.n_outputs, "seed": strategy.seed, "params": strategy.params,
                "initial": list(strategy.initial), "compact_start": strategy.compact_start,
                "known": sorted(strategy.known),
                "surrogate": surrogate, "ahead": -(-ahead // helpers)}
        self.helpers: list[_Helper] = []
        for i in range(helpers):
            self.helpers.append(_Helper(i, twin, self))

    # -- the master's calls (cheap: a pickle, a queue put, a deque pop) ----------------------
    def _post(self, msg: tuple) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        for h in self.helpers:
            h.outbox.put(data)

    def note_ask(self, genome: AnyGenome) -> None:
        self._post(("ask", genome))

    def note_tell(self, genome: AnyGenome, fitness: float | None, objectives: tuple | None) -> None:
        self._post(("tell", genome, fitness, objectives))

    def take(self, seen: set[str], lineage: int) -> tuple[AnyGenome, AnyGenome | None] | None:
        """The next ready child not in ``seen`` and bred under ``lineage`` (with its parent),
        or None when none is ready; the places it frees are given back to their helpers."""
        freed: dict[int, int] = {}
        out = None
        while self.ready:
            lin, child, parent, index = self.ready.popleft()
            freed[index] = freed.get(index, 0) + 1
            if lin == lineage and child.key() not in seen:
                out = (child, parent)
                break
            self.counts["dropped"] += 1
        for index, n in freed.items():
            self.helpers[index].outbox.put(pickle.dumps(("credit", n), protocol=pickle.HIGHEST_PROTOCOL))
        self.counts["served" if out is not None else "missed"] += 1
        return out

    @property
    def failed(self) -> str | None:
        """Why the helpers stopped, when every one did (None while one works)."""
        whys = [h.failed for h in self.helpers]
        return whys[0] if all(whys) else None

    def state(self) -> dict:
        """The helpers' surrogate counts (``Surrogate.state``: the latest fit of any, the
        screens and seconds of all) and the master's: bred asks served a screened child,
        asks that found none ready, children dropped as stale."""
        merged: dict = {}
        for h in self.helpers:
            for key, value in h.state.items():
                summed = key.endswith("_seconds") or key == "surrogate_screens"
                merged[key] = merged.get(key, 0) + value if summed else max(merged.get(key, value), value)
        failed = self.failed
        return {**merged, "surrogate_ahead": self.ahead, "surrogate_helpers": len(self.helpers),
                "surrogate_served": self.counts["served"], "surrogate_missed": self.counts["missed"],
                "surrogate_dropped": self.counts["dropped"], **({"surrogate_failed": failed} if failed else {})}

    def close(self, timeout: float = 10.0) -> None:
        """End the helpers: close their input (each exits at end of file), wait, then kill."""
        for h in self.helpers:
            h.outbox.put(None)
        for h in self.helpers:
            h.close(timeout)


# ---------------------------------------------------------------------------- the helper
class Twin:
    """The helper's copy of the master's strategy and the surrogate; ``apply`` the master's
    messages, ``breed`` screened children."""

    def __init__(self, spec: dict):
        import sklearn.ensemble  # noqa: F401 - imported now (2 s), not at the first fit

        from evolve.strategies import make_strategy
        from evolve.surrogate import Surrogate
        if not isinstance(spec["surrogate"], Surrogate):
            raise TypeError(f"a Surrogate is needed to screen, not {type(spec['surrogate']).__name__}")
        self.surrogate = spec["surrogate"]
        self.strategy = make_strategy(spec["strategy"], spec["space"], spec["input_shape"], spec["n_outputs"],
                                      rng_seed=spec["seed"], initial=spec["initial"],
                                      compact_start=spec["compact_start"], surrogate=self.surrogate,
                                      known=spec.get("known", ()), **spec["params"])
        self.credit = int(spec["ahead"])
        self.index = int(spec.get("index", 0))         # which helper: its own random stream
        self.offered: dict[str, None] = {}             # keys sent, oldest first (bounded)
        self.bred = 0
        self.stalled: tuple[int, int] | None = None    # (told, asked) when the space gave no new child

    def apply(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ask":
            self.strategy._register(msg[1])
        elif kind == "tell":
            self.strategy.tell(msg[1], msg[2], msg[3])
        elif kind == "credit":
            self.credit += int(msg[1])

    def can_breed(self) -> bool:
        st = self.strategy
        return (self.credit > 0 and self.surrogate.ready and st.breeder() is not None
                and self.stalled != (st.told, st.asked))

    def breed(self) -> list[tuple[AnyGenome, AnyGenome | None]]:
        """Up to ``min(credit, BATCH)`` children, each the pick of ``candidates`` new ones,
        screened with one prediction."""
        st, sur = self.strategy, self.surrogate
        n = min(self.credit, BATCH)
        propose = st.breeder()
        assert propose is not None
        st.rng = np.random.default_rng([st.seed, st.told, st.asked, 1 + self.index, self.bred])
        children = st.new_children(propose, n * sur.candidates,
                                   lambda key: key in sur.trained or key in self.offered)
        self.bred += 1
        picks = [children[i] for i in sur.choose_many(children, n)]
        for child in picks:
            self.offered[child.key()] = None
        while len(self.offered) > 100_000:
            self.offered.pop(next(iter(self.offered)))
        self.credit -= len(picks)
        if not picks:
            self.stalled = (st.told, st.asked)         # no new child here: wait for the next ask or tell
        return [(child, st.parent_of(child)) for child in picks]


def main() -> int:
    """The helper's loop: read the twin, then apply messages and breed while there is room.
    A failure is sent to the master (``("error", why)``) and ends the helper with status 1."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C reaches the whole group: the master ends it
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    first = _recv(stdin)
    if first is None:
        return 0
    try:
        twin = Twin(first[1])
    except Exception as exc:  # noqa: BLE001 - said to the master, which goes on unscreened
        _send(stdout, ("error", f"the screening helper could not start ({type(exc).__name__}: {exc})"))
        return 1
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        while (msg := _recv(stdin)) is not None:
            inbox.put(msg)
        inbox.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            msgs = []
            try:
                msgs.append(inbox.get(block=not twin.can_breed()))
                while True:
                    msgs.append(inbox.get_nowait())
            except queue.Empty:
                pass
            for msg in msgs:
                if msg is None:
                    return 0
                twin.apply(msg)
            if twin.can_breed():
                children = twin.breed()
                if children:
                    _send(stdout, ("children", twin.strategy.lineage(), children, twin.surrogate.state()))
    except Exception as exc:
        _send(stdout, ("error", f"the screening helper failed ({type(exc).__name__}: {exc})"))
        raise


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:  # noqa: BLE001 - printed, then the status says it
        import traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    os._exit(code)                 # not the interpreter's shutdown: its reader thread may be in a read
