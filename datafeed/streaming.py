"""Streaming: members read batches from the files, never the whole array (larger than memory).

Chosen by ``data.stream`` (``"auto"``: when the features as float32 exceed
``data.memory_share`` of a node's memory, ``will_stream``). Rank 0 then reads only the
targets (small: one value or vector per sample), draws or takes the split on row indices as
the in-memory path does (``prepare.choose_rows``), and fits the normalisation in one pass over
the training rows, a chunk at a time (``fit_streaming``). What it broadcasts is small: the
targets, each split's row indices, the normalisation, and a few training rows for the build
check; ``meta["stream"]`` says how to read the files.

Each member reads *chunks*: runs of consecutive rows of one file (about ``CHUNK_BYTES`` of
features; a whole .npz or one-sample file; a Parquet row group). ``Streamed.train_dataset``
is a tf.data pipeline over an ``EpochReader``: each epoch the member's chunks in a seeded
order, taken a *window* at a time (enough chunks to hold ``data.shuffle_buffer`` rows), a
window's rows read by a background thread while the previous window is served and put in a
seeded random order as they are read, batches served as slices of it (no copy, nothing
gathered), prefetched. The ranks of a data-parallel group read
disjoint chunks (a seeded deal, as Horovod and CosmoFlow shard files), each its share of the
global batch, and all take the same number of steps (the smallest share's full batches), so
a group of 2 sees the same rows per epoch as one rank, in another order (equal within
tolerance, not bit for bit). Validation and test predictions read the chunks in order.
Deterministic for a given seed: the order of chunks and rows depends on the member's seed
only, not on the number of ranks in the job.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from datafeed.pipeline import member_indices
from datafeed.prepare import SPLITS, apply_normalizer, choose_rows, prepare_targets
from datafeed.readers import BUILTINS, DataError, DataSettings
from datafeed.shards import (
    SHARD_FORMATS,
    SHARD_SUFFIXES,
    Shard,
    ShardSet,
    is_many,
    read_column,
    read_rows,
    read_targets,
    scan,
)
from datafeed.splits import rows_from_column, rows_from_file, split_from

CHUNK_BYTES = 4 << 20      # rows read at once: about this many bytes of features (at least one row)
CYCLE = 4                  # at least this many chunks a window; validation chunks read at once
HEAD_ROWS = 64             # training rows broadcast for the build check
EVAL_BATCH = 512           # validation batches, as the in-memory path's


def node_memory(data: DataSettings) -> int:
    """Bytes of one node's memory: ``data.node_memory_gb``, else this machine's total."""
    gb = float(getattr(data, "node_memory_gb", 0) or 0)
    return int(gb * 1e9) if gb > 0 else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def will_stream(data: DataSettings, nbytes: int) -> bool:
    """Whether features of ``nbytes`` (float32) stream under ``data.stream``."""
    setting = getattr(data, "stream", False)
    if setting == "auto":
        return nbytes > float(data.memory_share) * node_memory(data)
    return bool(setting)


def read_whole(data: DataSettings) -> bool:
    """``data.source`` is one file of a format that is read whole (a CSV): not a built-in
    dataset, nor files of a format that can stream (``SHARD_FORMATS``)."""
    fmt = data.format if data.format != "auto" else SHARD_SUFFIXES.get(Path(data.source).suffix.lower())
    return data.source not in BUILTINS and not is_many(data.source) and fmt not in SHARD_FORMATS


def read_whole_note(data: DataSettings) -> str | None:
    """What to say when ``data.source`` is one file in a format read whole (a CSV, whatever
    ``data.stream`` says) and larger on disk than ``data.memory_share`` of a node's memory:
    rank 0 holds it all (and pandas about twice that while it parses), so the run may not fit.
    None otherwise (a size on disk is a fair floor of the parsed table's)."""
    if not read_whole(data):
        return None
    try:
        size = Path(data.source).stat().st_size
    except OSError:
        return None                               # its reader says what is wrong
    node = node_memory(data)
    if size <= float(data.memory_share) * node:
        return None
    return (f"`data.source` {data.source!r} is {size / 1e9:.1f} GB on disk, more than `data.memory_share` = "
            f"{float(data.memory_share):g} of a node's {node / 1e9:.1f} GB, and a CSV is read whole "
            "(it cannot stream): rank 0 may run out of memory. Convert it to Parquet (pandas: "
            "`pd.read_csv(path).to_parquet(path_parquet)`, or several files in chunks) and set `data.source` to "
            "it, which streams; or raise `data.memory_share` (`data.node_memory_gb`) if the nodes hold it")


def stream_plan(data: DataSettings) -> ShardSet | None:
    """The files to stream from when this run streams, else None (the in-memory path)."""
    setting = getattr(data, "stream", False)
    if setting is False or data.source in BUILTINS:
        if setting is True:
            raise DataError(f"`data.stream = true`, but `data.source` {data.source!r} is a built-in dataset; "
                            "stream files (npz, npy, HDF5, Parquet) or set `data.stream = false`")
        return None
    if setting == "auto" and read_whole(data):
        return None                               # a CSV (or another table) is read whole
    try:
        ss = scan_sources(data)
    except DataError:
        if setting == "auto" and not is_many(data.source):
            return None                           # one file: its reader says what is wrong, as it always has
        raise
    return ss if will_stream(data, ss.nbytes) else None


def scan_sources(data: DataSettings) -> ShardSet:
    """The files of ``data.source``, and when the split is given by separate sources
    (``data.val_source``, ``data.test_source``) theirs after them, as one ``ShardSet`` whose
    rows are the training files', then the validation files', then the test files' (as
    ``datafeed.splits.read_data`` reads them in memory); each source is checked against
    ``data.source`` (format, sample and target shapes, kinds of values, Parquet columns), its
    errors naming its own setting."""
    from datafeed.splits import _Source
    ss = scan(data)
    if split_from(data) != "sources":
        return ss
    features = ss.features                        # Parquet: the columns by name (``shards.scan``)
    shards, parts = list(ss.shards), [("train", len(ss.shards))]
    for name, setting in (("val", "val_source"), ("test", "test_source")):
        path = getattr(data, setting)
        if not path:
            continue
        other = _Source(data, path)
        other.features = features                 # a Parquet file's columns by name, as in training
        where = f"`data.{setting}` {path!r}"
        try:
            got = scan(other)
        except DataError as exc:
            msg = str(exc).replace("`data.source`", f"`data.{setting}`")
            raise DataError(msg if path in msg else f"{where}: {msg}") from None
        if got.fmt != ss.fmt:
            raise DataError(f"{where} is {got.fmt}, but `data.source` is {ss.fmt}: give every split in one format")
        first = got.shards[0]
        for what, a, b in (("one sample (`data.x`)", ss.sample_shape, got.sample_shape),
                           ("one target (`data.y`)", ss.shards[0].y_shape, first.y_shape)):
            if a != b:
                raise DataError(f"{where}: file {first.path!r} has {what} of shape {list(b)}, but `data.source` "
                                f"{list(a)}; every split needs the same shapes")
        if np.dtype(first.x_dtype).kind != np.dtype(ss.shards[0].x_dtype).kind:
            raise DataError(f"{where}: file {first.path!r} has features of dtype {first.x_dtype}, but `data.source` "
                            f"{ss.shards[0].x_dtype}; every split needs the same kind of values")
        if got.per_sample != ss.per_sample:
            raise DataError(f"{where} holds {'one sample' if got.per_sample else 'samples along a first axis'} per "
                            "file, unlike `data.source`; set `data.sample_per_file` and give every split alike")
        shards.extend(got.shards)
        parts.append((name, len(got.shards)))
    return replace(ss, shards=tuple(shards), features=features, parts=tuple(parts))


def source_rows(ss: ShardSet) -> dict[str, np.ndarray | None]:
    """The split separate sources give (``scan_sources``): each split's rows, None for a
    validation split not given."""
    rows: dict[str, np.ndarray | None] = {"val": None}
    at, start = 0, 0
    for name, files in ss.parts:
        n = sum(s.rows for s in ss.shards[at:at + files])
        rows[name] = np.arange(start, start + n, dtype=np.int64)
        at, start = at + files, start + n
    return rows


def chunk_table(ss: ShardSet) -> np.ndarray:
    """(shard, start, stop, global start of the shard) of every chunk, in row order."""
    out, starts = [], ss.starts
    row_bytes = max(1, int(np.prod(ss.sample_shape, dtype=np.int64)) * np.dtype(ss.shards[0].x_dtype).itemsize)
    step = max(1, CHUNK_BYTES // row_bytes)
    for i, s in enumerate(ss.shards):
        if ss.fmt == "parquet":
            bounds = np.concatenate([[0], np.cumsum(s.groups)])
        elif ss.fmt == "npz" or ss.per_sample:
            bounds = np.array([0, s.rows])
        else:
            bounds = np.append(np.arange(0, s.rows, step), s.rows)
        out.extend((i, int(a), int(b), int(starts[i])) for a, b in zip(bounds[:-1], bounds[1:]) if b > a)
    return np.asarray(out, dtype=np.int64).reshape(-1, 4)


def split_spans(table: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each chunk, the span [lo, hi) of the split's sorted ``rows`` that lie in it."""
    return (np.searchsorted(rows, table[:, 3] + table[:, 1]), np.searchsorted(rows, table[:, 3] + table[:, 2]))


def rank_bytes(ss: ShardSet, data: DataSettings, batch_size: int = 512) -> int:
    """About the bytes of features one streaming rank holds: the window its pipeline serves
    (``data.shuffle_buffer`` rows, at least ``CYCLE`` chunks), the next one being read, and
    two prefetched batches (float32)."""
    row = int(np.prod(ss.sample_shape, dtype=np.int64)) * 4
    sizes = np.diff(chunk_table(ss)[:, 1:3], axis=1)
    chunk_rows = int(np.median(sizes)) if len(sizes) else 1
    open_chunks = max(CYCLE, min(-(-int(getattr(data, "shuffle_buffer", 10000)) // max(1, chunk_rows)), len(sizes)))
    return 2 * open_chunks * chunk_rows * row + 2 * batch_size * row


def memory_plan(data: DataSettings) -> dict | None:
    """What ``--check`` says of the data's size: rows, bytes as float32 and on disk, files,
    the node memory and share, whether it streams and a streaming rank's bytes; None for a
    built-in dataset or a format that is read whole (CSV)."""
    if data.source in BUILTINS or read_whole(data):
        return None
    try:
        ss = scan_sources(data)
    except DataError:
        if is_many(data.source):
            raise
        return None                               # one file: its reader says what is wrong
    return {"rows": ss.rows, "bytes": ss.nbytes, "file_bytes": ss.file_bytes, "files": len(ss.shards),
            "node_memory": node_memory(data), "share": float(data.memory_share),
            "streams": will_stream(data, ss.nbytes), "rank_bytes": rank_bytes(ss, data)}


def prepare_stream(ss: ShardSet, data: DataSettings, seed: int, normalise: bool = True,
                   given: dict[str, np.ndarray] | None = None) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """Rank 0 of a streaming run: what ``prepare.prepare_with_rows`` returns, without ever
    holding the features: (small arrays to broadcast, metadata, the split's row indices).
    ``normalise=False`` (``--check``) skips the pass over the training rows (shift 0, scale 1);
    ``given``: the split to use (a resumed run's own), instead of the data's or a drawn one."""
    large_blocks_to_the_os()
    if data.impute != "none":
        raise DataError(f"`data.impute = \"{data.impute}\"` fills missing features of data read whole, but "
                        f"`data.source` {data.source!r} streams (`data.stream`): fill them in the files, or set "
                        "`data.stream = false` if the data fits in memory")
    y = read_targets(ss)
    if y is None:
        raise DataError(f"`data.y`: the files of `data.source` {data.source!r} hold no targets")
    if len(y) < 10:
        raise DataError(f"the dataset has only {len(y)} samples; at least 10 are needed to split into train/val/test")
    info = {"feature_names": list(ss.features) if ss.fmt == "parquet" else []}
    y, meta = prepare_targets(y, info, data)
    rows = given                            # a resumed run's own split, else the data's (or drawn)
    way = split_from(data) if given is None else None
    if way == "sources":
        rows = source_rows(ss)
    elif way == "indices":
        rows = rows_from_file(data.split_file, len(y))
    elif way == "column":
        if ss.fmt != "parquet":
            raise DataError(f"`data.split_column` is for Parquet files when streaming, but `data.source` is {ss.fmt}")
        rows = rows_from_column(read_column(ss, data.split_column), data.split_column)
    idx = choose_rows(y, meta, data, seed, rows)
    input_shape = _input_shape(ss.sample_shape, data.reshape)
    if normalise:
        shift, scale = fit_streaming(ss, idx["train"], data.normalize)
    else:
        width = int(np.prod(ss.sample_shape, dtype=np.int64))
        shift, scale = np.zeros(width, np.float32), np.ones(width, np.float32)
    shift, scale = shift.reshape(input_shape), scale.reshape(input_shape)
    arrays: dict[str, np.ndarray] = {"x_mean": shift, "x_scale": scale}
    for split in SPLITS:
        arrays[f"y_{split}"] = np.ascontiguousarray(y[idx[split]])
        arrays[f"rows_{split}"] = idx[split].astype(np.int64)
    meta["input_shape"] = list(input_shape)
    meta["sizes"] = {s: int(len(idx[s])) for s in SPLITS}
    from datafeed.prepare import FILES_DIGEST
    from datafeed.shards import files_digest
    meta["stream"] = {**describe(ss, data), FILES_DIGEST: files_digest([s.path for s in ss.shards])}
    feed = Streamed(meta, arrays, stage=False)
    arrays["x_head"] = next(feed.chunks("train", limit=HEAD_ROWS))
    return arrays, meta, {s: idx[s].astype(np.int64) for s in SPLITS}


def _input_shape(sample: tuple[int, ...], reshape) -> tuple[int, ...]:
    if not reshape:
        return tuple(sample)
    if int(np.prod(reshape)) != int(np.prod(sample)):
        raise DataError(f"`data.reshape` {list(reshape)} holds {int(np.prod(reshape))} values per sample, but "
                        f"each sample has {int(np.prod(sample))} (shape {list(sample)})")
    return tuple(int(v) for v in reshape)


def fit_streaming(ss: ShardSet, train: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature (shift, scale) over the training rows in one pass, a chunk at a time
    (float64 sums merged as Chan et al.; the population std, as ``prepare.fit_normalizer``);
    every chunk is read once, those without training rows too, so a non-finite value in any
    split's rows (a ``data.test_source`` file too) is a ``DataError`` naming its file and setting."""
    table = chunk_table(ss)
    lo, hi = split_spans(table, train)
    width = int(np.prod(ss.sample_shape, dtype=np.int64))
    n, mean, m2 = 0, np.zeros(width), np.zeros(width)
    low, high = np.full(width, np.inf), np.full(width, -np.inf)
    for (i, start, stop, g), a, b in zip(table, lo, hi):
        x, _ = read_rows(ss, int(i), int(start), int(stop), want_y=False)
        x = np.asarray(x).reshape(len(x), -1)
        if not np.isfinite(x).all():        # every chunk: validation and test rows (and files) too
            raise DataError(f"file {ss.shards[int(i)].path!r} of `{_setting_of(ss, int(i))}` holds NaN/inf "
                            "features; clean or impute them before training")
        if b <= a:
            continue
        x = x[train[a:b] - g - start].astype(np.float64)
        k, m = len(x), x.mean(axis=0)
        delta = m - mean
        mean = mean + delta * k / (n + k)
        m2 = m2 + ((x - m) ** 2).sum(axis=0) + delta ** 2 * n * k / (n + k)
        n += k
        low, high = np.minimum(low, x.min(axis=0)), np.maximum(high, x.max(axis=0))
    if method == "standard":
        shift, scale = mean, np.sqrt(m2 / max(n, 1))
    elif method == "minmax":
        shift, scale = low, high - low
    else:
        shift, scale = np.zeros(width), np.ones(width)
    scale = np.where(scale > 1e-12, scale, 1.0)
    return shift, scale                              # float64, as prepare.fit_normalizer


def _setting_of(ss: ShardSet, i: int) -> str:
    """The setting that names shard ``i``: ``data.source``, or ``data.val_source`` /
    ``data.test_source`` for the files of a split given by separate sources."""
    end = 0
    for split, count in ss.parts:
        end += count
        if i < end:
            return {"val": "data.val_source", "test": "data.test_source"}.get(split, "data.source")
    return "data.source"


def describe(ss: ShardSet, data: DataSettings) -> dict:
    """``meta["stream"]``: what a member needs to read the files (plain JSON)."""
    return {"source": ss.source, "format": ss.fmt, "per_sample": ss.per_sample, "x": ss.x, "y": ss.y,
            "label": ss.label, "features": list(ss.features), "split_column": ss.split_column,
            "files": [s.path for s in ss.shards], "rows": [s.rows for s in ss.shards],
            "y_files": [s.y_path for s in ss.shards], "groups": [list(s.groups) for s in ss.shards],
            "sample_shape": list(ss.sample_shape), "dtype": ss.shards[0].x_dtype,
            "shuffle_buffer": int(getattr(data, "shuffle_buffer", 10000)),
            "stage_dir": str(getattr(data, "stage_dir", "") or "")}


def shard_set(stream: dict) -> ShardSet:
    """The ``ShardSet`` that ``describe`` wrote down."""
    shards = tuple(Shard(p, int(n), tuple(stream["sample_shape"]), stream["dtype"], (), "", yp, tuple(g))
                   for p, n, yp, g in zip(stream["files"], stream["rows"], stream["y_files"], stream["groups"]))
    return ShardSet(stream["source"], stream["format"], shards, bool(stream["per_sample"]), stream["x"],
                    stream["y"], stream["label"], tuple(stream["features"]), stream["split_column"])


def large_blocks_to_the_os(threshold: int = 1 << 20) -> None:
    """Have glibc's malloc map every block of ``threshold`` bytes or more on its own and give it
    back when freed. Its default threshold rises (to 32 MiB) once a large block is freed, after
    which the chunks the reading threads allocate and free come from per-thread heaps that
    fragment, and a rank's resident memory creeps up with every file read; measured with
    ``scripts/bench_streaming.py memory``. Best effort: elsewhere nothing changes."""
    import ctypes
    import sys
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).mallopt(-3, threshold)          # M_MMAP_THRESHOLD
        except (OSError, AttributeError):
            pass


class Streamed:
    """A member's view of a streamed dataset: the broadcast targets, rows and normalisation
    (``data``) with the files ``meta["stream"]`` names (staged node-locally first when
    ``data.stage_dir`` is set and ``stage``)."""

    def __init__(self, meta: dict, data: Mapping[str, np.ndarray], stage: bool = True):
        stream = meta["stream"]
        self.ss = shard_set(stream)
        if stage and stream.get("stage_dir"):
            from datafeed.staging import stage_files
            moved = stage_files(self.ss, stream["stage_dir"])
            self.ss = replace(self.ss, shards=tuple(replace(s, path=moved[s.path],
                                                            y_path=moved.get(s.y_path, s.y_path))
                                                    for s in self.ss.shards))
        self.data, self.buffer = data, int(stream["shuffle_buffer"])
        self.shape = tuple(meta["input_shape"])
        self.shift, self.scale = np.asarray(data["x_mean"]), np.asarray(data["x_scale"])
        self.table = chunk_table(self.ss)
        large_blocks_to_the_os()


    def size(self, split: str) -> int:
        return len(self.data[f"rows_{split}"])

    def units(self, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(chunk ids, lo, hi) of the chunks holding rows of ``split``."""
        lo, hi = split_spans(self.table, np.asarray(self.data[f"rows_{split}"]))
        keep = np.flatnonzero(hi > lo)
        return keep, lo[keep], hi[keep]

    def read(self, split: str, chunk: int, counts: np.ndarray | None = None,
             raw: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The split's rows in one chunk, in row order, normalised and shaped as the model
        takes them (``raw``: as the file holds them), with their targets; ``counts``: how
        often each row of the split is taken (a bootstrap)."""
        i, start, stop, g = (int(v) for v in self.table[chunk])
        rows = np.asarray(self.data[f"rows_{split}"])
        a, b = np.searchsorted(rows, [g + start, g + stop])
        pos = np.arange(a, b) if counts is None else np.repeat(np.arange(a, b), counts[a:b])
        x, _ = read_rows(self.ss, i, start, stop, want_y=False)
        x = np.asarray(x)[rows[pos] - g - start]
        if raw:
            return x, np.asarray(self.data[f"y_{split}"])[pos]
        x = apply_normalizer(x.reshape((len(pos), *self.shape)), self.shift, self.scale)
        return x, np.asarray(self.data[f"y_{split}"])[pos]

    def chunks(self, split: str, limit: int | None = None) -> Iterator[np.ndarray]:
        """The split's features, normalised, a chunk at a time in row order (predictions);
        ``limit``: one array of at most that many first rows."""
        got: list[np.ndarray] = []
        for c in self.units(split)[0]:
            x = self.read(split, int(c))[0]
            if limit is None:
                yield x
                continue
            got.append(x)
            if sum(map(len, got)) >= limit:
                break
        if limit is not None:
            yield np.concatenate(got)[:limit]

    def _loader(self, split: str, y_transform):
        """A graph function: chunk id -> the split's (x, y) rows in it, in row order."""
        import tensorflow as tf
        y = np.asarray(self.data[f"y_{split}"])
        y_dtype = tf.as_dtype(np.float32 if y_transform is not None else y.dtype)

        def fn(c):
            x, t = self.read(split, int(c))
            return x, (y_transform(t).astype(np.float32) if y_transform is not None else t)

        def load(c):
            bx, by = tf.numpy_function(fn, [c], [tf.float32, y_dtype], stateful=False)
            bx.set_shape((None, *self.shape))
            by.set_shape((None, *y.shape[1:]))
            return bx, by
        return load

    def open_chunks(self) -> int:
        """Chunks a member's pipeline mixes at once (a window): enough to hold
        ``data.shuffle_buffer`` rows, at least ``CYCLE``."""
        rows = np.median(self.table[:, 2] - self.table[:, 1]) if len(self.table) else 1
        return int(max(CYCLE, min(-(-self.buffer // max(1, int(rows))), len(self.table))))

    def train_dataset(self, batch_size: int, seed: int, bootstrap: bool = False, y_transform=None,
                      shard: tuple[int, int] | None = None):
        """The member's training batches (module doc); ``shard=(rank, size)``: this rank's
        disjoint chunks and its share of each global batch."""
        import tensorflow as tf
        rank, size = shard if shard is not None else (0, 1)
        n = self.size("train")
        counts = np.bincount(member_indices(n, seed, True), minlength=n) if bootstrap else None
        chunks, lo, hi = self.units("train")
        per_chunk = hi - lo if counts is None else np.array([counts[a:b].sum() for a, b in zip(lo, hi)])
        deal = np.random.default_rng(seed).permutation(len(chunks))
        mine = np.sort(chunks[deal[rank::size]])
        local = batch_size * (rank + 1) // size - batch_size * rank // size
        rows = int(per_chunk[deal[rank::size]].sum())
        if size > 1:
            if len(chunks) < size:
                raise DataError(f"the training rows lie in {len(chunks)} chunk(s), fewer than the {size} ranks of the "
                                "group; use more (or smaller) files, or lower `group_size`")
            steps = min(int(per_chunk[deal[k::size]].sum()) // (batch_size * (k + 1) // size - batch_size * k // size)
                        for k in range(size))
            if steps == 0:
                raise DataError(f"a rank of the group of {size} holds fewer training rows than its share of the "
                                f"batch ({local}); use more data or a smaller `batch_size`")
        else:
            steps = -(-rows // local)
        reader = EpochReader(self, mine, per_chunk[np.searchsorted(chunks, mine)], counts, local, steps, seed,
                             y_transform)
        y = np.asarray(self.data["y_train"])
        y_dtype = tf.as_dtype(np.float32 if y_transform is not None else y.dtype)

        def load(step):
            bx, by = tf.numpy_function(reader.take, [step], [tf.float32, y_dtype], stateful=True)
            bx.set_shape((None, *self.shape))
            by.set_shape((None, *y.shape[1:]))
            return bx, by
        ds = tf.data.Dataset.range(steps).map(load)   # in order: batch i of the epoch, a slice of a window
        return ds.apply(tf.data.experimental.assert_cardinality(steps)).prefetch(2)

    def eval_dataset(self, split: str, y_transform=None):
        """The split's (x, y) in batches of ``EVAL_BATCH`` rows, in row order (validation during
        training), read a chunk at a time."""
        import tensorflow as tf
        ds = tf.data.Dataset.from_tensor_slices(self.units(split)[0].astype(np.int64))
        batches = -(-self.size(split) // EVAL_BATCH)     # said, so Keras does not find the end by running out
        return ds.map(self._loader(split, y_transform), num_parallel_calls=CYCLE, deterministic=True).rebatch(
            EVAL_BATCH).apply(tf.data.experimental.assert_cardinality(batches)).prefetch(2)


_POOL: list = []


def reading_thread():
    """The process's one background reading thread (an executor), shared by every member it
    trains, so no member leaves a thread behind."""
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor
        _POOL.append(ThreadPoolExecutor(1, thread_name_prefix="stream-read"))
    return _POOL[0]


class EpochReader:
    """A member's training rows an epoch at a time, as whole batches (``Streamed.train_dataset``).

    Epoch k (counted from 0 by this reader: each pass from step 0 is the next) orders the
    rank's chunks with the seed (member seed, k); runs of ``Streamed.open_chunks()``
    consecutive chunks of that order (about ``data.shuffle_buffer`` rows) are *windows*. A
    window's rows (a bootstrap's as often as it draws them) are read, normalised and put in
    a random order (seed (member seed, k, window)) as they are read; the epoch's rows are
    the windows' in turn, and batch i is rows [i * batch, (i + 1) * batch) of that sequence:
    a slice, nothing gathered or copied when the batch is served. A background thread reads
    the next window (after an epoch's last, the next epoch's first) while this one is
    served, so at most two windows are held."""

    def __init__(self, feed: Streamed, chunks: np.ndarray, rows: np.ndarray, counts: np.ndarray | None,
                 batch: int, steps: int, seed: int, y_transform=None):
        self.feed, self.chunks, self.rows, self.counts = feed, chunks, rows, counts
        self.batch, self.steps, self.seed, self.y_transform = batch, steps, seed, y_transform
        self.width = feed.open_chunks()
        self.pool = reading_thread()
        self.epoch = -1
        self.plans: dict[int, tuple[list[np.ndarray], np.ndarray]] = {}
        self.held: dict = {}

    def plan(self, k: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Epoch ``k``'s windows (indices into ``chunks``) and each one's first row in the epoch."""
        if k not in self.plans:
            order = np.random.default_rng([self.seed, k]).permutation(len(self.chunks))
            windows = [order[i:i + self.width] for i in range(0, len(order), self.width)]
            starts = np.concatenate([[0], np.cumsum([self.rows[w].sum() for w in windows])]).astype(np.int64)
            self.plans = {e: p for e, p in self.plans.items() if e >= k - 1}
            self.plans[k] = windows, starts
        return self.plans[k]

    def _ask(self, k: int, w: int) -> None:
        if w < len(self.plan(k)[0]) and (k, w) not in self.held:
            self.held[(k, w)] = self.pool.submit(self._read, k, w)

    def _read(self, k: int, w: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``w`` of epoch ``k``: its rows (x, y) in their random order."""
        windows, starts = self.plan(k)
        size = int(starts[w + 1] - starts[w])
        slot = np.argsort(np.random.default_rng([self.seed, k, w]).permutation(size))   # row i goes to slot[i]
        x = np.empty((size, *self.feed.shape), np.float32)
        y = None
        at = 0
        for c in windows[w]:
            px, py = self.feed.read("train", int(self.chunks[c]), self.counts)
            if y is None:
                y = np.empty((size, *py.shape[1:]), py.dtype)
            x[slot[at:at + len(px)]] = px
            y[slot[at:at + len(px)]] = py
            at += len(px)
        return x, y

    def take(self, step) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``step`` of the epoch; step 0 starts the next epoch."""
        step = int(step)
        if step == 0:
            self.epoch += 1
            self.held = {key: f for key, f in self.held.items() if key[0] == self.epoch}
        k = self.epoch
        windows, starts = self.plan(k)
        a, b = step * self.batch, min((step + 1) * self.batch, int(starts[-1]))
        first = int(np.searchsorted(starts, a, side="right")) - 1
        last = int(np.searchsorted(starts, b - 1, side="right")) - 1
        xs, ys = [], []
        for w in range(first, last + 1):
            self._ask(k, w)
            x, y = self.held[(k, w)].result()
            lo, hi = max(a, starts[w]) - starts[w], min(b, starts[w + 1]) - starts[w]
            xs.append(x[lo:hi])
            ys.append(y[lo:hi])
        for key in [key for key in self.held if key[0] == k and key[1] < last]:
            del self.held[key]                        # served: let it go
        if step == self.steps - 1 or last == len(windows) - 1:
            if step == self.steps - 1:
                self.held = {key: f for key, f in self.held.items() if key[0] > k}
            self._ask(k + 1, 0)                       # the next epoch's first window, read meanwhile
        else:
            self._ask(k, last + 1)                    # the next window, read while this one is served
        y = ys[0] if len(ys) == 1 else np.concatenate(ys)
        if self.y_transform is not None:
            y = self.y_transform(y).astype(np.float32)
        return (xs[0] if len(xs) == 1 else np.concatenate(xs)), y
