"""`python -m ensemble.predict` under real mpiexec: -n 3 and -n 2 give the -n 1 numbers; errors never hang.

The run directories are made here without training (members with seeded random weights,
saved exactly as a run saves them), so the test pays for prediction only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from datafeed.prepare import prepare
from datafeed.readers import read_dataset
from ensemble import predict as P
from ensemble.config import dump_toml, resolve_config
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi


def make_run(run_dir, data: dict, members: list[dict]) -> None:
    """A run directory as `ensemble.run` writes it; members: {"id", "weight", "gaussian"}."""
    import keras
    cfg = resolve_config({"seed": 1, "data": data, "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})
    x, y, info = read_dataset(cfg.data)
    arrays, meta = prepare(x, y, info, cfg.data, cfg.seed)
    run_dir.mkdir()
    (run_dir / "config.toml").write_text(dump_toml(cfg))
    (run_dir / "data.json").write_text(json.dumps(meta))
    np.savez(run_dir / "normalization.npz", shift=arrays["x_mean"], scale=arrays["x_scale"])
    regression = meta["task"] == "regression"
    y_train = np.asarray(arrays["y_train"], dtype=np.float64)
    for i, m in enumerate(members):
        keras.utils.set_random_seed(i)
        inputs = keras.Input(tuple(meta["input_shape"]))
        hidden = keras.layers.Dense(8, activation="tanh")(inputs)
        k = meta["n_outputs"] * (2 if m.get("gaussian") else 1)
        outputs = keras.layers.Dense(k, activation=None if regression else "softmax")(hidden)
        folder = run_dir / "members" / m["id"]
        folder.mkdir(parents=True)
        keras.Model(inputs, outputs).save(folder / "model.keras")
        scaling = {"y_shift": 0.0, "y_scale": 1.0}
        if regression:
            scaling = {"y_shift": float(y_train.mean()), "y_scale": float(y_train.std()),
                       "gaussian": m.get("gaussian", False)}
        (folder / "scaling.json").write_text(json.dumps(scaling))
    (run_dir / "ensemble.json").write_text(json.dumps({
        "task": meta["task"], "members": [{"id": m["id"], "weight": m["weight"]} for m in members]}))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("predict_mpi")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 5)).astype(np.float32) * [1, 10, 100, 0.1, 1] + 3
    y = np.stack([x[:, 0] + 0.01 * x[:, 2], x[:, 1] * x[:, 3]], axis=1)
    np.savez(base / "two_targets.npz", x=x, y=y)
    make_run(base / "reg", {"source": str(base / "two_targets.npz"), "task": "regression"},
             [{"id": "g-000", "weight": 0.4, "gaussian": True}, {"id": "g-001", "weight": 0.3, "gaussian": True},
              {"id": "plain-000", "weight": 0.2}, {"id": "g-002", "weight": 0.1, "gaussian": True}])
    make_run(base / "cls", {"source": "iris"},
             [{"id": f"m-{i:03d}", "weight": w} for i, w in enumerate((0.5, 0.25, 0.25))])
    return base


def predict(n, run_dir, out, *args):
    return run_mpi(n, ["-m", "ensemble.predict", str(run_dir), "--data", "test", "--out", str(out), *args],
                   timeout=120)


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_three_ranks_equal_one_rank_regression(runs):
    proc3 = predict(3, runs / "reg", runs / "reg3.npz")
    assert proc3.returncode == 0, proc3.stdout + proc3.stderr
    assert "on 3 rank(s)" in proc3.stdout and "mse" in proc3.stdout
    proc1 = predict(1, runs / "reg", runs / "reg1.npz")
    assert proc1.returncode == 0, proc1.stdout + proc1.stderr
    one, three = np.load(runs / "reg1.npz"), np.load(runs / "reg3.npz")
    intervals = {f"{side}_{level}" for level in ("50", "80", "90", "95") for side in ("lower", "upper")}
    assert set(one.files) == {"mean", "std", "aleatoric_var", "epistemic_var", "target", *intervals}
    for key in one.files:
        assert one[key].shape == (18, 2)
        np.testing.assert_allclose(three[key], one[key], rtol=1e-9, atol=1e-12, err_msg=key)
    assert (one["aleatoric_var"] > 0).all() and (one["epistemic_var"] > 0).all()


def test_two_ranks_equal_the_library_classification(runs):
    proc = predict(2, runs / "cls", runs / "cls2.npz")               # members 0, 2 on rank 0; 1 on rank 1
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = np.load(runs / "cls2.npz")
    result, y = P.predict_file(runs / "cls", "test")
    np.testing.assert_array_equal(got["target"], np.array(["setosa", "versicolor", "virginica"])[y])
    np.testing.assert_allclose(got["proba"], result["proba"], rtol=1e-12)
    for key, name in (("total", "total_entropy"), ("aleatoric", "aleatoric"), ("epistemic", "epistemic")):
        np.testing.assert_allclose(got[name], result[key], rtol=1e-9, atol=1e-12, err_msg=key)


def iris_rows(runs, n: int = 30):
    """Iris rows as a user's table: columns out of training order, text IDs, labels, a note."""
    import pandas as pd
    from sklearn.datasets import load_iris
    iris = load_iris()
    frame = pd.DataFrame(iris.data[:: 150 // n], columns=iris.feature_names)[iris.feature_names[::-1]]
    frame.insert(0, "sample_id", [f"s-{i:04d}" for i in range(len(frame))])
    frame.insert(2, "label", iris.target_names[iris.target[:: 150 // n]])
    frame["note"] = "field"
    return frame, iris.data[:: 150 // n].astype(np.float32), list(iris.feature_names)


def test_keep_passes_ids_through_on_two_ranks(runs):
    """--keep (repeated and comma-separated) puts the IDs and a kept feature first, in row order;
    the other columns are matched by name, the unused one is listed; the numbers are the library's."""
    import pandas as pd
    frame, x, names = iris_rows(runs)
    frame.to_csv(runs / "iris_rows.csv", index=False)
    proc = run_mpi(2, ["-m", "ensemble.predict", str(runs / "cls"), "--data", str(runs / "iris_rows.csv"),
                       "--out", str(runs / "iris_rows.csv.out.csv"), "--keep", f"sample_id,{names[0]}",
                       "--keep", "sample_id"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ignored: 'note'" in proc.stderr and "error:" not in proc.stderr
    assert f"with input column(s) sample_id, {names[0]}" in proc.stdout and "accuracy" in proc.stdout
    got = pd.read_csv(runs / "iris_rows.csv.out.csv")
    assert list(got.columns[:3]) == ["sample_id", names[0], "prediction"]
    assert got["sample_id"].tolist() == frame["sample_id"].tolist()
    np.testing.assert_allclose(got[names[0]], frame[names[0]])
    run = P.load_run(runs / "cls")
    expected = P.predict_arrays(run, P.prepare_features(run, x))
    proba = got[[f"p_{c}" for c in run.class_names]].to_numpy()
    np.testing.assert_allclose(proba, expected["proba"], rtol=1e-6)
    assert got["target"].tolist() == frame["label"].tolist()


def test_a_missing_column_fails_by_name_on_every_rank(runs):
    frame, _, names = iris_rows(runs)
    frame.drop(columns=[names[2], "note"]).to_csv(runs / "iris_short.csv", index=False)
    proc = run_mpi(2, ["-m", "ensemble.predict", str(runs / "cls"), "--data", str(runs / "iris_short.csv"),
                       "--keep", "sample_id"], timeout=60)
    assert proc.returncode == P.EXIT_INPUT, proc.stdout + proc.stderr
    assert f"lacks 1 of the 4 columns the ensemble was trained on: '{names[2]}'" in proc.stderr
    assert proc.stderr.count("error:") == 1


def test_errors_stop_every_rank(runs):
    proc = run_mpi(3, ["-m", "ensemble.predict", str(runs / "cls"), "--data", str(runs / "none.csv")], timeout=60)
    assert proc.returncode != 0 and proc.stderr.count("does not exist") == 1, proc.stderr
    broken = runs / "broken"
    broken.mkdir()
    for name in ("config.toml", "data.json", "normalization.npz", "ensemble.json"):
        (broken / name).write_bytes((runs / "cls" / name).read_bytes())
    for i in range(3):
        (broken / "members" / f"m-{i:03d}").mkdir(parents=True)
        model = (runs / "cls" / "members" / f"m-{i:03d}" / "model.keras").read_bytes()
        (broken / "members" / f"m-{i:03d}" / "model.keras").write_bytes(model if i != 1 else b"not a model")
    proc = predict(2, broken, runs / "broken.npz")
    assert proc.returncode == P.EXIT_PREDICT, proc.stdout + proc.stderr
    assert "rank 1: member 'm-001': cannot load" in proc.stderr and proc.stderr.count("error:") == 1
    assert not (runs / "broken.npz").exists()


def test_export_of_gaussian_and_plain_members_matches_predict(runs):
    """Not MPI, but on this module's two-output run: mean/variance heads mixed with a plain member."""
    import keras

    from ensemble.inference.export import export_ensemble
    path = export_ensemble(runs / "reg", runs / "reg.keras")
    x = np.load(runs / "two_targets.npz")["x"][:40]
    mean, var = keras.models.load_model(path).predict(x, verbose=0)
    run = P.load_run(runs / "reg")
    expected = P.predict_arrays(run, P.prepare_features(run, x))
    for got, want in ((mean, expected["mean"]), (var, expected["var"])):     # float32 sums: relative to
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())   # the outputs' scale
