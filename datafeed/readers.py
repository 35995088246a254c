"""Dataset readers: one function per format in a registry, chosen by suffix or ``format``.

A reader takes the ``[data]`` settings (any object with their attributes: the run's
typed ``DataConfig``, or ``DataSettings`` below) and returns ``(x, y, info)``: features as an
array with samples on axis 0, targets with the same length, and a dict of what was
learnt on the way (feature names, class names). Only rank 0 reads.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

Reader = Callable[..., tuple[np.ndarray, np.ndarray | None, dict]]
READERS: dict[str, Reader] = {}
SUFFIXES = {".npz": "npz", ".npy": "npy", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet",
            ".h5": "hdf5", ".hdf5": "hdf5", ".hdf": "hdf5", ".nc": "hdf5", ".nc4": "hdf5"}   # NetCDF-4 is HDF5
BUILTINS = ("digits", "iris", "wine", "breast_cancer", "diabetes", "california_housing_small")


class DataSettings(Protocol):
    """What datafeed reads of the ``[data]`` table, read-only (``ensemble.config.DataConfig``
    has it all; datafeed imports nothing from ``ensemble``)."""

    @property
    def source(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def x(self) -> str: ...
    @property
    def y(self) -> str: ...
    @property
    def label(self) -> str | tuple[Any, ...]: ...
    @property
    def features(self) -> tuple[Any, ...]: ...
    @property
    def task(self) -> str: ...
    @property
    def val_fraction(self) -> float: ...
    @property
    def test_fraction(self) -> float: ...
    @property
    def normalize(self) -> str: ...
    @property
    def impute(self) -> str: ...
    @property
    def reshape(self) -> tuple[Any, ...] | None: ...
    @property
    def test_source(self) -> str: ...
    @property
    def val_source(self) -> str: ...
    @property
    def split_column(self) -> str: ...
    @property
    def split_file(self) -> str: ...


class DataError(ValueError):
    """The data cannot be used as configured; the message names the setting and the fix."""


def reader(name: str) -> Callable[[Reader], Reader]:
    """Register a reader under a format name."""
    def register(fn: Reader) -> Reader:
        READERS[name] = fn
        return fn
    return register


def detect_format(data: DataSettings) -> str:
    """The format named by ``data.format``, else by the file suffix, else a built-in name."""
    src = data.source
    if src not in BUILTINS:
        from datafeed.shards import is_many, list_files
        if is_many(src):
            return list_files(data)[1]
    if data.format != "auto":
        return data.format
    if src in BUILTINS:
        return "builtin"
    fmt = SUFFIXES.get(Path(src).suffix.lower())
    if fmt is None:
        raise DataError(f"`data.source` {src!r} is neither a built-in dataset ({', '.join(BUILTINS)}) "
                        f"nor a file with a known suffix ({', '.join(SUFFIXES)}); set `data.format`")
    return fmt


def read_dataset(data: DataSettings, require_y: bool = True) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """Read the dataset the ``[data]`` table names.

    ``require_y=False`` (prediction inputs) returns ``y = None`` when the file has no targets
    (no ``data.y`` array/dataset/file, no ``data.label`` column) instead of raising.
    """
    from datafeed.shards import is_many, read_all
    if data.source not in BUILTINS and is_many(data.source):
        x, y, info = read_all(data, require_y)
        if require_y and y is None:
            raise DataError(f"`data.y`: the files of `data.source` {data.source!r} hold no targets")
        return x, y, info
    fmt = detect_format(data)
    if fmt != "builtin":
        check_source_file(data.source)
    try:
        x, y, info = READERS[fmt](data) if require_y else READERS[fmt](data, require_y=False)
    except DataError:
        raise
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        raise DataError(f"`data.source` {data.source!r} cannot be read as {fmt}: {type(exc).__name__}: "
                        f"{one_line(str(exc))}; check the file, or set `data.format` if it is not {fmt}") from None
    if len(x) == 0:
        raise DataError(f"`data.source` {data.source!r} holds no samples (0 rows)")
    return x, y, info


def check_source_file(source: str) -> None:
    """``DataError`` for a data file that is not there or holds nothing (0 bytes)."""
    if not Path(source).exists():
        raise DataError(f"`data.source` file {source!r} does not exist{unset_note(source)}")
    if Path(source).is_file() and Path(source).stat().st_size == 0:
        raise DataError(f"`data.source` file {source!r} is empty (0 bytes)")


def duplicate_names(names) -> list[str]:
    """The names given more than once (a header with ``u2`` twice), in their order."""
    seen: set[str] = set()
    return list(dict.fromkeys(n for n in map(str, names) if n in seen or seen.add(n)))


def header_twice(path: str, options: dict) -> list[str]:
    """The names a CSV file's header gives more than once (``options``: ``csv_options``): pandas
    would read the second ``label`` as ``label.1``, a feature holding what the label holds."""
    import pandas as pd
    try:
        names = pd.read_csv(path, nrows=1, header=None, dtype=str, keep_default_na=False, **options).iloc[0]
        return duplicate_names(n for n in names if n != "")     # as written ("01" is not "1"); empty: numbered
    except (pd.errors.EmptyDataError, pd.errors.ParserError, IndexError):
        return []                               # the full read says what is wrong with the file


def is_number(name: str) -> bool:
    """Whether a name (a column's, a class's) reads as a number ("3", "-1", "0.5")."""
    try:
        float(name)
    except ValueError:
        return False
    return True


def twice_message(twice: list[str]) -> str:
    """What ``header_twice``'s names are said with, by training and by ``predict``."""
    return (f"column(s) {', '.join(map(repr, twice))} appear more than once in the header (pandas would read the "
            f"second as '{twice[0]}.1'); give each column its own name"
            + ("; the names are numbers: if the first line is data, add a header line naming the columns"
               if all(map(is_number, twice)) else ""))


def unset_note(path: str) -> str:
    """What a "does not exist" says of a path that still holds ``$NAME`` or ``~`` (the config
    expands them when set: these were not): "" for any other path."""
    names = list(dict.fromkeys(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", path)))
    if names:
        return f" ({', '.join('$' + n for n in names)} not set here: a path's variables are expanded when set)"
    return " (`~` is expanded only at the path's start)" if "~" in path else ""


def one_line(text: str, limit: int = 200) -> str:
    """An error's text as one short line: a message must never echo a file's contents."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit] + " ..."


#: how much of a text file is looked at before pandas parses it
TEXT_PROBE = 1 << 20


def check_text(path: str) -> None:
    """A CSV must be text: no NUL bytes, a first line shorter than ``TEXT_PROBE``, and UTF-8
    (or plain ASCII); told in milliseconds whatever the file's size."""
    with open(path, "rb") as fh:
        head = fh.read(TEXT_PROBE)
    if b"\0" in head:
        raise DataError(f"`data.source` {path!r} is not a text CSV: it holds NUL bytes (a binary or "
                        "zero-filled file); check the file, or set `data.format`")
    if b"\n" not in head and len(head) == TEXT_PROBE:
        raise DataError(f"`data.source` {path!r}: its first line is longer than {TEXT_PROBE // 2 ** 20} MiB, "
                        "which is not a CSV header; check the file")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(head) < TEXT_PROBE or exc.start < len(head) - 4:   # not a character cut at the probe's end
            raise DataError(f"`data.source` {path!r} is not UTF-8 text (byte {exc.start} is "
                            f"0x{head[exc.start]:02x}); save it as UTF-8 (e.g. from latin-1: "
                            "iconv -f latin1 -t utf-8)") from None


#: comment lines a CSV may begin with (an instrument's preamble) before its header
CSV_COMMENT = "#"


def csv_options(path: str) -> dict:
    """``pd.read_csv`` options for the file's dialect, from its first lines: comment lines
    (``#``) before the header skipped; the separator (a comma; else the semicolon, tab or bar
    the header holds) and, for semicolons whose numbers carry a decimal comma (1,5;2,25:
    spreadsheets in many locales), ``decimal=","``; spaces after a separator (``a, b, c``)
    are no part of a name or value."""
    skip = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        header = fh.readline()
        while header.startswith(CSV_COMMENT):
            skip, header = skip + 1, fh.readline()
        first = fh.readline()
    out: dict = {"skipinitialspace": True, **({"skiprows": skip} if skip else {})}
    if "," in header:
        return out
    sep = next((c for c in (";", "\t", "|") if c in header), None)
    if sep is None:
        return out
    return {**out, "sep": sep, **({"decimal": ","} if sep == ";" and "," in first and "." not in first else {})}


@reader("builtin")
def read_builtin(data: DataSettings, require_y: bool = True) -> tuple[np.ndarray, np.ndarray, dict]:
    from sklearn import datasets
    name = data.source
    if name not in BUILTINS:
        raise DataError(f"`data.source` {name!r} is not a built-in dataset; use one of {', '.join(BUILTINS)}")
    if name == "california_housing_small":     # no download: a synthetic regression stand-in
        x, y = datasets.make_friedman1(n_samples=2000, n_features=8, noise=0.5, random_state=0)
        return x, y, {"task": "regression"}
    bunch = getattr(datasets, f"load_{name}")()
    info = {"feature_names": [str(f) for f in getattr(bunch, "feature_names", [])]}
    if name != "diabetes":
        info["class_names"] = [str(c) for c in getattr(bunch, "target_names", [])]
    return bunch.data, bunch.target, info


@reader("npz")
def read_npz(data: DataSettings, require_y: bool = True) -> tuple[np.ndarray, np.ndarray | None, dict]:
    with np.load(data.source, allow_pickle=False) as f:
        keys = ("x", "y") if require_y or data.y in f.files else ("x",)
        for key in keys:
            if getattr(data, key) not in f.files:
                raise DataError(f"`data.{key}` names array {getattr(data, key)!r}, but {data.source!r} "
                                f"holds {', '.join(f.files)}")
        return f[data.x], (f[data.y] if len(keys) > 1 else None), {}


@reader("npy")
def read_npy(data: DataSettings, require_y: bool = True) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """``source`` is the features file; ``y`` names the targets file (relative to it)."""
    src = Path(data.source)
    ypath = Path(data.y) if Path(data.y).is_absolute() else src.parent / data.y
    if not ypath.suffix:
        ypath = ypath.with_suffix(".npy")
    if not ypath.exists() and not require_y:
        return np.load(src, mmap_mode="r"), None, {}
    if not ypath.exists():
        raise DataError(f"`data.y` must name the targets .npy file next to {str(src)!r}, "
                        f"but {str(ypath)!r} does not exist")
    return np.load(src, mmap_mode="r"), np.load(ypath, mmap_mode="r"), {}


#: the attributes that mark a dataset's missing values (NetCDF and the CF conventions): a value
#: equal to one is no measurement (NetCDF's default float fill is 9.97e36)
FILL_ATTRIBUTES = ("_FillValue", "missing_value")


def hdf5_values(dataset, selection: Any = ()) -> np.ndarray:
    """``dataset[selection]`` of an HDF5/NetCDF dataset, its fill values (``FILL_ATTRIBUTES``)
    made NaN (integers become float64), so that they are found as missing, not learnt as
    numbers: 1% of pixels at 9.97e36 took a run from accuracy 1.0 to 0.32, unsaid."""
    values = np.asarray(dataset[selection])
    marks = [np.asarray(dataset.attrs[a]).ravel() for a in FILL_ATTRIBUTES if a in dataset.attrs]
    if not marks or values.dtype.kind not in "iuf":
        return values
    hit = np.isin(values, np.concatenate(marks))
    if hit.any():
        values = values.astype(values.dtype if values.dtype.kind == "f" else np.float64)
        values[hit] = np.nan
    return values


@reader("hdf5")
def read_hdf5(data: DataSettings, require_y: bool = True) -> tuple[np.ndarray, np.ndarray | None, dict]:
    import h5py
    with h5py.File(data.source, "r") as f:
        out = []
        keys = ("x", "y") if require_y or data.y in f else ("x",)
        for key in keys:
            if getattr(data, key) not in f:
                names: list[str] = []
                f.visit(lambda n, names=names, f=f: names.append("/" + n) if isinstance(f[n], h5py.Dataset) else None)
                raise DataError(f"`data.{key}` names HDF5 dataset {getattr(data, key)!r}, but "
                                f"{data.source!r} holds {', '.join(names) or 'no datasets'}")
            out.append(hdf5_values(f[getattr(data, key)]))
    return out[0], (out[1] if len(out) > 1 else None), {}


def label_columns(label: str | Iterable[str]) -> list[str]:
    """``data.label`` as a list of column names: one target column, or several (a regression
    with one output per column)."""
    return [label] if isinstance(label, str) else [str(c) for c in label]


def feature_columns(data: DataSettings, columns: Iterable) -> list:
    """A table's feature columns: ``data.features``, else every column of ``columns`` but the
    label(s), the split column and ``data.exclude``; an excluded column the table lacks is an
    error naming it."""
    columns = list(columns)
    labels = label_columns(data.label)
    split = getattr(data, "split_column", "")
    if data.features:
        twice = duplicate_names(data.features)
        if twice:
            raise DataError(f"`data.features` lists {', '.join(map(repr, twice))} more than once; list each column "
                            "once")
        both = [c for c in data.features if c in labels or (split and c == split)]
        if both:
            key = "`data.label`" if both[0] in labels else "`data.split_column`"
            raise DataError(f"`data.features` lists {', '.join(map(repr, both))}, which {key} also names: the networks "
                            "would be given the answer (or the split) as an input; take it out of `data.features`")
        return list(data.features)
    exclude = list(getattr(data, "exclude", ()) or ())
    absent = [c for c in exclude if c not in columns]
    if absent:
        raise DataError(f"`data.exclude` names column(s) {', '.join(map(repr, absent))} that the table does not have; "
                        f"it has {one_line(', '.join(map(repr, columns)))}")
    drop = {*labels, split, *exclude}
    out = [c for c in columns if c not in drop]
    if not out and columns:
        raise DataError(f"no feature column is left: the table's columns {one_line(', '.join(map(repr, columns)))} are "
                        "all the label, the split column or `data.exclude`; keep at least one feature")
    return out


#: names of columns that number rows or samples rather than measure them (case aside)
ID_NAMES = re.compile(r"(unnamed: ?\d+|index|idx|id|row|rowid|row_id|sample|sample_?id|.*[_ ]id|id[_ ].*)",
                      re.IGNORECASE)
ID_MIN_ROWS = 20            # a ramp of fewer rows than this may be a real feature


def id_like_columns(frame, features: list) -> list[str]:
    """Feature columns that look like row numbers or identifiers, not measurements: named so
    (``Unnamed: 0`` is the index ``DataFrame.to_csv`` writes; ``id``, ``sample_id``, ...) or
    whole numbers counting up by one from the first row. A network given one learns the file's
    order (a leak when the file is sorted by label) and predicts new rows by their number."""
    import pandas as pd
    out = []
    for c in features:
        values = frame[c]
        named = ID_NAMES.fullmatch(str(c).strip()) is not None
        ramp = False
        if len(values) >= ID_MIN_ROWS and pd.api.types.is_integer_dtype(values.dtype):
            v = values.to_numpy(dtype=np.float64, na_value=np.nan)      # nullable integers too
            ramp = bool((np.diff(v) == 1).all())
        if (named and values.nunique() == len(values)) or ramp:
            out.append(str(c))
    return out


def id_like_note(columns: list[str]) -> str:
    """What ``check`` and the run say of ``id_like_columns``."""
    listed = ", ".join(f'"{c}"' for c in columns)
    return (f"feature column(s) {listed} look like row numbers or identifiers, not measurements (a saved index, "
            "an ID, whole numbers counting up by one from the first row): a network learns the file's order from "
            "them (a leak when the file is sorted by label) and predicts new rows by their number; leave them out "
            f"with `data.exclude = [{listed}]`, or ignore this if they are measurements")


def target_values(frame, columns: list) -> np.ndarray:
    """The targets in ``columns`` of a DataFrame: (n,) for one column, (n, k) for several."""
    return (frame[columns[0]] if len(columns) == 1 else frame[columns]).to_numpy()


def odd_cells(values) -> np.ndarray:
    """Rows of a text column whose cells are not numbers, when they are few (a typo, a unit, a
    stray "n/a" in a column of numbers); empty when the column is text throughout."""
    import pandas as pd
    odd = pd.to_numeric(values.astype(str).str.strip(), errors="coerce").isna() & values.notna()
    return np.nonzero(odd.to_numpy())[0] if 0 < odd.sum() <= max(1, len(values) // 10) else np.zeros(0, int)


def _quoted(name: Any) -> str:
    """A column name as a TOML string."""
    return '"' + str(name).replace("\\", "\\\\").replace('"', '\\"') + '"'


def not_numeric(frame, columns: list) -> str:
    """Why ``columns`` of ``frame`` cannot be features: a column of numbers with a few cells that
    are not is named with those cells' rows and values; columns of text with too many distinct
    values to be categories (dates, free text, identifiers) are to be dropped or encoded."""
    parts, text = [], []
    for c in columns:
        values = frame[c]
        rows = odd_cells(values)
        if len(rows):
            cells = ", ".join(f"row {r}: {values.iloc[r]!r}" for r in rows[:3])
            parts.append(f"column {c!r} holds numbers but for {len(rows)} cell(s) that are not ({cells}"
                         f"{', ...' if len(rows) > 3 else ''}; rows counted from 0 after the header): "
                         "correct those cells")
        else:
            text.append(c)
    if text:
        example = next(iter(frame[text[0]].dropna()), None)
        counts = ", ".join(f"{c!r} {frame[c].nunique()}" for c in text[:4])
        parts.append(f"feature columns {text} are not numeric (such as {example!r} in {text[0]!r}) and have too "
                     f"many distinct values to be categories (distinct values: {counts}; at most "
                     f"{MAX_CATEGORIES}, each in 2 rows or more on average); leave them out with "
                     f"`data.exclude = [{', '.join(map(_quoted, text))}]`, or encode them as numbers "
                     "(a date as days since a start, say)")
    return "; ".join(parts)


#: a text column with at most this many distinct values (and at least two rows per value on
#: average) is a categorical feature: one 0/1 input per value (``one_hot``)
MAX_CATEGORIES = 32
#: the input of value v of categorical column c is named "c=v" (``data.json`` ``feature_names``)
CATEGORY_SEP = "="


def categorical_columns(frame, columns: list) -> dict[str, list[str]]:
    """The text ``columns`` of ``frame`` that are categories (``MAX_CATEGORIES``), each with its
    values as text, sorted; a column of numbers with a few odd cells is none (``not_numeric``)."""
    out = {}
    for c in columns:
        values = frame[c].dropna().astype(str).str.strip()
        distinct = sorted(set(values) - {""})
        if distinct and len(distinct) <= MAX_CATEGORIES and 2 * len(distinct) <= len(values) \
                and not len(odd_cells(frame[c])):
            out[str(c)] = distinct
    return out


def category_inputs(column: str, values: Iterable[str]) -> list[str]:
    """The names of a categorical column's inputs, one per value."""
    return [f"{column}{CATEGORY_SEP}{v}" for v in values]


def one_hot(frame, features: list, categories: dict[str, list[str]]) -> tuple[Any, list[str], dict[str, list[str]]]:
    """``frame[features]`` with each column of ``categories`` replaced, where it stood, by a 0/1
    column per value (``category_inputs``); a missing cell is 0 in all of them, and so is a value
    the categories lack (returned, per column, sorted: a value training never saw).
    Returns (the frame, its column names, the unseen values)."""
    import pandas as pd
    parts, names, unseen = {}, [], {}
    for c in features:
        if str(c) not in categories:
            parts[str(c)] = frame[c]
            names.append(str(c))
            continue
        values = frame[c].astype("string").str.strip()
        known = categories[str(c)]
        new = sorted(set(values.dropna()) - set(known) - {""})
        if new:
            unseen[str(c)] = new
        for v, name in zip(known, category_inputs(str(c), known)):
            parts[name] = (values == v).fillna(False).to_numpy(dtype=np.float64)
            names.append(name)
    return pd.DataFrame(parts, index=frame.index), names, unseen


def table_columns(feature_names: Iterable[str], categories: dict[str, list[str]] | None) -> list[str]:
    """The table columns a run's inputs came from: ``feature_names`` with each categorical
    column's inputs folded back into the column, where its first input stands."""
    inputs = {name: c for c, values in (categories or {}).items() for name in category_inputs(c, values)}
    return list(dict.fromkeys(inputs.get(n, n) for n in map(str, feature_names)))


def categories_note(categories: dict[str, list[str]]) -> str:
    """What ``check`` and the run say of the categorical columns they encoded."""
    listed = "; ".join(f"{c!r}: {len(v)} ({', '.join(map(repr, v[:5]))}{', ...' if len(v) > 5 else ''})"
                       for c, v in categories.items())
    return (f"text column(s) read as categories, one 0/1 input per value (a missing cell: all 0): {listed}; "
            "a value not seen in training is all 0 when predicting (warned)")


def unseen_note(unseen: dict[str, list[str]], where: str) -> str:
    """What is said of categorical values that training never saw (all 0 in their inputs)."""
    listed = "; ".join(f"{c!r}: {', '.join(map(repr, v[:5]))}{', ...' if len(v) > 5 else ''}"
                       for c, v in unseen.items())
    return (f"{where} holds values the training rows' categories lack ({listed}): their inputs are all 0, "
            "as for a missing cell; the networks know nothing of them")


def _from_frame(frame, data: DataSettings, require_y: bool = True) -> tuple[np.ndarray, np.ndarray | None, dict]:
    labels, split = label_columns(data.label), data.split_column
    absent = [c for c in labels if c not in frame.columns]
    has_label = not absent
    if require_y and not has_label:
        near = [repr(c) for c in frame.columns if str(c).strip().lower() in {a.strip().lower() for a in absent}]
        how = "spaces or case differ"
        if not near:                              # a misspelling: "modulos" for "modulus"
            import difflib
            columns = {str(c).lower(): str(c) for c in frame.columns}
            near = [repr(columns[m]) for a in absent for m in difflib.get_close_matches(a.lower(), columns, 1, 0.75)]
            how = "did you mean it?"
        raise DataError(f"`data.label` names column{'s' if len(absent) > 1 else ''} {', '.join(map(repr, absent))}, "
                        f"but the file has columns {one_line(', '.join(map(repr, frame.columns)))}"
                        + (f"; the nearest is {', '.join(near)} ({how})" if near else ""))
    if require_y and split and split not in frame.columns:
        raise DataError(f"`data.split_column` names column {split!r}, but {data.source!r} has columns "
                        f"{one_line(', '.join(map(str, frame.columns)))}; name the column that says train/val/test")
    features = feature_columns(data, frame.columns)
    missing = [c for c in features if c not in frame.columns]
    if missing:
        raise DataError(f"`data.features` names columns {missing} that the file does not have; "
                        f"it has {', '.join(map(str, frame.columns))}")
    x = frame[features]
    import pandas as pd
    bad = [c for c in features if not pd.api.types.is_numeric_dtype(x[c].dtype)]    # bool and nullable too
    known = getattr(data, "categories", None)         # another split's file: the training file's categories
    categories = categorical_columns(x, bad) if known is None else \
        {str(c): known[str(c)] for c in features if str(c) in known}
    bad = [c for c in bad if str(c) not in categories]
    if bad:
        raise DataError(not_numeric(x, bad))
    names, unseen = list(map(str, features)), {}
    if categories:
        x, names, unseen = one_hot(x, features, categories)
    y = target_values(frame, labels) if has_label else None
    info: dict = {"feature_names": names}
    if categories:
        info["categories"] = categories
    if unseen:
        info["unseen_categories"] = unseen
    if not data.features and require_y:
        info["id_like"] = id_like_columns(x, names)     # said by check and the run (``id_like_note``)
    if split and split in frame.columns:
        info["split_values"] = frame[split].to_numpy()      # each row's split, read by datafeed.splits
    return x.to_numpy(dtype=np.float64, na_value=np.nan), y, info      # float32 only once normalised


@reader("csv")
def read_csv(data: DataSettings, require_y: bool = True) -> tuple[np.ndarray, np.ndarray | None, dict]:
    import pandas as pd
    check_text(data.source)
    options = csv_options(data.source)
    twice = header_twice(data.source, options)
    if twice:
        raise DataError(f"`data.source` {data.source!r}: {twice_message(twice)}")
    try:
        frame = pd.read_csv(data.source, **options)
    except pd.errors.EmptyDataError:
        raise DataError(f"`data.source` {data.source!r} holds no columns (an empty CSV)") from None
    except pd.errors.ParserError as exc:
        raise DataError(f"`data.source` {data.source!r} is not a well-formed CSV: {one_line(str(exc))}") from None
    if len(frame) == 0:
        raise DataError(f"`data.source` {data.source!r} has a header ({one_line(', '.join(map(str, frame.columns)))}) "
                        "but no data rows")
    return _from_frame(frame, data, require_y)


@reader("parquet")
def read_parquet(data: DataSettings, require_y: bool = True) -> tuple[np.ndarray, np.ndarray | None, dict]:
    import pandas as pd
    return _from_frame(pd.read_parquet(data.source), data, require_y)
