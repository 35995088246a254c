"""Scores and uncertainty of members and ensembles, in plain numpy.

Every metric here is a number computed on one split: classification metrics take
integer labels and class probabilities, regression metrics take targets, the
predicted mean and optionally the predicted variance. The `METRICS` table says
which way is better, so ranking and ensemble selection need no special cases.

The formulas are those of scikit-learn's accuracy, log loss (probabilities clipped at
1e-15 and renormalised), multiclass Brier, MSE and MAE, in numpy after one input check:
scikit-learn's own per-call validation cost about 8 ms per split, which every member
paid twice (and a 100,000-member rehearsal, a hundred thousand times).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import NormalDist
from types import MappingProxyType

import numpy as np

from ensemble.config.vocabulary import METRICS as VOCABULARY
from ensemble.config.vocabulary import task_metrics


def metric_text(value: float, width: int = 0) -> str:
    """A metric as a person reads it: 4 decimals in the usual range; 4 significant figures
    where 4 decimals would say nothing or overflow a column (targets in micrometres or in
    millions: an mse of 3e-13 or 2.5e+10)."""
    v = float(value)
    if not np.isfinite(v) or v == 0 or 1e-3 <= abs(v) < 1e5:
        text = f"{v:.4f}"
    else:
        text = f"{v:.4g}"
    return text.rjust(width)

__all__ = [
    "CLASSIFICATION_METRICS",
    "METRICS",
    "REGRESSION_METRICS",
    "average_predictions",
    "classification_metrics",
    "classification_uncertainty",
    "coverage",
    "coverage_name",
    "higher_is_better",
    "metric_task",
    "regression_metrics",
    "regression_mixture",
    "score",
    "scales_note",
    "score_unchecked",
]

#: metric name -> True when a higher value is better (from the one vocabulary).
METRICS: Mapping[str, bool] = MappingProxyType({m: up for m, (_, up) in VOCABULARY.items()})
CLASSIFICATION_METRICS = frozenset(task_metrics("classification"))
REGRESSION_METRICS = frozenset(task_metrics("regression"))

ECE_BINS = 15
#: central interval levels whose coverage is reported, and the standard normal's
#: two-sided quantile of each (interval = mean +- z * std)
#: the central intervals a regression ensemble reports: ``coverage50`` ... in its metrics,
#: ``lower_50``/``upper_50`` ... in its predictions
COVERAGE_LEVELS = (0.5, 0.8, 0.9, 0.95)
#: the levels of the coverage curve (nominal against observed) in ensemble.json and the report
CURVE_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
#: the half-width of the central Gaussian interval of each level, in standard deviations
Z = {level: NormalDist().inv_cdf(0.5 + level / 2) for level in sorted({*COVERAGE_LEVELS, *CURVE_LEVELS})}


def z_of(level: float) -> float:
    """The half-width of the central Gaussian interval of any ``level`` in (0, 1), in standard
    deviations (``Z`` holds the reported levels')."""
    return Z[level] if level in Z else NormalDist().inv_cdf(0.5 + level / 2)

PROBA_EPS = 1e-15  # floor of a probability before the log
PROBA_TOL = 1e-3  # how far rows may stray from a distribution (float32 softmax)
VAR_EPS = 1e-12  # floor of a predicted variance before the log and the division, relative (``var_floor``)


# --------------------------------------------------------------------------- table
def _check_metric(name: str) -> None:
    if name not in METRICS:
        allowed = ", ".join(sorted(METRICS))
        raise ValueError(f"`metric` must be one of {allowed}, but got {name!r}")


def higher_is_better(name: str) -> bool:
    """Whether a higher value of metric `name` is better (ValueError if unknown)."""
    _check_metric(name)
    return METRICS[name]


def metric_task(name: str) -> str:
    """'classification' or 'regression': the kind of prediction metric `name` scores."""
    _check_metric(name)
    return "classification" if name in CLASSIFICATION_METRICS else "regression"


# --------------------------------------------------------------------- validation
def _labels_and_proba(y: np.ndarray, proba: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y)
    proba = np.asarray(proba, dtype=np.float64)
    if proba.ndim != 2 or proba.shape[1] < 2:
        raise ValueError(
            f"`proba` must have shape (n_samples, n_classes >= 2), but got {proba.shape}"
        )
    if proba.size and (
        not np.all(np.isfinite(proba))
        or proba.min() < -PROBA_TOL
        or proba.max() > 1 + PROBA_TOL
        or np.max(np.abs(proba.sum(axis=1) - 1)) > PROBA_TOL
    ):
        raise ValueError(
            "`proba` rows must be probabilities (finite, in [0, 1], summing to 1), but got"
            f" values in [{proba.min()}, {proba.max()}] and row sums up to"
            f" {np.max(np.abs(proba.sum(axis=1)))}; were logits passed instead?"
        )
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.shape != (proba.shape[0],):
        raise ValueError(
            f"`y` must hold one integer label per row of `proba` ({proba.shape[0]}),"
            f" but got shape {y.shape}"
        )
    if y.size and not np.all(np.equal(np.mod(y, 1), 0)):
        raise ValueError("`y` must hold integer class labels, but got non-integers")
    y = y.astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= proba.shape[1]):
        raise ValueError(
            f"`y` labels must lie in [0, {proba.shape[1] - 1}] for {proba.shape[1]}"
            f" classes, but got [{y.min()}, {y.max()}]"
        )
    return y, proba


def _safe_proba(proba: np.ndarray) -> np.ndarray:
    """Clip to [PROBA_EPS, 1] and renormalise rows, so the log is finite and rows sum to
    one (float32 network outputs often do not)."""
    p = np.clip(proba, PROBA_EPS, 1.0)
    return p / p.sum(axis=1, keepdims=True)


def _match_shape(arr: np.ndarray, like: np.ndarray, name: str) -> np.ndarray:
    """`arr` as float64 in the shape of `like`; (n,) and (n, 1) are taken as equal."""
    arr = np.asarray(arr, dtype=np.float64)
    if arr.shape == like.shape:
        return arr
    if arr.size == like.size and arr.ndim <= 2 and like.ndim <= 2 and (
        arr.shape[0] == like.shape[0]
    ):
        return arr.reshape(like.shape)
    raise ValueError(f"`{name}` must have the shape of `y` {like.shape}, but got {arr.shape}")


def _checked_weights(weights: np.ndarray | None, m: int) -> np.ndarray:
    """Weights of m members normalised to sum 1 (uniform when None)."""
    if weights is None:
        return np.full(m, 1.0 / m)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (m,):
        raise ValueError(f"`weights` must have shape ({m},) for {m} members, but got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"`weights` must be finite and non-negative, but got {w.tolist()}")
    total = w.sum()
    if total <= 0:
        raise ValueError("`weights` must not all be zero")
    return w / total


# ------------------------------------------------------------------ classification
def _brier(y: np.ndarray, proba: np.ndarray) -> float:
    """Multiclass Brier score: mean over samples of sum over classes of (p - onehot)^2."""
    p = _safe_proba(proba)
    p_true = p[np.arange(p.shape[0]), y]
    return float(np.mean(np.sum(p * p, axis=1) - 2 * p_true + 1))


def _log_loss(y: np.ndarray, proba: np.ndarray) -> float:
    p = _safe_proba(proba)
    return float(-np.mean(np.log(p[np.arange(p.shape[0]), y])))


def _accuracy(y: np.ndarray, proba: np.ndarray) -> float:
    return float(np.mean(proba.argmax(axis=1) == y))


def _ece(y: np.ndarray, proba: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Expected calibration error: |accuracy - confidence| per equal-width bin of the
    top probability, bins (i/B, (i+1)/B], averaged with weights = bin counts."""
    conf = proba.max(axis=1)
    correct = (proba.argmax(axis=1) == y).astype(np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    bins = np.digitize(conf, edges[1:-1], right=True)
    count = np.bincount(bins, minlength=n_bins)
    gap = np.abs(
        np.bincount(bins, weights=correct, minlength=n_bins)
        - np.bincount(bins, weights=conf, minlength=n_bins)
    )
    return float(gap.sum() / max(count.sum(), 1))


_CLASSIFICATION = {"accuracy": _accuracy, "log_loss": _log_loss, "brier": _brier, "ece": _ece}


def classification_metrics(y: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    """accuracy, log_loss, brier (multiclass, in [0, 2]) and ece of class
    probabilities `proba` (n, c) against integer labels `y` (n,)."""
    y, proba = _labels_and_proba(y, proba)
    return {name: fn(y, proba) for name, fn in _CLASSIFICATION.items()}


# ---------------------------------------------------------------------- regression
def _regression_arrays(
    y: np.ndarray, mean: np.ndarray, var: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 0 or y.shape[0] == 0:
        raise ValueError(f"`y` must hold at least one sample, but got shape {y.shape}")
    mean = _match_shape(mean, y, "mean")
    if var is not None:
        var = _match_shape(var, y, "var")
        if np.any(var < 0):
            raise ValueError(f"`var` must be non-negative, but its minimum is {var.min()}")
        var = np.maximum(var, var_floor(y))
    return y, mean, var


def var_floor(y: np.ndarray) -> np.ndarray:
    """The floor of a predicted variance before the log and the division: ``VAR_EPS`` times the
    spread of each output's targets (their variance over the rows; 1 where they do not vary),
    so a target in micrometres is floored as one in metres. An absolute 1e-12 floored every
    variance of a target of scale 1e-6 (its NLL and coverage were then those of the floor).
    ``y``: (n,) or (n, ...); the floor has the shape of one row."""
    y = np.asarray(y, dtype=np.float64)
    rows = y.reshape(len(y), -1) if y.ndim else y.reshape(1, 1)
    spread = rows.var(axis=0) if len(rows) > 1 else np.zeros(rows.shape[1])
    return (VAR_EPS * np.where(spread > 0, spread, 1.0)).reshape(y.shape[1:] if y.ndim else ())


def _nll(y: np.ndarray, mean: np.ndarray, var: np.ndarray) -> float:
    return float(np.mean(0.5 * np.log(2 * np.pi * var) + (y - mean) ** 2 / (2 * var)))


def level_key(level: float) -> str:
    """A level's name in interval keys and columns: 0.9 -> "90"."""
    return f"{round(level * 100):d}"


def coverage_name(level: float) -> str:
    """The metric key of a central interval's coverage: 0.9 -> "coverage90"."""
    return f"coverage{level_key(level)}"


def coverage(y: np.ndarray, mean: np.ndarray, half_width: np.ndarray) -> float:
    """Fraction of targets inside [mean - half_width, mean + half_width]."""
    return float(np.mean(np.abs(y - mean) <= half_width))


def _r2(y: np.ndarray, mean: np.ndarray) -> float:
    """Coefficient of determination, averaged over outputs (scikit-learn's "uniform_average")
    whose targets vary: an output with one value in every row has none (scikit-learn calls it
    1 if predicted exactly, else 0, and a ridge baseline that fits the constant then read 0.94
    against an ensemble's 0.44 on the same real target); NaN when no output varies, and for
    fewer than two rows (one row has no spread to explain; scikit-learn warns and returns NaN)."""
    if len(y) < 2:
        return float("nan")
    y2, m2 = y.reshape(len(y), -1), mean.reshape(len(y), -1)
    sse = np.sum((y2 - m2) ** 2, axis=0)
    sst = np.sum((y2 - y2.mean(axis=0)) ** 2, axis=0)
    varies = sst > 0
    if not varies.any():
        return float("nan")
    return float(np.mean(1.0 - sse[varies] / sst[varies]))


def _mse(y: np.ndarray, mean: np.ndarray) -> float:
    return float(np.mean((y - mean) ** 2))


def _mae(y: np.ndarray, mean: np.ndarray) -> float:
    return float(np.mean(np.abs(y - mean)))


#: a class rarer than this share of the rows, and than ``RARE_RATIO`` times the most frequent
#: class, makes accuracy blind to it (``rare_class_note``): 20 balanced classes of 5% each do not
RARE_SHARE = 0.1
RARE_RATIO = 0.5


def rare_class_note(metric: str, y: np.ndarray, names: Sequence[str], test_rows: int) -> str | None:
    """What ``check`` and the run say when members are ranked on "accuracy" and a class holds fewer
    than ``RARE_SHARE`` of the rows and fewer than ``RARE_RATIO`` times the most frequent class's:
    answering the common class scores nearly as well, and the test split holds only a few of the
    rare one (400 rows, 23 positives: 3 in the test split). Balanced classes, however many, are
    none (digits: 9.7% to 10.2%)."""
    y = np.asarray(y).reshape(-1)
    if metric != "accuracy" or y.ndim != 1 or len(y) < 2 or not np.issubdtype(y.dtype, np.integer):
        return None
    counts = np.bincount(y, minlength=len(names))
    rare = int(np.argmin(np.where(counts > 0, counts, len(y) + 1)))      # a class with no rows: ``class_notes``
    share = counts[rare] / len(y)
    if share >= RARE_SHARE or counts[rare] >= RARE_RATIO * counts.max():
        return None
    name = repr(str(names[rare])) if rare < len(names) else str(rare)
    return (f"class {name} holds {counts[rare]} of {len(y)} training rows ({share:.1%}), so about "
            f"{share * test_rows:.0f} of the {test_rows} test rows: accuracy barely sees it (answering the common "
            "class scores nearly as well) and ranks members by it; `ensemble.metric = \"log_loss\"` ranks them on "
            "their probabilities of every class")


#: targets whose spreads differ by more than this factor make "mse"/"mae" about the widest (``scales_note``)
SCALE_RATIO = 10.0


def scales_note(metric: str, y: np.ndarray, names: Sequence[str] = ()) -> str | None:
    """What ``check`` and the run say when a multi-target regression ranks on "mse" or "mae", which
    average the targets in their own units, and the targets' spreads differ by more than
    ``SCALE_RATIO``: the ranking (and a search's fitness) is then about the widest target alone."""
    y = np.asarray(y, dtype=np.float64)
    if metric not in ("mse", "mae") or y.ndim != 2 or y.shape[1] < 2 or len(y) < 2:
        return None
    sd = y.std(axis=0)
    if not np.all(np.isfinite(sd)) or sd.min() <= 0 or sd.max() / sd.min() <= SCALE_RATIO:
        return None
    label = (lambda j: repr(names[j])) if len(names) == y.shape[1] else str
    power = 2 if metric == "mse" else 1
    share = sd.max() ** power / float(np.sum(sd ** power))
    return (f"the targets' spreads differ {sd.max() / sd.min():,.0f}-fold (standard deviation "
            f"{', '.join(f'{label(j)} {v:.3g}' for j, v in enumerate(sd))}): `{metric}` averages them in their own "
            f"units, so {label(int(np.argmax(sd)))} makes {share:.0%} of it, and the ranking, the selection and a "
            "search's fitness are about that target alone; set `ensemble.metric = \"r2\"` (the mean of the "
            "targets' R^2) to weigh them alike")


def regression_metrics(
    y: np.ndarray, mean: np.ndarray, var: np.ndarray | None = None
) -> dict[str, float]:
    """mse, mae and r2 of `mean` against `y` ((n,) or (n, d), averaged over all
    entries; r2 over outputs); with a predicted `var` also nll (mean Gaussian negative
    log likelihood) and the coverage of each of COVERAGE_LEVELS (fraction of y inside the central Gaussian
    interval mean +- z * sqrt(var) of that level)."""
    y, mean, var = _regression_arrays(y, mean, var)
    out = {"mse": _mse(y, mean), "mae": _mae(y, mean), "r2": _r2(y, mean)}
    if var is not None:
        out["nll"] = _nll(y, mean, var)
        std = np.sqrt(var)
        for level in COVERAGE_LEVELS:
            out[coverage_name(level)] = coverage(y, mean, Z[level] * std)
    return out


def score(
    name: str, y: np.ndarray, pred: np.ndarray, var: np.ndarray | None = None
) -> float:
    """One metric by name: `pred` is the probabilities (n, c) for a classification
    metric and the mean for a regression metric; "nll" also needs `var`."""
    if metric_task(name) == "classification":
        y, proba = _labels_and_proba(y, pred)
        return _CLASSIFICATION[name](y, proba)
    if name == "nll" and var is None:
        raise ValueError("metric 'nll' needs the predicted variance `var`, but got None")
    y, mean, var = _regression_arrays(y, pred, var)
    if name == "mse":
        return _mse(y, mean)
    if name == "mae":
        return _mae(y, mean)
    if name == "r2":
        return _r2(y, mean)
    return _nll(y, mean, var)


def score_unchecked(
    name: str, y: np.ndarray, pred: np.ndarray, var: np.ndarray | None = None
) -> float:
    """`score` in plain numpy without input checks, for inner loops such as greedy
    selection (scikit-learn's per-call validation costs milliseconds). Takes what
    `score` has accepted: integer labels (n,) and rows of probabilities, or
    float64 targets of the size of `pred`. Agrees with `score` to rounding."""
    if name in CLASSIFICATION_METRICS:
        if name == "ece":
            return _ece(y, pred)
        if name == "accuracy":
            return float(np.mean(pred.argmax(axis=1) == y))
        p = _safe_proba(pred)
        p_true = p[np.arange(p.shape[0]), y]
        if name == "log_loss":
            return float(-np.mean(np.log(p_true)))
        _check_metric(name)
        return float(np.mean(np.sum(p * p, axis=1) - 2 * p_true + 1))  # brier
    y = y.reshape(pred.shape)
    if name == "mse":
        return float(np.mean((y - pred) ** 2))
    if name == "mae":
        return float(np.mean(np.abs(y - pred)))
    if name == "r2":
        return _r2(y, pred)
    _check_metric(name)
    return _nll(y, pred, np.maximum(var.reshape(pred.shape), var_floor(y)))


#: metrics that are a mean over rows (``pointwise`` gives the rows' values)
POINTWISE = frozenset({"accuracy", "log_loss", "brier", "mse", "mae", "nll"})


def pointwise(name: str, y: np.ndarray, pred: np.ndarray, var: np.ndarray | None = None) -> np.ndarray | None:
    """Per-row values of metric `name` whose mean is `score_unchecked(name, ...)` (several
    outputs: averaged per row), for paired comparisons on the same rows; None for a metric
    that is not a mean over rows (r2, ece). Takes what `score_unchecked` takes."""
    if name not in POINTWISE:
        return None
    n = len(pred)
    if name in CLASSIFICATION_METRICS:
        if name == "accuracy":
            return (pred.argmax(axis=1) == y).astype(np.float64)
        p = _safe_proba(pred)
        p_true = p[np.arange(n), y]
        if name == "log_loss":
            return -np.log(p_true)
        return np.sum(p * p, axis=1) - 2 * p_true + 1                    # brier
    y = y.reshape(pred.shape)
    if name == "mse":
        rows = (y - pred) ** 2
    elif name == "mae":
        rows = np.abs(y - pred)
    else:
        v = np.maximum(var.reshape(pred.shape), var_floor(y))
        rows = 0.5 * np.log(2 * np.pi * v) + (y - pred) ** 2 / (2 * v)
    return rows.reshape(n, -1).mean(axis=1)


# ----------------------------------------------------------- averaging, uncertainty
def average_predictions(preds: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted average over the first axis of `preds` (m, ...); the weights are
    normalised to sum 1 (uniform when None). ValueError on negative or all-zero weights."""
    preds = np.asarray(preds, dtype=np.float64)
    if preds.ndim == 0 or preds.shape[0] == 0:
        raise ValueError(f"`preds` must stack at least one member, but got shape {preds.shape}")
    w = _checked_weights(weights, preds.shape[0])
    return np.tensordot(w, preds, axes=1)


def _entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) over the last axis, with 0 log 0 = 0."""
    logp = np.log(np.where(p > 0, p, 1.0))
    return -np.sum(p * logp, axis=-1)


def classification_uncertainty(
    member_probas: np.ndarray, weights: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Ensemble probability and its uncertainty split, from members' probabilities
    (m, n, c): "proba" (n, c) the weighted mean, and per sample (n,) "total" =
    entropy of the mean, "aleatoric" = weighted mean of members' entropies,
    "epistemic" = total - aleatoric (mutual information), all in nats."""
    probas = np.asarray(member_probas, dtype=np.float64)
    if probas.ndim != 3:
        raise ValueError(
            f"`member_probas` must have shape (members, samples, classes), but got {probas.shape}"
        )
    w = _checked_weights(weights, probas.shape[0])
    mean = np.tensordot(w, probas, axes=1)
    total = _entropy(mean)
    aleatoric = np.tensordot(w, _entropy(probas), axes=1)
    # Mutual information is >= 0 in exact arithmetic; clip rounding noise.
    epistemic = np.maximum(total - aleatoric, 0.0)
    return {"proba": mean, "total": total, "aleatoric": aleatoric, "epistemic": epistemic}


def regression_mixture(
    member_means: np.ndarray,
    member_vars: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Moments of the weighted mixture of members' Gaussians, from means (m, n[, d])
    and variances of the same shape (None: members without a variance head):
    "mean", "aleatoric" (mean of variances), "epistemic" (variance of the means),
    "var" = aleatoric + epistemic and "std" = sqrt(var)."""
    means = np.asarray(member_means, dtype=np.float64)
    if means.ndim < 2:
        raise ValueError(
            f"`member_means` must have shape (members, samples[, outputs]), but got {means.shape}"
        )
    w = _checked_weights(weights, means.shape[0])
    mean = np.tensordot(w, means, axes=1)
    if member_vars is None:
        aleatoric = np.zeros_like(mean)
    else:
        variances = np.asarray(member_vars, dtype=np.float64)
        if variances.shape != means.shape:
            raise ValueError(
                f"`member_vars` must have the shape of `member_means` {means.shape},"
                f" but got {variances.shape}"
            )
        aleatoric = np.tensordot(w, variances, axes=1)
    epistemic = np.tensordot(w, (means - mean) ** 2, axes=1)
    var = aleatoric + epistemic
    return {
        "mean": mean,
        "aleatoric": aleatoric,
        "epistemic": epistemic,
        "var": var,
        "std": np.sqrt(var),
    }
