"""Build a Keras model from a member spec: a layer list or the user's own builder.

The builder appends the output head itself (softmax over classes, or a linear
regression head), so configs and evolved genomes describe only the hidden layers.
"""

from __future__ import annotations

import importlib
import math
import sys
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ensemble.config import ArchitectureConfig
from ensemble.config.vocabulary import AXES, INPUT_RANK, OPTIMIZERS, gaussian_head, rank_hint
from ensemble.task import get_task
from ensemble.task.metrics import PROBA_TOL


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
            at_input = tuple(x.shape[1:]) == tuple(input_shape)
            raise ArchitectureError(
                f"layer {i} ({kind}) needs inputs with {need} axes per sample ({AXES.get(need, 'axes')}), "
                f"but gets shape {tuple(x.shape[1:])}; {rank_hint(need, tuple(x.shape[1:]), at_input)}")
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


def use_builder_folders(architectures: Iterable[ArchitectureConfig | Mapping[str, Any]]) -> list[str]:
    """Put each user builder's ``model_dir`` first on ``sys.path`` (the config file's folder when
    the builder's module lies there, as data paths resolve against it; ``ensemble.config``
    records it), so ``model = "mymodels:build"`` beside the config imports on every rank.
    ``architectures``: the config's ``ArchitectureConfig``s, or member specs (plain dicts, as
    they cross MPI). Returns the folders added."""
    added = []
    for arch in architectures:
        if isinstance(arch, Mapping):
            model, folder = arch.get("model"), arch.get("model_dir")
        else:
            model, folder = arch.model, arch.model_dir
        if model and folder and folder not in sys.path:
            check_no_shadowing(folder)
            sys.path.insert(0, folder)
            added.append(folder)
    return added


#: what the run imports, at once or later (TensorFlow after the config): a module of the same
#: name in a builder's folder would be imported instead of it, on every rank
RUN_IMPORTS = frozenset({"ensemble", "evolve", "datafeed", "numpy", "pandas", "sklearn", "scipy", "mpi4py",
                         "deap", "h5py", "pyarrow", "matplotlib", "tensorflow", "keras", "ml_dtypes", "jax",
                         "tomllib", "json", "pickle", "logging", "typing"})


def check_no_shadowing(folder: str) -> None:
    """A builder's folder goes first on ``sys.path``: it must not hold a module (``x.py`` or a
    package ``x/``) named like one the run imports (``RUN_IMPORTS`` or any module already
    imported), which would be imported instead of it. Raises ``ArchitectureError`` naming both."""
    import importlib.util
    path = Path(folder)
    if not path.is_dir():
        return
    imported = {name.partition(".")[0] for name in sys.modules}
    for entry in path.iterdir():
        name = entry.stem if entry.suffix == ".py" else entry.name if (entry / "__init__.py").is_file() else None
        if not name or not name.isidentifier() or name not in RUN_IMPORTS | imported:
            continue
        spec = importlib.util.find_spec(name) if name not in sys.modules else None
        origin = getattr(sys.modules.get(name), "__file__", None) or (spec.origin if spec else None)
        if origin and Path(origin).resolve().is_relative_to(path.resolve()):
            continue                              # it is the folder's own module already
        raise ArchitectureError(f"the builder folder {folder!r} holds {entry.name!r}, which would be imported "
                                f"instead of the module {name!r} the run uses ({origin or 'standard library'}), "
                                "since the folder goes first on sys.path; rename it, or move the builder to a "
                                "folder of its own (`model_dir`)")


def load_builder(ref: str):
    """Import ``package.module:function`` and return the function."""
    mod_name, _, fn_name = ref.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ArchitectureError(f"`model` {ref!r}: cannot import module {mod_name!r} ({exc}); "
                                "put it beside the config file (or set `model_dir`) or on PYTHONPATH") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ArchitectureError(f"`model` {ref!r}: module {mod_name!r} has no function {fn_name!r}")
    return fn


def build_model(spec: dict, input_shape: tuple[int, ...], n_outputs: int, task: str):
    """The uncompiled Keras model a member spec describes."""
    gaussian = gaussian_head(spec.get("loss"), task, bool(spec.get("model")))
    if spec.get("model"):
        model = load_builder(spec["model"])(tuple(input_shape), n_outputs, **spec.get("params", {}))
        if not hasattr(model, "output_shape") or not callable(model):
            raise ArchitectureError(f"`model` {spec['model']!r} returned {type(model).__name__}"
                                    + (" (a function without a return?)" if model is None else "")
                                    + ", not a Keras model: return keras.Model(inputs, outputs)")
        want = get_task(task).output_width(n_outputs, gaussian)
        got = model.output_shape[-1] if hasattr(model, "output_shape") else None
        if got != want:
            raise ArchitectureError(f"`model` {spec['model']!r} must return a Keras model with {want} "
                                    f"outputs per sample (softmax probabilities for classification), "
                                    f"but its output shape is {getattr(model, 'output_shape', None)}")
        return model
    return build_layers(spec["layers"], tuple(input_shape), n_outputs, task, gaussian)


def _where(exc: BaseException) -> str:
    """`` (at file:line in fn)`` of the innermost frame outside Keras/TensorFlow and this package:
    where in a user's builder it went wrong."""
    ours = str(Path(__file__).resolve().parents[1])
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" not in f.filename and not f.filename.startswith(ours)]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno} in {f.name})"


def check_architecture(spec: dict, x: np.ndarray, n_outputs: int, task: str):
    """Build the model ``spec`` describes and run it on ``x`` (a batch of training data), as a
    member would but before any member trains, and return the model. Raises
    ``ArchitectureError`` with the whole reason when it cannot be built or run, when its
    output is not ``(batch, width)``, when it is not finite, or (classification) when its
    rows are not probabilities: a user builder that forgot the softmax fails here, not after
    every member has trained."""
    ref = spec.get("model")
    what = f"`model` {ref!r}" if ref else "the layer list"
    shape = tuple(x.shape[1:])
    try:
        model = build_model(spec, shape, n_outputs, task)
    except ArchitectureError:
        raise
    except Exception as exc:                 # noqa: BLE001 - the user's code: any error, reported whole
        call = f"{ref.partition(':')[2]}({shape}, {n_outputs}" + "".join(
            f", {k}={v!r}" for k, v in spec.get("params", {}).items()) + ")" if ref else "building it"
        raise ArchitectureError(f"{what} failed in {call}: {type(exc).__name__}: {exc}{_where(exc)}") from None
    try:
        out = np.asarray(model(x, training=False), dtype=np.float64)
    except Exception as exc:                 # noqa: BLE001
        raise ArchitectureError(f"{what} fails on a batch of {len(x)} training samples of shape {shape}: "
                                f"{type(exc).__name__}: {exc}{_where(exc)}") from None
    t = get_task(task)
    want = (len(x), t.output_width(n_outputs, gaussian_head(spec.get("loss"), task, bool(ref))))
    if out.shape != want:
        raise ArchitectureError(f"{what} returns shape {out.shape} for a batch of {len(x)} samples, but a "
                                f"{task} member must return {want} (one row of {want[1]} values per sample)")
    if not np.isfinite(out).all():
        raise ArchitectureError(f"{what} returns NaN/inf on a batch of {len(x)} training samples "
                                "before any training; check its layers and initialisers")
    if task == "classification":
        sums = out.sum(axis=1)
        if out.min() < -PROBA_TOL or out.max() > 1 + PROBA_TOL or np.abs(sums - 1).max() > PROBA_TOL:
            end = (f'end the model with a softmax, e.g. keras.layers.Dense({n_outputs}, activation="softmax")'
                   if ref else "the layer list's head should give them; report this as a bug")
            raise ArchitectureError(
                f"{what} must output class probabilities for classification (each row non-negative, "
                f"summing to 1), but on a batch of {len(x)} training samples its outputs lie in "
                f"[{out.min():.4g}, {out.max():.4g}] and its rows sum to {sums.min():.4g} .. {sums.max():.4g}: "
                f"logits, not probabilities? {end}")
    return model


def count_params(model) -> int:
    return int(sum(math.prod(w.shape) for w in model.weights))


def footprint(model) -> dict[str, int | None]:
    """What a model holds per copy, in values: ``params`` (every weight, moving statistics
    included), ``trainable`` (those with a gradient and optimizer state) and
    ``activations``, the input plus every layer's output for one sample: what a batch keeps
    on its way through the model for the backward pass. ``activations`` is None when the
    layers do not say (a subclassed model, or a dimension left open)."""
    import keras
    trainable = int(sum(math.prod(w.shape) for w in model.trainable_weights))
    try:
        values = sum(math.prod(t.shape[1:]) for t in model.inputs)
        for layer in model.layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            out = layer.output
            values += sum(math.prod(t.shape[1:]) for t in (out if isinstance(out, (list, tuple)) else [out]))
        activations: int | None = int(values)
    except (AttributeError, ValueError, TypeError):
        activations = None
    return {"params": count_params(model), "trainable": trainable, "activations": activations}


def make_optimizer(name: str, learning_rate: float):
    """The Keras optimizer a vocabulary name stands for (``ensemble.config.vocabulary.OPTIMIZERS``)."""
    import keras
    if name not in OPTIMIZERS:
        raise ArchitectureError(f"optimizer {name!r} is not one of {', '.join(OPTIMIZERS)}")
    return getattr(keras.optimizers, OPTIMIZERS[name])(learning_rate=learning_rate)


def build_training_state(model, dataset) -> None:
    """Create every variable a compiled ``model``'s first training step would create (the
    optimizer's slots, the loss tracker's and the metrics' state) before ``fit``, from the
    element spec of its training ``dataset``.

    Keras 3 on TensorFlow, outside a distribution strategy, defers building them to the trace
    of the training step; a ``tf.function`` that creates variables on its first trace is
    traced a second time, so every new model paid for two traces of its training step, the
    largest part of a small network's first epoch (1.3-2.2 s on one core of this machine, as
    long as 6-10 of its epochs). Built here, the step is traced once. Nothing is drawn from a
    random generator and every created value is the one the trace would create (zeros, the
    learning rate), so the member trains as it would have. Where Keras lacks the symbolic
    build this uses (``Trainer._symbolic_build``, a private method of Keras 3: 3.15 here), or it
    fails, only the optimizer is built and the first trace builds the rest, as before."""
    symbolic = getattr(model, "_symbolic_build", None)
    if symbolic is not None:
        try:
            symbolic(data_batch=dataset.element_spec)
            return
        except Exception:  # noqa: BLE001 - an older or newer Keras: the first trace builds the rest
            pass
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
