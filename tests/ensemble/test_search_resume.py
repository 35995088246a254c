"""Evolve resume without MPI: the real SearchSource and master loop (``dispatch``) on a fake
executor whose members "train" instantly to a metric that depends on the genome only. A
run is killed at some point, its journal lines kept; a new source built from them must go
on as the uninterrupted run did: same ids, genomes, seeds and results in the same order."""

from __future__ import annotations

import json
import time
import zlib
from collections import deque

import pandas as pd
import pytest

from ensemble.config import resolve_config
from ensemble.orchestrate.dispatch import dispatch
from ensemble.results.journal import typed_history as history_of
from ensemble.results.records import MemberRecord
from ensemble.results.rundir import RunDirectory
from ensemble.sources.base import Hooks
from ensemble.sources.search import SearchSource
from evolve import STRATEGIES

META = {"task": "classification", "input_shape": [8, 8, 1], "n_outputs": 10}
SEARCH = {"space": "free", "max_depth": 2, "filters": [4, 8], "units": [8, 32]}
PARAMS = {"regularized": {"population_size": 4, "sample_size": 2},
          "mu_plus_lambda": {"mu": 3, "lambda_": 4},
          "nsga2": {"population_size": 4},
          "random": {}}
EVALUATIONS = 16


class Killed(Exception):
    """The job went down here."""


def rundir(path) -> RunDirectory:
    path.mkdir(parents=True, exist_ok=True)
    return RunDirectory(path)


def config(name: str) -> dict:
    return resolve_config({"mode": "evolve", "seed": 7, "search": SEARCH,
                           "evolve": {"strategy": name, "evaluations": EVALUATIONS, **PARAMS[name]}})


def outcome(spec: dict) -> dict:
    """What training ``spec`` gives: a pure function of its genome and seed (as real training
    is), a failure now and then; how long it takes, from its id."""
    h = zlib.crc32(json.dumps([spec["genome"], spec["seed"]], sort_keys=True).encode())
    record = {"id": spec["id"], "genome": spec["genome"], "summary": spec["summary"], "seed": spec["seed"],
              "params": 100 + h % 5000, "seconds": 1 + zlib.crc32(spec["id"].encode()) % 4}
    if h % 5 == 0 or spec["id"] == "e0004":      # and one for sure, whatever the search breeds
        return {**record, "status": "failed", "error": {"kind": "RuntimeError", "message": "boom"}}
    return {**record, "status": "ok", "val": {"accuracy": 0.5 + (h % 1000) / 2000},
            "test": {"accuracy": 0.5 + (h % 997) / 2000}}


class FakeExecutor:
    """``workers`` workers holding up to ``in_hand`` specs each, on a virtual clock;
    ``kill_after`` results: the next wait raises ``Killed``."""

    idle_seconds = None
    report_bytes = 0

    def __init__(self, workers: int, in_hand: int, kill_after: int | None = None):
        self.workers, self.in_hand, self.kill_after = workers, in_hand, kill_after
        self.held = [deque() for _ in range(workers)]
        self.start = [0.0] * workers          # when each worker started its current spec
        self.now, self.results = 0.0, 0

    def free(self) -> int:
        return sum(self.in_hand - len(h) for h in self.held)

    def submit(self, spec: dict) -> None:
        w = max(range(self.workers), key=lambda i: (self.in_hand - len(self.held[i]), -i))
        if not self.held[w]:
            self.start[w] = self.now
        self.held[w].append(spec)

    def busy(self) -> int:
        return sum(len(h) for h in self.held)

    def wait(self, decide, idle=None) -> list[dict]:
        if self.kill_after is not None and self.results >= self.kill_after:
            raise Killed
        ends = [(self.start[w] + outcome(h[0])["seconds"], w) for w, h in enumerate(self.held) if h]
        end, w = min(ends)
        result = {**outcome(self.held[w].popleft()), "worker": w}
        self.now = self.start[w] = end
        self.results += 1
        return [result]

    def shutdown(self) -> None:
        pass

    def tail(self, dry: bool) -> None:
        pass


def run(source: SearchSource, lines: list, executor: FakeExecutor, kill_in_journal: int | None = None) -> None:
    """The master's side as ``orchestrate.session`` wires it: issued lines and results to
    ``lines`` (the journal); ``kill_in_journal``: killed just after that many results were
    journalled, before the next candidates went out."""
    source.bind(Hooks(event=lines.append, answer=lambda spec_id, decision: None, deadline=lambda: None,
                      clock=time.time))
    count = [0]

    def on_results(results: list) -> None:
        lines.extend(json.loads(json.dumps(r.to_json())) for r in results)     # as read back from the file
        count[0] += len(results)
        if count[0] == kill_in_journal:
            raise Killed
    try:
        dispatch(executor, source, on_results)
    except Killed:
        pass


def path(lines: list[dict]) -> list[tuple]:
    """What must not change: each journal line's meaning, in order (times left out)."""
    out = []
    for x in lines:
        if x.get("event") == "issued":
            out.append(("issued", x["id"], x["evaluation"], x["seed"], x["told"], json.dumps(x["genome"])))
        else:
            out.append((x["id"], x["status"], x.get("val"), x["seed"], json.dumps(x["genome"]),
                        x["search"]["evaluation"], x["search"]["fitness"]))
    return out


def state(s) -> dict:
    """Everything that decides what the strategy asks next."""
    out = {"asked": s.asked, "told": s.told, "failed": s.failed, "pending": sorted(s._pending),
           "seen": sorted(s._seen), "results": s.results, "best": s.best and (s.best[0].key(), s.best[1])}
    for name in ("population", "parents"):
        if hasattr(s, name):
            out[name] = [(g.key(), *rest) for g, *rest in getattr(s, name)]
    if hasattr(s, "parents"):
        out.update(generation=s.generation, issued=s._issued, outstanding=sorted(s._outstanding))
    return out


def uninterrupted(tmp_path, name: str, workers: int = 1, in_hand: int = 2) -> list[dict]:
    lines: list[dict] = []
    run(SearchSource(config(name), META, rundir(tmp_path / "full"), []), lines, FakeExecutor(workers, in_hand))
    return lines


def test_every_strategy_is_tested():
    assert set(PARAMS) == set(STRATEGIES)


@pytest.mark.parametrize("name", sorted(PARAMS))
@pytest.mark.parametrize("kill", ["training", "journalled"])
@pytest.mark.parametrize("in_hand", [1, 2])
def test_killed_and_resumed_search_equals_the_uninterrupted_one(tmp_path, name, kill, in_hand):
    full = uninterrupted(tmp_path, name, in_hand=in_hand)
    records = [x for x in full if "event" not in x]
    assert [r["id"] for r in records] == [f"e{i:04d}" for i in range(1, EVALUATIONS + 1)]
    assert {r["status"] for r in records} == {"ok", "failed"}
    for k in range(1, EVALUATIONS, 3):
        lines: list[dict] = []
        killed = SearchSource(config(name), META, rundir(tmp_path / f"k{k}"), [])
        if kill == "training":             # while members train: in_hand of them out
            run(killed, lines, FakeExecutor(1, in_hand, kill_after=k))
        else:                              # between a result's line and the next issued line
            run(killed, lines, FakeExecutor(1, in_hand), kill_in_journal=k)
        resumed = SearchSource(config(name), META, rundir(tmp_path / f"k{k}"), history_of(lines))
        assert state(resumed.strategy) == state(killed.strategy), k
        out = [x["id"] for x in lines if x.get("event") == "issued"][k:]
        assert [x["id"] for x in resumed.reissue] == out       # in flight at the kill
        run(resumed, lines, FakeExecutor(1, in_hand))
        assert path(lines) == path(full), k
        assert resumed.strategy.done() and resumed.strategy.asked == EVALUATIONS


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_resumed_twice_writes_the_same_search_table(tmp_path, name):
    full = uninterrupted(tmp_path, name)
    reference = SearchSource(config(name), META, rundir(tmp_path / "full"), history_of(full))
    reference.finish([MemberRecord.from_json(x) for x in full if "event" not in x])
    lines: list[dict] = []
    run(SearchSource(config(name), META, rundir(tmp_path / "r"), []), lines, FakeExecutor(1, 2, kill_after=4))
    run(SearchSource(config(name), META, rundir(tmp_path / "r"), history_of(lines)), lines,
        FakeExecutor(1, 2, kill_after=4))
    source = SearchSource(config(name), META, rundir(tmp_path / "r"), history_of(lines))
    run(source, lines, FakeExecutor(1, 2))
    source.finish([MemberRecord.from_json(x) for x in lines if "event" not in x])
    a, b = (pd.read_csv(tmp_path / d / "search.csv").drop(columns="wall_seconds") for d in ("full", "r"))
    pd.testing.assert_frame_equal(a, b)
    assert len(b) == EVALUATIONS


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_with_more_workers_the_in_flight_candidates_go_out_again_as_they_were(tmp_path, name):
    """Arrival order depends on timing here, so the path after the kill may differ; what
    holds: the strategy is where the killed master left it, the candidates out at the kill
    are trained with their journalled id, genome and seed, none is bred twice, and the
    budget is the same."""
    lines: list[dict] = []
    killed = SearchSource(config(name), META, rundir(tmp_path), [])
    run(killed, lines, FakeExecutor(3, 2, kill_after=5))
    issued = {x["id"]: x for x in lines if x.get("event") == "issued"}
    out = [i for i in issued if i not in {x["id"] for x in lines if "event" not in x}]
    assert len(out) >= 2
    resumed = SearchSource(config(name), META, rundir(tmp_path), history_of(lines))
    assert state(resumed.strategy) == state(killed.strategy)
    run(resumed, lines, FakeExecutor(3, 1))                  # fewer in hand: some go out later
    records = {x["id"]: x for x in lines if "event" not in x}
    assert sorted(records) == [f"e{i:04d}" for i in range(1, EVALUATIONS + 1)]
    assert len([x for x in lines if "event" not in x]) == EVALUATIONS          # none trained twice
    for i in out:
        assert records[i]["genome"] == issued[i]["genome"] and records[i]["seed"] == issued[i]["seed"]
    assert len([x for x in lines if x.get("event") == "issued"]) == EVALUATIONS  # each issued once


def test_a_journal_without_issued_lines_still_resumes(tmp_path):
    """Runs journalled before issued lines existed: their records are replayed as before
    (the candidates that were out are bred anew), and a member trained again after its
    artifacts were lost is told once."""
    lines = uninterrupted(tmp_path, "regularized")
    records = [x for x in lines if "event" not in x][:6]
    again = SearchSource(config("regularized"), META, rundir(tmp_path), history_of(records + [records[2]]))
    assert again.strategy.told == again.strategy.asked == 6 and not again.reissue
    assert again.count == 6
    spec = again.next_spec()
    assert spec["id"] == "e0007"


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_a_candidate_given_up_after_lost_jobs_is_told_failed_and_not_handed_out_again(tmp_path, name):
    """``results.crashes``: a search's candidate in flight at lost jobs is given up on resume
    (its record journalled with the genome of its issued line): the resumed search tells its
    strategy the failure and re-issues only the others that were out."""
    from ensemble.results.crashes import CrashBook, with_genomes
    lines: list[dict] = []
    run(SearchSource(config(name), META, rundir(tmp_path / "k"), []), lines, FakeExecutor(1, 3, kill_after=5))
    history = history_of(lines)
    told = {r.id for r in history if isinstance(r, MemberRecord)}
    out = [x.data["id"] for x in history if not isinstance(x, MemberRecord) and x.data["id"] not in told]
    assert len(out) >= 2                                    # candidates out when the job went down
    given_up = with_genomes(CrashBook({}, [out[0]]).records(), history)
    resumed = SearchSource(config(name), META, rundir(tmp_path / "k"), history + given_up)
    assert [x["id"] for x in resumed.reissue] == out[1:]
    assert resumed.strategy.failed >= 1 and resumed.strategy.told == len(told) + 1
    more: list[dict] = []
    run(resumed, more, FakeExecutor(1, 2))
    assert out[0] not in {x["id"] for x in more}             # never handed out again
    assert {x["id"] for x in more if "event" not in x} >= set(out[1:])
    # every candidate out given up (lost together, REPEATS times): the next is numbered after
    # them all, never with the number of one given up (it was, and the journal had two e0002s)
    every = with_genomes(CrashBook({}, out).records(), history)
    assert all(r.extra["search"]["evaluation"] == int(r.id[1:]) for r in every)   # a row in search.csv
    again = SearchSource(config(name), META, rundir(tmp_path / "k"), history + every)
    assert not again.reissue and again.next_spec()["id"] == f"e{max(int(i[1:]) for i in out) + 1:04d}"


def test_the_search_line_names_the_best_candidate_as_the_leaderboard_ranks_it(tmp_path):
    """Candidates tied on the metric (val accuracy 1.0): the console's "search: best ..." named the
    earliest, the leaderboard (and the ensemble) the one of better log loss, a bred one."""
    from ensemble.results.records import SEARCH, search_entry
    source = SearchSource(config("regularized"), META, rundir(tmp_path), [])
    n = source.population_size + 2
    rows = [MemberRecord.from_json({"id": f"e{i:04d}", "status": "ok", "summary": "net",
                                    "val": {"accuracy": 1.0, "log_loss": 0.5 if i < n else 0.01},
                                    "test": {"accuracy": 1.0}, SEARCH: search_entry(i, float(i), 1.0)})
            for i in range(1, n + 1)]
    out = source.compare(rows)
    assert out["initial_best"]["id"] == "e0001" and out["search_best"]["id"] == f"e{n:04d}"
