"""Build a Keras model from a member spec: a layer list or the user's own builder.

The builder appends the output head itself (softmax over classes, or a linear
regression head), so configs and evolved genomes describe only the hidden layers.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from ensemble.config.vocabulary import INPUT_RANK, OPTIMIZERS
from ensemble.task import get_task


class ArchitectureError(ValueError):
    """A layer list cannot be built on this data; the message says which layer and why."""


def _tuple(v: Any, rank: int) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _make_layer(layer: dict):
    import keras
    kind = layer["type"]
    params = {k: _tuple(v, 0) for k, v in layer.items() if k not in ("type", "residual")}
    if kind.startswith("Conv") or kind.endswith("Pooling1D") or kind.endswith("Pooling2D") \
            or kind.endswith("Pooling3D"):
        if not kind.startswith("Global"):
            params.setdefault("padding", "same")
    return getattr(keras.layers, kind)(**params)


def _residual(x, y, layer: dict):
    """Add the block's input to its output, projecting with a 1x1 layer if shapes differ."""
    import keras
    if tuple(x.shape[1:]) == tuple(y.shape[1:]):
        return keras.layers.Add()([x, y])
    kind = layer["type"]
    if kind == "Dense":
        proj = keras.layers.Dense(y.shape[-1])(x)
    else:
        dims = int(kind[-2])
        proj = getattr(keras.layers, kind)(y.shape[-1], kernel_size=1, strides=layer.get("strides", 1),
                                           padding="same")(x)
        if tuple(proj.shape[1:]) != tuple(y.shape[1:]):
            raise ArchitectureError(f"residual {kind} changes the shape {tuple(x.shape[1:])} -> "
                                    f"{tuple(y.shape[1:])} in a way a 1x1 projection over {dims}-D "
                                    "cannot follow; use padding = \"same\"")
    return keras.layers.Add()([proj, y])


def build_layers(layers: list[dict], input_shape: tuple[int, ...], n_outputs: int, task: str,
                 gaussian: bool = False):
    """Keras functional model: input -> hidden layers -> output head."""
    import keras
    inputs = keras.Input(shape=tuple(input_shape))
    x = inputs
    for i, layer in enumerate(layers):
        kind = layer["type"]
        need = INPUT_RANK.get(kind)
        if need is not None and len(x.shape) - 1 != need:
            raise ArchitectureError(
                f"layer {i} ({kind}) needs inputs with {need} axes per sample, but gets shape "
                f"{tuple(x.shape[1:])}; set `data.reshape` (e.g. [8, 8, 1] for 64 pixels) or add "
                "a Reshape/Flatten layer")
        try:
            y = _make_layer(layer)(x)
        except (ValueError, TypeError) as exc:
            raise ArchitectureError(f"layer {i} ({kind}) cannot be applied to shape "
                                    f"{tuple(x.shape[1:])}: {exc}") from None
        if any(d is not None and d < 1 for d in y.shape[1:]):
            raise ArchitectureError(f"layer {i} ({kind}) shrinks the shape {tuple(x.shape[1:])} to "
                                    f"{tuple(y.shape[1:])}; remove pooling/strides or use padding=\"same\"")
        x = _residual(x, y, layer) if layer.get("residual") else y
    if len(x.shape) > 2:
        x = keras.layers.Flatten()(x)
    return keras.Model(inputs, get_task(task).head(x, n_outputs, gaussian))


def load_builder(ref: str):
    """Import ``package.module:function`` and return the function."""
    mod_name, _, fn_name = ref.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ArchitectureError(f"`model` {ref!r}: cannot import module {mod_name!r} ({exc}); "
                                "is it on PYTHONPATH?") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ArchitectureError(f"`model` {ref!r}: module {mod_name!r} has no function {fn_name!r}")
    return fn


def build_model(spec: dict, input_shape: tuple[int, ...], n_outputs: int, task: str):
    """The uncompiled Keras model a member spec describes."""
    gaussian = spec.get("loss") == "gaussian_nll"
    if spec.get("model"):
        model = load_builder(spec["model"])(tuple(input_shape), n_outputs, **spec.get("params", {}))
        want = get_task(task).output_width(n_outputs, gaussian)
        got = model.output_shape[-1] if hasattr(model, "output_shape") else None
        if got != want:
            raise ArchitectureError(f"`model` {spec['model']!r} must return a Keras model with {want} "
                                    f"outputs per sample (softmax probabilities for classification), "
                                    f"but its output shape is {getattr(model, 'output_shape', None)}")
        return model
    return build_layers(spec["layers"], tuple(input_shape), n_outputs, task, gaussian)


def count_params(model) -> int:
    return int(sum(math.prod(w.shape) for w in model.weights))


def make_optimizer(name: str, learning_rate: float):
    """The Keras optimizer a vocabulary name stands for (``ensemble.config.vocabulary.OPTIMIZERS``)."""
    import keras
    if name not in OPTIMIZERS:
        raise ArchitectureError(f"optimizer {name!r} is not one of {', '.join(OPTIMIZERS)}")
    return getattr(keras.optimizers, OPTIMIZERS[name])(learning_rate=learning_rate)
