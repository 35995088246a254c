"""The ensemble as a serving graph: raw features in, every per-sample quantity out.

What ``ensemble export --format saved_model|onnx`` writes. Unlike the stock ``.keras``
file (``inference.export.build_ensemble_model``), this graph holds the whole of
``ensemble.predict``: the run's normalisation, every member, the task's combination in
float64 and the run's calibration (a classification temperature; a regression's variance
scale and its calibrated interval half-widths). It is not meant to be loaded back into
Keras (its head is a custom layer); a SavedModel or ONNX file needs no Python code.

Outputs (float64; n rows, C classes, k regression outputs):

- classification: ``probabilities`` (n, C), ``total_entropy``, ``aleatoric``,
  ``epistemic`` (n,) in nats: ``calibration.apply_temperature`` of
  ``metrics.classification_uncertainty``;
- regression: ``mean``, ``std``, ``variance``, ``aleatoric_var``, ``epistemic_var`` and
  ``lower_L``/``upper_L`` for each level L of ``metrics.COVERAGE_LEVELS`` (50, 80, 90,
  95), each (n, k): ``calibration.apply_regression`` of ``metrics.regression_mixture``.
"""

from __future__ import annotations

import re

import numpy as np

from ensemble.inference.load import EnsembleRun
from ensemble.task import metrics as M
from ensemble.task.tasks import VAR_FLOOR, scaling_json

#: the input's name in every format
INPUT_NAME = "features"


def output_names(run: EnsembleRun) -> list[str]:
    """The serving graph's outputs, in order."""
    if run.task == "classification":
        return ["probabilities", "total_entropy", "aleatoric", "epistemic"]
    levels = [M.level_key(lv) for lv in M.COVERAGE_LEVELS]
    return ["mean", "std", "variance", "aleatoric_var", "epistemic_var",
            *(f"{side}_{key}" for key in levels for side in ("lower", "upper"))]


def _standardize_layer():
    """``datafeed.prepare.apply_normalizer`` and the training reshape as one layer whose
    shift and scale are constants of the graph (a ``Normalization`` layer's are variables,
    which the ONNX converter turns into inputs)."""
    import keras
    from keras import ops

    class Standardize(keras.layers.Layer):
        def __init__(self, shift: np.ndarray, scale: np.ndarray, shape: tuple[int, ...], **kw):
            super().__init__(**kw)
            self.shift = np.asarray(shift).reshape(-1)
            self.scale = np.asarray(scale).reshape(-1)
            self.shape = tuple(shape)

        def call(self, x):
            flat = ops.reshape(x, (-1, self.shift.size))
            dtype = np.result_type(np.float32, self.shift.dtype, self.scale.dtype).name
            z = (ops.cast(flat, dtype) - self.shift.astype(dtype)) / self.scale.astype(dtype)
            return ops.reshape(ops.cast(z, "float32"), (-1, *self.shape))

    return Standardize


def _head_layer():
    """The combination as one Keras layer (float64 keras.ops), made on first use so that
    importing this module does not import Keras."""
    import keras
    from keras import ops

    def entropy(p):
        return -ops.sum(p * ops.log(ops.where(p > 0, p, ops.ones_like(p))), axis=-1)

    def softplus(x):            # log(1 + e^x), stable in float64 and plain ops for ONNX
        return ops.maximum(x, 0.0) + ops.log(1.0 + ops.exp(-ops.abs(x)))

    class EnsembleHead(keras.layers.Layer):
        def __init__(self, task: str, members: list[dict], n_outputs: int, calibration: dict | None, **kw):
            super().__init__(dtype="float64", **kw)
            self.task, self.members, self.k, self.calibration = task, members, n_outputs, calibration

        def call(self, outputs):
            outs = [ops.cast(x, "float64") for x in outputs]
            return self._classification(outs) if self.task == "classification" else self._regression(outs)

        def _classification(self, outs):
            w = [m["weight"] for m in self.members]
            proba = sum(wi * p for wi, p in zip(w, outs))
            total = entropy(proba)
            aleatoric = sum(wi * entropy(p) for wi, p in zip(w, outs))
            cal = self.calibration or {}
            if cal.get("method") == "temperature":                 # calibration.apply_temperature
                logp = ops.log(ops.clip(proba, M.PROBA_EPS, 1.0)) / cal["temperature"]
                logp = logp - ops.max(logp, axis=1, keepdims=True)
                p = ops.exp(logp)
                proba = p / ops.sum(p, axis=1, keepdims=True)
                before, total = total, entropy(proba)
                ratio = ops.where(before > 0, total / ops.where(before > 0, before, 1.0), 1.0)
                aleatoric = aleatoric * ratio
            epistemic = ops.maximum(total - aleatoric, 0.0)
            return {"probabilities": proba, "total_entropy": total, "aleatoric": aleatoric, "epistemic": epistemic}

        def _regression(self, outs):
            k = self.k
            means, variances = [], []
            for m, out in zip(self.members, outs):
                scale, shift = np.asarray(m["y_scale"], np.float64), np.asarray(m["y_shift"], np.float64)
                if m["gaussian"]:
                    variances.append((softplus(out[:, k:2 * k]) + VAR_FLOOR) * scale ** 2)
                    out = out[:, :k]
                else:
                    variances.append(None)
                means.append(out * scale + shift)
            w = [m["weight"] for m in self.members]
            mean = sum(wi * x for wi, x in zip(w, means))
            aleatoric = sum((wi * v for wi, v in zip(w, variances) if v is not None), ops.zeros_like(mean))
            epistemic = sum(wi * (x - mean) ** 2 for wi, x in zip(w, means))
            std = ops.sqrt(aleatoric + epistemic)
            cal = self.calibration
            if cal is None:                                         # Gaussian intervals of the spread
                half = {M.level_key(lv): M.Z[lv] * std for lv in M.COVERAGE_LEVELS}
            else:                                                   # calibration.apply_regression
                scale = np.asarray(cal["std_scale"], dtype=np.float64)
                floor = np.asarray(cal.get("floor", [0.0]), dtype=np.float64)
                sd = ops.maximum(std, floor)
                half = {key: np.asarray(f, dtype=np.float64) * sd for key, f in cal["half_width"].items()}
                aleatoric = (aleatoric + sd ** 2 - std ** 2) * scale ** 2       # no spread: the floor's, as noise
                epistemic, std = epistemic * scale ** 2, sd * scale
            out = {"mean": mean, "std": std, "variance": aleatoric + epistemic, "aleatoric_var": aleatoric,
                   "epistemic_var": epistemic}
            for lv in M.COVERAGE_LEVELS:
                key = M.level_key(lv)
                out[f"lower_{key}"], out[f"upper_{key}"] = mean - half[key], mean + half[key]
            return out

    return EnsembleHead


def build_serving_model(run: EnsembleRun):
    """The Keras model: raw features -> normalisation -> members -> combination and calibration,
    with a dict of named outputs (``output_names``)."""
    import keras

    from ensemble.inference.export import raw_input_shape
    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(1)
    inputs = keras.Input(shape=raw_input_shape(run), name=INPUT_NAME)
    z = _standardize_layer()(run.shift, run.scale, run.input_shape, name="normalize")(inputs)
    raw, members = [], []
    for member in run.members:
        tag = re.sub(r"[^A-Za-z0-9_]", "_", member.id)
        model = keras.models.load_model(member.model_path, compile=False)
        model.name = f"member_{tag}"
        raw.append(model(z))
        members.append({"weight": float(member.weight), "y_shift": scaling_json(member.y_shift),
                        "y_scale": scaling_json(member.y_scale), "gaussian": bool(member.gaussian)})
    head = _head_layer()(run.task, members, run.n_outputs, run.calibration, name="ensemble_head")
    outputs = head(raw)
    return keras.Model(inputs, {name: outputs[name] for name in output_names(run)}, name="ensemble")
