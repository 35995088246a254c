"""Shared fixtures for the evolve tests: spaces, a synthetic fitness, a driver loop."""

from __future__ import annotations

import math

import pytest

from evolve import Genome, SearchSpace


def synthetic_fitness(g: Genome) -> float:
    """Structured toy objective, best (0.0) at 3 convs, 1 dense of 128 units,
    lr 1e-3 and adam. Higher is better."""
    convs = sum(x.kind == "conv" for x in g.layers)
    dense = [x for x in g.layers if x.kind == "dense"]
    units = dense[0].get("units") if dense else 1
    return (-abs(convs - 3) - abs(len(dense) - 1) - 0.5 * abs(math.log2(units) - 7)
            - abs(math.log10(g.learning_rate) + 3) - 0.5 * (g.optimizer != "adam"))


def drive(strategy, fitness=synthetic_fitness, parallel: int = 1, max_rounds: int = 10_000):
    """Ask up to ``parallel`` genomes, tell them all (in ask order); repeat until done.

    Returns the journal records in tell order; each also carries ``_round``, the
    index of the ask/tell round it belongs to (a resume point lies between rounds)."""
    records = []
    for rnd in range(max_rounds):
        if strategy.done():
            break
        batch = []
        for _ in range(parallel):
            g = strategy.ask()
            if g is None:
                break
            batch.append(g)
        assert batch, "strategy neither done nor asking"
        for g in batch:
            f = fitness(g)
            strategy.tell(g, f)
            records.append({"genome": g.to_dict(), "fitness": f, "objectives": None,
                            "_round": rnd})
    return records


@pytest.fixture
def image_space() -> SearchSpace:
    return SearchSpace.from_config({"space": "free"}, input_rank=3)


@pytest.fixture
def flat_space() -> SearchSpace:
    return SearchSpace.from_config({"space": "free"}, input_rank=1)


@pytest.fixture(scope="session")
def fitness():
    return synthetic_fitness


@pytest.fixture(name="drive", scope="session")
def drive_fixture():
    return drive
