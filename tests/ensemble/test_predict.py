"""ensemble.predict and ensemble.export on two tiny trained runs (digits, diabetes).

Each run is trained once per module under `mpiexec -n 1`; the CLI is run in subprocesses
(with a timeout), the library in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from datafeed.prepare import encode_labels, split_indices
from datafeed.readers import read_dataset
from ensemble import predict as P
from ensemble.task import metrics as M
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

CLASSIFICATION = """
name = "cls"
seed = 3
[data]
source = "digits"
test_fraction = 0.2
[train]
epochs = 3
batch_size = 64
learning_rate = 0.005
[[architectures]]
name = "mlp"
members = 4
layers = [{type = "Dense", units = 16, activation = "relu"}]
[ensemble]
k = 2
method = "top_k"
candidates = 3
keep_models = 1
"""

REGRESSION = """
name = "reg"
seed = 5
[data]
source = "diabetes"
task = "regression"
[train]
epochs = 4
batch_size = 32
bootstrap = true
learning_rate = 0.01
[[architectures]]
name = "mlp"
members = 2
layers = [{type = "Dense", units = 8, activation = "relu"}]
[ensemble]
k = 2
method = "top_k"
keep_models = 0
"""


def train(tmp_path_factory, text: str, name: str):
    base = tmp_path_factory.mktemp(name)
    (base / f"{name}.toml").write_text(textwrap.dedent(text))
    run_dir = base / "run"
    proc = run_mpi(1, ["-m", "ensemble.run", str(base / f"{name}.toml"), "--run-dir", str(run_dir)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    return train(tmp_path_factory, CLASSIFICATION, "cls")


@pytest.fixture(scope="module")
def reg_run(tmp_path_factory):
    return train(tmp_path_factory, REGRESSION, "reg")


def cli(*args, n: int = 1, timeout: float = 180) -> subprocess.CompletedProcess:
    return run_mpi(n, ["-m", "ensemble.predict", *map(str, args)], timeout=timeout)


def raw_test_rows(run_dir):
    """The run's test split as the data file holds it: raw features, raw targets, feature names."""
    run = P.load_run(run_dir)
    x, y, info = read_dataset(run.config.data)
    y_split = encode_labels(y, info.get("class_names"))[0] if run.task == "classification" else y
    data = run.config.data
    idx = split_indices(y_split, run.task, data.val_fraction, data.test_fraction, run.config.seed)["test"]
    return np.asarray(x[idx], dtype=np.float32), y[idx], run.meta["feature_names"]


def library(run_dir, x_raw):
    run = P.load_run(run_dir)
    return P.predict_arrays(run, P.prepare_features(run, x_raw))


# ------------------------------------------------------------------ the test split, via the CLI
@pytest.fixture(scope="module")
def cls_cli(cls_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("cls_out")
    proc = cli(cls_run, "--data", "test", "--out", out / "preds.csv", "--export", out / "ensemble.keras")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc


def test_an_out_that_cannot_be_written_is_one_line_not_a_traceback(cls_run):
    """A read-only or full file system is found only on writing (root may write anywhere else):
    a pandas OSError traceback, exit 1, before."""
    proc = cli(cls_run, "--data", "test", "--out", "/proc/preds.csv")
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    assert "error: cannot write --out '/proc/preds.csv'" in proc.stderr and "choose another --out" in proc.stderr


def test_test_split_reproduces_ensemble_json_classification(cls_run, cls_cli):
    out, proc = cls_cli
    frame = pd.read_csv(out / "preds.csv")
    classes = [str(c) for c in range(10)]
    assert list(frame.columns) == (["prediction"] + [f"p_{c}" for c in classes]
                                   + ["total_entropy", "aleatoric", "epistemic", "target"])
    proba = frame[[f"p_{c}" for c in classes]].to_numpy()
    y = frame["target"].to_numpy()
    expected = json.loads((cls_run / "ensemble.json").read_text())["ensemble"]["test"]
    assert M.classification_metrics(y, proba) == pytest.approx(expected, rel=1e-9)
    assert "accuracy" in proc.stdout and "ensemble.json test" in proc.stdout
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    assert (frame["prediction"].to_numpy() == proba.argmax(axis=1)).all()
    np.testing.assert_allclose(frame["total_entropy"], frame["aleatoric"] + frame["epistemic"], atol=1e-12)
    assert (frame["epistemic"] >= 0).all() and (frame["epistemic"] > 0).any()
    saved = np.load(cls_run / "ensemble_test_predictions.npz")      # what the run itself wrote
    np.testing.assert_allclose(proba, saved["proba"], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(frame["epistemic"], saved["epistemic"], rtol=1e-6, atol=1e-12)


def test_a_pruned_run_keeps_only_what_the_ensemble_needs(cls_run, reg_run):
    """4 members, 3 candidates, keep_models 1, an ensemble of 2: the other models are gone,
    ensemble.json names only files that exist (the predict test above runs on this run)."""
    from ensemble.results.journal import read_lines
    for run_dir, n_members in ((cls_run, 4), (reg_run, 2)):
        ens = json.loads((run_dir / "ensemble.json").read_text())
        selected = {m["id"] for m in ens["members"]}
        assert len(selected) == 2 and ens["n_finished"] == n_members
        assert {p.stem for p in (run_dir / "models").glob("*.keras")} == selected
        assert all((run_dir / m["model"]).is_file() for m in ens["members"])
        assert not (run_dir / "members").exists()
    ens = json.loads((cls_run / "ensemble.json").read_text())
    lines = read_lines(cls_run / "journal.jsonl")
    final = [x for x in lines if x.get("event") == "released" and x.get("reason") == "final"]
    assert len(final) == 1 and set(final[0]["models"]).isdisjoint(m["id"] for m in ens["members"])
    assert ens["kept"]["models"] == 2 and ens["n_candidates"] == 3


def test_test_split_reproduces_ensemble_json_regression(reg_run):
    result, y = P.predict_file(reg_run, "test")
    run = P.load_run(reg_run)
    expected = json.loads((reg_run / "ensemble.json").read_text())["ensemble"]["test"]
    assert P.score(run, result, y) == pytest.approx(expected, rel=1e-9)
    saved = np.load(reg_run / "ensemble_test_predictions.npz")
    np.testing.assert_allclose(result["mean"], saved["mean"], rtol=1e-12)
    np.testing.assert_allclose(result["std"], saved["std"], rtol=1e-9)
    np.testing.assert_allclose(result["var"], result["aleatoric"] + result["epistemic"], rtol=1e-12)
    assert (result["aleatoric"] > 0).all() and (result["epistemic"] > 0).all()   # variance heads by default
    assert ens_calibration(reg_run) in ("variance_scaling", "conformal")
    np.testing.assert_allclose(result["mean"] + result["intervals"]["90"], saved["upper_90"], rtol=1e-9)


def ens_calibration(run_dir) -> str:
    return json.loads((run_dir / "ensemble.json").read_text())["calibration"]["method"]


# -------------------------------------------------------------- files written here, same rows
def test_npz_without_targets_equals_library(cls_run, tmp_path):
    x, y, _ = raw_test_rows(cls_run)
    np.savez(tmp_path / "rows.npz", x=x)                            # no y: predictions only
    result, targets = P.predict_file(cls_run, str(tmp_path / "rows.npz"))
    assert targets is None
    expected = library(cls_run, x)
    for key in ("proba", "total", "aleatoric", "epistemic"):
        np.testing.assert_array_equal(result[key], expected[key])
    run = P.load_run(cls_run)
    P.write_predictions(tmp_path / "p.npz", run, result)
    saved = np.load(tmp_path / "p.npz")
    assert set(saved.files) == {"prediction", "proba", "class_names", "total_entropy", "aleatoric", "epistemic"}
    assert saved["prediction"].tolist() == [str(i) for i in result["proba"].argmax(axis=1)]


def test_csv_with_labels_by_column_name(cls_run, tmp_path):
    x, y, names = raw_test_rows(cls_run)
    frame = pd.DataFrame(x, columns=names)[names[::-1]]             # columns in another order
    frame.insert(3, "label", y)                                     # the run's data.label
    frame["row_id"] = np.arange(len(frame))                          # an extra column is ignored
    frame.to_csv(tmp_path / "rows.csv", index=False)
    result, targets = P.predict_file(cls_run, str(tmp_path / "rows.csv"))
    np.testing.assert_array_equal(targets, y)
    np.testing.assert_allclose(result["proba"], library(cls_run, x)["proba"], rtol=1e-12)
    run = P.load_run(cls_run)
    expected = json.loads((cls_run / "ensemble.json").read_text())["ensemble"]["test"]
    assert P.score(run, result, targets) == pytest.approx(expected, rel=1e-9)


def test_csv_columns_are_matched_by_name_never_by_position(cls_run, tmp_path):
    """One training column missing and an extra ID column make the count right: an error
    that names the missing column, not predictions from the wrong features."""
    x, y, names = raw_test_rows(cls_run)
    frame = pd.DataFrame(x, columns=names).drop(columns=[names[5]])
    frame.insert(0, "sample_id", np.arange(len(frame)))
    assert frame.shape[1] == len(names)
    frame.to_csv(tmp_path / "rows.csv", index=False)
    with pytest.raises(P.PredictError, match=rf"lacks 1 of the {len(names)} columns.*'{names[5]}'.*'sample_id'"):
        P.predict_file(cls_run, str(tmp_path / "rows.csv"))


def test_several_target_columns_train_one_output_each_and_predict_under_their_names(tmp_path_factory):
    """`data.label = ["t1", "t2"]` on a CSV: a regression with two outputs; predicting on the CSV
    reads both targets (scored as the run scored its test split) and names every output column
    after its target. The targets' scales differ by a factor of 1,000: each is standardised on
    its own (one shared scale squashed the small one to noise: R^2 of -500 on it), in the run, in
    predict and in the exported model."""
    base = tmp_path_factory.mktemp("multi")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 3))
    frame = pd.DataFrame(x, columns=["a", "b", "c"])
    frame["t1"] = 2 * x[:, 0] + 0.1 * rng.normal(size=240) - 50
    frame["t2"] = 1000 * (x[:, 1] - x[:, 2]) + 5
    frame.to_csv(base / "multi.csv", index=False)
    run_dir = train(tmp_path_factory, f"""
        name = "multi"
        seed = 1
        [data]
        source = "{base / 'multi.csv'}"
        label = ["t1", "t2"]
        [train]
        epochs = 20
        learning_rate = 0.01
        loss = "gaussian_nll"
        [[architectures]]
        members = 2
        layers = [{{type = "Dense", units = 8, activation = "relu"}}]
        """, "multi")
    run = P.load_run(run_dir)
    assert run.task == "regression" and run.n_outputs == 2
    assert np.shape(run.members[0].y_scale) == (2,)
    test = split_indices(frame["t1"].to_numpy(), "regression", run.config.data.val_fraction,
                         run.config.data.test_fraction, run.config.seed)["test"]
    frame.iloc[test].to_csv(base / "test.csv", index=False)
    result, targets = P.predict_file(run_dir, str(base / "test.csv"))
    np.testing.assert_allclose(targets, frame[["t1", "t2"]].to_numpy()[test], rtol=1e-6)
    expected = json.loads((run_dir / "ensemble.json").read_text())["ensemble"]["test"]
    assert P.score(run, result, targets)["mse"] == pytest.approx(expected["mse"], rel=1e-5)
    for j in range(2):                   # both targets learnt, whatever their scale
        residual = np.sum((targets[:, j] - result["mean"][:, j]) ** 2)
        assert 1 - residual / np.sum((targets[:, j] - targets[:, j].mean()) ** 2) > 0.5, j
    import keras

    from ensemble.inference.export import export_ensemble
    model = keras.models.load_model(export_ensemble(run_dir, base / "multi.keras"), compile=False)
    mean = np.asarray(model(frame[["a", "b", "c"]].to_numpy(np.float32)[test])[0])
    np.testing.assert_allclose(mean, result["mean"], rtol=1e-4, atol=1e-3)
    proc = cli(run_dir, "--data", base / "test.csv", "--out", base / "p.csv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    columns = list(pd.read_csv(base / "p.csv").columns)
    assert columns[:4] == ["mean_t1", "mean_t2", "std_t1", "std_t2"] and "target_t2" in columns


# --------------------------------------------------------------------------------- export
@pytest.fixture(scope="module")
def reg_export(reg_run, tmp_path_factory):
    from ensemble.inference.export import export_ensemble
    out = tmp_path_factory.mktemp("reg_out")
    return export_ensemble(reg_run, out / "ensemble.keras")


def test_regression_csv_without_targets_equals_library(reg_run, tmp_path):
    x, _, names = raw_test_rows(reg_run)
    pd.DataFrame(x, columns=names).to_csv(tmp_path / "rows.csv", index=False)     # no target column
    result, targets = P.predict_file(reg_run, str(tmp_path / "rows.csv"))
    assert targets is None
    expected = library(reg_run, x)
    for key in ("mean", "std", "var", "aleatoric", "epistemic"):     # the CSV holds float32's shortest text,
        np.testing.assert_allclose(result[key], expected[key], rtol=1e-5, err_msg=key)   # read in float64
    P.write_predictions(tmp_path / "p.csv", P.load_run(reg_run), result)
    intervals = [f"{side}_{level}" for level in ("50", "80", "90", "95") for side in ("lower", "upper")]
    assert list(pd.read_csv(tmp_path / "p.csv").columns) == ["mean", "std", "aleatoric_var", "epistemic_var",
                                                             *intervals]


def test_exported_models_load_in_a_fresh_process(cls_run, reg_run, cls_cli, reg_export, tmp_path):
    x_cls, x_reg = raw_test_rows(cls_run)[0], raw_test_rows(reg_run)[0]
    np.savez(tmp_path / "x.npz", cls=x_cls, reg=x_reg)
    script = textwrap.dedent(f"""
        import sys, numpy as np, keras
        x = np.load({str(tmp_path / 'x.npz')!r})
        p = keras.models.load_model({str(cls_cli[0] / 'ensemble.keras')!r}).predict(x["cls"], verbose=0)
        mean, var = keras.models.load_model({str(reg_export)!r}).predict(x["reg"], verbose=0)
        assert not any(m.startswith("ensemble") for m in sys.modules), "needs no project import"
        np.savez({str(tmp_path / 'out.npz')!r}, proba=p, mean=mean, var=var)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1",
                                            "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "out.npz")
    cls, reg = library(cls_run, x_cls), library(reg_run, x_reg)
    temperature = (P.load_run(cls_run).calibration or {}).get("temperature", 1.0)
    if temperature != 1.0:       # the exported probabilities are before the run's temperature
        assert "before the run's temperature" in cls_cli[1].stderr + cls_cli[1].stdout
        scaled = np.exp(np.log(np.clip(got["proba"].astype(np.float64), 1e-15, 1.0)) / temperature)
        got = {**got, "proba": scaled / scaled.sum(axis=1, keepdims=True)}
    np.testing.assert_allclose(got["proba"], cls["proba"], rtol=1e-5, atol=1e-7)
    assert got["mean"].shape == got["var"].shape == (len(x_reg), 1)
    np.testing.assert_allclose(got["mean"][:, 0], reg["mean"], rtol=1e-5)
    np.testing.assert_allclose(got["var"][:, 0], reg["var"], rtol=1e-5)


# --------------------------------------------------------------------------------- errors
def test_bad_inputs_give_clear_errors(cls_run, reg_run, tmp_path):
    with pytest.raises(P.PredictError, match="run directory .* does not exist"):
        P.load_run(tmp_path / "nope")
    (tmp_path / "half").mkdir()
    for name in ("config.toml", "data.json", "normalization.npz"):
        (tmp_path / "half" / name).write_bytes((cls_run / name).read_bytes())
    with pytest.raises(P.PredictError, match="ensemble.json' does not exist.*--resume"):
        P.load_run(tmp_path / "half")
    run = P.load_run(cls_run)
    with pytest.raises(P.PredictError, match="--data file .* does not exist"):
        P.read_input(run, str(tmp_path / "missing.npz"))
    np.savez(tmp_path / "narrow.npz", x=np.zeros((5, 10)))
    with pytest.raises(P.PredictError, match=r"10 features per sample .* trained on 64"):
        P.read_input(run, str(tmp_path / "narrow.npz"))
    np.savez(tmp_path / "named.npz", feats=np.zeros((5, 64)))
    with pytest.raises(P.PredictError, match=r"`data.x` \(the run's setting; --x names another\) names array "
                                             r"'x'.*feats"):               # no --x was given: the run's data.x
        P.read_input(run, str(tmp_path / "named.npz"))
    with pytest.raises(P.PredictError, match=r"--x names array 'x2'.*feats"):
        P.read_input(run, str(tmp_path / "named.npz"), x="x2")
    assert P.read_input(run, str(tmp_path / "named.npz"), x="feats")[0].shape == (5, 64)
    np.savez(tmp_path / "labels.npz", x=np.zeros((2, 64)), y=np.array(["3", "cat"]))
    assert P.read_input(run, str(tmp_path / "labels.npz"))[1] is None        # predicted, not scored: warned
    with pytest.raises(P.PredictError, match=r"labels \['cat'\] that are not classes"):
        P.encode_targets(run, np.array(["3", "cat"]), 2)
    nan = np.zeros((3, 10), dtype=np.float32)
    nan[1, 2] = np.nan
    with pytest.raises(P.PredictError, match=r"NaN/inf values in column\(s\) .* \(first rows, counted from 0: \[1\]\)"):
        P.prepare_features(P.load_run(reg_run), nan)


def test_cli_errors_exit_nonzero_with_one_message(cls_run, tmp_path):
    proc = cli(tmp_path / "no_run", "--data", "test", timeout=60)
    assert proc.returncode == P.EXIT_INPUT and "does not exist" in proc.stderr
    proc = cli(cls_run, "--data", "test", "--out", tmp_path / "p.txt", timeout=60)
    assert proc.returncode == P.EXIT_INPUT and "--out must end in .csv, .npz, .parquet" in proc.stderr
    mine = tmp_path / "mine.csv"                       # --out the input itself: its rows were replaced, unsaid
    mine.write_text("a,b\n1,2\n")
    proc = cli(cls_run, "--data", mine, "--out", tmp_path / "." / "mine.csv", timeout=60)
    assert proc.returncode == P.EXIT_INPUT and "is the --data file" in proc.stderr
    assert mine.read_text() == "a,b\n1,2\n"
    board = (cls_run / "leaderboard.csv").read_text()         # --out over the run's own files: refused
    proc = cli(cls_run, "--data", "test", "--out", cls_run / "leaderboard.csv", timeout=60)
    assert proc.returncode == P.EXIT_INPUT and "inside the run directory" in proc.stderr
    assert (cls_run / "leaderboard.csv").read_text() == board
    assert proc.stderr.count("error:") == 1
