"""The simulator's reproducible mode (the master's cost from a cost model) and the fast
engine (``orchestrate.fastsim``), checked against the session engine that runs the real
master code."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ensemble.orchestrate import fastsim
from ensemble.orchestrate.simulate import MasterCost, master_cost, simulate
from ensemble.results.rundir import RunDirectory
from ensemble.sources.members import member_specs
from ensemble.train.rehearsal import member_seconds
from tests.ensemble.test_control_plane import sim_config, sim_data

COST = MasterCost(200e-6, 50e-6)


def spread_config(members: int, seconds: float, spread: float, **runtime):
    cfg = sim_config(members, **runtime)
    return cfg.replace(rehearsal=cfg.rehearsal.replace(seconds=seconds, spread=spread))


@pytest.mark.slow
def test_the_cost_model_gives_the_same_figure_twice_and_charges_the_master_exactly(tmp_path):
    data, meta = sim_data()
    cfg = spread_config(40, 30.0, 0.5)
    a = simulate(cfg, meta, data, RunDirectory(tmp_path / "a"), 4, latency=0.01, cost=COST)
    b = simulate(cfg, meta, data, RunDirectory(tmp_path / "b"), 4, latency=0.01, cost=COST)
    assert a["utilisation"] == b["utilisation"] and a["simulated_seconds"] == b["simulated_seconds"]
    assert a["cost_model"] == {"result_us": 200.0, "dispatch_us": 50.0}
    # the master's real code was measured all the same (for calibration), and is not on the clock
    assert a["master_code_us_per_result"] > 0 and a["master_code_us_per_dispatch"] > 0
    equal = simulate(sim_config(12), meta, data, RunDirectory(tmp_path / "c"), 3, latency=0.01,
                     cost=MasterCost(0.1, 0.05))
    # 4 rounds of 10 s, each a round trip, and the master's 0.1 s per result and 0.05 s per spec:
    # the first fill (3 specs, 0.15 s), then per round one result taken and one spec sent
    assert equal["simulated_seconds"] == pytest.approx(0.15 + 4 * (10 + 0.02) + 3 * 0.15 + 0.1 * 2, abs=0.3)


@pytest.mark.parametrize("seconds,spread,workers", [(60.0, 0.5, 8), (60.0, 0.0, 5), (20.0, 1.0, 6)])
def test_the_fast_engine_agrees_with_the_real_master_code(tmp_path, seconds, spread, workers):
    """Same durations (the rehearsal's, by seed), same cost model: the same utilisation and
    simulated time, with members held one at a time (the fast engine models ``auto`` by its
    steady state; ``Slots`` starts from the first result's seconds)."""
    data, meta = sim_data()
    cfg = spread_config(60, seconds, spread, specs_in_hand=1)
    session = simulate(cfg, meta, data, RunDirectory(tmp_path), workers, latency=0.0005,
                       message_seconds=10e-6, cost=COST)
    durations = np.array([member_seconds(s, cfg.rehearsal) for s in member_specs(cfg)])
    fast = fastsim.run(fastsim.Scenario(workers, COST, in_hand=1), durations)
    assert fast["members"] == session["members"] == 60
    assert fast["utilisation"] == pytest.approx(session["utilisation"], abs=0.002)
    assert fast["simulated_seconds"] == pytest.approx(session["simulated_seconds"], rel=1e-3)


def test_longest_first_beats_the_list_when_costs_differ():
    """Two architectures, one 10x the other, listed short first: longest first (what
    ``runtime.order = "cost"`` does once each is measured) ends the run with short members."""
    d, arch = fastsim.lognormal_durations(4000, 10.0, 0.25, seed=1, arch_costs=(1.0, 10.0))
    listed = np.concatenate([d[arch == 0], d[arch == 1]])
    longest_first = np.concatenate([d[arch == 1], d[arch == 0]])
    s = fastsim.Scenario(100, COST)
    assert fastsim.run(s, longest_first)["utilisation"] > fastsim.run(s, listed)["utilisation"] + 0.02


def test_helpers_shorten_the_tail_and_every_member_is_counted_once():
    d, _ = fastsim.lognormal_durations(2000, 60.0, 0.5, seed=2)
    alone = fastsim.run(fastsim.Scenario(200, COST), d)
    helped = fastsim.run(fastsim.Scenario(200, COST, tail="helpers"), d)
    assert alone["members"] == helped["members"] == 2000
    assert helped["utilisation"] > alone["utilisation"] + 0.02
    assert helped["simulated_seconds"] < alone["simulated_seconds"]


def test_a_time_limit_stops_the_hand_out_and_a_quantile_stops_later():
    d, _ = fastsim.lognormal_durations(20000, 60.0, 0.5, seed=3)
    runs = {q: fastsim.run(fastsim.Scenario(100, COST, time_limit=3600.0, stop_quantile=q), d)
            for q in (None, 0.9)}
    assert all(r["handed_out"] < 20000 and r["simulated_seconds"] <= 3600.0 + 1 for r in runs.values())
    assert runs[0.9]["handed_out"] > runs[None]["handed_out"]
    assert runs[None]["lost_to_deadline"] == 0.0 < runs[0.9]["lost_to_deadline"]


def test_a_saturated_master_limits_the_rate():
    """1,000 workers, 0.1 s members, 1 ms per member at the master: at most 1,000 members/s."""
    d = np.full(20000, 0.1)
    r = fastsim.run(fastsim.Scenario(1000, MasterCost(0.8e-3, 0.2e-3), message_seconds=0.0), d)
    assert r["members_per_second"] == pytest.approx(1000, rel=0.02)
    assert r["master_busy_share"] > 0.98 and r["utilisation"] < 0.15


def test_the_cli_fast_engine_rows(capsys):
    from ensemble.simulate import main
    assert main(["configs/digits.toml", "--engine", "fast", "--workers", "50", "100", "--per-worker", "10",
                 "--seconds", "60", "--spread", "0.5", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["members"] for r in rows] == [500, 1000]
    assert rows[0]["cost_us"] == [round(c * 1e6, 2) for c in (master_cost("ensemble").result,
                                                              master_cost("ensemble").dispatch)]


def test_the_one_in_hand_fast_path_equals_the_general_loop():
    d, _ = fastsim.lognormal_durations(3000, 60.0, 0.5, seed=4)
    fast = fastsim.run(fastsim.Scenario(300, COST, in_hand=1), d)
    general = fastsim.run(fastsim.Scenario(300, COST, in_hand=1, time_limit=1e12), d)   # a deadline never met
    assert {k: v for k, v in fast.items()} == {k: v for k, v in general.items()}


def test_the_fast_engine_replays_a_journal_as_the_session_engine_does(tmp_path, capsys):
    """--engine fast --replay said "members replayed" and drew the config's log-normal durations."""
    from ensemble.simulate import main
    journal = tmp_path / "journal.jsonl"
    journal.write_text("".join(json.dumps({"id": f"m-{i:03d}", "train_seconds": 0.1}) + "\n" for i in range(8)))
    common = ["configs/digits.toml", "--workers", "4", "--members", "8", "--seconds", "60", "--replay", str(journal),
              "--json"]
    assert main([*common, "--engine", "fast"]) == 0
    fast = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert fast["members"] == 8 and fast["simulated_seconds"] < 1.0        # 2 rounds of 0.1 s, not of 60 s
    assert main([*common, "--members", "12", "--engine", "fast"]) == 0     # beyond the journal: drawn (60 s)
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["simulated_seconds"] > 30


@pytest.mark.parametrize("args, said", [
    (["--tail", "none"], "--tail applies to --engine fast only"),                 # the session engine ignored it
    (["--sub-masters", "4", "--seed", "5"], "--seed, --sub-masters apply to --engine fast only"),
    (["--time-limit", "10"], "not more than the config's `runtime.finish_reserve`"),
])
def test_options_the_session_engine_would_ignore_are_refused(capsys, args, said):
    from ensemble.simulate import main
    assert main(["configs/digits.toml", "--workers", "10", *args]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--engine", "fast", "--sub-masters", "foo"], ["--specs-in-hand", "0"],
                                  ["--engine", "fast", "--arch-costs", "-1", "2"], ["--seconds", "nan"],
                                  ["--engine", "fast", "--arch-costs", "inf"], ["--latency", "nan"]])
def test_bad_simulate_numbers_are_usage_errors_not_tracebacks(capsys, args):
    from ensemble.simulate import main
    with pytest.raises(SystemExit) as info:
        main(["configs/digits.toml", "--workers", "10", *args])
    assert info.value.code == 2 and "error: argument" in capsys.readouterr().err


def test_the_masters_busy_share_never_passes_one():
    d = np.full(50, 1e-4)                                  # members shorter than the master's work on them
    r = fastsim.run(fastsim.Scenario(10, MasterCost(1e-3, 1e-3), message_seconds=0.0), d)
    assert 0.9 < r["master_busy_share"] <= 1.0
