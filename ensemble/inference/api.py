"""A finished run in a notebook: ``ens = ensemble.load("runs/name")``.

``Ensemble`` holds what ``python -m ensemble.predict`` uses (``load_run``) plus the run's
tables as pandas objects; its models are loaded on the first prediction and kept, so a
notebook's second call costs only the forward passes. Inputs are raw features, as in the
data file: a DataFrame or structured array (columns matched by name), or a plain array
(checked for width and dtype); they are reshaped and normalised as in training.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ensemble.inference.combine import predict_arrays, score
from ensemble.inference.inputs import data_input, encode_targets
from ensemble.inference.load import EnsembleRun, load_run
from ensemble.inference.outputs import prediction_frame

if TYPE_CHECKING:
    from ensemble.config import RunConfig


class Ensemble:
    """A run directory's ensemble. ``predict(x)`` -> (mean, spread): for classification the
    averaged probabilities (n, classes) and the predictive entropy in nats (n,); for
    regression the mean and the standard deviation (recalibrated as ``ensemble.json``
    says), each (n,) or (n, outputs). ``predict_details(x)`` has every quantity (intervals,
    aleatoric and epistemic parts); ``predict_frame`` the CLI's table."""

    def __init__(self, run_dir: str | Path):
        self._run: EnsembleRun = load_run(run_dir)
        self._models: dict = {}
        self._written = self._stamp()

    def _stamp(self) -> int | None:
        """When the run's ``ensemble.json`` was written (ns): a run directory written again since
        ``load`` (``--overwrite``, ``reselect``) holds other splits, members or weights."""
        try:
            from ensemble.results.rundir import RunDirectory
            return (self.path / RunDirectory.ENSEMBLE).stat().st_mtime_ns
        except OSError:
            return None

    def _current(self) -> None:
        """Refuse to answer for the run directory once its files are no longer the ones this
        handle loaded (a notebook cell re-run with ``overwrite=True`` left an older handle
        reading the new run's test rows against its own models, unsaid; after ``reselect`` a
        handle that had predicted went on answering with the ensemble it replaced): every
        prediction, table and metric asks."""
        if self._stamp() != self._written:
            from ensemble.inference.load import PredictError
            raise PredictError(f"{str(self.path)!r} was written again since it was loaded (a run with "
                               "--overwrite, or reselect): its splits and members are not this handle's; "
                               f"load it again: ensemble.load({str(self.path)!r})")

    # -- what the run is -----------------------------------------------------------------
    @property
    def path(self) -> Path:
        return Path(self._run.path)

    @property
    def task(self) -> str:
        return self._run.task

    @property
    def config(self) -> RunConfig:
        """The run's resolved config (every default filled in), as ``config.toml`` holds it:
        typed and read-only (``ens.config.train.epochs``; ``.to_dict()`` for the plain tables)."""
        return self._run.config

    @property
    def summary(self) -> dict:
        """``ensemble.json``: selection, calibration, test and validation metrics, run figures."""
        self._current()
        return self._run.summary

    @property
    def metrics(self) -> dict:
        """The ensemble's metrics on the run's test split (``ensemble.json``)."""
        self._current()
        return self._run.summary["ensemble"]["test"]

    @property
    def class_names(self) -> list[str]:
        return self._run.class_names

    @property
    def members(self):
        """The chosen members: id, weight (summing to 1), model file; a DataFrame."""
        import pandas as pd
        self._current()
        return pd.DataFrame([{"id": m.id, "weight": m.weight, "model": m.model_path} for m in self._run.members])

    @property
    def leaderboard(self):
        """Every member the run trained, ranked by the validation metric (``leaderboard.csv``)."""
        import pandas as pd
        self._current()
        return pd.read_csv(self.path / "leaderboard.csv")

    def journal(self):
        """One row per member record of the journal (flattened: ``val.accuracy`` ...)."""
        import pandas as pd

        from ensemble.results.rundir import RunDirectory
        self._current()
        return pd.json_normalize(RunDirectory(self.path).read_journal())

    # -- using it ------------------------------------------------------------------------
    def predict_details(self, x) -> dict[str, np.ndarray]:
        """Every per-sample quantity of the ensemble on raw features ``x`` (see ``combine``)."""
        self._current()
        return predict_arrays(self._run, data_input(self._run, x).x, models=self._models)

    def predict(self, x) -> tuple[np.ndarray, np.ndarray]:
        """(mean, spread) on raw features ``x``; see the class docstring."""
        out = self.predict_details(x)
        if self.task == "classification":
            return out["proba"], out["total"]
        return out["mean"], out["std"]

    def predict_frame(self, data, keep=(), label: str | None = None):
        """The predictions as a DataFrame with the same columns ``python -m ensemble.predict``
        writes; ``keep`` names input columns to carry through (a DataFrame's ids)."""
        self._current()
        got = data_input(self._run, data, label, keep)
        result = predict_arrays(self._run, got.x, models=self._models)
        return prediction_frame(self._run, result, got.y, got.kept, index=got.index)

    def evaluate(self, x, y) -> dict[str, float]:
        """The metrics ``ensemble.json`` reports, on raw features ``x`` and targets ``y``."""
        result = self.predict_details(x)
        return score(self._run, result, encode_targets(self._run, y, len(result[next(iter(result))])))

    def export(self, path: str | Path, format: str = "keras") -> Path:
        """Write the ensemble as one model that takes raw features: "keras", "saved_model"
        or "onnx" (``inference.export.export_model``; docs/export.md)."""
        from ensemble.inference.export import export_model
        self._current()
        return export_model(self._run, path, format)

    def data(self, split: str = "test") -> tuple[np.ndarray, np.ndarray]:
        """The run's own ``split`` ("train", "val" or "test") as read from its data file(s):
        (features as the members' input before normalisation: a table's text columns one-hot,
        as ``predict`` takes them; targets), the rows ``splits.npz`` records. Reads the data again, as
        the run did (``datafeed.splits.read_data``); a run whose data streamed reads only the
        split's rows, a chunk at a time, and refuses a split that would not fit in memory
        (``data.memory_share`` of ``data.node_memory_gb``): use ``data_batches`` or
        ``predict_split`` for that."""
        from ensemble.inference.streamed import is_streamed, raw_batches, split_nbytes
        self._current()
        if not is_streamed(self._run):
            from ensemble.inference.load import run_split
            return run_split(self.path, self.config, self._run.meta, split)
        from datafeed.streaming import will_stream
        if will_stream(self.config.data.replace(stream="auto"), split_nbytes(self._run, split)):
            from ensemble.inference.load import PredictError
            raise PredictError(f"the run's {split} split takes {split_nbytes(self._run, split) / 1e9:.2f} GB as "
                               f"float32, more than `data.memory_share` of a node's memory; read it with "
                               f"data_batches({split!r}) or predict on it with predict_split({split!r})")
        parts = list(raw_batches(self._run, split))
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])

    def data_batches(self, split: str = "test", rows: int = 4096):
        """The run's own ``split`` as ``data`` gives it, a batch at a time: (raw features,
        targets) pairs in row order; a run whose data streamed reads them from its files a
        chunk at a time (about 4 MiB each), never the whole split (``rows`` is then unused)."""
        from ensemble.inference.streamed import is_streamed, raw_batches
        self._current()
        if is_streamed(self._run):
            yield from raw_batches(self._run, split)
            return
        x, y = self.data(split)
        for a in range(0, len(x), rows):
            yield x[a:a + rows], y[a:a + rows]

    def predict_split(self, split: str = "test", out: str | Path | None = None) -> dict[str, float]:
        """The ensemble on the run's own ``split``: its metrics (as ``ensemble.json`` reports
        them), and the predictions written to ``out`` (.csv, .parquet or .npz; None: not
        written). A run whose data streamed is read and predicted a chunk at a time, the
        predictions written as they come, so a split larger than memory works; only the few
        numbers a row the metrics need are kept."""
        from ensemble.inference.streamed import is_streamed, predict_split
        self._current()
        batches = None
        if not is_streamed(self._run):
            from ensemble.inference.load import run_arrays
            arrays = run_arrays(self.path, self.config, self._run.meta)
            x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
            batches = iter([(x[a:a + 4096], y[a:a + 4096]) for a in range(0, len(x), 4096)])
        metrics, _, _ = predict_split(self._run, split, out, models=self._models, batches=batches)
        return metrics

    def __repr__(self) -> str:
        if self._stamp() != self._written:
            return f"<Ensemble {self.path.name}: written again since loaded; load it again>"
        s = self._run.summary
        metric = s.get("metric")
        value = s.get("ensemble", {}).get("test", {}).get(metric)
        shown = f", test {metric} {value:.4f}" if isinstance(value, float) else ""
        return (f"<Ensemble {self.path.name}: {self.task}, {len(self._run.members)} of "
                f"{s.get('n_finished', '?')} members{shown}>")


def load(run_dir: str | Path) -> Ensemble:
    """A finished run directory's ensemble (see ``Ensemble``)."""
    return Ensemble(run_dir)

