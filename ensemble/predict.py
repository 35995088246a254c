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
``--export`` writes the whole ensemble as one Keras model instead (``ensemble.export``).
"""

from __future__ import annotations

if __name__ == "__main__":            # thread limits before numpy and TensorFlow start their pools
    from ensemble.run import set_thread_env
    set_thread_env(1)

import argparse
import json
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ensemble import metrics as M
from ensemble.member import VAR_FLOOR, predict

TEST_KEYWORD = "test"
OUT_SUFFIXES = (".csv", ".npz", ".parquet")
EXIT_INPUT, EXIT_PREDICT = 3, 4
BATCH = 512                           # rows per model call, as in training (same float32 results)
_BCAST_BYTES = 1 << 28                # per Bcast message, far below the 2 GiB count limit
_CLI_NAMES = {"`data.source`": "--data", "`data.x`": "--x", "`data.y`": "--y", "`data.label`": "--label",
              "set `data.format`": "pass --format"}


class PredictError(ValueError):
    """The run directory or the input cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Member:
    """One ensemble member: its weight (normalised over the ensemble) and output scaling."""
    id: str
    weight: float
    model_path: str
    y_shift: float = 0.0
    y_scale: float = 1.0
    gaussian: bool = False


@dataclass(frozen=True)
class EnsembleRun:
    """What prediction needs from a run directory; small, picklable, no TensorFlow."""
    path: str
    config: dict
    meta: dict
    members: tuple[Member, ...]
    shift: np.ndarray
    scale: np.ndarray
    summary: dict

    @property
    def task(self) -> str:
        return self.meta["task"]

    @property
    def class_names(self) -> list[str]:
        return [str(c) for c in self.meta.get("class_names", [])]

    @property
    def n_outputs(self) -> int:
        return int(self.meta["n_outputs"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.meta["input_shape"])

    @property
    def gaussian(self) -> bool:
        """Every member predicts a variance (then metrics include nll, as in ensemble.json)."""
        return all(m.gaussian for m in self.members)


# ------------------------------------------------------------------------- run directory
def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PredictError(f"cannot read {str(path)!r}: {exc}") from None


def load_run(run_dir: str | Path) -> EnsembleRun:
    """Read a run directory's ensemble, data description and normalisation; check the members."""
    path = Path(run_dir)
    if not path.is_dir():
        raise PredictError(f"run directory {str(path)!r} does not exist; pass the directory that "
                           "`python -m ensemble.run` wrote (runs/<name>, or its --run-dir)")
    for name in ("config.toml", "data.json", "normalization.npz", "ensemble.json"):
        if not (path / name).is_file():
            why = ("the run has not chosen an ensemble yet (unfinished or failed); finish it with "
                   "`python -m ensemble.run CONFIG --resume`" if name == "ensemble.json"
                   else "it is not a complete run directory")
            raise PredictError(f"{str(path / name)!r} does not exist: {why}")
    summary = _read_json(path / "ensemble.json")
    meta = _read_json(path / "data.json")
    from ensemble.config import resolve_config
    config = resolve_config(tomllib.loads((path / "config.toml").read_text()))   # defaults back in
    with np.load(path / "normalization.npz") as norm:
        shift, scale = norm["shift"].astype(np.float32), norm["scale"].astype(np.float32)
    entries = [m for m in summary.get("members", []) if float(m.get("weight", 0.0)) > 0]
    total = sum(float(m["weight"]) for m in entries)
    if not entries or not np.isfinite(total):
        raise PredictError(f"{str(path / 'ensemble.json')!r} lists no member with a positive weight")
    members = []
    for m in entries:
        folder = path / "members" / m["id"]
        if not (folder / "model.keras").is_file():
            raise PredictError(f"ensemble member {m['id']!r} has no model file "
                               f"{str(folder / 'model.keras')!r}; the run directory is incomplete")
        scaling = {}
        if (folder / "scaling.json").is_file():
            scaling = _read_json(folder / "scaling.json")
        elif meta["task"] == "regression":
            raise PredictError(f"regression member {m['id']!r} has no {str(folder / 'scaling.json')!r}, "
                               "so its outputs cannot be put back into the targets' units")
        members.append(Member(m["id"], float(m["weight"]) / total, str(folder / "model.keras"),
                              float(scaling.get("y_shift", 0.0)), float(scaling.get("y_scale", 1.0)),
                              bool(scaling.get("gaussian", False))))
    return EnsembleRun(str(path), config, meta, tuple(members), shift, scale, summary)


# ------------------------------------------------------------------------------ inputs
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
        if columns is not None and set(names) <= set(columns):
            data["features"] = list(names)        # a table's columns, picked by name in training order
    return data


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


# -------------------------------------------------------------------------- prediction
def member_output(member: Member, model, x: np.ndarray, task: str) -> tuple[np.ndarray, np.ndarray | None]:
    """One member on normalised ``x``: probabilities (n, C), or its mean (n, k) and variance
    (n, k; None without a variance head) in the targets' units."""
    return predict(model, x, task, member.y_shift, member.y_scale, member.gaussian, BATCH, squeeze=False)


def _local_ensemble(run: EnsembleRun, x: np.ndarray, rank: int, size: int) -> tuple[float, dict | None]:
    """This rank's members (i % size == rank) averaged among themselves, and their total weight."""
    mine = run.members[rank::size]
    if not mine:
        return 0.0, None
    import keras
    from ensemble.member import configure_tensorflow
    configure_tensorflow(1)
    outs = []
    for m in mine:
        try:
            model = keras.models.load_model(m.model_path, compile=False)
        except Exception as exc:                   # noqa: BLE001 - a corrupt or foreign file
            raise PredictError(f"member {m.id!r}: cannot load {m.model_path!r}: {exc}") from exc
        want = run.n_outputs * (2 if m.gaussian else 1)
        if model.output_shape[-1] != want:
            raise PredictError(f"member {m.id!r} outputs {model.output_shape[-1]} values per sample, but "
                               f"{want} are expected for this {run.task} ensemble")
        outs.append(member_output(m, model, x, run.task))
    w = np.array([m.weight for m in mine])
    preds = np.stack([o[0] for o in outs])
    if run.task == "classification":
        return float(w.sum()), M.classification_uncertainty(preds, w)
    variances = None
    if any(o[1] is not None for o in outs):   # a member without a variance head adds no aleatoric part
        variances = np.stack([o[1] if o[1] is not None else np.zeros_like(o[0]) for o in outs])
    return float(w.sum()), M.regression_mixture(preds, variances, w)


def predict_arrays(run: EnsembleRun, x: np.ndarray, comm=None) -> dict[str, np.ndarray]:
    """The ensemble on normalised ``x``, spread over ``comm``'s ranks (None: this process only).

    Classification: "proba" (n, C), "total", "aleatoric", "epistemic" (n,) in nats.
    Regression: "mean", "var", "std", "aleatoric", "epistemic", each (n,) or (n, k).
    Collective over ``comm``; the result is complete on rank 0 only (empty elsewhere).
    """
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    n, k = len(x), run.n_outputs
    error, weight, part = None, 0.0, None
    try:
        weight, part = _local_ensemble(run, x, rank, size)
    except Exception as exc:                       # noqa: BLE001 - every rank must learn of it
        error = str(exc) if isinstance(exc, PredictError) else f"{type(exc).__name__}: {exc}"
        if size == 1:
            raise PredictError(error) from exc
        error = f"rank {rank}: {error}"
    if size > 1:
        from ensemble import mpi
        mpi.polite_barrier(comm)                   # idle ranks sleep while the others predict
        errors = [e for e in comm.allgather(error) if e]
        if errors:
            raise PredictError("; ".join(errors))
    if size == 1:                                  # the weights sum to one: nothing to combine
        return _squeeze(dict(part), run)
    if run.task == "classification":
        buf = np.zeros((n, k + 1))
        if part is not None:
            buf[:, :k], buf[:, k] = weight * part["proba"], weight * part["aleatoric"]
        buf = _reduce(comm, buf)
        if rank != 0:
            return {}
        proba, aleatoric = buf[:, :k], buf[:, k]
        total = M.classification_uncertainty(proba[None])["total"]     # entropy of the ensemble mean
        return {"proba": proba, "total": total, "aleatoric": aleatoric,
                "epistemic": np.maximum(total - aleatoric, 0.0)}
    local_mean = part["mean"].reshape(n, k) if part is not None else np.zeros((n, k))
    mean = np.zeros((n, k))
    comm.Allreduce(weight * local_mean, mean)      # two passes: spread about the global mean
    buf = np.zeros((n, 2 * k))
    if part is not None:
        buf[:, :k] = weight * part["aleatoric"].reshape(n, k)
        buf[:, k:] = weight * (part["epistemic"].reshape(n, k) + (local_mean - mean) ** 2)
    buf = _reduce(comm, buf)
    if rank != 0:
        return {}
    aleatoric, epistemic = buf[:, :k], buf[:, k:]
    var = aleatoric + epistemic
    return _squeeze({"mean": mean, "var": var, "std": np.sqrt(var), "aleatoric": aleatoric,
                     "epistemic": epistemic}, run)


def _reduce(comm, buf: np.ndarray) -> np.ndarray | None:
    out = np.empty_like(buf) if comm.Get_rank() == 0 else None
    comm.Reduce(buf, out, root=0)                  # numpy buffers, summed; no pickling
    return out


def _squeeze(result: dict, run: EnsembleRun) -> dict[str, np.ndarray]:
    if run.task == "regression":
        n, k = len(result["mean"]), run.n_outputs
        result = {key: np.asarray(v).reshape((n,) if k == 1 else (n, k)) for key, v in result.items()}
    return result


def predict_file(run_dir: str | Path, source: str, **overrides) -> tuple[dict, np.ndarray | None]:
    """In one process: the ensemble's prediction on ``source`` and its encoded targets (or None)."""
    run = load_run(run_dir)
    x, y = read_input(run, source, **overrides)
    return predict_arrays(run, x), y


def score(run: EnsembleRun, result: dict, y: np.ndarray) -> dict[str, float]:
    """The metrics ``ensemble.json`` reports, on these predictions."""
    if run.task == "classification":
        return M.classification_metrics(y, result["proba"])
    return M.regression_metrics(y, result["mean"], result["var"] if run.gaussian else None)


# ----------------------------------------------------------------------------- outputs
def prediction_arrays(run: EnsembleRun, result: dict, y: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """What the .npz holds: per-sample arrays ((n,) or (n, k)) by name."""
    if run.task == "classification":
        names = np.array(run.class_names)
        out = {"prediction": names[result["proba"].argmax(axis=1)], "proba": result["proba"],
               "class_names": names, "total_entropy": result["total"], "aleatoric": result["aleatoric"],
               "epistemic": result["epistemic"]}
        if y is not None:
            out["target"] = names[y]
        return out
    out = {"mean": result["mean"], "std": result["std"], "aleatoric_var": result["aleatoric"],
           "epistemic_var": result["epistemic"]}
    if y is not None:
        out["target"] = y
    return out


def prediction_columns(run: EnsembleRun, result: dict, y: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """What the .csv/.parquet holds: one column per class probability and per regression output."""
    columns = {}
    for name, values in prediction_arrays(run, result, y).items():
        if name == "class_names":
            continue
        if name == "proba":
            columns.update({f"p_{c}": values[:, i] for i, c in enumerate(run.class_names)})
        elif values.ndim == 2:
            columns.update({f"{name}_{i}": values[:, i] for i in range(values.shape[1])})
        else:
            columns[name] = values
    return columns


def write_predictions(path: str | Path, run: EnsembleRun, result: dict, y: np.ndarray | None = None) -> Path:
    """Write .csv, .parquet (columns) or .npz (arrays); returns the path."""
    path = Path(path)
    if path.suffix == ".npz":
        np.savez(path, **prediction_arrays(run, result, y))
        return path
    import pandas as pd
    frame = pd.DataFrame(prediction_columns(run, result, y))
    frame.to_csv(path, index=False) if path.suffix == ".csv" else frame.to_parquet(path, index=False)
    return path


def format_metrics(label: str, metrics: dict[str, float]) -> str:
    return f"{label:<28}" + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())


# --------------------------------------------------------------------------------- CLI
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
        from ensemble.export import export_ensemble
        export_ensemble(run, args.export)
        print(f"wrote {args.export}: {len(run.members)} members -> "
              + ("averaged probabilities" if run.task == "classification" else "[mean, variance]"), flush=True)
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
    from ensemble import mpi
    from ensemble.run import bind_gpu, set_thread_env
    set_thread_env(1)
    mpi.abort_on_exception()
    comm = mpi.world
    rank, size = comm.Get_rank(), comm.Get_size()
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
        if rank == 0:
            print(status[1], file=sys.stderr, flush=True)
        return EXIT_INPUT
    run, layout = status[1], status[2]
    if layout is None:                             # --export only
        return 0
    if size > 1:
        x = _broadcast_features(comm, x, *layout)
    try:
        result = predict_arrays(run, x, comm if size > 1 else None)
    except PredictError as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_PREDICT
    if rank != 0:
        return 0
    write_predictions(out, run, result, y)
    print(f"wrote {out}: {len(x)} predictions from {len(run.members)} members on {size} rank(s)", flush=True)
    if y is not None:
        print(format_metrics(f"{args.data} ({len(y)} samples)", score(run, result, y)), flush=True)
        recorded = run.summary.get("ensemble", {}).get("test")
        if args.data == TEST_KEYWORD and recorded:
            print(format_metrics("ensemble.json test", recorded), flush=True)
    return 0


if __name__ == "__main__":                        # run the importable module, so that pickled and
    from ensemble.predict import main as _main    # isinstance-checked classes are one and the same
    sys.exit(_main())
