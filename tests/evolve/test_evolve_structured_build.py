"""Every genome of the structured space builds with Keras and trains: a property test over
seeds for each kind of input (a 1-D sequence, a 2-D image, a flat table). Drawn genomes
(from the whole space and compact), their mutants and the templates go through the members' own path (``decode`` ->
``ensemble.train.architecture.build_layers``), train one batch, and have exactly the
parameters ``evolve.decode`` counted, so ``search.max_params`` holds for the real model.
Tiny inputs and eager steps keep it to a few seconds after TensorFlow's import."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evolve import SearchSpace, count_params, decode, mutate, random_genome, templates
from evolve.templates import templates_for

pytestmark = pytest.mark.slow        # TensorFlow training: in `make test`, not in test-fast's minute

#: one sample's shape for each kind of input
SHAPES = {"sequence": (16, 2), "image": (6, 6, 1), "table": (5,)}
SEEDS = 5
CLASSES = 3


@pytest.fixture(scope="module")
def keras_step():
    """Build, count and train one batch; TensorFlow imported once for the module."""
    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(1)
    from ensemble.train.architecture import build_layers, make_optimizer

    def step(genome, shape: tuple[int, ...], space: SearchSpace) -> float:
        model = build_layers(decode(genome, shape, space, CLASSES), shape, CLASSES, "classification")
        assert model.count_params() == count_params(genome, shape, CLASSES), genome.summary(shape)
        model.compile(optimizer=make_optimizer(genome.optimizer, genome.learning_rate),
                      loss="sparse_categorical_crossentropy", run_eagerly=True)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(4, *shape)).astype("float32")
        y = np.array([0, 1, 2, 0])
        loss = model.train_on_batch(x, y)
        return float(loss[0] if isinstance(loss, (list, tuple)) else loss)
    return step


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_every_drawn_and_mutated_structured_genome_builds_and_trains_a_batch(kind, keras_step):
    shape = SHAPES[kind]
    space = SearchSpace.from_config({"space": "structured", "filters": [4, 16], "units": [4, 32],
                                     "max_params": 20_000}, input_rank=len(shape))
    genomes = []
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        g = random_genome(rng, space, shape, CLASSES)
        genomes += [g, mutate(g, rng, space, shape, CLASSES), random_genome(rng, space, shape, CLASSES, compact=True)]
    start = templates(space, shape, CLASSES)
    genomes += start
    assert len({g.key() for g in genomes}) == len(genomes) == 3 * SEEDS + len(start)
    for g in genomes:
        assert math.isfinite(keras_step(g, shape, space)), g.summary(shape)


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_the_free_spaces_templates_build_and_train_too(kind, keras_step):
    shape = SHAPES[kind]
    space = SearchSpace.from_config({}, input_rank=len(shape))
    found = templates(space, shape, CLASSES)
    assert len(found) == len(templates_for(shape))
    for g in found:
        assert math.isfinite(keras_step(g, shape, space)), g.summary(shape)
