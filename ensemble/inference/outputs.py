"""What ``ensemble.predict`` writes: per-sample arrays (.npz) or columns (.csv/.parquet)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble.inference.load import EnsembleRun

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
