"""Prediction inputs: a file read with the training readers and the run's ``[data]``
settings, checked, reshaped and normalised as in training; targets encoded as the
metrics take them. ``test`` regenerates the run's own test split."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ensemble.inference.load import EnsembleRun, PredictError

log = logging.getLogger(__name__)

TEST_KEYWORD = "test"
_CLI_NAMES = {"`data.source`": "--data", "`data.x`": "--x", "`data.y`": "--y", "`data.label`": "--label",
              "set `data.format`": "pass --format"}


def input_settings(run: EnsembleRun, source: str, fmt: str | None = None, x: str | None = None,
                   y: str | None = None, label: str | None = None) -> dict:
    """The run's ``[data]`` table with ``source`` (and any overrides) for a file to predict on."""
    from datafeed.readers import BUILTINS, SUFFIXES
    data = dict(run.config["data"], source=str(source))
    detectable = source in BUILTINS or Path(source).suffix.lower() in SUFFIXES
    data["format"] = fmt or ("auto" if detectable else data.get("format", "auto"))
    for key, value in (("x", x), ("y", y), ("label", label)):
        if value is not None:
            data[key] = value
    names = run.meta.get("feature_names") or []
    if not data.get("features") and names and Path(source).is_file():
        columns = _table_columns(Path(source), data["format"])
        if columns is not None:                 # a table: its columns are matched by name, never by position
            missing = [n for n in names if n not in columns]
            extra = [c for c in columns if c not in names and c != data.get("label")]
            if missing:
                raise PredictError(
                    f"{source!r} lacks {len(missing)} of the {len(names)} columns the ensemble was trained "
                    f"on: {_some(missing)}" + (f"; it has other columns ({_some(extra)}), which are not "
                                               "used" if extra else "")
                    + "; give the training columns by their names")
            if extra:
                log.info("%s: columns not used by the ensemble, ignored: %s", source, _some(extra))
            data["features"] = list(names)        # picked by name, in training order
    return data


def _some(names: list[str], n: int = 8) -> str:
    return ", ".join(repr(x) for x in names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _table_columns(path: Path, fmt: str) -> list[str] | None:
    """Column names of a CSV/Parquet file without reading its rows; None for other formats."""
    kind = fmt if fmt != "auto" else {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}.get(
        path.suffix.lower())
    if kind == "csv":
        import pandas as pd
        return [str(c) for c in pd.read_csv(path, nrows=0).columns]
    if kind == "parquet":
        import pyarrow.parquet as pq
        return [str(c) for c in pq.read_schema(path).names]
    return None


def prepare_features(run: EnsembleRun, x: np.ndarray, source: str = "the input") -> np.ndarray:
    """Raw features -> the members' input: checked, reshaped to the training shape, normalised."""
    from datafeed.prepare import apply_normalizer
    x = np.asarray(x)
    shape = run.input_shape
    if x.ndim == 0 or len(x) == 0:
        raise PredictError(f"{source} holds no samples (features of shape {list(x.shape)})")
    per_sample = int(np.prod(x.shape[1:]))
    if per_sample != int(np.prod(shape)):
        raise PredictError(f"{source} has {per_sample} features per sample (shape {list(x.shape[1:])}), "
                           f"but the ensemble was trained on {int(np.prod(shape))} (input shape "
                           f"{list(shape)}); give the same features as in training")
    if x.dtype.kind not in "iufb":
        raise PredictError(f"{source}: features must be numeric, but have dtype {x.dtype}")
    bad = ~np.isfinite(x.reshape(len(x), -1).astype(np.float64))
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        raise PredictError(f"{source}: features hold {int(bad.sum())} NaN/inf values (first rows: "
                           f"{rows[:5].tolist()}); clean or impute them first")
    x = np.asarray(x, dtype=np.float32).reshape((len(x), *shape))
    return np.ascontiguousarray(apply_normalizer(x, run.shift, run.scale))


def encode_targets(run: EnsembleRun, y: np.ndarray, n: int, source: str = "the input") -> np.ndarray:
    """Targets as the metrics take them: class indices (names or indices in the file), or floats."""
    y = np.asarray(y)
    if len(y) != n:
        raise PredictError(f"{source}: {len(y)} targets for {n} samples")
    if run.task == "regression":
        if y.dtype.kind not in "iufb" or y.size != n * run.n_outputs:
            raise PredictError(f"{source}: targets must be {run.n_outputs} number(s) per sample, but "
                               f"have shape {list(y.shape)} and dtype {y.dtype}")
        y = y.astype(np.float64)
        return y.reshape(n) if run.n_outputs == 1 else y.reshape(n, run.n_outputs)
    y = y.reshape(n) if y.ndim == 2 and y.shape[1] == 1 else y
    names = run.class_names
    lookup = {name: i for i, name in enumerate(names)}
    values, inverse = np.unique(y, return_inverse=True)
    codes, unknown = [], []
    for v in values:
        key = v.decode() if isinstance(v, bytes) else str(v)
        if key in lookup:
            codes.append(lookup[key])
        elif y.dtype.kind in "iuf" and float(v).is_integer() and 0 <= v < len(names):
            codes.append(int(v))                                  # class indices, as training used them
        else:
            unknown.append(key)
    if unknown:
        raise PredictError(f"{source}: targets hold labels {unknown[:5]} that are not classes of this "
                           f"ensemble ({', '.join(names)})")
    return np.asarray(codes, dtype=np.int64)[inverse.reshape(-1)]


def read_input(run: EnsembleRun, source: str, fmt: str | None = None, x: str | None = None,
               y: str | None = None, label: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Normalised features and encoded targets (None if the file has none) of ``source``.

    ``source == "test"`` regenerates the run's own test split from its config and seed.
    """
    from datafeed.readers import DataError, read_dataset
    if source == TEST_KEYWORD:
        return _test_split(run)
    data = input_settings(run, source, fmt, x, y, label)
    try:
        x_raw, y_raw, _ = read_dataset(data, require_y=False)
    except DataError as exc:
        msg = str(exc)
        for setting, option in _CLI_NAMES.items():
            msg = msg.replace(setting, option)
        raise PredictError(msg) from None
    x_norm = prepare_features(run, x_raw, repr(source))
    return x_norm, None if y_raw is None else encode_targets(run, y_raw, len(x_norm), repr(source))


def _test_split(run: EnsembleRun) -> tuple[np.ndarray, np.ndarray]:
    from datafeed.prepare import prepare
    from datafeed.readers import read_dataset
    data = run.config["data"]
    x, y, info = read_dataset(data)
    arrays, _ = prepare(x, y, info, data, run.config["seed"])
    if arrays["x_mean"].shape != run.shift.shape or not (
            np.allclose(arrays["x_mean"], run.shift) and np.allclose(arrays["x_scale"], run.scale)):
        raise PredictError(f"the training data {data['source']!r} has changed since the run: its "
                           "normalisation differs from normalization.npz, so --data test cannot "
                           "regenerate the run's test split")
    return arrays["x_test"], arrays["y_test"]
