"""Contract suites for the framework's declared seams, each run against every implementation
(as optuna runs one storage suite on every storage):

- Executor (``runtime.executor``): ``SerialExecutor`` and ``SimExecutor`` run here (one slot
  or several, specs in hand, latency); ``MpiExecutor`` is checked to declare every member of
  the protocol (tests/mpi/test_executor_mpi.py runs it under mpiexec);
- Trainer: ``OneByOne``, what ``modes.make_trainer`` builds (rehearsal, a user's factory),
  and ``PackingTrainer`` (declared only: it trains with TensorFlow);
- Source and Decider (``sources.base``): ``SpecList``, ``SearchSource`` (every strategy),
  ``PopulationSource``; ``GoOn``, ``EarlyDiscard`` (both rules), ``PopulationSource``;
- Mode: every mode in ``modes.MODES``, made, described, run through ``dispatch`` on each
  executor, and resumed from its own journal.

Members "train" in plain functions (no TensorFlow, no MPI, no sleeping); a simulated
executor runs on a virtual clock that only its events move.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import math
import sys
import textwrap
import time
import types
import zlib
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from ensemble.config import Problems, resolve_config
from ensemble.modes import MODES, RunContext, make_trainer
from ensemble.modes.ensemble_list import PackingTrainer
from ensemble.orchestrate.dispatch import dispatch
from ensemble.orchestrate.simulate import SimExecutor, VirtualClock
from ensemble.results.journal import typed_history
from ensemble.results.records import MemberRecord, Status
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import (
    CONTINUE,
    STOP,
    Executor,
    MpiExecutor,
    OneByOne,
    SerialExecutor,
    Trainer,
    check_decision,
)
from ensemble.runtime.hierarchy import HierarchyExecutor
from ensemble.sources.base import Decider, GoOn, Hooks, Source
from ensemble.sources.discard import EarlyDiscard
from ensemble.sources.members import SpecList, member_count, member_specs
from ensemble.sources.population import PopulationSource
from ensemble.sources.search import SearchSource
from evolve import STRATEGIES

META = {"task": "classification", "input_shape": [4], "n_outputs": 3}
METRIC = "accuracy"
ARCHITECTURES = [{"name": "a", "members": 2, "layers": [{"type": "Dense", "units": 4}]},
                 {"name": "b", "members": 3, "layers": [{"type": "Dense", "units": 8}]}]
#: small populations, so that a search of EVALUATIONS breeds beyond its initial one
STRATEGY_PARAMS = {"regularized": {"population_size": 4, "sample_size": 2},
                   "mu_plus_lambda": {"mu": 3, "lambda_": 4},
                   "nsga2": {"population_size": 4},
                   "random": {}}
EVALUATIONS = 10


# -- members as every implementation trains them ---------------------------------------------
def quality(spec: dict) -> float:
    """A member's final validation accuracy: a pure function of its id."""
    return 0.3 + (zlib.crc32(str(spec["id"]).encode()) % 1000) / 1700


def curve(spec: dict, epoch: int, epochs: int) -> dict:
    """The in-training report of ``spec`` at ``epoch`` (what ``EarlyDiscard`` and a population
    read): its value climbs towards ``quality``. Also ``SimExecutor``'s ``curve``."""
    value = quality(spec) * (1.0 - 0.5 * math.exp(-3.0 * epoch / max(1, epochs)))
    return {"ok": True, "val": {METRIC: value}, "loss": 1.0 - value,
            "logs": {"loss": 1.0 - value, "val_loss": 1.0 - value, f"val_{METRIC}": value}}


def record(spec: dict, epochs: int, stopped: str) -> dict:
    """A member's result as a worker sends it (genome and summary travel back, as
    ``train.member`` sends them)."""
    out = {"id": spec["id"], "status": "ok", "seed": spec.get("seed"), "arch": spec.get("arch"),
           "epochs": epochs, "stopped": stopped, "params": 100 + len(str(spec["id"])),
           "val": {METRIC: quality(spec)}, "test": {METRIC: quality(spec)}}
    out.update({k: spec[k] for k in ("genome", "summary") if k in spec})
    return out


def train(spec: dict, report) -> dict:
    """A trainer (``(spec, report) -> record``): reports every ``report_every`` epochs, the last
    one included (as the Keras and the population trainers do), and obeys a stop. A resumed
    population member goes on after the round it restores (as ``train.population`` does)."""
    epochs, every = max(1, int(spec.get("epochs", 1))), int(spec.get("report_every") or 0)
    restore = (spec.get("pbt") or {}).get("restore") or {"round": 0}
    done, stopped, actions = epochs, "epochs", []
    for epoch in range(every * (restore["round"] + 1), epochs + 1, every) if every else ():
        decision = report({"epoch": epoch, "round": epoch // every, "rank": 1, **curve(spec, epoch, epochs)})
        actions.append(decision["action"])
        if decision["action"] == "stop":
            done, stopped = epoch, "master"
            break
    return {**record(spec, done, stopped), "actions": actions}


def duration(spec: dict) -> float:
    """Virtual seconds a member trains (uneven, so that results interleave)."""
    return 1.0 + 0.25 * (zlib.crc32(str(spec["id"]).encode()) % 5)


# -- the executors ----------------------------------------------------------------------------
def serial() -> SerialExecutor:
    return SerialExecutor(lambda: train)


def simulated(workers: int = 3, in_hand: int = 1, latency: float = 0.0) -> SimExecutor:
    return SimExecutor(workers, duration, lambda spec, seconds, epochs, stopped: record(spec, epochs, stopped),
                       VirtualClock(0.0, speed=0.0), in_hand=in_hand, latency=latency, message_seconds=0.001,
                       curve=curve)


#: name -> (a fresh executor, its slots, whether ``decide`` may hold a member for ``answer``)
EXECUTORS: dict[str, tuple[Callable[[], Executor], int, bool]] = {
    "serial": (serial, 1, False),
    "sim": (lambda: simulated(3), 3, True),
    "sim-in-hand": (lambda: simulated(2, in_hand=2, latency=0.05), 4, True),
}
#: executors a whole run is dispatched on (a mode, a source)
RUN_ON = ["serial", "sim"]


@pytest.fixture(params=list(EXECUTORS))
def executor_kind(request):
    return request.param


def drain(executor, specs: list[dict], decide) -> list[dict]:
    """Submit ``specs`` as slots free up and wait until all are back; checks the counts on the way."""
    queue, out, outstanding = list(specs), [], set()
    while queue or executor.busy():
        while queue and executor.free():
            busy, free = executor.busy(), executor.free()
            spec = queue.pop(0)
            executor.submit(spec)
            outstanding.add(spec["id"])
            assert executor.busy() == busy + 1 and executor.free() == free - 1
        busy = executor.busy()
        results = executor.wait(decide, lambda: None)
        assert results, "wait returns once at least one result is in"
        assert executor.busy() == busy - len(results)
        for result in results:
            assert result["id"] in outstanding, f"{result['id']} came back twice or was never submitted"
            outstanding.discard(result["id"])
        out.extend(results)
    assert not outstanding
    return out


def specs_of(n: int, epochs: int = 3, every: int = 0) -> list[dict]:
    return [{"id": f"m{i:02d}", "seed": i, "epochs": epochs, **({"report_every": every} if every else {})}
            for i in range(n)]


# -- declared members, checked by inspection ---------------------------------------------------
def protocol_members(proto: type) -> tuple[set[str], set[str]]:
    """(attributes, methods) a Protocol declares."""
    attributes = set(proto.__dict__.get("__annotations__", {}))
    methods = {n for n, v in vars(proto).items() if callable(v) and (not n.startswith("_") or n == "__call__")}
    return attributes, methods


def assigned_attributes(cls: type) -> set[str]:
    """Attributes a class sets: its class attributes and every ``self.x = ...`` in ``__init__``."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:                        # object left out
        names |= {n for n in vars(klass) if not n.startswith("_")}
        if "__init__" not in vars(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass.__init__)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return names


def check_declares(cls: type, proto: type) -> None:
    """``cls`` sets every attribute of ``proto`` and has each of its methods, with the
    protocol's parameters in order (defaulted where the protocol's are); extra ones only with
    a default."""
    attributes, methods = protocol_members(proto)
    missing = attributes - assigned_attributes(cls)
    assert not missing, f"{cls.__name__} never sets {sorted(missing)}"
    for name in sorted(methods):
        impl = getattr(cls, name, None)
        assert callable(impl), f"{cls.__name__} has no method {name}"
        want = list(inspect.signature(getattr(proto, name)).parameters.values())
        got = list(inspect.signature(impl).parameters.values())
        assert [p.name for p in got[:len(want)]] == [p.name for p in want], \
            f"{cls.__name__}.{name}{inspect.signature(impl)} is not the protocol's"
        for w, g in zip(want, got):
            if w.default is not inspect.Parameter.empty:
                assert g.default is not inspect.Parameter.empty, f"{cls.__name__}.{name}: {g.name} needs a default"
        for extra in got[len(want):]:
            assert extra.default is not inspect.Parameter.empty or extra.kind in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD), \
                f"{cls.__name__}.{name} requires {extra.name}, which callers never pass"


# == the Executor suite =========================================================================
@pytest.mark.parametrize("cls", [SerialExecutor, SimExecutor, MpiExecutor, HierarchyExecutor])
def test_executor_declares_every_member_of_the_protocol(cls):
    # MpiExecutor and HierarchyExecutor are checked here by inspection only (constructing them
    # starts MPI); tests/mpi/test_executor_mpi.py and test_hierarchy_mpi.py run them under mpiexec
    check_declares(cls, Executor)


def test_a_fresh_executor_has_every_slot_free(executor_kind):
    make, slots, _ = EXECUTORS[executor_kind]
    executor = make()
    assert isinstance(executor.workers, int) and executor.workers >= 1
    assert executor.free() == slots and executor.busy() == 0
    assert executor.idle_seconds is None or executor.idle_seconds >= 0
    assert executor.report_bytes == 0


def test_submit_takes_a_slot_and_counts_as_busy(executor_kind):
    make, slots, _ = EXECUTORS[executor_kind]
    executor = make()
    for n, spec in enumerate(specs_of(slots), 1):
        executor.submit(spec)
        assert executor.busy() == n and executor.free() == slots - n
    executor.shutdown()


def test_every_spec_comes_back_once_stamped_by_its_worker(executor_kind):
    make, slots, _ = EXECUTORS[executor_kind]
    executor = make()
    specs = specs_of(3 * slots + 1)
    results = drain(executor, specs, lambda spec, payload: CONTINUE)
    assert sorted(r["id"] for r in results) == [s["id"] for s in specs]
    for r in results:
        assert isinstance(r["started"], float) and r["ended"] >= r["started"]
        assert r["worker"] in range(executor.workers)
        assert r["status"] == "ok" and r["epochs"] == 3
    assert executor.free() == slots and executor.busy() == 0
    executor.shutdown()
    executor.shutdown()                                   # twice: nothing to release, no error


def test_reports_reach_decide_and_its_decisions_reach_the_member(executor_kind):
    make, _, _ = EXECUTORS[executor_kind]
    executor = make()
    specs = [{"id": i, "seed": 1, "epochs": 4, "report_every": 1} for i in ("stop-me", "go-on", "update-me")]
    seen: dict[str, list[int]] = {}

    def decide(spec, payload):
        seen.setdefault(spec["id"], []).append(payload["epoch"])
        assert spec in specs                                     # the spec as submitted
        if spec["id"] == "stop-me" and payload["epoch"] == 2:
            return STOP
        if spec["id"] == "update-me" and payload["epoch"] == 1:
            return {"action": "update", "settings": {"learning_rate": 0.5}}
        return CONTINUE
    bytes_before = executor.report_bytes
    by_id = {r["id"]: r for r in drain(executor, specs, decide)}
    assert seen["stop-me"] == [1, 2], "a stopped member reports no more"
    assert by_id["stop-me"]["epochs"] == 2 and by_id["stop-me"]["stopped"] == "master"
    for member in ("go-on", "update-me"):                        # an update is not a stop
        assert seen[member][:3] == [1, 2, 3]
        assert by_id[member]["epochs"] == 4 and by_id[member]["stopped"] == "epochs"
    assert isinstance(executor.report_bytes, int) and executor.report_bytes >= bytes_before


def test_a_held_report_waits_for_answer_where_the_executor_can_hold(executor_kind):
    make, slots, holds = EXECUTORS[executor_kind]
    executor = make()
    specs = specs_of(2, epochs=2, every=1)
    held, actions = [], []

    def decide(spec, payload):
        if payload["epoch"] != 1:
            return CONTINUE
        if not held:                                  # the first to report waits ...
            held.append(spec["id"])
            return None
        executor.answer(held[0], STOP)                # ... until the other's report comes
        actions.append(spec["id"])
        return CONTINUE
    if not holds:
        with pytest.raises(RuntimeError, match="held"):
            drain(executor, specs, decide)
        return
    assert slots >= 2
    by_id = {r["id"]: r for r in drain(executor, specs, decide)}
    assert by_id[held[0]]["epochs"] == 1 and by_id[held[0]]["stopped"] == "master"
    assert by_id[actions[0]]["epochs"] == 2 and by_id[actions[0]]["stopped"] == "epochs"


def test_an_answer_to_a_member_not_held_is_refused(executor_kind):
    executor = EXECUTORS[executor_kind][0]()
    with pytest.raises((KeyError, RuntimeError)):
        executor.answer("nobody", CONTINUE)


def test_dispatch_over_the_executor_crosses_every_result_into_a_record_once(executor_kind):
    make, slots, _ = EXECUTORS[executor_kind]
    executor = make()
    specs = specs_of(2 * slots + 3, epochs=2, every=1)
    records: list[MemberRecord] = []
    account = dispatch(executor, SpecList(specs, total=len(specs)), records.extend, clock=executor_clock(executor))
    assert account["results"] == len(specs) == len(records)
    assert sorted(r.id for r in records) == [s["id"] for s in specs]
    for r in records:
        assert r.status is Status.OK and r.dispatched is not None and r.received >= r.dispatched
        assert MemberRecord.from_json(json.loads(json.dumps(r.to_json()))) == r     # the journal's round trip
    assert (account["master_busy_seconds"] is None) == (executor.idle_seconds is None)


@pytest.mark.parametrize("status", list(Status))
def test_a_record_of_every_status_survives_the_journal(status):
    r = MemberRecord(id="m-001", status=status, val={METRIC: 0.5}, epochs=2, error={"kind": "RuntimeError"},
                     discarded={"epoch": 1} if status is Status.DISCARDED else None, extra={"stopped": "master"})
    assert MemberRecord.from_json(json.loads(json.dumps(r.to_json()))) == r


def executor_clock(executor) -> Callable[[], float]:
    """The master's clock that goes with ``executor`` (the simulated one's own)."""
    return executor.clock if isinstance(executor, SimExecutor) else time.time


# == the Trainer suite ==========================================================================
def rehearsal_trainer(tmp_path) -> Trainer:
    cfg = resolve_config({"architectures": ARCHITECTURES, "runtime": {"trainer": "rehearsal"},
                          "rehearsal": {"seconds": 0.0, "predictions": False}})
    rng = np.random.default_rng(0)
    data = {"y_val": rng.integers(0, 3, 30), "y_test": rng.integers(0, 3, 30)}
    return make_trainer(cfg, META, data, RunDirectory(tmp_path), 0)


def factory_trainer(tmp_path, monkeypatch) -> Trainer:
    """``runtime.trainer = "module:function"``: a user's factory, called with the run's objects."""
    module = types.ModuleType("seam_user_trainer")
    module.factory = lambda cfg, meta, data, run_dir, rank, group: train
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cfg = resolve_config({"architectures": ARCHITECTURES, "runtime": {"trainer": "seam_user_trainer:factory"}})
    return make_trainer(cfg, META, {}, RunDirectory(tmp_path), 0)


TRAINERS = {"one-by-one": lambda tmp_path, monkeypatch: OneByOne(train),
            "rehearsal": lambda tmp_path, monkeypatch: rehearsal_trainer(tmp_path),
            "user-factory": factory_trainer}


@pytest.fixture(params=list(TRAINERS))
def trainer(request, tmp_path, monkeypatch):
    return TRAINERS[request.param](tmp_path, monkeypatch)


@pytest.mark.parametrize("cls", [OneByOne, PackingTrainer])
def test_trainer_declares_every_member_of_the_protocol(cls):
    check_declares(cls, Trainer)


def test_a_trainer_trains_one_spec_into_its_record(trainer):
    check_declares(type(trainer), Trainer)
    assert isinstance(trainer.pack, int) and trainer.pack >= 1
    spec = {"id": "m-007", "seed": 7, "epochs": 2}
    hash(trainer.pack_key(spec))                        # a key to group specs by (None: alone)
    assert isinstance(trainer.looks_ahead, bool)
    assert trainer.ahead({"id": "m-009", "seed": 9, "epochs": 2}, spec) is None   # prepares at most; trains nothing
    result = trainer(spec, lambda payload: pytest.fail("a spec without report_every never reports"))
    assert MemberRecord.from_json(result).id == "m-007" and result["status"] == "ok"
    json.dumps(result)                                  # what crosses MPI and lands in the journal


def test_a_trainer_obeys_the_masters_stop(trainer):
    epochs_reported = []

    def report(payload):
        epochs_reported.append(payload["epoch"])
        return STOP
    result = trainer({"id": "m-008", "seed": 8, "epochs": 6, "report_every": 2}, report)
    assert epochs_reported == [2] and result["epochs"] == 2


def test_a_trainer_trains_many_specs_into_one_record_each(trainer):
    specs = [{"id": f"m-{i:03d}", "seed": i, "epochs": 1} for i in range(3)]
    results = trainer.train_many(specs)
    assert [r["id"] for r in results] == [s["id"] for s in specs]


# == the Source suite ===========================================================================
def ensemble_cfg(**extra):
    return resolve_config({"seed": 5, "train": {"epochs": 3}, "architectures": ARCHITECTURES, **extra})


def evolve_cfg(strategy="regularized", **evolve):
    return resolve_config({"mode": "evolve", "seed": 3, "train": {"epochs": 4},
                           "evolve": {"strategy": strategy, "evaluations": EVALUATIONS,
                                      **STRATEGY_PARAMS[strategy], **evolve}})


def pbt_cfg(**pbt):
    return resolve_config({"mode": "pbt", "seed": 1, "architectures": ARCHITECTURES,
                           "pbt": {"rounds": 3, "round_epochs": 1, "ranges": {"learning_rate": [1e-4, 1e-1]},
                                   **pbt}})


def spec_list(tmp_path, workers):
    cfg = ensemble_cfg()
    return SpecList(member_specs(cfg), total=member_count(cfg)), GoOn()


def spec_list_unsized(tmp_path, workers):
    return SpecList(specs_of(4, epochs=2)), GoOn()


def search(strategy):
    def make(tmp_path, workers):
        return SearchSource(evolve_cfg(strategy), META, RunDirectory(tmp_path), []), GoOn()
    return make


def population(tmp_path, workers):
    source = PopulationSource(pbt_cfg(), META, RunDirectory(tmp_path), [], workers)
    return source, source


def online_source(tmp_path, workers):
    from ensemble.sources.online import OnlineSource
    from ensemble.sources.replay import ReplayBuffer
    buffer = ReplayBuffer(16, "reservoir")
    buffer.offer(np.ones((8, 4), np.float32), np.arange(8, dtype=np.float32))
    return OnlineSource(online_cfg(), RunDirectory(tmp_path), EndedLink(), buffer, [], 0, workers), GoOn()


#: name -> (tmp_path, workers) -> (a new run's Source, the Decider it runs with)
SOURCES = {"spec-list": spec_list, "spec-list-unsized": spec_list_unsized,
           **{f"search-{name}": search(name) for name in STRATEGIES}, "population": population,
           "online": online_source}


@pytest.fixture(params=list(SOURCES))
def source_kind(request):
    return request.param


def hooks(events: list | Callable[[dict], None] | None = None, answer=None, clock=None) -> Hooks:
    """The session's hooks: events go to ``events`` (a list, or a function), decisions on held
    members to ``answer`` (none expected by default)."""
    events = events if events is not None else []
    return Hooks(event=events.append if isinstance(events, list) else events,
                 answer=answer or (lambda spec_id, decision: pytest.fail(f"nobody holds {spec_id}")),
                 deadline=lambda: None, clock=clock or time.time)


def hand_out(source, limit: int = 1000) -> list[dict]:
    """Everything ``source`` hands out now, up to its first None."""
    out = []
    while (spec := source.next_spec()) is not None:
        out.append(spec)
        assert len(out) < limit, "next_spec never says None"
    return out


def test_source_declares_the_protocol(source_kind, tmp_path):
    source, _ = SOURCES[source_kind](tmp_path, 3)
    assert isinstance(source, Source)
    check_declares(type(source), Source)


def test_total_is_a_count_or_unknown(source_kind, tmp_path):
    total = SOURCES[source_kind](tmp_path, 3)[0].total
    assert total is None or (type(total) is int and total >= 0)


def test_next_spec_hands_out_plain_specs_with_unique_ids_until_none(source_kind, tmp_path):
    source, _ = SOURCES[source_kind](tmp_path, 3)
    events: list[dict] = []
    source.bind(hooks(events))
    specs = hand_out(source)
    assert specs, "a new run has something to hand out"
    ids = [s["id"] for s in specs]
    assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids)
    assert source.total is None or len(specs) <= source.total
    for spec in specs:
        assert json.loads(json.dumps(spec)) == spec           # plain data: crosses MPI, journalled as issued
    json.dumps(events)


def test_tell_returns_the_record_of_the_same_member(source_kind, tmp_path):
    source, _ = SOURCES[source_kind](tmp_path, 3)
    source.bind(hooks())
    specs = hand_out(source)
    told = []
    for n, spec in enumerate(specs):
        result = record(spec, int(spec.get("epochs", 1)), "epochs")
        if n == 1:                                            # any status is told
            result = {"id": spec["id"], "status": "failed", "error": {"kind": "RuntimeError", "message": "x"}}
        sent = MemberRecord.from_json(result)
        back = source.tell(sent)
        assert isinstance(back, MemberRecord) and back.id == sent.id and back.status is sent.status
        assert back.val == sent.val
        told.append(back)
    section = source.finish(told)
    assert isinstance(section, dict)
    json.dumps(section)


@pytest.mark.parametrize("run_on", RUN_ON)
def test_dispatch_runs_the_source_to_its_end_telling_every_member_once(source_kind, run_on, tmp_path):
    make, _, _ = EXECUTORS[run_on]
    executor = make()
    source, decider = SOURCES[source_kind](tmp_path, executor.workers)
    events: list[dict] = []
    bound = hooks(events, executor.answer, executor_clock(executor))
    source.bind(bound)
    decider.bind(bound)
    issued, told, records = [], Counter(), []
    next_spec, tell = source.next_spec, source.tell

    def spy_next():
        spec = next_spec()
        if spec is not None:
            issued.append(spec["id"])
        return spec

    def spy_tell(record):
        told[record.id] += 1
        return tell(record)
    source.next_spec, source.tell = spy_next, spy_tell
    account = dispatch(executor, source, records.extend, decider=decider, clock=executor_clock(executor))
    assert len(set(issued)) == len(issued) and set(told) == set(issued) and set(told.values()) == {1}
    assert account["results"] == len(records) == len(issued)
    if source.total is not None:
        assert len(issued) == source.total, "a new run hands out `total` members"
    section = source.finish(records)
    assert isinstance(section, dict)
    json.dumps(section)


# == the Decider suite ==========================================================================
def discard(rule):
    def make(tmp_path):
        return EarlyDiscard(rule, 1, 2, 2, METRIC), [{"id": f"e{i:04d}", "seed": i, "epochs": 6} for i in range(6)]
    return make


def population_decider(tmp_path):
    source = PopulationSource(pbt_cfg(), META, RunDirectory(tmp_path), [], 3)
    source.bind(hooks())
    return source, hand_out(source)


#: name -> tmp_path -> (a Decider, the specs it decides about)
DECIDERS = {"go-on": lambda tmp_path: (GoOn(), specs_of(4, epochs=4)),
            "asha": discard("asha"), "median": discard("median"), "population": population_decider}


@pytest.fixture(params=list(DECIDERS))
def decider_kind(request):
    return request.param


def test_decider_declares_the_protocol(decider_kind, tmp_path):
    decider, _ = DECIDERS[decider_kind](tmp_path)
    assert isinstance(decider, Decider)
    check_declares(type(decider), Decider)


def test_stamp_keeps_the_spec_and_its_id(decider_kind, tmp_path):
    decider, specs = DECIDERS[decider_kind](tmp_path)
    for spec in specs:
        before = copy.deepcopy(spec)
        stamped = decider.stamp(spec)
        assert spec == before, "stamp must not change the spec it was given"
        assert isinstance(stamped, dict) and stamped["id"] == spec["id"]
        kept = set(spec) - {"report_every"}                      # how often it reports is the decider's
        assert {k: stamped[k] for k in kept} == {k: spec[k] for k in kept}
        json.dumps(stamped)


def test_decide_answers_every_report_or_holds_it_until_hooks_answer(decider_kind, tmp_path):
    decider, specs = DECIDERS[decider_kind](tmp_path)
    answered: dict[str, list[dict]] = {}
    decider.bind(hooks(answer=lambda spec_id, decision: answered.setdefault(spec_id, []).append(decision)))
    stamped = [decider.stamp(s) for s in specs]
    epochs = max(int(s["epochs"]) for s in stamped)
    every = {s["id"]: int(s.get("report_every") or 1) for s in stamped}
    running = {s["id"] for s in stamped}
    for epoch in range(1, epochs + 1):
        held = set()
        for spec in stamped:
            if spec["id"] not in running or epoch % every[spec["id"]]:
                continue
            payload = {"epoch": epoch, "round": epoch // every[spec["id"]], "rank": 1,
                       **curve(spec, epoch, int(spec["epochs"]))}
            decision = decider.decide(spec, payload)
            if decision is None:
                held.add(spec["id"])
                continue
            check_decision(decision)
            if decision["action"] == "stop":
                running.discard(spec["id"])
        # every member held this epoch was answered once, by the time the last one reported
        assert set(answered) == held and all(len(d) == 1 for d in answered.values())
        for spec_id, (decision,) in answered.items():
            if check_decision(decision)["action"] == "stop":
                running.discard(spec_id)
        answered.clear()


def test_mark_keeps_the_member_of_every_status(decider_kind, tmp_path):
    decider, specs = DECIDERS[decider_kind](tmp_path)
    for status in Status:
        r = MemberRecord(id=specs[0]["id"], status=status, val={METRIC: 0.5}, epochs=2)
        marked = decider.mark(r)
        assert isinstance(marked, MemberRecord) and marked.id == r.id
        assert marked.status is status and marked.val == r.val      # a member it never decided about


def test_replay_accepts_an_empty_journal_and_a_one_pass_iterator(decider_kind, tmp_path):
    decider, specs = DECIDERS[decider_kind](tmp_path)
    decider.replay([])
    decider.replay(iter([MemberRecord(id="x", status=Status.OK, val={METRIC: 0.5}, extra={"rungs": {"1": 0.5}})]))
    assert decider.stamp(specs[0])["id"] == specs[0]["id"]


# == the Mode suite =============================================================================
def online_cfg():
    return resolve_config({"mode": "online", "seed": 2, "data": {"source": "seed.npz"}, "train": {"epochs": 2},
                           "architectures": ARCHITECTURES, "online": {"warmup": 4, "buffer": 16}})


class EndedLink:
    """Mode "online"'s link to a simulation that has already sent its samples and closed
    (``runtime.coupling.Inlet`` without MPI): the source hands out its last round and stops."""

    def __init__(self):
        import threading
        self.lock, self.closed, self.ranks, self.sim_counts = threading.RLock(), threading.Event(), 1, {}
        self.closed.set()
        self.refused, self.refused_error, self.error = 0, None, None     # what the online section reads
        self.announced: list[int] = []

    def announce(self, generation, run_dir, seqs=None):
        self.announced.append(generation)

    def failed(self, generation, error):
        pass

    def stop(self, reason=""):
        pass


def online_link(monkeypatch) -> None:
    """The link and buffer ``OnlineMode.before_prepare`` would have made, with 8 samples."""
    from ensemble.modes import online
    from ensemble.sources.replay import ReplayBuffer
    buffer = ReplayBuffer(16, "fifo")
    buffer.offer(np.zeros((8, 4), np.float32), np.arange(8, dtype=np.float32))
    monkeypatch.setattr(online, "_LINK", {"inlet": EndedLink(), "buffer": buffer})


#: a valid config per mode (and per variant that changes its Source or Decider)
MODE_CONFIGS = {"online": online_cfg, "ensemble": ensemble_cfg,
                "evolve": evolve_cfg,
                "evolve-asha": lambda: evolve_cfg(discard="asha", discard_epochs=1, discard_factor=2,
                                                  discard_grace=2),
                "pbt": pbt_cfg}


#: the data each mode's preflight sees (mode "online" trains regression)
MODE_META = {"online": {"task": "regression", "input_shape": [4], "n_outputs": 1}}


@pytest.fixture(params=list(MODE_CONFIGS))
def mode_case(request, monkeypatch):
    cfg = MODE_CONFIGS[request.param]()
    if cfg.mode == "online":
        online_link(monkeypatch)
    return MODES[cfg.mode], cfg


def context(cfg, tmp_path, workers: int, history: list | None = None) -> RunContext:
    return RunContext(cfg, META, RunDirectory(tmp_path), list(history or []), frozenset(), workers, METRIC)


def test_every_registered_mode_is_covered_here():
    assert {MODE_CONFIGS[c]().mode for c in MODE_CONFIGS} == set(MODES)


def test_mode_is_registered_under_its_name_and_describes_itself(mode_case):
    mode, cfg = mode_case
    assert MODES[mode.name] is mode
    assert isinstance(mode.master_may_train, bool) and isinstance(mode.uses_architectures, bool)
    text = mode.describe(cfg)
    assert isinstance(text, str) and text.strip()
    for workers in (None, 1, 3):
        n = mode.expected_members(cfg, workers)
        assert n is None or (type(n) is int and n > 0)
    assert isinstance(mode.ranks_hint(cfg), str)
    assert isinstance(mode.packs(cfg), bool)
    n = mode.resume_trains(cfg, [], 4)               # nothing ended yet: a resume trains every member
    assert n == 4


def test_mode_preflight_finds_nothing_wrong_with_a_valid_config(mode_case):
    mode, cfg = mode_case
    for meta, groups in ((MODE_META.get(mode.name, META), 3), (None, None)):
        found = Problems()
        mode.preflight(cfg, meta, groups, found)
        assert not found.messages
    notes = mode.notes(cfg, MODE_META.get(mode.name, META))         # a valid config's: nothing to say
    assert notes == []


def test_mode_status_section_reads_a_journal_without_events(mode_case):
    mode, cfg = mode_case
    section = mode.status_section(cfg, [])
    assert section is None or isinstance(section, dict)
    if section is not None:
        json.dumps(section)
        assert all(isinstance(line, str) for line in mode.status_lines(section))


@pytest.mark.parametrize("workers", [1, 3])
def test_mode_makes_a_source_and_a_decider_sized_as_it_expects(mode_case, workers, tmp_path):
    mode, cfg = mode_case
    source, decider = mode.make(context(cfg, tmp_path, workers))
    assert isinstance(source, Source) and isinstance(decider, Decider)
    assert source.total == mode.expected_members(cfg, workers)
    source.bind(hooks())
    decider.bind(hooks())
    specs = hand_out(source)
    assert specs and all(decider.stamp(s)["id"] == s["id"] for s in specs)


class Killed(Exception):
    """The job went down here."""


def run_mode(mode, cfg, tmp_path, run_on: str, history: list | None = None, kill_after: int | None = None):
    """One job of ``cfg`` on a fresh executor, as the session wires it: returns (its journal
    lines, the ids it handed out, the master's account or None when the job died right after
    journalling ``kill_after`` lines, the source)."""
    executor = EXECUTORS[run_on][0]()
    source, decider = mode.make(context(cfg, tmp_path, executor.workers, typed_history(history or [])))
    lines: list[dict] = []

    def journal(new: list[dict]) -> None:
        lines.extend(json.loads(json.dumps(x)) for x in new)          # as read back from the file
        if kill_after is not None and len(lines) >= kill_after:
            raise Killed
    bound = hooks(lambda line: journal([line]), executor.answer, executor_clock(executor))
    source.bind(bound)
    decider.bind(bound)
    issued: list[str] = []
    next_spec = source.next_spec

    def spy_next():
        spec = next_spec()
        if spec is not None:
            issued.append(spec["id"])
        return spec
    source.next_spec = spy_next
    try:
        account = dispatch(executor, source, lambda records: journal([r.to_json() for r in records]),
                           decider=decider, clock=executor_clock(executor))
    except Killed:
        return lines, issued, None, source
    return lines, issued, account, source


@pytest.mark.parametrize("run_on", RUN_ON)
def test_mode_runs_a_new_run_to_its_expected_members(mode_case, run_on, tmp_path):
    mode, cfg = mode_case
    lines, issued, account, source = run_mode(mode, cfg, tmp_path, run_on)
    results = [MemberRecord.from_json(x) for x in lines if "event" not in x]
    expected = mode.expected_members(cfg, EXECUTORS[run_on][0]().workers)
    assert account["results"] == len(results) == len(issued) == len(set(issued))
    assert expected is None or len(results) == expected
    assert sorted(r.id for r in results) == sorted(issued)
    section = source.finish(results)
    assert isinstance(section, dict)
    json.dumps(section)
    pool = mode.selection_pool(cfg, results)        # what `ensemble reselect` chooses among: the run's own
    assert pool is None or (isinstance(pool, frozenset) and pool <= {r.id for r in results if r.ok})
    mode.abandon("a test: the run ended before training")    # nothing began it may not undo


@pytest.mark.parametrize("run_on", RUN_ON)
def test_mode_resumed_from_a_finished_journal_hands_out_nothing(mode_case, run_on, tmp_path):
    mode, cfg = mode_case
    if mode.name == "online":
        pytest.skip("an online run is never finished: resumed, it trains on what the new simulation sends")
    lines, _, account, _ = run_mode(mode, cfg, tmp_path, run_on)
    assert account is not None
    executor = EXECUTORS[run_on][0]()
    source, _ = mode.make(context(cfg, tmp_path, executor.workers, typed_history(lines)))
    source.bind(hooks())
    assert source.next_spec() is None


@pytest.mark.parametrize("kill_after", [1, 3])
@pytest.mark.parametrize("run_on", RUN_ON)
def test_mode_killed_and_resumed_trains_each_member_it_expects_once(mode_case, run_on, kill_after, tmp_path):
    mode, cfg = mode_case
    if run_on != "serial" and mode.name == "pbt":
        pytest.skip("a simulated worker trains a resumed population member from round 1, not from the round it "
                    "restores (ensemble.simulate never resumes a run)")
    if mode.name == "online":
        pytest.skip("online members are no fixed list: one out when the job died is not handed out again, a "
                    "new one trains on the buffer as it then is (tests/mpi/test_online_mpi.py resumes one)")
    lines, first, account, _ = run_mode(mode, cfg, tmp_path, run_on, kill_after=kill_after)
    assert account is None and len(lines) >= kill_after, "the job died half-way"
    finished = {x["id"] for x in lines if "event" not in x and x["status"] in ("ok", "discarded")}
    _, second, account, _ = run_mode(mode, cfg, tmp_path, run_on, history=lines)
    assert account is not None
    assert not finished & set(second), "a finished member is not trained again"
    assert set(first) - finished <= set(second), "a member out when the job died goes out again"
    expected = mode.expected_members(cfg, EXECUTORS[run_on][0]().workers)
    assert expected is None or len(finished | set(second)) == expected


@pytest.mark.parametrize("run_on", ["serial", "sim"])
def test_a_population_journals_every_round(run_on, tmp_path):
    cfg = pbt_cfg()
    lines, _, account, source = run_mode(MODES["pbt"], cfg, tmp_path, run_on)
    rounds = [x["round"] for x in lines if x.get("event") == "pbt_round"]
    assert rounds == list(range(1, cfg.pbt.rounds + 1))
    assert source.finish([])["pbt"]["rounds"] == cfg.pbt.rounds
