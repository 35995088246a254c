"""SearchSpace.from_config: defaults, and errors that name `search.<key>`."""

import pytest

from evolve import SearchSpace


def test_empty_config_gives_defaults_by_rank():
    flat = SearchSpace.from_config({}, input_rank=1)
    assert flat.layer_types == ("dense", "dropout", "batchnorm")
    img = SearchSpace.from_config({}, input_rank=3)
    assert img.layer_types == ("conv", "maxpool", "dense", "dropout", "batchnorm")
    assert (img.min_depth, img.max_depth, img.max_params) == (1, 6, 2_000_000)
    assert img.unit_choices == (16, 32, 64, 128, 256, 512)
    assert img.filter_choices == (8, 16, 32, 64, 128)
    assert img.skip_connections is True


def test_minimal_config_overrides_and_round_trips():
    d = {"max_depth": 4, "units": [32, 100], "max_params": 2e6, "dropout": [0, 0.3],
         "optimizers": ["adam"], "batch_size": [64, 32, 32]}
    s = SearchSpace.from_config(d, input_rank=2)
    assert s.max_depth == 4 and s.unit_choices == (32, 64) and s.max_params == 2_000_000
    assert s.batch_size == (32, 64) and s.dropout == (0.0, 0.3)
    assert SearchSpace.from_config(s.to_config(), input_rank=2) == s
    assert set(s.to_config()) == SearchSpace.KEYS


def test_max_depth_below_min_depth_message():
    with pytest.raises(ValueError) as e:
        SearchSpace.from_config({"max_depth": 0}, input_rank=3)
    assert str(e.value) == "`search.max_depth` must be >= `search.min_depth` (1), but got 0"


@pytest.mark.parametrize("d, key", [
    ({"bogus": 1}, "search.bogus"),
    ({"units": [512, 16]}, "search.units"),
    ({"units": [33, 63]}, "search.units"),
    ({"filters": 8}, "search.filters"),
    ({"min_depth": 0}, "search.min_depth"),
    ({"min_depth": 2.5}, "search.min_depth"),
    ({"dropout": [0.2, 1.0]}, "search.dropout"),
    ({"learning_rate": [0, 1e-2]}, "search.learning_rate"),
    ({"learning_rate": [1e-2]}, "search.learning_rate"),
    ({"activations": ["relu", "nope"]}, "search.activations"),
    ({"optimizers": []}, "search.optimizers"),
    ({"layer_types": ["dropout"]}, "search.layer_types"),
    ({"layer_types": "dense"}, "search.layer_types"),
    ({"skip_connections": "yes"}, "search.skip_connections"),
    ({"kernel_sizes": [3, -1]}, "search.kernel_sizes"),
    ({"pool_sizes": [1]}, "search.pool_sizes"),
    ({"batch_size": [True]}, "search.batch_size"),
    ({"max_params": 0}, "search.max_params"),
])
def test_bad_values_name_the_key(d, key):
    with pytest.raises(ValueError, match=f"`{key}`"):
        SearchSpace.from_config(d, input_rank=3)


def test_conv_on_flat_input_is_rejected():
    with pytest.raises(ValueError, match="`search.layer_types`.*'conv'.*rank 1"):
        SearchSpace.from_config({"layer_types": ["conv", "dense"]}, input_rank=1)


@pytest.mark.parametrize("rank", [0, 5, True])
def test_bad_input_rank(rank):
    with pytest.raises(ValueError, match="rank"):
        SearchSpace.from_config({}, input_rank=rank)


def test_every_problem_of_a_search_table_is_listed_at_once():
    """``check`` listed one `search.*` problem a run (five edits to see five): all of them now,
    and those that need no data before the data is read (``problems``)."""
    from evolve.space import SpaceError
    d = {"units": [64, 16], "dropout": [0.0, 1.2], "layer_types": ["conv", "lstm"],
         "learning_rate": [0.1, 0.001], "pool_sizes": [1]}
    with pytest.raises(SpaceError) as e:
        SearchSpace.from_config(d, input_rank=1)
    keys = ["units", "dropout", "layer_types", "learning_rate", "pool_sizes"]
    assert len(e.value.problems) == 5 and all(any(f"`search.{k}`" in p for p in e.value.problems) for k in keys)
    assert SearchSpace.problems(d) == e.value.problems
    flat = SearchSpace.problems({"layer_types": ["conv", "dense"]})      # needs the rank: left to from_config
    assert flat == []
    with pytest.raises(SpaceError, match=r"data.reshape"):
        SearchSpace.from_config({"layer_types": ["conv", "dense"]}, input_rank=1)
