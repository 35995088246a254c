"""Which members keep their artifacts: bounded sets, whatever the number of members.

At 100,000 members a run cannot keep a model and predictions for each. It keeps:

- predictions (validation and test, for ensemble selection) for the best ``candidates``
  members by the validation metric: selection chooses among them;
- model files for the best ``max(keep_models, candidates)`` while the run goes on (a
  candidate must stay loadable, since selection may pick it), and for the members on the
  Pareto front of a multi-objective search; when the run ends, the models of the members
  that were neither selected nor among the best ``keep_models`` nor on the front are
  removed (``prune``).

Ranking is the run's one order (``selection.rank_key``): best value first, ties by the
proper score (log loss or NLL; ``Retention.tie``), then by id,
so the kept sets depend on the results only, not on the order they arrive in. The master
sends the current bars with every spec (``wire``); a worker whose member cannot enter
(``passes``) writes no model and sends no predictions. Bars only get stricter, so a bar
that is a little stale keeps a little more, never less; what arrives and no longer
enters is dropped by the master.

Pure Python: no MPI, no files (``results.artifacts`` does the storing and removing).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

from ensemble.config.vocabulary import PROPER_SCORES
from ensemble.results.selection import rank_key
from ensemble.task.metrics import higher_is_better, metric_task


@dataclass
class Decision:
    """What to do with one arriving member, and with the members it pushed out."""
    predictions: bool = False
    model: bool = False
    released_predictions: list[str] = field(default_factory=list)
    released_models: list[str] = field(default_factory=list)


class ParetoFront:
    """Non-dominated points (every objective maximised); equal points all stay."""

    def __init__(self):
        self.points: dict[str, tuple[float, ...]] = {}

    def __contains__(self, member_id: str) -> bool:
        return member_id in self.points

    def add(self, member_id: str, objectives) -> tuple[bool, list[str]]:
        """(whether ``member_id`` is on the front now, the ids it pushed off)."""
        point = tuple(float(x) for x in objectives)
        if not all(math.isfinite(x) for x in point):
            return False, []
        for other in self.points.values():
            if _dominates(other, point):
                return False, []
        removed = [i for i, other in self.points.items() if _dominates(point, other)]
        for i in removed:
            del self.points[i]
        self.points[member_id] = point
        return True, removed

    def discard(self, member_id: str) -> None:
        self.points.pop(member_id, None)


def _dominates(a: tuple, b: tuple) -> bool:
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


class Retention:
    """The kept sets of a run (see the module docstring); ``offer`` each finished member."""

    def __init__(self, metric: str, candidates: int, keep_models: int, pareto: bool = False):
        if candidates < 1:
            raise ValueError(f"`candidates` must be at least 1, but got {candidates}")
        self.metric, self.higher = metric, higher_is_better(metric)
        self.tie = PROPER_SCORES[metric_task(metric)]          # the validation score ties go by
        self.n_predictions = candidates
        self.n_models = max(keep_models, candidates)
        self.keep_models = keep_models
        self._ranked: list[tuple[tuple, str]] = []           # (rank key, id), best first, <= n_models
        self._values: dict[str, tuple[float, Any]] = {}        # id -> (value, tie)
        self.front = ParetoFront() if pareto else None

    def key(self, value: Any, member_id: str, tie: Any = None) -> tuple | None:
        """The member's rank key; None when its value is missing or not finite (never kept)."""
        key = rank_key(value, member_id, self.higher, tie)
        return None if key[0] else key              # rank_key puts non-finite values last: (1, ...)

    def __contains__(self, member_id: str) -> bool:
        return member_id in self._values

    def predictions(self) -> list[str]:
        """Ids whose predictions are kept, best first."""
        return [i for _, i in self._ranked[:self.n_predictions]]

    def models(self) -> set[str]:
        """Ids whose models are kept (the best n_models, and the Pareto front)."""
        kept = {i for _, i in self._ranked}
        if self.front is not None:
            kept |= set(self.front.points)
        return kept

    def discard(self, member_id: str) -> None:
        """Forget ``member_id`` (lost, or retrained): it keeps nothing."""
        kept = self._values.pop(member_id, None)
        if kept is not None:
            entry = (rank_key(kept[0], member_id, self.higher, kept[1]), member_id)
            pos = bisect.bisect_left(self._ranked, entry)
            if pos < len(self._ranked) and self._ranked[pos] == entry:
                del self._ranked[pos]
        if self.front is not None:
            self.front.discard(member_id)

    def offer(self, member_id: str, value: Any, objectives=None, tie: Any = None) -> Decision:
        """Member ``member_id`` finished with validation ``value`` (its ``tie`` score too,
        and, in a multi-objective search, ``objectives``): what it keeps, and whom it
        pushes out."""
        self.discard(member_id)
        decision = Decision()
        key = self.key(value, member_id, tie)
        on_front, off_front = False, []
        if self.front is not None and objectives is not None and key is not None:
            on_front, off_front = self.front.add(member_id, objectives)
        if key is not None:
            entry = (key, member_id)
            pos = bisect.bisect_left(self._ranked, entry)
            if pos < self.n_models:
                self._ranked.insert(pos, entry)
                self._values[member_id] = (float(value), key[2] if math.isfinite(key[2]) else None)
                decision.model = True
                if pos < self.n_predictions:
                    decision.predictions = True
                    if len(self._ranked) > self.n_predictions:       # the old last candidate is out
                        decision.released_predictions.append(self._ranked[self.n_predictions][1])
                if len(self._ranked) > self.n_models:
                    _, out = self._ranked.pop()
                    del self._values[out]
                    if self.front is None or out not in self.front:
                        decision.released_models.append(out)
        decision.model = decision.model or on_front
        ranked = {i for _, i in self._ranked}
        decision.released_models += [i for i in off_front if i not in ranked]
        return decision

    def restore(self, member_id: str, value: Any, objectives=None, tie: Any = None) -> None:
        """Put back a member kept before a resume (no decision: it keeps what it kept)."""
        self.offer(member_id, value, objectives, tie)

    def bars(self) -> dict[str, list | None]:
        """The worst kept member of each full set as [value, id, tie] (None: not full, all enter)."""
        def bar(n: int):
            if len(self._ranked) < n:
                return None
            member_id = self._ranked[n - 1][1]
            value, tie = self._values[member_id]
            return [value, member_id, tie]
        return {"predictions": bar(self.n_predictions),
                "models": None if self.front is not None else bar(self.n_models)}

    def wire(self) -> dict:
        """What a spec carries to its worker (``retain``): the metric, its direction, the
        score ties go by, the bars."""
        return {"metric": self.metric, "higher": self.higher, "tie": self.tie, **self.bars()}

    def final_models(self, selected) -> set[str]:
        """Models to keep once the ensemble is chosen: the selected members, the best
        ``keep_models`` and the Pareto front."""
        kept = set(selected) | {i for _, i in self._ranked[:self.keep_models]}
        if self.front is not None:
            kept |= set(self.front.points)
        return kept


def passes(retain: dict | None, which: str, val: dict, member_id: str) -> bool:
    """Worker side: may a member with validation metrics ``val`` enter set ``which``
    ("predictions" or "models") under the bars a spec carried? No bars: yes."""
    if not retain:
        return True
    higher, tie = retain["higher"], retain.get("tie")
    key = rank_key(val.get(retain["metric"]), member_id, higher, val.get(tie) if tie else None)
    if key[0]:                                      # missing or not finite: never kept
        return False
    bar = retain.get(which)
    return bar is None or key < rank_key(bar[0], bar[1], higher, bar[2] if len(bar) > 2 else None)
