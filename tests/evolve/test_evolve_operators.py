"""Operators keep genomes valid, depend only on the Generator, and select sensibly."""

import random

import numpy as np
import pytest

from evolve import Genome, LayerGene, SearchSpace, analyse, check, decode
from evolve.operators import crossover, mutate, random_genome, tournament

SHAPES = [(32, 32, 3), (20,), (64, 3), (8, 8, 8, 1), (5, 5, 1)]


def assert_valid(g, shape, space):
    assert isinstance(g, Genome)
    assert check(g, shape, 10, space) is None
    a = analyse(g, shape, 10)
    layers = decode(g, shape, space, 10)
    assert layers == a.layers and len(a.shapes) == len(layers)
    assert len(a.shapes[-1]) == 1  # the output layer sees a flat vector
    for layer, out in zip(layers, a.shapes):
        if "filters" in layer:
            assert out[-1] == layer["filters"] and len(out) == len(shape)
        if layer["type"] == "Dense":
            assert out == (layer["units"],)
    assert min(min(s) for s in a.shapes) >= 1


@pytest.mark.parametrize("shape", SHAPES)
def test_operators_keep_genomes_valid(shape):
    space = SearchSpace.from_config({"space": "free", "max_params": 500_000}, input_rank=len(shape))
    for seed in range(25):
        rng = np.random.default_rng(seed)
        a = random_genome(rng, space, shape, 10)
        b = random_genome(rng, space, shape, 10)
        assert_valid(a, shape, space)
        for _ in range(8):
            child = mutate(a, rng, space, shape, 10)
            assert child != a
            assert_valid(child, shape, space)
            c1, c2 = crossover(a, child, rng, space, shape, 10)
            assert_valid(c1, shape, space)
            assert_valid(c2, shape, space)
            a = c1
        assert_valid(b, shape, space)


def test_random_genomes_cover_the_space(image_space):
    rng = np.random.default_rng(0)
    gs = [random_genome(rng, image_space, (32, 32, 3), 10) for _ in range(200)]
    assert len({g.key() for g in gs}) == 200
    kinds = {x.kind for g in gs for x in g.layers}
    assert kinds == set(image_space.layer_types)
    assert {g.depth for g in gs} >= {1, 2, 3, 4, 5}
    assert {g.optimizer for g in gs} == set(image_space.optimizers)


def test_operators_depend_only_on_the_generator(image_space):
    def run(seed):
        rng = np.random.default_rng(seed)
        a = random_genome(rng, image_space, (32, 32, 3), 10)
        b = mutate(a, rng, image_space, (32, 32, 3), 10)
        return a, b, crossover(a, b, rng, image_space, (32, 32, 3), 10)

    before = random.getstate()
    random.seed(1)
    first = run(3)
    random.seed(2)
    assert run(3) == first and run(4) != first
    random.setstate(before)


def test_python_random_state_is_restored(image_space):
    random.seed(42)
    expected = random.random()
    random.seed(42)
    rng = np.random.default_rng(0)
    a = random_genome(rng, image_space, (32, 32, 3), 10)
    crossover(a, mutate(a, rng, image_space, (32, 32, 3), 10), rng, image_space, (32, 32, 3), 10)
    tournament([1, 2, 3], [0.1, 0.2, 0.3], 2, rng)
    assert random.random() == expected


def test_crossover_of_one_layer_genomes(flat_space):
    rng = np.random.default_rng(0)
    one = Genome(layers=(LayerGene.make("dense", units=32, activation="relu", residual=False),))
    two = random_genome(rng, flat_space, (20,), 10)
    for _ in range(20):
        for child in crossover(one, two, rng, flat_space, (20,), 10):
            assert check(child, (20,), 10, flat_space) is None


def test_tournament():
    rng = np.random.default_rng(0)
    items = list("abcdef")
    fits = [0.1, 0.5, None, 0.3, float("nan"), 0.2]
    assert tournament(items, fits, 200, rng) == "b"  # the best almost surely sampled
    wins = [tournament(items, fits, 1, rng) for _ in range(600)]
    assert set(wins) == set(items)  # k=1 is uniform sampling
    wins = [tournament(items, fits, 3, rng) for _ in range(600)]
    assert wins.count("b") > wins.count("d") > wins.count("a")
    assert all(tournament(["x", "y"], [None, 1.0], 2, rng) in "xy" for _ in range(10))
    with pytest.raises(ValueError):
        tournament([], [], 2, rng)


def test_space_that_admits_nothing_raises_a_clear_error():
    space = SearchSpace.from_config({"space": "free", "max_params": 10}, input_rank=3)
    with pytest.raises(ValueError, match="search.max_params"):
        random_genome(np.random.default_rng(0), space, (32, 32, 3), 10)
