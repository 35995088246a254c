"""Early discarding for the search (``evolve.discard``): stop a candidate whose learning
curve cannot reach the population's top at the same epoch, so the workers' time goes to
candidates that can.

A candidate reports its epoch logs every ``discard_epochs`` epochs (the executor's
in-training reports); the master answers with ``decide``:

- "asha" (asynchronous successive halving, Li et al. 2020, the stopping form Ray Tune's
  ``ASHAScheduler`` uses): rungs at ``discard_epochs * discard_factor**k`` epochs; at a
  rung a candidate goes on when its validation value is among the best
  ``ceil(n / discard_factor)`` of the ``n`` candidates that have reached that rung so far
  (itself included), else it stops. Asynchronous: nobody waits for a rung to fill.
- "median" (the median stopping rule of Google Vizier): at every report a candidate goes
  on when its value is at least as good as the median of the others' values at the same
  epoch.

Under either rule nobody is stopped while fewer than ``discard_grace`` values are known at
that epoch, and a candidate in the top fraction (``1 / discard_factor``; the better half
for "median") is never stopped. A stopped candidate ends with what it learned so far: its
result is journalled with ``discarded`` (the epoch and the rule), the search is told its
metric as a low-fidelity evaluation (not a failure), and it never enters the candidate pool
the ensemble is selected from. Pure Python: tested on synthetic learning curves.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

from ensemble.config import EvolveConfig
from ensemble.results.records import MemberRecord, Status
from ensemble.runtime.executor import CONTINUE, STOP
from ensemble.sources.base import Hooks
from ensemble.task.metrics import higher_is_better

RULES = ("off", "asha", "median")


class EarlyDiscard:
    """The master's Decider for in-training reports of search candidates."""

    def __init__(self, rule: str, first: int, factor: int, grace: int, metric: str):
        if rule not in RULES:
            raise ValueError(f"unknown discard rule {rule!r}; one of {RULES}")
        self.rule, self.first, self.factor, self.grace = rule, int(first), int(factor), int(grace)
        self.metric = metric
        self.key, self.up = f"val_{metric}", higher_is_better(metric)
        self.seen: dict[int, list[float]] = {}        # epoch -> the values known there, sorted (better last)
        self.stopped: dict[str, dict] = {}             # candidate id -> where it was stopped
        self.reported: dict[str, dict[int, float]] = {}   # candidate id -> its scores at the rungs so far

    @classmethod
    def from_config(cls, ev: EvolveConfig, metric: str) -> "EarlyDiscard | None":
        """The rule ``[evolve]`` asks for, or None for ``discard = "off"``."""
        if ev.discard == "off":
            return None
        return cls(ev.discard, ev.discard_epochs, ev.discard_factor, ev.discard_grace, metric)

    def bind(self, hooks: Hooks) -> None:
        pass

    def rungs(self, epochs: int) -> list[int]:
        """The epochs a candidate of ``epochs`` epochs is judged at ("asha"; "median" judges
        at every report from ``first`` on)."""
        out, r = [], self.first
        while r < epochs:
            out.append(r)
            if self.rule == "median":
                r += self.first
            else:
                r *= self.factor
        return out

    def stamp(self, spec: dict) -> dict:
        """The spec as it goes out: it reports every ``first`` epochs."""
        return {**spec, "report_every": self.first} if self.rungs(int(spec["epochs"])) else spec

    def _value(self, logs: dict) -> tuple[float, bool] | None:
        """(value, higher is better) of a report: ``val_<metric>`` when Keras logs it, else
        the validation loss."""
        if self.key in logs:
            value, up = logs[self.key], self.up
        elif "val_loss" in logs:
            value, up = logs["val_loss"], False
        else:
            return None
        return float(value), up

    def decide(self, spec: dict, payload: dict) -> dict:
        epoch = int(payload.get("epoch", 0))
        got = self._value(payload.get("logs") or {})
        if got is None or epoch not in self.rungs(int(spec["epochs"])):
            return CONTINUE
        value, up = got
        score = value if up else -value                 # higher is better from here on
        if not math.isfinite(score):
            score = -math.inf
        self.reported.setdefault(spec["id"], {})[epoch] = score
        known = self.seen.setdefault(epoch, [])
        if self.rule == "median":
            others = list(known)
            bisect.insort(known, score)
            if len(others) + 1 < self.grace:
                return CONTINUE
            median = others[len(others) // 2] if len(others) % 2 else \
                0.5 * (others[len(others) // 2 - 1] + others[len(others) // 2])
            keep = score >= median
        else:
            bisect.insort(known, score)
            n = len(known)
            if n < self.grace:
                return CONTINUE
            top = math.ceil(n / self.factor)
            keep = score >= known[n - top]              # among the best ``top`` (ties go on)
        if keep:
            return CONTINUE
        self.stopped[spec["id"]] = {"epoch": epoch, "rule": self.rule, "value": value,
                                    "key": self.key if self.key in payload.get("logs", {}) else "val_loss"}
        return STOP

    def mark(self, record: MemberRecord) -> MemberRecord:
        """A member ended: its record says whether (and where) it was discarded, and what it
        scored at the rungs it reached (``rungs``: epoch -> score, higher better), so
        ``--resume`` knows them."""
        where = self.stopped.pop(record.id, None)
        if where is not None and record.status is Status.OK:
            record = record.replace(status=Status.DISCARDED, discarded=where)
        scores = self.reported.pop(record.id, None)
        if scores:
            record = record.replace(extra={**record.extra, "rungs": {str(e): v for e, v in scores.items()}})
        return record

    def replay(self, records: Iterable[MemberRecord]) -> None:
        """``--resume``: the rungs as the journal's results left them."""
        for r in records:
            for epoch, score in (r.extra.get("rungs") or {}).items():
                bisect.insort(self.seen.setdefault(int(epoch), []), float(score))
