"""A finished run's ensemble, as prediction needs it: members, weights, scaling, normalisation.

``load_run(run_dir)`` reads ``ensemble.json``, ``data.json``, ``config.toml`` and the
normalisation through the run directory and checks every chosen member's files, so a
broken run fails here with a message that says what to do, before any model is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ensemble.results.rundir import DAMAGED_FIX, RunDirectory, file_matches
from ensemble.task.tasks import read_scaling

if TYPE_CHECKING:
    from ensemble.config import RunConfig


class PredictError(ValueError):
    """The run directory or the input cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Member:
    """One ensemble member: its weight (normalised over the ensemble) and output scaling."""
    id: str
    weight: float
    model_path: str
    y_shift: float | np.ndarray = 0.0           # an array (k,) for several regression outputs
    y_scale: float | np.ndarray = 1.0
    gaussian: bool = False


@dataclass(frozen=True)
class EnsembleRun:
    """What prediction needs from a run directory; small, picklable, no TensorFlow."""
    path: str
    config: RunConfig
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
    def calibration(self) -> dict | None:
        """The recalibration fitted at the end of the run (``ensemble.task.calibration``);
        None for a run without one (or written before there was calibration)."""
        cal = self.summary.get("calibration")
        return cal if cal and cal.get("method", "none") != "none" else None

    @property
    def gaussian(self) -> bool:
        """Every member predicts a variance (then metrics include nll, as in ensemble.json)."""
        return all(m.gaussian for m in self.members)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        fix = f"; {DAMAGED_FIX}" if path.name == RunDirectory.ENSEMBLE and path.is_file() else ""
        raise PredictError(f"cannot read {str(path)!r}: {exc}{fix}") from None


def load_run(run_dir: str | Path) -> EnsembleRun:
    """Read a run directory's ensemble, data description and normalisation; check the members."""
    path = Path(run_dir)
    rd = RunDirectory(path)
    if path.is_file():
        hint = ""
        if path.suffix.lower() == ".toml":              # the config, not its run: name where it went
            try:
                from ensemble.config import load_config
                cfg = load_config(path)
                hint = f" ({Path(cfg.output_dir) / cfg.name}, unless it ran with --run-dir or was suffixed -2, -3, ...)"
            except Exception:                           # noqa: BLE001 - only a hint
                hint = ""
        raise PredictError(f"{str(path)!r} is a file, not a run directory; pass the directory its run wrote{hint}")
    if not path.is_dir():
        raise PredictError(f"run directory {str(path)!r} does not exist; pass the directory that "
                           "`python -m ensemble.run` wrote (runs/<name>, or its --run-dir)")
    for name in (rd.CONFIG, rd.DATA, rd.NORMALIZATION, rd.ENSEMBLE):
        if not (path / name).is_file():
            why = ("the run has not chosen an ensemble yet (unfinished or failed); finish it with "
                   "`python -m ensemble.run CONFIG --resume`" if name == rd.ENSEMBLE
                   else "it is not a complete run directory")
            raise PredictError(f"{str(path / name)!r} does not exist: {why}")
    summary = _read_json(path / rd.ENSEMBLE)
    meta = _read_json(path / rd.DATA)
    from ensemble.config import ConfigError, read_saved_config
    try:
        config = read_saved_config(path / rd.CONFIG)                 # defaults back in
    except ConfigError as exc:
        raise PredictError(str(exc)) from None
    shift, scale = rd.load_normalization()         # float64 (a run before 2026-11-28: float32)
    entries = [m for m in summary.get("members", []) if float(m.get("weight", 0.0)) > 0]
    total = sum(float(m["weight"]) for m in entries)
    if not entries or not np.isfinite(total):
        raise PredictError(f"{str(path / rd.ENSEMBLE)!r} lists no member with a positive weight")
    members = []
    for m in entries:
        try:
            model_path = rd.inside(m["model"]) if m.get("model") else rd.model_path(str(m["id"]))
        except ValueError as exc:
            raise PredictError(f"{str(path / rd.ENSEMBLE)!r}: member {m.get('id')!r}: {exc}") from None
        if not model_path.is_file() and rd.legacy_model_path(m["id"]).is_file():
            model_path = rd.legacy_model_path(m["id"])          # a run written before retention
        if not model_path.is_file():
            raise PredictError(f"ensemble member {m['id']!r} has no model file "
                               f"{str(model_path)!r}; the run directory is incomplete")
        if not file_matches(model_path, m.get("model_file")):
            raise PredictError(f"ensemble member {m['id']!r}: its model file {str(model_path)!r} is damaged (its "
                               "size or SHA-256 differs from what the run recorded); resume the run "
                               "(`python -m ensemble.run CONFIG --resume`), which trains damaged members again")
        scaling = m if "y_shift" in m else {}
        legacy_scaling = rd.legacy_model_path(m["id"]).parent / rd.LEGACY_SCALING
        if not scaling and legacy_scaling.is_file():
            scaling = _read_json(legacy_scaling)
        elif not scaling and meta["task"] == "regression":
            raise PredictError(f"regression member {m['id']!r} has no output scaling in "
                               f"{str(path / rd.ENSEMBLE)!r}, so its outputs cannot be put back into "
                               "the targets' units")
        members.append(Member(m["id"], float(m["weight"]) / total, str(model_path),
                              read_scaling(scaling.get("y_shift", 0.0)), read_scaling(scaling.get("y_scale", 1.0)),
                              bool(scaling.get("gaussian", False))))
    return EnsembleRun(str(path), config, meta, tuple(members), shift, scale, summary)




def run_split(run_dir: str | Path, config: RunConfig, meta: dict, split: str) -> tuple[np.ndarray, np.ndarray]:
    """One of the run's splits ("train", "val" or "test") as its data holds it: (raw features,
    targets), the rows ``splits.npz`` records, the data read as the run read it
    (``datafeed.splits.read_data``). Raises ``PredictError`` when the run has no
    ``splits.npz`` or the data is not what it was made for (checked as ``run_arrays`` checks
    it: a file rewritten with its rows in another order gave the run's training rows as its
    "test" split, unsaid)."""
    rd = RunDirectory(Path(run_dir))
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', but got {split!r}")
    if not (rd.path / rd.SPLITS).is_file():
        raise PredictError(f"{str(rd.path / rd.SPLITS)!r} does not exist: the run was written before splits "
                           "were saved")
    got, _, rows = _read_checked(rd, config, meta)
    return np.asarray(got.x)[rows[split]], np.asarray(got.y)[rows[split]]


def run_arrays(run_dir: str | Path, config: RunConfig, meta: dict) -> dict[str, np.ndarray]:
    """The run's own prepared splits (``x_train`` ... ``y_test``, normalised and encoded as
    its members saw them), from its data file and ``splits.npz``: the one way every later
    step (``--data test``, re-selection, the notebook API) gets the run's rows back. The data
    is read as the run read it (``datafeed.splits.read_data``: separate files per split are
    one array again). A run written before ``splits.npz`` existed draws its split again
    from its seed. A run whose data streamed gets its targets, rows and normalisation only
    (``inference.streamed.run_targets``; its features are read a chunk at a time there).
    Raises ``PredictError`` when the data is not the file the run trained on."""
    if meta.get("stream"):                         # never read whole: the targets (features: inference.streamed)
        from ensemble.inference.streamed import run_targets
        return run_targets(run_dir, config, meta)
    return _read_checked(RunDirectory(Path(run_dir)), config, meta)[1]


def _read_checked(rd: RunDirectory, config: RunConfig, meta: dict):
    """(what ``read_data`` read, the prepared arrays, the split's rows) of the run's data,
    checked to be the data the run trained on: the same split sizes and task, and the
    normalisation ``normalization.npz`` holds (fitted on the training rows: other rows there,
    or other values, give another)."""
    from datafeed.prepare import prepare_with_rows, with_run_task
    from datafeed.readers import DataError
    from datafeed.splits import read_data
    data = with_run_task(config.data, meta)
    try:
        got = read_data(data)
        rows = rd.load_splits() if (rd.path / rd.SPLITS).is_file() else got.rows
        arrays, fresh, drawn = prepare_with_rows(got.x, got.y, got.info, data, config.seed, rows)
    except (OSError, DataError, ValueError) as exc:
        raise PredictError(f"cannot read the run's data {data.source!r} again: {exc}") from None
    from datafeed.prepare import as_run_made, data_changed
    why = data_changed(meta, fresh, rd.load_normalization(), (arrays["x_mean"], arrays["x_scale"]))
    if why:
        raise PredictError(f"the data {data.source!r} is not what the run trained on: {why}; use the file the "
                           "run was trained on")
    as_run_made(arrays, fresh, meta)               # a run before float64 targets: scored on float32 ones
    return got, arrays, drawn
