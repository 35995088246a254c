"""The whole ensemble as ONE Keras model, built from stock layers only.

``export_ensemble(run_dir, "ensemble.keras")`` writes a model that takes raw features (as
the training file holds them, flattened when ``data.reshape`` was set), normalises them
with the run's saved shift/scale (a ``Normalization`` layer), runs every member (nested
models) and combines their outputs with their weights:

- classification: one output, the averaged probabilities (n, C);
- regression: two outputs, [mean (n, k), total variance (n, k)], the variance being the
  mixture's aleatoric (members' own variances) plus epistemic (spread of their means) part.

The combination runs in float64 (``Rescaling``/``Add``/``Subtract``/``Multiply``; a Gaussian
member's mean/variance halves are picked by a fixed ``Dense``), so the numbers match
``python -m ensemble.predict``. No custom layer is used: ``keras.models.load_model(path)``
loads it in any process without importing this project (a member built by a user's own
builder with custom layers still needs those layers, as its own model.keras does).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ensemble.inference.load import EnsembleRun, PredictError, load_run
from ensemble.task import VAR_FLOOR

F64 = "float64"


def _sum(terms: list, name: str):
    """Sum of tensors under a named layer (an Identity when there is a single term)."""
    import keras
    if len(terms) == 1:
        return keras.layers.Identity(name=name, dtype=F64)(terms[0])
    return keras.layers.Add(name=name, dtype=F64)(terms)


def _weighted(tensor, weight: float, name: str):
    import keras
    return keras.layers.Rescaling(weight, name=name, dtype=F64)(tensor)


def _columns(tensor, start: int, stop: int, width: int, name: str):
    """``tensor[:, start:stop]`` by a fixed, non-trainable selection Dense (no Lambda layer)."""
    import keras
    layer = keras.layers.Dense(stop - start, use_bias=False, trainable=False, dtype=F64, name=name)
    out = layer(tensor)
    layer.set_weights([np.eye(width)[:, start:stop]])
    return out


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
    raw_shape = (flat,) if run.config["data"].get("reshape") else shape
    inputs = keras.Input(shape=raw_shape, name="features")
    z = inputs if len(raw_shape) == 1 else keras.layers.Flatten(name="flatten_features")(inputs)
    z = _normalize(z, run.shift, run.scale)
    if len(shape) != 1:
        z = keras.layers.Reshape(shape, name="sample_shape")(z)
    probas, means, variances = [], [], []
    for member in run.members:
        tag = re.sub(r"[^A-Za-z0-9_]", "_", member.id)
        model = keras.models.load_model(member.model_path, compile=False)
        model.name = f"member_{tag}"               # nested models need unique names
        out = model(z)
        if run.task == "classification":
            probas.append(_weighted(out, member.weight, f"proba_w_{tag}"))
            continue
        k = run.n_outputs
        if member.gaussian:
            raw_var = _columns(out, k, 2 * k, 2 * k, f"raw_var_{tag}")
            out = _columns(out, 0, k, 2 * k, f"raw_mean_{tag}")
            var = keras.layers.Activation("softplus", dtype=F64, name=f"softplus_{tag}")(raw_var)
            s2 = member.y_scale ** 2
            var = keras.layers.Rescaling(s2, offset=VAR_FLOOR * s2, dtype=F64, name=f"var_{tag}")(var)
            variances.append(_weighted(var, member.weight, f"var_w_{tag}"))
        mean = keras.layers.Rescaling(member.y_scale, offset=member.y_shift, dtype=F64, name=f"mean_{tag}")(out)
        means.append((mean, member.weight, tag))
    if run.task == "classification":
        return keras.Model(inputs, _sum(probas, "probabilities"), name="ensemble")
    mean = _sum([_weighted(m, w, f"mean_w_{tag}") for m, w, tag in means], "mean")
    for m, w, tag in means:                        # epistemic: weighted spread about the mean
        d = keras.layers.Subtract(dtype=F64, name=f"dev_{tag}")([m, mean])
        variances.append(_weighted(keras.layers.Multiply(dtype=F64, name=f"dev2_{tag}")([d, d]), w,
                                   f"dev2_w_{tag}"))
    return keras.Model(inputs, [mean, _sum(variances, "variance")], name="ensemble")


def export_ensemble(run: EnsembleRun | str | Path, path: str | Path) -> Path:
    """Build the ensemble model of ``run`` (a run directory or a loaded run) and save it to ``path``."""
    path = Path(path)
    if path.suffix != ".keras":
        raise PredictError(f"the exported model must be a .keras file, but got {str(path)!r}")
    if isinstance(run, (str, Path)):
        run = load_run(run)
    model = build_ensemble_model(run)
    model.save(path)
    return path
