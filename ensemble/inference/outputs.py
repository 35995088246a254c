"""What ``ensemble.predict`` writes: per-sample arrays (.npz) or columns (.csv/.parquet), or
returns (a DataFrame); the input's kept columns (``--keep``) come first, in its row order."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble.inference.load import EnsembleRun, PredictError
from ensemble.results.rundir import atomic_write
from ensemble.task.metrics import COVERAGE_LEVELS, level_key, metric_text

OUT_SUFFIXES = (".csv", ".npz", ".parquet")


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
    for level, half in (result.get("intervals") or {}).items():     # recalibrated on validation
        out[f"lower_{level}"] = result["mean"] - half
        out[f"upper_{level}"] = result["mean"] + half
    if y is not None:
        out["target"] = y
    return out


def output_suffixes(run: EnsembleRun) -> list[str]:
    """A regression output's column suffix: its target column's name when the run was trained on
    several named columns (``data.label = ["t1", "t2"]``: mean_t1, mean_t2), else its index."""
    from datafeed.readers import label_columns
    names = label_columns(run.config.data.label)
    return names if len(names) == run.n_outputs > 1 else [str(i) for i in range(run.n_outputs)]


def prediction_columns(run: EnsembleRun, result: dict, y: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """What the .csv/.parquet holds: one column per class probability and per regression output."""
    columns = {}
    for name, values in prediction_arrays(run, result, y).items():
        if name == "class_names":
            continue
        if name == "proba":
            columns.update({f"p_{c}": values[:, i] for i, c in enumerate(run.class_names)})
        elif values.ndim == 2:
            columns.update({f"{name}_{s}": values[:, i] for i, s in enumerate(output_suffixes(run))})
        else:
            columns[name] = values
    return columns


def output_names(run: EnsembleRun) -> set[str]:
    """Every name ``prediction_arrays``/``prediction_columns`` may write for this run."""
    if run.task == "classification":
        return {"prediction", "proba", "class_names", "total_entropy", "aleatoric", "epistemic", "target",
                *(f"p_{c}" for c in run.class_names)}
    base = ("mean", "std", "aleatoric_var", "epistemic_var", "target",
            *(f"{side}_{level_key(level)}" for side in ("lower", "upper") for level in COVERAGE_LEVELS))
    return {*base, *(f"{b}_{s}" for b in base for s in output_suffixes(run))}


def check_kept_names(run: EnsembleRun, keep: list[str], taken: set[str] | None = None) -> None:
    """Kept columns must not share a name with a prediction column (checked before predicting)."""
    clash = [k for k in keep if k in (output_names(run) if taken is None else taken)]
    if clash:
        raise PredictError(f"--keep {', '.join(map(repr, clash))}: the output has a prediction column of "
                           "that name (or, in .npz, a name np.savez takes); rename the input column")


def prediction_frame(run: EnsembleRun, result: dict, y: np.ndarray | None = None,
                     kept: dict[str, np.ndarray] | None = None, index=None):
    """The .csv/.parquet columns as a DataFrame: kept columns first, then the predictions."""
    import pandas as pd
    columns = prediction_columns(run, result, y)
    check_kept_names(run, list(kept or {}), set(columns))
    return pd.DataFrame({**(kept or {}), **columns}, index=index)


def write_predictions(path: str | Path, run: EnsembleRun, result: dict, y: np.ndarray | None = None,
                      kept: dict[str, np.ndarray] | None = None) -> Path:
    """Write .csv, .parquet (columns) or .npz (arrays; text kept as str arrays); returns the path."""
    path = Path(path)
    if path.suffix == ".npz":
        arrays = prediction_arrays(run, result, y)
        check_kept_names(run, list(kept or {}), set(arrays) | {"file", "allow_pickle"})   # np.savez's own
        text = {k: np.asarray(v).astype(str) if np.asarray(v).dtype.kind == "O" else np.asarray(v)
                for k, v in (kept or {}).items()}           # no pickled object arrays in the .npz
        return atomic_write(path, lambda tmp: np.savez(tmp, **text, **arrays))
    frame = prediction_frame(run, result, y, kept)
    # written whole or not at all: a killed predict leaves no file whose rows look complete
    if path.suffix == ".csv":
        return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))
    return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def format_metrics(label: str, metrics: dict[str, float]) -> str:
    head = f"{label:<28}" if len(label) < 28 else f"{label}  "
    return head + "  ".join(f"{k} {metric_text(v)}" for k, v in metrics.items())


class PredictionWriter:
    """Predictions written a batch at a time, for a split too large to hold (a streamed run's
    ``--data test``): .csv rows appended, .parquet row groups, .npz arrays filled in place in
    ``.npy`` files of the known length and stored in the archive at the end; the same columns
    and arrays ``write_predictions`` writes. The file appears whole at ``close`` (fsync,
    rename), as ``write_predictions``'s does; ``abort`` leaves nothing."""

    def __init__(self, path: str | Path, run: EnsembleRun, n: int):
        self.path, self.run, self.n, self.at = Path(path), run, n, 0
        self.tmp = self.path.with_name(self.path.name + ".part" + self.path.suffix)
        self.arrays: dict = {}
        self.parquet = None
        self.folder: Path | None = None

    def write(self, result: dict, y: np.ndarray | None = None) -> None:
        """The next rows' predictions (``combine.predict_arrays``'s result) and targets."""
        if self.path.suffix == ".npz":
            self._npz(prediction_arrays(self.run, result, y))
        else:
            frame = prediction_frame(self.run, result, y)
            if self.path.suffix == ".csv":
                frame.to_csv(self.tmp, index=False, header=self.at == 0, mode="w" if self.at == 0 else "a")
            else:
                import pyarrow as pa
                import pyarrow.parquet as pq
                table = pa.Table.from_pandas(frame, preserve_index=False)
                if self.parquet is None:
                    self.parquet = pq.ParquetWriter(self.tmp, table.schema)
                self.parquet.write_table(table)          # type: ignore[attr-defined]
            self.at += len(frame)

    def _npz(self, arrays: dict[str, np.ndarray]) -> None:
        import tempfile
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix=self.path.name + ".", dir=self.path.parent))
        rows = len(next(v for k, v in arrays.items() if k != "class_names"))
        for name, values in arrays.items():
            values = np.asarray(values)
            if name == "class_names":
                if name not in self.arrays:
                    np.save(self.folder / f"{name}.npy", values)
                    self.arrays[name] = None
                continue
            if name not in self.arrays:
                self.arrays[name] = np.lib.format.open_memmap(self.folder / f"{name}.npy", mode="w+",
                                                              dtype=values.dtype, shape=(self.n, *values.shape[1:]))
            self.arrays[name][self.at:self.at + rows] = values
        self.at += rows

    def close(self) -> Path:
        """Finish the file: fsync, rename to ``path``; returns it."""
        import os
        if self.at != self.n:
            self.abort()
            raise PredictError(f"{self.path}: {self.at} rows written, {self.n} expected")
        if self.path.suffix == ".npz":
            import zipfile
            for memmap in self.arrays.values():
                if memmap is not None:
                    memmap.flush()
            with zipfile.ZipFile(self.tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
                for name in self.arrays:          # what np.savez writes: NAME.npy members, stored
                    z.write(self.folder / f"{name}.npy", f"{name}.npy")     # type: ignore[operator]
            self._drop_folder()
        elif self.parquet is not None:
            self.parquet.close()
        fd = os.open(self.tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Stop without a file: what was written so far is removed."""
        if self.parquet is not None:
            self.parquet.close()
            self.parquet = None
        self._drop_folder()
        self.tmp.unlink(missing_ok=True)

    def _drop_folder(self) -> None:
        import shutil
        self.arrays = {k: None for k in self.arrays}
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
