"""End-to-end ensemble runs under real mpiexec: -n 1 (serial) and -n 3 (master + 2 workers)."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest

from ensemble.results.journal import read_journal
from ensemble.results.store import PackStore
from ensemble.task import metrics as M
from ensemble.task.calibration import apply_temperature
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
name = "tiny"
seed = 7
[data]
source = "digits"
test_fraction = 0.2
[train]
epochs = 6
batch_size = 64
patience = 2
learning_rate = 0.003
[[architectures]]
name = "mlp"
members = 3
layers = [{type = "Dense", units = 24, activation = "relu"}]
[[architectures]]
name = "user"
members = 1
model = "tests.mpi.user_models:small_mlp"
params = {units = 12}
[[architectures]]
name = "cnn"
members = 1
layers = [{type = "Reshape", target_shape = [8, 8, 1]},
          {type = "Conv2D", filters = 4, kernel_size = 3, activation = "relu"},
          {type = "MaxPooling2D", pool_size = 2}, {type = "Flatten"}]
[ensemble]
k = 3
method = "top_k"
"""


def start(tmp_path_factory, n: int, text: str = CONFIG, name: str = "run"):
    base = tmp_path_factory.mktemp(f"n{n}")
    cfg = base / "tiny.toml"
    cfg.write_text(textwrap.dedent(text))
    run_dir = base / name
    proc = run_mpi(n, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir, proc


@pytest.fixture(scope="module")
def run3(tmp_path_factory):
    return start(tmp_path_factory, 3, CONFIG + "[runtime]\ndebug_log = true\n")


@pytest.fixture(scope="module")
def run1(tmp_path_factory):
    return start(tmp_path_factory, 1)


def check_run_dir(run_dir):
    journal = read_journal(run_dir / "journal.jsonl")
    ids = [r["id"] for r in journal]
    assert sorted(ids) == ["cnn-000", "mlp-000", "mlp-001", "mlp-002", "user-000"]
    assert all(r["status"] == "ok" for r in journal), journal
    store = PackStore(run_dir / "store")                      # every member is a candidate here
    for r in journal:
        assert r["model"] and r["stored"] and (run_dir / r["path"]).is_file()
        arrays, meta = store.get(r["id"])
        assert {"val_pred", "test_pred"} <= set(arrays) and meta["history"]["loss"]
    board = pd.read_csv(run_dir / "leaderboard.csv")
    assert list(board["rank"]) == [1, 2, 3, 4, 5]
    acc = list(board["val_accuracy"])
    assert acc == sorted(acc, reverse=True)

    # ensemble.json's numbers, recomputed from the saved predictions
    ens = json.loads((run_dir / "ensemble.json").read_text())
    data = np.load(run_dir / "ensemble_test_predictions.npz")
    y_test = data["y"]
    weights = {m["id"]: m["weight"] for m in ens["members"]}
    assert len(weights) == 3 and abs(sum(weights.values()) - 1) < 1e-9
    assert set(weights) == set(board["id"][:3])                      # top-k by validation accuracy
    probs = sum(w * store.get(i)[0]["test_pred"] for i, w in weights.items())
    raw = M.classification_metrics(y_test, probs)
    # ensemble.json: the temperature-scaled probabilities (T = 1 where held-out rows did not agree)
    entropy = -np.sum(probs * np.log(np.clip(probs, 1e-300, 1.0)), axis=1)
    scaled = apply_temperature({"proba": probs, "total": entropy, "aleatoric": np.zeros(len(probs))},
                               ens["calibration"])["proba"]
    recomputed = M.classification_metrics(y_test, scaled)
    for key in ("accuracy", "log_loss", "brier", "ece"):
        assert ens["ensemble"]["test"][key] == pytest.approx(recomputed[key], rel=1e-9)
        assert ens["calibration"]["before"]["test"][key] == pytest.approx(raw[key], rel=1e-9)
    best = ens["best_member"]
    assert best["id"] == board["id"][0]
    best_pred = store.get(best["id"])[0]["test_pred"]
    assert best["test"]["accuracy"] == pytest.approx(M.classification_metrics(y_test, best_pred)["accuracy"])
    assert (run_dir / "config.toml").is_file() and (run_dir / "normalization.npz").is_file()
    return journal


def test_three_ranks_complete_run(run3):
    run_dir, proc = run3
    journal = check_run_dir(run_dir)
    assert {r["rank"] for r in journal} <= {1, 2} and len({r["rank"] for r in journal}) == 2
    assert "ensemble (3 members)" in proc.stdout and "best member" in proc.stdout


def test_the_run_writes_its_report_with_the_baseline_and_how_it_was_made(run3):
    run_dir, proc = run3
    for plot in ("leaderboard", "classification", "costs", "timeline"):
        assert (run_dir / "report" / f"{plot}.png").stat().st_size > 1000, plot
    page = (run_dir / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "could not be drawn" not in page
    assert "http://" not in page and "https://" not in page
    ens = json.loads((run_dir / "ensemble.json").read_text())
    base = ens["baseline"]
    assert base["model"] == "logistic regression" and base["train_rows"] > 0
    assert set(base["test"]) == set(ens["ensemble"]["test"]) and 0.5 < base["test"]["accuracy"] <= 1.0
    assert "baseline: logistic regression" in proc.stdout and f"report: {run_dir}/report.html" in proc.stdout
    opened = next(e for e in read_journal(run_dir / "journal.jsonl", events=True)[1] if e["event"] == "open")
    env = opened["environment"]
    assert env["argv"][1:4] == ["-m", "ensemble.run", str(run_dir.parent / "tiny.toml")]
    assert {"python", "tensorflow", "mpi4py", "MPI library"} <= set(env["versions"])
    assert "MPICH" in env["versions"]["MPI library"] and env["versions"]["MPI library"] in page


def test_debug_log_per_rank(run3):
    logs = run3[0] / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["rank-0.log", "rank-1.log", "rank-2.log"]
    master = (logs / "rank-0.log").read_text()
    assert "spec mlp-000 to rank" in master and "result of" in master
    for r in (1, 2):
        text = (logs / f"rank-{r}.log").read_text()
        assert f"rank {r} ensemble.runtime.executor DEBUG: training" in text and "told to stop" in text
    assert "DEBUG" not in run3[1].stdout + run3[1].stderr        # the console stays at INFO


def test_serial_run_matches_parallel_run(run1, run3):
    j1 = {r["id"]: r for r in check_run_dir(run1[0])}
    j3 = {r["id"]: r for r in read_journal(run3[0] / "journal.jsonl")}
    assert {r["rank"] for r in j1.values()} == {0}
    for member_id, r in j1.items():                      # same config and seed: same member metrics
        assert r["val"] == pytest.approx(j3[member_id]["val"], rel=1e-6), member_id
        assert r["test"] == pytest.approx(j3[member_id]["test"], rel=1e-6), member_id


@pytest.mark.parametrize("loss, metric", [pytest.param("mse", "mse", marks=pytest.mark.long),   # make test-long
                                          ("auto", "nll")])     # auto: a variance head
def test_regression_run_reports_spread(tmp_path_factory, loss, metric):
    run_dir, proc = start(tmp_path_factory, 2, f"""
        name = "reg"
        [data]
        source = "diabetes"
        task = "regression"
        [train]
        epochs = 8
        batch_size = 32
        bootstrap = true
        loss = "{loss}"
        [[architectures]]
        members = 3
        layers = [{{type = "Dense", units = 16, activation = "relu"}}]
        [ensemble]
        k = 3
        metric = "{metric}"
    """)
    ens = json.loads((run_dir / "ensemble.json").read_text())
    assert ens["task"] == "regression" and set(ens["ensemble"]["test"]) >= {"mse", "mae"}
    data = np.load(run_dir / "ensemble_test_predictions.npz")
    assert data["mean"].shape == data["std"].shape == data["y"].shape
    assert (data["epistemic_var"] > 0).all()                          # members disagree somewhere
    np.testing.assert_allclose(data["std"] ** 2, data["aleatoric_var"] + data["epistemic_var"], rtol=1e-9)
    assert ens["ensemble"]["test"]["mse"] == pytest.approx(float(np.mean((data["mean"] - data["y"]) ** 2)))
    if loss == "auto":
        assert (data["aleatoric_var"] > 0).all()
        test = ens["ensemble"]["test"]
        recomputed = M.regression_metrics(data["y"], data["mean"], data["std"] ** 2)
        assert test["nll"] == pytest.approx(recomputed["nll"]) and 0.5 < test["coverage90"] <= 1.0
    else:
        assert (data["aleatoric_var"] == 0).all()
    assert "mse" in proc.stdout
