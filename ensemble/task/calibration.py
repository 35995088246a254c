"""Recalibrating an ensemble's uncertainty on the validation split, in plain numpy.

Regression. A deep ensemble's spread (members' variances + their disagreement) is a
model of the error, not a measurement of it: on a small table the members agree with
each other more than with the data, and a nominal 90% interval can cover 30% of
points. Two recalibrations, both fitted on the validation split's ensemble
predictions, per output:

- ``variance_scaling``: every standard deviation is multiplied by ``s``, the factor that
  maximises the Gaussian likelihood of the validation residuals (``s^2 = mean(r^2 /
  var)``, Kuleshov et al. 2018 / Levi et al. 2019's "std scaling"); intervals are
  ``mean +- z * s * std``. Keeps Gaussian intervals, so it is right when the errors
  are Gaussian-shaped and only their scale is off.
- ``conformal``: split-conformal prediction with normalised scores ``|r| / std``
  (Lei et al. 2018): the half-width of the level-``a`` interval is ``q_a * std`` with
  ``q_a`` the ``ceil((n + 1) a) / n`` empirical quantile of the validation scores.
  Distribution-free: coverage >= a on exchangeable data, whatever the error's shape.
  The reported ``std`` (and NLL) then use the variance-scaling factor.

``auto`` fits both on folds of the validation rows and keeps the one whose held-out
coverage of the 50/90/95% intervals is closer to nominal (ties: variance scaling).

Classification: ``temperature`` (Guo et al. 2017) divides the log of the ensemble's
probabilities by one temperature ``T`` fitted to minimise validation log loss, kept only
when it also lowers the log loss of held-out validation folds (``auto`` does this); it
changes confidence, never the predicted class. The total entropy is that of the
scaled probabilities; its split into aleatoric and epistemic parts keeps the members'
proportions. (The exported Keras model, built of stock layers, gives the probabilities
before the temperature: ``calibration.temperature`` in ensemble.json says what to apply.)

Calibration uses the validation split, which also chose the ensemble and, unless
``data.calibration_holdout`` keeps part of it from them (``holdout_rows``), stopped the
members' training early; the test split, untouched, says whether it held
(``ensemble.json`` reports coverage before and after on both).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ensemble.config.vocabulary import CALIBRATIONS, calibration_problem
from ensemble.task import metrics as M

METHODS = tuple(CALIBRATIONS)            # ``ensemble.calibration``
REGRESSION_METHODS = ("variance_scaling", "conformal")
FOLDS, MIN_ROWS = 5, 20
#: every level a calibration fits: the reported intervals and the coverage curve's
LEVELS = tuple(sorted({*M.COVERAGE_LEVELS, *M.CURVE_LEVELS}))
T_BOUNDS = (0.05, 20.0)
#: misclassified validation rows needed before a temperature may sharpen probabilities
MIN_ERRORS = 5


#: ``data.calibration_holdout = "auto"``: the share of the validation rows held back, per task
AUTO_HOLDOUT = {"regression": 0.5, "classification": 0.0}


def holdout_share(setting: str | float, task: str) -> float:
    """The share ``data.calibration_holdout`` stands for on ``task``."""
    return AUTO_HOLDOUT[task] if setting == "auto" else float(setting)


def holdout_rows(n: int, share: float) -> tuple[np.ndarray, np.ndarray]:
    """``data.calibration_holdout``: the validation rows members stop early on, and the rows
    kept for the recalibration alone (sorted indices into the validation split). A fixed
    draw of ``n`` alone, so every rank and every later reader (``ensemble reselect``,
    ``predict``) finds the same rows; no holdout (every row in both) when ``share`` is 0 or
    either part would hold fewer than ``MIN_ROWS`` rows."""
    every = np.arange(n)
    held = int(round(n * share))
    if not share or held < MIN_ROWS or n - held < MIN_ROWS:
        return every, every
    kept = np.sort(np.random.default_rng([n, 7919]).permutation(n)[:held])
    return np.setdiff1d(every, kept), kept


def coverage_spread(level: float, m: int) -> float:
    """The standard deviation of a split-conformal interval's coverage over calibration sets of
    ``m`` rows: given them it is Beta(k, m + 1 - k), k = ceil((m + 1) level) (Vovk 2012; Angelopoulos
    and Bates 2021, section 3.2): 45 rows move a 95% interval's coverage by 3 points either way."""
    k = min(m, math.ceil((m + 1) * level - 1e-9))
    return math.sqrt(k * (m + 1 - k) / ((m + 1) ** 2 * (m + 2)))


def rows_of(stats: dict, rows: np.ndarray, n: int) -> dict:
    """Per-sample ``stats`` (arrays of ``n`` rows) at ``rows``; other entries as they are."""
    return {k: (v[rows] if isinstance(v, np.ndarray) and v.ndim and len(v) == n else v) for k, v in stats.items()}


def resolve(setting: str, task: str) -> str:
    """The method ``ensemble.calibration`` stands for on ``task``; ValueError if it does
    not apply (the message names the setting)."""
    problem = calibration_problem(setting, task)
    if problem:
        raise ValueError(problem)
    if setting == "auto":
        return "auto" if task == "regression" else "temperature"
    return setting


# ---------------------------------------------------------------------- regression
def _columns(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(len(a), -1)


def _scores(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Normalised residuals |y - mean| / std (n, k); a zero std is floored at a tiny
    fraction of the targets' spread, so an ensemble without any spread gets intervals
    of constant width instead of none."""
    y, mean, std = _columns(y), _columns(mean), _columns(std)
    floor = 1e-9 * np.maximum(y.std(axis=0), 1e-12)
    return np.abs(y - mean) / np.maximum(std, floor), floor


def _fit_factors(method: str, y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> dict[str, Any]:
    """Per-output std scale and half-width factors of one method, fitted on these rows."""
    scores, floor = _scores(y, mean, std)
    scale = np.sqrt(np.mean(scores ** 2, axis=0))
    if method == "variance_scaling":
        widths = {level: M.Z[level] * scale for level in LEVELS}
    else:
        widths = {level: conformal_quantile(scores, level) * beyond(len(scores), level) for level in LEVELS}
    return {"std_scale": scale, "widths": widths, "floor": floor}


def beyond(rows: int, level: float) -> float:
    """How much wider than the largest of ``rows`` scores a ``capped`` level's interval is drawn:
    the Gaussian tail's ratio of ``level`` to the level the largest score stands for, n / (n + 1)
    (12 rows: 95% is 1.11 times the largest error, 99% 1.45 times); 1 for a level the rows
    guarantee."""
    if not capped(rows, level):
        return 1.0
    return M.z_of(level) / M.z_of(rows / (rows + 1))


def capped(rows: int, level: float) -> bool:
    """Whether split conformal on ``rows`` calibration rows cannot guarantee ``level``:
    ``ceil((rows + 1) level) > rows`` (fewer than 19 rows for 95%, 99 for 99%). Its interval
    would be the largest score, as wide as a lower level's (12 rows: the "95%" interval was the
    90% one and covered 0.86 of new rows); ``_fit_factors`` widens it by the Gaussian tail beyond that
    score (``beyond``), and the console says so (``capped`` in the result)."""
    return math.ceil((rows + 1) * level - 1e-9) > rows


def conformal_quantile(scores: np.ndarray, level: float) -> np.ndarray:
    """Split conformal's finite-sample quantile of calibration ``scores`` (n, k): the
    ``ceil((n + 1) level)``-th smallest per column. An interval of this many scores covers a
    new exchangeable point with probability at least ``level`` (Vovk et al. 2005; Lei et al.
    2018); when ``ceil((n + 1) level) > n`` the guarantee needs an infinite interval, and the
    largest score is used instead (said by ``"capped"`` levels in the fitted calibration)."""
    n = len(scores)
    rank = min(n, math.ceil((n + 1) * level - 1e-9))
    return np.sort(scores, axis=0)[rank - 1]


def _held_out_error(method: str, y: np.ndarray, mean: np.ndarray, std: np.ndarray, seed: int) -> float:
    """Mean |coverage - level| over the reported levels, each fold's rows covered by
    intervals fitted on the other folds."""
    rows = np.random.default_rng(seed).permutation(len(y))
    inside = {level: 0 for level in M.COVERAGE_LEVELS}
    y2, m2, s2 = _columns(y), _columns(mean), _columns(std)
    for held in np.array_split(rows, FOLDS):
        rest = np.setdiff1d(rows, held)
        fit = _fit_factors(method, y2[rest], m2[rest], s2[rest])
        sd = np.maximum(s2[held], fit["floor"])
        for level in M.COVERAGE_LEVELS:
            inside[level] += int(np.sum(np.abs(y2[held] - m2[held]) <= fit["widths"][level] * sd))
    total = y2.size
    return float(np.mean([abs(inside[lv] / total - lv) for lv in M.COVERAGE_LEVELS]))


def fit_regression(y: np.ndarray, mean: np.ndarray, std: np.ndarray, method: str = "auto",
                   seed: int = 0, held_out: bool = True, none_kept: str | None = None) -> dict[str, Any]:
    """The calibration of one regression ensemble from its validation ``mean``/``std``.
    Returns a JSON-ready dict: "method", "std_scale" (list, per output), "half_width"
    ({"50": [...], "90": [...], "95": [...]}: multiples of the calibrated-input std),
    "floor" and, for "auto", "held_out_error" per method.

    ``held_out`` False: these rows also stopped the members' training and chose the ensemble
    (a validation split too small to keep a part for the calibration alone, ``holdout_rows``).
    Their residuals are then smaller than new rows' (each member's best epoch and the weights
    were picked on them), and a fit on them narrows the intervals below nominal (150 rows, 23 of
    them for validation: 0.80 of new rows inside the 90% interval over 5 splits, 0.92
    uncalibrated). "auto" then only widens: every factor at least the uncalibrated one
    ("widen_only" in the result); a method asked for by name is fitted as asked. ``none_kept``:
    why no rows were kept aside, for the result's "why" (default: too few)."""
    if method not in ("auto", "none", *REGRESSION_METHODS):
        raise ValueError(f"regression calibration must be auto, none, {', '.join(REGRESSION_METHODS)}; "
                         f"got {method!r}")
    errors, widen_only = None, method == "auto" and not held_out
    if method == "auto":
        method = "variance_scaling"
        if len(y) >= MIN_ROWS:
            errors = {m: _held_out_error(m, y, mean, std, seed) for m in REGRESSION_METHODS}
            if errors["conformal"] < errors["variance_scaling"] - 1e-12:
                method = "conformal"
    k = _columns(y).shape[1]
    if method == "none":
        fit = {"std_scale": np.ones(k), "widths": {lv: np.full(k, M.Z[lv]) for lv in LEVELS},
               "floor": np.zeros(k)}
    else:
        fit = _fit_factors(method, y, mean, std)
    if widen_only:                              # optimistic rows: never narrower than uncalibrated
        fit["std_scale"] = np.maximum(fit["std_scale"], 1.0)
        fit["widths"] = {lv: np.maximum(w, M.Z[lv]) for lv, w in fit["widths"].items()}
    out = {"method": method, "std_scale": fit["std_scale"].tolist(), "floor": fit["floor"].tolist(),
           "half_width": {M.level_key(lv): fit["widths"][lv].tolist() for lv in M.COVERAGE_LEVELS},
           "curve": {M.level_key(lv): fit["widths"][lv].tolist() for lv in M.CURVE_LEVELS}}
    if method == "conformal":
        out["capped"] = [M.level_key(lv) for lv in LEVELS if capped(len(y), lv)]
    if errors is not None:
        out["held_out_error"] = errors
    if widen_only:
        out["widen_only"] = True
        out["why"] = (f"fitted on the {len(y)} validation rows that also stopped the members' training and chose the "
                      f"ensemble ({none_kept or 'too few to keep a part aside: `data.calibration_holdout`'}); their "
                      "errors are smaller than new rows', so the intervals are only widened, never narrowed")
    return out


def _per_output(values: list[float], like: np.ndarray) -> np.ndarray:
    """A per-output list broadcast against (n,) or (n, k) arrays."""
    v = np.asarray(values, dtype=np.float64)
    return v[0] if like.ndim == 1 else v


def apply_regression(stats: dict, calibration: dict | None) -> dict:
    """``stats`` (``Task.combine``'s mean/var/std/aleatoric/epistemic) with the spread
    recalibrated (the parts scaled alike, so total = aleatoric + epistemic still holds; a spread
    below the calibration's floor, none at all, is raised to it as aleatoric) and "intervals":
    {"50": half-width array, "90": ..., "95": ...}. None: Gaussian intervals of the
    uncalibrated spread."""
    out = dict(stats)
    std = np.asarray(stats["std"], dtype=np.float64)
    if calibration is None:
        out["intervals"] = {M.level_key(lv): M.Z[lv] * std for lv in M.COVERAGE_LEVELS}
        return out
    scale = _per_output(calibration["std_scale"], std)
    floor = _per_output(calibration.get("floor", [0.0]), std)
    sd = np.maximum(std, floor)
    for key in ("var", "aleatoric", "epistemic"):
        out[key] = np.asarray(stats[key], dtype=np.float64) * scale ** 2
    # an ensemble without any spread (one member without a variance head) has its calibration's
    # residual scale as its spread, counted as noise it cannot tell apart: its std said 0 beside
    # intervals of +-0.6, and it reported no coverage
    out["aleatoric"] = out["aleatoric"] + (sd ** 2 - std ** 2) * scale ** 2
    out["var"] = sd ** 2 * scale ** 2
    out["std"] = sd * scale
    out["intervals"] = {key: _per_output(f, std) * sd for key, f in calibration["half_width"].items()}
    return out


def coverage_curve(y: np.ndarray, stats: dict, calibration: dict | None) -> dict[str, float]:
    """Observed coverage at every level of ``CURVE_LEVELS`` ({"10": ..., "99": ...}) of the
    intervals ``calibration`` gives ``stats`` (``Task.combine``'s uncalibrated statistics;
    None: Gaussian intervals of the spread; a calibration fitted before the curve existed:
    its Gaussian intervals rescaled)."""
    mean = np.asarray(stats["mean"], dtype=np.float64)
    std = np.asarray(stats["std"], dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(mean.shape)
    curve = (calibration or {}).get("curve")
    out = {}
    for level in M.CURVE_LEVELS:
        key = M.level_key(level)
        if curve is not None and key in curve:
            width = _per_output(curve[key], std) * np.maximum(std, _per_output(calibration["floor"], std))
        else:
            scale = 1.0 if calibration is None else _per_output(calibration["std_scale"], std)
            width = M.Z[level] * std * scale
        out[key] = M.coverage(y, mean, width)
    return out


def interval_metrics(y: np.ndarray, stats: dict) -> dict[str, float]:
    """Test coverage of each interval in ``stats["intervals"]`` (from ``apply_regression``)."""
    mean = np.asarray(stats["mean"], dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(mean.shape)
    return {f"coverage{key}": M.coverage(y, mean, width) for key, width in stats["intervals"].items()}


# ------------------------------------------------------------------ classification
def _scaled(proba: np.ndarray, temperature: float) -> np.ndarray:
    logp = np.log(np.clip(np.asarray(proba, dtype=np.float64), M.PROBA_EPS, 1.0)) / temperature
    logp -= logp.max(axis=1, keepdims=True)
    p = np.exp(logp)
    return p / p.sum(axis=1, keepdims=True)


def _log_loss(y: np.ndarray, proba: np.ndarray, temperature: float) -> float:
    p = _scaled(proba, temperature)[np.arange(len(y)), y]
    return float(-np.mean(np.log(np.clip(p, M.PROBA_EPS, 1.0))))


def _best_temperature(y: np.ndarray, proba: np.ndarray, soften_only: bool = False) -> float:
    """The temperature of least log loss on these rows. Sharpening (T < 1) only when they hold
    at least ``MIN_ERRORS`` misclassified rows: with fewer, the log loss keeps falling as T
    falls (every row is right, so more confidence always looks better), and a test split's
    first error is then punished with a near-zero probability; never with ``soften_only``."""
    from scipy.optimize import minimize_scalar
    errors = int(np.sum(np.asarray(proba).argmax(axis=1) != y))
    low = T_BOUNDS[0] if errors >= MIN_ERRORS and not soften_only else 1.0
    res = minimize_scalar(lambda log_t: _log_loss(y, proba, math.exp(log_t)),
                          bounds=(math.log(low), math.log(T_BOUNDS[1])), method="bounded", options={"xatol": 1e-4})
    return math.exp(res.x) if _log_loss(y, proba, math.exp(res.x)) < _log_loss(y, proba, 1.0) else 1.0


def fit_temperature(y: np.ndarray, proba: np.ndarray, seed: int = 0, soften_only: bool = False) -> dict[str, Any]:
    """The temperature minimising the log loss of ``proba ** (1/T)`` (renormalised) on
    validation labels ``y`` (log T searched in [0.05, 20]), kept only if it also lowers
    the log loss of held-out rows: temperatures fitted on 4 of 5 folds and scored on the
    fifth must beat T = 1 there, else T = 1 (a small validation split with a few errors
    otherwise sharpens probabilities that the test split then punishes).

    ``soften_only``: these rows also stopped the members' training and chose the ensemble, so
    the ensemble is more often right on them, and more sharply, than on new rows; a temperature
    fitted on them sharpens what new rows then punish (the panel, docs/ensembles.md: T < 1 in 9
    of 35 runs, worse test log loss in 7 of them). T is then at least 1 ("soften_only" in the
    result), as ``fit_regression`` only widens intervals on such rows."""
    y = np.asarray(y).reshape(-1).astype(np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    t = _best_temperature(y, proba, soften_only)
    held = None
    if len(y) >= MIN_ROWS:
        rows = np.random.default_rng(seed).permutation(len(y))
        scaled = plain = 0.0
        for part in np.array_split(rows, FOLDS):
            rest = np.setdiff1d(rows, part)
            scaled += len(part) * _log_loss(y[part], proba[part],
                                            _best_temperature(y[rest], proba[rest], soften_only))
            plain += len(part) * _log_loss(y[part], proba[part], 1.0)
        held = {"scaled": scaled / len(y), "unscaled": plain / len(y)}
        if not held["scaled"] < held["unscaled"]:
            t = 1.0
    out: dict[str, Any] = {"method": "temperature", "temperature": t, "held_out_log_loss": held}
    errors = int(np.sum(proba.argmax(axis=1) != y))
    if soften_only:
        out["soften_only"] = True
        out["why"] = (f"fitted on the {len(y)} validation rows that also stopped the members' training and chose the "
                      "ensemble (`data.calibration_holdout` keeps none aside); the ensemble is more often and more "
                      "surely right on them than on new rows, so its probabilities are only softened, never sharpened")
    elif t == 1.0 and errors < MIN_ERRORS and _log_loss(y, proba, 0.5) < _log_loss(y, proba, 1.0):
        out["why"] = (f"sharper would fit validation better, but it holds {errors} misclassified row(s), fewer than "
                      f"{MIN_ERRORS}: on so few errors more confidence always looks better, and the test split's "
                      "errors are then punished hard")
    return out


def apply_temperature(stats: dict, calibration: dict | None) -> dict:
    """Classification ``stats`` with the ensemble's probabilities temperature-scaled."""
    if calibration is None or calibration.get("method") != "temperature":
        return stats
    out = dict(stats)
    out["proba"] = _scaled(stats["proba"], calibration["temperature"])
    p = out["proba"]
    out["total"] = -np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=1)
    # the members' split of the entropy is kept, scaled to the new total: a sharper ensemble is
    # less uncertain in both parts, and total = aleatoric + epistemic still holds
    before = np.asarray(stats["total"], dtype=np.float64)
    ratio = np.divide(out["total"], before, out=np.ones_like(before), where=before > 0)
    out["aleatoric"] = np.asarray(stats["aleatoric"], dtype=np.float64) * ratio
    out["epistemic"] = np.maximum(out["total"] - out["aleatoric"], 0.0)
    return out


# ------------------------------------------------------------------------ either
def fit(task: str, y: np.ndarray, stats: dict, setting: str, seed: int = 0, held_out: bool = True,
        none_kept: str | None = None) -> dict | None:
    """The calibration ``setting`` gives on ``task`` from validation ``stats``; None for none.
    "auto" keeps T = 1 on fewer than ``MIN_ROWS`` classification rows (saying why in "why"):
    a temperature is kept only when held-out folds confirm it. ``held_out``: whether these
    rows were kept from early stopping and selection (``fit_regression``; ``none_kept``: why not)."""
    method = resolve(setting, task)
    if method == "none":
        return None
    if task == "classification":
        if setting == "auto" and len(y) < MIN_ROWS:
            # no held-out folds to check a temperature on: 2 rows would fit T = 20 (uniform)
            return {"method": "temperature", "temperature": 1.0, "held_out_log_loss": None,
                    "why": f"{len(y)} validation rows are too few to check a temperature on held-out "
                           f"folds (at least {MIN_ROWS})"}
        return fit_temperature(y, stats["proba"], seed, soften_only=setting == "auto" and not held_out)
    return fit_regression(y, stats["mean"], stats["std"], method, seed, held_out, none_kept)


def apply(task: str, stats: dict, calibration: dict | None) -> dict:
    """``stats`` as the calibration says (regression also gains "intervals")."""
    if task == "classification":
        return apply_temperature(stats, calibration)
    return apply_regression(stats, calibration)
