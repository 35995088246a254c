"""A linear baseline on the run's own split: the row a scientist must see beside the ensemble.

A network ensemble that loses to logistic or ridge regression on the same test rows is not
worth its GPUs, and the console, ``ensemble.json`` and the report say so at once. The
baseline is fitted on the run's training rows (the normalised features, flattened), scored
with the task's own metrics on the validation and test rows, so its numbers sit in the
same table as the members':

- classification: multinomial logistic regression (L2, C = 1, lbfgs); its probabilities are
  scored like the ensemble's (accuracy, log loss, Brier, ECE);
- regression: ridge regression (alpha = 1) per output; its spread is one Gaussian variance
  per output, the mean squared residual on the validation rows (held out, so its intervals
  are honest), which gives it NLL and coverage like the ensemble.

At most ``MAX_ROWS`` training rows (a seeded subsample above that) and ``MAX_FEATURES``
input values per sample: beyond those a linear fit says little and costs minutes, and the
baseline is skipped with the reason recorded. It never fails the run: the caller records
``{"skipped": reason}`` on any error.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from ensemble.task.calibration import apply as apply_calibration
from ensemble.task.tasks import get_task

MAX_ROWS = 20_000
MAX_FEATURES = 20_000
NAMES = {"classification": "logistic regression", "regression": "ridge regression"}


def _flat(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x.reshape(len(x), -1)


def linear_baseline(task_name: str, data, n_outputs: int, seed: int = 0) -> dict:
    """Fit the task's linear model on ``data["x_train"]``/``["y_train"]`` and score it on the
    validation and test splits: {"model", "train_rows", "val", "test", "seconds"}, or
    {"model", "skipped": why} when the data is too wide to make it meaningful."""
    t0 = time.perf_counter()
    task = get_task(task_name)
    x_train, y_train = _flat(data["x_train"]), np.asarray(data["y_train"])
    out = {"model": NAMES[task_name]}
    if x_train.shape[1] > MAX_FEATURES:
        return {**out, "skipped": f"{x_train.shape[1]} input values per sample (more than {MAX_FEATURES}): "
                                  "a linear model on raw values says little here"}
    if len(x_train) > MAX_ROWS:
        rows = np.sort(np.random.default_rng(seed).choice(len(x_train), MAX_ROWS, replace=False))
        x_train, y_train = x_train[rows], y_train[rows]
    out["train_rows"] = len(x_train)
    splits = {s: (_flat(data[f"x_{s}"]), np.asarray(data[f"y_{s}"])) for s in ("val", "test")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # lbfgs's ConvergenceWarning: the score says enough
        if task_name == "classification":
            stats = _logistic(x_train, y_train, splits, n_outputs)
        else:
            stats = _ridge(x_train, y_train, splits)
    for s, (_, y) in splits.items():
        out[s] = task.ensemble_metrics(y, stats[s], gaussian=task_name == "regression")
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def _logistic(x, y, splits, n_classes) -> dict:
    from sklearn.linear_model import LogisticRegression
    model = LogisticRegression(C=1.0, max_iter=500)
    model.fit(x, y)
    out, n = {}, int(n_classes)
    for s, (xs, _) in splits.items():
        proba = np.zeros((len(xs), n))
        proba[:, model.classes_.astype(int)] = model.predict_proba(xs)   # a class absent from training: 0
        out[s] = get_task("classification").combine_outputs([(proba, None)], np.ones(1))
    return out


def _ridge(x, y, splits) -> dict:
    from sklearn.linear_model import Ridge
    model = Ridge(alpha=1.0).fit(x, y)
    x_val, y_val = splits["val"]
    var = np.mean((model.predict(x_val).reshape(y_val.shape) - y_val) ** 2, axis=0)
    task = get_task("regression")
    out = {}
    for s, (xs, ys) in splits.items():
        mean = model.predict(xs).reshape((len(xs),) + ys.shape[1:])
        raw = task.combine_outputs([(mean, np.broadcast_to(var, mean.shape).copy())], np.ones(1))
        out[s] = apply_calibration("regression", raw, None)
    return out
