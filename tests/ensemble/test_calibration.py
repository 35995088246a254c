"""Recalibration of an ensemble's uncertainty (ensemble.task.calibration): pure numpy."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.task import calibration as C
from ensemble.task import get_task
from ensemble.task.metrics import classification_metrics, regression_mixture


def heteroscedastic(n: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, the true noise std at x, and y = sin(x) + noise whose std grows with |x|."""
    x = rng.uniform(-3, 3, n)
    sd = 0.1 + 0.3 * np.abs(x)
    return x, sd, np.sin(x) + rng.normal(0.0, sd)


def members(x: np.ndarray, sd: np.ndarray, rng, m: int = 5):
    """Overconfident members: means off by a member bias, variances a tenth of the truth."""
    bias = rng.normal(0.0, 0.05, m)
    means = np.stack([np.sin(x) + b for b in bias])
    variances = np.stack([0.1 * sd**2 for _ in bias])
    return means, variances


@pytest.mark.parametrize("method", ["auto", "variance_scaling", "conformal"])
def test_recalibrated_90_interval_covers_85_to_95_percent_of_test_points(method):
    rng = np.random.default_rng(3)
    (xv, sv, yv), (xt, st, yt) = heteroscedastic(600, rng), heteroscedastic(2000, rng)
    task = get_task("regression")
    bias_rng = np.random.default_rng(4)
    val = regression_mixture(*members(xv, sv, bias_rng))
    test = regression_mixture(*members(xt, st, np.random.default_rng(4)))
    before = task.ensemble_metrics(yt, C.apply("regression", test, None), True)
    assert before["coverage90"] < 0.6                       # overconfident as trained
    cal = C.fit("regression", yv, val, method, seed=0)
    after = task.ensemble_metrics(yt, C.apply("regression", test, cal), True)
    assert 0.85 <= after["coverage90"] <= 0.95, (cal, after)
    assert 0.45 <= after["coverage50"] <= 0.55 and 0.90 <= after["coverage95"] <= 0.98
    assert after["nll"] < before["nll"]
    if method == "auto":
        assert cal["method"] in C.REGRESSION_METHODS and set(cal["held_out_error"]) == set(C.REGRESSION_METHODS)


def test_variance_scaling_is_the_likelihood_factor_and_scales_the_parts_alike():
    y = np.array([0.0, 2.0, -2.0, 0.0])
    stats = regression_mixture(np.zeros((1, 4)), np.ones((1, 4)))
    cal = C.fit_regression(y, stats["mean"], stats["std"], "variance_scaling")
    assert cal["std_scale"] == [pytest.approx(np.sqrt(2.0))]         # s^2 = mean(r^2 / var) = 8 / 4
    out = C.apply_regression(stats, cal)
    assert np.allclose(out["var"], 2.0) and np.allclose(out["aleatoric"] + out["epistemic"], out["var"])
    assert np.allclose(out["intervals"]["90"], 1.6448536269514722 * np.sqrt(2.0))


def test_conformal_quantile_is_the_finite_sample_one():
    y = np.arange(1.0, 20.0)                     # scores 1..19 with mean 0 and std 1
    cal = C.fit_regression(y, np.zeros(19), np.ones(19), "conformal")
    # ceil((n + 1) * 0.9) = 18th smallest of 19 scores
    assert cal["half_width"]["90"] == [18.0] and cal["half_width"]["50"] == [10.0]


def test_a_spreadless_ensemble_gets_constant_width_intervals():
    rng = np.random.default_rng(0)
    y = rng.normal(size=200)
    stats = regression_mixture(np.zeros((1, 200)))                  # one member, no variance head
    cal = C.fit("regression", y, stats, "conformal")
    out = C.apply("regression", stats, cal)
    width = out["intervals"]["90"]
    assert np.allclose(width, width[0]) and 1.4 < width[0] < 2.0     # about the 90% quantile of |N(0,1)|


def test_multi_output_regression_is_calibrated_per_output():
    rng = np.random.default_rng(1)
    y = np.stack([rng.normal(0, 1, 300), rng.normal(0, 5, 300)], axis=1)
    stats = regression_mixture(np.zeros((1, 300, 2)), np.ones((1, 300, 2)))
    cal = C.fit("regression", y, stats, "variance_scaling")
    assert cal["std_scale"][0] == pytest.approx(1.0, abs=0.15) and cal["std_scale"][1] == pytest.approx(5.0, rel=0.15)
    assert C.apply("regression", stats, cal)["intervals"]["90"].shape == (300, 2)


def test_temperature_scaling_lowers_log_loss_and_ece_of_an_overconfident_ensemble():
    rng = np.random.default_rng(2)
    n, c = 2000, 4
    y = rng.integers(0, c, n)
    guess = np.where(rng.random(n) < 0.7, y, rng.integers(0, c, n))          # about 77% right
    proba = np.full((n, c), 0.01 / (c - 1))
    proba[np.arange(n), guess] = 0.99                                        # but 99% sure
    stats = get_task("classification").combine(proba[None], None, np.ones(1))
    cal = C.fit("classification", y[:1000], {k: v[:1000] for k, v in stats.items()}, "temperature")
    assert cal["temperature"] > 1.5
    test = {k: v[1000:] for k, v in stats.items()}
    before = classification_metrics(y[1000:], test["proba"])
    after = classification_metrics(y[1000:], C.apply("classification", test, cal)["proba"])
    assert after["log_loss"] < before["log_loss"] and after["ece"] < before["ece"] / 3
    assert after["accuracy"] == before["accuracy"]                             # never changes the class


def test_settings_that_do_not_fit_the_task_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="ensemble.calibration"):
        C.resolve("temperature", "regression")
    with pytest.raises(ValueError, match="ensemble.calibration"):
        C.resolve("conformal", "classification")
    assert C.resolve("auto", "classification") == "temperature"          # kept only where held-out rows agree
    assert C.fit("classification", np.zeros(3), {}, "none") is None


def test_temperature_never_sharpens_on_a_validation_split_with_too_few_errors():
    """All validation rows right: the log loss keeps falling as T falls, and the first test
    error would be punished with a near-zero probability; T stays at least 1."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 60)
    proba = np.full((60, 3), 0.1)
    proba[np.arange(60), y] = 0.8
    kept = C.fit_temperature(y, proba)
    assert kept["temperature"] == 1.0
    assert "holds 0 misclassified row(s), fewer than 5" in kept["why"]       # the reason said (it said "did not lower
    wrong = y.copy()                                                    # the log loss of held-out rows")
    wrong[: C.MIN_ERRORS] = (y[: C.MIN_ERRORS] + 1) % 3      # 8% wrong at 80% confidence: underconfident
    sharper = C.fit_temperature(wrong, proba)
    assert sharper["temperature"] < 1.0 and "why" not in sharper      # with enough errors it may sharpen


def test_auto_keeps_t_1_on_too_few_validation_rows_to_check_a_temperature():
    """Two rows, one of them wrong at 90%: the log loss alone would soften to T = 20
    (uniform); with no held-out folds to confirm it, "auto" keeps T = 1 and says why, while
    the explicit setting still fits."""
    y = np.array([0, 1])
    proba = np.array([[0.9, 0.1], [0.9, 0.1]])
    stats = get_task("classification").combine(proba[None], None, np.ones(1))
    assert C.fit("classification", y, stats, "temperature")["temperature"] > 5
    cal = C.fit("classification", y, stats, "auto")
    assert cal["temperature"] == 1.0 and "2 validation rows" in cal["why"]
    rows = C.MIN_ROWS
    y = np.tile([0, 1], rows // 2)
    stats = get_task("classification").combine(np.tile(proba, (rows // 2, 1))[None], None, np.ones(1))
    assert "why" not in C.fit("classification", y, stats, "auto")      # enough rows: fitted and checked


def test_conformal_intervals_cover_at_least_nominal_on_average_over_many_splits():
    """Split conformal's finite-sample guarantee, through the project's own fit and apply:
    on exchangeable data (heavy-tailed errors whose spread the ensemble gets wrong by a
    factor of 3), the level-a interval fitted on n = 24 validation rows covers at least a of
    new rows on average over 200 splits (in expectation ceil(25 a) / 25: 0.92 at 90%, 0.96 at
    95%). The uncorrected quantile (ceil(n a)-th score) would give 0.88 and 0.92."""
    rng = np.random.default_rng(0)
    n_val, n_test, splits = 24, 500, 200
    covered = {"90": [], "95": []}
    for _ in range(splits):
        scale = rng.uniform(0.5, 2.0, n_val + n_test)                      # heteroscedastic
        y = scale * rng.standard_t(3, n_val + n_test)
        mean, std = np.zeros_like(y), scale / 3.0                            # spread 3x too small
        cal = C.fit_regression(y[:n_val], mean[:n_val], std[:n_val], "conformal")
        stats = {"mean": mean[n_val:], "std": std[n_val:], "var": std[n_val:] ** 2,
                 "aleatoric": std[n_val:] ** 2, "epistemic": np.zeros(n_test)}
        out = C.interval_metrics(y[n_val:], C.apply_regression(stats, cal))
        for level in covered:
            covered[level].append(out[f"coverage{level}"])
    assert np.mean(covered["90"]) >= 0.90 and np.mean(covered["95"]) >= 0.95
    assert np.mean(covered["90"]) < 0.94                 # and not by giving up (infinite intervals)


@pytest.mark.parametrize("n", [40, 136, 500])
def test_normalised_conformal_intervals_equal_crepes(n):
    """The project's normalised split-conformal intervals are crepes' (Boström's
    ``ConformalRegressor`` with sigmas), a well-kept conformal library: the same finite-sample
    quantile of |y - mean| / std on the calibration rows, times each new row's std. (n is
    chosen so that (n + 1) * level is never a whole number: there crepes' float rounding
    takes the next score, one rank more conservative than the exact ceil((n + 1) level).)"""
    crepes = pytest.importorskip("crepes")
    rng = np.random.default_rng(n)
    mean, std = rng.normal(size=n), rng.uniform(0.2, 2.0, n)
    y = mean + std * rng.standard_t(4, n) * 1.7                  # heavy tails, spread off by 1.7x
    new_mean, new_std = rng.normal(size=50), rng.uniform(0.2, 2.0, 50)
    cal = C.fit_regression(y, mean, std, "conformal")
    stats = {"mean": new_mean, "std": new_std, "var": new_std ** 2, "aleatoric": new_std ** 2,
             "epistemic": np.zeros(50)}
    ours = C.apply_regression(stats, cal)["intervals"]
    reference = crepes.ConformalRegressor().fit(residuals=y - mean, sigmas=std)
    for key, half_width in ours.items():
        interval = reference.predict_int(new_mean, sigmas=new_std, confidence=int(key) / 100)
        np.testing.assert_allclose(new_mean - half_width, interval[:, 0], rtol=1e-12)
        np.testing.assert_allclose(new_mean + half_width, interval[:, 1], rtol=1e-12)


def test_the_calibration_holdout_is_a_fixed_disjoint_part_of_the_validation_rows():
    stop, held = C.holdout_rows(200, 0.5)
    assert len(held) == 100 and len(stop) == 100 and not set(stop) & set(held)
    assert sorted({*stop, *held}) == list(range(200))
    assert np.array_equal(held, C.holdout_rows(200, 0.5)[1])               # every rank finds the same rows
    assert held.min() < 50 and held.max() > 150                            # drawn, not a block
    for n, share in ((200, 0.0), (30, 0.5), (100, 0.9)):                   # none, or a part under 20 rows
        stop, held = C.holdout_rows(n, share)
        assert np.array_equal(stop, np.arange(n)) and np.array_equal(held, np.arange(n))


def test_members_stop_early_on_the_rows_the_holdout_leaves():
    from ensemble.train.member import stopping_rows
    data = {"y_val": np.zeros(120)}
    assert np.array_equal(stopping_rows(data, {}), np.arange(120))
    rows = stopping_rows(data, {"calibration_holdout": 0.25})
    assert len(rows) == 90 and np.array_equal(rows, C.holdout_rows(120, 0.25)[0])


def test_an_ensemble_is_recalibrated_on_the_held_out_rows_alone():
    """Members fitted to the stopping rows (small errors there) and not to the held ones: the
    spread is scaled by the held rows' errors, so the test split, like the held rows, is covered."""
    from ensemble.results.summary import score_weights
    rng = np.random.default_rng(0)
    n = 400
    stop, held = C.holdout_rows(n, 0.5)
    y_val = rng.normal(size=n)
    noise = np.where(np.isin(np.arange(n), held), 2.0, 0.5)                 # optimistic on the stopping rows
    arrays = {"m": {"val_pred": (y_val + noise * rng.normal(size=n))[:, None], "val_var": np.ones((n, 1)),
                    "test_pred": np.zeros((n, 1)), "test_var": np.ones((n, 1))}}
    y_test = 2.0 * rng.normal(size=n)
    targets = {"val": y_val, "test": y_test}
    task = get_task("regression")
    plain = score_weights(task, {"m": 1.0}, arrays, targets, "variance_scaling", 0, True)
    held_out = score_weights(task, {"m": 1.0}, arrays, targets, "variance_scaling", 0, True, 0.5)
    assert held_out["calibration"]["rows"] == 200 and plain["calibration"]["rows"] == n
    assert held_out["calibration"]["std_scale"][0] == pytest.approx(2.0, rel=0.1)
    assert plain["calibration"]["std_scale"][0] < 1.7
    assert held_out["metrics"]["test"]["coverage90"] == pytest.approx(0.9, abs=0.04)
    assert plain["metrics"]["test"]["coverage90"] < 0.85


def test_the_holdout_setting_is_auto_by_task_or_a_share_and_refuses_anything_else():
    from ensemble.config import ConfigError
    from ensemble.config.schema import resolve_config
    arch = [{"name": "m", "members": 1, "layers": [{"type": "Dense", "units": 4}]}]
    assert resolve_config({"architectures": arch}).data.calibration_holdout == "auto"
    assert C.holdout_share("auto", "regression") == 0.5 and C.holdout_share("auto", "classification") == 0.0
    assert C.holdout_share(0.3, "classification") == 0.3
    for bad in (0.9, -0.1, "half", True):
        with pytest.raises(ConfigError, match="data.calibration_holdout"):
            resolve_config({"architectures": arch, "data": {"calibration_holdout": bad}})


def test_auto_only_widens_on_rows_that_also_stopped_training():
    """150 rows, 23 for validation (too few to hold some out): the members' errors on those rows were
    half their errors on new rows, and "auto" narrowed the 90% interval to 0.80 of new rows."""
    from ensemble.results.summary import calibration_lines
    rng = np.random.default_rng(2)
    n = 23
    y = rng.normal(size=n)
    mean, std = y + 0.5 * rng.normal(size=n), np.ones(n)           # optimistic: errors half the spread
    fitted = C.fit_regression(y, mean, std, "auto", held_out=True)
    assert fitted["std_scale"][0] < 0.8 and fitted["half_width"]["90"][0] < 1.645      # rows kept aside: as fitted
    kept = C.fit_regression(y, mean, std, "auto", held_out=False)
    assert kept["widen_only"] and kept["std_scale"] == [1.0]
    assert all(kept["half_width"][k][0] >= C.M.Z[float(k) / 100] - 1e-12 for k in kept["half_width"])
    wide = C.fit_regression(y, y + 3.0 * rng.normal(size=n), std, "auto", held_out=False)
    assert wide["std_scale"][0] > 2                                  # overconfident even there: widened
    asked = C.fit_regression(y, mean, std, "conformal", held_out=False)
    assert "widen_only" not in asked and asked["half_width"]["90"][0] < 1.645          # a method asked for: as asked
    said = calibration_lines({**kept, "rows": n, "held_out": False})
    assert len(said) == 1 and "only widened, never narrowed" in said[0]
    assert "may cover less than nominal" in calibration_lines({**asked, "rows": n, "held_out": False})[0]
    assert "without split conformal's finite-sample guarantee" in calibration_lines(
        {"method": "variance_scaling", "rows": 60, "held_out": True})[0]
    assert "covers at least 0.90" in calibration_lines({"method": "conformal", "rows": 60, "held_out": True})[0]


def test_auto_only_softens_on_classification_rows_that_also_stopped_training():
    """No calibration holdout (classification's default): the validation rows chose each member's
    epoch and the weights, so the ensemble is surer and more often right on them than on new rows.
    A temperature fitted there sharpened in 9 of 35 panel runs and the test log loss was worse in 7;
    "auto" then keeps T >= 1 and says why, while rows kept aside (or the method asked by name) may
    still sharpen, and an overconfident ensemble is still softened."""
    rng = np.random.default_rng(4)
    n, c = 400, 3
    y = rng.integers(0, c, n)
    guess = np.where(rng.random(n) < 0.85, y, (y + 1) % c)                   # 85% right
    proba = np.full((n, c), 0.2)
    proba[np.arange(n), guess] = 0.6                                        # but 60% sure: underconfident
    stats = get_task("classification").combine(proba[None], None, np.ones(1))
    held = C.fit("classification", y, stats, "auto", held_out=True)
    assert held["temperature"] < 0.8 and "soften_only" not in held
    kept = C.fit("classification", y, stats, "auto", held_out=False)
    assert kept["temperature"] == 1.0 and kept["soften_only"] and "only softened" in kept["why"]
    assert C.fit("classification", y, stats, "temperature", held_out=False)["temperature"] < 0.8     # asked: as asked
    proba[np.arange(n), guess] = 0.98                                       # 98% sure: overconfident
    proba[proba == 0.2] = 0.01
    sure = get_task("classification").combine(proba[None], None, np.ones(1))
    softened = C.fit("classification", y, sure, "auto", held_out=False)
    assert softened["temperature"] > 1.5 and softened["soften_only"]


def test_a_level_too_few_rows_can_guarantee_is_wider_than_the_one_below_and_said():
    """12 validation rows: split conformal's 95% interval needs an unbounded one, and was the largest
    error, the 90% one (it covered 0.86 of new rows), with nothing said but `capped` in ensemble.json."""
    from ensemble.results.summary import calibration_lines
    from ensemble.task.calibration import beyond, fit_regression
    rng = np.random.default_rng(0)
    y = rng.normal(size=12)
    mean = y + rng.normal(size=12)
    cal = fit_regression(y, mean, np.ones(12), "conformal")
    assert cal["capped"] == ["95", "99"]
    w = {k: v[0] for k, v in cal["half_width"].items()}
    assert w["95"] == pytest.approx(w["90"] * beyond(12, 0.95)) and w["95"] > w["90"] * 1.1
    assert cal["curve"]["99"][0] > w["95"]
    lines = calibration_lines({**cal, "rows": 12, "held_out": True})
    said = "95%: 12 rows are too few for split conformal to guarantee this level"
    assert any(line.startswith(said) for line in lines)
    many = fit_regression(rng.normal(size=200), rng.normal(size=200), np.ones(200), "conformal")
    assert many["capped"] == [] and beyond(200, 0.95) == 1.0


def test_the_reason_no_rows_were_kept_aside_is_the_true_one():
    """`data.calibration_holdout = 0` asked for none, but the console said the rows were too few."""
    from ensemble.results.summary import score_weights
    from ensemble.task import get_task
    rng = np.random.default_rng(0)
    y = {s: rng.normal(size=61) for s in ("val", "test")}
    arrays = {"m0": {f"{s}_pred": y[s] + 0.3 * rng.normal(size=61) for s in y} |
              {f"{s}_var": np.full(61, 0.09) for s in y}}
    for share, said in ((0.0, "`data.calibration_holdout` is 0: none kept aside"), (0.9, "too few to keep a part")):
        out = score_weights(get_task("regression"), {"m0": 1.0}, arrays, y, "auto", 0, True, share)
        assert said in out["calibration"]["why"], (share, out["calibration"]["why"])


def test_uncalibrated_intervals_far_below_nominal_are_warned_of():
    """`calibration = "none"` with members without variance heads: the 90% intervals covered 0.22 of
    the test rows and nothing said so."""
    from ensemble.results.summary import format_comparison
    test = {"mse": 1.0, "coverage50": 0.07, "coverage80": 0.15, "coverage90": 0.22, "coverage95": 0.3}
    summary = {"metric": "mse", "task": "regression", "members": [{"id": "a", "weight": 1.0}],
               "ensemble": {"test": test}, "best_member": {"id": "a", "test": {"mse": 1.0}},
               "calibration": {"method": "none"}}
    text = format_comparison(summary)
    assert "warning: the uncalibrated 90% intervals cover 0.22 of the test rows" in text
    summary["ensemble"]["test"] = {**test, "coverage90": 0.88}
    assert "warning: the uncalibrated" not in format_comparison(summary)
