"""Metrics, uncertainty split and averaging, against hand-computed numbers."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from ensemble.task.metrics import (
    CLASSIFICATION_METRICS,
    METRICS,
    REGRESSION_METRICS,
    average_predictions,
    classification_metrics,
    classification_uncertainty,
    higher_is_better,
    metric_task,
    regression_metrics,
    regression_mixture,
    score,
    score_unchecked,
)

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ classification
def test_classification_metrics_by_hand():
    y = np.array([0, 1, 1])
    proba = np.array([[0.9, 0.1], [0.35, 0.65], [0.75, 0.25]])
    m = classification_metrics(y, proba)
    assert m["accuracy"] == pytest.approx(2 / 3)
    assert m["log_loss"] == pytest.approx(-(math.log(0.9) + math.log(0.65) + math.log(0.25)) / 3)
    # sum over classes of (p - onehot)^2: 0.02, 0.245, 1.125
    assert m["brier"] == pytest.approx((0.02 + 0.245 + 1.125) / 3)
    # one sample per bin: |1 - .9|, |1 - .65|, |0 - .75|
    assert m["ece"] == pytest.approx((0.1 + 0.35 + 0.75) / 3)


def test_ece_shares_a_bin():
    y = np.array([0, 1, 0])
    proba = np.array([[0.91, 0.09], [0.92, 0.08], [0.22, 0.78]])
    # bin (13/15, 14/15]: accuracy 1/2, confidence 0.915; bin of 0.78: wrong
    expected = (2 * abs(0.5 - 0.915) + abs(0.0 - 0.78)) / 3
    assert classification_metrics(y, proba)["ece"] == pytest.approx(expected)


def test_three_classes_not_all_present_and_zero_probability():
    y = np.array([0, 0])
    proba = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])  # 0 on the true class
    m = classification_metrics(y, proba)
    assert m["accuracy"] == 0.5
    assert math.isfinite(m["log_loss"]) and m["log_loss"] > 10
    assert m["brier"] == pytest.approx((0.0 + (1 + 0.25 + 0.25)) / 2)


def test_float32_rows_not_summing_to_one_give_no_warning():
    rng = np.random.default_rng(0)
    proba = rng.dirichlet(np.ones(5), size=50).astype(np.float32) * np.float32(1.0001)
    y = rng.integers(0, 5, size=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = classification_metrics(y, proba)
    assert set(m) == {"accuracy", "log_loss", "brier", "ece"}


def test_bad_labels_are_named():
    with pytest.raises(ValueError, match=r"`y` labels must lie in \[0, 1\]"):
        classification_metrics(np.array([0, 2]), np.array([[0.5, 0.5], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="were logits passed"):
        classification_metrics(np.array([0, 1]), np.array([[2.0, -1.0], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="one integer label per row"):
        classification_metrics(np.array([0, 1, 1]), np.array([[0.5, 0.5], [0.5, 0.5]]))


# ---------------------------------------------------------------------- regression
def test_regression_metrics_by_hand():
    y = np.array([0.0, 1.0, 2.0])
    mean = np.array([0.0, 3.0, 2.0])
    var = np.array([1.0, 1.0, 4.0])
    m = regression_metrics(y, mean, var)
    assert m["mse"] == pytest.approx(4 / 3)
    assert m["mae"] == pytest.approx(2 / 3)
    nll = (0.5 * math.log(2 * math.pi) + 0.5 * math.log(2 * math.pi) + 2.0
           + 0.5 * math.log(8 * math.pi)) / 3
    assert m["nll"] == pytest.approx(nll)
    assert m["coverage90"] == pytest.approx(2 / 3)  # |3 - 1| > 1.645
    assert m["coverage50"] == pytest.approx(2 / 3) and m["coverage95"] == pytest.approx(2 / 3)
    assert set(regression_metrics(y, mean)) == {"mse", "mae", "r2"}


def test_r2_matches_scikit_learn_for_one_and_several_outputs():
    from sklearn.metrics import r2_score
    rng = np.random.default_rng(0)
    y = rng.normal(size=(50, 3))
    pred = y + rng.normal(scale=0.5, size=y.shape)
    assert regression_metrics(y, pred)["r2"] == pytest.approx(r2_score(y, pred))
    assert regression_metrics(y[:, 0], pred[:, 0])["r2"] == pytest.approx(r2_score(y[:, 0], pred[:, 0]))
    assert score("r2", y[:, 0], pred[:, 0]) == pytest.approx(r2_score(y[:, 0], pred[:, 0]))
    # one row: undefined (it printed 0, a perfect-looking "no better than the mean")
    assert np.isnan(regression_metrics(y[:1], pred[:1])["r2"]) and np.isnan(score("r2", y[:1, 0], pred[:1, 0]))
    # a target with one value in every row has no R^2: left out of the average, not 0 (or 1 for a
    # baseline that fits the constant exactly, which then read 0.94 against an ensemble's 0.44)
    flat = np.column_stack([y[:, 0], np.full(len(y), 3.0)])
    for guess in (np.full(len(y), 3.0), np.full(len(y), 3.1)):
        got = regression_metrics(flat, np.column_stack([pred[:, 0], guess]))["r2"]
        assert got == pytest.approx(r2_score(y[:, 0], pred[:, 0]))
    assert np.isnan(regression_metrics(np.full(5, 3.0), np.full(5, 3.1))["r2"])


def test_regression_shapes():
    y = np.array([[0.0, 1.0], [2.0, 3.0]])
    assert regression_metrics(y, y + np.array([[1.0, 0.0], [0.0, 1.0]]))["mse"] == 0.5
    # (n,) targets against (n, 1) network outputs
    assert regression_metrics(np.array([1.0, 2.0]), np.array([[1.0], [4.0]]))["mae"] == 1.0
    with pytest.raises(ValueError, match="`mean` must have the shape of `y`"):
        regression_metrics(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="`var` must be non-negative"):
        regression_metrics(np.zeros(2), np.zeros(2), np.array([1.0, -1.0]))


# --------------------------------------------------------------------------- table
def test_directions():
    assert higher_is_better("accuracy")
    for name in ("log_loss", "brier", "ece", "mse", "mae", "nll"):
        assert not higher_is_better(name)
    assert set(METRICS) == CLASSIFICATION_METRICS | REGRESSION_METRICS
    assert metric_task("brier") == "classification" and metric_task("nll") == "regression"


def test_unknown_metric_names_it_and_the_allowed_ones():
    with pytest.raises(ValueError) as err:
        higher_is_better("f1")
    text = str(err.value)
    assert "'f1'" in text
    for name in METRICS:
        assert name in text
    with pytest.raises(ValueError, match="'auc'"):
        score("auc", np.zeros(2), np.zeros(2))


def test_score_matches_the_tables():
    rng = np.random.default_rng(1)
    proba = rng.dirichlet(np.ones(3), size=40)
    y = rng.integers(0, 3, size=40)
    cm = classification_metrics(y, proba)
    for name in CLASSIFICATION_METRICS:
        assert score(name, y, proba) == pytest.approx(cm[name])
    t, mu, var = rng.normal(size=40), rng.normal(size=40), rng.uniform(0.5, 2, size=40)
    rm = regression_metrics(t, mu, var)
    for name in REGRESSION_METRICS:
        assert score(name, t, mu, var) == pytest.approx(rm[name])
    with pytest.raises(ValueError, match="'nll' needs the predicted variance"):
        score("nll", t, mu)


def test_score_unchecked_agrees_with_score():
    rng = np.random.default_rng(6)
    proba = rng.dirichlet(np.full(4, 0.3), size=60)
    proba[0] = [0.0, 0.0, 1.0, 0.0]  # exercises the clipping
    y = rng.integers(0, 4, size=60)
    y[0] = 0
    for name in CLASSIFICATION_METRICS:
        assert score_unchecked(name, y, proba) == pytest.approx(score(name, y, proba), rel=1e-9)
    t = rng.normal(size=(60, 2))
    mu, var = rng.normal(size=(60, 2)), rng.uniform(0.1, 2, size=(60, 2))
    for name in REGRESSION_METRICS:
        assert score_unchecked(name, t, mu, var) == pytest.approx(score(name, t, mu, var))
    column = mu[:, :1]  # (n, 1) outputs against (n,) targets
    assert score_unchecked("mse", t[:, 0], column) == pytest.approx(score("mse", t[:, 0], column))


# ------------------------------------------------------------ averaging, uncertainty
def test_average_predictions_normalises_and_refuses_bad_weights():
    preds = np.array([[0.0, 4.0], [4.0, 0.0]])
    np.testing.assert_allclose(average_predictions(preds, np.array([1.0, 3.0])), [3.0, 1.0])
    np.testing.assert_allclose(average_predictions(preds), [2.0, 2.0])
    with pytest.raises(ValueError, match="non-negative"):
        average_predictions(preds, np.array([1.0, -0.5]))
    with pytest.raises(ValueError, match="all be zero"):
        average_predictions(preds, np.zeros(2))
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        average_predictions(preds, np.ones(3))


def test_classification_uncertainty_by_hand():
    probas = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # two confident, opposite members
    u = classification_uncertainty(probas, np.array([1.0, 1.0]))
    np.testing.assert_allclose(u["proba"], [[0.5, 0.5]])
    np.testing.assert_allclose(u["total"], [math.log(2)])
    np.testing.assert_allclose(u["aleatoric"], [0.0])
    np.testing.assert_allclose(u["epistemic"], [math.log(2)])


def test_classification_total_is_aleatoric_plus_epistemic():
    rng = np.random.default_rng(2)
    probas = rng.dirichlet(np.full(4, 0.7), size=(6, 30))
    w = rng.uniform(0.1, 1.0, size=6)
    u = classification_uncertainty(probas, w)
    np.testing.assert_allclose(u["total"], u["aleatoric"] + u["epistemic"], atol=1e-12)
    assert np.all(u["epistemic"] >= 0)
    np.testing.assert_allclose(u["proba"], average_predictions(probas, w))
    # mutual information = weighted KL of each member from the mean
    wn = w / w.sum()
    kl = np.sum(probas * np.log(probas / u["proba"][None]), axis=-1)
    np.testing.assert_allclose(u["epistemic"], np.tensordot(wn, kl, axes=1), atol=1e-12)


def test_classification_epistemic_zero_when_members_agree():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(5), size=20)
    u = classification_uncertainty(np.stack([p, p, p]), np.array([0.2, 0.3, 0.5]))
    np.testing.assert_allclose(u["epistemic"], 0.0, atol=1e-12)
    np.testing.assert_allclose(u["total"], -np.sum(p * np.log(p), axis=1))


def test_regression_mixture_by_hand():
    out = regression_mixture(np.array([[0.0], [2.0]]), np.array([[1.0], [1.0]]), np.ones(2))
    for key, value in {"mean": 1.0, "aleatoric": 1.0, "epistemic": 1.0, "var": 2.0}.items():
        np.testing.assert_allclose(out[key], [value])
    np.testing.assert_allclose(out["std"], [math.sqrt(2.0)])


def test_regression_mixture_variance_on_random_data():
    rng = np.random.default_rng(4)
    means = rng.normal(size=(5, 25, 2))
    variances = rng.uniform(0.1, 2.0, size=(5, 25, 2))
    w = rng.uniform(0.1, 1.0, size=5)
    out = regression_mixture(means, variances, w)
    wn = w / w.sum()
    second = np.tensordot(wn, variances + means**2, axes=1)
    np.testing.assert_allclose(out["var"], second - out["mean"] ** 2, atol=1e-12)
    np.testing.assert_allclose(out["var"], out["aleatoric"] + out["epistemic"])
    np.testing.assert_allclose(out["std"] ** 2, out["var"])
    no_var = regression_mixture(means, None, w)
    np.testing.assert_array_equal(no_var["aleatoric"], 0.0)
    np.testing.assert_allclose(no_var["var"], out["epistemic"])


def test_regression_epistemic_zero_when_members_agree():
    mu = np.linspace(-1, 1, 10)
    out = regression_mixture(np.stack([mu, mu]), np.stack([mu**2, mu**2]), np.array([1.0, 2.0]))
    np.testing.assert_allclose(out["epistemic"], 0.0, atol=1e-15)
    np.testing.assert_allclose(out["var"], mu**2)


def test_import_is_light():
    code = (
        "import sys, time; t = time.perf_counter(); import ensemble.task.metrics, ensemble.results.selection;"
        " print(time.perf_counter() - t, 'sklearn' in sys.modules, 'tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out[1:] == ["False", "False"]                 # what they import, not how long it takes


def test_metrics_too_small_or_too_large_for_4_decimals_show_4_significant_figures():
    """Targets in micrometres or in millions: an mse of 3.2e-13 was shown as 0.0000 (and a baseline
    "beat" the ensemble 0.0000 to 0.0000), one of 2.5e10 overflowed the console's columns."""
    from ensemble.task.metrics import metric_text
    assert metric_text(0.123456) == "0.1235" and metric_text(0.0) == "0.0000" and metric_text(-12.5) == "-12.5000"
    assert metric_text(3.2e-13) == "3.2e-13" and metric_text(25134940491.9672) == "2.513e+10"
    assert metric_text(0.00042) == "0.00042" and metric_text(float("nan")) == "nan"
    assert metric_text(0.5, 12) == "      0.5000" and len(metric_text(2.5e10, 12)) == 12


def test_scales_note_names_the_target_that_mse_is_about():
    """A two-target regression ranked on mse was about its wider target alone, unsaid."""
    from ensemble.task.metrics import scales_note
    rng = np.random.default_rng(0)
    y = np.stack([rng.normal(0, 1, 200), rng.normal(0, 40, 200)], axis=1)
    note = scales_note("mse", y, ["gap", "modulus"])
    assert "'modulus' makes 100% of it" in note and 'ensemble.metric = "r2"' in note
    assert scales_note("r2", y) is None and scales_note("mse", y[:, :1]) is None
    assert scales_note("mse", np.stack([y[:, 0], 3 * y[:, 0]], axis=1)) is None     # within SCALE_RATIO


def test_a_class_too_rare_for_accuracy_is_said():
    """400 rows, 23 positives, ranked on accuracy: check printed "0: 377, 1: 23" and nothing more,
    and the test split held 3 positives."""
    from ensemble.task.metrics import rare_class_note
    y = np.array([0] * 280 + [1] * 16)
    note = rare_class_note("accuracy", y, ["no", "yes"], 60)
    assert "class 'yes' holds 16 of 296 training rows (5.4%), so about 3 of the 60 test rows" in note
    assert 'ensemble.metric = "log_loss"' in note
    assert rare_class_note("log_loss", y, ["no", "yes"], 60) is None                       # ranked on probabilities
    assert rare_class_note("accuracy", np.array([0] * 80 + [1] * 20), ["no", "yes"], 60) is None     # 20%: seen
    # balanced classes are not rare, however many (digits: 9.7%, and 20 classes of 5% each, were said to be)
    assert rare_class_note("accuracy", np.repeat(np.arange(20), 10), [str(i) for i in range(20)], 40) is None
    digits = np.repeat(np.arange(10), [128, 130, 127, 131, 129, 130, 129, 128, 122, 129])
    assert rare_class_note("accuracy", digits, [str(i) for i in range(10)], 270) is None
    assert rare_class_note("accuracy", np.repeat(np.arange(3), [47, 47, 6]), ["a", "b", "c"], 30) is not None
