"""``ensemble export --format saved_model|onnx``: the exported files, loaded by TensorFlow and
ONNX Runtime in a fresh process that imports nothing of this project, reproduce
``ensemble.predict`` on the run's test split (classification with its temperature,
regression with its calibrated intervals).

Two tiny runs are trained once per module under ``mpiexec -n 1``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ensemble import cli
from ensemble.inference.api import load
from ensemble.inference.load import PredictError
from ensemble.inference.serving import output_names
from tests.conftest import run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None
                                 or importlib.util.find_spec("tf2onnx") is None,
                                 reason='needs pip install "mpi-ensemble[onnx]" and onnxruntime')]

CLASSIFICATION = """
name = "cls"
seed = 3
[data]
source = "digits"
test_fraction = 0.2
[train]
epochs = 2
batch_size = 64
learning_rate = 0.005
[[architectures]]
name = "mlp"
members = 3
layers = [{type = "Dense", units = 16, activation = "relu"}]
[ensemble]
k = 2
method = "top_k"
[tracking]
tensorboard = true
"""

REGRESSION = """
name = "reg"
seed = 5
[data]
source = "diabetes"
task = "regression"
[train]
epochs = 3
batch_size = 32
learning_rate = 0.01
[[architectures]]
name = "mlp"
members = 2
layers = [{type = "Dense", units = 8, activation = "relu"}]
[ensemble]
k = 2
method = "top_k"
"""

#: the serving outputs -> the keys of ``Ensemble.predict_details``
SAME = {"probabilities": "proba", "total_entropy": "total", "aleatoric": "aleatoric", "epistemic": "epistemic",
        "mean": "mean", "std": "std", "variance": "var", "aleatoric_var": "aleatoric",
        "epistemic_var": "epistemic"}


def train(tmp_path_factory, text: str, name: str):
    base = tmp_path_factory.mktemp(name)
    (base / f"{name}.toml").write_text(textwrap.dedent(text))
    proc = run_mpi(1, ["-m", "ensemble.run", str(base / f"{name}.toml"), "--run-dir", str(base / "run")],
                   timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return base / "run"


def exported(run_dir, tmp_path) -> dict[str, dict[str, np.ndarray]]:
    """Export both formats with the CLI, then run each on the test split in a fresh process."""
    for fmt, out in (("saved_model", tmp_path / "sm"), ("onnx", tmp_path / "e.onnx")):
        assert cli.main(["export", str(run_dir), str(out), "--format", fmt]) == 0
    x, _ = load(run_dir).data("test")
    np.save(tmp_path / "x.npy", np.asarray(x, dtype=np.float32))
    script = textwrap.dedent(f"""
        import sys, numpy as np, tensorflow as tf, onnxruntime as ort
        x = np.load({str(tmp_path / 'x.npy')!r})
        sm = tf.saved_model.load({str(tmp_path / 'sm')!r}).signatures["serving_default"]
        a = {{k: v.numpy() for k, v in sm(features=tf.constant(x)).items()}}
        s = ort.InferenceSession({str(tmp_path / 'e.onnx')!r})
        assert [i.name for i in s.get_inputs()] == ["features"], s.get_inputs()
        b = dict(zip([o.name for o in s.get_outputs()], s.run(None, {{"features": x}})))
        assert not any(m.startswith("ensemble") for m in sys.modules), "needs no project import"
        np.savez({str(tmp_path / 'sm.npz')!r}, **a)
        np.savez({str(tmp_path / 'onnx.npz')!r}, **b)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env={"TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1",
                                            "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return {fmt: dict(np.load(tmp_path / f"{fmt}.npz")) for fmt in ("sm", "onnx")}


def check_same(run_dir, got: dict[str, np.ndarray]) -> None:
    ens = load(run_dir)
    ref = ens.predict_details(ens.data("test")[0])
    assert sorted(got) == sorted(output_names(ens._run))
    n = len(ens.data("test")[0])
    for name, values in got.items():
        assert values.dtype == np.float64 and len(values) == n, name
        if name in SAME:
            want = np.asarray(ref[SAME[name]], dtype=np.float64).reshape(values.shape)
        else:                                                     # lower_90, upper_90, ...
            side, level = name.split("_")
            half = np.asarray(ref["intervals"][level]).reshape(values.shape)
            want = np.asarray(ref["mean"]).reshape(values.shape) + (half if side == "upper" else -half)
        # float32 members: the same numbers to 1e-5 of the output's size
        np.testing.assert_allclose(values, want, rtol=1e-5, atol=1e-5 * max(1e-3, float(np.abs(want).max())),
                                   err_msg=name)


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    return train(tmp_path_factory, CLASSIFICATION, "cls")


@pytest.fixture(scope="module")
def reg_run(tmp_path_factory):
    return train(tmp_path_factory, REGRESSION, "reg")


def test_classification_exports_reproduce_predict(cls_run, tmp_path):
    got = exported(cls_run, tmp_path)
    for fmt in ("sm", "onnx"):
        check_same(cls_run, got[fmt])
        np.testing.assert_allclose(got[fmt]["probabilities"].sum(axis=1), 1.0, rtol=1e-9)


def test_regression_exports_reproduce_predict_with_calibrated_intervals(reg_run, tmp_path):
    calibration = json.loads((reg_run / "ensemble.json").read_text())["calibration"]
    assert calibration["method"] in ("variance_scaling", "conformal")      # intervals from a calibration
    got = exported(reg_run, tmp_path)
    for fmt in ("sm", "onnx"):
        check_same(reg_run, got[fmt])
        assert (got[fmt]["upper_95"] > got[fmt]["upper_50"]).all()


def test_notebook_export_and_defaults(cls_run, tmp_path):
    ens = load(cls_run)
    path = ens.export(tmp_path / "m.onnx", "onnx")
    assert path.stat().st_size > 0
    assert cli.main(["export", str(cls_run)]) == 0 and (cls_run / "ensemble.keras").exists()
    deep = tmp_path / "not" / "yet" / "m.keras"              # its folders are made; OUT after --format
    assert cli.main(["export", str(cls_run), "--format", "keras", str(deep)]) == 0 and deep.is_file()
    from ensemble.results.rundir import RunDirectory  # a new ensemble.json says the export is stale
    assert "ensemble.keras" in RunDirectory(cls_run).stale_exports()
    with pytest.raises(PredictError, match="must be one of keras, saved_model, onnx"):
        ens.export(tmp_path / "m.bin", "torch")
    with pytest.raises(PredictError, match="a SavedModel is a directory"):
        ens.export(tmp_path / "m.pb", "saved_model")


def test_a_trained_run_has_every_members_epochs_in_tensorboard(cls_run):
    """The same run, trained with `[tracking] tensorboard = true`: each member's Keras
    history, epoch by epoch, as TensorBoard's reader sees it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    journal = [json.loads(x) for x in (cls_run / "journal.jsonl").read_text().splitlines()]
    ids = [x["id"] for x in journal if "id" in x]
    assert len(ids) == 3
    for member in ids:
        acc = EventAccumulator(str(cls_run / "tensorboard" / "members" / member)).Reload()
        assert [e.step for e in acc.Scalars("epoch/loss")] == [1, 2]
        assert {"epoch/val_loss", "epoch/accuracy", "val/accuracy", "test/accuracy"} <= set(acc.Tags()["scalars"])
    ens = json.loads((cls_run / "ensemble.json").read_text())["ensemble"]["test"]["accuracy"]
    got = EventAccumulator(str(cls_run / "tensorboard" / "ensemble")).Reload().Scalars("test/accuracy")[0].value
    assert got == pytest.approx(ens, rel=1e-6)


def test_a_missing_extra_is_named(cls_run, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tf2onnx" else real(name, *a))
    with pytest.raises(PredictError, match=r'pip install "mpi-ensemble\[onnx\]"'):
        load(cls_run).export(tmp_path / "m.onnx", "onnx")
    assert not (tmp_path / "m.onnx").exists()
