"""A split the data gives: separate files per split, a split column, or index arrays.

Scientific data often comes with its own split (a published test set, one simulation
held out), and the run must use it as given. ``read_data(data)`` reads a dataset the way
a run does, and is the one reader of it for every step (rank 0, ``--check``,
``inference.load.run_arrays``, the notebook API's ``data(split)``), so they all see the
same rows:

- ``split_from(data) == "random"``: ``data.source`` as read; the split is drawn later
  (``prepare.split_indices``).
- ``"sources"`` (``data.test_source``, optionally ``data.val_source``): one array, the
  training file's rows (``data.source``), then the validation file's, then the test
  file's; each file is checked against the training file (format, columns, sample shape,
  kind of dtype) and its error names its own setting.
- ``"column"`` (``data.split_column``, CSV/Parquet): each row's split from the column's
  values (``COLUMN_VALUES``); the column is not a feature.
- ``"indices"`` (``data.split_file``): integer arrays ``train``, ``test`` and optionally
  ``val`` in an .npz, checked (in range, no repeats, disjoint, not empty).

The given split's ``val`` is None when the data gives none: ``prepare.prepare_with_rows``
then draws validation from the training rows (``data.val_fraction`` of them).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datafeed.readers import DataError, DataSettings, detect_format, one_line, read_dataset, unseen_note

#: how the split is made; recorded in data.json and splits.npz as ``split_from``
SPLIT_FROM = ("random", "sources", "column", "indices")
#: a split column's values (case and surrounding spaces aside) and the split each means
COLUMN_VALUES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
INDEX_ARRAYS = ("train", "val", "test")


@dataclass(frozen=True)
class DataRead:
    """A dataset as a run reads it: features, targets, what the reader learnt, and the
    split the data gives (None: drawn at random; ``val`` None: drawn from ``train``)."""
    x: np.ndarray
    y: np.ndarray | None
    info: dict
    rows: dict[str, np.ndarray | None] | None
    split_from: str


def split_from(data: DataSettings) -> str:
    """Which way the split is made (``SPLIT_FROM``); the config allows one way at a time."""
    if data.split_file:
        return "indices"
    if data.split_column:
        return "column"
    if data.test_source or data.val_source:
        return "sources"
    return "random"


def read_data(data: DataSettings) -> DataRead:
    """Read the ``[data]`` dataset and the split it gives, as a run does (module doc)."""
    way = split_from(data)
    if way == "sources":
        return _read_sources(data)
    if way == "column" and detect_format(data) not in ("csv", "parquet"):
        raise DataError(f"`data.split_column` is for CSV/Parquet sources, but `data.source` {data.source!r} "
                        f"is {detect_format(data)}; give the split as index arrays (`data.split_file`) or as "
                        "separate files (`data.test_source`)")
    x, y, info = read_dataset(data)
    rows: dict[str, np.ndarray | None] | None = None
    if way == "column":
        rows = rows_from_column(info.pop("split_values"), data.split_column)
    elif way == "indices":
        rows = rows_from_file(data.split_file, len(x))
    return DataRead(x, y, info, rows, way)


def rows_from_column(values: np.ndarray, column: str) -> dict[str, np.ndarray | None]:
    """Each split's rows from a split column's values; an unknown value, or no train or no
    test row, is a ``DataError`` naming ``data.split_column`` and the values found."""
    text = np.char.lower(np.char.strip(np.asarray(values).astype(str)))
    found, inverse, counts = np.unique(text, return_inverse=True, return_counts=True)
    unknown = [(str(v), int(c)) for v, c in zip(found, counts) if v not in COLUMN_VALUES]
    if unknown:
        shown = ", ".join(f"{v!r} ({c} rows)" for v, c in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
        raise DataError(f"`data.split_column` {column!r} holds values that name no split: {shown}; each row's "
                        f"value must be one of {', '.join(map(repr, COLUMN_VALUES))}")
    split = np.array([COLUMN_VALUES[str(v)] for v in found])[inverse.reshape(-1)]
    rows = {s: np.flatnonzero(split == s).astype(np.int64) for s in INDEX_ARRAYS}
    sizes = ", ".join(f"{s} {len(r)}" for s, r in rows.items())
    for need in ("train", "test"):
        if not len(rows[need]):
            raise DataError(f"`data.split_column` {column!r} marks no {need} rows (it has {sizes}); mark the "
                            f"{'held-out' if need == 'test' else 'training'} rows {need!r}")
    return {**rows, "val": rows["val"] if len(rows["val"]) else None}


def rows_from_file(path: str, n_rows: int) -> dict[str, np.ndarray | None]:
    """The index arrays of ``data.split_file``, checked against the data's ``n_rows``."""
    where = f"`data.split_file` {path!r}"
    if not Path(path).is_file():
        raise DataError(f"{where} does not exist; it must be an .npz with integer arrays train, test (and "
                        "optionally val), e.g. np.savez(path, train=..., test=...)")
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            raise DataError(f"{where} is a single .npy array, not an .npz of train/val/test index arrays")
        with loaded as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{where} cannot be read as an .npz: {type(exc).__name__}: {one_line(str(exc))}") from None
    extra = sorted(set(arrays) - set(INDEX_ARRAYS))
    missing = [k for k in ("train", "test") if k not in arrays]
    if extra or missing:
        raise DataError(f"{where} holds arrays {', '.join(arrays) or 'none'}, but must hold `train` and `test` "
                        "and optionally `val` (nothing else): integer row indices into `data.source`")
    rows: dict[str, np.ndarray | None] = {"val": None}
    for name, idx in arrays.items():
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu" or idx.ndim != 1:
            hint = "; for a boolean mask m, save np.flatnonzero(m)" if idx.dtype.kind == "b" else ""
            raise DataError(f"{where}: `{name}` must be a 1-D array of integer row indices, but is "
                            f"{idx.dtype} of shape {list(idx.shape)}{hint}")
        if not len(idx):
            raise DataError(f"{where}: `{name}` is empty; every split it gives needs at least one row")
        if idx.min() < 0 or idx.max() >= n_rows:
            bad = idx[(idx < 0) | (idx >= n_rows)]
            raise DataError(f"{where}: `{name}` refers to row {int(bad[0])}, but `data.source` has {n_rows} rows "
                            f"(0..{n_rows - 1}); {len(bad)} index(es) out of range")
        values, counts = np.unique(idx, return_counts=True)
        if (counts > 1).any():
            raise DataError(f"{where}: `{name}` lists row {int(values[counts > 1][0])} more than once "
                            f"({int((counts > 1).sum())} repeated rows); each row belongs to a split once")
        rows[name] = values.astype(np.int64)
    names = [k for k in INDEX_ARRAYS if rows.get(k) is not None]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = np.intersect1d(rows[a], rows[b])       # type: ignore[arg-type]
            if len(both):
                raise DataError(f"{where}: `{a}` and `{b}` overlap in {len(both)} row(s) (first: "
                                f"{both[:5].tolist()}); a row belongs to one split only")
    return rows


class _Source:
    """``data`` with another ``source``: how the other splits' files are read."""

    def __init__(self, data: DataSettings, source: str):
        self._data, self.source = data, source

    def __getattr__(self, name: str) -> Any:
        return getattr(self._data, name)


def _read_sources(data: DataSettings) -> DataRead:
    """Separate files per split, as one array: train rows, then val, then test."""
    fmt = detect_format(data)
    if fmt == "builtin":
        raise DataError(f"`data.test_source` gives the test rows in a file, but `data.source` {data.source!r} is "
                        "a built-in dataset; give the training rows as a file too, or remove `data.test_source`")
    x0, y0, info0 = read_dataset(data)
    x0 = np.asarray(x0)
    xs, ys, sizes = [x0], [np.asarray(y0)], {"train": len(x0)}
    for name, setting, path in (("val", "val_source", data.val_source), ("test", "test_source", data.test_source)):
        if not path:
            continue
        x, y = _read_like(data, fmt, setting, path, x0, y0, info0)
        xs.append(x)
        ys.append(y)
        sizes[name] = len(x)
    start, rows = 0, {}
    for name in INDEX_ARRAYS:
        n = sizes.get(name)
        rows[name] = None if n is None else np.arange(start, start + n, dtype=np.int64)
        start += n or 0
    return DataRead(np.concatenate(xs), np.concatenate(ys), info0, rows, "sources")


def _read_like(data: DataSettings, fmt: str, setting: str, path: str, x0: np.ndarray, y0: np.ndarray,
               info0: dict) -> tuple[np.ndarray, np.ndarray]:
    """One split's own file, read with the training file's settings and checked against it."""
    where = f"`data.{setting}` {path!r}"
    other = _Source(data, path)
    other.categories = info0.get("categories") or {}    # encoded as the training file's (readers.one_hot)
    try:
        other_fmt = detect_format(other)
        if other_fmt == fmt:
            x, y, info = read_dataset(other)
    except DataError as exc:
        msg = str(exc).replace("`data.source`", f"`data.{setting}`", 1)
        raise DataError(msg if path in msg else f"{where}: {msg}") from None
    if other_fmt != fmt:
        raise DataError(f"{where} is {other_fmt}, but `data.source` is {fmt}: give every split in one format")
    x, y = np.asarray(x), np.asarray(y)
    if info.get("unseen_categories"):
        info0.setdefault("unseen_notes", []).append(unseen_note(info["unseen_categories"], where))
    names0, names = info0.get("feature_names"), info.get("feature_names")
    if names0 and names is not None and names != names0:
        missing, extra = [c for c in names0 if c not in names], [c for c in names if c not in names0]
        if missing or extra:
            raise DataError(f"{where} has other columns than `data.source`: missing {missing}, extra {extra}; "
                            "give every split the same columns (or name the features in `data.features`)")
        x = x[:, [names.index(c) for c in names0]]           # the same columns in another order
    for what, a, b in (("one sample", x0, x), ("one target", y0, y)):
        if a.shape[1:] != b.shape[1:]:
            raise DataError(f"{where}: {what} has shape {list(b.shape[1:])}, but in `data.source` "
                            f"{list(a.shape[1:])}; every split needs the same shapes")
        if _kind(a) != _kind(b):
            raise DataError(f"{where}: {'features' if what == 'one sample' else 'targets'} are {b.dtype}, but in "
                            f"`data.source` {a.dtype}; every split needs the same kind of values")
    return x, y


def _kind(a: np.ndarray) -> str:
    """The kind of values, widths aside (float32 and float64 alike; signed and unsigned too)."""
    return {"u": "i", "S": "U", "O": "U"}.get(a.dtype.kind, a.dtype.kind)


def describe_split(meta: dict, data: DataSettings, seed: int) -> str:
    """How the run's split was made, in words, for the console and ``--check``."""
    way = meta.get("split_from", "random")
    stratified = ", stratified" if meta.get("task") == "classification" else ""
    if way == "random":
        return f"drawn at random (seed {seed}{stratified})"
    text = {"sources": "given by separate files (`data.test_source`"
                       + (", `data.val_source`)" if data.val_source else ")"),
            "column": f"given by column {data.split_column!r} (`data.split_column`)",
            "indices": f"given by index arrays in {Path(data.split_file).name} (`data.split_file`)"}[way]
    if meta.get("val_drawn"):
        text += f"; validation drawn from the training rows (`data.val_fraction` {data.val_fraction}, seed {seed}" \
                f"{stratified})"
    return text
