"""One vocabulary: config validation, the search space and training accept the same names;
strategies declare their settings, which the config, the search and docs/search.md share."""

from __future__ import annotations

import pytest

from ensemble.config import ConfigError, dump_toml, resolve_config
from ensemble.config.reference import README_END, README_START, strategy_table
from ensemble.config.vocabulary import ACTIVATIONS, OPTIMIZERS, check_input_rank, suggest
from ensemble.results.rundir import RunDirectory
from evolve import STRATEGIES, SearchSpace
from tests.conftest import ROOT

ARCH = [{"name": "a", "layers": [{"type": "Dense", "units": 4}]}]


def test_search_space_and_config_share_the_names():
    space = SearchSpace.from_config({"optimizers": list(OPTIMIZERS), "activations": list(ACTIVATIONS)}, 1)
    assert set(space.optimizers) == set(OPTIMIZERS) and set(space.activations) == set(ACTIVATIONS)
    for name in OPTIMIZERS:
        resolve_config({"train": {"optimizer": name}, "architectures": ARCH})
    for act in ACTIVATIONS:
        resolve_config({"architectures": [{"name": "a", "layers": [{"type": "Dense", "units": 4,
                                                                     "activation": act}]}]})


def test_every_optimizer_and_activation_builds_in_keras():
    keras = pytest.importorskip("keras")
    from ensemble.train.architecture import make_optimizer
    for name in OPTIMIZERS:                        # "adamax" once passed validation and then failed
        assert make_optimizer(name, 1e-3).learning_rate is not None
    for act in ACTIVATIONS:
        keras.layers.Dense(2, activation=act)(keras.Input((3,)))


def test_suggestions_prefer_the_fewest_slips():
    assert suggest("adma", OPTIMIZERS) == " (did you mean 'adam'?)"
    assert suggest("rleu", ACTIVATIONS) == " (did you mean 'relu'?)"
    assert suggest("zzzzzz", OPTIMIZERS) == ""
    keys = ["strategy", "evaluations", "time_limit", "start_from", "surrogate", "surrogate_ahead"]
    assert suggest("time_budget", keys) == " (did you mean 'time_limit'?)"     # the one key with a word in common
    assert suggest("ahead_of_time", keys) == ""                                 # two share a word: no guess
    assert suggest("surrogate_model", keys) == " (did you mean 'surrogate'?)"
    assert suggest("budget", keys) == ""


#: the search's own settings beside the strategy's: early discarding and weight inheritance, off
SEARCH_DEFAULTS = {"discard": "off", "discard_epochs": 2, "discard_factor": 3, "discard_grace": 5, "inherit": False,
                   "templates": True, "compact_start": False, "start_from": "", "surrogate": "off",
                   "surrogate_candidates": 12,
                   "surrogate_min_results": 16, "surrogate_ahead": "auto", "surrogate_helpers": 1}


def test_strategy_settings_come_from_the_registry_and_reach_the_strategy(tmp_path):
    cfg = resolve_config({"mode": "evolve", "evolve": {"crossover_prob": 0.5, "population_size": 6,
                                                       "sample_size": 3}})
    assert cfg.evolve.to_dict() == {"strategy": "regularized", "evaluations": 40, "time_limit": None, **SEARCH_DEFAULTS,
                             "population_size": 6, "sample_size": 3, "crossover_prob": 0.5}
    again = resolve_config(__import__("tomllib").loads(dump_toml(cfg)))
    assert again.evolve == cfg.evolve
    from ensemble.sources.search import SearchSource
    meta = {"task": "classification", "input_shape": [8, 8, 1], "n_outputs": 10}
    source = SearchSource(cfg, meta, RunDirectory(tmp_path), [])
    assert source.strategy.params == {"population_size": 6, "sample_size": 3, "crossover_prob": 0.5}
    for name, cls in STRATEGIES.items():
        cfg = resolve_config({"mode": "evolve", "evolve": {"strategy": name}})
        assert {k: cfg.evolve.settings[k] for k in cls.SETTINGS} == cls.defaults()


@pytest.mark.parametrize("evolve, message", [
    ({"mu": 4}, "`evolve.mu` for strategy 'regularized'; it is a setting of strategy 'mu_plus_lambda'"),
    ({"strategy": "nsga2", "crossover_prob": 2}, "`evolve.crossover_prob` must be a probability"),
    ({"strategy": "nsga2", "objectives": "metric_size"}, "`evolve.objectives` must be one of"),
    ({"strategy": "annealing"}, "`evolve.strategy` must be one of"),
    ({"sample_size": 13}, "`evolve.sample_size` (13) must be <= `evolve.population_size` (12)"),
    ({"populaton_size": 9}, "did you mean 'population_size'"),
])
def test_bad_strategy_settings_name_the_key(evolve, message):
    with pytest.raises(ConfigError) as info:
        resolve_config({"mode": "evolve", "evolve": evolve})
    assert message in str(info.value)


def test_search_page_documents_exactly_the_declared_settings():
    text = (ROOT / "docs" / "search.md").read_text()
    assert README_START in text and README_END in text, "docs/search.md lacks the generated strategy table"
    block = text.split(README_START)[1].split(README_END)[0].strip()
    assert block == strategy_table(), ("the strategy table in docs/search.md is stale; regenerate it with "
                                       "`python -m ensemble.config.reference`")


def test_run_directories_written_before_the_registry_still_load():
    old = {"mode": "evolve", "evolve": {"strategy": "regularized", "evaluations": 7, "population_size": 4,
                                        "sample_size": 2, "mu": 8, "lambda_": 8, "objectives": "metric_params"}}
    with pytest.raises(ConfigError, match="`evolve.mu`"):
        resolve_config(old)                           # a user's config: a wrong key is an error
    cfg = resolve_config(old, saved=True)             # a run's own config.toml from an older version
    assert cfg.evolve.to_dict() == {"strategy": "regularized", "evaluations": 7, "time_limit": None, **SEARCH_DEFAULTS,
                             "population_size": 4, "sample_size": 2, "crossover_prob": 0.0}
    with pytest.raises(ConfigError, match="`evolve.typo`"):
        resolve_config({"mode": "evolve", "evolve": {"typo": 1}}, saved=True)


@pytest.mark.parametrize("layers, shape, fix", [
    ([{"type": "Conv2D"}], [8, 8], "set `data.reshape = [8, 8, 1]` (height, width, channels)"),
    ([{"type": "Conv1D"}], [32], "set `data.reshape = [32, 1]` (steps, channels)"),
    ([{"type": "Conv2D"}], [64], "set `data.reshape = [8, 8, 1]`"),
    ([{"type": "Conv2D"}], [10], "set `data.reshape` to 3 axes (height, width, channels) whose product is 10"),
    ([{"type": "Conv1D"}], [8, 8, 1], "set `data.reshape = [64, 1]`"),
    ([{"type": "Flatten"}, {"type": "Conv2D"}], [8, 8, 1], "the layers before it give 1; add a Reshape"),
])
def test_a_layer_of_the_wrong_rank_is_told_the_reshape_that_fits(layers, shape, fix):
    """The fix names the `data.reshape` for these very samples (it said [8, 8, 1] whatever the data,
    and "add a Flatten" for a Conv2D on 8 x 8 images)."""
    why = check_input_rank(layers, shape, "architectures[0].layers")
    assert why is not None and fix in why, why


@pytest.mark.parametrize("layers, why", [
    ([{"type": "Reshape", "target_shape": [7, 7, 1]}], "target_shape [7, 7, 1] holds 49 values, but each sample "
                                                        "has 64 (shape [64]); set `data.reshape` instead"),
    ([{"type": "Dense", "units": 10}, {"type": "Reshape", "target_shape": [3, 3]}],
     "the layers before it give 10 per sample (shape [10]); the product of target_shape must be 10"),
    ([{"type": "Reshape", "target_shape": [8, 8, 1]}, {"type": "Conv2D"}, {"type": "Flatten"}], None),
    ([{"type": "Reshape", "target_shape": [-1, 1]}, {"type": "Conv1D"}], None),
    ([{"type": "Dense", "units": 10}, {"type": "Dropout"}, {"type": "Reshape", "target_shape": [5, 2]}], None),
    ([{"type": "Reshape", "target_shape": [8, 8, 1]}, {"type": "Conv2D"}, {"type": "Reshape", "target_shape": [5]}],
     None),                                                   # after a convolution the size is not known here
])
def test_a_reshape_that_cannot_hold_the_values_it_gets_is_caught_before_training(layers, why):
    """`ensemble check` caught it by building (raw Keras text); `ensemble run` did not, and every
    member failed with it."""
    got = check_input_rank(layers, [64], "architectures[0].layers")
    assert (got is None) if why is None else (got is not None and why in got), got


def test_a_dense_layer_reading_one_value_at_a_time_is_noted():
    """docs/your-data.md's example: `reshape = [8, 8, 1]` and an MLP with no Flatten trained Dense
    on each pixel alone (test mse 3.5 against the linear baseline's 0.015), and nothing said so."""
    from ensemble.config.vocabulary import dense_on_values_note
    mlp = [{"type": "Dropout", "rate": 0.1}, {"type": "Dense", "units": 128}]
    note = dense_on_values_note(mlp, [8, 8, 1], "architectures[0].layers")
    assert note.startswith("`architectures[0].layers[1]` (Dense) acts on the last axis of samples of shape [8, 8, 1]")
    assert "Flatten" in note
    assert dense_on_values_note([{"type": "Flatten"}, *mlp], [8, 8, 1], "a") is None       # every value
    assert dense_on_values_note(mlp, [64], "a") is None                                    # a table
    assert dense_on_values_note(mlp, [20, 3], "a") is None                                 # per step, on purpose
    assert dense_on_values_note([{"type": "Conv2D", "filters": 4, "kernel_size": 3}, *mlp], [8, 8, 1], "a") is None
