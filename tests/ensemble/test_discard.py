"""Early discarding on synthetic learning curves: a candidate clearly worse at a rung is
stopped, one in the top fraction never is; discarded candidates are neither ranked nor
selected, and the rungs survive a resume."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.results.records import MemberRecord, Status
from ensemble.results.summary import finished_records, leaderboard
from ensemble.runtime.executor import CONTINUE, STOP
from ensemble.sources.discard import EarlyDiscard


def curve(final: float, epoch: int, speed: float = 0.3) -> float:
    """An accuracy learning curve rising to ``final``."""
    return final * (1 - np.exp(-speed * epoch))


def spec(i: int, epochs: int = 20) -> dict:
    return {"id": f"e{i:04d}", "epochs": epochs}


def report(epoch: int, value: float, key: str = "val_accuracy") -> dict:
    return {"epoch": epoch, "logs": {"loss": 1.0, key: value}}


def test_asha_rungs_are_geometric_and_spec_reports_at_the_first():
    d = EarlyDiscard("asha", 2, 3, 3, "accuracy")
    assert d.rungs(20) == [2, 6, 18] and d.rungs(2) == []
    assert d.stamp(spec(1))["report_every"] == 2
    assert "report_every" not in d.stamp(spec(1, epochs=2))          # nothing to judge: no reports


def test_asha_stops_the_clearly_worse_and_never_the_top_fraction():
    rng = np.random.default_rng(0)
    d = EarlyDiscard("asha", 2, 3, 3, "accuracy")
    finals = rng.uniform(0.3, 0.99, 60)
    decisions = {}
    for i, final in enumerate(finals):             # asynchronous: each candidate reaches rung 2 in turn
        s = spec(i)
        for epoch in d.rungs(20):
            decision = d.decide(s, report(epoch, curve(final, epoch)))
            decisions[i] = (epoch, decision)
            if decision == STOP:
                break
            # the top fraction of all that reached this rung (itself included) never stops
    for epoch in (2, 6, 18):
        values = sorted(d.seen[epoch], reverse=True)
        assert len(values) >= 1
    stopped = [i for i, (_, dec) in decisions.items() if dec == STOP]
    assert stopped, "some of 60 candidates must be stopped at a rung"
    # the best third overall at rung 2 was never stopped there
    best = np.argsort(-finals)[: len(finals) // 10]
    assert not set(best) & {i for i in stopped if decisions[i][0] == 2}
    # a candidate far below everyone is stopped at the first rung once the grace is over
    assert d.decide(spec(999), report(2, 0.01)) == STOP
    assert d.stopped["e0999"]["epoch"] == 2 and d.stopped["e0999"]["rule"] == "asha"


def test_every_candidate_in_the_top_fraction_goes_on():
    d = EarlyDiscard("asha", 1, 4, 1, "accuracy")
    values = [0.1, 0.9, 0.2, 0.8, 0.3, 0.95, 0.4, 0.5]
    for i, v in enumerate(values):
        decision = d.decide(spec(i, 10), report(1, v))
        known = sorted(values[: i + 1], reverse=True)
        top = known[: int(np.ceil(len(known) / 4))]
        assert (decision == CONTINUE) == (v >= top[-1]), (i, v, known)


def test_nobody_is_stopped_during_the_grace_and_lower_is_better_for_losses():
    d = EarlyDiscard("asha", 2, 2, 4, "mse")
    assert all(d.decide(spec(i), report(2, 10.0 * (i + 1), "val_loss")) == CONTINUE for i in range(3))
    assert d.decide(spec(3), report(2, 100.0, "val_loss")) == STOP        # the worst mse of four
    assert d.decide(spec(4), report(2, 1.0, "val_loss")) == CONTINUE      # the best
    assert d.decide(spec(5), report(3, 1e9, "val_loss")) == CONTINUE      # epoch 3 is no rung


def test_median_rule_compares_with_the_others_at_the_same_epoch():
    d = EarlyDiscard("median", 1, 3, 3, "accuracy")
    assert d.rungs(4) == [1, 2, 3]
    for i, v in enumerate((0.5, 0.6, 0.7)):
        d.decide(spec(i), report(1, v))
    assert d.decide(spec(10), report(1, 0.55)) == STOP                     # median of the others: 0.6
    assert d.decide(spec(11), report(1, 0.65)) == CONTINUE


def test_nan_is_worst_and_mark_says_where_it_stopped():
    d = EarlyDiscard("asha", 2, 2, 2, "accuracy")
    d.decide(spec(0), report(2, 0.9))
    assert d.decide(spec(1), report(2, float("nan"))) == STOP
    result = d.mark(MemberRecord.from_json({"id": "e0001", "status": "ok"}))
    assert result.status is Status.DISCARDED
    assert result.discarded["epoch"] == 2 and result.extra["rungs"] == {"2": -np.inf}
    assert result.to_json()["status"] == "discarded"
    kept = d.mark(MemberRecord.from_json({"id": "e0000", "status": "ok"}))
    assert kept.status is Status.OK and kept.discarded is None and kept.extra["rungs"] == {"2": 0.9}


def test_resume_restores_the_rungs():
    records = [{"id": "e0000", "status": "ok", "rungs": {"2": 0.9}},
               {"id": "e0001", "status": "ok", "rungs": {"2": 0.8, "4": 0.85}}]
    d = EarlyDiscard("asha", 2, 2, 2, "accuracy")
    d.replay(MemberRecord.from_json(r) for r in records)
    assert d.seen == {2: [0.8, 0.9], 4: [0.85]}
    assert d.decide(spec(5), report(2, 0.1)) == STOP                      # judged against the journal's


def test_discarded_candidates_are_never_ranked_nor_selected():
    records = [
        {"id": "e0001", "status": "ok", "val": {"accuracy": 0.9}, "test": {"accuracy": 0.88}, "epochs": 20},
        {"id": "e0002", "status": "ok", "val": {"accuracy": 0.95}, "test": {"accuracy": 0.9}, "epochs": 2,
         "discarded": {"epoch": 2, "rule": "asha"}},
        {"id": "e0003", "status": "failed", "error": {"message": "boom"}},
    ]
    records = [MemberRecord.from_json(r) for r in records]
    assert [r.id for r in finished_records(records)] == ["e0001"]
    board = leaderboard(records, "accuracy")
    assert list(board["status"]) == ["ok", "discarded", "failed"]
    assert board.loc[1, "discarded_at_epoch"] == 2 and np.isnan(board.loc[1, "rank"])


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="unknown discard rule"):
        EarlyDiscard("hyperband", 1, 3, 3, "accuracy")


def test_leaderboard_csv_keeps_whole_numbers_whole_beside_failed_rows():
    """A failed member's empty cells made pandas write params 2410.0 and seed 1501029259.0."""
    from ensemble.results.summary import leaderboard_csv
    records = [MemberRecord("a", Status.OK, val={"accuracy": 0.9}, params=2410, epochs=3, seed=1501029259, rank=1),
               MemberRecord("b", Status.FAILED, error={"kind": "nan_loss", "message": "NaN"})]
    text = leaderboard_csv(leaderboard(records, "accuracy"))
    assert text.splitlines()[1].startswith("1,a,,ok,0.9,2410,3,") and "1501029259," in text and ".0," not in text
