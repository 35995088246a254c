"""Packed members (``runtime.members_per_rank``): each packed member's result equals its
unpacked twin's (same seed, data order, dropout masks, optimizer state, early stopping),
for classification and Gaussian regression; what cannot be packed says so."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.results.records import Status
from ensemble.results.rundir import RunDirectory
from ensemble.train.packed import pack_key

LAYERS = [{"type": "Dense", "units": 16, "activation": "relu"}, {"type": "Dropout", "rate": 0.2},
          {"type": "Dense", "units": 8, "activation": "tanh"}]


def make_data(task: str):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6)).astype(np.float32)
    if task == "classification":
        y = ((x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 0.5)).astype(np.int64)
        meta = {"task": task, "input_shape": [6], "n_outputs": 3}
    else:
        y = (x[:, 0] * 2 + np.sin(x[:, 1]) + 0.1 * rng.normal(size=300)).astype(np.float64)
        meta = {"task": task, "input_shape": [6], "n_outputs": 1}
    data = {"x_train": x[:200], "y_train": y[:200], "x_val": x[200:250], "y_val": y[200:250],
            "x_test": x[250:], "y_test": y[250:]}
    return data, meta


def spec(i: int, **extra):
    return {"id": f"m{i}", "arch": "mlp", "layers": LAYERS, "model": None, "params": {}, "seed": 100 + i,
            "epochs": 8, "batch_size": 32, "optimizer": "adam", "learning_rate": 0.01, "patience": 2,
            "member_time_limit": 60.0, "bootstrap": i % 2 == 1, "loss": "auto", **extra}


@pytest.mark.long          # about 25 s of training for both; tests/mpi/test_packed_mpi.py runs packs in make test
@pytest.mark.slow          # and not in test-fast's minute either
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_packed_member_equals_its_unpacked_twin(tmp_path, task):
    import keras

    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.member import run_member
    from ensemble.train.packed import train_packed
    configure_tensorflow(1)
    data, meta = make_data(task)
    specs = [spec(i) for i in range(4)]
    alone = [run_member(s, data, meta, RunDirectory(tmp_path / "alone"), 0) for s in specs]
    packed = train_packed(specs, data, meta, RunDirectory(tmp_path / "packed"), 0)
    assert [r["status"] for r in packed] == [Status.OK.value] * 4, [r.get("error") for r in packed]
    stopped_early = 0
    for a, p in zip(alone, packed):
        assert a["id"] == p["id"] and a["epochs"] == p["epochs"] and a["stopped"] == p["stopped"]
        stopped_early += a["stopped"] == "early_stopping"
        for split in ("val", "test"):
            for metric, value in a[split].items():
                assert p[split][metric] == pytest.approx(value, rel=1e-5, abs=1e-6), (p["id"], split, metric)
        np.testing.assert_allclose(p["payload"]["arrays"]["test_pred"], a["payload"]["arrays"]["test_pred"],
                                   rtol=1e-5, atol=1e-6)
        assert p["packed"]["members"] == 4 and p["model"] and p["path"] == a["path"]
        mine = keras.models.load_model(tmp_path / "packed" / "models" / f"{p['id']}.keras", compile=False)
        twin = keras.models.load_model(tmp_path / "alone" / "models" / f"{a['id']}.keras", compile=False)
        for w, v in zip(mine.get_weights(), twin.get_weights()):
            np.testing.assert_allclose(w, v, rtol=1e-5, atol=1e-6)
    assert 0 < stopped_early < 4 or task == "regression"       # members stop at their own epochs


def test_what_cannot_be_packed_trains_alone():
    assert pack_key(spec(0)) == pack_key(spec(1, seed=7, id="x"))     # seed and id are each member's own
    assert pack_key(spec(0)) != pack_key(spec(0, learning_rate=0.1))
    assert pack_key(spec(0, report_every=2)) is None                  # early discarding reports per epoch
    assert pack_key(spec(0, model="pkg.mod:build")) is None
    assert pack_key(spec(0, layers=[{"type": "Conv1D", "filters": 4, "kernel_size": 3}])) is None
    assert pack_key(spec(0, layers=[{"type": "Dense", "units": 4, "kernel_regularizer": "l2"}])) is None
    assert pack_key(spec(0, inherit={"from": "e0001", "path": "x"})) is None


@pytest.mark.slow
def test_packed_members_whose_weights_go_nan_fail_as_nan_loss(tmp_path):
    """NaN features: every packed member fails as `nan_loss` (by its loss, or by its weights
    where a ReLU hid the NaN from the loss), not later as NaN predictions."""
    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.packed import train_packed
    configure_tensorflow(1)
    data, meta = make_data("classification")
    data = {**data, "x_train": np.full_like(data["x_train"], np.nan)}
    records = train_packed([spec(i, epochs=2) for i in range(2)], data, meta, RunDirectory(tmp_path), 0)
    assert [r["status"] for r in records] == [Status.FAILED.value] * 2
    assert [r["error"]["kind"] for r in records] == ["nan_loss"] * 2
