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
``--export`` writes the whole ensemble as one Keras model instead. This module is the
command line only; the work is in ``ensemble.inference`` (whose public names are
re-exported here for notebooks: ``load_run``, ``predict_file``, ``predict_arrays``, ...).
"""

from __future__ import annotations

if __name__ == "__main__":            # thread limits before numpy and TensorFlow start their pools
    from ensemble.runtime.env import set_thread_env
    set_thread_env(1)

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

from ensemble.inference.combine import BATCH, member_output, predict_arrays, predict_file, score
from ensemble.inference.inputs import (TEST_KEYWORD, encode_targets, input_settings, prepare_features,
                                       read_input)
from ensemble.inference.load import EnsembleRun, Member, PredictError, load_run
from ensemble.inference.outputs import (OUT_SUFFIXES, format_metrics, prediction_arrays, prediction_columns,
                                        write_predictions)

__all__ = ["BATCH", "EnsembleRun", "Member", "OUT_SUFFIXES", "PredictError", "TEST_KEYWORD", "encode_targets",
           "format_metrics", "input_settings", "load_run", "main", "member_output", "predict_arrays",
           "predict_file", "prediction_arrays", "prediction_columns", "prepare_features", "read_input",
           "score", "write_predictions"]

EXIT_INPUT, EXIT_PREDICT = 3, 4
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
    p.add_argument("--label", help="CSV/Parquet targets column, if any; default: the run's data.label")
    p.add_argument("--export", metavar="FILE.keras", help="write the ensemble as one Keras model")
    args = p.parse_args(argv)
    if not args.data and not args.export:
        p.error("give --data FILE (predict) and/or --export FILE.keras")
    return args


def _prepare_on_root(args: argparse.Namespace):
    """Rank 0: load the run, check the output path, export, read the input -> (run, x, y, out)."""
    run = load_run(args.run_dir)
    out = Path(args.out or f"{Path(args.data).stem}_predictions.csv") if args.data else None
    if out is not None and out.suffix not in OUT_SUFFIXES:
        raise PredictError(f"--out must end in {', '.join(OUT_SUFFIXES)}, but got {str(out)!r}")
    if out is not None and not out.parent.is_dir():
        raise PredictError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist")
    if args.export:
        from ensemble.inference.export import export_ensemble
        export_ensemble(run, args.export)
        log.info(f"wrote {args.export}: {len(run.members)} members -> "
                 + ("averaged probabilities" if run.task == "classification" else "[mean, variance]"))
    if not args.data:
        return run, None, None, None
    x, y = read_input(run, args.data, args.format, args.x, args.y, args.label)
    return run, x, y, out


def _broadcast_features(comm, x: np.ndarray | None, shape: tuple, dtype: str) -> np.ndarray:
    """Rank 0's normalised features on every rank: chunked Bcast of the raw bytes."""
    if comm.Get_rank() != 0:
        x = np.empty(shape, dtype=dtype)
    flat = x.reshape(-1).view(np.uint8)
    for lo in range(0, flat.size, _BCAST_BYTES):
        comm.Bcast(flat[lo:lo + _BCAST_BYTES], root=0)
    return x


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

    run = x = y = out = status = None
    if rank == 0:                                  # decide on rank 0, then tell every rank
        try:
            run, x, y, out = _prepare_on_root(args)
            status = ("ok", run, None if x is None else (x.shape, x.dtype.str))
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
    if size > 1:
        x = _broadcast_features(comm, x, *layout)
    try:
        result = predict_arrays(run, x, comm if size > 1 else None)
    except PredictError as exc:
        log.error(f"error: {exc}")
        return EXIT_PREDICT
    if rank != 0:
        return 0
    write_predictions(out, run, result, y)
    log.info(f"wrote {out}: {len(x)} predictions from {len(run.members)} members on {size} rank(s)")
    if y is not None:
        log.info(format_metrics(f"{args.data} ({len(y)} samples)", score(run, result, y)))
        recorded = run.summary.get("ensemble", {}).get("test")
        if args.data == TEST_KEYWORD and recorded:
            log.info(format_metrics("ensemble.json test", recorded))
    return 0


if __name__ == "__main__":                        # run the importable module, so that pickled and
    from ensemble.predict import main as _main    # isinstance-checked classes are one and the same
    sys.exit(_main())
