"""Honest uncertainty end to end: a real run (Keras members under mpiexec) on a synthetic
heteroscedastic regression table, whose noise grows with |x|; the recalibrated 90%
interval must cover 85-95% of the test rows, and the run reports coverage and R^2."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
name = "hetero"
seed = 11
[data]
source = "hetero.csv"
label = "y"
task = "regression"
val_fraction = 0.2
test_fraction = 0.2
[train]
epochs = 40
batch_size = 64
learning_rate = 0.01
patience = 5
[[architectures]]
name = "mlp"
members = 3
layers = [{type = "Dense", units = 16, activation = "tanh"}]
"""


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_recalibrated_interval_covers_what_it_claims_on_heteroscedastic_data(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (2000, 2))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1] + rng.normal(0.0, 0.05 + 0.3 * np.abs(x[:, 0]))
    pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "y": y}).to_csv(tmp_path / "hetero.csv", index=False)
    (tmp_path / "hetero.toml").write_text(textwrap.dedent(CONFIG))
    run_dir = tmp_path / "run"
    proc = run_mpi(2, ["-m", "ensemble.run", str(tmp_path / "hetero.toml"), "--run-dir", str(run_dir)],
                   timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "ensemble.json").read_text())
    test = summary["ensemble"]["test"]
    assert 0.85 <= test["coverage90"] <= 0.95, summary["calibration"]
    assert test["coverage50"] < test["coverage90"] < test["coverage95"]
    assert test["r2"] > 0.5 and "nll" in test
    assert summary["calibration"]["method"] in ("variance_scaling", "conformal")
    assert set(summary["calibration"]["before"]["test"]) >= {"coverage50", "coverage90", "coverage95"}
    saved = np.load(run_dir / "ensemble_test_predictions.npz")
    assert (saved["aleatoric_var"] > 0).all()                     # members predict a variance by default
    inside = (saved["lower_90"] <= saved["y"]) & (saved["y"] <= saved["upper_90"])
    assert inside.mean() == pytest.approx(test["coverage90"])
    # the interval follows the noise: larger predicted spread, larger errors (rank correlation)
    err = np.abs(saved["y"] - saved["mean"])
    ranks = [np.argsort(np.argsort(v)) for v in (saved["std"], err)]
    assert np.corrcoef(*ranks)[0, 1] > 0.3
    out = proc.stdout + proc.stderr
    assert "coverage" in out and "r2" in out and "effective size" in out
