"""Choosing ensemble members from their validation results.

All deterministic (ties go to a better proper score, then to the smaller id):
- `rank_members`: finished member records, best validation score first;
- `top_k`: the k best members, equal weights;
- `greedy_selection`: Caruana et al. (2004) forward selection with replacement
  on the members' stored validation predictions, weights = selection counts;
- `bagged_selection`: Caruana's bagged variant, greedy selection on random halves
  of the candidates, weights averaged over the bags;
- `shrunk_selection`: bagged selection shrunk toward the uniform average;
- `choose_ensemble`: what a run does: shrunk selection, unless another (the uniform
  average of the k best, greedy, bagged) beats it clearly out of fold on a proper
  scoring rule; one member only when validation shows it significantly better.

Weights come back as a dict id -> weight ordered best first (highest weight, then
best single score), holding only nonzero weights, summing to 1.
Pure numpy; metrics and their directions come from `ensemble.task.metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from statistics import NormalDist
from typing import Any

import numpy as np

from ensemble.config.vocabulary import SELECTION_METHODS
from ensemble.results.records import MemberRecord
from ensemble.task.metrics import (
    POINTWISE,
    PROBA_EPS,
    PROBA_TOL,
    higher_is_better,
    metric_task,
    pointwise,
    score,
    score_unchecked,
    var_floor,
)

__all__ = ["bagged_selection", "choose_ensemble", "shrunk_selection", "effective_size", "ensemble_score",
           "few_rows_note", "greedy_selection", "rank_key", "rank_members", "select", "top_k"]

# An addition must beat the current ensemble by more than this relative margin,
# so float noise from re-averaging identical predictions never counts as a gain.
MIN_GAIN = 1e-12
METHODS = ("greedy", "top_k")
#: ``ensemble.method``: "auto" compares greedy and bagged by cross-validation
CHOICES = SELECTION_METHODS
BAGS, BAG_FRACTION, CV_FOLDS, MIN_CV_ROWS = 20, 0.5, 5, 20
#: "auto" keeps a single member only when it beats every larger ensemble out of fold by
#: more than this many standard errors (one-sided 5%)
SIGNIFICANCE_Z = 1.645
#: "auto" leaves shrunk selection only for a config that beats it out
#: of fold at this one-sided significance level, Bonferroni-corrected for the number of
#: configs compared (the best of many looks better than it is): 3.1 standard errors for 8
#: candidates, 3.4 for 500
DEPART_ALPHA = 0.01
#: how far "shrunk" selection moves bagged weights toward the uniform average (chosen on the
#: panel, docs/ensembles.md)
SHRINK = 0.25
#: the uniform average "shrunk" moves toward holds the members not worse than the best one on
#: validation by more than this many standard errors of their paired per-row difference (a
#: search's pool holds networks far worse than its best, which a deep ensemble would not)
COMPETITIVE_Z = 3.0
#: numbers per batch when greedy selection scores every candidate at once
BATCH_ELEMENTS = 4_000_000
#: the scores `_Ensemble.scores_all` computes for all candidates at once
BATCHED = frozenset({"log_loss", "nll", "mse"})


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


def _sort_key(value: float | None, member_id: Any, higher: bool, tie: float | None = None) -> tuple:
    """Best first in the metric's direction, None last; ties by `tie` (lower is
    better, missing last), then by id."""
    if value is None:
        return (1, 0.0, math.inf, _id_key(member_id))
    return (0, -value if higher else value, math.inf if tie is None else tie, _id_key(member_id))


def rank_key(value: Any, member_id: Any, higher: bool, tie: Any = None) -> tuple:
    """The sort key of one member in every ranking of the run (leaderboard, retention,
    selection): best value first in the metric's direction, missing or non-finite last;
    equal values by `tie`, the member's proper score (log loss, NLL: lower is better,
    so eight members at validation accuracy 1.0 are told apart by how confident they
    are), then by id. Smaller is better."""
    return _sort_key(_finite(value), member_id, higher, _finite(tie))


def _ranked_ids(scores: Mapping[Any, Any], metric: str) -> list[Any]:
    """Ids with a finite score, best first (ties by id)."""
    higher = higher_is_better(metric)
    finite = {i: _finite(s) for i, s in scores.items()}
    kept = [i for i, s in finite.items() if s is not None]
    return sorted(kept, key=lambda i: _sort_key(finite[i], i, higher))


def rank_members(records: Iterable[Any], metric: str, tie: str | None = None) -> list[Any]:
    """Member records (``MemberRecord``s, or mappings with "id" and "val": {metric: value})
    sorted best first by validation `metric`; ties by validation `tie` (a proper score,
    lower is better), then by id; a record whose value is missing or not finite (NaN, inf,
    a failed member with no "val") goes last. Returns a new list of the same record objects."""
    higher = higher_is_better(metric)
    records = list(records)
    for i, rec in enumerate(records):
        if not isinstance(rec, MemberRecord) and "id" not in rec:
            raise ValueError(f"member record {i} has no 'id': {dict(rec)!r}")

    def key(rec: Any) -> tuple:
        typed = isinstance(rec, MemberRecord)
        val = (rec.val if typed else rec.get("val")) or {}
        return rank_key(val.get(metric), rec.id if typed else rec["id"], higher, val.get(tie) if tie else None)

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
    """Each member's own score; NaN for a member whose predictions are not finite. Inputs are
    checked as ``score`` checks them (bad labels or rows that are not probabilities raise);
    the proper scores are then computed for all members at once."""
    out: dict[Any, float] = {}
    finite = [i for i, p in preds.items()
              if np.all(np.isfinite(p)) and (variances is None or np.all(np.isfinite(variances[i])))]
    if metric not in BATCHED or len(finite) < 2:
        for i in preds:
            var = None if variances is None else variances[i]
            out[i] = score(metric, y, preds[i], var) if i in finite else math.nan
        return out
    first = finite[0]
    score(metric, y, preds[first], None if variances is None else variances[first])   # labels, shapes
    if metric_task(metric) == "classification":
        for i in finite:                     # rows of probabilities, as `score` checks them
            p = preds[i]
            if p.min() < -PROBA_TOL or p.max() > 1 + PROBA_TOL or np.max(np.abs(p.sum(axis=1) - 1)) > PROBA_TOL:
                score(metric, y, p)          # raises the message that says what is wrong
        y_fit = y.reshape(-1).astype(np.int64)
    else:
        y_fit = y.astype(np.float64)
    at = dict(zip(finite, _Ensemble(metric, y_fit, preds, variances).scores_all(finite).tolist()))
    return {i: at.get(i, math.nan) for i in preds}


class _Ensemble:
    """Running sums of a multiset of members, scored as their average (for
    regression with variances: the mixture mean and variance)."""

    def __init__(self, metric: str, y: np.ndarray, preds: dict, variances: dict | None):
        self.metric, self.y, self.preds, self.vars = metric, y, preds, variances
        first = next(iter(preds.values()))
        if metric_task(metric) == "regression":       # every regression metric is blind to a shift of
            shift = np.asarray(y, dtype=np.float64).reshape(first.shape).mean(axis=0)    # the targets: centred,
            self.y = (np.asarray(y, dtype=np.float64).reshape(first.shape) - shift).reshape(np.shape(y))
            self.preds = {i: np.asarray(p, dtype=np.float64) - shift for i, p in preds.items()}   # E[x^2] - E[x]^2
            first = next(iter(self.preds.values()))   # keeps its digits at a target of 1e9 + signal
        self.sum = np.zeros_like(first)
        self.sum_sq = np.zeros_like(self.sum) if variances is not None else None
        self.floor = var_floor(self.y.reshape(self.sum.shape)) if variances is not None else None
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

    def scores_all(self, ids: list) -> np.ndarray:
        """``score_with(i)`` for every id, as one array (NaN where not finite): batched over
        candidates for log loss, Gaussian NLL and MSE (the proper scores selection uses),
        in chunks of at most ``BATCH_ELEMENTS`` numbers; one by one for other metrics."""
        if self.metric not in BATCHED:
            return np.array([self.score_with(i) for i in ids], dtype=np.float64)
        out = np.empty(len(ids), dtype=np.float64)
        n = self.size + 1
        chunk = max(1, BATCH_ELEMENTS // max(1, self.sum.size))
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            mean = (self.sum[None] + np.stack([self.preds[i] for i in part])) / n
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                if self.metric == "log_loss":
                    p = np.clip(mean, PROBA_EPS, 1.0)
                    rows = np.arange(p.shape[1])
                    values = -np.mean(np.log(p[:, rows, self.y] / p.sum(axis=2)), axis=1)
                elif self.metric == "mse":
                    values = np.mean(((self.y.reshape(self.sum.shape)[None] - mean) ** 2).reshape(len(part), -1),
                                     axis=1)
                else:
                    second = (self.sum_sq[None] + np.stack([self._second(i) for i in part])) / n
                    var = np.maximum(np.maximum(second - mean**2, 0.0), self.floor)
                    y = self.y.reshape(self.sum.shape)[None]
                    values = np.mean((0.5 * np.log(2 * np.pi * var) + (y - mean) ** 2 / (2 * var))
                                     .reshape(len(part), -1), axis=1)
            out[start:start + len(part)] = values
        out[~np.isfinite(out)] = np.nan
        return out

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

    Start from the best single member and add the next best ones, up to `n_init`,
    while each improves the ensemble (Caruana's sorted initialisation, its size chosen
    on validation: a poor member is never forced in), then add,
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
    ensemble.add(ranked[0])
    counts: dict[Any, int] = {ranked[0]: 1}
    current = ensemble.score_with(None)
    for i in ranked[1: min(n_init, max_size)]:      # sorted initialisation, while it helps
        value = ensemble.score_with(i)
        if not _better(value, current, higher):
            break
        ensemble.add(i)
        counts[i] = 1
        current = value

    while ensemble.size < max_size:
        values = ensemble.scores_all(by_id)
        if np.all(np.isnan(values)):
            break
        # the first of equal values: ties go to the smaller id
        j = int(np.nanargmax(values) if higher else np.nanargmin(values))
        best_id, best = by_id[j], float(values[j])
        if not _better(best, current, higher):
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


# ----------------------------------------------------------- the run's selection
def effective_size(weights: Mapping[Any, float]) -> float:
    """Kish's effective number of members, 1 / sum(w^2): 1.0 for one member, n for
    n equal weights; an ensemble of 4 at (0.93, 0.03, 0.02, 0.02) is about 1.15."""
    w = np.asarray(list(weights.values()), dtype=np.float64)
    return float(1.0 / np.sum((w / w.sum()) ** 2))


def ensemble_score(
    weights: Mapping[Any, float],
    val_preds: Mapping[Any, np.ndarray],
    y_val: np.ndarray,
    metric: str,
    val_vars: Mapping[Any, np.ndarray] | None = None,
) -> float:
    """`metric` of the weighted average of members (for "nll": of their mixture, as
    greedy selection scores it); NaN when it is not finite."""
    mean, var = _average(weights, val_preds, metric, val_vars)
    try:
        value = score(metric, y_val, mean, var)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def bagged_selection(
    val_preds: Mapping[Any, np.ndarray],
    y_val: np.ndarray,
    metric: str,
    *,
    bags: int = BAGS,
    fraction: float = BAG_FRACTION,
    max_size: int = 50,
    n_init: int = 3,
    val_vars: Mapping[Any, np.ndarray] | None = None,
    seed: int = 0,
) -> dict[Any, float]:
    """Caruana et al. (2004, section 4.3) bagged ensemble selection: greedy selection
    on `bags` random subsets holding `fraction` of the candidates, weights averaged
    over the bags. A poor member that looks good by chance on validation is in only
    some bags, and no single member can take the whole ensemble. Seeded: the same
    inputs and `seed` give the same weights."""
    if isinstance(bags, bool) or not isinstance(bags, (int, np.integer)) or bags < 1:
        raise ValueError(f"`bags` must be a positive integer, but got {bags!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"`fraction` must be in (0, 1], but got {fraction!r}")
    ids = sorted(val_preds, key=_id_key)
    rng = np.random.default_rng(seed)
    size = max(1, int(round(fraction * len(ids))))
    total: dict[Any, float] = {}
    used = 0
    for _ in range(bags):
        subset = [ids[j] for j in sorted(rng.choice(len(ids), size, replace=False))]
        try:
            weights = greedy_selection(
                {i: val_preds[i] for i in subset}, y_val, metric, max_size=max_size, n_init=n_init,
                val_vars=None if val_vars is None else {i: val_vars[i] for i in subset},
            )
        except ValueError:              # a bag of members that all failed: it chooses nothing
            continue
        used += 1
        for i, w in weights.items():
            total[i] = total.get(i, 0.0) + w
    if not used:
        raise ValueError(f"no candidate has a finite validation {metric!r} among {len(ids)} members")
    order = sorted(total, key=lambda i: (-total[i], _id_key(i)))
    return {i: total[i] / used for i in order}


def shrunk_selection(
    val_preds: Mapping[Any, np.ndarray],
    y_val: np.ndarray,
    metric: str,
    *,
    shrink: float | None = None,
    val_vars: Mapping[Any, np.ndarray] | None = None,
    seed: int = 0,
    **fit: Any,
) -> dict[Any, float]:
    """Bagged selection shrunk toward the uniform average: weights ``(1 - shrink) * bagged +
    shrink / m`` over the m candidates with a finite score (``shrink`` defaults to
    ``SHRINK``). Bagging already spreads the weight a small validation split would give one
    member; the shrinkage keeps every member in, as a deep ensemble does, and leaves the
    validation split only part of the say."""
    shrink = SHRINK if shrink is None else shrink
    if not 0.0 <= shrink <= 1.0:
        raise ValueError(f"`shrink` must be in [0, 1], but got {shrink!r}")
    variances = None if val_vars is None or metric != "nll" else val_vars
    ranked = _ranked_ids(_single_scores(metric, np.asarray(y_val), dict(val_preds), variances), metric)
    near = competitive(dict(val_preds), np.asarray(y_val), metric, variances, ranked)
    # one member alone competitive (a search's pool, one network far ahead): it alone; bags without it
    # gave the far worse candidates half the weight (reselect --method shrunk: validation log loss 0.44,
    # the best alone 0.29). Bags over the competitive members only, with two or more, were tried on the
    # panel (docs/ensembles.md): a deep ensemble's weaker members bring diversity there; no better.
    pool = near if len(near) == 1 else list(val_preds)
    bagged = bagged_selection({i: val_preds[i] for i in pool}, y_val, metric, seed=seed,
                              val_vars=None if val_vars is None else {i: val_vars[i] for i in pool}, **fit)
    return _shrink(bagged, near, shrink)


def competitive(preds: dict, y: np.ndarray, metric: str, variances: dict | None, ranked: list) -> list:
    """The ``ranked`` members (best first) not worse than the best by more than
    ``COMPETITIVE_Z`` standard errors of their paired per-row difference in ``metric``
    (all of them for a metric that is not a mean over rows)."""
    if len(ranked) < 2:
        return list(ranked)
    y_fit = y.reshape(-1).astype(np.int64) if metric_task(metric) == "classification" else y.astype(np.float64)

    def rows(i: Any) -> np.ndarray | None:
        return pointwise(metric, y_fit, preds[i], None if variances is None else variances[i])
    best = rows(ranked[0])
    if best is None or len(best) < 2:
        return list(ranked)
    sign = -1.0 if higher_is_better(metric) else 1.0
    out = []
    for i in ranked:
        d = sign * (rows(i) - best)
        se = float(np.std(d, ddof=1)) / math.sqrt(len(d))
        if not np.all(np.isfinite(d)) or float(np.mean(d)) <= COMPETITIVE_Z * se:
            out.append(i)
    return out


def _shrink(weights: Mapping[Any, float], ranked: list, shrink: float) -> dict[Any, float]:
    """``weights`` moved ``shrink`` of the way toward equal weights on the `ranked` ids
    (best first; ``competitive``), ordered by weight, then rank; zero weights left out."""
    target = set(ranked)
    out = {i: (1.0 - shrink) * weights.get(i, 0.0) + (shrink / len(ranked) if i in target else 0.0)
           for i in [*ranked, *(i for i in weights if i not in target)]}
    position = {i: r for r, i in enumerate(out)}
    return {i: out[i] for i in sorted(out, key=lambda i: (-out[i], position[i])) if out[i] > 0}


def _rank_on(preds: dict, y: np.ndarray, metric: str, variances: dict | None, tie_metric: str | None = None) -> list:
    """Ids by their own `metric` on these rows, best first (ties by `tie_metric`, then id);
    members whose score is not finite are left out."""
    primary = _single_scores(metric, y, preds, variances if metric == "nll" else None)
    tie = (_single_scores(tie_metric, y, preds, variances if tie_metric == "nll" else None)
           if tie_metric else {})
    sign = -1.0 if tie_metric and higher_is_better(tie_metric) else 1.0
    higher = higher_is_better(metric)
    kept = [i for i in preds if not math.isnan(primary[i])]
    return sorted(kept, key=lambda i: rank_key(primary[i], i, higher, sign * tie[i] if i in tie else None))


def _fit(method: str, preds: dict, y: np.ndarray, metric: str, rank_metric: str, k: int,
         variances: dict | None, seed: int, max_size: int, n_init: int) -> dict[Any, float]:
    """Weights of one method fitted on (a part of) the validation rows."""
    if method == "greedy":
        return greedy_selection(preds, y, metric, max_size=max_size, n_init=n_init, val_vars=variances)
    if method == "bagged":
        return bagged_selection(preds, y, metric, max_size=max_size, n_init=n_init,
                                val_vars=variances, seed=seed)
    if method == "shrunk":
        return shrunk_selection(preds, y, metric, max_size=max_size, n_init=n_init, val_vars=variances, seed=seed)
    if method != "top_k":
        raise ValueError(f"`method` must be one of {', '.join(CHOICES)}, but got {method!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"`k` must be a positive integer, but got {k!r}")
    # the k best as the leaderboard ranks them: `rank_metric`, ties by the selection score
    ranked = _rank_on(preds, y, rank_metric, variances, metric if metric != rank_metric else None)
    if not ranked:
        raise ValueError(f"no candidate has a finite validation {rank_metric!r} among {len(preds)} members")
    return _equal_weights(ranked[:k])


def _rows(arrays: dict | None, idx: np.ndarray) -> dict | None:
    return None if arrays is None else {i: a[idx] for i, a in arrays.items()}


def _average(weights: Mapping[Any, float], preds: Mapping[Any, np.ndarray], metric: str,
             variances: Mapping[Any, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The weighted average of members' predictions (for "nll": with the mixture's variance)."""
    ids = list(weights)
    w = np.array([weights[i] for i in ids], dtype=np.float64)
    w = w / w.sum()
    stacked = np.stack([np.asarray(preds[i], dtype=np.float64) for i in ids])
    mean = np.tensordot(w, stacked, axes=1)
    if metric != "nll":
        return mean, None
    if variances is None:
        raise ValueError("metric 'nll' needs the members' variances `val_vars`, but got None")
    spread = np.stack([np.asarray(variances[i], dtype=np.float64) for i in ids]) + (stacked - mean) ** 2
    return mean, np.tensordot(w, spread, axes=1)          # centred: exact at a target of 1e9 + signal


def k_grid(m: int) -> list[int]:
    """The ensemble sizes "auto" tries as uniform averages of the best: 1, 2, 3, ... growing
    by about a quarter each step, and always all `m` candidates."""
    out, k = [], 1
    while k < m:
        out.append(k)
        k = max(k + 1, int(round(k * 1.25)))
    return out + [m]


def _configs(m: int) -> list[tuple[str, int | None]]:
    """What "auto" compares: the uniform average of the k best for every k of `k_grid`,
    greedy and bagged selection."""
    return [("top_k", k) for k in k_grid(m)] + [("greedy", None), ("bagged", None), ("shrunk", None)]


def config_name(method: str, k: int | None) -> str:
    """A config's name in ``ensemble.json`` (``selection.cv``): "top_5", "greedy", "bagged"."""
    return f"top_{k}" if method == "top_k" else method


def _cross_validate(preds: dict, y: np.ndarray, metric: str, variances: dict | None, seed: int,
                    **fit: Any) -> dict[str, dict]:
    """Every config of `_configs`, fitted on CV_FOLDS - 1 folds of the validation rows and
    scored on the rows of the remaining fold. Per config: "rows" (each row's out-of-fold
    value of `metric`, or None when the metric is not a mean over rows), "folds" (score per
    fold), "score" (the out-of-fold score), "size" (mean effective size of the fold fits)."""
    n = len(y)
    folds = np.array_split(np.random.default_rng(seed).permutation(n), min(CV_FOLDS, n))
    configs = _configs(len(preds))
    y_fit = y.reshape(-1).astype(np.int64) if metric_task(metric) == "classification" else y.astype(np.float64)
    out = {config_name(*c): {"rows": np.full(n, np.nan), "folds": [], "sizes": []} for c in configs}
    for f, held in enumerate(folds):
        part = np.sort(np.concatenate([folds[g] for g in range(len(folds)) if g != f]))
        p_part, v_part = _rows(preds, part), _rows(variances, part)
        p_held, v_held = _rows(preds, held), _rows(variances, held)
        ranked = _rank_on(p_part, y[part], metric, v_part)
        bagged: dict | None = None
        for method, k in configs:
            entry = out[config_name(method, k)]
            try:
                if method == "top_k":
                    if not ranked:
                        raise ValueError("no finite candidate")
                    weights = _equal_weights(ranked[:k])
                elif method == "shrunk" and bagged:                # the fold's bagged weights, shrunk
                    weights = _shrink(bagged, competitive(p_part, y[part], metric, v_part if metric == "nll"
                                                          else None, ranked), SHRINK)
                else:
                    weights = _fit(method, p_part, y[part], metric, metric, 1, v_part, seed, **fit)
                    bagged = weights if method == "bagged" else bagged
                mean, var = _average(weights, p_held, metric, v_held)
                rows = pointwise(metric, y_fit[held], mean, var)
                value = score_unchecked(metric, y_fit[held], mean, var)
            except (ValueError, FloatingPointError):
                rows, value, weights = None, math.nan, {}
            if rows is not None:
                entry["rows"][held] = rows
            entry["folds"].append(value if math.isfinite(value) else math.nan)
            entry["sizes"].append(effective_size(weights) if weights else 0.0)
    for entry in out.values():
        rows = entry["rows"]
        if metric not in POINTWISE or not np.all(np.isfinite(rows)):
            entry["rows"] = None
        folds_ = np.asarray(entry["folds"])
        entry["score"] = (float(np.mean(entry["rows"])) if entry["rows"] is not None
                          else float(np.average(folds_, weights=[len(h) for h in folds]))
                          if np.all(np.isfinite(folds_)) else math.nan)
        entry["size"] = float(np.mean(entry.pop("sizes")))
    return out


def _difference(a: dict, b: dict, higher: bool) -> tuple[float, float]:
    """How much worse config `a` is than config `b` out of fold (positive: worse) and the
    standard error of that difference: paired over rows where the metric is a mean over
    rows, else over folds."""
    sign = -1.0 if higher else 1.0
    if a["rows"] is not None and b["rows"] is not None:
        d = sign * (a["rows"] - b["rows"])
    else:
        d = sign * (np.asarray(a["folds"]) - np.asarray(b["folds"]))
    if len(d) < 2 or not np.all(np.isfinite(d)):
        return (math.inf if not np.all(np.isfinite(d)) else float(np.mean(d))), 0.0
    return float(np.mean(d)), float(np.std(d, ddof=1) / math.sqrt(len(d)))


def _auto(cv: dict[str, dict], higher: bool, base: str) -> tuple[str, str]:
    """The config "auto" fits on all rows, and why: `base` ("shrunk": bagged selection
    shrunk toward the uniform average), unless the config of best out-of-fold score beats
    it by more than `depart_z` standard errors of the paired difference (``DEPART_ALPHA``,
    Bonferroni-corrected for the configs compared). A small validation split cannot tell
    near-equal members apart, and a selection made on it fits its noise; the shrunk bagged
    ensemble gives it only part of the say, and is what another config has to beat."""
    finite = {name: e for name, e in cv.items() if math.isfinite(e["score"])}
    if not finite:
        raise ValueError("no selection method has a finite out-of-fold score")
    best = min(finite, key=lambda c: (-finite[c]["score"] if higher else finite[c]["score"]))
    if base not in finite or best == base:
        return best, "best out-of-fold score"
    gap, se = _difference(finite[base], finite[best], higher)
    z = gap / se if se > 0 else (math.inf if gap > 0 else 0.0)
    limit = depart_z(len(cv))
    if z > limit:
        return best, f"beats {base} selection out of fold by {z:.1f} standard errors"
    return base, (f"no other selection beats {base} out of fold by more than {limit:.1f} standard errors "
                  f"(the best, {best}, by {max(z, 0.0):.1f})")


def few_rows_note(n_val: int) -> str | None:
    """What ``check`` and the run say of a validation split too small to choose an ensemble on
    (``choose_ensemble`` then averages the k best, ranked on those few rows); None otherwise."""
    if n_val >= MIN_CV_ROWS:
        return None
    return (f"the validation split holds {n_val} row(s): too few to choose the ensemble on (at least {MIN_CV_ROWS}), "
            "so it averages the k best members, ranked on those rows, and the validation metrics are mostly chance; "
            "raise `data.val_fraction`, or give more rows")


def depart_z(configs: int) -> float:
    """How many standard errors a config must beat the average of all candidates by, out of
    `configs` compared (itself included): the one-sided ``DEPART_ALPHA`` level divided among
    the others."""
    return NormalDist().inv_cdf(1.0 - DEPART_ALPHA / max(1, configs - 1))


def choose_ensemble(
    val_preds: Mapping[Any, np.ndarray],
    y_val: np.ndarray,
    metric: str,
    *,
    method: str = "auto",
    rank_metric: str | None = None,
    k: int = 5,
    val_vars: Mapping[Any, np.ndarray] | None = None,
    seed: int = 0,
    max_size: int = 50,
    n_init: int = 3,
) -> dict[str, Any]:
    """The run's ensemble selection, minimising (or maximising) `metric` on validation,
    normally a proper scoring rule (log loss, Gaussian NLL).

    `method`: "greedy" (Caruana's forward selection with replacement from the `n_init`
    best), "bagged" (the same on random halves of the candidates, averaged), "shrunk"
    (bagged, moved toward the uniform average), "top_k" (the `k` best by `rank_metric`,
    equal weights), each returned as asked; or "auto":
    cross-validated selection. Every config (the uniform average of the k best for k = 1,
    2, 3, ... all candidates; greedy; bagged; shrunk) is fitted on 4 of 5 folds of the
    validation rows and scored on the fifth. "shrunk" (bagged selection, its weights moved
    ``SHRINK`` of the way toward the uniform average) is kept unless the config of best
    out-of-fold score beats it by more than `depart_z` standard errors (paired over rows;
    3.1 for 8 candidates, 3.4 for 500); that config is then fitted on all rows. A validation split of a
    few dozen rows tunes greedy weights to its own noise; bagging and shrinkage give it only
    part of the say, and out-of-fold scores say when a sharper selection is worth it (a
    pool with poor candidates, as a search's). "auto" returns one member only when that member
    alone also beats the best ensemble of two or more out of fold by more than
    ``SIGNIFICANCE_Z`` standard errors (``single_member`` says by how much); with fewer
    than ``MIN_CV_ROWS`` validation rows it averages the `k` best.

    Returns {"weights", "method" (shrunk, greedy, bagged or top_k), "k" (top_k's size, else None),
    "metric", "val_score", "best_member": {"id", "val_score"}, "effective_size", "cv"
    (config name -> out-of-fold score, or None), "why" (a sentence), "single_member"
    (None, or {"z": its advantage in standard errors})}."""
    if method not in CHOICES:
        raise ValueError(f"`method` must be one of {', '.join(CHOICES)}, but got {method!r}")
    if metric == "nll" and val_vars is None:
        raise ValueError("metric 'nll' needs the members' variances `val_vars`, but got None")
    preds, variances = _stack(val_preds, val_vars if val_vars is not None else None)
    y = np.asarray(y_val)
    fit = {"max_size": max_size, "n_init": n_init}
    higher = higher_is_better(metric)
    single = _single_scores(metric, y, preds, variances if metric == "nll" else None)
    ranked = _ranked_ids(single, metric)
    if not ranked:
        raise ValueError(f"no candidate has a finite validation {metric!r} among {len(preds)} members")
    cv, single_member, size = None, None, k
    chosen, why = method, "asked for"
    if method == "auto":
        finite = {i: preds[i] for i in ranked}
        finite_vars = None if variances is None else {i: variances[i] for i in ranked}
        if len(ranked) == 1:
            chosen, size, why = "top_k", 1, "only one candidate"
        elif len(y) < MIN_CV_ROWS:
            chosen, why = "top_k", (f"the {min(k, len(ranked))} best averaged: {len(y)} validation rows are too "
                                    f"few to cross-validate a selection (at least {MIN_CV_ROWS})")
        else:
            table = _cross_validate(finite, y, metric, finite_vars, seed, **fit)
            cv = {name: e["score"] for name, e in table.items()}
            name, why = _auto(table, higher, "shrunk")
            if name == "top_1":                       # one member: only if validation says so clearly
                multi = {c: e for c, e in table.items() if c != "top_1" and math.isfinite(e["score"])
                         and e["size"] > 1.0}
                if multi:
                    rival = min(multi, key=lambda c: -multi[c]["score"] if higher else multi[c]["score"])
                    gap, se = _difference(multi[rival], table["top_1"], higher)
                    z = gap / se if se > 0 else (math.inf if gap > 0 else 0.0)
                    if z > SIGNIFICANCE_Z:
                        single_member = {"z": round(z, 2), "rival": rival}
                        why = (f"the best member alone beats the best ensemble ({rival}) out of fold by "
                               f"{z:.1f} standard errors")
                    else:
                        name, why = rival, ("best ensemble of more than one member: the best member alone is "
                                            f"not significantly better out of fold ({z:.1f} standard errors)")
            chosen, size = ("top_k", int(name[4:])) if name.startswith("top_") else (name, None)
        weights = _fit(chosen, finite, y, metric, metric, size or k, finite_vars, seed, **fit)
        if len(weights) == 1 and single_member is None and len(ranked) > 1 and chosen != "top_k":
            # greedy on all rows stopped at one member although its folds did not: average the best two
            chosen, size, why = "top_k", 2, why + "; on all rows it kept one member, so the best two are averaged"
            weights = _fit("top_k", finite, y, metric, metric, 2, finite_vars, seed, **fit)
    else:
        weights = _fit(chosen, preds, y, metric, rank_metric or metric, k, variances, seed, **fit)
        if chosen == "top_k" and k > len(weights):
            why = f"asked for; k = {k}, but only {len(weights)} candidate(s) have a finite score: all of them"
    value = ensemble_score(weights, preds, y, metric, variances)
    return {"weights": weights, "method": chosen, "k": len(weights) if chosen == "top_k" else None,
            "metric": metric, "val_score": value, "best_member": {"id": ranked[0], "val_score": single[ranked[0]]},
            "effective_size": effective_size(weights), "cv": cv, "why": why, "single_member": single_member}
