"""decode/analyse/check/repair: schema, shapes, parameter counts, invalid genomes."""

import math

import numpy as np
import pytest

from evolve import Genome, LayerGene, SearchSpace, analyse, check, decode, repair
from evolve.space import LAYER_TYPES

L = LayerGene.make


def conv(f, k=3, s=1, act="relu", res=False):
    return L("conv", filters=f, kernel_size=k, strides=s, activation=act, residual=res)


def dense(u, act="relu", res=False):
    return L("dense", units=u, activation=act, residual=res)


def genome(*layers, **hp):
    return Genome(layers=tuple(layers), **hp)


EXAMPLE = genome(conv(32), L("maxpool", pool_size=2), dense(128, "elu"), L("dropout", rate=0.2))


def test_schema_shapes_and_params_2d(image_space):
    assert decode(EXAMPLE, (32, 32, 3), image_space, 10) == [
        {"type": "Conv2D", "filters": 32, "kernel_size": 3, "strides": 1, "padding": "same",
         "activation": "relu"},
        {"type": "MaxPooling2D", "pool_size": 2, "padding": "valid"},
        {"type": "GlobalAveragePooling2D"},
        {"type": "Dense", "units": 128, "activation": "elu"},
        {"type": "Dropout", "rate": 0.2},
    ]
    a = analyse(EXAMPLE, (32, 32, 3), 10)
    assert a.shapes == [(32, 32, 32), (16, 16, 32), (32,), (128,), (128,)]
    assert a.n_params == (9 * 3 * 32 + 32) + (32 * 128 + 128) + (128 * 10 + 10)


def test_flatten_reduction_counts_the_flat_width():
    a = analyse(EXAMPLE.replace(reduction="flatten"), (32, 32, 3), 10)
    assert a.layers[2] == {"type": "Flatten"} and a.shapes[2] == (16 * 16 * 32,)
    assert a.n_params == 896 + (8192 * 128 + 128) + 1290


@pytest.mark.parametrize("shape, d", [((50, 4), 1), ((8, 8, 2), 2)])
def test_global_max_reduction_pools_each_channel_to_its_largest_value(shape, d):
    g = EXAMPLE.replace(reduction="global_max")
    a = analyse(g, shape, 10)
    assert a.layers[2] == {"type": f"GlobalMaxPooling{d}D"} and a.shapes[2] == (32,)
    assert a.n_params == analyse(EXAMPLE, shape, 10).n_params          # no weights, as GAP
    assert "-MP2-GMP-D128(elu)" in g.summary(shape)
    assert Genome.from_dict(g.to_dict()) == g


def test_residual_projection_strides_and_batchnorm():
    g = genome(conv(4, k=3, s=2, res=True), L("batchnorm"), conv(4, k=1, res=True))
    a = analyse(g, (7, 9, 2), 10)
    assert a.layers[0]["residual"] is True and a.shapes[0] == (4, 5, 4)  # ceil(n / 2)
    assert a.layers[-1] == {"type": "GlobalAveragePooling2D"}
    # conv + 1x1 projection (channels and stride differ), BN 4*c, conv without projection
    assert a.n_params == (9 * 2 * 4 + 4) + (2 * 4 + 4) + 16 + (4 * 4 + 4) + (4 * 10 + 10)
    f = genome(dense(20, res=True), dense(8, res=True))
    assert analyse(f, (20,), 3).n_params == 420 + (168 + 168) + 27


@pytest.mark.parametrize("shape, d", [((50, 4), 1), ((8, 8, 2), 2), ((6, 6, 6, 1), 3)])
def test_layer_names_follow_input_rank(shape, d):
    g = genome(conv(8), L("avgpool", pool_size=2), L("maxpool", pool_size=3), dense(16))
    types = [x["type"] for x in analyse(g, shape, 2).layers]
    assert types == [f"Conv{d}D", f"AveragePooling{d}D", f"MaxPooling{d}D",
                     f"GlobalAveragePooling{d}D", "Dense"]
    assert analyse(g, shape, 2).shapes[2] == tuple(n // 2 // 3 for n in shape[:-1]) + (8,)


def test_flat_input_is_dense_only(flat_space):
    g = genome(dense(64), L("batchnorm"), L("dropout", rate=0.1))
    assert [x["type"] for x in decode(g, (20,), flat_space, 3)] == [
        "Dense", "BatchNormalization", "Dropout"]


def test_pooling_past_1x1_is_reported_and_repaired(image_space):
    pool = L("maxpool", pool_size=2)
    g = genome(conv(8), pool, pool, pool, dense(16))
    assert check(g, (4, 4, 3), 10, image_space) == "pooling past a 1x1 map at layer 4 (pool_size 2)"
    with pytest.raises(ValueError, match="pooling past"):
        decode(g, (4, 4, 3), image_space, 10)
    fixed = repair(g, (4, 4, 3), 10, image_space)
    assert check(fixed, (4, 4, 3), 10, image_space) is None
    assert [x.kind for x in fixed.layers] == ["conv", "maxpool", "maxpool", "dense"]
    assert check(genome(pool, pool), (3, 8, 1), 10, image_space) == (
        "pooling a 1x4 map at layer 2 (pool_size 2)")


def test_stride_on_1x1_map_becomes_1(image_space):
    g = genome(conv(8, s=2), dense(16))
    assert check(g, (1, 1, 3), 10, image_space) == "stride 2 on a 1x1 map at layer 1"
    assert repair(g, (1, 1, 3), 10, image_space).layers[0].get("strides") == 1


def test_too_many_params_reason_and_repair(image_space):
    g = genome(conv(128), dense(512), dense(512), reduction="flatten")
    reason = check(g, (32, 32, 3), 10, image_space)
    assert reason == "67,380,746 parameters > max_params 2,000,000"      # (max_params 3 read "3e0")
    fixed = repair(g, (32, 32, 3), 10, image_space)
    assert check(fixed, (32, 32, 3), 10, image_space) is None
    assert analyse(fixed, (32, 32, 3), 10).n_params <= 2_000_000


def test_repair_halves_widths_on_the_grid():
    space = SearchSpace.from_config({"space": "free", "max_params": 300_000}, input_rank=1)
    fixed = repair(genome(dense(512), dense(512), dense(512)), (1000,), 10, space)
    units = [x.get("units") for x in fixed.layers]
    assert len(units) == 3 and all(u in space.unit_choices for u in units)
    assert analyse(fixed, (1000,), 10).n_params <= 300_000


def test_repair_gives_up_when_nothing_fits():
    space = SearchSpace.from_config({"space": "free", "max_params": 100_000, "reductions": ["flatten"]}, 3)
    g = genome(conv(64), dense(64), reduction="flatten")
    assert "parameters > max_params" in check(g, (64, 64, 3), 10, space)
    assert repair(g, (64, 64, 3), 10, space) is None


def test_order_and_out_of_space_values_are_repaired(image_space):
    g = genome(dense(100, act="foo"), conv(100, k=4, s=3), L("dropout", rate=0.93),
               optimizer="lion", learning_rate=1.0, batch_size=1000)
    assert check(genome(dense(64), conv(64)), (32, 32, 3), 10, image_space) == (
        "conv at layer 2 comes after the dense head (starting at layer 1)")
    fixed = repair(g, (32, 32, 3), 10, image_space)
    assert check(fixed, (32, 32, 3), 10, image_space) is None
    assert [x.kind for x in fixed.layers] == ["conv", "dropout", "dense"]
    c, do, d = fixed.layers
    assert (c.get("filters"), c.get("kernel_size"), c.get("strides")) == (128, 3, 2)
    assert d.get("units") == 128 and d.get("activation") == "relu" and do.get("rate") == 0.5
    assert (fixed.optimizer, fixed.learning_rate, fixed.batch_size) == ("adam", 1e-2, 128)


def test_depth_is_trimmed_and_padded(flat_space):
    deep = genome(*[dense(16), L("dropout", rate=0.1)] * 5)
    fixed = repair(deep, (20,), 2, flat_space)
    assert fixed.depth == 6 and [x.kind for x in fixed.layers].count("dense") == 5
    empty = genome()
    assert "depth 0" in check(empty, (20,), 2, flat_space)
    assert repair(empty, (20,), 2, flat_space).layers == (dense(16),)
    conv_on_flat = genome(conv(8))
    assert "spatial" in analyse(conv_on_flat, (20,), 2).problem
    assert check(repair(conv_on_flat, (20,), 2, flat_space), (20,), 2, flat_space) is None


def test_skip_connections_off_clears_residuals():
    space = SearchSpace.from_config({"space": "free", "skip_connections": False}, input_rank=1)
    g = genome(dense(32, res=True))
    assert "skip_connections" in check(g, (20,), 2, space)
    assert repair(g, (20,), 2, space).layers[0].get("residual") is False


JUNK = [None, -1, 0, 1, 2, 3, 2.5, 128, "x", "relu", True, 1e9, math.nan, [1]]
NAMES = ["filters", "kernel_size", "strides", "activation", "residual", "units",
         "pool_size", "rate", "bogus"]


@pytest.mark.parametrize("shape", [(16, 16, 3), (20,), (30, 2)])
def test_garbage_genomes_never_crash(shape):
    rng = np.random.default_rng(7)
    space = SearchSpace.from_config({"space": "free"}, input_rank=len(shape))
    for _ in range(300):
        layers = []
        for _ in range(int(rng.integers(0, 9))):
            kind = LAYER_TYPES[int(rng.integers(len(LAYER_TYPES)))] if rng.random() < 0.9 else "rnn"
            params = {NAMES[int(i)]: JUNK[int(j)] for i, j in
                      zip(rng.integers(len(NAMES), size=3), rng.integers(len(JUNK), size=3))}
            layers.append(LayerGene(kind, tuple(sorted(params.items()))))
        g = Genome(layers=tuple(layers), optimizer=["adam", "x", None][int(rng.integers(3))],
                   learning_rate=JUNK[int(rng.integers(len(JUNK)))],
                   batch_size=JUNK[int(rng.integers(len(JUNK)))],
                   reduction=["flatten", "global_average", "zz"][int(rng.integers(3))])
        reason = check(g, shape, 5, space)                   # junk is a reason, never an exception
        analyse(g, shape, 5)
        fixed = repair(g, shape, 5, space)
        assert reason is not None or fixed is not None, "a valid genome must survive repair"
        assert fixed is None or check(fixed, shape, 5, space) is None
        if reason is not None:
            with pytest.raises(ValueError):
                decode(g, shape, space, 5)


def test_bad_input_shape_is_a_reason(image_space):
    assert "input shape" in check(EXAMPLE, (0, 3), 10, image_space)
    assert repair(EXAMPLE, (0, 3), 10, image_space) is None
