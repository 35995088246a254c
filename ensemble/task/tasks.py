"""Classification and regression: everything that differs between the two, in one place.

A task object owns the output head, the loss, the target scaling, how a member's raw
outputs are decoded, its metrics, and how members are combined into an ensemble. The
combination has one set of formulas used three ways: in numpy over all members
(``combine``), across processes (``first_moments``/``second_moments`` summed by an
allreduce, then ``finish``), and inside an exported Keras model (``ensemble.inference.
export`` builds the same sums from stock layers; the tests compare all three).

Keras is imported only inside ``head`` and ``loss``; the rest is numpy.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ensemble.config.vocabulary import TASKS
from ensemble.task import metrics as M

VAR_FLOOR = 1e-6            # added to the softplus variance head, in the loss and at prediction


def read_scaling(value) -> float | np.ndarray:
    """A target shift or scale as stored: a float for one output, an array (k,) for several
    (``RegressionTask.target_scaling``)."""
    a = np.asarray(value, dtype=np.float64)
    return float(a) if a.ndim == 0 else a


def scaling_json(value) -> float | list[float]:
    """A target shift or scale as JSON stores it (``read_scaling`` reads it back)."""
    return np.asarray(value, dtype=np.float64).tolist() if np.ndim(value) else float(value)


def gaussian_nll(y_true, y_pred):
    """Mean Gaussian negative log-likelihood of (mean, softplus variance) heads, up to a constant."""
    from keras import ops
    k = y_pred.shape[-1] // 2
    mean, var = y_pred[..., :k], ops.softplus(y_pred[..., k:]) + VAR_FLOOR
    y = ops.reshape(ops.cast(y_true, mean.dtype), ops.shape(mean))
    return ops.mean(0.5 * ops.log(var) + 0.5 * ops.square(y - mean) / var, axis=-1)


class Task:
    """What a member and an ensemble do differently per task; see the subclasses."""

    name: str = ""
    #: metric used when ``ensemble.metric = "auto"``
    auto_metric: str = ""

    def default_metric(self, setting: str = "auto") -> str:
        return self.auto_metric if setting == "auto" else setting

    # -- a member -----------------------------------------------------------------
    def output_width(self, n_outputs: int, gaussian: bool = False) -> int:
        """Values per sample the member's model must output."""
        return n_outputs

    def head(self, x, n_outputs: int, gaussian: bool = False):
        """The Keras output layer applied to the last hidden tensor ``x``."""
        raise NotImplementedError

    def loss(self, gaussian: bool = False) -> tuple[Any, list]:
        """(Keras loss, Keras metrics) a member compiles with."""
        raise NotImplementedError

    def target_scaling(self, y_train: np.ndarray) -> tuple[float | np.ndarray, float | np.ndarray]:
        """(shift, scale): members train on (y - shift) / scale (floats, or arrays (k,) of one
        per output)."""
        return 0.0, 1.0

    def target_transform(self, shift: float, scale: float) -> Callable | None:
        return None

    def decode(self, raw: np.ndarray, y_shift: float = 0.0, y_scale: float = 1.0, gaussian: bool = False,
               squeeze: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """(prediction, variance or None) from the model's raw float64 outputs."""
        return raw, None

    def predict(self, model, x: np.ndarray, y_shift: float = 0.0, y_scale: float = 1.0,
                gaussian: bool = False, batch_size: int = 512,
                squeeze: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """A member's (prediction, variance or None) on ``x``: probabilities for classification;
        for regression the prediction (and a Gaussian member's variance) in the targets' units,
        (n,) for one output unless ``squeeze`` is False."""
        # Direct calls in chunks: Keras' predict() would build a tf.data pipeline per member.
        chunks = [np.asarray(model(x[i:i + batch_size], training=False)) for i in range(0, len(x), batch_size)]
        raw = (np.concatenate(chunks).astype(np.float64) if chunks
               else np.zeros((0, model.output_shape[-1])))
        return self.decode(raw, y_shift, y_scale, gaussian, squeeze)

    def metrics(self, y: np.ndarray, pred: np.ndarray, var: np.ndarray | None = None) -> dict[str, float]:
        raise NotImplementedError

    # -- an ensemble ----------------------------------------------------------------
    def combine(self, preds: np.ndarray, variances: np.ndarray | None, weights: np.ndarray) -> dict:
        """The ensemble's per-sample statistics from stacked member outputs (m, n, ...)."""
        raise NotImplementedError

    def combine_outputs(self, outputs: list[tuple[np.ndarray, np.ndarray | None]],
                        weights: np.ndarray) -> dict:
        """``combine`` over members' (prediction, variance or None) pairs: a member without a
        variance head adds no aleatoric part (zeros), unless no member has one (None)."""
        variances = None
        if any(var is not None for _, var in outputs):
            variances = np.stack([var if var is not None else np.zeros_like(pred) for pred, var in outputs])
        return self.combine(np.stack([pred for pred, _ in outputs]), variances, weights)

    def first_moments(self, weight: float, part: dict | None, n: int, k: int) -> np.ndarray:
        """This process's share of the first sums (``part`` = ``combine`` of its members,
        ``weight`` their summed weight; None when it holds no member)."""
        raise NotImplementedError

    def second_moments(self, weight: float, part: dict | None, first: np.ndarray, k: int) -> np.ndarray:
        """This process's share of the second sums, given the summed first ones."""
        raise NotImplementedError

    def finish(self, first: np.ndarray, second: np.ndarray, k: int) -> dict:
        """Per-sample statistics from the sums over all processes (as ``combine`` gives)."""
        raise NotImplementedError

    def merge(self, parts: list[tuple[float, dict | None]], n: int, k: int) -> dict:
        """``finish`` over in-memory parts: what the allreduce does across processes."""
        first = sum(self.first_moments(w, p, n, k) for w, p in parts)
        second = sum(self.second_moments(w, p, first, k) for w, p in parts)
        return self.finish(first, second, k)

    def combine_in_keras(self, members: list, n_outputs: int, calibration: dict | None = None):
        """The same combination as a Keras graph of stock layers (``ensemble.task.graph``),
        from ``MemberOutput``s; the exported model's output(s). Of a ``calibration``, the
        graph applies a regression's variance scale (stock layers have no log for a
        temperature, and interval widths are not a model output)."""
        raise NotImplementedError

    def ensemble_metrics(self, y: np.ndarray, stats: dict, gaussian: bool = False) -> dict[str, float]:
        raise NotImplementedError

    def per_sample(self, stats: dict) -> dict[str, np.ndarray]:
        """What ``ensemble_test_predictions.npz`` holds besides the targets."""
        raise NotImplementedError


class Classification(Task):
    name, auto_metric = "classification", "accuracy"

    def head(self, x, n_outputs: int, gaussian: bool = False):
        import keras
        # float32 under a mixed-precision policy too: a softmax and a log loss in half precision underflow
        return keras.layers.Dense(n_outputs, activation="softmax", name="probabilities", dtype="float32")(x)

    def loss(self, gaussian: bool = False):
        return "sparse_categorical_crossentropy", ["accuracy"]

    def metrics(self, y, pred, var=None):
        return M.classification_metrics(y, pred)

    def combine(self, preds, variances, weights):
        return M.classification_uncertainty(preds, weights)

    def first_moments(self, weight, part, n, k):
        buf = np.zeros((n, k + 1))
        if part is not None:
            buf[:, :k], buf[:, k] = weight * part["proba"], weight * part["aleatoric"]
        return buf

    def second_moments(self, weight, part, first, k):
        return np.zeros((len(first), 0))

    def finish(self, first, second, k):
        proba, aleatoric = first[:, :k], first[:, k]
        total = M.classification_uncertainty(proba[None])["total"]     # entropy of the ensemble mean
        return {"proba": proba, "total": total, "aleatoric": aleatoric,
                "epistemic": np.maximum(total - aleatoric, 0.0)}

    def combine_in_keras(self, members, n_outputs, calibration=None):
        """The averaged probabilities, before any temperature: stock Keras layers have no
        logarithm, and a custom layer would make the file need this project to load."""
        from ensemble.task.graph import classification_graph
        return classification_graph(members, n_outputs)

    def ensemble_metrics(self, y, stats, gaussian=False):
        return M.classification_metrics(y, stats["proba"])

    def per_sample(self, stats):
        return {"proba": stats["proba"], "prediction": stats["proba"].argmax(axis=1),
                "total_entropy": stats["total"], "aleatoric": stats["aleatoric"],
                "epistemic": stats["epistemic"]}


class Regression(Task):
    name, auto_metric = "regression", "mse"

    def output_width(self, n_outputs, gaussian=False):
        return 2 * n_outputs if gaussian else n_outputs

    def head(self, x, n_outputs, gaussian=False):
        import keras
        if gaussian:                      # float32 always, as the classification head
            return keras.layers.Dense(2 * n_outputs, name="mean_and_raw_variance", dtype="float32")(x)
        return keras.layers.Dense(n_outputs, name="prediction", dtype="float32")(x)

    def loss(self, gaussian=False):
        return (gaussian_nll, []) if gaussian else ("mse", ["mae"])

    def target_scaling(self, y_train):
        y = np.asarray(y_train, dtype=np.float64)
        if y.ndim == 2 and y.shape[1] > 1:          # several targets: each standardised on its own
            std = y.std(axis=0)
            return y.mean(axis=0), np.where(std > 0, std, 1.0)
        return float(y.mean()), float(y.std() or 1.0)

    def target_transform(self, shift, scale):
        return lambda y: (y - shift) / scale

    def decode(self, raw, y_shift=0.0, y_scale=1.0, gaussian=False, squeeze=True):
        out, var = raw, None
        if gaussian:
            k = out.shape[-1] // 2
            out, raw_var = out[:, :k], out[:, k:]
            var = (np.logaddexp(0.0, raw_var) + VAR_FLOOR) * y_scale ** 2     # softplus, as in the loss
        out = out * y_scale + y_shift
        if squeeze and out.shape[-1] == 1:
            out = out[:, 0]
            var = var[:, 0] if var is not None else None
        return out, var

    def metrics(self, y, pred, var=None):
        return M.regression_metrics(y, pred, var)

    def combine(self, preds, variances, weights):
        return M.regression_mixture(preds, variances, weights)

    def first_moments(self, weight, part, n, k):
        return weight * part["mean"].reshape(n, k) if part is not None else np.zeros((n, k))

    def second_moments(self, weight, part, first, k):
        buf = np.zeros((len(first), 2 * k))
        if part is not None:           # the law of total variance: spread about the global mean
            local = part["mean"].reshape(len(first), k)
            buf[:, :k] = weight * part["aleatoric"].reshape(len(first), k)
            buf[:, k:] = weight * (part["epistemic"].reshape(len(first), k) + (local - first) ** 2)
        return buf

    def finish(self, first, second, k):
        aleatoric, epistemic = second[:, :k], second[:, k:]
        var = aleatoric + epistemic
        return {"mean": first, "var": var, "std": np.sqrt(var), "aleatoric": aleatoric,
                "epistemic": epistemic}

    def combine_in_keras(self, members, n_outputs, calibration=None):
        from ensemble.task.graph import regression_graph
        scale = floor = None
        if calibration and calibration.get("std_scale") is not None:
            scale = np.asarray(calibration["std_scale"], dtype=np.float64) ** 2
            floor = np.asarray(calibration.get("floor", [0.0]), dtype=np.float64) ** 2    # apply_regression's
        return regression_graph(members, n_outputs, VAR_FLOOR, scale, floor)

    def ensemble_metrics(self, y, stats, gaussian=False):
        """mse, mae, r2 and, when the ensemble has a spread (members' variances or their
        disagreement), nll and the coverage of its intervals (``metrics.COVERAGE_LEVELS``) (the recalibrated
        ones when ``stats`` has "intervals", see ``ensemble.task.calibration``)."""
        var = np.asarray(stats["var"])
        spread = gaussian or bool(np.any(var > 0))
        out = M.regression_metrics(y, stats["mean"], var if spread else None)
        if spread and "intervals" in stats:
            from ensemble.task.calibration import interval_metrics
            out.update(interval_metrics(y, stats))
        return out

    def per_sample(self, stats):
        out = {"mean": stats["mean"], "std": stats["std"], "aleatoric_var": stats["aleatoric"],
               "epistemic_var": stats["epistemic"]}
        if "intervals" in stats:
            out["lower_90"] = stats["mean"] - stats["intervals"]["90"]
            out["upper_90"] = stats["mean"] + stats["intervals"]["90"]
        return out


_TASKS: dict[str, Task] = {t.name: t for t in (Classification(), Regression())}
assert tuple(_TASKS) == TASKS, "every task of the vocabulary has one implementation"


def get_task(name: str) -> Task:
    """The task object for ``"classification"`` or ``"regression"``."""
    try:
        return _TASKS[name]
    except KeyError:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, but got {name!r}") from None
