"""The exported Keras graph's combination (``ensemble.task.graph``) against ``Task.combine``: the same
numbers, also for targets with a large offset (a member's weight or shift through Keras' ``Rescaling``
went through float32: a 1.6e9 target lost 48 units and the variance 31%)."""

from __future__ import annotations

import numpy as np


def test_the_regression_graph_keeps_a_large_offset_to_float64():
    import keras

    from ensemble.task import get_task
    from ensemble.task.graph import MemberOutput
    task = get_task("regression")
    rng = np.random.default_rng(0)
    raw = [rng.normal(size=(6, 4)) for _ in range(3)]                       # Gaussian heads: mean, raw var
    shifts, scales = np.array([1.6e9 + 0.37, -0.1]), np.array([109.9, 3.15])
    weights = [0.5, 0.3, 0.2]
    inputs = [keras.Input((4,), dtype="float64") for _ in raw]
    graph = task.combine_in_keras([MemberOutput(t, w, f"m{i}", shifts, scales, True)
                                   for i, (t, w) in enumerate(zip(inputs, weights))], 2)
    mean, var = (np.asarray(a) for a in keras.Model(inputs, graph)(raw))
    decoded = [task.decode(r, shifts, scales, gaussian=True) for r in raw]
    want = task.combine_outputs(decoded, np.asarray(weights))
    np.testing.assert_allclose(mean, want["mean"], rtol=1e-13, atol=1e-6)
    np.testing.assert_allclose(var, want["var"], rtol=1e-9)


def test_an_ensemble_without_spread_has_its_calibrations_spread_in_predict_and_the_export():
    """One member without a variance head: predict wrote std 0 beside intervals of +-0.6 and
    reported no coverage, and the exported model's variance was 0. The spread is now the
    calibration's floor times its scale (the residual scale), as aleatoric, everywhere."""
    import keras

    from ensemble.task import get_task
    from ensemble.task.calibration import apply_regression, fit_regression
    from ensemble.task.graph import MemberOutput
    task = get_task("regression")
    rng = np.random.default_rng(1)
    y = rng.normal(size=200)
    mean = y + 0.6 * rng.normal(size=200)
    stats = task.combine_outputs([(mean, None)], np.ones(1))
    assert not np.any(stats["std"])
    cal = fit_regression(y, stats["mean"], stats["std"], "conformal", held_out=True)
    out = apply_regression(stats, cal)
    assert np.allclose(out["std"], np.sqrt(np.mean((y - mean) ** 2)), rtol=1e-6)       # the residual scale
    assert np.allclose(out["var"], out["aleatoric"] + out["epistemic"]) and np.all(out["std"] > 0)
    metrics = task.ensemble_metrics(y, out)
    assert 0.85 <= metrics["coverage90"] <= 0.95 and np.isfinite(metrics["nll"])        # said, not left out
    raw = [(mean.reshape(-1, 1) - 0.0) / 1.0]
    inputs = [keras.Input((1,), dtype="float64")]
    graph = task.combine_in_keras([MemberOutput(inputs[0], 1.0, "m0", np.zeros(1), np.ones(1), False)], 1, cal)
    _, var = (np.asarray(a) for a in keras.Model(inputs, graph)(raw))
    np.testing.assert_allclose(var.reshape(-1), out["var"], rtol=1e-9)
