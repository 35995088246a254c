"""Tracking where science teams already look: TensorBoard and MLflow, written by the master only.

``Tracking`` is the master session's one observer: ``results(records)`` as members end,
``finish(summary)`` once the ensemble is written, ``close()`` on the way out. Each sink
(``tensorboard_sink.TensorBoardSink``, ``mlflow_sink.MlflowSink``) runs in its own
background thread behind a bounded queue (``Background``), so the dispatch loop only
copies a few numbers per member into a queue: a slow disk or a tracking server that is
slow, down or refusing never fails, blocks or slows the run. What a sink could not write
is dropped and counted, and ``close`` says so on the console.

What a sink is told about a member (``MemberView``): its id, status, hyperparameters
(architecture, seed, size, epochs, and a searched genome's scalar genes), its final
validation and test metrics, and its per-epoch history (``payload.meta.history``, the
Keras history a trained member sends with its predictions).
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
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ensemble.results.records import MemberRecord

log = logging.getLogger("ensemble.tracking")

@dataclass(frozen=True)
class MemberView:
    """What the sinks record of one member (plain values only, safe to hand to a thread)."""

    id: str
    status: str
    hparams: dict[str, float | int | str | bool]
    final: dict[str, float]                     # "val/accuracy", "test/log_loss", ...
    history: dict[str, list[float]] = field(default_factory=dict)    # "loss", "val_loss", ... per epoch
    train_seconds: float | None = None
    ended: float | None = None

    @property
    def key(self) -> str:
        """One training of the member: a member trained again (on resume) is a new one."""
        return f"{self.id}@{self.ended}"


def _scalar(value: Any) -> float | int | str | bool | None:
    if isinstance(value, (bool, int, float, str)):
        return value
    return None


def raw_of(record: MemberRecord, history: Mapping[str, Any] | None = None) -> tuple:
    """What the master sends of a member: references to its fields, no processing (the
    writer process makes the ``MemberView``; a pickle of these is one C call per batch).
    ``history``: its per-epoch curves when the record no longer carries them (the store's)."""
    extra = record.extra
    payload = extra.get("payload")
    if history is None:
        history = (payload.get("meta") or {}).get("history") if payload else extra.get("history")
    hp = extra.get("hp") or extra.get("hyperparameters")
    return (record.id, record.status.value, record.arch, record.seed, record.params, record.epochs, record.genome,
            record.val, record.test, history, hp, record.train_seconds, record.ended)


def hparams_from(arch, seed, params, epochs, genome, hp) -> dict[str, float | int | str | bool]:
    """A member's hyperparameters as flat scalars: architecture, seed, size, epochs, genome."""
    out: dict[str, Any] = {"arch": arch, "seed": seed, "params": params, "epochs": epochs}
    if isinstance(genome, Mapping):
        for key, value in genome.items():
            if _scalar(value) is not None:
                out[f"genome.{key}"] = value
            elif isinstance(value, (list, tuple)):
                out[f"genome.{key}"] = str(list(value))[:250]
    elif genome is not None:
        out["genome"] = str(genome)[:250]
    for name, value in (hp or {}).items():
        if _scalar(value) is not None:
            out[str(name)] = value
    return {k: v for k, v in out.items() if v is not None}


def view_from(raw: tuple) -> MemberView:
    """The ``MemberView`` of ``raw_of``'s tuple."""
    id_, status, arch, seed, params, epochs, genome, val, test, history, hp, train_seconds, ended = raw
    final = {f"{split}/{name}": float(value) for split, values in (("val", val), ("test", test))
             for name, value in (values or {}).items() if isinstance(value, (int, float))}
    curves = {str(k): [float(x) for x in v] for k, v in (history or {}).items() if isinstance(v, (list, tuple))}
    return MemberView(id_, status, hparams_from(arch, seed, params, epochs, genome, hp), final, curves,
                      train_seconds, ended)


def view_of(record: MemberRecord) -> MemberView:
    return view_from(raw_of(record))


class Sink(Protocol):
    """One tracking destination, driven from its own thread."""

    name: str
    where: str                  # what the console says at the end: where to look

    def members(self, views: list[MemberView]) -> None:
        """Record members that ended (may raise: the caller retries)."""

    def known(self, views: list[MemberView]) -> None:
        """Members that earlier jobs of this run ended (``--resume``): record those the
        destination does not hold yet, each once, and count the others in (may raise: the
        caller retries)."""

    def ensemble(self, summary: dict, files: list[Path]) -> None:
        """Record the ensemble's metrics and files (may raise: the caller retries)."""

    def close(self, ok: bool) -> None:
        """The run is over (``ok``: it finished); never raises."""


#: the queue items that carry members (a list of views each); the others count as one write
MEMBER_KINDS = ("members", "known")


def _writes(kind: str, payload: Any) -> int:
    return len(payload) if kind in MEMBER_KINDS else int(kind == "ensemble")


class Background:
    """A sink in a daemon thread behind a bounded queue, with batching and retries.

    Items are gathered for ``batch_seconds`` and handed over together; a call that raises is
    retried with backoff until ``give_up_seconds`` have passed since the first failure, then
    the sink is given up: what was pending and everything later is dropped, with ONE warning.
    Until ``close`` the thread keeps to ``cpu_share`` of a core (``tracking.cpu_share``): after
    a write that took ``c`` seconds of its CPU it rests ``c * (1 / cpu_share - 1)``. The
    lowest priority alone was not enough: ranks that wake thousands of times a second lost
    10-40% to a writer busy beside them, nice 19 or ``SCHED_IDLE`` alike (docs/tracking.md)."""

    def __init__(self, sink: Sink, queue_size: int, batch_seconds: float, give_up_seconds: float,
                 cpu_share: float):
        self.sink, self.batch_seconds, self.give_up_seconds = sink, batch_seconds, give_up_seconds
        self.last_error: str | None = None       # the sink's latest failure, while retrying
        self.rest_factor = 1.0 / cpu_share - 1.0
        self._hurry = threading.Event()     # set by close: no more resting
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.dropped = 0                    # members (and the ensemble, as one) not written
        self.gave_up: str | None = None
        self.warned = False
        self.inflight = 0                   # items the thread is sending (or retrying) now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tracking-{sink.name}", daemon=True)
        self._thread.start()

    def put(self, item: tuple[str, Any]) -> None:
        """Never blocks: a full queue or a sink given up counts the item as dropped."""
        if self.gave_up is not None:
            self.dropped += _writes(*item)
            return
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped += _writes(*item)

    def _loop(self) -> None:
        while True:
            try:
                first = self.queue.get(timeout=0.2)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if first[0] == "stop":
                return
            batch = [first]
            end = time.monotonic() + self.batch_seconds
            while first[0] == "members" and not self._stop.is_set():
                try:
                    item = self.queue.get(timeout=max(0.0, end - time.monotonic()))
                except queue.Empty:
                    break
                batch.append(item)
                if item[0] != "members" or time.monotonic() >= end:
                    break
            views = [v for kind, vs in batch if kind == "members" for v in vs]
            cpu = time.thread_time()
            if views and not self._send(lambda v=views: self.sink.members(v), len(views), views):
                return
            for kind, payload in batch:
                if kind == "known" and not self._send(lambda p=payload: self.sink.known(p), len(payload), payload):
                    return
                if kind == "ensemble" and not self._send(lambda p=payload: self.sink.ensemble(*p), 1):
                    return
                if kind == "stop":
                    return
            self._hurry.wait((time.thread_time() - cpu) * self.rest_factor)

    def _send(self, call, count: int, views: Sequence[MemberView] = ()) -> bool:
        """``call()`` with retries; False (and everything dropped) once the sink is given up.
        Of a batch of ``views``, the members a sink says it wrote (its ``written`` keys) before
        it failed are not counted as dropped."""
        start, pause = time.monotonic(), 0.25
        self.inflight = count
        while True:
            try:
                call()
                self.inflight = 0
                return True
            except Exception as exc:           # noqa: BLE001 - a tracking server must never fail the run
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
                self.last_error = error                # said if the run ends while it still retries
            if time.monotonic() - start >= self.give_up_seconds or self._stop.is_set():
                written = getattr(self.sink, "written", None)
                self._give_up(error, count if written is None else sum(v.key not in written for v in views))
                return False
            time.sleep(min(pause, max(0.0, start + self.give_up_seconds - time.monotonic())))
            pause = min(2 * pause, 5.0)

    def _give_up(self, error: str, count: int) -> None:
        self.gave_up, self.inflight = error, 0
        self.dropped += count
        while True:                                        # what waits is dropped too
            try:
                kind, payload = self.queue.get_nowait()
            except queue.Empty:
                break
            self.dropped += _writes(kind, payload)
        if not self.warned:
            self.warned = True
            log.warning(f"tracking: {self.sink.name} given up ({error}); its writes are dropped from now on, "
                        "the run goes on")

    def close(self, ok: bool, wait: float, limit: float | None = None) -> None:
        """Let the thread write what waits (no longer resting) for at most ``wait`` seconds,
        then drop the rest."""
        self._hurry.set()
        if self.gave_up is None:
            try:
                self.queue.put(("stop", None), timeout=max(wait, 0.01))
            except queue.Full:
                pass
        self._thread.join(wait)
        if self._thread.is_alive():                       # still writing or retrying: leave it
            self._stop.set()
            left = self.inflight
            while True:
                try:
                    kind, payload = self.queue.get_nowait()
                except queue.Empty:
                    break
                left += _writes(kind, payload)
            self.dropped += left
            if not self.warned:
                self.warned = True
                log.warning(f"tracking: {self.sink.name} did not finish within `tracking.finish_seconds` "
                            f"= {limit if limit is not None else wait:g}; {left} queued writes dropped"
                            + (f" (it was retrying after: {self.last_error})" if self.last_error else ""))
            return
        if self.gave_up is None:
            self.sink.close(ok)


#: the master hands gathered members to the writer this often (or once this many are gathered)
SEND_SECONDS, SEND_MEMBERS = 0.5, 2000


class Tracking:
    """The master's tracking observer; does nothing when ``[tracking]`` asks for nothing.

    The sinks run in a writer process (``tracking_writer``), not in a thread of the master:
    MLflow's client spends milliseconds of Python per request, and in the master's process
    that would take the interpreter lock from the dispatch loop. The master only pickles
    each batch of members onto a non-blocking pipe; when the writer falls behind and the
    pipe and ``tracking.queue_size`` pending bytes are full, batches are dropped and counted."""

    def __init__(self, cfg, run_dir: Path, meta: Mapping[str, Any], resume: bool = False,
                 known_upto: int | None = None):
        """``known_upto`` (``--resume``): the journal's size in bytes when this job began; the
        writer reads the members it holds and records those its destinations lack (earlier
        jobs ran without tracking, or ended before their members were sent)."""
        t = cfg.tracking
        self.run_dir, self.finish_seconds = Path(run_dir), t.finish_seconds
        self.max_pending, self.pending, self.dropped = 64 * t.queue_size, bytearray(), 0
        self.proc: subprocess.Popen | None = None
        self.broken = False                      # the writer died: what comes is dropped
        self.views: list[tuple] = []
        self.sent_at = time.monotonic()
        if not (t.tensorboard or t.mlflow):
            return
        root = str(Path(__file__).resolve().parents[2])        # the writer imports this package as we do
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "ensemble.results.tracking_writer"],
                                         stdin=subprocess.PIPE, close_fds=True, env=env)
        except OSError as exc:                   # no tracking is better than no run
            log.warning(f"tracking: cannot start the writer process ({exc}); this run is not tracked")
            return
        self._send(("open", {"cfg": cfg, "run_dir": str(self.run_dir), "meta": dict(meta), "resume": resume,
                             "known_upto": known_upto if resume else None}), block=True)
        os.set_blocking(self.proc.stdin.fileno(), False)

    def _send(self, message: tuple, block: bool = False, count: int = 1) -> None:
        if self.broken:
            self.dropped += count
            return
        frame = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(self.pending) + len(frame) > self.max_pending:
            self.dropped += count
        else:
            self.pending += struct.pack("<I", len(frame)) + frame
        self._flush(timeout=self.finish_seconds if block else 0.0)

    def _flush(self, timeout: float = 0.0) -> bool:
        """Write what is pending without blocking (or for at most ``timeout`` seconds)."""
        end = time.monotonic() + timeout
        while self.pending and self.proc is not None:
            try:
                n = os.write(self.proc.stdin.fileno(), self.pending)
                del self.pending[:n]
            except BlockingIOError:
                if time.monotonic() >= end:
                    return False
                time.sleep(0.01)
            except OSError:                      # the writer is gone: nothing more reaches it
                self.dropped += 1
                self.pending.clear()
                if not self.broken:
                    self.broken = True
                    log.warning(f"tracking: the writer process ended (exit code {self.proc.poll()}); "
                                "tracking stops, the run goes on")
                return False
        return True

    def results(self, records: list[MemberRecord]) -> None:
        """Members that ended (before their payload is stored away): their views are gathered
        and handed to the writer every ``SEND_SECONDS``, never written here."""
        if self.proc is None:
            return
        self.views += [raw_of(r) for r in records]
        if time.monotonic() - self.sent_at >= SEND_SECONDS or len(self.views) >= SEND_MEMBERS:
            self._send_views()

    def idle(self) -> None:
        """The master waits for results: members gathered since the last send go out when due
        (else the last members before a lull would wait for the next result to end)."""
        if self.proc is not None and (self.views or self.pending) and time.monotonic() - self.sent_at >= SEND_SECONDS:
            self._send_views()

    def _send_views(self) -> None:
        if self.views:
            self._send(("members", self.views), count=len(self.views))
            self.views = []
        elif self.pending:
            self._flush()
        self.sent_at = time.monotonic()

    def finish(self, summary: dict) -> None:
        """The ensemble is written: its metrics, report.html and ensemble.json."""
        if self.proc is not None:
            self._send_views()
            files = [str(p) for p in (self.run_dir / "ensemble.json", self.run_dir / "report.html") if p.exists()]
            self._send(("ensemble", (summary, files)))

    def close(self, ok: bool = True) -> None:
        """Let the writer finish (at most ``tracking.finish_seconds`` and a little), then say
        what was dropped here; the writer says what it dropped."""
        if self.proc is None:
            return
        end = time.monotonic() + self.finish_seconds + 10.0
        self._send_views()
        self._send(("close", ok))
        self._flush(timeout=max(0.0, end - time.monotonic()))
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            log.warning(f"tracking: the writer did not finish within `tracking.finish_seconds` = "
                        f"{self.finish_seconds:g} (and 10 s); stopped")
        if self.dropped:
            log.info(f"tracking: {self.dropped} member(s) dropped before the writer (it fell behind)")
        self.proc = None


def known_views(run_dir: Path, upto: int) -> list[MemberView]:
    """The members the journal's first ``upto`` bytes hold (an id's last record), with the
    per-epoch histories the store kept (read-only: the master may be appending to it)."""
    from ensemble.results.journal import typed_history
    from ensemble.results.rundir import RunDirectory
    run = RunDirectory(run_dir)
    last = {r.id: r for r in typed_history(run.read_lines(upto)) if isinstance(r, MemberRecord)}
    store = run.store(read_only=True)
    views = []
    for record in last.values():
        history = None
        if record.id in store:
            try:
                history = store.get(record.id)[1].get("history")
            except (OSError, ValueError):     # a damaged entry: the member without its curves
                pass
        views.append(view_from(raw_of(record, history)))
    return views


def _put_known(sinks: list[Background], run_dir: Path, upto: int) -> None:
    try:
        views = known_views(run_dir, upto)
    except Exception as exc:                  # noqa: BLE001 - the catch-up never fails the run
        log.warning(f"tracking: cannot read the members earlier jobs ended ({type(exc).__name__}: {exc}); "
                    "only this job's are sent")
        return
    if views:
        for sink in sinks:
            sink.put(("known", views))


def serve(stream: BinaryIO) -> None:
    """The writer process: frames from ``stream`` to the sinks, each in its own thread."""
    sinks: list[Background] = []
    finish_seconds, ok = 0.0, True
    known: threading.Thread | None = None
    while True:
        head = stream.read(4)
        if len(head) < 4:
            break
        size = struct.unpack("<I", head)[0]
        frame = stream.read(size)
        if len(frame) < size:                    # the master closed the pipe mid-frame (it gave up waiting)
            break
        kind, payload = pickle.loads(frame)
        if kind == "open":
            cfg = payload["cfg"]
            t = cfg.tracking
            finish_seconds = t.finish_seconds
            run_dir = Path(payload["run_dir"])
            if t.tensorboard:
                from ensemble.results.tensorboard_sink import TensorBoardSink
                sinks.append(Background(TensorBoardSink(run_dir / "tensorboard", payload["meta"]), t.queue_size,
                                        t.batch_seconds, t.give_up_seconds, t.cpu_share))
            if t.mlflow:
                from ensemble.results.mlflow_sink import MlflowSink
                sinks.append(Background(MlflowSink(t.mlflow, t.mlflow_experiment, run_dir, cfg, payload["meta"],
                                                   payload["resume"]), t.queue_size, t.batch_seconds,
                                        t.give_up_seconds, t.cpu_share))
            if sinks and payload.get("known_upto"):       # read beside the pipe: the master never waits
                known = threading.Thread(target=_put_known, args=(sinks, run_dir, payload["known_upto"]),
                                         name="tracking-known", daemon=True)
                known.start()
        elif kind == "close":
            ok = bool(payload)
        else:
            if kind == "ensemble":
                payload = (payload[0], [Path(p) for p in payload[1]])
            elif kind == "members":
                payload = [view_from(raw) for raw in payload]
            for sink in sinks:
                sink.put((kind, payload))
    end = time.monotonic() + finish_seconds
    if known is not None:
        known.join(max(0.0, end - time.monotonic()))
    for sink in sinks:
        sink.close(ok, max(0.0, end - time.monotonic()), finish_seconds)
        if sink.dropped or sink.warned:
            log.info(f"tracking: {sink.sink.name}: {sink.dropped} writes dropped (members, or the ensemble)"
                     + (f"; {sink.gave_up}" if sink.gave_up else ""))
        else:
            log.info(f"tracking: {sink.sink.name}: {sink.sink.where}")
