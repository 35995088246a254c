"""Prediction inputs: a file (or, in the API, a DataFrame or array) read as in training,
checked, reshaped and normalised as in training; targets encoded as the metrics take
them.

Inputs with names are matched by name, never by position: CSV and Parquet columns, the
fields of a compound (structured) array in HDF5, npz or npy, and a DataFrame (a pandas
HDF5 table is refused: pandas unpickles it, which can run code the file holds). The
training columns (``feature_names`` in the run's data.json) are picked in training
order; a missing one is an error that names it; other columns are ignored and listed in
a warning; ``keep`` columns (IDs, any type) are carried through, in the input's row
order, and may also be features. A run trained on arrays has no names: then a table's
columns other than the label and the kept ones are its features, in file order. Arrays
without names (npy, npz, a plain HDF5 dataset) are checked for dtype and width against
the training input shape (flat or reshaped). ``test`` regenerates the run's own test
split.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from ensemble.inference.load import EnsembleRun, PredictError

if TYPE_CHECKING:
    from ensemble.config import DataConfig

log = logging.getLogger(__name__)

TEST_KEYWORD = "test"
_CLI_NAMES = {"`data.source`": "--data", "`data.x`": "--x", "`data.y`": "--y", "`data.label`": "--label",
              "set `data.format`": "pass --format"}


@dataclass(frozen=True)
class PredictInput:
    """An input ready for the members: normalised features, encoded targets (None without),
    the kept columns' values in the input's row order, and the columns that were ignored."""
    x: np.ndarray
    y: np.ndarray | None = None
    kept: dict[str, np.ndarray] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    index: Any = None                           # a frame's row labels (a Series row: its name), else None


@dataclass(frozen=True)
class Columns:
    """How an input's named columns are used: features (training order), the targets columns
    (one, or one per output; empty if the input has none), the kept columns and the ignored rest."""
    features: list[str]
    labels: list[str]
    keep: list[str]
    ignored: list[str]

    def wanted(self) -> list[str]:
        return list(dict.fromkeys(self.features + self.labels + self.keep))


def parse_keep(keep: str | Iterable[str] | None) -> list[str]:
    """``--keep id --keep site,day`` -> ['id', 'site', 'day'] (comma-separated, repeatable, once each)."""
    if keep is None:
        return []
    items = [keep] if isinstance(keep, str) else list(keep)
    return list(dict.fromkeys(n.strip() for item in items for n in str(item).split(",") if n.strip()))


def _some(names: list[str], n: int = 8) -> str:
    return ", ".join(repr(x) for x in names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def match_columns(run: EnsembleRun, columns: Iterable, source: str, label: str | Iterable[str] | None = None,
                  keep: Iterable[str] = ()) -> Columns:
    """Match an input's column names to the training columns; errors name what is missing.
    The targets (``label``: a column or a list of them) are read only when every one is there."""
    from datafeed.readers import label_columns
    columns = [str(c) for c in columns]
    keep = parse_keep(keep)
    absent = [k for k in keep if k not in columns]
    if absent:
        raise PredictError(f"--keep names {_some(absent)}, but {source} has no such column; its columns "
                           f"are {_some(columns, 20)}")
    labels = label_columns(label) if label is not None else []
    partial = [c for c in labels if c in columns] if not all(c in columns for c in labels) else []
    if partial:                                 # some targets only: nothing to score, and they are no features
        log.warning("%s: has target column(s) %s but not %s: the predictions are not scored (every target column "
                    "is needed)", source, _some(partial), _some([c for c in labels if c not in columns]))
    labels = labels if all(c in columns for c in labels) else []
    from datafeed.readers import table_columns
    names = table_columns(run.meta.get("feature_names") or [], run.meta.get("categories"))
    if names:
        missing = [n for n in names if n not in columns]
        if missing:
            extra = [c for c in columns if c not in names and c not in labels and c not in keep]
            raise PredictError(
                f"{source} lacks {len(missing)} of the {len(names)} columns the ensemble was trained on: "
                f"{_some(missing)}" + (f"; it has other columns ({_some(extra)}), which are not used"
                                       if extra else "") + "; give the training columns by their names")
        features = names                         # picked by name, in training order
    else:
        features = [c for c in columns if c not in labels and c not in keep]
        named = features != [str(i) for i in range(len(features))]      # not a frame's default 0, 1, 2, ...
        (log.warning if named else log.info)(
            "%s: the ensemble was trained on arrays without column names, so the input's %d columns other than "
            "the targets and --keep ones are its features, taken by position in their order, not by name",
            source, len(features))
    used = set(features) | set(keep) | set(labels) | set(partial)
    ignored = [c for c in columns if c not in used]
    if ignored:
        log.warning("%s: %d column(s) not used by the ensemble, ignored: %s", source, len(ignored),
                    _some(ignored))
    return Columns(features, labels, keep, ignored)


def frame_input(run: EnsembleRun, frame, source: str = "the DataFrame", label: str | Iterable[str] | None = None,
                keep: Iterable[str] = (), y: np.ndarray | None = None,
                columns: Columns | None = None) -> PredictInput:
    """A pandas DataFrame -> PredictInput, columns matched by name (``match_columns``).

    ``label`` defaults to the run's ``data.label``; without that column, ``y`` (targets read
    beside the table, e.g. an HDF5 ``data.y`` dataset) is used if given.
    """
    import pandas as pd

    from datafeed.readers import target_values
    label = run.config.data.label if label is None else label
    cols = columns or match_columns(run, frame.columns, source, label, keep)
    by_name = {str(c): c for c in frame.columns}
    if len(frame) == 0:
        raise PredictError(f"{source} has its columns but no rows: nothing to predict")
    categories = run.meta.get("categories") or {}
    text = [f for f in cols.features if f not in categories and not pd.api.types.is_numeric_dtype(frame[by_name[f]])]
    if text:
        from datafeed.readers import odd_cells
        cells = {f: odd_cells(frame[by_name[f]]) for f in text}
        typos = "; ".join(f"column {f!r} holds numbers but for " + ", ".join(
            f"row {r}: {frame[by_name[f]].iloc[r]!r}" for r in cells[f][:3]) for f in text if len(cells[f]))
        bad = [f"{f!r} ({frame[by_name[f]].dtype})" for f in text]
        raise PredictError(f"{source}: " + (typos + " (rows counted from 0 after the header); correct those cells"
                                            if typos else
                                            f"column(s) {', '.join(bad[:8])} are not numeric, but the ensemble takes "
                                            "them as features") + ("" if run.meta.get("feature_names") else
                                                 " (it was trained on arrays without column names, so every "
                                                 "column but the targets and --keep ones is a feature)"))
    x_frame = frame[[by_name[f] for f in cols.features]]
    if categories:                               # one 0/1 input per category, as in training
        from datafeed.readers import one_hot, unseen_note
        x_frame.columns = cols.features
        x_frame, _, unseen = one_hot(x_frame, cols.features, categories)
        if unseen:
            log.warning("%s", unseen_note(unseen, source))
    x_raw = x_frame.to_numpy(dtype=np.float64, na_value=np.nan)
    x = prepare_features(run, x_raw, source)
    if cols.labels:
        y = target_values(frame, [by_name[c] for c in cols.labels])
    kept = {k: frame[by_name[k]].to_numpy() for k in cols.keep}
    return PredictInput(x, scorable_targets(run, y, len(x), source), kept, cols.ignored)


def structured_frame(a: np.ndarray, source: str):
    """A structured (compound) array's fields as DataFrame columns; byte strings decoded."""
    import pandas as pd
    out = {}
    for name in a.dtype.names:
        values = np.asarray(a[name])
        if values.ndim != 1:
            raise PredictError(f"{source}: field {name!r} holds {list(values.shape[1:])} values per sample; "
                               "the fields of a compound dataset must be columns (one value per sample)")
        if values.dtype.kind == "S":
            values = np.char.decode(values, "utf-8")
        elif values.dtype.kind == "O":
            values = np.array([v.decode() if isinstance(v, bytes) else v for v in values], dtype=object)
        out[name] = values
    return pd.DataFrame(out)


def data_input(run: EnsembleRun, data, label: str | None = None, keep: Iterable[str] = (),
               source: str | None = None) -> PredictInput:
    """The API's input: a DataFrame or structured array (matched by name) or a plain array."""
    if hasattr(data, "columns"):
        return replace(frame_input(run, data, source or "the DataFrame", label, keep), index=data.index)
    if isinstance(data, Mapping):                 # a dict of columns, or of one row's values
        import pandas as pd
        frame = pd.DataFrame(data) if any(np.ndim(v) for v in data.values()) else pd.DataFrame([data])
        return replace(frame_input(run, frame, source or "the dict", label, keep), index=frame.index)
    if hasattr(data, "to_frame") and run.meta.get("feature_names"):     # a pandas Series: a column, or a row
        from datafeed.readers import table_columns
        names = table_columns(run.meta["feature_names"], run.meta.get("categories"))
        frame = data.to_frame() if str(data.name) in names else data.to_frame().T.infer_objects()
        return replace(frame_input(run, frame, source or "the Series", label, keep), index=frame.index)
    if not isinstance(data, np.ma.MaskedArray):       # a mask is kept: its entries are missing values
        data = np.asarray(data)
    source = source or "the array"
    if data.dtype.names:
        return frame_input(run, structured_frame(data, source), source, label, keep)
    if parse_keep(keep):
        raise PredictError(f"keep={parse_keep(keep)}: {source} is a plain array without column names, so "
                           "there is no column to keep; pass a DataFrame")
    return PredictInput(prepare_features(run, data, source))


def input_settings(run: EnsembleRun, source: str, fmt: str | None = None, x: str | None = None,
                   y: str | None = None, label: str | None = None) -> DataConfig:
    """The run's ``[data]`` settings with ``source`` (and any overrides) for a file to predict on."""
    from datafeed.readers import BUILTINS, SUFFIXES
    data = run.config.data
    detectable = source in BUILTINS or Path(source).suffix.lower() in SUFFIXES
    changes = {"source": str(source), "format": fmt or ("auto" if detectable else data.format),
               "test_source": "", "val_source": "", "split_column": "", "split_file": ""}   # no split here
    if label is not None and "," in label:                  # --label t1,t2: one column per output
        label = tuple(c.strip() for c in label.split(",") if c.strip())
    changes.update({key: value for key, value in (("x", x), ("y", y), ("label", label)) if value is not None})
    return data.replace(**changes)


def prepare_features(run: EnsembleRun, x: np.ndarray, source: str = "the input", empty: bool = False) -> np.ndarray:
    """Raw features -> the members' input: checked, reshaped to the training shape, normalised.
    ``empty``: no rows is an answer of no rows (a simulation rank with nothing to ask this step),
    not an error.

    A sample may be flat or have the training input shape (size-1 axes aside); any shape of
    the same size when the run reshaped its data (``data.reshape``), whose raw form is not kept.
    """
    from datafeed.prepare import apply_normalizer, feature_array
    masked = isinstance(x, np.ma.MaskedArray)         # netCDF4's arrays: masked entries are no values
    x = np.ma.filled(x.astype(np.float64), np.nan) if masked else np.asarray(x)
    shape = run.input_shape
    width = int(np.prod(shape))
    if (x.ndim == 1 and len(x) == width > 1) or (tuple(x.shape) == tuple(shape) and x[0].size != width):
        x = x[None]                               # one sample, flat or shaped as in training: ens.predict(img)
    if x.ndim == 0 or (len(x) == 0 and not empty):
        raise PredictError(f"{source} holds no samples (features of shape {list(x.shape)})")
    if len(x) == 0 and x.ndim == 1:
        x = x.reshape(0, width)
    if len(x) == 0 and x.dtype.kind in "iufb" and int(np.prod(x.shape[1:])) == width:
        return np.zeros((0, *shape), np.float32)          # normalised nothing: the members' input of no rows
    if x.dtype.kind not in "iufb":
        raise PredictError(f"{source}: features must be numbers, but have dtype {x.dtype}"
                           + ("; a table's columns go in a CSV/Parquet file or a DataFrame, matched by name"
                              if x.dtype.kind in "SUO" else ""))
    sample = tuple(x.shape[1:])
    if int(np.prod(sample)) != width:
        raise PredictError(f"{source} has {int(np.prod(sample))} features per sample (shape {list(sample)}), "
                           f"but the ensemble was trained on {width} (input shape {list(shape)}); give the "
                           "same features as in training")
    squeeze = tuple(d for d in shape if d != 1)
    if sample not in ((width,), shape) and tuple(d for d in sample if d != 1) != squeeze \
            and not run.config.data.reshape:
        raise PredictError(f"{source} has samples of shape {list(sample)}, but the ensemble was trained on "
                           f"input shape {list(shape)}; give samples of that shape or flat ({width} values)")
    impute = run.meta.get("impute")
    if impute:                                   # data.impute: missing values filled as in training
        flat = x.reshape(len(x), -1).astype(np.float64)
        gaps = np.isnan(flat)
        if gaps.any():
            fill = np.asarray(impute["values"], dtype=np.float64)
            x = np.where(gaps, fill[None, :], flat).reshape(x.shape)
            log.warning("%s: %d missing value(s) in %d row(s) filled with their feature's training %s "
                        "(`data.impute`)", source, int(gaps.sum()), int(gaps.any(axis=1).sum()), impute["method"])
    bad = ~np.isfinite(x.reshape(len(x), -1).astype(np.float64))
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        names = [str(n) for n in run.meta.get("feature_names") or []]
        per = bad.sum(axis=0)
        where = (" in column(s) " + ", ".join(f"{names[j]!r} ({int(per[j])})" for j in np.flatnonzero(per)[:8])
                 if len(names) == bad.shape[1] else "")
        raise PredictError(f"{source}: features hold {int(bad.sum())} NaN/inf values"
                           f"{' or masked entries' if masked else ''}{where} (first rows, counted from 0: "
                           f"{rows[:5].tolist()}); clean or impute them first")
    x = feature_array(x).reshape((len(x), *shape))     # float32 only once normalised, as in training
    x = np.ascontiguousarray(apply_normalizer(x, run.shift, run.scale))
    far_note(x, run.config.data.normalize, source)
    return x


#: a normalised feature this many training spreads (standard deviations, or min-max ranges)
#: outside the training data makes its sample "far": the networks extrapolate there
FAR_SPREADS = 10.0


def far_note(x: np.ndarray, normalize: str, source: str) -> None:
    """Warn of samples with a feature ``FAR_SPREADS`` training spreads outside the training
    data (``data.normalize`` "standard": from the mean; "minmax": beyond the range): an
    ensemble of small networks extrapolates there with confidence, so its spread does not
    say that it does not know (inputs x10 got probability 1.0 and no epistemic part)."""
    if normalize not in ("standard", "minmax") or not len(x):
        return
    flat = x.reshape(len(x), -1)
    reach = np.abs(flat) if normalize == "standard" else np.maximum(-flat, flat - 1.0)
    worst = reach.max(axis=1)
    rows = np.flatnonzero(worst > FAR_SPREADS)
    if len(rows):
        log.warning("%s: %d of %d samples have a feature more than %g training %s outside the training data "
                    "(up to %.3g; first rows, counted from 0: %s): the networks extrapolate there, and their "
                    "spread does not say how little they know", source, len(rows), len(x), FAR_SPREADS,
                    "standard deviations" if normalize == "standard" else "ranges", float(worst.max()),
                    rows[:5].tolist())


class UnusableTargets(PredictError):
    """The input's targets cannot be scored (missing values, labels the ensemble does not know);
    predicting needs none, so a file's predictions are written without metrics."""


def _class_key(v) -> str:
    """A target value as a class name: bytes decoded, integral floats (3.0, as pandas reads a
    column with gaps) as integers."""
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def encode_targets(run: EnsembleRun, y: np.ndarray, n: int, source: str = "the input") -> np.ndarray:
    """Targets as the metrics take them: class indices (names or indices in the file), or floats.
    ``UnusableTargets`` for missing values or unknown labels."""
    y = np.asarray(y)
    if y.ndim == 0:                             # one file of one sample (a volume and its scalar target)
        y = y.reshape(1)
    if len(y) != n:
        raise PredictError(f"{source}: {len(y)} targets for {n} samples")
    from datafeed.prepare import missing_rows
    rows = missing_rows(y) if len(y) else []
    if len(rows):
        raise UnusableTargets(f"{source}: targets are missing in {len(rows)} of {n} rows (first rows, counted from 0: "
                              f"{rows[:5].tolist()})")
    if run.task == "regression":
        if y.dtype.kind not in "iufb" or y.size != n * run.n_outputs:
            raise PredictError(f"{source}: targets must be {run.n_outputs} number(s) per sample, but "
                               f"have shape {list(y.shape)} and dtype {y.dtype}")
        y = y.astype(np.float64)
        if not np.isfinite(y).all():
            raise UnusableTargets(f"{source}: targets hold infinite values")
        return y.reshape(n) if run.n_outputs == 1 else y.reshape(n, run.n_outputs)
    from datafeed.prepare import ONE_HOT, plain_labels
    names = run.class_names
    y, form = plain_labels(y, "classification")          # bytes decoded, (n, 1) flat, one-hot to indices
    if form == ONE_HOT and names != [str(i) for i in range(len(names))]:
        raise UnusableTargets(f"{source}: the targets are one-hot rows, but this ensemble's classes are "
                              f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''}: which column is which "
                              "class is not known; pass the class names")
    lookup = {name: i for i, name in enumerate(names)}
    from datafeed.readers import is_number
    numbered = any(is_number(name) for name in names)     # then a number is a class name only
    if not numbered and y.dtype.kind in "iuf" and len(y):
        order = ", ".join(f"{i}: {name!r}" for i, name in enumerate(names[:6])) + (", ..." if len(names) > 6 else "")
        raise UnusableTargets(f"{source}: the targets are numbers, but this ensemble's classes are names "
                              f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}): which number is which "
                              f"class is not known; pass the names (if the numbers count the classes in this "
                              f"order, {order}: np.asarray(ens.class_names)[y])")
    values, inverse = np.unique(y, return_inverse=True)
    codes, unknown = [], []
    for v in values:
        key = _class_key(v)
        if key in lookup or str(v) in lookup:       # str(v): "3.0", as runs trained before named such classes
            codes.append(lookup[key] if key in lookup else lookup[str(v)])
        else:
            unknown.append(key)
    if unknown:
        raise UnusableTargets(f"{source}: targets hold labels {unknown[:5]} that are not classes of this "
                              f"ensemble ({', '.join(names)})")
    return np.asarray(codes, dtype=np.int64)[inverse.reshape(-1)]


def scorable_targets(run: EnsembleRun, y: np.ndarray | None, n: int, source: str) -> np.ndarray | None:
    """``encode_targets`` for an input read to predict on: targets that cannot be scored are
    dropped with a warning (the predictions are still wanted); None without targets."""
    if y is None:
        return None
    try:
        return encode_targets(run, y, n, source)
    except UnusableTargets as exc:
        log.warning("%s: predicting without scoring them", exc)
        return None


def _cli_error(exc: Exception, given: Iterable[str] = ()) -> PredictError:
    """A reader's message in the command line's words (--data, --x, ... for data.source, data.x,
    ...); an option not ``given`` is the run's own setting, and said so ("`data.x` (the run's;
    --x names another)")."""
    msg = str(exc)
    for setting, option in _CLI_NAMES.items():
        if option in given or not option.startswith("--") or option == "--data":
            msg = msg.replace(setting, option)
        else:
            msg = msg.replace(setting, f"{setting} (the run's setting; {option} names another)")
    return PredictError(msg)


def load_input(run: EnsembleRun, source: str, fmt: str | None = None, x: str | None = None,
               y: str | None = None, label: str | None = None, keep: Iterable[str] = ()) -> PredictInput:
    """Read ``source`` for prediction: names matched, ``keep`` columns carried (see the module doc).

    ``source == "test"`` regenerates the run's own test split from its config and seed.
    """
    from datafeed.readers import DataError, check_source_file, detect_format, read_dataset
    keep = parse_keep(keep)
    if source == TEST_KEYWORD:
        if keep:
            raise PredictError(f"--keep {', '.join(keep)}: --data test regenerates the run's test split as "
                               "arrays, without the file's columns; predict on the data file to keep columns")
        return PredictInput(*_test_split(run))
    data = input_settings(run, source, fmt, x, y, label)
    name = repr(source)
    try:
        kind = detect_format(data)
        if kind != "builtin" and not any(c in source for c in "*?["):      # a glob: its reader says
            check_source_file(source)
        if kind in ("csv", "parquet"):
            return _read_table(run, data, kind, keep, name)
        frame = _pandas_hdf5(data, name) if kind == "hdf5" else None
        if frame is not None:
            return frame_input(run, frame, name, data.label, keep)
        x_raw, y_raw, _ = read_dataset(data, require_y=False)
    except DataError as exc:
        given = [option for option, value in (("--x", x), ("--y", y), ("--label", label)) if value is not None]
        raise _cli_error(exc, given) from None
    if x_raw.dtype.names:                        # a compound dataset / structured array: named fields
        return frame_input(run, structured_frame(x_raw, name), name, data.label, keep, y_raw)
    if keep:
        raise PredictError(f"--keep {', '.join(keep)}: {name} holds a plain array ({kind}) without column "
                           "names, so there is no column to keep; use a CSV/Parquet file or a compound "
                           "HDF5 dataset with the ID columns, or join the IDs by row order")
    x_norm = prepare_features(run, x_raw, name)
    return PredictInput(x_norm, scorable_targets(run, y_raw, len(x_norm), name))


def read_input(run: EnsembleRun, source: str, fmt: str | None = None, x: str | None = None,
               y: str | None = None, label: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Normalised features and encoded targets (None if the file has none) of ``source``."""
    got = load_input(run, source, fmt, x, y, label)
    return got.x, got.y


def _read_table(run: EnsembleRun, data: DataConfig, kind: str, keep: list[str], source: str) -> PredictInput:
    """CSV/Parquet: names from the header, then only the columns used; kept CSV columns that are
    not features are read as text, exactly as written (leading zeros stay)."""
    import pandas as pd
    path = data.source
    if kind == "csv":
        from datafeed.readers import csv_options, header_twice, twice_message
        dialect = csv_options(path)
        header = pd.read_csv(path, nrows=0, **dialect).columns
        twice = header_twice(path, dialect)
        if twice:
            raise PredictError(f"{source}: {twice_message(twice)}")
    else:
        import pyarrow.parquet as pq
        header = pq.read_schema(path).names
    cols = match_columns(run, header, source, data.label, keep)
    if kind == "csv":
        text = {k: str for k in cols.keep if k not in cols.features and k not in cols.labels}
        frame = pd.read_csv(path, usecols=cols.wanted(), dtype=text, **dialect)
    else:
        frame = pd.read_parquet(path, columns=cols.wanted())
    return frame_input(run, frame, source, data.label, columns=cols)


def _pandas_hdf5(data: DataConfig, source: str):
    """None for an HDF5 dataset; a pandas HDF5 table (``df.to_hdf``) at ``data.x`` is refused:
    pandas reads its object columns with pickle, which runs code the file holds, and data
    from someone else must never run code here."""
    import h5py
    try:
        with h5py.File(data.source, "r") as f:
            node = f.get(data.x)
            is_pandas = isinstance(node, h5py.Group) and "pandas_type" in node.attrs
    except OSError:
        return None                              # not HDF5: the reader says so
    if not is_pandas:
        return None
    raise PredictError(f"{source}: {data.x!r} is a pandas HDF5 table (written by DataFrame.to_hdf); it is not "
                       "read, because pandas unpickles such tables' object columns, which can run code stored "
                       "in the file. Save the table as Parquet or CSV (df.to_parquet), or the arrays as HDF5 "
                       "datasets with h5py")


def _test_split(run: EnsembleRun) -> tuple[np.ndarray, np.ndarray]:
    """The run's test rows as its members took them; a streamed run's read a chunk at a time
    (only the test rows, never the whole data; ``inference.streamed``)."""
    from ensemble.inference.load import run_arrays
    from ensemble.inference.streamed import is_streamed, split_batches
    if is_streamed(run):
        parts = list(split_batches(run, "test"))
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
    arrays = run_arrays(run.path, run.config, run.meta)
    return arrays["x_test"], arrays["y_test"]
