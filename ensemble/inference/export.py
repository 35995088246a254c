"""The whole ensemble as ONE model: a stock ``.keras`` file, a TensorFlow SavedModel or ONNX.

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

``export_model(run, path, fmt)`` also writes the ``saved_model`` and ``onnx`` formats
(``ensemble.inference.serving``): there the calibration is inside the graph too, and the
outputs are every per-sample quantity ``ensemble.predict`` gives (docs/export.md).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ensemble.inference.load import EnsembleRun, PredictError, load_run
from ensemble.results.rundir import RunDirectory, atomic_write
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


def raw_input_shape(run: EnsembleRun) -> tuple[int, ...]:
    """One sample's shape as the exported model takes it: the training file's, flat when
    ``data.reshape`` was set."""
    shape = run.input_shape
    return (int(np.prod(shape)),) if run.config.data.reshape else shape


def normalized_input(run: EnsembleRun):
    """(the raw ``features`` input, the members' input): flattened, normalised with the
    run's shift/scale and reshaped to the training shape, in stock layers."""
    import keras

    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(1)
    shape, raw_shape = run.input_shape, raw_input_shape(run)
    inputs = keras.Input(shape=raw_shape, name="features")
    z = inputs if len(raw_shape) == 1 else keras.layers.Flatten(name="flatten_features")(inputs)
    z = _normalize(z, run.shift, run.scale)
    if len(shape) != 1:
        z = keras.layers.Reshape(shape, name="sample_shape")(z)
    return inputs, z


def build_ensemble_model(run: EnsembleRun):
    """The Keras model: raw features -> normalisation -> members -> weighted combination."""
    import keras
    inputs, z = normalized_input(run)
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
    safe_destination(path, "keras", run.path if isinstance(run, EnsembleRun) else run)   # predict --export too
    if isinstance(run, (str, Path)):
        run = load_run(run)
    model = build_ensemble_model(run)
    temperature = (run.calibration or {}).get("temperature", 1.0)
    if run.task == "classification" and temperature != 1.0:
        log.warning(f"{path}: the model gives the averaged probabilities before the run's temperature "
                    f"(T = {temperature:.4g}); predict applies it: softmax(log(p) / T)")
    return atomic_write(path, model.save)           # never a half-written model at the final path


#: ``export_model``'s formats: what each writes and the extra it needs (None: the base install)
FORMATS = {"keras": None, "saved_model": None, "onnx": "onnx"}


def _need(module: str, extra: str, what: str) -> None:
    import importlib.util
    if importlib.util.find_spec(module) is None:
        raise PredictError(f"{what} needs the Python package {module!r}, which is not installed: "
                           f'pip install "mpi-ensemble[{extra}]"')


#: what a SavedModel directory holds (Keras's ``model.export``): one that holds anything else is not replaced
SAVED_MODEL_ENTRIES = frozenset({"saved_model.pb", "variables", "assets", "fingerprint.pb", "keras_metadata.pb"})


def safe_destination(path: Path, fmt: str, run_dir: str | Path) -> None:
    """Refuse a destination whose writing would destroy what it holds: the run directory or a folder
    above it or above the working directory, anything inside the run directory but its own
    export of ``fmt`` (``RunDirectory.EXPORTS``: a member's model written over damages the run), a
    symbolic link, a folder that is not a SavedModel written before (a SavedModel replaces its
    directory whole; an empty one may take it), a folder where a file goes. ``PredictError``
    says which and what to give instead."""
    path = Path(os.path.abspath(path))
    run_dir, here = Path(os.path.realpath(run_dir)), Path(os.path.realpath(Path.cwd()))
    real = Path(os.path.realpath(path))                 # a link is judged by what it names
    default = run_dir / RunDirectory.EXPORTS[fmt]
    for inside, what in ((run_dir, "the run directory"), (here, "the working directory")):
        if real == inside or real in inside.parents:
            raise PredictError(f"{str(path)!r} is {what} or a folder holding it: exporting there would replace "
                               f"it; give a new path, e.g. {str(default)!r}")
    if run_dir in real.parents and real != default:
        raise PredictError(f"{str(path)!r} is inside the run directory, whose files are the run's own (a member's "
                           f"model written over is lost): export to {str(default)!r}, or outside the run directory")
    if path.is_symlink():
        raise PredictError(f"{str(path)!r} is a symbolic link; give the path itself to write to")
    if not path.exists():
        return
    if fmt == "saved_model":
        entries = {p.name for p in path.iterdir()} if path.is_dir() else None
        if entries is None or (entries and ("saved_model.pb" not in entries or entries - SAVED_MODEL_ENTRIES)):
            raise PredictError(f"{str(path)!r} exists and is not a SavedModel written before (a SavedModel "
                               "replaces its whole directory, and this one holds other things): give a new path")
    elif path.is_dir():
        raise PredictError(f"{str(path)!r} is a folder; give the {fmt} file to write, e.g. "
                           f"{str(path / RunDirectory.EXPORTS[fmt])!r}")


def export_model(run: EnsembleRun | str | Path, path: str | Path, fmt: str = "keras") -> Path:
    """Write the ensemble of ``run`` to ``path`` as ``fmt``: "keras" (the stock ``.keras``
    file, ``export_ensemble``), "saved_model" (a TensorFlow SavedModel directory) or "onnx"
    (one ``.onnx`` file). The last two are the serving graph (``inference.serving``):
    calibration inside, every per-sample output named; written with Keras's own
    ``model.export``. Inputs, outputs and their shapes: docs/export.md."""
    if fmt not in FORMATS:
        raise PredictError(f"--format must be one of {', '.join(FORMATS)}, but got {fmt!r}")
    path = Path(os.path.abspath(path))                 # "." and ".." named: checked as the folders they are
    safe_destination(path, fmt, run.path if isinstance(run, EnsembleRun) else run)
    path.parent.mkdir(parents=True, exist_ok=True)     # every format makes the folder it goes in
    if fmt == "keras":
        return export_ensemble(run, path)
    if fmt == "onnx":
        if path.suffix != ".onnx":
            raise PredictError(f"an ONNX export must be a .onnx file, but got {str(path)!r}")
        _need("tf2onnx", "onnx", "--format onnx")
        _need("onnx", "onnx", "--format onnx")
    elif path.suffix:
        raise PredictError(f"a SavedModel is a directory: give a path without a suffix, not {str(path)!r}")
    if isinstance(run, (str, Path)):
        run = load_run(run)
    from ensemble.inference.serving import build_serving_model
    model = build_serving_model(run)
    keras_format = "tf_saved_model" if fmt == "saved_model" else "onnx"

    def write(target: Path) -> None:
        import warnings

        import tensorflow as tf
        spec = [tf.TensorSpec((None, *raw_input_shape(run)), tf.float32, name="features")]
        with warnings.catch_warnings():              # Keras's tf2onnx patch probing numpy: not the user's
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"keras\.src\.export")
            model.export(str(target), format=keras_format, verbose=False, input_signature=spec)

    if fmt == "onnx":
        return atomic_write(path, write)
    # a directory: written beside, then renamed; in a folder of its own, never a user's
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.part-", dir=path.parent))
    try:
        shutil.rmtree(tmp)                              # Keras's export makes the folder itself
        write(tmp)
        if path.exists():
            shutil.rmtree(path)                         # an earlier SavedModel (safe_destination) or an empty folder
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
