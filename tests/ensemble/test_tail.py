"""The end of the run (``runtime.tail``): the master's plan of who helps whom, and the fast
simulator's use of the same rule. The messages and real crews are in tests/mpi/test_tail_mpi.py."""

from __future__ import annotations

import pytest

from ensemble.orchestrate import fastsim
from ensemble.orchestrate.simulate import MasterCost
from ensemble.runtime.tail import AUTO_HELPERS, AUTO_WORKERS, STRAGGLER, TailPlan, helpers_per_member, speedup


def plan_with(max_helpers: int, starts: dict[int, float]) -> TailPlan:
    plan = TailPlan(max_helpers)
    for worker, t in starts.items():
        plan.started(worker, f"m{worker}", t)
    return plan


def test_an_idle_worker_helps_the_longest_running_member_until_it_is_full():
    plan = plan_with(2, {0: 5.0, 1: 1.0, 2: 3.0})
    assert plan.assign(7, now=10.0) == (1, "m1")
    assert plan.assign(8, now=10.0) == (1, "m1")
    assert plan.assign(9, now=10.0) == (2, "m2")          # m1 has its 2 helpers: the next longest
    assert plan.helpers == {1: [7, 8], 2: [9]}
    assert plan.busy(7) and plan.busy(0) and not plan.busy(5)


def test_no_helper_joins_a_member_that_is_no_straggler_until_it_is_one():
    plan = plan_with(3, {0: 0.0})
    mean = 10.0
    assert plan.assign(4, now=STRAGGLER * mean - 1.0, mean_seconds=mean) is None
    assert plan.idle == {4}
    assert plan.assign_idle(now=STRAGGLER * mean + 1.0, mean_seconds=mean) == [(4, 0, "m0")]
    assert plan.idle == set()


def test_a_member_that_ends_frees_its_helpers_and_takes_none_after():
    plan = plan_with(3, {0: 0.0, 1: 2.0})
    plan.assign(5, now=9.0)
    plan.assign(6, now=9.0)
    assert plan.ended(0) == [5, 6]
    assert not plan.busy(5) and not plan.busy(0)
    assert plan.assign(5, now=9.0) == (1, "m1")             # the ended member is skipped


def test_a_member_that_declines_frees_its_helpers_and_is_never_sent_more():
    plan = plan_with(3, {0: 0.0, 1: 2.0})
    plan.assign(5, now=9.0)
    assert plan.decline(0, "m0") == [5]
    assert plan.declined == 1 and not plan.busy(5)
    assert plan.assign(5, now=9.0) == (1, "m1")
    assert plan.decline(0, "another member") == []          # a stale decline changes nothing


def test_a_worker_starting_its_next_member_is_no_longer_the_old_one():
    plan = plan_with(3, {0: 0.0})
    plan.ended(0)
    plan.started(0, "m9", 8.0)
    assert plan.assign(3, now=9.0) == (0, "m9")


def test_helpers_off_assign_nothing():
    plan = plan_with(0, {0: 0.0})
    assert plan.assign(1, now=100.0) is None


@pytest.mark.parametrize("setting, workers, group, expected", [
    ("auto", AUTO_WORKERS, 1, AUTO_HELPERS), ("auto", AUTO_WORKERS - 1, 1, 0), (3, 2, 1, 3), (0, 1000, 1, 0),
    ("auto", 10_000, 2, 0), (5, 100, 4, 0)])
def test_how_many_helpers_a_member_may_take(setting, workers, group, expected):
    assert helpers_per_member(setting, workers, group) == expected


def test_the_crew_speed_model():
    assert speedup(1, 0.9) == 1.0
    assert speedup(2, 0.9) == pytest.approx(1.8)
    assert speedup(8, 0.9) == pytest.approx(8 * 0.9 ** 3)


def test_the_fast_simulator_with_the_runtimes_rule_fills_the_tail_and_ends_every_member_once():
    durations, _ = fastsim.lognormal_durations(200 * 20, 60.0, 1.0, seed=3)
    cost = MasterCost(40e-6, 40e-6)
    none = fastsim.run(fastsim.Scenario(workers=200, cost=cost, tail="none"), durations)
    helped = fastsim.run(fastsim.Scenario(workers=200, cost=cost, tail="helpers"), durations)
    assert none["members"] == helped["members"] == len(durations)
    assert helped["utilisation"] > none["utilisation"] + 0.03
    assert helped["simulated_seconds"] < none["simulated_seconds"]


def test_the_session_engine_runs_the_real_master_with_helpers_and_counts_every_member_once(tmp_path):
    """The real master session on simulated workers: ``SimExecutor`` plans helpers as the MPI
    executor does; helped members end sooner, are recorded once, and say so."""
    from ensemble.orchestrate.simulate import simulate
    from ensemble.results.journal import read_journal
    from ensemble.results.rundir import RunDirectory
    from tests.ensemble.test_control_plane import sim_data
    from tests.ensemble.test_simulate_fast import COST, spread_config
    data, meta = sim_data()
    runs = {}
    for helpers in (0, 3):
        cfg = spread_config(48, 30.0, 1.0, tail_helpers=helpers)
        run_dir = tmp_path / str(helpers)
        runs[helpers] = simulate(cfg, meta, data, RunDirectory(run_dir), 6, latency=0.0005, cost=COST)
        records = read_journal(run_dir / "journal.jsonl")
        assert sorted(r["id"] for r in records) == sorted({r["id"] for r in records}) and len(records) == 48
        helped = [r for r in records if r.get("helpers")]
        assert bool(helped) == bool(helpers)
        assert all(1 <= r["helpers"] <= 3 and r["helper_seconds"] > 0 for r in helped)
    assert runs[3]["simulated_seconds"] < runs[0]["simulated_seconds"]
    assert runs[3]["utilisation"] > runs[0]["utilisation"] + 0.03
