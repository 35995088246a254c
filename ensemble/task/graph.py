"""The task's combination formulas as a Keras graph of stock layers, for the exported model.

The same sums as ``Task.combine``/``Task.finish`` (weighted mean of probabilities; the
mixture's mean and aleatoric + epistemic variance), in float64 with ``Rescaling``, ``Add``,
``Subtract`` and ``Multiply`` only (a Gaussian member's mean/variance halves are picked by
a fixed ``Dense``), so ``keras.models.load_model`` needs no custom layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

F64 = "float64"


def _sum(terms: list, name: str):
    """Sum of tensors under a named layer (an Identity when there is a single term)."""
    import keras
    if len(terms) == 1:
        return keras.layers.Identity(name=name, dtype=F64)(terms[0])
    return keras.layers.Add(name=name, dtype=F64)(terms)


def _weighted(tensor, weight: float, name: str):
    return _affine(tensor, weight, None, int(tensor.shape[-1]), name)


def _columns(tensor, start: int, stop: int, width: int, name: str):
    """``tensor[:, start:stop]`` by a fixed, non-trainable selection Dense (no Lambda layer)."""
    import keras
    layer = keras.layers.Dense(stop - start, use_bias=False, trainable=False, dtype=F64, name=name)
    out = layer(tensor)
    layer.set_weights([np.eye(width)[:, start:stop]])
    return out


def _affine(tensor, scale, shift, k: int, name: str):
    """``tensor * scale (+ shift)`` per output, by a fixed float64 ``Dense`` (diagonal kernel, bias unless
    ``shift`` is None). Not ``Rescaling``: Keras casts its Python numbers through float32, and a target of
    1.6e9 lost 48 units in a member's weight of 1/3 (float32: 3e-8 relative)."""
    import keras
    layer = keras.layers.Dense(k, use_bias=shift is not None, trainable=False, dtype=F64, name=name)
    out = layer(tensor)
    weights = [np.diag(np.broadcast_to(np.asarray(scale, dtype=np.float64), (k,)))]
    if shift is not None:
        weights.append(np.broadcast_to(np.asarray(shift, dtype=np.float64), (k,)).copy())
    layer.set_weights(weights)
    return out


@dataclass(frozen=True)
class MemberOutput:
    """One member's raw output tensor in the exported graph, with its weight and scaling."""
    tensor: Any
    weight: float
    tag: str
    y_shift: Any = 0.0          # a float, or an array (k,) of one per output
    y_scale: Any = 1.0
    gaussian: bool = False


def classification_graph(members: list[MemberOutput], k: int):
    """Averaged probabilities (n, C)."""
    return _sum([_weighted(m.tensor, m.weight, f"proba_w_{m.tag}") for m in members],
                              "probabilities")


def regression_graph(members: list[MemberOutput], k: int, var_floor: float, var_scale=None, min_var=None):
    """[mean (n, k), variance (n, k)]: the mixture's mean and aleatoric + epistemic variance,
    at least ``min_var`` (per output: the recalibration's floor, squared) and times ``var_scale``
    (per output; the recalibration's squared std scale) when given, as
    ``calibration.apply_regression`` does."""
    import keras
    means, variances = [], []
    for m in members:
        out = m.tensor
        if m.gaussian:
            raw_var = _columns(out, k, 2 * k, 2 * k, f"raw_var_{m.tag}")
            out = _columns(out, 0, k, 2 * k, f"raw_mean_{m.tag}")
            var = keras.layers.Activation("softplus", dtype=F64, name=f"softplus_{m.tag}")(raw_var)
            s2 = m.y_scale ** 2
            var = keras.layers.Rescaling(s2, offset=var_floor * s2, dtype=F64, name=f"var_{m.tag}")(var)
            variances.append(_weighted(var, m.weight, f"var_w_{m.tag}"))
        means.append(_affine(out, m.y_scale, m.y_shift, k, f"mean_{m.tag}"))
    mean = _sum([_weighted(x, m.weight, f"mean_w_{m.tag}") for x, m in zip(means, members)],
                              "mean")
    for x, m in zip(means, members):               # epistemic: weighted spread about the mean
        d = keras.layers.Subtract(dtype=F64, name=f"dev_{m.tag}")([x, mean])
        variances.append(_weighted(keras.layers.Multiply(dtype=F64, name=f"dev2_{m.tag}")([d, d]), m.weight,
                                   f"dev2_w_{m.tag}"))
    if var_scale is None:
        return [mean, _sum(variances, "variance")]
    total = _sum(variances, "variance_uncalibrated")
    scale = np.asarray(var_scale, dtype=np.float64)
    low = np.zeros(1) if min_var is None else np.asarray(min_var, dtype=np.float64)
    if np.any(low > 0):                           # max(total, low) = relu(total - low) + low, in float64
        total = _affine(total, 1.0, -low, k, "variance_less_floor")
        total = keras.layers.Activation("relu", dtype=F64, name="variance_above_floor")(total)
        return [mean, _affine(total, scale, low * scale, k, "variance")]
    return [mean, _affine(total, scale, None, k, "variance")]
