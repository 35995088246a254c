"""Cost-aware ordering (``runtime.order = "cost"``): every member goes out exactly once,
longest predicted first; the budget's quantile stop rule."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ensemble.config import resolve_config
from ensemble.results.records import MemberRecord, Status
from ensemble.runtime.budget import DurationQuantile, RunBudget
from ensemble.sources.members import CostOrdered, SpecList, member_count, member_specs, prior_cost


def cfg3(members=(5, 3, 4)):
    archs = [{"name": "small", "members": members[0], "layers": [{"type": "Dense", "units": 4}]},
             {"name": "big", "members": members[1], "layers": [{"type": "Dense", "units": 256}]},
             {"name": "mid", "members": members[2], "layers": [{"type": "Dense", "units": 32}]}]
    return resolve_config({"architectures": archs, "runtime": {"trainer": "rehearsal"}})


def drain(source, seconds=None):
    out = []
    while (spec := source.next_spec()) is not None:
        out.append(spec)
        if seconds is not None:
            source.tell(MemberRecord(id=spec["id"], status=Status.OK, arch=spec["arch"],
                                     train_seconds=seconds[spec["arch"]]))
    return out


def test_cost_order_hands_out_every_member_once_with_the_same_specs_as_the_list():
    cfg = cfg3()
    got = drain(CostOrdered(cfg))
    listed = list(member_specs(cfg))
    assert len(got) == member_count(cfg) == 12
    assert Counter(s["id"] for s in got).most_common(1)[0][1] == 1
    assert sorted(got, key=lambda s: s["id"]) == sorted(listed, key=lambda s: s["id"])     # same seeds, same specs


def test_before_any_result_the_prior_orders_the_architectures_longest_first():
    got = [s["arch"] for s in drain(CostOrdered(cfg3()))]
    assert got == ["big"] * 3 + ["mid"] * 4 + ["small"] * 5
    assert prior_cost({"epochs": 10, "layers": [{"units": 8}, {"filters": 4, "kernel_size": 3}]}) == 10 * (1 + 8 + 36)


def test_measured_seconds_overrule_the_prior():
    """``small`` turns out the slowest (a prior is a guess): once measured, it goes first;
    an unmeasured architecture is predicted from the prior, scaled by the measured ones."""
    cfg = cfg3(members=(6, 2, 6))
    src = CostOrdered(cfg)
    first = src.next_spec()
    assert first["arch"] == "big"
    src.tell(MemberRecord(id=first["id"], status=Status.OK, arch="big", train_seconds=10.0))
    # mid: prior 33/257 of big's -> 1.3 s predicted; small not measured either: 5/257 -> 0.2 s
    assert src.predicted("mid") == pytest.approx(10.0 * prior_cost(src.heads["mid"]) / prior_cost(src.heads["big"]))
    src.tell(MemberRecord(id="small-000", status=Status.OK, arch="small", train_seconds=50.0))
    # small: 50 s measured; mid, unmeasured: its prior times the measured ones' mean rate (165 s)
    assert src.predicted("mid") == pytest.approx(prior_cost(src.heads["mid"]) * (
        10.0 / prior_cost(src.heads["big"]) + 50.0 / prior_cost(src.heads["small"])) / 2)
    rest = [s["arch"] for s in drain(src)]
    assert rest == ["mid"] * 6 + ["small"] * 6 + ["big"]


def test_finished_members_are_skipped_and_failures_teach_nothing():
    cfg = cfg3()
    done = {"big-000", "mid-002", "small-004"}
    src = CostOrdered(cfg, done)
    src.tell(MemberRecord(id="x", status=Status.FAILED, arch="small", train_seconds=1e6))
    assert src.seconds == {}
    got = {s["id"] for s in drain(src)}
    assert got == {s["id"] for s in member_specs(cfg)} - done
    assert got == {s["id"] for s in drain(SpecList(member_specs(cfg, done), done))}


def test_one_architecture_goes_out_in_list_order():
    cfg = resolve_config({"architectures": [{"name": "m", "members": 7, "layers": [{"type": "Dense", "units": 4}]}]})
    assert [s["id"] for s in drain(CostOrdered(cfg), {"m": 1.0})] == [s["id"] for s in member_specs(cfg)]


def test_ensemble_mode_uses_the_setting():
    from ensemble.modes import RunContext, mode_of
    for order, kind in (("cost", CostOrdered), ("list", SpecList)):
        cfg = resolve_config({"architectures": [{"name": "m", "members": 2, "layers": [{"type": "Dense", "units": 4}]}],
                              "runtime": {"order": order}})
        source, _ = mode_of(cfg).make(RunContext(cfg, {}, None, [], frozenset(), 2, "accuracy"))
        assert type(source) is kind


def test_a_resume_tries_untried_members_before_those_that_failed():
    """A run stopped by max_failed_share handed its failures out first on --resume: they failed again,
    the rule tripped again at once, and no new member was ever tried."""
    from ensemble.modes import RunContext, mode_of
    history = [MemberRecord.from_json({"id": "m-000", "status": "ok"}),
               MemberRecord.from_json({"id": "m-001", "status": "failed", "error": {"kind": "x"}}),
               MemberRecord.from_json({"id": "m-002", "status": "failed", "error": {"kind": "x"}})]
    for order in ("cost", "list"):
        archs = [{"name": "m", "members": 5, "layers": [{"type": "Dense", "units": 4}]},
                 {"name": "w", "members": 1, "layers": [{"type": "Dense", "units": 64}]}]
        cfg = resolve_config({"architectures": archs, "runtime": {"order": order}})
        source, _ = mode_of(cfg).make(RunContext(cfg, {}, None, history, frozenset(), 2, "accuracy"))
        got = [source.next_spec()["id"] for _ in range(5)]
        assert sorted(got[:3]) == ["m-003", "m-004", "w-000"] and got[3:] == ["m-001", "m-002"], (order, got)
        assert source.next_spec() is None and source.dry()


# -- the budget's stop rule -------------------------------------------------------------------
def test_duration_quantile_is_within_its_bin_of_the_exact_one_and_none_is_the_slowest():
    rng = np.random.default_rng(1)
    x = 60 * np.exp(0.5 * rng.standard_normal(5000))
    for q in (0.5, 0.9, 0.99):
        est = DurationQuantile(q)
        for v in x:
            est.observe(float(v))
        assert est.value() == pytest.approx(np.quantile(x, q), rel=0.03)
    slowest = DurationQuantile(None)
    for v in x:
        slowest.observe(float(v))
    assert slowest.value() == x.max()
    with pytest.raises(ValueError):
        DurationQuantile(1.5)


def test_the_stop_rule_uses_the_quantile():
    t = [0.0]
    cautious = RunBudget(1000.0, 0.0, 0.5, clock=lambda: t[0])
    quantile = RunBudget(1000.0, 0.0, 0.5, clock=lambda: t[0], stop_quantile=0.5)
    for b in (cautious, quantile):
        for s in [10.0] * 99 + [500.0]:
            b.observe(True, s)
    t[0] = 600.0
    assert cautious.should_stop() and "time limit" in cautious.reason
    assert not quantile.should_stop()
    t[0] = 995.0
    assert quantile.should_stop()


def test_near_equal_architectures_do_not_alternate():
    """Measured means within 20% of each other: the architecture being handed out stays (a
    packing worker packs one architecture), then the other follows."""
    cfg = cfg3(members=(4, 4, 1))
    cfg = cfg.replace(architectures=cfg.architectures[:2])
    got = [s["arch"] for s in drain(CostOrdered(cfg), {"small": 10.0, "big": 9.0})]
    assert got == ["big"] * 4 + ["small"] * 4
