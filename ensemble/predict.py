"""``python -m ensemble.predict RUN_DIR --data FILE``: a finished run's predictions with uncertainty.

Loads the ensemble a run chose (members and weights from ``ensemble.json``), reads FILE
with the training readers, applies the saved reshape and normalisation, averages the
members' predictions with their weights and writes each sample's prediction with its
uncertainty: the entropy split (total = aleatoric + epistemic) for classification, the
mixture's variance split for regression. ``--data test`` regenerates the run's own test
split, so the numbers in ``ensemble.json`` can be reproduced.

Under ``mpirun -n P`` member i runs on rank i % P. Rank 0 reads the file and broadcasts
the normalised features as numpy buffers; every rank loads only its members and sums
its weighted share; a Reduce to rank 0 gives the ensemble, and rank 0 alone writes.
``--export`` writes the whole ensemble as one Keras model instead.

Inputs with names are matched by name, never by position (CSV, Parquet, an HDF5 compound
dataset or pandas table, a DataFrame): a missing training column is an error that names
it, other columns are ignored and listed. ``--keep COL`` (repeatable or comma-separated)
carries input columns, IDs of any type, to the output's first columns in the input's row
order. Arrays without names are checked for dtype and width (flat or the training shape).

In a notebook, one process, no MPI::

    from ensemble.predict import predict_frame
    out = predict_frame("runs/digits", frame, keep=["sample_id"])   # DataFrame or array

returns a DataFrame with the columns the CSV would have (kept ones first, the frame's
index kept). This module is otherwise the command line; the work is in
``ensemble.inference``, whose public names are re-exported here (``load_run``,
``load_input``, ``predict_file``, ``predict_arrays``, ...).
"""

from __future__ import annotations

if __name__ == "__main__":            # thread limits before numpy and TensorFlow start their pools
    from ensemble.runtime.env import set_thread_env
    set_thread_env(1)

import argparse
import logging
import os
import sys
from pathlib import Path

import numpy as np

from ensemble.inference.combine import BATCH, member_output, predict_arrays, predict_file, score
from ensemble.inference.inputs import (
    TEST_KEYWORD,
    PredictInput,
    data_input,
    encode_targets,
    input_settings,
    load_input,
    match_columns,
    parse_keep,
    prepare_features,
    read_input,
)
from ensemble.inference.load import EnsembleRun, Member, PredictError, load_run
from ensemble.inference.outputs import (
    OUT_SUFFIXES,
    check_kept_names,
    format_metrics,
    prediction_arrays,
    prediction_columns,
    prediction_frame,
    write_predictions,
)
from ensemble.inference.streamed import is_streamed, predict_split

__all__ = ["BATCH", "EnsembleRun", "Member", "OUT_SUFFIXES", "PredictError", "PredictInput", "TEST_KEYWORD",
           "data_input", "encode_targets", "format_metrics", "input_settings", "load_input", "load_run", "main",
           "match_columns", "member_output", "predict_arrays", "predict_file", "predict_frame",
           "prediction_arrays", "prediction_columns", "prediction_frame", "prepare_features", "read_input",
           "score", "write_predictions"]

EXIT_INPUT, EXIT_PREDICT = 3, 4
STREAMED = "streamed"                 # what rank 0 found: --data test of a run whose data streams
_BCAST_BYTES = 1 << 28                # per Bcast message, far below the 2 GiB count limit
log = logging.getLogger("ensemble.predict")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ensemble.predict",
                                description="Predict with a finished run's ensemble (and its uncertainty), "
                                            "or export it as one Keras model.")
    p.add_argument("run_dir", help="run directory written by `python -m ensemble.run`")
    p.add_argument("--data", help=f"file to predict on (any format training reads), a built-in name, or "
                                  f"'{TEST_KEYWORD}' for the run's own test split")
    p.add_argument("--out", help="predictions file: .csv, .parquet or .npz (default: <data>_predictions.csv)")
    p.add_argument("--format", choices=("builtin", "npz", "npy", "csv", "parquet", "hdf5"),
                   help="format of --data when its suffix does not say")
    p.add_argument("--x", help="features array (npz) or dataset (HDF5); default: the run's data.x")
    p.add_argument("--y", help="targets array/dataset/.npy file, if any; default: the run's data.y")
    p.add_argument("--label", help="targets column of a table, if any (several: t1,t2); default: the run's "
                                    "data.label")
    p.add_argument("--keep", action="append", metavar="COL",
                   help="input column to carry to the output (IDs, any type), first in the output, in the "
                        "input's row order; repeatable or comma-separated: --keep id,site")
    p.add_argument("--export", metavar="FILE.keras", help="write the ensemble as one Keras model")
    args = p.parse_args(argv)
    if not args.data and not args.export:
        p.error("give --data FILE (predict) and/or --export FILE.keras")
    args.keep = parse_keep(args.keep)
    if args.keep and not args.data:
        p.error("--keep carries columns of --data to its predictions; give --data FILE")
    return args


def _prepare_on_root(args: argparse.Namespace):
    """Rank 0: load the run, check the output path, export, read the input -> (run, input, out)."""
    run = load_run(args.run_dir)
    check_kept_names(run, args.keep)
    out = Path(args.out or f"{Path(args.data).stem}_predictions.csv") if args.data else None
    if out is not None and out.suffix not in OUT_SUFFIXES:
        raise PredictError(f"--out must end in {', '.join(OUT_SUFFIXES)}, but got {str(out)!r}")
    if out is not None and not out.parent.is_dir():
        raise PredictError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist")
    if out is not None and not os.access(out.parent, os.W_OK):
        raise PredictError(f"--out {str(out)!r}: folder {str(out.parent)!r} is not writable; choose another --out")
    if out is not None and out.exists() and Path(args.data).exists() and out.samefile(args.data):
        raise PredictError(f"--out {str(out)!r} is the --data file: writing the predictions would replace its rows; "
                           "choose another --out")
    if out is not None and Path(os.path.realpath(run.path)) in Path(os.path.realpath(out.absolute())).parents:
        raise PredictError(f"--out {str(out)!r} is inside the run directory, whose files are the run's own "
                           "(its leaderboard, a member's model written over is lost): write the predictions "
                           "outside it")
    if args.export:
        from ensemble.inference.export import export_ensemble
        export_ensemble(run, args.export)
        log.info(f"wrote {args.export}: {len(run.members)} members -> "
                 + ("averaged probabilities" if run.task == "classification" else "[mean, variance]"))
    if not args.data:
        return run, None, None
    if args.data == TEST_KEYWORD and is_streamed(run):
        if args.keep:
            raise PredictError(f"--keep {', '.join(args.keep)}: --data test reads the run's test rows as arrays, "
                               "without the file's columns; predict on the data file to keep columns")
        return run, STREAMED, out                  # read a chunk at a time by every step below
    got = load_input(run, args.data, args.format, args.x, args.y, args.label, args.keep)
    return run, got, out


def _broadcast_features(comm, x: np.ndarray | None, shape: tuple, dtype: str) -> np.ndarray:
    """Rank 0's normalised features on every rank: chunked Bcast of the raw bytes."""
    if comm.Get_rank() != 0:
        x = np.empty(shape, dtype=dtype)
    flat = x.reshape(-1).view(np.uint8)
    for lo in range(0, flat.size, _BCAST_BYTES):
        comm.Bcast(flat[lo:lo + _BCAST_BYTES], root=0)
    return x


def predict_frame(run: str | Path | EnsembleRun, data, keep: str | list[str] = (), label: str | None = None):
    """In this process: the ensemble's predictions for ``data`` as a DataFrame, the CSV's columns.

    ``data`` is a DataFrame (columns matched by name, as for a CSV; other columns ignored and
    listed), a structured array (fields by name) or a plain array (checked for width and
    dtype). ``keep`` columns come first; ``target`` is added when the frame holds the targets
    column (``label``, default the run's ``data.label``). The frame's index is kept.
    """
    run = run if isinstance(run, EnsembleRun) else load_run(run)
    check_kept_names(run, parse_keep(keep))
    got = data_input(run, data, label, keep)
    result = predict_arrays(run, got.x)
    return prediction_frame(run, result, got.y, got.kept, index=got.index)


def _predict_streamed(run: EnsembleRun, out: Path | None, comm, data: str) -> int:
    """``--data test`` of a run whose data streamed: the test rows a chunk at a time through
    the members, the predictions written as they come (``inference.streamed.predict_split``)."""
    size = comm.Get_size()
    try:
        metrics, _, n = predict_split(run, "test", out, comm if size > 1 else None)
    except PredictError as exc:
        log.error(f"error: {exc}")
        return EXIT_PREDICT
    if comm.Get_rank() != 0:
        return 0
    log.info(f"wrote {out}: {n} predictions from {len(run.members)} member{'s' * (len(run.members) != 1)} on {size} "
             "rank(s), the test rows "
             "read a chunk at a time (the run's data streams)")
    log.info(format_metrics(f"{data} ({n} samples)", metrics))
    recorded = run.summary.get("ensemble", {}).get("test")
    if recorded:
        log.info(format_metrics("ensemble.json test", recorded))
    return 0


def _is_training_file(data: str, run) -> bool:
    """``--data`` names the file the run trained on (its ``data.source``)."""
    source = run.config.data.source
    try:
        return bool(source) and Path(data).is_file() and Path(data).resolve() == Path(source).resolve()
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ensemble.runtime import mpi
    from ensemble.runtime.env import bind_gpu, set_thread_env
    from ensemble.runtime.logs import setup_logging
    set_thread_env(1)
    mpi.abort_on_exception()
    comm = mpi.world
    rank, size = comm.Get_rank(), comm.Get_size()
    setup_logging(rank)
    bind_gpu(mpi.node_local_rank(comm))

    run = got = x = out = status = None
    if rank == 0:                                  # decide on rank 0, then tell every rank
        try:
            run, got, out = _prepare_on_root(args)
            x = None if got is None or got is STREAMED else got.x
            status = ("ok", run, STREAMED if got is STREAMED else None if x is None else (x.shape, x.dtype.str))
        except Exception as exc:                   # noqa: BLE001 - every rank must learn of it
            kind = "" if isinstance(exc, ValueError) else f"{type(exc).__name__}: "
            status = ("error", f"error: {kind}{exc}", None)
    status = mpi.polite_bcast(comm, status, 0)
    if status[0] != "ok":
        log.error(status[1])
        return EXIT_INPUT
    run, layout = status[1], status[2]
    if layout is None:                             # --export only
        return 0
    if layout == STREAMED:
        return _predict_streamed(run, out, comm, args.data)
    if size > 1:
        x = _broadcast_features(comm, x, *layout)
    try:
        result = predict_arrays(run, x, comm if size > 1 else None)
    except PredictError as exc:
        log.error(f"error: {exc}")
        return EXIT_PREDICT
    if rank != 0:
        return 0
    y = got.y
    try:
        write_predictions(out, run, result, y, got.kept)
    except OSError as exc:                         # a read-only or full file system, found only on writing
        log.error(f"error: cannot write --out {str(out)!r}: {exc.strerror or exc}; choose another --out")
        return EXIT_PREDICT
    log.info(f"wrote {out}: {len(x)} predictions from {len(run.members)} member{'s' * (len(run.members) != 1)} on "
             f"{size} rank(s)" + (f", with input column(s) {', '.join(got.kept)}" if got.kept else ""))
    if y is not None:
        log.info(format_metrics(f"{args.data} ({len(y)} samples)", score(run, result, y)))
        if _is_training_file(args.data, run):
            log.warning(f"{args.data} is the run's own `data.source`: these rows include the ones the members "
                        "trained and stopped on, so the metrics above flatter the ensemble; `--data test` scores "
                        "the test rows alone")
        recorded = run.summary.get("ensemble", {}).get("test")
        if args.data == TEST_KEYWORD and recorded:
            log.info(format_metrics("ensemble.json test", recorded))
    return 0


if __name__ == "__main__":                        # run the importable module, so that pickled and
    from ensemble.predict import main as _main  # isinstance-checked classes are one and the same
    sys.exit(_main())
