"""The whole ensemble as ONE Keras model, built from stock layers only.

``export_ensemble(run_dir, "ensemble.keras")`` writes a model that takes raw features (as
the training file holds them, flattened when ``data.reshape`` was set), normalises them
with the run's saved shift/scale (a ``Normalization`` layer), runs every member (nested
models) and combines their outputs with their weights:

- classification: one output, the averaged probabilities (n, C);
- regression: two outputs, [mean (n, k), total variance (n, k)], the variance being the
  mixture's aleatoric (members' own variances) plus epistemic (spread of their means) part,
  recalibrated by the run's variance scale (``ensemble.json`` "calibration": "std_scale").
  Conformal interval widths and a classification temperature are not in the exported
  model: ``python -m ensemble.predict`` applies them.

The combination is the task's (``Task.combine_in_keras``, built in ``ensemble.task.graph``
from stock layers in float64, the formulas of ``Task.combine``), so the numbers match
``python -m ensemble.predict``. No custom layer is used: ``keras.models.load_model(path)``
loads it in any process without importing this project (a member built by a user's own
builder with custom layers still needs those layers, as its own model.keras does).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from ensemble.inference.load import EnsembleRun, PredictError, load_run
from ensemble.results.rundir import atomic_write
from ensemble.task import get_task
from ensemble.task.graph import MemberOutput

log = logging.getLogger("ensemble.export")


def _normalize(z, shift: np.ndarray, scale: np.ndarray):
    """(x - shift) / scale per feature, in float32 as ``datafeed.prepare.apply_normalizer`` does."""
    import keras
    shift, scale = shift.astype(np.float64).reshape(-1), scale.astype(np.float64).reshape(-1)
    if scale.min() >= keras.config.epsilon():      # Normalization divides by max(sqrt(var), epsilon)
        return keras.layers.Normalization(axis=-1, mean=shift, variance=scale ** 2, name="normalize")(z)
    return keras.layers.Rescaling(1.0 / scale, offset=-shift / scale, name="normalize")(z)


def build_ensemble_model(run: EnsembleRun):
    """The Keras model: raw features -> normalisation -> members -> weighted combination."""
    import keras

    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(1)
    shape = run.input_shape
    flat = int(np.prod(shape))
    raw_shape = (flat,) if run.config.data.reshape else shape
    inputs = keras.Input(shape=raw_shape, name="features")
    z = inputs if len(raw_shape) == 1 else keras.layers.Flatten(name="flatten_features")(inputs)
    z = _normalize(z, run.shift, run.scale)
    if len(shape) != 1:
        z = keras.layers.Reshape(shape, name="sample_shape")(z)
    outputs = []
    for member in run.members:
        tag = re.sub(r"[^A-Za-z0-9_]", "_", member.id)
        model = keras.models.load_model(member.model_path, compile=False)
        model.name = f"member_{tag}"               # nested models need unique names
        outputs.append(MemberOutput(model(z), member.weight, tag, member.y_shift, member.y_scale,
                                    member.gaussian))
    return keras.Model(inputs, get_task(run.task).combine_in_keras(outputs, run.n_outputs, run.calibration),
                       name="ensemble")


def export_ensemble(run: EnsembleRun | str | Path, path: str | Path) -> Path:
    """Build the ensemble model of ``run`` (a run directory or a loaded run) and save it to ``path``."""
    path = Path(path)
    if path.suffix != ".keras":
        raise PredictError(f"the exported model must be a .keras file, but got {str(path)!r}")
    if isinstance(run, (str, Path)):
        run = load_run(run)
    model = build_ensemble_model(run)
    temperature = (run.calibration or {}).get("temperature", 1.0)
    if run.task == "classification" and temperature != 1.0:
        log.warning(f"{path}: the model gives the averaged probabilities before the run's temperature "
                    f"(T = {temperature:.4g}); predict applies it: softmax(log(p) / T)")
    return atomic_write(path, model.save)           # never a half-written model at the final path
