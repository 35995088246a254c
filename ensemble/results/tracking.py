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
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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


def _scalar(value: Any) -> float | int | str | bool | None:
    if isinstance(value, (bool, int, float, str)):
        return value
    return None


def hparams_of(record: MemberRecord) -> dict[str, float | int | str | bool]:
    """A member's hyperparameters as flat scalars: architecture, seed, size, epochs, genome."""
    out: dict[str, Any] = {"arch": record.arch, "seed": record.seed, "params": record.params,
                           "epochs": record.epochs}
    genome = record.genome
    if isinstance(genome, Mapping):
        for key, value in genome.items():
            if _scalar(value) is not None:
                out[f"genome.{key}"] = value
            elif isinstance(value, (list, tuple)):
                out[f"genome.{key}"] = str(list(value))[:250]
    elif genome is not None:
        out["genome"] = str(genome)[:250]
    for key in ("hp", "hyperparameters"):
        for name, value in (record.extra.get(key) or {}).items():
            if _scalar(value) is not None:
                out[str(name)] = value
    return {k: v for k, v in out.items() if v is not None}


def view_of(record: MemberRecord) -> MemberView:
    final = {f"{split}/{name}": float(value) for split, values in (("val", record.val), ("test", record.test))
             for name, value in values.items() if isinstance(value, (int, float))}
    payload = record.extra.get("payload") or {}
    raw = (payload.get("meta") or {}).get("history") or record.extra.get("history") or {}
    history = {str(k): [float(x) for x in v] for k, v in raw.items() if isinstance(v, (list, tuple))}
    return MemberView(record.id, record.status.value, hparams_of(record), final, history,
                      record.train_seconds, record.ended)


class Sink(Protocol):
    """One tracking destination, driven from its own thread."""

    name: str

    def members(self, views: list[MemberView]) -> None:
        """Record members that ended (may raise: the caller retries)."""

    def ensemble(self, summary: dict, files: list[Path]) -> None:
        """Record the ensemble's metrics and files (may raise: the caller retries)."""

    def close(self, ok: bool) -> None:
        """The run is over (``ok``: it finished); never raises."""


class Background:
    """A sink in a daemon thread behind a bounded queue, with batching and retries.

    Items are gathered for ``batch_seconds`` and handed over together; a call that raises is
    retried with backoff until ``give_up_seconds`` have passed since the first failure, then
    the sink is given up: what was pending and everything later is dropped, with ONE warning."""

    def __init__(self, sink: Sink, queue_size: int, batch_seconds: float, give_up_seconds: float):
        self.sink, self.batch_seconds, self.give_up_seconds = sink, batch_seconds, give_up_seconds
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.dropped = 0                    # members (and the ensemble, as one) not written
        self.gave_up: str | None = None
        self.warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tracking-{sink.name}", daemon=True)
        self._thread.start()

    def put(self, item: tuple[str, Any]) -> None:
        """Never blocks: a full queue or a sink given up counts the item as dropped."""
        if self.gave_up is not None:
            self.dropped += 1 if item[0] != "members" else len(item[1])
            return
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1 if item[0] != "members" else len(item[1])

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
            if views and not self._send(lambda v=views: self.sink.members(v), len(views)):
                return
            for kind, payload in batch:
                if kind == "ensemble" and not self._send(lambda p=payload: self.sink.ensemble(*p), 1):
                    return
                if kind == "stop":
                    return

    def _send(self, call, count: int) -> bool:
        """``call()`` with retries; False (and everything dropped) once the sink is given up."""
        start, pause = time.monotonic(), 0.25
        while True:
            try:
                call()
                return True
            except Exception as exc:           # noqa: BLE001 - a tracking server must never fail the run
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
            if time.monotonic() - start >= self.give_up_seconds or self._stop.is_set():
                self._give_up(error, count)
                return False
            time.sleep(min(pause, max(0.0, start + self.give_up_seconds - time.monotonic())))
            pause = min(2 * pause, 5.0)

    def _give_up(self, error: str, count: int) -> None:
        self.gave_up = error
        self.dropped += count
        while True:                                        # what waits is dropped too
            try:
                kind, payload = self.queue.get_nowait()
            except queue.Empty:
                break
            self.dropped += len(payload) if kind == "members" else (kind == "ensemble")
        if not self.warned:
            self.warned = True
            log.warning(f"tracking: {self.sink.name} given up ({error}); its writes are dropped from now on, "
                        "the run goes on")

    def close(self, ok: bool, wait: float, limit: float | None = None) -> None:
        """Let the thread write what waits for at most ``wait`` seconds, then drop the rest."""
        if self.gave_up is None:
            try:
                self.queue.put(("stop", None), timeout=max(wait, 0.01))
            except queue.Full:
                pass
        self._thread.join(wait)
        if self._thread.is_alive():                       # still writing or retrying: leave it
            self._stop.set()
            left = 0
            while True:
                try:
                    kind, payload = self.queue.get_nowait()
                except queue.Empty:
                    break
                left += len(payload) if kind == "members" else (kind == "ensemble")
            self.dropped += left
            if not self.warned:
                self.warned = True
                log.warning(f"tracking: {self.sink.name} did not finish within `tracking.finish_seconds` "
                            f"= {limit if limit is not None else wait:g}; {left} queued writes dropped")
            return
        if self.gave_up is None:
            self.sink.close(ok)


class Tracking:
    """The master's tracking observer; does nothing when ``[tracking]`` asks for nothing."""

    def __init__(self, cfg, run_dir: Path, meta: Mapping[str, Any], resume: bool = False):
        t = cfg.tracking
        self.run_dir, self.finish_seconds = Path(run_dir), t.finish_seconds
        self.sinks: list[Background] = []
        if t.tensorboard:
            from ensemble.results.tensorboard_sink import TensorBoardSink
            self.sinks.append(Background(TensorBoardSink(self.run_dir / "tensorboard", meta), t.queue_size,
                                         t.batch_seconds, t.give_up_seconds))
        if t.mlflow:
            from ensemble.results.mlflow_sink import MlflowSink
            self.sinks.append(Background(MlflowSink(t.mlflow, t.mlflow_experiment, self.run_dir, cfg, meta,
                                                    resume), t.queue_size, t.batch_seconds, t.give_up_seconds))

    def results(self, records: list[MemberRecord]) -> None:
        """Members that ended (before their payload is stored away): queued, never written here."""
        if self.sinks:
            views = [view_of(r) for r in records]
            for sink in self.sinks:
                sink.put(("members", views))

    def finish(self, summary: dict) -> None:
        """The ensemble is written: its metrics, report.html and ensemble.json."""
        files = [p for p in (self.run_dir / "ensemble.json", self.run_dir / "report.html") if p.exists()]
        for sink in self.sinks:
            sink.put(("ensemble", (summary, files)))

    def close(self, ok: bool = True) -> None:
        """Wait (at most ``tracking.finish_seconds`` in all) for the writes, then say what was dropped."""
        end = time.monotonic() + self.finish_seconds
        for sink in self.sinks:
            sink.close(ok, max(0.0, end - time.monotonic()), self.finish_seconds)
            if sink.dropped:
                log.info(f"tracking: {sink.sink.name}: {sink.dropped} member(s)/ensemble writes dropped"
                         + (f" ({sink.gave_up})" if sink.gave_up else ""))
            else:
                log.info(f"tracking: {sink.sink.name}: {sink.sink.where}")
