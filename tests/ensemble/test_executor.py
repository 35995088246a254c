"""The executor seam without MPI: the dispatch loop over a serial executor, in-training
reports answered by the master's decision, and a contract every executor keeps."""

from __future__ import annotations

import pytest

from ensemble.orchestrate.dispatch import dispatch
from ensemble.runtime.executor import CONTINUE, STOP, SerialExecutor, check_decision
from ensemble.sources import GoOn, SpecList


def fake_trainer(epochs: int = 4):
    """A trainer that 'trains' for ``epochs`` epochs, reporting each, and obeys decisions."""
    def train(spec, report):
        seen, lr = [], spec.get("learning_rate", 1.0)
        for epoch in range(1, epochs + 1):
            decision = report({"epoch": epoch, "logs": {"val_loss": 1.0 / epoch}})
            seen.append(decision["action"])
            if decision["action"] == "stop":
                break
            if decision["action"] == "update":
                lr = decision["settings"]["learning_rate"]
        return {"id": spec["id"], "status": "ok", "epochs": epoch, "decisions": seen, "lr": lr}
    return train


def test_serial_dispatch_trains_every_spec_in_order():
    specs = [{"id": f"m{i}"} for i in range(4)]
    results = []
    dispatch(SerialExecutor(lambda: fake_trainer(2)), SpecList(specs, {"m1"}), results.extend)
    assert [r.id for r in results] == ["m0", "m2", "m3"]
    assert all(r.extra["decisions"] == ["continue", "continue"] for r in results)


def test_master_decisions_stop_and_update_a_member_while_it_trains():
    asked = []

    def decide(spec, payload):
        asked.append((spec["id"], payload["epoch"]))
        if spec["id"] == "stop-me" and payload["epoch"] == 2:
            return STOP
        if spec["id"] == "tune-me" and payload["epoch"] == 1:
            return {"action": "update", "settings": {"learning_rate": 0.5}}
        return CONTINUE

    results = []
    specs = [{"id": "stop-me"}, {"id": "tune-me"}]
    decider = GoOn()
    decider.decide = decide
    dispatch(SerialExecutor(lambda: fake_trainer(4)), SpecList(specs), results.extend, decider=decider)
    by_id = {r.id: r for r in results}
    assert by_id["stop-me"].epochs == 2 and by_id["stop-me"].extra["decisions"] == ["continue", "stop"]
    assert by_id["tune-me"].epochs == 4 and by_id["tune-me"].extra["lr"] == 0.5
    assert asked[:2] == [("stop-me", 1), ("stop-me", 2)]


def test_should_stop_and_adjust_are_applied_before_hand_out():
    results = []
    specs = [{"id": f"m{i}", "limit": 10} for i in range(5)]
    dispatch(SerialExecutor(lambda: fake_trainer(1)), SpecList(specs), results.extend,
             should_stop=lambda: len(results) >= 2, adjust=lambda s: {**s, "id": s["id"] + "*"})
    assert [r.id for r in results] == ["m0*", "m1*"]


def test_trainer_is_made_only_when_there_is_work():
    made = []
    dispatch(SerialExecutor(lambda: made.append(1) or fake_trainer(1)), SpecList([]), lambda r: None)
    assert made == []


@pytest.mark.parametrize("bad", [None, {"action": "pause"}, {"action": "update"}])
def test_a_malformed_decision_is_refused(bad):
    with pytest.raises(ValueError, match="decision"):
        check_decision(bad)


def test_the_serial_path_needs_no_mpi():
    import subprocess
    import sys
    code = ("import sys, ensemble.orchestrate.dispatch, ensemble.runtime.executor, ensemble.sources;"
            " print('mpi4py' in sys.modules, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_gather_waits_for_a_result_then_takes_what_is_in_up_to_a_batch():
    """The wait every polling executor shares: idle while nothing comes, a message without
    a result (a report, a room update) does not end the wait, then one batch of what is in."""
    from ensemble.runtime.executor import gather
    replies = iter([None, None, [], None, [{"id": "a"}], [{"id": "b"}, {"id": "c"}], [{"id": "d"}], [{"id": "e"}]])
    idles = []
    results, waited = gather(lambda: next(replies), batch=3, cap=1e-3, idle=lambda: idles.append(1))
    assert [r["id"] for r in results] == ["a", "b", "c"]           # stops at the batch; "d" waits
    assert len(idles) == 3 and waited > 0
    assert next(replies) == [{"id": "d"}]
    replies = iter([[{"id": "x"}], None, [{"id": "late"}]])
    results, waited = gather(lambda: next(replies), batch=10, cap=1e-3)
    assert [r["id"] for r in results] == ["x"] and waited == 0.0    # nothing more in: no second wait
