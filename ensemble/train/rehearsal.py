"""``runtime.trainer = "rehearsal"``: members that sleep instead of training (no TensorFlow).

A rehearsal runs the whole control plane of a real run (data broadcast, dispatch, reports,
journal, budget, selection, ensemble.json) with members whose cost is only their duration,
so a user can size an allocation, and the project can measure its master, before paying
for GPUs. Each member:

- sleeps a duration drawn from a log-normal distribution (median ``rehearsal.seconds``, or
  its architecture's ``rehearsal.arch_seconds``; spread ``rehearsal.spread`` = sigma of the
  log; 0 gives every member the median), or the
  time an earlier run journalled for the same member id (``rehearsal.replay``:
  a journal.jsonl or its run directory; ids it lacks get durations drawn from its records);
- splits the sleep over ``epochs`` and reports to the master every ``report_every`` epochs
  as a Keras member does, obeying a stop, and stops at its ``member_time_limit`` (which the
  budget shortens near the run's end) with the Keras member's outcome (``check_time_limit``);
- returns a record of the real shape (metrics, params, epochs) and, unless
  ``rehearsal.predictions = false``, validation and test predictions of the right shape
  (a made-up member about ``rehearsal.accuracy`` good) when it can be a selection
  candidate, as a Keras member does, so retention, the packed store, selection and the
  ensemble run as after real training. No model file: ``ensemble.predict`` has nothing
  to load in a rehearsal's run directory.
- fails (kind "rehearsal") with probability ``rehearsal.failure_rate``.

In a member group every rank sleeps and reports alike; the leader returns the record.
"""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np

from ensemble.config.vocabulary import gaussian_head
from ensemble.results.journal import read_journal
from ensemble.results.records import Status
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import Report
from ensemble.task import get_task
from ensemble.train.member import MemberFailed, candidate_payload, check_time_limit

if TYPE_CHECKING:
    from ensemble.config import RehearsalConfig, RunConfig


def replay_durations(path: str | Path) -> dict[str, float]:
    """member id -> seconds on its worker (``ended - started``; ``train_seconds`` in journals
    without timestamps) from a journal (or a run directory holding one)."""
    path = Path(path)
    run_dir = RunDirectory(path) if path.is_dir() else None
    if run_dir is not None:
        path = path / RunDirectory.JOURNAL
    if not path.is_file():
        raise ValueError(f"`rehearsal.replay`: {str(path)!r} is not a journal.jsonl or a run directory "
                         "holding one")
    out = {}
    for record in (run_dir.read_journal() if run_dir is not None else read_journal(path)):
        if "id" not in record:
            continue
        if "ended" in record and "started" in record:
            out[record["id"]] = float(record["ended"]) - float(record["started"])
        elif record.get("train_seconds") is not None:
            out[record["id"]] = float(record["train_seconds"])
    if not out:
        raise ValueError(f"`rehearsal.replay`: {str(path)!r} holds no member with `train_seconds`")
    return out


def member_seconds(spec: dict, settings: RehearsalConfig, replay: dict[str, float] | None = None) -> float:
    """How long ``spec`` sleeps: replayed by id, else drawn (the same for the same seed)."""
    if replay:
        if spec["id"] in replay:
            return replay[spec["id"]]
        values = list(replay.values())
        return values[zlib.crc32(spec["id"].encode()) % len(values)]
    rng = np.random.default_rng([spec["seed"], 17])
    median = settings.arch_seconds.get(spec.get("arch"), settings.seconds)
    return float(median * np.exp(settings.spread * rng.standard_normal()))


def _made_up(task, y: np.ndarray, n_outputs: int, quality: float, rng, gaussian: bool):
    """(prediction, variance or None) shaped like a real member's on targets ``y``."""
    n = len(y)
    if task.name == "classification":
        labels = np.asarray(y).astype(int).reshape(n)
        right = rng.random(n) < quality
        wrong = (labels + rng.integers(1, max(2, n_outputs), n)) % max(2, n_outputs)
        top = np.where(right, labels, wrong)
        logits = rng.normal(0.0, 1.0, (n, n_outputs))
        logits[np.arange(n), top] = logits.max(axis=1) + rng.uniform(0.5, 3.0, n)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True), None
    y = np.asarray(y, dtype=np.float64)
    sigma = (1.0 - quality) * (float(np.std(y)) or 1.0) + 1e-6
    pred = y + rng.normal(0.0, sigma, y.shape)
    return pred, (np.full(y.shape, sigma ** 2) if gaussian else None)


class RehearsalTrainer:
    """The trainer (spec, report) -> record of a rehearsal; see the module docstring."""

    def __init__(self, cfg: RunConfig, meta: dict, data: Mapping[str, np.ndarray], leader: bool = True):
        self.settings, self.leader = cfg.rehearsal, leader
        self.meta, self.data = meta, data
        self.task = get_task(meta["task"])
        self.replay = replay_durations(self.settings.replay) if self.settings.replay else None
        self._scores: dict[bool, list[dict]] = {}       # without predictions: a few members' metrics
        if not self.settings.predictions:             # made now: start-up, not the first members
            rng = np.random.default_rng(0)
            for gaussian in ((False, True) if self.task.name == "regression" else (False,)):
                for _ in range(8):
                    self._score(rng, float(np.clip(self.settings.accuracy + rng.normal(0.0, 0.05), 0, 1)),
                                gaussian)

    def _score(self, rng, quality: float, gaussian: bool) -> tuple[dict, dict | None]:
        """(metrics, arrays or None) of made-up predictions on both splits. Without
        ``predictions`` a member reuses one of 8 made-up members' metrics: a null member
        then costs the worker nothing but its sleep."""
        keep = self.settings.predictions
        if not keep and len(self._scores.get(gaussian, ())) >= 8:
            return self._scores[gaussian][int(rng.integers(8))], None
        scores, preds, variances = {}, {}, {}
        for split in ("val", "test"):
            y = np.asarray(self.data[f"y_{split}"])
            preds[split], variances[split] = _made_up(self.task, y, self.meta["n_outputs"], quality, rng, gaussian)
            scores[split] = self.task.metrics(y, preds[split], variances[split])
        if not keep:
            self._scores.setdefault(gaussian, []).append(scores)
            return scores, None
        return scores, (preds, variances)

    def __call__(self, spec: dict, report: Report | None = None, tail=None) -> dict | None:
        t0 = time.monotonic()
        seconds = member_seconds(spec, self.settings, self.replay)
        epochs = max(1, int(spec.get("epochs", 1)))
        every = int(spec.get("report_every") or 0)
        done, stopped = epochs, "epochs"
        crew = _Crew(tail) if tail is not None else None
        limit = spec.get("member_time_limit")          # as a Keras member's: the budget caps it near the end
        cut = t0 + float(limit) if limit else None
        end = t0
        for epoch in range(1, epochs + 1):
            end += seconds / epochs / (crew.speed() if crew is not None else 1.0)
            if cut is not None and end > cut:       # stopped inside this epoch: the ones before it count
                _sleep_until(cut)
                done, stopped = epoch - 1, "time_limit"
                break
            _sleep_until(end)
            if report is not None and every and epoch % every == 0 and epoch < epochs:
                decision = report({"epoch": epoch, "logs": {"loss": 1.0 / epoch, "val_loss": 1.0 / epoch}})
                if decision["action"] == "stop":
                    done, stopped = epoch, "master"
                    break
            if crew is not None and epoch < epochs:
                crew.epoch_end(spec["id"])
        if not self.leader:            # the other ranks of a group sleep and report alike, return nothing
            return None
        helped = crew.end() if crew is not None else {}
        if stopped == "time_limit":
            check_time_limit(spec, done)            # none completed, or `train.time_limit_fails`: status "limit"
        record = self.record(spec, time.monotonic() - t0, done, stopped)
        record["train_seconds"] = round(time.monotonic() - t0, 3)      # scoring and writing included
        record.update(helped)
        return record

    def help(self, spec: dict, leader: int, tail) -> None:
        """A helper at the end of the run: in the crew of ``leader`` until the member ends (it
        sleeps with the leader, whose epochs shorten as the crew grows: ``tail.speedup``)."""
        from ensemble.runtime.mpi import polite_bcast
        ranks = tail.answer(leader)
        if ranks is None:
            return
        group = tail.form(ranks)
        polite_bcast(group, None)                       # the state (here: nothing to carry)
        while (new := polite_bcast(group, None)) is not None:
            if new:
                ranks = ranks + new
                old, group = group, tail.form(ranks)
                old.Free()
                polite_bcast(group, None)
        group.Free()

    def record(self, spec: dict, seconds: float, epochs: int | None = None, stopped: str = "epochs") -> dict:
        """The member's journal record after ``seconds`` (raises MemberFailed for a drawn failure)."""
        rng = np.random.default_rng([spec["seed"], 29])
        if rng.random() < self.settings.failure_rate:
            raise MemberFailed("rehearsal", f"rehearsal failure drawn for {spec['id']} "
                               f"(`rehearsal.failure_rate` = {self.settings.failure_rate:g})")
        quality = float(np.clip(self.settings.accuracy + rng.normal(0.0, 0.05), 0.0, 1.0))
        scores, arrays = self._score(rng, quality, gaussian_head(spec.get("loss"), self.task.name,
                                                                  bool(spec.get("model"))))
        record = {"id": spec["id"], "status": Status.OK.value, "arch": spec.get("arch"), "seed": spec["seed"],
                  "val": scores["val"], "test": scores["test"],
                  "params": int(rng.integers(1_000, 1_000_000)),
                  "epochs": max(1, int(spec.get("epochs", 1))) if epochs is None else epochs, "stopped": stopped,
                  "train_seconds": round(seconds, 3), "model": False, "path": None,
                  "predict_seconds_per_sample": 0.0, "rehearsal": True}
        if arrays is not None:
            record.update(candidate_payload(spec, scores["val"], *arrays))
        return record


class _Crew:
    """A rehearsal member's worker and its helpers (``runtime.tail``), following the Keras
    member's messages: at each epoch end the crew hears whether it grows ([] no, a list of
    new ranks yes), the new ranks are invited and the group is formed; ``None`` ends it."""

    def __init__(self, tail):
        self.tail, self.ranks, self.group = tail, [tail.rank], None
        self.joined: dict[int, float] = {}

    def speed(self) -> float:
        from ensemble.runtime.tail import EFFICIENCY, speedup
        return speedup(len(self.ranks), EFFICIENCY)

    def epoch_end(self, spec_id: str) -> None:
        from ensemble.runtime.mpi import polite_bcast
        new = self.tail.arrived(spec_id)
        if self.group is not None:
            polite_bcast(self.group, new)
        if not new:
            return
        self.tail.invite(self.ranks + new, new)
        self.ranks = self.ranks + new
        old, self.group = self.group, self.tail.form(self.ranks)
        if old is not None:
            old.Free()
        polite_bcast(self.group, {})
        now = time.monotonic()
        self.joined.update({r: now for r in new})

    def end(self) -> dict:
        """The crew parts; the record's ``helpers`` and ``helper_seconds`` (none: {})."""
        from ensemble.runtime.mpi import polite_bcast
        if self.group is None:
            return {}
        polite_bcast(self.group, None)
        self.group.Free()
        from ensemble.results.records import helped_fields
        now = time.monotonic()
        return helped_fields(len(self.ranks) - 1, sum(now - t for t in self.joined.values()))


def _sleep_until(deadline: float) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)
