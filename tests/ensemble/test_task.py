"""The task objects: one set of combination formulas, used in numpy, across processes and
inside the exported Keras model; all three agree."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.config import resolve_config
from ensemble.inference.load import EnsembleRun, Member
from ensemble.task import get_task

RNG = np.random.default_rng(7)


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _members(task, m=5, n=40, k=3, gaussian=False):
    if task == "classification":
        return _softmax(RNG.normal(size=(m, n, k))), None
    means = RNG.normal(10.0, 2.0, size=(m, n, k))
    return means, (RNG.uniform(0.1, 1.0, size=(m, n, k)) if gaussian else None)


@pytest.mark.parametrize("name, gaussian", [("classification", False), ("regression", False),
                                            ("regression", True)])
def test_numpy_combination_equals_merge_of_parts(name, gaussian):
    task = get_task(name)
    preds, variances = _members(name, gaussian=gaussian)
    w = RNG.uniform(0.5, 2.0, size=len(preds))
    w /= w.sum()
    whole = task.combine(preds, variances, w)
    parts = []
    for rank in range(3):                      # members i % 3 == rank, as ensemble.predict spreads them
        idx = np.arange(rank, len(preds), 3)
        sub_w = w[idx]
        part = task.combine(preds[idx], None if variances is None else variances[idx], sub_w)
        parts.append((float(sub_w.sum()), part))
    parts.append((0.0, None))                  # a rank that holds no member
    merged = task.merge(parts, preds.shape[1], preds.shape[2])
    for key, value in whole.items():
        np.testing.assert_allclose(merged[key], value, rtol=1e-10, atol=1e-12, err_msg=key)


def test_regression_decode_puts_outputs_back_in_target_units():
    task = get_task("regression")
    raw = np.array([[0.5, -1.0], [1.5, 2.0]])
    mean, var = task.decode(raw, y_shift=3.0, y_scale=2.0, gaussian=True)
    np.testing.assert_allclose(mean, [4.0, 6.0])
    np.testing.assert_allclose(var, (np.logaddexp(0.0, [-1.0, 2.0]) + 1e-6) * 4.0)
    assert get_task("classification").decode(raw)[1] is None


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="task must be one of classification, regression"):
        get_task("ranking")


@pytest.mark.parametrize("name, gaussian", [("classification", False), ("regression", True)])
def test_exported_model_combines_as_numpy(tmp_path, name, gaussian):
    keras = pytest.importorskip("keras")
    from ensemble.inference.export import build_ensemble_model
    task = get_task(name)
    n_in, k, n = 4, (3 if name == "classification" else 2), 25
    x = RNG.normal(size=(n, n_in)).astype(np.float32)
    members, outs = [], []
    weights = np.array([0.5, 0.3, 0.2])
    for i, w in enumerate(weights):
        keras.utils.set_random_seed(i)
        inputs = keras.Input((n_in,))
        h = keras.layers.Dense(6, activation="tanh")(inputs)
        model = keras.Model(inputs, task.head(h, k, gaussian))
        path = tmp_path / f"m{i}.keras"
        model.save(path)
        member = Member(f"m{i}", float(w), str(path), y_shift=1.5, y_scale=2.0, gaussian=gaussian)
        members.append(member)
        outs.append(task.predict(model, x, member.y_shift, member.y_scale, gaussian, squeeze=False))
    variances = np.stack([o[1] for o in outs]) if gaussian else None
    expect = task.combine(np.stack([o[0] for o in outs]), variances, weights)
    config = resolve_config({"architectures": [{"name": "m", "members": 1, "layers": [{"type": "Dense", "units": 4}]}]})
    run = EnsembleRun(str(tmp_path), config,
                      {"task": name, "n_outputs": k, "input_shape": [n_in]}, tuple(members),
                      np.zeros(n_in, np.float32), np.ones(n_in, np.float32), {})
    got = build_ensemble_model(run)(x)
    if name == "classification":
        np.testing.assert_allclose(np.asarray(got), expect["proba"], rtol=1e-6)
    else:
        np.testing.assert_allclose(np.asarray(got[0]), expect["mean"], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(got[1]), expect["var"], rtol=1e-5)


def test_a_streamed_run_says_plainly_why_it_has_no_linear_baseline():
    from ensemble.orchestrate.session import baseline_section
    meta = {"task": "classification", "n_outputs": 3}
    out = baseline_section({**meta, "stream": {"files": 4}}, {}, 0)
    assert out["model"] == "logistic regression" and "`data.stream`" in out["skipped"]
    assert baseline_section(meta, {}, 0)["skipped"].startswith("KeyError")        # any other failure: named
