"""Where a member's time goes: the phases in its record (build, first epoch with tracing,
later epochs, validation inside them, prediction, writing) and their run-wide summary."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.results.records import REUSED_TRACE, Status
from ensemble.results.rundir import RunDirectory
from ensemble.results.timeline import format_stats, member_costs

META = {"task": "classification", "input_shape": [5], "n_outputs": 2}


def tiny_member(**changes) -> tuple[dict, dict]:
    """A small classification member's spec and data (120 training rows), TensorFlow ready."""
    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    data = {"x_train": x[:120], "y_train": y[:120], "x_val": x[120:160], "y_val": y[120:160],
            "x_test": x[160:], "y_test": y[160:]}
    spec = {"id": "m0", "arch": "a", "layers": [{"type": "Dense", "units": 4}], "model": None, "params": {},
            "seed": 1, "epochs": 4, "batch_size": 32, "optimizer": "adam", "learning_rate": 0.01, "patience": 9,
            "member_time_limit": 60.0, "bootstrap": False, "loss": "auto", **changes}
    return spec, data


@pytest.mark.slow                  # TensorFlow training: make test, not make test-fast
def test_a_member_record_says_where_its_time_went(tmp_path):
    from ensemble.train.member import run_member
    spec, data = tiny_member()
    record = run_member(spec, data, META, RunDirectory(tmp_path), 0)
    costs = record["costs"]
    assert set(costs) == {"build", "first_epoch", "epochs", "validation", "predict", "write", "other"}
    assert all(v >= 0 for v in costs.values())
    assert costs["first_epoch"] > 0 and costs["epochs"] > 0       # 3 epochs: the first, and the others
    parts = sum(v for k, v in costs.items() if k != "validation")
    assert parts == pytest.approx(record["train_seconds"], abs=0.02)
    assert costs["write"] > 0 and record["model"]


def test_the_run_summary_averages_the_phases_and_skips_records_without_them():
    records = [{"status": Status.OK.value, "costs": {"build": 1.0, "first_epoch": 2.0, "epochs": 6.0, "validation": 1.0,
                                          "predict": 0.5, "write": 0.5, "other": 0.0}},
               {"status": Status.OK.value, "costs": {"build": 1.0, "first_epoch": 2.0, "epochs": 2.0, "validation": 0.5,
                                          "predict": 0.5, "write": 0.5, "other": 0.0}, REUSED_TRACE: True},
               {"status": Status.OK.value},                      # an older journal, or the rehearsal trainer
               {"status": Status.FAILED.value, "costs": {"build": 50.0}}]
    costs = member_costs(records)
    assert costs["members"] == 2 and costs["reused_trace"] == 1
    assert costs["epochs"]["mean"] == 4.0 and costs["epochs"]["share"] == pytest.approx(8 / 16)
    assert costs["validation"]["mean"] == 0.75
    assert member_costs([{"status": Status.OK.value}]) == {}
    line = format_stats({"members": 4, "workers": 2, "utilisation": 0.9, "startup_seconds": 1.0,
                         "members_per_second": 1.0, "member_costs": costs})
    assert "member time, mean of 2: build 1.00 s (12%), first epoch 2.00 s (25%), epochs 4.00 s (50%)" in line
    assert "validation inside the epochs 0.75 s" in line
    assert "; 1 trained on a kept model (no tracing)" in line
    pbt = member_costs([{"status": Status.OK.value, "costs": {"predict": 0.01, "write": 0.02}}] * 3)
    line = format_stats({"members": 3, "workers": 3, "utilisation": 0.9, "startup_seconds": 1.0,
                         "members_per_second": 1.0, "member_costs": pbt})
    assert "member time" not in line          # PBT's records: the last predict and write, not their training
    assert "run: 3 members on 3 workers," in line
    grouped = format_stats({"members": 5, "workers": 1, "group_size": 2, "utilisation": 0.9, "startup_seconds": 1.0,
                            "members_per_second": 1.0})
    assert "run: 5 members on 1 member group of 2 ranks," in grouped            # it said "on 1 workers"


class Ticks:
    """A clock that moves one second each time it is read: the time limit is crossed after a
    known number of batch and epoch ends, whatever the machine's speed."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.mark.slow                 # make test, not test-fast (its minute)
@pytest.mark.parametrize("limit, kept", [(7.5, True), (1.5, False)], ids=["after 2 epochs", "in the first"])
def test_a_member_stopped_by_its_time_limit_keeps_its_best_weights(tmp_path, monkeypatch, limit, kept):
    """120 training rows in batches of 60: 2 batch ends and an epoch end read the clock per
    epoch, so a limit of 7.5 s stops training in the third epoch (two epochs complete), 1.5 s
    in the first: the first member is kept (ranked, its best weights, ``time_limit``), the
    second fails with kind time_limit (the work it did is too little to keep)."""
    from ensemble.results.records import MemberRecord
    from ensemble.train import member as M
    monkeypatch.setattr(M, "_clock", Ticks())
    spec, data = tiny_member(epochs=20, batch_size=60, patience=20, member_time_limit=limit)
    record = MemberRecord.from_json(M.guarded(lambda: M.run_member(spec, data, META, RunDirectory(tmp_path), 0),
                                              spec, 0))
    if kept:
        assert record.status is Status.OK and record.extra["stopped"] == "time_limit"
        assert record.epochs == 3 and "accuracy" in record.val and record.has_model
    else:
        assert record.status is Status.LIMIT and record.error_kind == "time_limit"
        assert "before its first epoch ended" in record.error["message"]


@pytest.mark.slow                 # make test, not test-fast (its minute)
def test_time_limit_fails_keeps_the_old_behaviour(tmp_path, monkeypatch):
    """`train.time_limit_fails = true`: the member stopped in its third epoch fails (kind
    time_limit, status limit) instead of being kept."""
    from ensemble.results.records import MemberRecord
    from ensemble.train import member as M
    monkeypatch.setattr(M, "_clock", Ticks())
    spec, data = tiny_member(epochs=20, batch_size=60, patience=20, member_time_limit=7.5, time_limit_fails=True)
    record = MemberRecord.from_json(M.guarded(lambda: M.run_member(spec, data, META, RunDirectory(tmp_path), 0),
                                              spec, 0))
    assert record.status is Status.LIMIT and record.error_kind == "time_limit"
    assert "after 2 of 20 epochs" in record.error["message"] and "time_limit_fails" in record.error["message"]
