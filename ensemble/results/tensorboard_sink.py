"""TensorBoard event files from the master, without TensorFlow (``[tracking] tensorboard``).

Written with the ``tensorboard`` package's own event-file writer and summary protos, so the
master never imports TensorFlow. Layout under ``RUN_DIR/tensorboard/``:

- ``members/<id>/``: one TensorBoard run per member: ``epoch/<name>`` scalars per epoch
  (the Keras history: ``epoch/loss``, ``epoch/val_loss``, ...; step = epoch, from 1),
  ``val/<metric>`` and ``test/<metric>`` at the last epoch, ``train_seconds``, and the
  member's HParams session (its hyperparameters or genome and its status);
- ``ensemble/``: the ensemble's ``val/<metric>`` and ``test/<metric>`` (and the best
  member's, as ``best_member/...``);
- the directory itself: the HParams experiment (every hyperparameter and metric seen),
  rewritten as members come, so the HParams dashboard lists every member against its
  final metrics.

``tensorboard --logdir RUN_DIR/tensorboard`` shows them.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ensemble.results.tracking import MemberView

#: the HParams experiment (all members' hyperparameters) is rewritten at most this often, and at the end
EXPERIMENT_SECONDS = 30.0


def _crc32c() -> Callable[[bytes], int]:
    """CRC-32C: the C one of ``google-crc32c`` (in the ``tracking`` extra) where installed, else
    TensorBoard's pure-Python one (about 25 µs a record: 40% of a member's writing)."""
    try:
        from google_crc32c import value
        return value
    except ImportError:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c
        return crc32c


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(payloads: list[bytes], crc32c: Callable[[bytes], int]) -> bytes:
    """TFRecord framing, the event file's format: per record its length (uint64), the length's
    masked CRC-32C, the bytes, their masked CRC-32C (all little-endian)."""
    out = bytearray()
    for data in payloads:
        head = struct.pack("<Q", len(data))
        out += head + struct.pack("<I", _masked(crc32c(head))) + data + struct.pack("<I", _masked(crc32c(data)))
    return bytes(out)


def _tag(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./-]", "_", name)


class TensorBoardSink:
    """Event files for members, the ensemble and the HParams experiment."""

    name = "tensorboard"

    def __init__(self, logdir: Path, meta: Mapping[str, Any]):
        from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: F401 - fails early if absent
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.where = f"tensorboard --logdir {self.logdir}"
        self.hparams: dict[str, set] = {}            # name -> values seen (for the experiment's domains)
        self.metrics: set[str] = set()
        self.task = meta.get("task")
        self._count = 0
        self._dirty, self._written_at = False, 0.0
        self._crc32c = _crc32c()

    # -- writing ------------------------------------------------------------------------
    def _write(self, folder: Path, events: list) -> None:
        """``events`` as a new event file in ``folder``, written whole in one write and closed
        (framed here, ``records``: TensorBoard's ``EventFileWriter`` would import TensorFlow
        where it is installed, and its ``RecordWriter`` computes CRCs in Python)."""
        from tensorboard.compat.proto import event_pb2
        folder.mkdir(parents=True, exist_ok=True)
        self._count += 1
        now = time.time()
        path = folder / f"events.out.tfevents.{now:.6f}.{socket.gethostname()}.{os.getpid()}.{self._count}"
        head = event_pb2.Event(wall_time=now, file_version="brain.Event:2").SerializeToString()
        path.write_bytes(records([head] + [event.SerializeToString() for event in events], self._crc32c))

    @staticmethod
    def _scalars(values: Mapping[str, float], step: int, wall: float) -> Any:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=_tag(k), simple_value=float(v))
                                             for k, v in values.items()])
        return event_pb2.Event(wall_time=wall, step=step, summary=summary)

    @staticmethod
    def _summary_event(summary: Any, wall: float) -> Any:
        from tensorboard.compat.proto import event_pb2
        return event_pb2.Event(wall_time=wall, step=0, summary=summary)

    # -- the sink ------------------------------------------------------------------------
    def known(self, views: list[MemberView]) -> None:
        """Members earlier jobs ended (``--resume``): written unless their folder already
        holds an event file; every one joins the HParams experiment."""
        self.members(views, skip_written=True)

    def members(self, views: list[MemberView], skip_written: bool = False) -> None:
        from tensorboard.plugins.hparams import summary_v2 as hp
        for view in views:
            folder = self.logdir / "members" / _tag(view.id)
            wall = view.ended or time.time()
            events = []
            epochs = max((len(v) for v in view.history.values()), default=0)
            for epoch in range(epochs):
                values = {f"epoch/{k}": v[epoch] for k, v in view.history.items() if epoch < len(v)}
                events.append(self._scalars(values, epoch + 1, wall))
            last = max(epochs, int(view.hparams.get("epochs") or 0))
            final = dict(view.final)
            if view.train_seconds is not None:
                final["train_seconds"] = view.train_seconds
            if final:
                events.append(self._scalars(final, last, wall))
            hparams = {**view.hparams, "status": view.status}
            events.append(self._summary_event(hp.hparams_pb(hparams, trial_id=view.id, start_time_secs=wall),
                                              wall))
            if not (skip_written and any(folder.glob("events.out.tfevents.*"))):
                self._write(folder, events)
            for key, value in hparams.items():
                self.hparams.setdefault(key, set()).add(value)
            self.metrics.update(_tag(k) for k in final)
        self._dirty = True
        if time.monotonic() - self._written_at >= EXPERIMENT_SECONDS:
            self._experiment()

    def _experiment(self) -> None:
        """The HParams experiment: every hyperparameter (with the values seen) and metric."""
        from tensorboard.plugins.hparams import summary_v2 as hp
        self._dirty, self._written_at = False, time.monotonic()
        params = []
        for key, values in sorted(self.hparams.items()):
            kinds = {type(v) for v in values}
            if kinds == {str} or kinds == {bool}:
                params.append(hp.HParam(key, hp.Discrete(sorted(values))))
            else:
                params.append(hp.HParam(key))
        metrics = [hp.Metric(m) for m in sorted(self.metrics)]
        config = hp.hparams_config_pb(params, metrics, time_created_secs=time.time())
        for old in self.logdir.glob("events.out.tfevents.*"):       # one experiment file, the latest
            old.unlink()
        self._write(self.logdir, [self._summary_event(config, time.time())])

    def ensemble(self, summary: dict, files: list[Path]) -> None:
        wall = time.time()
        values = {}
        for who, key in (("ensemble", "ensemble"), ("best_member", "best_member")):
            part = summary.get(key) or {}
            for split in ("val", "test"):
                for name, value in (part.get(split) or {}).items():
                    if isinstance(value, (int, float)):
                        values[f"{split}/{name}" if who == "ensemble" else f"{who}/{split}/{name}"] = value
        if values:
            self._write(self.logdir / "ensemble", [self._scalars(values, 0, wall)])
        if self._dirty:
            self._experiment()

    def close(self, ok: bool) -> None:
        if self._dirty:
            self._experiment()
