"""The optional features stay optional: MLflow, TensorBoard, ONNX and their converters only in
extras, and a feature asked for without its extra is a clear error naming the extra, before
anything runs. These run (and mean most) in an install without the extras; the config's
`[tracking]` checks are in test_tracking.py.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib

from ensemble import export
from tests.conftest import ROOT

OPTIONAL = {"mlflow", "mlflow-skinny", "tensorboard", "google-crc32c", "onnx", "onnxruntime", "tf2onnx"}


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=~!;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_tracking_and_export_packages_stay_in_their_extras():
    """The base install carries none of them; users' `tracking` extra is MLflow's lean
    client, the full server only in the `test` extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert not names(project["dependencies"]) & OPTIONAL
    assert names(extras["tracking"]) == {"tensorboard", "google-crc32c", "mlflow-skinny"}
    assert names(extras["onnx"]) == {"tf2onnx", "onnx", "onnxruntime"}
    assert "mlflow" in names(extras["test"]) and "mlflow" not in names(extras["tracking"])


def test_onnx_export_without_its_extra_names_it(tmp_path, monkeypatch, capsys):
    """Said before the run is even read (here: a run directory that does not exist)."""
    real = importlib.util.find_spec
    extra = {"tf2onnx", "onnx", "onnxruntime"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in extra else real(name, *a))
    assert export.main([str(tmp_path / "no-run"), str(tmp_path / "m.onnx"), "--format", "onnx"]) == 2
    err = capsys.readouterr().err
    assert "needs the Python package 'tf2onnx'" in err and 'pip install "mpi-ensemble[onnx]"' in err
    assert not (tmp_path / "m.onnx").exists()
