"""mode = "pbt", the master's side without MPI: the exploit and explore rules, synchronous
rounds (held reports answered together), lineage, resume, failures; and the packing of a
member's state for the worker-to-worker exchange."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from ensemble.config import ConfigError, Problems, resolve_config
from ensemble.results.journal import typed_history
from ensemble.results.records import MemberRecord, Status
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.exchange import pack, state_bytes, unpack
from ensemble.runtime.executor import HeldReports, SerialExecutor
from ensemble.sources.base import Hooks
from ensemble.sources.population import DEFAULT_BOUNDS, PopulationSource, exploit_pairs, explore

META = {"task": "classification", "input_shape": [4], "n_outputs": 3}


def config(**pbt):
    return resolve_config({"mode": "pbt", "seed": 1,
                           "architectures": [{"name": "a", "layers": [{"type": "Dense", "units": 4}]},
                                             {"name": "b", "layers": [{"type": "Dense", "units": 8}]}],
                           "pbt": {"rounds": 3, "ranges": {"learning_rate": [1e-4, 1e-1]}, **pbt}})


def test_truncation_copies_the_worst_fraction_from_the_best():
    scores = {f"m{i}": float(i) for i in range(8)}        # m7 best, m0 worst
    pairs = exploit_pairs(scores, "truncation", 0.25, np.random.default_rng(0))
    assert sorted(r for r, _ in pairs) == ["m0", "m1"]
    assert {d for _, d in pairs} <= {"m6", "m7"}


def test_truncation_copies_only_from_a_member_that_scored_better():
    """Three members all at validation accuracy 1.0 still copied one another every round (the
    population lost its diversity for nothing)."""
    assert exploit_pairs({"a": 1.0, "b": 1.0, "c": 1.0}, "truncation", 0.34, np.random.default_rng(0)) == []
    scores = {"a": 0.9, "b": 0.9, "c": 0.8, "d": 0.9}
    for seed in range(20):
        pairs = exploit_pairs(scores, "truncation", 0.5, np.random.default_rng(seed))
        assert all(scores[d] > scores[r] for r, d in pairs) and [r for r, _ in pairs] == ["c"]


def test_tournament_pairs_members_and_the_loser_copies_the_winner():
    scores = {f"m{i}": float(i) for i in range(6)}
    pairs = exploit_pairs(scores, "tournament", 0.25, np.random.default_rng(3))
    assert len(pairs) == 3
    assert all(scores[donor] > scores[receiver] for receiver, donor in pairs)
    assert len({m for pair in pairs for m in pair}) == 6


def test_a_failed_member_copies_a_good_one_under_every_rule():
    scores = {"a": 0.9, "b": 0.5, "c": -math.inf, "d": 0.7}
    for rule in ("truncation", "tournament", "none"):
        pairs = dict(exploit_pairs(scores, rule, 0.25, np.random.default_rng(1)))
        assert pairs["c"] == "a"
        assert "c" not in pairs.values()
    assert exploit_pairs(scores, "none", 0.25, np.random.default_rng(1)) == [("c", "a")]


def test_explore_perturbs_by_the_factors_and_stays_in_bounds():
    rng = np.random.default_rng(0)
    bounds = dict(DEFAULT_BOUNDS, learning_rate=(1e-4, 1e-2))
    hp = {"learning_rate": 1e-3, "batch_size": 64, "dropout": 0.2, "weight_decay": None, "momentum": None}
    out = explore(hp, ["learning_rate", "batch_size"], "perturb", [0.5, 2.0], 0.0, bounds, rng)
    assert out["learning_rate"] in (pytest.approx(5e-4), pytest.approx(2e-3))
    assert out["batch_size"] in (32, 128) and isinstance(out["batch_size"], int)
    assert out["dropout"] == 0.2                               # not evolving: unchanged
    for _ in range(50):
        out = explore(out, ["learning_rate"], "perturb", [10.0], 0.0, bounds, rng)
    assert out["learning_rate"] == pytest.approx(1e-2)         # clipped at the range's top
    drawn = explore(hp, ["learning_rate", "weight_decay"], "resample", [1.0], 1.0, bounds, rng)
    assert 1e-4 <= drawn["learning_rate"] <= 1e-2 and drawn["weight_decay"] is not None


def source(tmp_path, workers=3, lines=(), **pbt):
    cfg = config(**pbt)
    src = PopulationSource(cfg, META, RunDirectory(tmp_path), typed_history(lines), workers)
    answered, journal = {}, []
    src.bind(Hooks(event=journal.append, answer=lambda member, decision: answered.__setitem__(member, decision),
                   deadline=lambda: None, clock=time.time))
    return src, answered, journal


def report(round_, value, rank, ok=True):
    return {"round": round_, "ok": ok, "val": {"accuracy": value}, "loss": 1.0 - value, "rank": rank,
            "state_bytes": 1000, "exposes": ["learning_rate", "batch_size", "weight_decay"]}


def test_a_round_is_answered_once_every_member_has_reported(tmp_path):
    src, answered, journal = source(tmp_path)
    specs = [src.next_spec() for _ in range(3)]
    assert src.next_spec() is None
    assert [s["id"] for s in specs] == ["pbt-000", "pbt-001", "pbt-002"]
    assert [s["arch"] for s in specs] == ["a", "b", "a"]              # dealt round-robin
    assert len({s["pbt"]["hparams"]["learning_rate"] for s in specs}) == 3   # drawn from the range
    assert src.decide(specs[0], report(1, 0.9, 1)) is None              # held
    assert src.decide(specs[1], report(1, 0.2, 2)) is None
    own = src.decide(specs[2], report(1, 0.5, 3))
    decisions = {**answered, "pbt-002": own}
    assert decisions["pbt-001"]["action"] == "update"                   # the worst copies the best
    assert decisions["pbt-001"]["copy"]["rank"] == 1 and decisions["pbt-001"]["copy"]["member"] == "pbt-000"
    assert decisions["pbt-001"]["copy"]["what"]["arch"] == "a"          # the architecture comes along
    assert decisions["pbt-000"] == {"action": "continue", "send_to": [2]}
    assert decisions["pbt-002"]["action"] == "continue"
    assert len(journal) == 1 and journal[0]["round"] == 1 and not journal[0]["stop"]
    rows = {r["id"]: r for r in journal[0]["members"]}
    assert rows["pbt-001"]["copied_from"] == "pbt-000" and rows["pbt-001"]["next_what"]["arch"] == "a"
    # round 3 is the last: everyone stops, nobody copies
    for r in (2, 3):
        answered.clear()
        src.decide(specs[0], report(r, 0.9, 1))
        src.decide(specs[1], report(r, 0.3, 2))
        own = src.decide(specs[2], report(r, 0.5, 3))
    assert own["action"] == "stop" and all(d["action"] == "stop" for d in answered.values())
    assert journal[-1]["stop"] and not any(row["copied_from"] for row in journal[-1]["members"])


def test_a_report_from_another_round_is_refused(tmp_path):
    src, _, _ = source(tmp_path, workers=2, population=2)
    a, b = src.next_spec(), src.next_spec()
    src.decide(a, report(1, 0.5, 1))
    with pytest.raises(RuntimeError, match="reported round 2"):
        src.decide(b, report(2, 0.5, 2))


def test_a_member_that_fails_outside_a_round_leaves_and_the_round_completes(tmp_path):
    src, answered, journal = source(tmp_path)
    specs = [src.next_spec() for _ in range(3)]
    assert src.decide(specs[0], report(1, 0.9, 1)) is None
    assert src.decide(specs[1], report(1, 0.2, 2)) is None
    told = src.tell(MemberRecord.from_json({"id": specs[2]["id"], "status": "failed",
                                            "error": {"kind": "OutOfMemory"}}))
    assert told.status is Status.FAILED and told.extra["pbt"]["rounds"] == 0
    assert set(answered) == {"pbt-000", "pbt-001"} and len(journal) == 1
    assert src.active == ["pbt-000", "pbt-001"]


def test_resume_restores_each_member_from_its_state_after_the_last_round(tmp_path):
    src, answered, journal = source(tmp_path)
    specs = [src.next_spec() for _ in range(3)]
    for spec, value in zip(specs, (0.9, 0.2, 0.5)):
        src.decide(spec, report(1, value, spec["pbt"]["hparams"]["batch_size"]))
    lines = [{"event": "open"}, *journal]
    again, _, _ = source(tmp_path, lines=lines)
    assert again.round == 1
    specs2 = {s["id"]: s for s in (again.next_spec() for _ in range(3))}
    assert specs2["pbt-001"]["pbt"]["restore"] == {"round": 1, "from": "pbt-000", "stop": False}
    assert specs2["pbt-000"]["pbt"]["restore"]["from"] == "pbt-000"
    assert specs2["pbt-001"]["arch"] == "a"                               # became a copy of pbt-000
    assert specs2["pbt-001"]["pbt"]["hparams"] == journal[0]["members"][1]["next_hparams"]
    # finished members are not handed out again
    done = [*lines, {"id": "pbt-002", "status": "ok"}]
    third, _, _ = source(tmp_path, lines=done)
    assert [third.next_spec()["id"], third.next_spec()["id"], third.next_spec()] == ["pbt-000", "pbt-001", None]


def test_the_time_limit_counts_the_rounds_earlier_jobs_trained(tmp_path):
    """`pbt.time_limit` began again at every resume (`started` was per job)."""
    rounds = [{"event": "pbt_round", "round": r, "time": 1000.0 + 10 * r, "stop": False, "members": []}
              for r in (1, 2, 3)]
    lines = [{"event": "open", "time": 1000.0}, *rounds[:2], {"event": "open", "time": 5000.0},
             {**rounds[2], "time": 5008.0}]
    again, answered, journal = source(tmp_path, lines=lines, time_limit=60.0, rounds=10)
    assert again.spent == 20.0 + 8.0                            # each job's rounds, from its open line
    now = [6000.0]
    again.bind(Hooks(event=journal.append, answer=lambda member, decision: answered.__setitem__(member, decision),
                     deadline=lambda: None, clock=lambda: now[0]))
    specs = [again.next_spec() for _ in range(3)]
    now[0] = 6020.0                                             # a 20 s round: 28 + 20 + 20 > 60
    for i, spec in enumerate(specs):
        again.decide(spec, report(4, 0.5 + 0.1 * i, i + 1))
    assert journal[-1]["round"] == 4 and journal[-1]["stop"] and "time limit" in journal[-1]["why"]


def test_population_larger_than_the_workers_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="pbt.population"):
        source(tmp_path, workers=2, population=3)


def test_pbt_settings_are_checked():
    with pytest.raises(ConfigError) as err:
        resolve_config({"mode": "pbt", "pbt": {"hyperparameters": ["lr"], "ranges": {"dropout": [0.2, 1.5]},
                                               "exploit": "best"}})
    text = str(err.value)
    assert "needs a starting population" in text and "'lr'" in text
    assert "pbt.ranges.dropout" in text and "pbt.exploit" in text
    with pytest.raises(ConfigError, match=r"`pbt.ranges.batch_size` is a number of samples, at least 1"):
        resolve_config({"mode": "pbt", "pbt": {"ranges": {"batch_size": [0.5, 2]}},      # trained at batch size 1
                        "architectures": [{"layers": [{"type": "Dense", "units": 2}]}]})
    with pytest.raises(ConfigError, match="master_trains"):
        resolve_config({"mode": "pbt", "runtime": {"master_trains": True},
                                               "architectures": [{"layers": [{"type": "Dense", "units": 2}]}]})


def test_a_state_packs_into_one_buffer_and_back_exactly():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.asarray(7, dtype=np.int64),
              np.asarray(0.5, dtype=np.float32), np.ones((0, 4), np.float16)]
    header, buffer = pack(arrays)
    assert buffer.dtype == np.uint8 and len(buffer) == state_bytes(arrays) == 24 + 8 + 4
    back = unpack(header, buffer)
    for a, b in zip(arrays, back):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="does not match"):
        unpack(header, buffer[:-1])


def test_held_reports_are_delivered_once():
    held, got = HeldReports(), []
    held.hold("m1", got.append)
    with pytest.raises(RuntimeError, match="again"):
        held.hold("m1", got.append)
    held.answer("m1", {"action": "continue"})
    assert got == [{"action": "continue"}] and len(held) == 0
    with pytest.raises(KeyError):
        held.answer("m1", {"action": "stop"})


def test_a_serial_run_cannot_hold_a_report():
    def trainer(spec, report):
        report({"round": 1})
        return {"id": spec["id"], "status": "ok"}
    ex = SerialExecutor(lambda: trainer)
    ex.submit({"id": "m"})
    with pytest.raises(RuntimeError, match="serial run"):
        ex.wait(lambda spec, payload: None)


def test_the_report_draws_the_population_and_status_counts_rounds(tmp_path):
    import json

    from ensemble.results.report import RunView, plot_population
    from ensemble.status import JournalTail, format_status, run_status
    src, _, journal = source(tmp_path)
    specs = [src.next_spec() for _ in range(3)]
    for r in (1, 2):
        for spec, value in zip(specs, (0.9, 0.2, 0.5)):
            src.decide(spec, report(r, value + 0.01 * r, 1 + specs.index(spec)))
    assert plot_population(RunView(tmp_path)) is None                 # no rounds: no plot
    fig = plot_population(RunView(tmp_path, events=journal))
    assert "3 members, 2 rounds, 2 copies" in fig._suptitle.get_text()
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in journal))
    from ensemble.config import dump_toml
    (tmp_path / "config.toml").write_text(dump_toml(config()))
    status = run_status(tmp_path, JournalTail(tmp_path / "journal.jsonl"))
    assert status["pbt"]["round"] == 2 and status["pbt"]["rounds"] == 3 and status["pbt"]["best"] == "pbt-000"
    assert ("population: round 2 of 3 done, best pbt-000 val accuracy 0.9200 (its round's score), 2 copies"
            in format_status(status))


def test_a_population_can_start_from_an_evolve_runs_best_candidates(tmp_path):
    import json

    from ensemble.config import dump_toml
    from ensemble.sources.population import search_winners
    from evolve import SearchSpace, random_genome
    evolve_cfg = resolve_config({"mode": "evolve", "search": {"max_depth": 2, "units": [8, 16]}})
    run = tmp_path / "ev"
    run.mkdir()
    (run / "config.toml").write_text(dump_toml(evolve_cfg))
    space = SearchSpace.from_config(dict(evolve_cfg.search), input_rank=1)
    rng = np.random.default_rng(0)
    lines = [{"id": f"e{i:04d}", "status": "ok", "val": {"accuracy": acc},
              "genome": random_genome(rng, space, (4,), 3).to_dict()} for i, acc in enumerate((0.5, 0.9, 0.7))]
    lines.append({"id": "e0009", "status": "failed"})
    (run / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    winners = search_winners(str(run), 4, META, evolve_cfg.train.to_dict())
    assert [w["arch"] for w in winners] == ["e0001", "e0002", "e0000", "e0001"]    # best first, round-robin
    assert all(w["layers"] and w["optimizer"] for w in winners)
    with pytest.raises(ConfigError, match="not a run directory"):
        search_winners(str(tmp_path), 2, META, evolve_cfg.train.to_dict())
    # a population started from it keeps what it took (started_from.json): resumed after the
    # search's run was moved away, it starts from the same members, and its preflight says nothing
    import shutil

    from ensemble.modes.pbt import PbtMode
    here = RunDirectory(tmp_path / "pbt")
    first, _, journal = source(here.path, workers=4, start=str(run))
    started = [first._spec(i)["arch"] for i in first.members]
    assert started == ["e0001", "e0002", "e0000", "e0001"]
    shutil.move(str(run), str(tmp_path / "moved"))
    again, _, _ = source(here.path, workers=4, lines=journal, start=str(run))
    assert [again._spec(i)["arch"] for i in again.members] == started
    found = Problems()
    PbtMode().preflight(config(start=str(run)), META, None, found, here)
    assert not found.messages
    PbtMode().preflight(config(start=str(run)), META, None, found, None)       # a new run: refused
    assert "does not exist" in found.messages[0]


def test_a_resumed_population_keeps_its_size_whatever_the_ranks(tmp_path):
    src, _, journal = source(tmp_path, workers=3)
    specs = [src.next_spec() for _ in range(3)]
    for spec, value in zip(specs, (0.9, 0.2, 0.5)):
        src.decide(spec, report(1, value, 1))
    bigger, _, _ = source(tmp_path, workers=5, lines=journal)            # population = 0: one per worker
    assert bigger.size == 3 and len(bigger.pending) == 3
    with pytest.raises(ConfigError, match="started with has 3 members.*mpirun -n 4"):
        source(tmp_path, workers=2, lines=journal)
