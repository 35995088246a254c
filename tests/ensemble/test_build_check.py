"""The build check rank 0 runs before any member trains: each user builder is built once and
run on one batch (``train.architecture.check_architecture``, ``orchestrate.prepare.check_builds``).
Imports Keras (a few seconds), no MPI."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.config import ConfigError, resolve_config
from ensemble.orchestrate.prepare import check_builds
from ensemble.results.records import Status
from ensemble.train.architecture import ArchitectureError, check_architecture

X = np.random.default_rng(0).normal(size=(32, 64)).astype(np.float32)


def spec(model=None, layers=None, **extra):
    return {"model": model, "layers": layers, "params": {}, "loss": "auto", **extra}


def test_a_builder_without_softmax_fails_naming_it_and_the_fix():
    with pytest.raises(ArchitectureError) as err:
        check_architecture(spec("tests.mpi.user_models:logits_mlp"), X, 10, "classification")
    msg = str(err.value)
    assert "`model` 'tests.mpi.user_models:logits_mlp' must output class probabilities" in msg
    assert "rows sum to" in msg and 'keras.layers.Dense(10, activation="softmax")' in msg


def test_good_builders_and_layer_lists_pass():
    check_architecture(spec("tests.mpi.user_models:small_mlp", params={"units": 8}), X, 10, "classification")
    check_architecture(spec(layers=[{"type": "Dense", "units": 8, "activation": "relu"}]), X, 10, "classification")
    check_architecture(spec("tests.mpi.user_models:logits_mlp"), X, 1, "regression")   # linear head: fine


def test_output_shape_is_one_row_per_sample():
    with pytest.raises(ArchitectureError, match=r"returns shape \(32, 8, 10\) for a batch of 32 samples, "
                                                r"but a classification member must return \(32, 10\)"):
        check_architecture(spec("tests.mpi.user_models:per_step"), X, 10, "classification")


def test_a_failing_builder_is_reported_whole_with_where():
    with pytest.raises(ArchitectureError) as err:
        check_architecture(spec("tests.mpi.user_models:broken", params={"width": 3}), X, 10, "classification")
    msg = str(err.value)
    assert msg.startswith("`model` 'tests.mpi.user_models:broken' failed in broken((64,), 10, width=3): "
                          "TypeError: width 3 does not fit")
    assert msg.count("explains at length") == 12 and "(end)" in msg                 # not truncated
    assert "user_models.py:" in msg and "in broken)" in msg                          # where in the user's code


def config(**arch):
    return resolve_config({"architectures": [{"name": "mine", "members": 50, **arch}], "train": {"epochs": 500}})


def test_check_builds_turns_a_bad_builder_into_a_config_error_before_training():
    arrays, meta = {"x_train": X}, {"n_outputs": 10, "task": "classification"}
    with pytest.raises(ConfigError,
                       match=r"^`architectures\[0\]` \(mine\): `model` 'tests.mpi.user_models:logits_mlp'"):
        check_builds(config(model="tests.mpi.user_models:logits_mlp"), arrays, meta)
    check_builds(config(model="tests.mpi.user_models:small_mlp"), arrays, meta)
    rehearsal = config(model="tests.mpi.user_models:logits_mlp")
    rehearsal = rehearsal.replace(runtime=rehearsal.runtime.replace(trainer="rehearsal"))     # builds nothing
    check_builds(rehearsal, arrays, meta)


def test_a_failed_member_record_keeps_the_whole_message_and_the_innermost_frames():
    from ensemble.train.member import guarded

    def deep(n):
        if n == 0:
            raise ValueError("the real reason, " + "at length " * 40 + "(end)")
        return deep(n - 1)
    record = guarded(lambda: deep(20), {"id": "m-000", "seed": 1}, rank=3)
    assert record["status"] == Status.FAILED.value and record["error"]["message"].endswith("(end)")
    assert "the real reason" in record["error"]["traceback"]          # where it broke, not the outer frames
    assert 'raise ValueError("the real reason, "' in record["error"]["traceback"]


def test_a_builder_that_returns_nothing_says_so():
    """It said "its output shape is None"."""
    with pytest.raises(ArchitectureError, match=r"returned NoneType \(a function without a return\?\), not a Keras "
                                                r"model: return keras.Model\(inputs, outputs\)"):
        check_architecture(spec("tests.mpi.user_models:returns_nothing"), X, 10, "classification")
