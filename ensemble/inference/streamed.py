"""A streamed run's own splits, read back a chunk at a time (``data.stream``, issue 33).

A run whose data streamed (``data.json`` holds ``stream``: the files, their rows, how to
read them) never had its features in memory, and a later step must not need them there
either. ``run_feed(run, split)`` is the ``datafeed.streaming.Streamed`` the members read:
the files ``data.json`` names (checked against what they hold now), the rows of
``splits.npz``, the targets encoded as in training and the normalisation of
``normalization.npz``. ``split_batches`` gives a split's features as the members take them
(normalised, reshaped) a chunk at a time; ``raw_batches`` as the files hold them (the
notebook's ``data_batches``); ``predict_split`` runs the ensemble over one split batch by
batch, writing the predictions as they come (``outputs.PredictionWriter``) and keeping only
the few numbers a row the metrics need.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ensemble.inference.load import EnsembleRun, PredictError
from ensemble.results.rundir import RunDirectory

if TYPE_CHECKING:
    from ensemble.config import RunConfig

SPLITS = ("train", "val", "test")


def is_streamed(run: EnsembleRun) -> bool:
    """Whether the run's data streamed (its members read it from the files)."""
    return bool(run.meta.get("stream"))


def run_targets(run_dir: str | Path, config: RunConfig, meta: dict, raw: bool = False) -> dict[str, np.ndarray]:
    """A streamed run's targets and rows per split (``y_train``, ``rows_train``, ...) and its
    normalisation (``x_mean``, ``x_scale``), without reading a feature: what re-selection
    needs (``inference.load.run_arrays`` answers with it for a streamed run). The files are
    checked against ``data.json`` (their number and rows); ``raw``: the targets as the files
    hold them, else encoded as the members were scored on them."""
    from datafeed.prepare import prepare_targets
    from datafeed.readers import DataError
    from datafeed.shards import read_targets
    from datafeed.streaming import scan_sources, shard_set
    rd = RunDirectory(Path(run_dir))
    if not (rd.path / rd.SPLITS).is_file():
        raise PredictError(f"{str(rd.path / rd.SPLITS)!r} does not exist: the run directory is incomplete")
    recorded = shard_set(meta["stream"])
    try:
        now = scan_sources(config.data)
    except (OSError, DataError) as exc:
        raise PredictError(f"cannot read the run's data {config.data.source!r} again: {exc}") from None
    if [s.rows for s in now.shards] != [s.rows for s in recorded.shards] \
            or now.sample_shape != recorded.sample_shape:
        raise PredictError(f"the files of {config.data.source!r} are not what the run trained on "
                           f"({len(now.shards)} files of {now.rows} rows now, {len(recorded.shards)} of "
                           f"{recorded.rows} then); use the files the run was trained on")
    from datafeed.prepare import FILES_DIGEST
    from datafeed.shards import files_digest
    then = meta["stream"].get(FILES_DIGEST)
    if then and files_digest([s.path for s in now.shards]) != then:
        raise PredictError(f"the files of {config.data.source!r} hold other values than the run trained on (a file "
                           "rewritten with the same shape: their sampled contents differ); use the files the run "
                           "was trained on")
    try:
        y_all = read_targets(recorded)
    except (OSError, DataError, KeyError, ValueError) as exc:
        raise PredictError(f"cannot read the targets of {config.data.source!r} again: {exc}") from None
    if y_all is None:
        raise PredictError(f"the files of {config.data.source!r} hold no targets (`data.y`) any more")
    if not raw:
        from datafeed.prepare import as_run_made, with_run_task
        y_all, fresh = prepare_targets(y_all, {"feature_names": meta.get("feature_names", [])},
                                       with_run_task(config.data, meta))
        held = {"y_all": y_all}
        as_run_made(held, fresh, meta)          # a run before float64 targets: scored on float32 ones
        y_all = held["y_all"]
    splits = rd.load_splits()
    shift, scale = rd.load_normalization()
    out = {"x_mean": shift, "x_scale": scale}
    for split in SPLITS:
        out[f"rows_{split}"] = splits[split]
        out[f"y_{split}"] = np.ascontiguousarray(y_all[splits[split]])
    return out


def run_feed(run: EnsembleRun, split: str, raw: bool = False):
    """The ``Streamed`` view of ``split`` of a streamed run (module doc); ``raw``: its targets
    as the files hold them, else encoded as the members were scored on them."""
    from datafeed.streaming import Streamed
    if split not in SPLITS:
        raise ValueError(f"split must be 'train', 'val' or 'test', but got {split!r}")
    arrays = run_targets(run.path, run.config, run.meta, raw)
    arrays["x_mean"], arrays["x_scale"] = run.shift, run.scale
    return Streamed(run.meta, arrays, stage=False)


def split_batches(run: EnsembleRun, split: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``split``'s (features as the members take them, encoded targets), a chunk at a time."""
    feed = run_feed(run, split)
    for c in feed.units(split)[0]:
        yield feed.read(split, int(c))


def raw_batches(run: EnsembleRun, split: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``split``'s (features, targets) as the files hold them, a chunk at a time, in row order."""
    feed = run_feed(run, split, raw=True)
    for c in feed.units(split)[0]:
        yield feed.read(split, int(c), raw=True)


def split_nbytes(run: EnsembleRun, split: str) -> int:
    """Bytes of ``split``'s features as float32."""
    rows = len(RunDirectory(Path(run.path)).load_splits()[split])
    return rows * int(np.prod(run.meta["stream"]["sample_shape"], dtype=np.int64)) * 4


def concat_results(parts: list[dict]) -> dict:
    """Per-batch results of ``combine.predict_arrays`` as one (nested dicts too)."""
    out: dict = {}
    for key, first in parts[0].items():
        if isinstance(first, dict):
            out[key] = concat_results([p[key] for p in parts])
        else:
            out[key] = np.concatenate([np.asarray(p[key]) for p in parts])
    return out


def predict_split(run: EnsembleRun, split: str = "test", out: str | Path | None = None, comm=None,
                  models: dict | None = None, batches: Iterator | None = None) -> tuple[dict, dict, int]:
    """The ensemble over ``split`` of a streamed run, a chunk at a time; the predictions
    written to ``out`` as they come (None: not written). Collective over ``comm``: rank 0
    reads each chunk and broadcasts it, every rank predicts with its members; ``batches``
    (rank 0's, for tests) replaces the chunks read. Returns (metrics, the predictions the
    metrics need, rows) on rank 0, ({}, {}, 0) elsewhere."""
    from ensemble.inference.combine import predict_arrays, score
    from ensemble.inference.outputs import PredictionWriter
    rank = comm.Get_rank() if comm is not None else 0
    models = {} if models is None else models
    writer = None
    parts: list[dict] = []
    ys: list[np.ndarray] = []
    if rank == 0:
        batches = batches if batches is not None else split_batches(run, split)
        n = len(RunDirectory(Path(run.path)).load_splits()[split])
        writer = PredictionWriter(out, run, n) if out is not None else None
    try:
        while True:
            x: np.ndarray | None = None
            y: np.ndarray | None = None
            head: tuple = ("end",)
            if rank == 0:
                try:
                    x, y = next(batches)          # type: ignore[arg-type]
                    head = ("batch", x.shape, x.dtype.str)
                except StopIteration:
                    head = ("end",)
                except Exception as exc:          # noqa: BLE001 - every rank must learn of it
                    head = ("error", str(exc) if isinstance(exc, (PredictError, ValueError)) else
                            f"{type(exc).__name__}: {exc}")
            if comm is not None:
                head = comm.bcast(head if rank == 0 else None, root=0)
            if head[0] == "end":
                break
            if head[0] == "error":
                raise PredictError(head[1])
            if comm is not None:
                if rank != 0:
                    x = np.empty(head[1], dtype=head[2])
                comm.Bcast(x, root=0)
            assert x is not None
            result = predict_arrays(run, x, comm, models)
            if rank == 0:
                if writer is not None:
                    writer.write(result, y)
                parts.append(result)
                ys.append(np.asarray(y))
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if rank != 0:
        return {}, {}, 0
    if writer is not None:
        writer.close()
    if not parts:
        raise PredictError(f"the run's {split} split has no rows")
    result, y_all = concat_results(parts), np.concatenate(ys)
    return score(run, result, y_all), result, len(y_all)

