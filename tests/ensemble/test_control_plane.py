"""The control plane without MPI: group commit, utilisation from the journal, worker slots,
the rehearsal trainer, progress lines and the virtual-clock simulator."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from ensemble.config import resolve_config
from ensemble.orchestrate.progress import Progress
from ensemble.results.journal import Journal, read_journal
from ensemble.results.records import as_record
from ensemble.results.rundir import RunDirectory
from ensemble.results.timeline import format_stats, run_stats
from ensemble.runtime.executor import Slots


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


# -- journal: group commit and events ---------------------------------------------------
def test_group_commit_syncs_at_most_every_interval_and_flushes_every_line(tmp_path):
    clock = FakeClock()
    path = tmp_path / "journal.jsonl"
    j = Journal(path, sync_seconds=1.0, clock=clock)
    j.extend([{"id": "a"}])                    # first write after a long quiet: synced at once
    assert j.syncs == 1
    for i in range(5):
        clock.t += 0.1
        j.append({"id": f"b{i}"})
        assert path.read_text().count("\n") == 2 + i      # on disk (the OS has it) at once
    assert j.syncs == 1                                   # but not fsynced yet
    clock.t += 0.6
    j.sync_if_due()                                       # the master's idle tick
    assert j.syncs == 2
    j.sync_if_due()
    assert j.syncs == 2                                   # nothing new: no fsync
    j.close()


def test_sync_zero_fsyncs_every_append(tmp_path):
    j = Journal(tmp_path / "j.jsonl", sync_seconds=0.0, clock=FakeClock())
    for i in range(4):
        j.append({"id": str(i)})
    assert j.syncs == 4
    j.close()


def test_event_lines_are_not_members(tmp_path):
    path = tmp_path / "journal.jsonl"
    with Journal(path) as j:
        j.event({"event": "open", "time": 1.0, "workers": 2})
        j.append({"id": "a", "status": "ok"})
    assert [r["id"] for r in read_journal(path)] == ["a"]
    records, events = read_journal(path, events=True)
    assert [e["event"] for e in events] == ["open"] and len(records) == 1


def test_torn_tail_of_a_long_journal_is_cut_from_the_end(tmp_path):
    path = tmp_path / "journal.jsonl"
    lines = [json.dumps({"id": f"m{i}", "pad": "x" * 200}) for i in range(2000)]   # > one 64 KiB read
    path.write_text("\n".join(lines) + "\n" + '{"id": "torn", "pa')
    with Journal(path) as j:
        j.append({"id": "next"})
    ids = [r["id"] for r in read_journal(path)]
    assert len(ids) == 2001 and ids[-1] == "next" and "torn" not in ids


# -- utilisation from the journal -------------------------------------------------------
def rec(worker, started, ended, received=None, status="ok"):
    return {"id": f"w{worker}-{started}", "worker": worker, "started": started, "ended": ended,
            "received": ended if received is None else received, "status": status}


def test_utilisation_is_training_time_over_workers_times_span():
    events = [{"event": "open", "time": 100.0, "job_started": 95.0, "workers": 2},
              {"event": "close", "time": 111.0, "master_wall_seconds": 11.0, "master_busy_seconds": 1.1,
               "master_cpu_seconds": 0.55, "journal_syncs": 3}]
    records = [rec(0, 101.0, 105.0), rec(0, 105.0, 111.0), rec(1, 101.0, 106.0, status="failed")]
    stats = run_stats(records, events)
    # trained 4 + 6 + 5 = 15 s of 2 workers x (111 - 101) s; startup 101 - 95
    assert stats["utilisation"] == pytest.approx(0.75)
    assert stats["startup_seconds"] == pytest.approx(6.0)
    assert stats["members"] == 3 and stats["failed"] == 1
    assert stats["members_per_second"] == pytest.approx(0.3)
    assert stats["master_busy_share"] == pytest.approx(0.1)
    assert stats["master_cpu_us_per_result"] == pytest.approx(1e6 * 0.55 / 3, rel=1e-3)
    assert "utilisation 75.0%" in format_stats(stats)


def test_packed_members_count_their_workers_time_once():
    """members_per_rank = 4 on 2 workers reported "utilisation 358%": each packed member's span, which
    its pack shares, was counted as a worker's time of its own."""
    events = [{"event": "open", "time": 100.0, "job_started": 99.0, "workers": 2}]
    records = [{**rec(w, 101.0, 111.0), "id": f"w{w}-{k}"} for w in (0, 1) for k in range(4)]
    assert run_stats(records, events)["utilisation"] == pytest.approx(1.0)


def test_a_resumed_run_adds_its_segments():
    events = [{"event": "open", "time": 0.0, "job_started": 0.0, "workers": 1},
              {"event": "open", "time": 100.0, "job_started": 98.0, "workers": 2}]
    records = [rec(0, 1.0, 11.0),                          # job 1: killed after one member
               rec(0, 101.0, 111.0), rec(1, 101.0, 106.0)]
    stats = run_stats(records, events)
    assert stats["segments"] == 2
    assert stats["utilisation"] == pytest.approx((10 + 10 + 5) / (1 * 10 + 2 * 10), abs=1e-4)
    assert stats["startup_seconds"] == pytest.approx(1.0 + 3.0)


def test_startup_phases_come_from_each_workers_first_result():
    events = [{"event": "open", "time": 100.0, "job_started": 95.0, "workers": 2}]
    first = [rec(0, 104.0, 108.0), rec(1, 106.0, 110.0)]
    first[0].update(build_seconds=0.5, startup={"process": 94.0, "main": 94.5, "mpi_and_config": 95.0,
                                                "data": 96.0, "trainer": 103.0})
    first[1].update(build_seconds=1.5, startup={"process": 94.0, "main": 94.5, "mpi_and_config": 95.5,
                                                "data": 96.0, "trainer": 105.0})
    stats = run_stats(first + [rec(0, 108.0, 112.0)], events)
    phases = stats["startup_phases"]
    assert phases["python"] == {"slowest": 0.5, "mean": 0.5}
    assert phases["tensorflow"] == {"slowest": 9.0, "mean": 8.0}
    assert phases["first_build"]["slowest"] == 1.5
    assert phases["total"] == {"slowest": 13.5, "mean": 12.0}          # 94 -> 106 + 1.5, 94 -> 104 + 0.5
    line = format_stats(stats)
    assert "tensorflow 9.0 s" in line and "launch to first member training 13.5 s" in line


def test_records_without_timestamps_give_no_stats():
    assert run_stats([{"id": "old", "status": "ok"}], []) == {}


# -- which worker gets the next spec ---------------------------------------------------
def test_slots_hand_out_round_robin_and_keep_order_per_worker():
    slots = Slots(3, in_hand=2)
    taken = [slots.take({"id": i}) for i in range(6)]
    assert taken == [0, 1, 2, 0, 1, 2] and len(slots.ready) == 0 and slots.busy == 6
    assert slots.training(1)["id"] == 1                  # a report from worker 1 is about its first spec
    assert slots.done(1)["id"] == 1
    assert slots.training(1)["id"] == 4 and list(slots.ready) == [1]


def test_auto_holds_more_specs_the_shorter_the_members():
    slots = Slots(4, in_hand=None)
    assert slots.target == 1 and len(slots.ready) == 4
    for w in range(4):
        slots.take({"id": w})
    slots.done(0, seconds=0.5)                  # the first result sets the target: 0.1 s / 0.5 s + 2
    assert slots.target == 2 and sorted(slots.ready) == [0, 0, 1, 2, 3]    # room for two each
    for _ in range(4):
        slots.take({"id": "x"})
    for w in range(1, 4):
        slots.done(w, seconds=1000.0)
    assert slots.target == 2                    # reconsidered once per max(64, workers) results only
    slots.retarget()
    assert slots.target == 1                    # long members: one in hand, an even end of the run
    assert sorted(slots.ready) == [w for w in range(4) if not slots.held[w]] == [3]
    slots.mean_seconds = 1e-4                   # null members: as many as the cap
    slots.retarget()
    assert slots.target == 4 and sum(len(h) for h in slots.held) + len(slots.ready) == 4 * 4


# -- the rehearsal trainer -----------------------------------------------------------
CFG = {"architectures": [{"name": "m", "members": 3, "layers": [{"type": "Dense", "units": 4}]}],
       "runtime": {"trainer": "rehearsal"}}


def rehearsal(tmp_path, task="classification", **settings):
    from ensemble.train.rehearsal import RehearsalTrainer
    raw = {**CFG, "rehearsal": {"seconds": 0.0, **settings}}
    cfg = resolve_config(raw)
    rng = np.random.default_rng(0)
    if task == "classification":
        data = {"y_val": rng.integers(0, 4, 50), "y_test": rng.integers(0, 4, 40)}
        meta = {"task": task, "n_outputs": 4}
    else:
        data = {"y_val": rng.normal(size=50), "y_test": rng.normal(size=40)}
        meta = {"task": task, "n_outputs": 1}
    return RehearsalTrainer(cfg, meta, data)


def test_rehearsal_member_has_the_real_record_and_prediction_shapes(tmp_path):
    trainer = rehearsal(tmp_path, accuracy=0.9)
    record = trainer({"id": "m-000", "seed": 5, "epochs": 3}, None)
    assert record["status"] == "ok" and record["epochs"] == 3 and record["rehearsal"]
    assert set(record["val"]) >= {"accuracy", "log_loss", "brier", "ece"}
    assert 0.6 < record["val"]["accuracy"] <= 1.0
    pred = record["payload"]["arrays"]["val_pred"]             # no bars in the spec: a candidate
    assert pred.shape == (50, 4) and np.allclose(pred.sum(axis=1), 1.0)
    assert record["payload"]["arrays"]["test_pred"].shape == (40, 4) and not record["model"]
    # a bar it cannot pass: no predictions travel
    bar = {"metric": "accuracy", "higher": True, "predictions": [1.0, "a"], "models": None}
    assert "payload" not in trainer({"id": "m-001", "seed": 6, "epochs": 1, "retain": bar}, None)
    reg = rehearsal(tmp_path / "r", "regression", predictions=False)({"id": "r", "seed": 1, "loss": "gaussian_nll"})
    assert {"mse", "mae", "nll", "coverage90"} <= set(reg["val"])
    assert "payload" not in reg and not list((tmp_path / "r").glob("*"))


def test_rehearsal_members_stop_at_their_time_limit_as_keras_members_do(tmp_path):
    """35 s members under a 20 s run limit ran 35 s each, status ok: a scheduler would have killed the job
    the rehearsal said fits. The budget's cap (``member_time_limit``) now stops them as it stops Keras."""
    from ensemble.train.member import MemberFailed
    trainer = rehearsal(tmp_path, spread=0.0, seconds=0.4)
    record = trainer({"id": "m-000", "seed": 5, "epochs": 4, "member_time_limit": 0.25}, None)
    assert record["status"] == "ok" and record["epochs"] == 2 and record["stopped"] == "time_limit"
    assert record["train_seconds"] < 0.35
    with pytest.raises(MemberFailed, match="before its first epoch ended") as err:
        trainer({"id": "m-001", "seed": 6, "epochs": 4, "member_time_limit": 0.05}, None)
    assert err.value.kind == "time_limit"
    with pytest.raises(MemberFailed, match="time_limit_fails"):
        trainer({"id": "m-002", "seed": 7, "epochs": 4, "member_time_limit": 0.25, "time_limit_fails": True}, None)
    assert trainer({"id": "m-003", "seed": 8, "epochs": 4, "member_time_limit": 5.0}, None)["epochs"] == 4


def test_rehearsal_durations_are_log_normal_around_the_median_and_replayable(tmp_path):
    from ensemble.train.rehearsal import member_seconds, replay_durations
    settings = resolve_config({**CFG, "rehearsal": {"seconds": 60.0, "spread": 0.5}}).rehearsal
    draws = [member_seconds({"id": str(i), "seed": i}, settings) for i in range(4000)]
    assert np.median(draws) == pytest.approx(60.0, rel=0.05)
    assert np.std(np.log(draws)) == pytest.approx(0.5, rel=0.05)
    assert member_seconds({"id": "x", "seed": 7}, settings) == member_seconds({"id": "y", "seed": 7}, settings)
    journal = tmp_path / "journal.jsonl"
    journal.write_text(json.dumps({"event": "open"}) + "\n" + json.dumps({"id": "a", "train_seconds": 2.5}) + "\n")
    replay = replay_durations(tmp_path)
    assert member_seconds({"id": "a", "seed": 0}, settings, replay) == 2.5
    assert member_seconds({"id": "unknown", "seed": 0}, settings, replay) == 2.5
    with pytest.raises(ValueError, match="rehearsal.replay"):
        replay_durations(tmp_path / "nowhere")


def test_rehearsal_arch_seconds_give_each_named_architecture_its_own_median():
    from ensemble.config import ConfigError
    from ensemble.train.rehearsal import member_seconds
    archs = [{"name": "small", "members": 2, "layers": [{"type": "Dense", "units": 4}]},
             {"name": "large", "members": 2, "layers": [{"type": "Dense", "units": 64}]}]
    settings = resolve_config({**CFG, "architectures": archs,
                               "rehearsal": {"seconds": 2.0, "spread": 0.5, "arch_seconds": {"large": 20}}}).rehearsal
    large = [member_seconds({"id": f"l{i}", "seed": i, "arch": "large"}, settings) for i in range(2000)]
    small = [member_seconds({"id": f"s{i}", "seed": i, "arch": "small"}, settings) for i in range(2000)]
    assert np.median(large) == pytest.approx(20.0, rel=0.08) and np.median(small) == pytest.approx(2.0, rel=0.08)
    assert np.std(np.log(large)) == pytest.approx(0.5, rel=0.08)
    with pytest.raises(ConfigError, match=r"rehearsal.arch_seconds.*'huge'.*'large', 'small'"):
        resolve_config({**CFG, "architectures": archs, "rehearsal": {"arch_seconds": {"huge": 5}}})
    with pytest.raises(ConfigError, match=r"rehearsal.arch_seconds.*'large' is given -1"):
        resolve_config({**CFG, "architectures": archs, "rehearsal": {"arch_seconds": {"large": -1}}})


def test_rehearsal_reports_and_obeys_a_stop(tmp_path):
    trainer = rehearsal(tmp_path, predictions=False)
    seen = []

    def report(payload):
        seen.append(payload["epoch"])
        return {"action": "stop"} if payload["epoch"] == 4 else {"action": "continue"}
    record = trainer({"id": "m", "seed": 1, "epochs": 10, "report_every": 2}, report)
    assert seen == [2, 4] and record["epochs"] == 4 and record["stopped"] == "master"


def test_rehearsal_failures_are_drawn_at_the_configured_rate(tmp_path):
    from ensemble.train.member import guarded
    trainer = rehearsal(tmp_path, predictions=False, failure_rate=0.3)
    results = [guarded(lambda i=i: trainer({"id": f"m{i}", "seed": i}), {"id": f"m{i}", "seed": i}, 0)
               for i in range(300)]
    failed = [r for r in results if r["status"] == "failed"]
    assert 0.2 < len(failed) / 300 < 0.4
    assert failed[0]["error"]["kind"] == "rehearsal"


# -- progress lines --------------------------------------------------------------------
def test_progress_prints_each_result_when_few_and_summaries_when_many(caplog):
    caplog.set_level(logging.INFO, logger="ensemble")
    ok = as_record({"id": "m", "status": "ok", "val": {"accuracy": 0.5}, "epochs": 1, "params": 10,
                    "train_seconds": 1.0, "started": 0.0, "ended": 1.0})
    clock = FakeClock()
    few = Progress(3, "accuracy", 1, lines=10, clock=clock)
    few.add([ok, ok])
    assert sum("val accuracy" in r.message for r in caplog.records) == 2
    caplog.clear()
    many = Progress(1000, "accuracy", 2, lines=10, every=5.0, clock=clock)
    for _ in range(20):
        clock.t += 1.0
        many.add([ok] * 10)
    lines = [r.message for r in caplog.records]
    assert len(lines) == 4 and all("members/s" in line and "ETA" in line for line in lines)
    assert lines[-1].startswith("[200/1000]") and "time budget" not in lines[-1]
    timed = Progress(1000, "accuracy", 2, lines=10, clock=clock, ends_at=clock.t + 30.0)   # evolve.time_limit
    clock.t += 10.0
    timed.add([ok] * 10)                             # 1 member/s: 990 s by the count, 20 s by the budget
    assert timed.summary().endswith("ETA 20 s (the time budget ends first)  +10 s")


def test_a_search_counts_the_time_it_already_searched_against_its_time_limit():
    from ensemble.modes import MODES
    cfg = resolve_config({"mode": "evolve", "evolve": {"time_limit": 100}})
    records = [as_record({"id": f"e{i}", "status": "ok", "val": {"accuracy": 0.5}, "search": {"wall": w}})
               for i, w in enumerate((10.0, 35.5))]
    assert MODES["evolve"].search_seconds_left(cfg, records) == pytest.approx(64.5)
    assert MODES["evolve"].search_seconds_left(resolve_config({"mode": "evolve"}), records) is None
    assert MODES["ensemble"].search_seconds_left(resolve_config(CFG), records) is None


# -- the simulator ---------------------------------------------------------------------
def sim_config(members=12, **runtime):
    return resolve_config({**CFG, "architectures": [{**CFG["architectures"][0], "members": members}],
                           "runtime": {"trainer": "rehearsal", **runtime},
                           "rehearsal": {"seconds": 10.0, "spread": 0.0}})


def sim_data():
    rng = np.random.default_rng(0)
    return ({"y_val": rng.integers(0, 3, 30), "y_test": rng.integers(0, 3, 30)},
            {"task": "classification", "n_outputs": 3, "input_shape": [4],
             "sizes": {"train": 60, "val": 30, "test": 30}})


def test_simulated_run_of_equal_members_is_exact(tmp_path):
    from ensemble.orchestrate.simulate import simulate
    data, meta = sim_data()
    stats = simulate(sim_config(12), meta, data, RunDirectory(tmp_path), 3, latency=0.01, speed=0.0)
    assert stats["members"] == 12
    # 4 rounds of 10 s on each of 3 workers; "auto" holds no spec ahead for 10 s members, so
    # each round also waits a round trip (2 latencies); speed=0: the master's own (measured,
    # machine-dependent) time is left out, so the clock is exact
    assert stats["simulated_seconds"] == pytest.approx(4 * (10 + 2 * 0.01), abs=1e-3)
    assert stats["utilisation"] > 0.99
    records, events = read_journal(tmp_path / "journal.jsonl", events=True)
    assert len(records) == 12 and {e["event"] for e in events} == {"open", "close"}
    assert run_stats(records, events)["utilisation"] == stats["utilisation"]


def test_simulated_round_trip_shows_what_a_spec_in_hand_saves(tmp_path):
    from ensemble.orchestrate.simulate import simulate
    data, meta = sim_data()
    one = simulate(sim_config(30, specs_in_hand=1), meta, data, RunDirectory(tmp_path / "a"), 3, latency=1.0,
                   speed=0.0)
    two = simulate(sim_config(30, specs_in_hand=2), meta, data, RunDirectory(tmp_path / "b"), 3, latency=1.0,
                   speed=0.0)
    # one in hand: each member waits a 2 s round trip (10 rounds of 12 s); two: only the first does
    assert one["simulated_seconds"] == pytest.approx(10 * 12, abs=1e-3)
    assert two["simulated_seconds"] == pytest.approx(100 + 2, abs=1e-3)
    assert two["utilisation"] > one["utilisation"]


def test_simulator_drives_every_evolution_strategy(tmp_path):
    from ensemble.orchestrate.simulate import simulate
    from evolve import STRATEGIES
    data, meta = sim_data()
    for name in STRATEGIES:
        cfg = resolve_config({"mode": "evolve", "evolve": {"strategy": name, "evaluations": 30},
                              "runtime": {"trainer": "rehearsal"}, "rehearsal": {"seconds": 5.0, "spread": 0.3}})
        stats = simulate(cfg, meta, data, RunDirectory(tmp_path / name), 4)
        assert stats["members"] == 30, name


def test_derive_seed_is_numpys_seed_sequence():
    from ensemble.sources import derive_seed
    rng = np.random.default_rng(3)
    cases = [(0,), (0, 0, 0), (11, 1_000_003, 40)] + [
        tuple(int(v) for v in rng.integers(0, 2 ** 40, rng.integers(1, 7))) for _ in range(500)]
    for parts in cases:
        want = int(np.random.SeedSequence(list(parts)).generate_state(1)[0]) & 0x7FFFFFFF
        assert derive_seed(*parts) == want, parts


def test_a_result_line_of_an_open_ended_run_shows_no_total():
    """Mode "online" has no total: its lines read "[   2/?]" and its start "? members"."""
    from ensemble.orchestrate.progress import result_line
    from ensemble.results.records import MemberRecord, Status
    record = MemberRecord("o-00002", Status.OK, val={"mse": 0.5})
    assert result_line(record, 2, None, "mse", 1.0).startswith("[   2] o-00002")
    assert result_line(record, 2, 40, "mse", 1.0).startswith("[   2/40] o-00002")
