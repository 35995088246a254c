"""A real Keras member that reports to the master every epoch and obeys its decisions."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.results.records import Status
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import CONTINUE, STOP

pytest.importorskip("keras")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    return {"x_train": x[:160], "y_train": y[:160], "x_val": x[160:200], "y_val": y[160:200],
            "x_test": x[200:], "y_test": y[200:]}


META = {"task": "classification", "input_shape": [6], "n_outputs": 2}


def spec(**extra):
    return {"id": "m0", "arch": "mlp", "layers": [{"type": "Dense", "units": 8, "activation": "relu"}],
            "model": None, "params": {}, "seed": 1, "epochs": 5, "batch_size": 32, "optimizer": "adamax",
            "learning_rate": 0.01, "patience": 10, "member_time_limit": 60.0, "bootstrap": False,
            "loss": "auto", **extra}


@pytest.mark.slow                  # TensorFlow training: make test, not make test-fast
def test_master_stops_a_member_mid_training(tmp_path, data):
    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.member import run_member
    configure_tensorflow(1)
    reports = []

    def report(payload):
        reports.append(payload)
        return STOP if payload["epoch"] == 2 else CONTINUE

    result = run_member(spec(report_every=1), data, META, RunDirectory(tmp_path), 0, None, report)
    assert result["status"] == Status.OK.value, result.get("error")
    assert result["epochs"] == 2 and result["stopped"] == "master"
    assert [r["epoch"] for r in reports] == [1, 2]
    assert {"loss", "val_loss", "accuracy"} <= set(reports[0]["logs"])
    assert (tmp_path / "models" / "m0.keras").is_file() and result["model"] and "payload" in result


@pytest.mark.slow                 # make test, not test-fast (its minute)
def test_update_sets_the_learning_rate_and_silence_costs_nothing(tmp_path, data):
    from ensemble.train.member import run_member
    calls = []

    def report(payload):
        calls.append(payload["epoch"])
        return {"action": "update", "settings": {"learning_rate": 1e-4}} if payload["epoch"] == 2 else CONTINUE

    result = run_member(spec(report_every=2), data, META, RunDirectory(tmp_path / "a"), 0, None, report)
    assert result["epochs"] == 5 and calls == [2, 4]
    assert result["decisions"] == ["update", "continue"]
    quiet = run_member(spec(), data, META, RunDirectory(tmp_path / "b"), 0, None,
                       lambda payload: pytest.fail("a spec without report_every must not report"))
    assert quiet["status"] == Status.OK.value and "decisions" not in quiet


@pytest.mark.slow                  # TensorFlow training: make test, not make test-fast
@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_and_xla_train_with_a_float32_head(tmp_path, data, precision):
    """`runtime.precision` and `runtime.jit_compile`: hidden layers in half precision, the
    output head (and so the predictions and the loss) in float32, the step compiled by XLA."""
    import keras

    from ensemble.runtime.env import TENSORFLOW, configure_tensorflow
    from ensemble.train.member import run_member
    configure_tensorflow(1, precision, jit_compile=True)
    try:
        result = run_member(spec(epochs=2), data, META, RunDirectory(tmp_path), 0)
        assert result["status"] == Status.OK.value, result.get("error")
        model = keras.models.load_model(tmp_path / "models" / "m0.keras", compile=False)
        policies = {layer.name: layer.dtype_policy.name for layer in model.layers}
        assert policies["probabilities"] == "float32" and precision in policies.values()
        assert model.predict(data["x_test"], verbose=0).dtype == np.float32
    finally:
        configure_tensorflow(1)                          # the process default again, for later tests
    assert TENSORFLOW == {"precision": "float32", "jit_compile": False, "deterministic": True, "traced_models": 0}
