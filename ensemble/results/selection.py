"""Choosing ensemble members from their validation results.

Three ways, all deterministic (ties go to the smaller id):
- `rank_members`: finished member records, best validation score first;
- `top_k`: the k best members, equal weights;
- `greedy_selection`: Caruana et al. (2004) forward selection with replacement
  on the members' stored validation predictions, weights = selection counts.

Weights come back as a dict id -> weight ordered best first (highest weight, then
best single score), holding only nonzero weights, summing to 1.
Pure numpy; metrics and their directions come from `ensemble.task.metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ensemble.task.metrics import higher_is_better, metric_task, score, score_unchecked

__all__ = ["greedy_selection", "rank_key", "rank_members", "select", "top_k"]

# An addition must beat the current ensemble by more than this relative margin,
# so float noise from re-averaging identical predictions never counts as a gain.
MIN_GAIN = 1e-12
METHODS = ("greedy", "top_k")


# ------------------------------------------------------------------------ ordering
def _id_key(member_id: Any) -> tuple[int, int, str]:
    """Sort key of an id: integers numerically, anything else as its string."""
    if isinstance(member_id, (int, np.integer)) and not isinstance(member_id, bool):
        return (0, int(member_id), "")
    return (1, 0, str(member_id))


def _finite(value: Any) -> float | None:
    """`value` as a float, or None when it is missing, NaN, infinite or not a number."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _sort_key(value: float | None, member_id: Any, higher: bool) -> tuple:
    """Best first in the metric's direction, None last, ties by id."""
    if value is None:
        return (1, 0.0, _id_key(member_id))
    return (0, -value if higher else value, _id_key(member_id))


def rank_key(value: Any, member_id: Any, higher: bool) -> tuple:
    """The sort key of one member in every ranking of the run (leaderboard, retention,
    selection): best value first in the metric's direction, missing or non-finite last,
    ties by id. Smaller is better."""
    return _sort_key(_finite(value), member_id, higher)


def _ranked_ids(scores: Mapping[Any, Any], metric: str) -> list[Any]:
    """Ids with a finite score, best first (ties by id)."""
    higher = higher_is_better(metric)
    finite = {i: _finite(s) for i, s in scores.items()}
    kept = [i for i, s in finite.items() if s is not None]
    return sorted(kept, key=lambda i: _sort_key(finite[i], i, higher))


def rank_members(records: Iterable[Mapping[str, Any]], metric: str) -> list[Mapping[str, Any]]:
    """Member records (each with "id" and "val": {metric: value}) sorted best first
    by validation `metric`; ties by id; a record whose value is missing or not
    finite (NaN, inf, a failed member with no "val") goes last. Returns a new list
    of the same record objects."""
    higher = higher_is_better(metric)
    records = list(records)
    for i, rec in enumerate(records):
        if "id" not in rec:
            raise ValueError(f"member record {i} has no 'id': {dict(rec)!r}")

    def key(rec: Mapping[str, Any]) -> tuple:
        return _sort_key(_finite((rec.get("val") or {}).get(metric)), rec["id"], higher)

    return sorted(records, key=key)


def _equal_weights(ids: list[Any]) -> dict[Any, float]:
    return {i: 1.0 / len(ids) for i in ids}


def top_k(val_scores: Mapping[Any, float], k: int, metric: str) -> dict[Any, float]:
    """The k best ids by validation score (all of them when fewer), weight 1/k each.
    Ids whose score is NaN or infinite are never chosen."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"`k` must be a positive integer, but got {k!r}")
    ranked = _ranked_ids(val_scores, metric)
    if not ranked:
        raise ValueError(
            f"no candidate has a finite validation {metric!r} among {len(val_scores)} members"
        )
    return _equal_weights(ranked[:k])


# ------------------------------------------------------------------------- greedy
def _stack(
    val_preds: Mapping[Any, np.ndarray], val_vars: Mapping[Any, np.ndarray] | None
) -> tuple[dict[Any, np.ndarray], dict[Any, np.ndarray] | None]:
    """Predictions (and variances) as float64 arrays of one common shape."""
    if not val_preds:
        raise ValueError("`val_preds` must hold at least one member, but got none")
    preds = {i: np.asarray(p, dtype=np.float64) for i, p in val_preds.items()}
    shape = next(iter(preds.values())).shape
    for i, p in preds.items():
        if p.shape != shape:
            raise ValueError(
                f"validation predictions must share one shape, but member {i!r} has"
                f" {p.shape} and the first has {shape}"
            )
    if val_vars is None:
        return preds, None
    missing = [i for i in preds if i not in val_vars]
    if missing:
        raise ValueError(f"`val_vars` lacks the variances of members {missing}")
    variances = {i: np.asarray(val_vars[i], dtype=np.float64) for i in preds}
    for i, v in variances.items():
        if v.shape != shape:
            raise ValueError(
                f"`val_vars` of member {i!r} has shape {v.shape}, but its predictions {shape}"
            )
    return preds, variances


def _single_scores(
    metric: str, y: np.ndarray, preds: dict, variances: dict | None
) -> dict[Any, float]:
    """Each member's own score; NaN for a member whose predictions are not finite."""
    out = {}
    for i, p in preds.items():
        var = None if variances is None else variances[i]
        finite = np.all(np.isfinite(p)) and (var is None or np.all(np.isfinite(var)))
        out[i] = score(metric, y, p, var) if finite else math.nan
    return out


class _Ensemble:
    """Running sums of a multiset of members, scored as their average (for
    regression with variances: the mixture mean and variance)."""

    def __init__(self, metric: str, y: np.ndarray, preds: dict, variances: dict | None):
        self.metric, self.y, self.preds, self.vars = metric, y, preds, variances
        self.sum = np.zeros_like(next(iter(preds.values())))
        self.sum_sq = np.zeros_like(self.sum) if variances is not None else None
        self.size = 0

    def _second(self, i: Any) -> np.ndarray:
        return self.vars[i] + self.preds[i] ** 2

    def score_with(self, i: Any | None) -> float:
        """Score of the ensemble with member `i` added once more (None: as it is)."""
        n = self.size + (i is not None)
        total = self.sum if i is None else self.sum + self.preds[i]
        mean = total / n
        var = None
        if self.sum_sq is not None:
            second = self.sum_sq if i is None else self.sum_sq + self._second(i)
            var = np.maximum(second / n - mean**2, 0.0)
        value = score_unchecked(self.metric, self.y, mean, var)
        return value if math.isfinite(value) else math.nan

    def add(self, i: Any) -> None:
        self.sum += self.preds[i]
        if self.sum_sq is not None:
            self.sum_sq += self._second(i)
        self.size += 1


def _better(a: float, b: float, higher: bool) -> bool:
    """Whether score `a` beats `b` by more than float noise (NaN never beats)."""
    if math.isnan(a):
        return False
    if math.isnan(b):
        return True
    margin = MIN_GAIN * max(1.0, abs(b))
    return a > b + margin if higher else a < b - margin


def greedy_selection(
    val_preds: Mapping[Any, np.ndarray],
    y_val: np.ndarray,
    metric: str,
    *,
    max_size: int = 50,
    n_init: int = 3,
    task: str | None = None,
    val_vars: Mapping[Any, np.ndarray] | None = None,
) -> dict[Any, float]:
    """Caruana et al. (2004) ensemble selection on validation predictions.

    Start from the `n_init` best single members (sorted initialisation), then add,
    with replacement, the member whose addition gives the best ensemble `metric`
    on (`y_val`), until no addition improves it strictly or the ensemble holds
    `max_size` picks (initial ones included). The ensemble is the average of
    `val_preds` (probabilities (n, c) for classification, means for regression).
    `task` defaults to the metric's task; "nll" needs `val_vars` (the members'
    predicted variances), and then the ensemble is scored as their mixture.
    Members whose predictions or own score are not finite are left out.
    Weights = counts / picks.
    """
    higher = higher_is_better(metric)
    expected = metric_task(metric)
    if task is not None and task != expected:
        raise ValueError(f"`task` must be {expected!r} for metric {metric!r}, but got {task!r}")
    for name, value in (("max_size", max_size), ("n_init", n_init)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer, but got {value!r}")
    if metric == "nll" and val_vars is None:
        raise ValueError("metric 'nll' needs the members' variances `val_vars`, but got None")
    preds, variances = _stack(val_preds, val_vars if metric == "nll" else None)
    y = np.asarray(y_val)

    single = _single_scores(metric, y, preds, variances)
    ranked = _ranked_ids(single, metric)
    if not ranked:
        raise ValueError(f"no candidate has a finite validation {metric!r} among {len(preds)}")
    by_id = sorted(ranked, key=_id_key)
    # `score` accepted y for every member; the inner loop takes it ready-made.
    y = y.reshape(-1).astype(np.int64) if expected == "classification" else y.astype(np.float64)

    ensemble = _Ensemble(metric, y, preds, variances)
    counts: dict[Any, int] = {}
    for i in ranked[: min(n_init, max_size)]:
        ensemble.add(i)
        counts[i] = counts.get(i, 0) + 1
    current = ensemble.score_with(None)

    while ensemble.size < max_size:
        best_id, best = None, math.nan
        for i in by_id:  # strict comparison: ties go to the smaller id
            value = ensemble.score_with(i)
            if math.isnan(value):
                continue
            if best_id is None or (value > best if higher else value < best):
                best_id, best = i, value
        if best_id is None or not _better(best, current, higher):
            break
        ensemble.add(best_id)
        counts[best_id] = counts.get(best_id, 0) + 1
        current = best

    position = {i: r for r, i in enumerate(ranked)}
    order = sorted(counts, key=lambda i: (-counts[i], position[i]))
    return {i: counts[i] / ensemble.size for i in order}


def select(
    val_preds: Mapping[Any, np.ndarray],
    y_val: np.ndarray,
    metric: str,
    *,
    method: str | None = None,
    k: int = 10,
    max_size: int = 50,
    n_init: int = 3,
    task: str | None = None,
    val_vars: Mapping[Any, np.ndarray] | None = None,
) -> dict[Any, float]:
    """Ensemble weights by `method` ("greedy" or "top_k"); when None, greedy if
    there are more candidates than `k`, else top_k (which then keeps them all)."""
    if method is None:
        method = "greedy" if len(val_preds) > k else "top_k"
    if method == "greedy":
        return greedy_selection(
            val_preds, y_val, metric, max_size=max_size, n_init=n_init, task=task,
            val_vars=val_vars,
        )
    if method != "top_k":
        raise ValueError(f"`method` must be one of {', '.join(METHODS)}, but got {method!r}")
    expected = metric_task(metric)
    if task is not None and task != expected:
        raise ValueError(f"`task` must be {expected!r} for metric {metric!r}, but got {task!r}")
    if metric == "nll" and val_vars is None:
        raise ValueError("metric 'nll' needs the members' variances `val_vars`, but got None")
    preds, variances = _stack(val_preds, val_vars if metric == "nll" else None)
    return top_k(_single_scores(metric, np.asarray(y_val), preds, variances), k, metric)
