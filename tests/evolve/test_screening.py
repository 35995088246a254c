"""Children screened ahead by a helper process (evolve.screening, ``evolve.surrogate_ahead``):
never a genome asked twice, the twin follows the master, stale children dropped, a helper
that fails or is left alone ends, and the settings resolve."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from evolve import STRATEGIES, SearchSpace, make_strategy, random_genome
from evolve import screening as S
from evolve.structured import StructuredGenome
from evolve.surrogate import Surrogate
from tests.evolve.conftest import synthetic_fitness

SHAPE = (32, 1)


def space_for(kind: str = "structured") -> SearchSpace:
    return SearchSpace.from_config({"space": kind, "max_params": 50_000, "max_depth": 5}, input_rank=2)


def fitness(g) -> float:
    return synthetic_fitness(g.to_genome() if isinstance(g, StructuredGenome) else g)


def wait_for(condition, seconds: float = 60.0) -> None:
    """Poll until ``condition()`` (the helper works in its own time); fail after ``seconds``."""
    until = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < until, "the screening helper did not answer"
        time.sleep(0.02)


def strategy(name: str, kind: str = "structured", seed: int = 0, evaluations: int = 60, ahead: int = 6,
             helpers: int = 1):
    space = space_for(kind)
    params = {"regularized": {"population_size": 4, "sample_size": 2}, "mu_plus_lambda": {"mu": 4, "lambda_": 4},
              "nsga2": {"population_size": 4}, "random": {}}[name]
    sur = Surrogate(space, SHAPE, 2, candidates=4, min_results=4, seed=seed, trees=4)
    st = make_strategy(name, space, SHAPE, 2, rng_seed=seed, budget_evaluations=evaluations, **params)
    st.attach(S.Ahead(st, sur, ahead, helpers))
    return st


def run(st, in_flight: int = 3, wait: bool = True, every_helper: bool = False) -> list:
    """Ask and tell until done, ``in_flight`` out at once; with ``wait``, each bred ask once the
    surrogate has its results waits for the helper to have a child ready (so the test does not
    depend on how fast the helper is); with ``every_helper``, the first such ask waits until
    every helper has sent children (one started late on a loaded machine had sent none when the
    other had served the whole search)."""
    asked, out, waited = [], [], not every_helper
    while not st.done():
        if wait and st.breeder() is not None and st.told >= 4:
            if not waited:
                wait_for(lambda: all(h.state or h.failed for h in st.ahead.helpers))
                waited = True
            wait_for(lambda: st.ahead.ready or st.ahead.failed is not None)
        g = st.ask()
        if g is not None:
            asked.append(g)
            out.append(g)
        if g is None or len(out) > in_flight:
            x = out.pop(0)
            st.tell(x, fitness(x), (fitness(x), 0.0))
    return asked


@pytest.mark.parametrize("name", ["regularized", *(pytest.param(n, marks=pytest.mark.slow)
                                                  for n in STRATEGIES if n != "regularized")])
def test_children_screened_ahead_are_new_and_most_bred_asks_get_one(name):
    """Every strategy (its ``breeder`` and ``lineage``, the contract a twin breeds by)."""
    st = strategy(name, seed=3)
    try:
        asked = run(st)
        assert len({g.key() for g in asked}) == len(asked) == 60        # never a genome asked twice
        counts = st.ahead.counts
        if name == "random":                                            # nothing bred: nothing screened
            assert counts["served"] == 0 and st.breeder() is None
            return
        assert counts["served"] >= 20, counts                           # the helper did the screening
        state = st.state()
        assert state["surrogate_fits"] >= 1 and state["surrogate_served"] == counts["served"]
        for g in asked[4:]:                  # a bred child's parent (weight inheritance) was asked before
            parent = st.parent_of(g)
            assert parent is None or parent.key() in {x.key() for x in asked}
    finally:
        st.close()
    assert all(h.proc.poll() == 0 for h in st.ahead.helpers)                                     # it ended when told to


@pytest.mark.slow
def test_two_helpers_breed_their_own_children_and_each_is_asked_once():
    st = strategy("regularized", seed=6, evaluations=60, ahead=8, helpers=2)
    try:
        asked = run(st, every_helper=True)
        assert len({g.key() for g in asked}) == len(asked) == 60
        assert st.ahead.counts["served"] >= 20 and all(h.state for h in st.ahead.helpers)   # both screened
        state = st.state()
        assert state["surrogate_helpers"] == 2
        assert state["surrogate_screens"] == sum(h.state["surrogate_screens"] for h in st.ahead.helpers)
    finally:
        st.close()


@pytest.mark.slow
def test_the_twin_is_told_the_masters_results_and_refits_on_them():
    st = strategy("regularized", seed=1, evaluations=80, ahead=8)
    try:
        run(st, in_flight=1)
        helper = st.ahead.state()                 # as the helper last sent it, with a batch of children
        assert helper["surrogate_results"] >= 60 and helper["surrogate_fits"] >= 4
        assert helper["surrogate_fitted_on"] <= helper["surrogate_results"] <= st.told
    finally:
        st.close()


@pytest.mark.slow
def test_a_child_of_an_earlier_generation_is_dropped():
    st = strategy("mu_plus_lambda", seed=2, evaluations=200)
    try:
        st.ahead.ready.append((st.lineage() - 1, random_genome(np.random.default_rng(0), st.space, SHAPE, 2), None, 0))
        assert st.ahead.take(set(), st.lineage()) is None
        assert st.ahead.counts == {"served": 0, "missed": 1, "dropped": 1}
        g = random_genome(np.random.default_rng(1), st.space, SHAPE, 2)
        st.ahead.ready.append((st.lineage(), g, None, 0))
        assert st.ahead.take({g.key()}, st.lineage()) is None           # asked already: dropped too
        st.ahead.ready.append((st.lineage(), g, None, 0))
        assert st.ahead.take(set(), st.lineage()) == (g, None)
    finally:
        st.close()


def test_a_helper_that_fails_leaves_the_master_breeding_plain_children(monkeypatch, caplog):
    monkeypatch.setattr(S.sys, "executable", sys.executable)
    real = S.subprocess.Popen

    def broken(cmd, **kw):                   # a helper that dies at once
        return real([sys.executable, "-c", "import sys; sys.exit(3)"], **kw)
    monkeypatch.setattr(S.subprocess, "Popen", broken)
    st = strategy("regularized", seed=4, evaluations=30)
    try:
        wait_for(lambda: st.ahead.failed is not None)
        asked = run(st, wait=False)
        assert len({g.key() for g in asked}) == 30
        assert st.ahead.counts["served"] == 0 and "status 3" in st.state()["surrogate_failed"]
    finally:
        st.close()
    assert "unscreened" in caplog.text


@pytest.mark.slow
def test_a_helper_whose_master_is_gone_ends():
    st = strategy("regularized", seed=5)
    proc = st.ahead.helpers[0].proc
    proc.stdin.close()                       # what the master's death looks like to it: end of file
    assert proc.wait(timeout=60) == 0


@pytest.mark.slow
def test_a_twin_that_cannot_be_built_says_why():
    st = make_strategy("regularized", space_for(), SHAPE, 2, rng_seed=0, population_size=4, sample_size=2)
    ahead = S.Ahead(st, "not a surrogate", 4)
    try:
        wait_for(lambda: ahead.helpers[0].proc.poll() is not None)
        wait_for(lambda: ahead.failed is not None)
        assert "could not start" in ahead.failed
    finally:
        ahead.close()


def test_the_setting_resolves_by_workers_and_is_checked():
    from ensemble.config import ConfigError
    from ensemble.config.schema import resolve_evolve
    assert S.ahead_children("auto", S.AHEAD_WORKERS - 1) == 0
    assert S.ahead_children("auto", S.AHEAD_WORKERS) == S.AHEAD_CHILDREN
    assert S.ahead_children(0, 10_000) == 0 and S.ahead_children(5, 2) == 5
    assert resolve_evolve({})["surrogate_ahead"] == "auto"
    for bad in (-1, 1.5, True, "soon"):
        with pytest.raises(ConfigError, match="evolve.surrogate_ahead"):
            resolve_evolve({"surrogate_ahead": bad})


def test_choose_many_screens_a_batch_with_one_prediction():
    space = space_for()
    rng = np.random.default_rng(0)
    sur = Surrogate(space, SHAPE, 2, candidates=4, min_results=20, seed=0, trees=16)
    seen = [random_genome(rng, space, SHAPE, 2) for _ in range(120)]
    for g in seen:
        sur.observe(g, fitness(g))
    pool = [random_genome(rng, space, SHAPE, 2) for _ in range(200)]
    pool = list({g.key(): g for g in pool if g.key() not in sur.trained}.values())
    picks = sur.choose_many(pool + seen[:5], 20)
    assert len(set(picks)) == 20 and all(i < len(pool) for i in picks)      # new ones only, distinct
    assert np.mean([fitness(pool[i]) for i in picks]) > np.mean([fitness(g) for g in pool])
    assert sur.choose_many(pool[:3], 20) == [0, 1, 2]                        # fewer than asked: all
