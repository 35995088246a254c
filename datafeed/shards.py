"""Many files as one dataset: ``data.source`` a directory or a glob of shards.

Each shard holds samples along its first axis (``x`` and ``y`` as for one file: arrays in an
.npz, datasets in an HDF5/NetCDF-4 file, columns of a Parquet table, a features .npy with
its targets .npy beside it), or exactly one sample (a volume per file: ``y`` a scalar, or
``data.sample_per_file = true``). Shards are taken in sorted path order, so the rows of the
dataset are the first file's, then the second's, and so on; that order is what a split's
row indices (``data.split_file``, ``splits.npz``) refer to.

``scan(data)`` reads only each shard's metadata (header, shapes, dtypes, row count) and
checks that every shard agrees with the first, naming the file and the setting when one
does not. ``read_rows(shards, i, start, stop)`` reads rows of one shard; ``read_all`` the
whole dataset (the in-memory path), ``datafeed.streaming`` a chunk at a time.

npy shards: the features files are those whose name starts with ``data.x`` (``x_000.npy``),
and each one's targets file is the same name with ``data.y`` in its place (``y_000.npy``).
"""

from __future__ import annotations

import glob as globlib
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datafeed.readers import SUFFIXES, DataError, DataSettings, feature_columns, hdf5_values, one_line, unset_note

#: the formats a shard may have (NetCDF-4 files are HDF5 files)
SHARD_FORMATS = ("npz", "npy", "hdf5", "parquet")
SHARD_SUFFIXES = {k: v for k, v in SUFFIXES.items() if v in SHARD_FORMATS}


def is_many(source: str) -> bool:
    """Whether ``data.source`` names many files: an existing directory or a glob pattern."""
    return bool(source) and (Path(source).is_dir() or any(c in source for c in "*?["))


@dataclass(frozen=True)
class Shard:
    """One file of the dataset: its rows and what one row (sample) of it looks like."""
    path: str
    rows: int
    x_shape: tuple[int, ...]
    x_dtype: str
    y_shape: tuple[int, ...]
    y_dtype: str
    y_path: str = ""           # npy: the targets file
    groups: tuple[int, ...] = ()   # parquet: rows of each row group


@dataclass(frozen=True)
class ShardSet:
    """The files of ``data.source`` and how they are read."""
    source: str
    fmt: str
    shards: tuple[Shard, ...]
    per_sample: bool
    x: str
    y: str
    label: str
    features: tuple[str, ...]
    split_column: str = ""
    #: a split given by separate sources (``data.test_source``): (split, number of files) in
    #: order, the training files first (``datafeed.streaming.scan_sources``); else empty
    parts: tuple[tuple[str, int], ...] = ()

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def starts(self) -> np.ndarray:
        """The first global row of each shard (and the total at the end)."""
        return np.concatenate([[0], np.cumsum([s.rows for s in self.shards])]).astype(np.int64)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.shards[0].x_shape

    @property
    def nbytes(self) -> int:
        """Bytes of the features as float32, the way a run holds them in memory."""
        return self.rows * int(np.prod(self.sample_shape, dtype=np.int64)) * 4

    @property
    def file_bytes(self) -> int:
        """Bytes of the files on disk."""
        return sum(Path(s.path).stat().st_size + (Path(s.y_path).stat().st_size if s.y_path else 0)
                   for s in self.shards)


def list_files(data: DataSettings) -> tuple[list[Path], str]:
    """The shard files ``data.source`` names (sorted) and their format; an empty match or
    mixed formats is a ``DataError`` naming ``data.source``."""
    src = data.source
    if not is_many(src):                          # one file: a dataset of one shard (streaming)
        fmt = data.format if data.format != "auto" else SHARD_SUFFIXES.get(Path(src).suffix.lower(), "")
        if fmt not in SHARD_FORMATS:
            raise DataError(f"`data.source` {src!r} cannot be streamed: streaming reads "
                            f"{', '.join(SHARD_FORMATS)} files; set `data.stream = false`")
        if not Path(src).is_file():
            raise DataError(f"`data.source` file {src!r} does not exist{unset_note(src)}")
        return [Path(src)], fmt
    if Path(src).is_dir():
        paths = sorted(p for p in Path(src).iterdir() if p.is_file() and p.suffix.lower() in SHARD_SUFFIXES)
        what = f"directory {src!r} holds no data files ({', '.join(SHARD_SUFFIXES)})"
    else:
        paths = sorted(Path(p) for p in globlib.glob(src, recursive=True) if Path(p).is_file())
        what = f"glob {src!r} matches no files"
    if not paths:
        raise DataError(f"`data.source` {what}; check the path, or the pattern's folder and suffix")
    if data.format != "auto":
        if data.format not in SHARD_FORMATS:
            raise DataError(f"`data.format` {data.format!r} cannot be read from many files; shards may be "
                            f"{', '.join(SHARD_FORMATS)}")
        fmt = data.format
    else:
        kinds = {SHARD_SUFFIXES.get(p.suffix.lower()) for p in paths}
        if None in kinds:
            odd = next(p for p in paths if p.suffix.lower() not in SHARD_SUFFIXES)
            if odd.suffix.lower() in (".csv", ".tsv", ".txt"):
                raise DataError(f"`data.source` {src!r}: file {str(odd)!r} is a text table, which is read from "
                                "one file only; join the tables into one CSV (or convert them to Parquet files, "
                                "which are read as one table from many)")
            raise DataError(f"`data.source` {src!r}: file {str(odd)!r} has no known suffix "
                            f"({', '.join(SHARD_SUFFIXES)}); narrow the glob or set `data.format`")
        if len(kinds) > 1:
            raise DataError(f"`data.source` {src!r} mixes formats ({', '.join(sorted(map(str, kinds)))}); "
                            "give files of one format (narrow the glob)")
        fmt = kinds.pop()  # type: ignore[assignment]
    if fmt == "npy":
        paths = [p for p in paths if p.name.startswith(data.x)]
        if not paths:
            raise DataError(f"`data.source` {src!r}: no .npy file's name starts with `data.x` {data.x!r}; "
                            "npy shards are features files x*.npy beside targets files y*.npy")
    return paths, fmt


def scan(data: DataSettings, require_y: bool = True) -> ShardSet:
    """The shards of ``data.source``, their metadata read and checked against each other."""
    paths, fmt = list_files(data)
    if fmt == "parquet" and not isinstance(data.label, str):
        raise DataError(f"`data.label` lists {len(data.label)} target columns, but files read in parts (a folder, "
                        "a glob or streamed Parquet) take one; give one column, or the targets as an (n, k) "
                        "array `data.y` in .npz/.h5 files")
    setting = getattr(data, "sample_per_file", "auto")
    shards = []
    for p in paths:
        try:
            shards.append(_SCAN[fmt](p, data, require_y))
        except DataError:
            raise
        except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            raise DataError(f"`data.source` {data.source!r}: file {str(p)!r} cannot be read as {fmt}: "
                            f"{type(exc).__name__}: {one_line(str(exc))}; fix or remove the file") from None
    per_sample = _per_sample(shards[0], setting, fmt)
    if fmt != "parquet":
        shards = [_settle(s, per_sample, bool(s.y_dtype)) for s in shards]
    first = shards[0]
    for s in shards[1:]:
        for what, key, a, b in (("one sample", "x", first.x_shape, s.x_shape),
                                ("one target", "y", first.y_shape, s.y_shape)):
            if a != b and (key == "x" or require_y):
                raise DataError(f"`data.source` {data.source!r}: file {s.path!r} has {what} (`data.{key}`) of "
                                f"shape {list(b)}, but {first.path!r} has {list(a)}; every file needs the same "
                                "shapes")
        for what, key, a, b in (("features", "x", first.x_dtype, s.x_dtype), ("targets", "y", first.y_dtype,
                                                                                 s.y_dtype)):
            if _kind(a) != _kind(b) and (key == "x" or require_y):
                setting = "`data.label` column" if fmt == "parquet" and key == "y" else f"`data.{key}`"
                raise DataError(f"`data.source` {data.source!r}: file {s.path!r} has {what} ({setting}) of "
                                f"dtype {b}, but {first.path!r} has {a}; every file needs the same kind of values")
    features = tuple(getattr(data, "features", ()) or ())
    if fmt == "parquet":
        features = _parquet_names(paths, data, features)
    return ShardSet(data.source, fmt, tuple(shards), per_sample, data.x, data.y, data.label, features,
                    getattr(data, "split_column", ""))


def _parquet_names(paths: list[Path], data: DataSettings, given: tuple[str, ...]) -> tuple[str, ...]:
    """The feature columns of Parquet files read as one table: ``data.features``, or the first
    file's columns but the label and split column, in its order; every file is read by these
    names (never by position), so a file whose feature columns differ from the first's is
    refused, naming both."""
    import pyarrow.parquet as pq
    names = [feature_columns(data, pq.ParquetFile(p).schema_arrow.names) for p in paths]
    features = given or tuple(names[0])
    if given:
        return features
    for p, cols in zip(paths[1:], names[1:]):
        if set(cols) != set(features):
            extra, lacks = sorted(set(cols) - set(features)), sorted(set(features) - set(cols))
            raise DataError(f"`data.source` {data.source!r}: file {str(p)!r} has other feature columns than "
                            f"{str(paths[0])!r}" + (f" (it lacks {one_line(', '.join(lacks))})" if lacks else "")
                            + (f" (it also has {one_line(', '.join(extra))})" if extra else "")
                            + "; every file needs the same columns (read by name), or list the ones to use "
                              "in `data.features`")
    return features


def _per_sample(first: Shard, setting, fmt: str) -> bool:
    if setting is True:
        if fmt == "parquet":
            raise DataError("`data.sample_per_file = true` does not apply to Parquet files (a table holds rows)")
        return True
    if setting is False or fmt == "parquet":
        return False
    return first.y_shape == () and first.y_dtype != ""       # a raw scalar target: the file is one sample


def _kind(dtype: str) -> str:
    kind = np.dtype(dtype).kind if dtype else ""
    return {"u": "i", "S": "U", "O": "U"}.get(kind, kind)


def _missing(data: DataSettings, key: str, path: Path, names: list[str], what: str) -> DataError:
    return DataError(f"`data.{key}` names {what} {getattr(data, key)!r}, but file {str(path)!r} of `data.source` "
                     f"holds {', '.join(names) or 'none'}")


def _scan_npz(p: Path, data: DataSettings, require_y: bool) -> Shard:
    dtypes = {}
    with zipfile.ZipFile(p) as z:
        for name in z.namelist():
            if name.endswith(".npy"):
                with z.open(name) as fh:
                    version = np.lib.format.read_magic(fh)
                    head = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, _, dtype = head(fh)
                dtypes[name[:-4]] = (tuple(shape), dtype.str)
    if data.x not in dtypes:
        raise _missing(data, "x", p, list(dtypes), "array")
    if data.y not in dtypes and require_y:
        raise _missing(data, "y", p, list(dtypes), "array")
    return _shard(p, dtypes[data.x], dtypes.get(data.y))


def _shard(p: Path, x: tuple, y: tuple | None, y_path: str = "") -> Shard:
    """A shard from its raw shapes; ``rows`` -1 and the raw shapes until ``_settle`` knows
    whether files hold one sample each."""
    (xs, xd), (ys, yd) = x, (y if y is not None else (None, ""))
    return Shard(str(p), -1, tuple(xs), xd, tuple(ys) if ys is not None else (), yd, y_path)


def _settle(s: Shard, per_sample: bool, has_y: bool) -> Shard:
    """The shard's rows and one sample's shapes: a one-sample file's raw shapes are the sample's."""
    if per_sample:
        return Shard(s.path, 1, s.x_shape, s.x_dtype, s.y_shape, s.y_dtype, s.y_path)
    if not s.x_shape:
        raise DataError(f"file {s.path!r} of `data.source` holds a scalar `data.x`, not samples along a first "
                        "axis; set `data.sample_per_file = true` if each file is one sample")
    if has_y and (not s.y_shape or s.y_shape[0] != s.x_shape[0]):
        raise DataError(f"file {s.path!r} of `data.source` has {s.x_shape[0]} samples (`data.x`) but targets "
                        f"(`data.y`) of shape {list(s.y_shape)}; each file needs one target per sample (or set "
                        "`data.sample_per_file = true` if each file is one sample)")
    return Shard(s.path, s.x_shape[0], s.x_shape[1:], s.x_dtype, s.y_shape[1:] if has_y else (), s.y_dtype,
                 s.y_path, s.groups)


def _scan_npy(p: Path, data: DataSettings, require_y: bool) -> Shard:
    x = np.load(p, mmap_mode="r")
    if is_many(data.source):
        y_path = p.with_name(data.y + p.name[len(data.x):])
    else:                                      # one file: `data.y` names its targets file (read_npy)
        y_path = Path(data.y) if Path(data.y).is_absolute() else p.parent / data.y
        y_path = y_path if y_path.suffix else y_path.with_suffix(".npy")
    if not y_path.exists():
        if require_y:
            raise DataError(f"`data.y`: the targets file {str(y_path)!r} for {str(p)!r} (`data.source`) does not "
                            f"exist; name each targets file like its features file with {data.y!r} for {data.x!r}")
        return _shard(p, (x.shape, x.dtype.str), None)
    y = np.load(y_path, mmap_mode="r")
    return _shard(p, (x.shape, x.dtype.str), (y.shape, y.dtype.str), str(y_path))


def _scan_hdf5(p: Path, data: DataSettings, require_y: bool) -> Shard:
    import h5py
    with h5py.File(p, "r") as f:
        names: list[str] = []
        f.visit(lambda n: names.append("/" + n) if isinstance(f[n], h5py.Dataset) else None)
        if data.x not in f:
            raise _missing(data, "x", p, names, "HDF5 dataset")
        if data.y not in f and require_y:
            raise _missing(data, "y", p, names, "HDF5 dataset")
        x = (f[data.x].shape, f[data.x].dtype.str)
        y = (f[data.y].shape, f[data.y].dtype.str) if data.y in f else None
    return _shard(p, x, y)


def _scan_parquet(p: Path, data: DataSettings, require_y: bool) -> Shard:
    import pyarrow.parquet as pq
    f = pq.ParquetFile(p)
    cols = list(f.schema_arrow.names)
    if data.label not in cols and require_y:
        raise DataError(f"`data.label` names column {data.label!r}, but file {str(p)!r} of `data.source` has "
                        f"columns {one_line(', '.join(cols))}")
    features = feature_columns(data, cols)
    missing = [c for c in features if c not in cols]
    if missing:
        raise DataError(f"`data.features` names columns {missing} that file {str(p)!r} of `data.source` lacks")
    import pyarrow.types as pat
    text = [c for c in features if not (pat.is_integer(t := f.schema_arrow.field(c).type) or pat.is_floating(t)
                                        or pat.is_boolean(t) or pat.is_decimal(t))]
    if text:
        raise DataError(f"feature column(s) {', '.join(map(repr, text[:8]))} of file {str(p)!r} of `data.source` "
                        f"are not numbers ({f.schema_arrow.field(text[0]).type}): Parquet files read as shards take "
                        "numeric features only (one table file reads text columns of few values as categories); "
                        "encode them as numbers in the files (one 0/1 column per category), or leave them out "
                        "with `data.exclude`")
    groups = tuple(f.metadata.row_group(i).num_rows for i in range(f.num_row_groups))
    ytype = f.schema_arrow.field(data.label).type.to_pandas_dtype() if data.label in cols else None
    return Shard(str(p), int(f.metadata.num_rows), (len(features),), "<f4", (),
                 np.dtype(ytype).str if ytype is not None else "", "", groups)


_SCAN = {"npz": _scan_npz, "npy": _scan_npy, "hdf5": _scan_hdf5, "parquet": _scan_parquet}


def read_rows(ss: ShardSet, i: int, start: int, stop: int, want_x: bool = True,
              want_y: bool = True) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Rows ``[start, stop)`` of shard ``i``: (features, targets), either skipped when not wanted."""
    s = ss.shards[i]
    x = y = None
    if ss.fmt == "hdf5":
        rows = () if ss.per_sample else slice(start, stop)
        with _HDF5_LOCK:                        # no file is closed (evicted) while another thread reads it
            f = _open_hdf5(s.path)
            x = hdf5_values(f[ss.x], rows) if want_x else None
            y = hdf5_values(f[ss.y], rows) if want_y and ss.y in f else None
        if ss.per_sample:
            x, y = (None if a is None else a[None] for a in (x, y))
    elif ss.fmt == "npz":
        with np.load(s.path, allow_pickle=False) as f:
            if want_x:
                x = f[ss.x][None] if ss.per_sample else f[ss.x][start:stop]
            if want_y and ss.y in f.files:
                y = np.asarray(f[ss.y])[None] if ss.per_sample else f[ss.y][start:stop]
    elif ss.fmt == "npy":
        if want_x:
            arr = np.load(s.path, mmap_mode="r")
            x = np.array(arr[None] if ss.per_sample else arr[start:stop])
        if want_y and s.y_path:
            arr = np.load(s.y_path, mmap_mode="r")
            y = np.array(arr[None] if ss.per_sample else arr[start:stop])
    else:
        x, y = _parquet_rows(ss, s, start, stop, want_x, want_y)
    return x, y


#: HDF5 files kept open by this process (opening one costs about a millisecond; each open file
#: holds about half a MB of metadata cache). h5py serialises calls from the reading threads itself,
#: but a file evicted here was closed while another thread still read it (a folder of one-sample
#: files, validation read 4 chunks at once: members failed with "invalid identifier type"), so a
#: read holds ``_HDF5_LOCK`` from the open to its last value: no concurrency is lost that h5py gave
_OPEN: dict[str, object] = {}
OPEN_FILES = 8
_HDF5_LOCK = threading.Lock()


def _open_hdf5(path: str):
    import h5py
    f = _OPEN.pop(path, None)
    if f is None or not f:                      # closed (h5py File is falsy then)
        f = h5py.File(path, "r")
    _OPEN[path] = f                             # most recently used last
    while len(_OPEN) > OPEN_FILES:
        _OPEN.pop(next(iter(_OPEN))).close()
    return f


#: ``files_digest``: files whose contents are sampled (evenly spaced; every file's size counts),
#: blocks read from each, and their bytes: at most 64 MiB read for the largest dataset
DIGEST_FILES, DIGEST_BLOCKS, DIGEST_BLOCK = 1024, 4, 16384


def files_digest(paths: list[str]) -> str:
    """A digest of a streamed dataset's files: every file's size, and ``DIGEST_BLOCKS`` blocks
    evenly spaced in up to ``DIGEST_FILES`` of them. A file rewritten with the same shape and other
    values is seen (where a sampled block changed); reading the whole dataset again is not done."""
    import hashlib
    h = hashlib.blake2b(digest_size=16)
    picked = set(np.linspace(0, len(paths) - 1, min(len(paths), DIGEST_FILES)).astype(np.int64).tolist()) \
        if paths else set()
    for i, path in enumerate(paths):
        size = Path(path).stat().st_size
        h.update(f"{i}:{size};".encode())
        if i not in picked:
            continue
        with open(path, "rb") as fh:
            for offset in np.unique(np.linspace(0, max(0, size - DIGEST_BLOCK), DIGEST_BLOCKS).astype(np.int64)):
                fh.seek(int(offset))
                h.update(fh.read(DIGEST_BLOCK))
    return h.hexdigest()


def close_files() -> None:
    """Close the HDF5 files this process keeps open."""
    with _HDF5_LOCK:
        while _OPEN:
            _OPEN.popitem()[1].close()


def _parquet_rows(ss: ShardSet, s: Shard, start: int, stop: int, want_x: bool, want_y: bool):
    import pyarrow.parquet as pq
    f = pq.ParquetFile(s.path)
    ends = np.cumsum(s.groups)
    first = int(np.searchsorted(ends, start, side="right"))
    last = int(np.searchsorted(ends, stop - 1, side="right")) if stop > start else first
    table = f.read_row_groups(list(range(first, last + 1)))
    offset = int(ends[first - 1]) if first else 0
    frame = table.slice(start - offset, stop - start).to_pandas()
    split = ss.split_column
    features = list(ss.features) or [c for c in frame.columns if c not in (ss.label, split)]
    x = frame[features].to_numpy(dtype=np.float64, na_value=np.nan) if want_x else None    # as readers._from_frame
    y = frame[ss.label].to_numpy() if want_y and ss.label in frame.columns else None
    return x, y


def read_column(ss: ShardSet, column: str) -> np.ndarray:
    """One column of every Parquet shard, in row order (a split column)."""
    import pyarrow.parquet as pq
    return np.concatenate([pq.read_table(s.path, columns=[column]).column(0).to_numpy(zero_copy_only=False)
                           for s in ss.shards])


def read_targets(ss: ShardSet) -> np.ndarray | None:
    """Every shard's targets, in row order (small beside the features: rank 0 holds them)."""
    parts = [read_rows(ss, i, 0, s.rows, want_x=False)[1] for i, s in enumerate(ss.shards)]
    return None if any(p is None for p in parts) else np.concatenate(parts)


def read_all(data: DataSettings, require_y: bool = True) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """The whole dataset in memory: every shard read and concatenated (``read_dataset``'s
    many-files reader)."""
    ss = scan(data, require_y)
    xs, ys = [], []
    for i, s in enumerate(ss.shards):
        x, y = _checked_read(ss, i, 0, s.rows)
        xs.append(x)
        ys.append(y)
    info: dict = {"files": len(ss.shards)}
    if ss.fmt == "parquet":
        info["feature_names"] = list(ss.features)
        split = getattr(data, "split_column", "")
        if split and require_y:
            try:
                info["split_values"] = read_column(ss, split)
            except KeyError:
                raise DataError(f"`data.split_column` names column {split!r}, which the files of `data.source` "
                                f"{data.source!r} lack") from None
    y = None if any(v is None for v in ys) else np.concatenate(ys)
    return np.concatenate(xs), y, info


def _checked_read(ss: ShardSet, i: int, start: int, stop: int):
    try:
        return read_rows(ss, i, start, stop)
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise DataError(f"`data.source` {ss.source!r}: file {ss.shards[i].path!r} cannot be read: "
                        f"{type(exc).__name__}: {one_line(str(exc))}; fix or remove the file") from None
