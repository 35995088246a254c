"""The one vocabulary of the project: tasks, optimizers, activations, losses, metrics, layers.

Config validation, the search space (``evolve.space``), training (``ensemble.train``) and
the metrics all read these tables, so a name is either valid everywhere or nowhere. No
TensorFlow here: the names map to Keras classes by name, looked up where models are built.

A layer is a plain dict such as ``{"type": "Dense", "units": 64, "activation": "relu"}``;
``LAYER_PARAMS`` says which types exist and which parameters each takes, so the config
can be validated on every rank before TensorFlow is imported.
"""

from __future__ import annotations

import difflib
from typing import Any

TASKS = ("classification", "regression")
#: the run's modes; each is one module of ``ensemble.modes``, registered under this name
MODES = ("ensemble", "evolve", "pbt", "online")

#: optimizer name in configs -> the ``keras.optimizers`` class it builds
OPTIMIZERS: dict[str, str] = {
    "adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "rmsprop": "RMSprop", "nadam": "Nadam",
    "adagrad": "Adagrad", "adamax": "Adamax", "adadelta": "Adadelta", "lion": "Lion",
}

#: bytes per value of weights, gradients and optimizer state (float32): memory estimates
VALUE_BYTES = 4

#: optimizer name -> state the Keras optimizer keeps per trained weight, in copies of the
#: weights (Adam's two moments; SGD without momentum none), as built with defaults;
#: what ``--check`` counts in a member's memory (a test builds each to confirm)
OPTIMIZER_SLOTS: dict[str, int] = {
    "adam": 2, "adamw": 2, "sgd": 0, "rmsprop": 1, "nadam": 2,
    "adagrad": 1, "adamax": 2, "adadelta": 2, "lion": 1,
}

#: activation names accepted by layers and by the search space (``keras.activations``)
ACTIVATIONS = ("relu", "elu", "gelu", "tanh", "sigmoid", "swish", "silu", "selu",
               "softplus", "leaky_relu", "mish", "linear")

#: ``train.loss``: "auto" is cross-entropy for classification and, for regression, the
#: Gaussian NLL of a mean and a variance head (a user builder's model keeps MSE unless
#: it sets "gaussian_nll": the builder decides its outputs); "mse" is a mean head only
LOSSES = ("auto", "gaussian_nll", "mse")


def gaussian_head(loss: str | None, task: str, user_builder: bool = False) -> bool:
    """Whether a member with ``loss`` predicts a mean and a variance (Gaussian NLL)."""
    if loss == "gaussian_nll":
        return True
    return loss in (None, "auto") and task == "regression" and not user_builder

#: metric name -> (task it scores, True when higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "accuracy": ("classification", True),
    "log_loss": ("classification", False),
    "brier": ("classification", False),
    "ece": ("classification", False),
    "mse": ("regression", False),
    "mae": ("regression", False),
    "nll": ("regression", False),
    "r2": ("regression", True),
}


#: the proper scoring rule ensembles are selected on (``ensemble.selection_metric = "auto"``)
#: and ties between members are broken by: log loss, or the Gaussian NLL when regression
#: members predict a variance (the MSE when they do not)
PROPER_SCORES = {"classification": "log_loss", "regression": "nll"}


def proper_score(task: str, gaussian: bool = True) -> str:
    """The proper scoring rule of ``task``'s predictions (``PROPER_SCORES``)."""
    return "mse" if task == "regression" and not gaussian else PROPER_SCORES[task]


#: ``ensemble.method``: how the ensemble is selected (see ensemble.results.selection)
SELECTION_METHODS = ("auto", "shrunk", "greedy", "bagged", "top_k")

#: ``ensemble.calibration`` -> the tasks it applies to ("auto": regression intervals
#: recalibrated, classification probabilities temperature-scaled when that lowers the log loss
#: of held-out validation rows; see ensemble.task.calibration)
CALIBRATIONS = {"auto": TASKS, "none": TASKS, "temperature": ("classification",),
                "variance_scaling": ("regression",), "conformal": ("regression",)}


def calibration_problem(setting: str, task: str) -> str | None:
    """Why ``ensemble.calibration = setting`` cannot apply to ``task`` (None: it can)."""
    if setting not in CALIBRATIONS:
        return f"`ensemble.calibration` must be one of {', '.join(CALIBRATIONS)}, but got {setting!r}"
    if task in CALIBRATIONS[setting]:
        return None
    fits = ", ".join(f'"{c}"' for c, tasks in CALIBRATIONS.items() if task in tasks)
    what = "rescales class probabilities" if setting == "temperature" else "recalibrates regression intervals"
    return f"`ensemble.calibration = \"{setting}\"` {what}, but this is a {task} task; use {fits}"


def task_metrics(task: str) -> tuple[str, ...]:
    """The metric names that score ``task``'s predictions."""
    return tuple(m for m, (t, _) in METRICS.items() if t == task)


_CONV = {"filters": (int, True), "kernel_size": ((int, list), True), "strides": ((int, list), False),
         "padding": (str, False), "activation": (str, False), "residual": (bool, False)}
_POOL = {"pool_size": ((int, list), False), "strides": ((int, list), False), "padding": (str, False)}

#: type -> {parameter: (python type(s), required)}
LAYER_PARAMS: dict[str, dict[str, tuple[Any, bool]]] = {
    "Dense": {"units": (int, True), "activation": (str, False), "residual": (bool, False)},
    "Conv1D": _CONV, "Conv2D": _CONV, "Conv3D": _CONV,
    "MaxPooling1D": _POOL, "MaxPooling2D": _POOL, "MaxPooling3D": _POOL,
    "AveragePooling1D": _POOL, "AveragePooling2D": _POOL, "AveragePooling3D": _POOL,
    "GlobalAveragePooling1D": {}, "GlobalAveragePooling2D": {}, "GlobalAveragePooling3D": {},
    "GlobalMaxPooling1D": {}, "GlobalMaxPooling2D": {}, "GlobalMaxPooling3D": {},
    "Flatten": {},
    "Dropout": {"rate": (float, True)},
    "BatchNormalization": {"momentum": (float, False), "epsilon": (float, False)},
    "Activation": {"activation": (str, True)},
    "Reshape": {"target_shape": (list, True)},
}

#: what each layer parameter means (docs/config.md); every parameter of ``LAYER_PARAMS`` has one
LAYER_PARAM_DOCS: dict[str, str] = {
    "units": "outputs of the layer",
    "filters": "output channels",
    "kernel_size": "window of the convolution: an integer, or a list with one per spatial axis",
    "strides": "step of the window: an integer or a list per axis (pooling: default the window)",
    "pool_size": "pooling window: an integer or a list per axis (default 2)",
    "padding": "\"same\" (the default here: the output keeps the input's size at stride 1) or \"valid\"",
    "activation": f"one of {', '.join(ACTIVATIONS)} (default: none, linear)",
    "residual": "true: add the layer's input to its output (projected by a 1x1 layer when the shapes differ)",
    "rate": "share of the inputs dropped while training, in [0, 1)",
    "momentum": "momentum of the moving mean and variance",
    "epsilon": "added to the variance, for stability",
    "target_shape": "the shape of one sample afterwards, e.g. [8, 8, 1]",
}

#: how many axes (batch excluded) a layer type needs on its input
INPUT_RANK = {**{f"{k}{d}D": d + 1 for d in (1, 2, 3)
                 for k in ("Conv", "MaxPooling", "AveragePooling", "GlobalAveragePooling",
                           "GlobalMaxPooling")}}


def _edit_distance(a: str, b: str) -> int:
    """Optimal-string-alignment distance: insertions, deletions, substitutions, swaps of neighbours."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def path_component_problem(name: str) -> str | None:
    """Why ``name`` cannot be one file or folder name inside a run (a run's ``name``, an
    architecture's, a member id: ``runs/<name>``, ``models/<arch>-000.keras``), or None:
    never a path that leaves the run. The one rule for the config and the run directory."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0") or name != name.strip():
        return ("must be a plain name (letters, digits, '-', '_', '.'), not empty, '.' or '..', without '/' or "
                "'\\' or surrounding spaces: it becomes a file name inside the run directory")
    return None


def suggest(word: object, options) -> str:
    """A " (did you mean 'x'?)" hint, or an empty string: the fewest typing slips first
    ('adma' -> 'adam', not 'adamax'), else the closest by difflib's ratio."""
    word, options = str(word), [str(o) for o in options]
    by_edits = sorted((_edit_distance(word.lower(), o.lower()), o) for o in options)
    if by_edits and by_edits[0][0] <= max(1, min(2, len(word) // 3)):
        return f" (did you mean '{by_edits[0][1]}'?)"
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if close:
        return f" (did you mean '{close[0]}'?)"
    parts = set(word.lower().split("_")) - {""}          # a word in common ('time_budget' -> 'time_limit'),
    sharing = [o for o in options if parts & set(o.lower().split("_"))]      # when only one option has it
    return f" (did you mean '{sharing[0]}'?)" if len(sharing) == 1 else ""


def check_layer(layer: Any, where: str) -> str | None:
    """Return why ``layer`` is not a valid layer dict, naming ``where`` it sits (every problem of
    it, "; " between them); None if valid. A type misspelt only in case (``"dense"``) is said, and
    the rest is checked as that type's, so a misspelt parameter beside it is said at once."""
    if not isinstance(layer, dict):
        return f"`{where}` must be a table like {{type = \"Dense\", units = 64}}, but got {layer!r}"
    kind, problems = layer.get("type"), []
    if kind not in LAYER_PARAMS:
        problems.append(f"`{where}.type` must be one of {', '.join(sorted(LAYER_PARAMS))}, "
                        f"but got {kind!r}{suggest(kind, LAYER_PARAMS)}")
        kind = next((k for k in LAYER_PARAMS if isinstance(kind, str) and k.lower() == kind.lower()), None)
        if kind is None:
            return problems[0]
    params = LAYER_PARAMS[kind]
    for key, value in layer.items():
        if key == "type":
            continue
        if key not in params:
            allowed = ", ".join(sorted(params)) or "no parameters"
            problems.append(f"`{where}.{key}` is not a parameter of {kind} (allowed: {allowed}){suggest(key, params)}")
            continue
        problems += filter(None, [_layer_value(where, key, value, params[key][0])])
    unknown = [k for k in layer if k != "type" and k not in params]       # said above, each with its nearest
    problems += [f"`{where}` ({kind}) needs `{key}`" for key, (_, required) in params.items()
                 if required and key not in layer and not difflib.get_close_matches(key, unknown, n=1, cutoff=0.6)]
    return "; ".join(problems) or None


def _layer_value(where: str, key: str, value: Any, types: Any) -> str | None:
    """Why ``value`` cannot be the layer parameter ``key`` (of ``types``); None if it can."""
    ok_types = types if isinstance(types, tuple) else (types,)
    if float in ok_types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and bool not in ok_types or not isinstance(value, ok_types):
        names = " or ".join(t.__name__ for t in ok_types)
        return f"`{where}.{key}` must be {names}, but got {value!r}"
    if key in ("units", "filters") and value < 1:
        return f"`{where}.{key}` must be >= 1, but got {value}"
    if key == "rate" and not 0.0 <= value < 1.0:
        return f"`{where}.rate` must be in [0, 1), but got {value}"
    if key == "activation" and value not in ACTIVATIONS:
        return (f"`{where}.activation` must be one of {', '.join(ACTIVATIONS)}, "
                f"but got {value!r}{suggest(value, ACTIVATIONS)}")
    if key == "padding" and value not in ("same", "valid"):
        return f"`{where}.padding` must be \"same\" or \"valid\", but got {value!r}"
    return None


#: what the axes of a sample mean to a layer that needs that many
AXES = {1: "a flat vector", 2: "steps, channels", 3: "height, width, channels", 4: "depth, height, width, channels"}


def _count(shape) -> int:
    """Values per sample of ``shape``."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def rank_hint(need: int, shape: list[int] | tuple[int, ...], at_input: bool) -> str:
    """The fix for a layer that needs ``need`` axes per sample but gets ``shape``: at the
    input, the `data.reshape` that gives them (a channel axis added, or a flat vector of a
    square number of values as a square image); after other layers, a Reshape layer."""
    if not at_input:
        return "add a Reshape (or Flatten) layer before it"
    n = _count(shape)
    target = None
    if need == len(shape) + 1:
        target = [*shape, 1]
    elif need == 2:
        target = [n, 1]
    elif need == 3 and round(n ** 0.5) ** 2 == n:
        target = [round(n ** 0.5)] * 2 + [1]
    if target is not None:
        return f"set `data.reshape = {target}` ({AXES[need]})"
    return f"set `data.reshape` to {need} axes ({AXES.get(need, 'axes')}) whose product is {n}"


#: layers that keep a sample's shape
SHAPE_KEEPING = ("Dropout", "BatchNormalization", "Activation")


def dense_on_values_note(layers: list[dict], input_shape: list[int], where: str) -> str | None:
    """When a layer list's first layer that reads the values is Dense, on samples of several axes
    whose last holds one value (``data.reshape = [8, 8, 1]`` for an MLP): Dense acts on that
    last axis, so each unit sees one pixel at a time, not the sample (a new user's MLP: test mse
    3.5 against the linear baseline's 0.015). None otherwise (Dense on a sequence's channels,
    [steps, channels], is a per-step layer on purpose)."""
    if len(input_shape) < 2 or int(input_shape[-1]) != 1:
        return None
    first = next((i for i, layer in enumerate(layers) if layer["type"] not in SHAPE_KEEPING), None)
    if first is None or layers[first]["type"] != "Dense":
        return None
    return (f"`{where}[{first}]` (Dense) acts on the last axis of samples of shape {list(input_shape)}, one value "
            "at a time: each unit sees a single value, never the sample; put {type = \"Flatten\"} first for an "
            "MLP of every value (or leave `data.reshape` out: it is for convolutions)")


def check_input_rank(layers: list[dict], input_shape: list[int], where: str) -> str | None:
    """Why the layer list cannot take samples of ``input_shape`` (axes per layer, and the values
    a Reshape gets where they are known), or None.

    A cheap, TensorFlow-free walk over the sample's shape (its axes only, after a layer that
    changes sizes: convolutions, pooling), so a Conv2D on flat vectors or a Reshape of 64
    values into [7, 7, 1] is caught on rank 0 before any worker builds a model.
    """
    axes = len(input_shape)
    shape: list[int] | None = list(input_shape)             # None where not known
    for i, layer in enumerate(layers):
        kind = layer["type"]
        need = INPUT_RANK.get(kind)
        at_input = shape == list(input_shape) and all(layer_["type"] in SHAPE_KEEPING for layer_ in layers[:i])
        if need is not None and axes != need:
            return (f"`{where}[{i}]` ({kind}) needs {need} axes per sample ({AXES.get(need, 'axes')}), but "
                    + (f"the data gives shape {list(input_shape)}" if at_input
                       else f"the layers before it give {axes}")
                    + f"; {rank_hint(need, input_shape, at_input)}")
        if kind == "Reshape":
            target = [int(d) for d in layer["target_shape"]]
            if shape is not None:
                n, known = _count(shape), _count(d for d in target if d != -1)
                if (n % known if -1 in target else n != known) if known else False:
                    return (f"`{where}[{i}]` (Reshape) target_shape {target} holds {known} values, but "
                            + (f"each sample has {n} (shape {shape})" if at_input
                               else f"the layers before it give {n} per sample (shape {shape})")
                            + ("; set `data.reshape` instead" if at_input else "")
                            + f"; the product of target_shape must be {n}")
                shape = [n // known if d == -1 else d for d in target]
            else:
                shape = None
            axes = len(target)
        elif kind == "Flatten":
            axes, shape = 1, None if shape is None else [_count(shape)]
        elif kind == "Dense":
            shape = None if shape is None else [*shape[:-1], int(layer.get("units", 1))]   # on the last axis
        elif kind.startswith("Global"):
            axes, shape = 1, None
        elif kind not in SHAPE_KEEPING:
            shape = None
    return None
