"""A master hierarchy's shape and layout, without MPI: who is what at -n P, the one shape
function the simulator and the runtime share ("auto" is flat at this machine's scales), and
the config errors of a fixed number of sub-masters. tests/mpi/test_hierarchy_mpi.py runs it."""

from __future__ import annotations

import json

import pytest

from ensemble.config import ConfigError, Problems, resolve_config
from ensemble.orchestrate.fastsim import MIN_SHARE, hierarchy_shape, sub_masters_for
from ensemble.orchestrate.prepare import check_world
from ensemble.orchestrate.simulate import master_cost
from ensemble.orchestrate.submasters import check_hierarchy, choose, measured_seconds
from ensemble.runtime.hierarchy import Layout, node_groups, share_leaders

ARCHS = [{"name": "a", "members": 4, "layers": [{"type": "Dense", "units": 4}]}]


def cfg_with(**runtime):
    return resolve_config({"architectures": ARCHS, "runtime": runtime})


def test_the_layout_at_n9_with_two_sub_masters():
    layout = Layout(9, 2, 1)
    assert [layout.role(r) for r in range(9)] == [("top", 0), ("sub", 0), ("sub", 1)] + [("worker", 0)] * 3 + [
        ("worker", 1)] * 3
    assert layout.shares() == [3, 3] and layout.sub_ranks == [1, 2]
    assert share_leaders(layout, 1) == [1, 2, 3] and layout.problem() is None


def test_groups_are_dealt_in_contiguous_shares_and_a_share_never_splits_a_group():
    layout = Layout(1 + 3 + 14, 3, 2)            # 14 worker ranks: 7 groups of 2
    assert layout.shares() == [2, 2, 3]
    roles = [layout.role(r) for r in range(4, 18)]
    assert roles == [("worker", k) for k, n in enumerate(layout.shares()) for _ in range(2 * n)]
    assert share_leaders(layout, 2) == [1, 3, 5]


@pytest.mark.parametrize("size, subs, group, words", [(9, 5, 1, "need a member group each"),
                                                      (10, 2, 2, "must divide"), (3, 2, 1, "leave 0 worker")])
def test_a_shape_the_job_cannot_take_says_why(size, subs, group, words):
    assert words in Layout(size, subs, group).problem()


def test_the_shape_is_one_function_for_the_simulator_and_the_runtime(capsys):
    from ensemble import simulate
    cost = master_cost("ensemble")
    for workers, seconds in ((127_488, 10.0), (27_648, 60.0), (18_688, 0.5)):
        code = simulate.main(["configs/digits.toml", "--engine", "fast", "--workers", str(workers),
                              "--per-worker", "0.01", "--seconds", str(seconds), "--spread", "0",
                              "--master-cost", "model", "--sub-masters", "auto", "--json"])
        assert code == 0
        row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        want = hierarchy_shape(workers, seconds, cost)
        assert row["sub_masters"] == max(want, 1)                 # the simulator writes 1 for one master
        assert choose(cfg_with(sub_masters="auto"), 1 + workers + want, seconds) == want
    assert hierarchy_shape(127_488, 10.0, cost) == sub_masters_for(127_488, 10.0, cost) > 2   # Aurora, 10 s


@pytest.mark.parametrize("seconds", [None, 1e-4, 0.01, 1.0, 600.0])
def test_auto_is_flat_at_the_scales_this_machine_runs(seconds):
    for size in (3, 9, 17, 33, 65, 2 * MIN_SHARE):
        assert choose(cfg_with(sub_masters="auto"), size, seconds) == 0
    assert choose(cfg_with(), 10_000, 1e-3) >= 2                  # the default, "auto", fits a large job


def test_auto_fits_the_shape_to_the_groups():
    cfg = cfg_with(sub_masters="auto", group_size=4)
    subs = choose(cfg, 1 + 4 * 1000, 0.01)                       # 1000 groups of 4 ranks, short members
    assert subs >= 2 and Layout(1 + 4 * 1000, subs, 4).problem() is None


def test_auto_reads_the_member_time_measured_so_far(tmp_path):
    from ensemble.results.rundir import RunDirectory
    run_dir = RunDirectory(tmp_path)
    lines = [{"id": "a-0", "status": "ok", "train_seconds": 2.0}, {"id": "a-1", "status": "ok", "train_seconds": 4.0},
             {"id": "a-2", "status": "failed", "train_seconds": 100.0}, {"event": "open"}]
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert measured_seconds(cfg_with(), run_dir, resume=True) == 3.0
    assert measured_seconds(cfg_with(), run_dir, resume=False) is None          # a fresh Keras run: not yet
    rehearsal = cfg_with(trainer="rehearsal")
    assert measured_seconds(rehearsal, run_dir, resume=False) == rehearsal.rehearsal.seconds   # its own median


def test_sub_masters_are_taken_from_the_workers_and_a_bad_shape_is_a_config_error():
    found = Problems()
    assert check_hierarchy(cfg_with(sub_masters=2), 8, found) == 2 and not found.messages
    with pytest.raises(ConfigError, match="runtime.sub_masters.*need a member group each"):
        check_world(cfg_with(sub_masters=5), 8)
    check_world(cfg_with(sub_masters="auto"), 2)                 # auto fits itself: no error


def test_a_config_that_decides_while_members_train_cannot_have_sub_masters():
    cfg = resolve_config({"mode": "evolve", "evolve": {"strategy": "regularized", "evaluations": 8,
                                                       "discard": "median"}, "runtime": {"sub_masters": 2}})
    with pytest.raises(ConfigError, match="`runtime.sub_masters = 2` cannot be used: `evolve.discard"):
        check_world(cfg, 8)
    with pytest.raises(ConfigError, match="members_per_rank"):
        check_world(cfg_with(sub_masters=2, members_per_rank=4), 8)
    assert choose(cfg.replace(runtime=cfg.runtime.replace(sub_masters="auto")), 100_000, 1e-3) == 0
    pbt = resolve_config({"mode": "pbt", "architectures": ARCHS, "runtime": {"sub_masters": 2},
                          "pbt": {"rounds": 3, "round_epochs": 1, "ranges": {"learning_rate": [1e-4, 1e-1]}}})
    found = Problems()
    assert check_hierarchy(pbt, 8, found) == 0
    assert found.messages == ['`runtime.sub_masters = 2` cannot be used: mode "pbt" needs its master while members '
                              'train; set `runtime.sub_masters = 0`']


def test_a_group_size_with_no_workers_or_workers_it_does_not_divide_names_the_ranks_to_start():
    """-n 1 with group_size 2 said "must divide the 0 worker ranks ... but got 2" (2 divides 0)."""
    with pytest.raises(ConfigError, match=r"group_size` = 2: the job has no worker ranks .* start it with -n 3"):
        check_world(cfg_with(group_size=2), 0)
    with pytest.raises(ConfigError, match=r"must divide the 3 worker ranks .* but got 2; e.g. -n 3"):
        check_world(cfg_with(group_size=2), 3)
    check_world(cfg_with(group_size=2), 4)


@pytest.mark.parametrize("nodes, group, groups", [
    ([0] * 9, 4, [[1, 2, 3, 4], [5, 6, 7, 8]]),                              # one node: contiguous, as before
    ([0] * 8 + [1] * 8 + [2], 8, [[1, 2, 3, 4, 5, 6, 7, 16], [8, 9, 10, 11, 12, 13, 14, 15]]),
    ([0] * 4 + [1] * 4 + [2] * 4 + [3], 4, [[1, 2, 3, 12], [4, 5, 6, 7], [8, 9, 10, 11]]),
    ([0, 0, 1, 1, 0, 1, 1], 2, [[1, 4], [2, 3], [5, 6]]),                    # ranks dealt round-robin
])
def test_member_groups_stay_inside_a_node_where_they_fit(nodes, group, groups):
    """3 nodes of 8 GPUs, groups of 8, block placement (17 ranks): ranks 1-8 and 9-16 made both
    groups span two nodes, every gradient allreduce crossing the network."""
    got = node_groups(nodes, group)
    assert got == groups
    assert sorted(r for g in got for r in g) == list(range(1, len(nodes)))
    with pytest.raises(ValueError, match="must divide the 6 worker ranks"):
        node_groups([0] * 7, 4)
