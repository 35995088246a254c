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
