"""The surrogate that screens bred children (evolve.surrogate): features of both genome kinds,
never a genome sent twice, fits in batches, replay rebuilds it, and a search runs with it on."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest

from evolve import SearchSpace, make_strategy, random_genome
from evolve.structured import StructuredGenome
from evolve.surrogate import Featurizer, Surrogate
from tests.evolve.conftest import synthetic_fitness

SHAPES = {1: (12,), 2: (32, 1), 3: (12, 12, 1)}


def space_for(kind: str, rank: int) -> SearchSpace:
    return SearchSpace.from_config({"space": kind, "max_params": 50_000, "max_depth": 5}, input_rank=rank)


def fitness(g) -> float:
    """Toy objective over any genome kind (the lowered layer list)."""
    return synthetic_fitness(g.to_genome() if isinstance(g, StructuredGenome) else g)


@pytest.mark.parametrize("kind", ["free", "structured"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_features_of_both_spaces_are_finite_and_fixed_length(kind, rank):
    space, shape = space_for(kind, rank), SHAPES[rank]
    feats = Featurizer(space, shape, 3)
    rng = np.random.default_rng(rank)
    rows = np.array([feats(random_genome(rng, space, shape, 3)) for _ in range(40)])
    assert rows.shape == (40, len(feats.names)) and np.isfinite(rows).all()
    assert len(np.unique(rows, axis=0)) > 20                  # genomes that differ read differently
    if rank > 1:
        assert rows[:, feats.names.index("n_conv")].max() >= 1
    assert rows[:, feats.names.index("log10_params")].min() > 0      # the parameter count is read


def test_a_structured_genome_reads_as_the_layers_it_lowers_to():
    space, shape = space_for("structured", 2), SHAPES[2]
    feats = Featurizer(space, shape, 4)
    rng = np.random.default_rng(0)
    for _ in range(20):
        g = random_genome(rng, space, shape, 4)
        assert isinstance(g, StructuredGenome)
        np.testing.assert_array_equal(feats(g), feats(g.to_genome()))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["free", "structured"])
@pytest.mark.parametrize("strategy", ["regularized", "mu_plus_lambda"])
def test_the_surrogate_never_sends_a_genome_already_trained(kind, strategy):
    """Over many seeds: every genome asked is new (never asked or told before), screening on."""
    space, shape = space_for(kind, 2), SHAPES[2]
    params = {"population_size": 4, "sample_size": 2} if strategy == "regularized" else {"mu": 4, "lambda_": 4}
    screened = 0
    for seed in range(6):
        sur = Surrogate(space, shape, 2, candidates=8, min_results=5, seed=seed, trees=8)
        st = make_strategy(strategy, space, shape, 2, rng_seed=seed, budget_evaluations=40, surrogate=sur, **params)
        trained: set[str] = set()
        while not st.done():
            g = st.ask()
            assert g is not None
            assert g.key() not in trained, f"seed {seed}: {g.key()} was trained already"
            trained.add(g.key())
            st.tell(g, fitness(g))
        screened += sur.stats["screens"]
        assert len(trained) == 40
    assert screened > 100                         # the screen was really used


def test_choose_skips_trained_candidates():
    space, shape = space_for("free", 2), SHAPES[2]
    sur = Surrogate(space, shape, 2, candidates=4, min_results=3, trees=4)
    rng = np.random.default_rng(1)
    genomes = list({g.key(): g for g in (random_genome(rng, space, shape, 2) for _ in range(12))}.values())
    for g in genomes[:8]:
        sur.observe(g, fitness(g))
    assert sur.choose([genomes[0], genomes[1], genomes[9], genomes[2]]) == 2
    with pytest.raises(ValueError, match="trained already"):
        sur.choose(genomes[:3])
    assert sur.choose(genomes[8:12]) in (0, 1, 2, 3)


def test_fits_come_in_batches_and_learn_the_fitness():
    space, shape = space_for("free", 2), SHAPES[2]
    sur = Surrogate(space, shape, 2, candidates=12, min_results=16, trees=16)
    assert [sur.boundary(n) for n in (0, 15, 16, 23, 24, 100)] == [0, 0, 16, 16, 24, 96]
    rng = np.random.default_rng(2)
    genomes = list({g.key(): g for g in (random_genome(rng, space, shape, 2) for _ in range(260))}.values())
    train, test = genomes[:200], genomes[200:]
    for g in train:
        sur.observe(g, fitness(g))
        if sur.ready:
            sur.predict(test[:1])                 # an ask after every result
    boundaries = {sur.boundary(n) for n in range(16, 201)}
    assert sur.stats["fits"] == len(boundaries) < 30          # refitted per batch, not per result
    mu, sigma = sur.predict(test)
    truth = np.array([fitness(g) for g in test])
    rho = np.corrcoef(np.argsort(np.argsort(mu)), np.argsort(np.argsort(truth)))[0, 1]
    assert rho > 0.5 and (sigma >= 0).all() and sigma.max() > 0


def test_a_failed_result_counts_as_the_worst():
    space, shape = space_for("free", 2), SHAPES[2]
    sur = Surrogate(space, shape, 2, candidates=2, min_results=4, trees=8)
    rng = np.random.default_rng(3)
    genomes = list({g.key(): g for g in (random_genome(rng, space, shape, 2) for _ in range(8))}.values())
    for i, g in enumerate(genomes[:6]):
        sur.observe(g, None if i % 2 else float(i))
    mu, _ = sur.predict(genomes[6:])
    assert np.isfinite(mu).all() and mu.min() >= 0.0 - 1e-9    # worst seen is 0.0, never nan


def test_replay_rebuilds_the_surrogate_and_the_next_asks():
    """Results replayed from a journal refit the same forest: the resumed search asks what the
    uninterrupted one asks."""
    space, shape = space_for("structured", 2), SHAPES[2]

    def make():
        sur = Surrogate(space, shape, 2, candidates=6, min_results=4, seed=7, trees=8)
        return make_strategy("regularized", space, shape, 2, rng_seed=7, budget_evaluations=30,
                             surrogate=sur, population_size=4, sample_size=2)
    first, events = make(), []
    for _ in range(18):
        g = first.ask()
        events.append({"event": "ask", "genome": g.to_dict()})
        first.tell(g, fitness(g))
        events.append({"genome": g.to_dict(), "fitness": fitness(g), "asked": True})
    resumed = make()
    resumed.replay(events)
    for _ in range(6):
        a, b = first.ask(), resumed.ask()
        assert a.key() == b.key()
        first.tell(a, fitness(a))
        resumed.tell(b, fitness(b))


def test_config_rejects_an_unknown_surrogate():
    from ensemble.config import ConfigError
    from ensemble.config.schema import resolve_evolve
    assert resolve_evolve({})["surrogate"] == "off"
    with pytest.raises(ConfigError, match="evolve.surrogate"):
        resolve_evolve({"surrogate": "gp"})
    with pytest.raises(ConfigError, match="evolve.surrogate_min_results"):
        resolve_evolve({"surrogate_min_results": 1})


CONFIG = """
name = "evo-surrogate"
mode = "evolve"
seed = 5
[data]
source = "digits"
reshape = [8, 8, 1]
[train]
epochs = 2
patience = 1
[evolve]
strategy = "regularized"
evaluations = 9
population_size = 3
sample_size = 2
surrogate = "forest"
surrogate_candidates = 6
surrogate_min_results = 3
[search]
space = "structured"
filters = [4, 8]
units = [8, 16]
max_params = 20000
[ensemble]
k = 3
"""


@pytest.mark.mpi
@pytest.mark.long
@pytest.mark.slow
def test_a_search_with_the_surrogate_runs_end_to_end(tmp_path):
    from ensemble.results.journal import read_journal
    from tests.conftest import run_mpi
    cfg = tmp_path / "evo.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    journal = read_journal(run_dir / "journal.jsonl")
    assert sorted(r["id"] for r in journal) == [f"e{i:04d}" for i in range(1, 10)]
    assert len({json.dumps(r["genome"], sort_keys=True) for r in journal}) == 9     # none trained twice
    ens = json.loads((run_dir / "ensemble.json").read_text())
    stats = ens["search"]["surrogate"]
    assert stats["surrogate_results"] == 9 and stats["surrogate_fits"] >= 1
    assert stats["surrogate_screens"] >= 1          # children after the third result were screened
    assert math.isfinite(ens["ensemble"]["test"]["accuracy"])
