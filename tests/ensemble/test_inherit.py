"""Weight inheritance: layers matched in order by kind and shape (an inserted layer shifts
the rest and they still match), the child starts with its parent's weights there; the
strategies remember which evaluated genome each child was bred from."""

from __future__ import annotations

import numpy as np

from ensemble.train.inherit import match_layers


def test_layers_match_as_the_longest_common_subsequence():
    parent = [("Dense", ((64, 32), (32,))), ("Dense", ((32, 16), (16,))), ("Dense", ((16, 10), (10,)))]
    child = [("Dense", ((64, 32), (32,))), ("BatchNormalization", ((32,),) * 4),
             ("Dense", ((32, 16), (16,))), ("Dense", ((16, 10), (10,)))]
    assert match_layers(child, parent) == [(0, 0), (2, 1), (3, 2)]
    widened = [("Dense", ((64, 48), (48,))), ("Dense", ((48, 16), (16,))), ("Dense", ((16, 10), (10,)))]
    assert match_layers(widened, parent) == [(2, 2)]                     # only the head kept its shape
    assert match_layers([], parent) == []


def test_a_child_starts_with_its_parents_weights_in_the_unchanged_layers(tmp_path):
    import keras

    from ensemble.train.architecture import build_layers
    from ensemble.train.inherit import inherit_weights, weighted_layers
    keras.utils.set_random_seed(1)
    parent = build_layers([{"type": "Dense", "units": 12, "activation": "relu"},
                           {"type": "Dense", "units": 8, "activation": "relu"}], (6,), 3, "classification")
    for v in parent.weights:                                              # "trained": anything but the init
        v.assign(np.full(v.shape, 0.5, dtype="float32"))
    path = tmp_path / "parent.keras"
    parent.save(path)
    keras.utils.set_random_seed(2)
    child = build_layers([{"type": "Dense", "units": 12, "activation": "relu"},
                          {"type": "Dense", "units": 5, "activation": "tanh"},          # inserted by mutation
                          {"type": "Dense", "units": 8, "activation": "relu"}], (6,), 3, "classification")
    got = inherit_weights(child, path)
    mine = weighted_layers(child)
    assert len(got["layers"]) == 2 and got["of_layers"] == 4                # the first Dense and the head
    np.testing.assert_array_equal(mine[0].get_weights()[0], np.full((6, 12), 0.5))
    assert not np.allclose(mine[1].get_weights()[0], 0.5)                 # the new layer keeps its init
    assert not np.allclose(mine[2].get_weights()[0], 0.5)                 # (5 -> 8): another shape
    assert got["params"] == 6 * 12 + 12 + 8 * 3 + 3
    gone = inherit_weights(child, tmp_path / "released.keras")
    assert gone["layers"] == [] and "gone" in gone["note"]


def test_strategies_remember_the_parent_of_each_bred_child():
    from evolve import SearchSpace, make_strategy
    space = SearchSpace.from_config({"max_depth": 3, "units": [8, 32]}, input_rank=1)
    strategy = make_strategy("regularized", space, (6,), 3, rng_seed=0, budget_evaluations=30,
                             population_size=4, sample_size=2)
    told = {}
    for _ in range(4):                                                    # the random first population
        g = strategy.ask()
        assert strategy.parent_of(g) is None
        strategy.tell(g, float(len(told)))
        told[g.key()] = g
    for _ in range(10):
        child = strategy.ask()
        parent = strategy.parent_of(child)
        assert parent is not None and parent.key() in told                # bred from an evaluated genome
        strategy.tell(child, 1.0)
        told[child.key()] = child
