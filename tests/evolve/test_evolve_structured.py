"""The structured space (``search.space = "structured"``): its genome's dict round trip and key,
its lowering to layer genes, and that drawing, mutating, crossing and repairing stay inside
the structure and the space for sequences, images, volumes and tables. No TensorFlow here
(``test_evolve_structured_build.py`` builds and trains them)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from evolve import (
    Genome,
    SearchSpace,
    Stage,
    StructuredGenome,
    analyse,
    check,
    count_params,
    crossover,
    decode,
    genome_from_dict,
    make_strategy,
    mutate,
    random_genome,
    repair,
    templates,
)
from evolve.templates import templates_for

#: (input rank, one sample's shape) for each kind of input
KINDS = {"sequence": (2, (40, 1)), "image": (3, (8, 8, 1)), "volume": (4, (4, 4, 4, 1)), "table": (1, (10,))}
EXAMPLE = StructuredGenome(stages=(Stage(2, 16, 3), Stage(1, 32, 5, "maxpool", 2)), dense=(64,), activation="gelu",
                           norm=True, residual=True, dropout=0.1)


def space(rank: int, **kw) -> SearchSpace:
    return SearchSpace.from_config({"space": "structured", **kw}, input_rank=rank)


def test_dict_round_trip_key_and_pickle():
    d = EXAMPLE.to_dict()
    assert json.loads(json.dumps(d)) == d and "stages" in d
    for back in (StructuredGenome.from_dict(json.loads(json.dumps(d))), genome_from_dict(d),
                 pickle.loads(pickle.dumps(EXAMPLE))):
        assert back == EXAMPLE and hash(back) == hash(EXAMPLE) and back.key() == EXAMPLE.key()
    assert EXAMPLE.key() == "269813acf889996b"                    # stable across processes and versions
    assert EXAMPLE.replace(dropout=0.2).key() != EXAMPLE.key()
    free = EXAMPLE.to_genome()
    assert isinstance(genome_from_dict(free.to_dict()), Genome) and genome_from_dict(free.to_dict()) == free


@pytest.mark.parametrize("change", [
    {"stages": [{"blocks": 1, "width": 8, "kernel": 3, "down": "sideways", "factor": 1}]},
    {"stages": [{"blocks": 0, "width": 8, "kernel": 3, "down": "none", "factor": 1}]},
    {"stages": [{"blocks": 1, "width": 8, "kernel": 3}]},
    {"dense": [0]}, {"norm": "yes"}, {"learning_rate": -1.0}, {"dropout": 1.0}, {"reduction": "max"},
    {"colour": "red"},
])
def test_a_malformed_dict_is_refused(change):
    with pytest.raises(ValueError):
        StructuredGenome.from_dict({**EXAMPLE.to_dict(), **change})


def test_it_lowers_to_stages_of_blocks_then_the_reduction_and_the_head():
    assert EXAMPLE.summary((40, 1)) == ("in 40x1: C16k3(gelu)-BN-C16k3(gelu)+r-BN-MP2-C32k5(gelu)+r-BN-GAP-"
                                        "D64(gelu)-do0.1 | adam lr=1e-3 bs=64")
    kinds = [layer["type"] for layer in decode(EXAMPLE, (40, 1))]
    assert kinds == ["Conv1D", "BatchNormalization", "Conv1D", "BatchNormalization", "MaxPooling1D", "Conv1D",
                     "BatchNormalization", "GlobalAveragePooling1D", "Dense", "Dropout"]
    strided = EXAMPLE.replace(stages=(Stage(1, 16, 3), Stage(2, 32, 3, "stride", 2)), norm=False, dropout=0.0)
    assert strided.summary((8, 8, 1)).startswith("in 8x8x1: C16k3(gelu)-C32k3s2(gelu)+r-C32k3(gelu)+r-GAP-D64")
    table = StructuredGenome(stages=(), dense=(32, 32), activation="relu", norm=True, residual=True, dropout=0.2)
    assert table.summary((10,)).startswith("in 10: D32(relu)-BN-do0.2-D32(relu)+r-BN-do0.2 |")
    assert analyse(table, (10,), 3).n_params == (10 * 32 + 32) + 4 * 32 + (32 * 32 + 32) + 4 * 32 + (32 * 3 + 3)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_genome_drawn_mutated_or_crossed_is_valid_and_keeps_the_structure(kind):
    rank, shape = KINDS[kind]
    sp = space(rank)
    rng = np.random.default_rng(0)
    drawn = [random_genome(rng, sp, shape, 3) for _ in range(40)]
    children = [mutate(g, rng, sp, shape, 3) for g in drawn]
    crossed = [crossover(a, b, rng, sp, shape, 3)[0] for a, b in zip(drawn, reversed(drawn))]
    assert len({g.key() for g in drawn}) > 30
    for parent, child in zip(drawn, children):
        assert child != parent
    for g in drawn + children + crossed:
        assert isinstance(g, StructuredGenome) and check(g, shape, 3, sp) is None, check(g, shape, 3, sp)
        assert genome_from_dict(json.loads(json.dumps(g.to_dict()))) == g
        widths = [st.width for st in g.stages]
        assert widths == sorted(widths)                             # widening (or level) from stage to stage
        if rank == 1:
            assert not g.stages and 1 <= len(g.dense) <= 3
        else:
            assert 1 <= len(g.stages) <= 3 and g.stages[0].down == "none" and len(g.dense) <= 2
            assert all(1 <= st.blocks <= 3 for st in g.stages)


def _moves(a: StructuredGenome, b: StructuredGenome) -> set[str]:
    """What changed from ``a`` to ``b``, in the words of the mutations."""
    out = {name for name in ("activation", "norm", "residual", "dropout", "reduction", "optimizer",
                             "learning_rate", "batch_size") if getattr(a, name) != getattr(b, name)}
    if len(a.stages) != len(b.stages):
        out.add("stages")
    elif a.stages != b.stages:
        for x, y in zip(a.stages, b.stages):
            out |= {f for f in ("blocks", "width", "kernel", "down") if getattr(x, f) != getattr(y, f)}
    if len(a.dense) != len(b.dense):
        out.add("dense_layers")
    elif a.dense != b.dense:
        out.add("dense_width")
    return out


def test_mutations_move_within_the_structure():
    sp = space(2)
    parent = repair(StructuredGenome(stages=(Stage(2, 16, 3), Stage(2, 32, 3, "maxpool", 2)), dense=(32,),
                                     dropout=0.2, activation="relu", batch_size=32), (40, 1), 3, sp)
    assert parent is not None
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(400):
        moved = _moves(parent, mutate(parent, rng, sp, (40, 1), 3))
        assert moved                                              # a child differs
        seen |= moved
    assert seen >= {"stages", "blocks", "width", "kernel", "down", "dense_layers", "dense_width", "activation",
                    "norm", "residual", "dropout", "reduction", "optimizer", "learning_rate", "batch_size"}


def test_max_params_holds_and_downsampling_past_the_map_is_repaired():
    sp = space(2, max_params=3000)
    rng = np.random.default_rng(2)
    for _ in range(30):
        g = random_genome(rng, sp, (40, 1), 3)
        assert count_params(g, (40, 1), 3) <= 3000
        assert count_params(mutate(g, rng, sp, (40, 1), 3), (40, 1), 3) <= 3000
    deep = StructuredGenome(stages=(Stage(1, 8, 3), Stage(1, 16, 3, "maxpool", 2), Stage(1, 32, 3, "maxpool", 2)),
                            dense=())
    assert check(deep, (3, 1), 3, space(2)) is not None                 # pooling past a 1-long map
    fixed = repair(deep, (3, 1), 3, space(2))
    assert fixed is not None and check(fixed, (3, 1), 3, space(2)) is None
    assert [st.down for st in fixed.stages] == ["none", "maxpool", "none"] and len(fixed.stages) == 3


def test_the_two_spaces_do_not_mix():
    free_space = SearchSpace.from_config({"space": "free"}, input_rank=2)
    free = EXAMPLE.to_genome()
    assert "free genome" in check(free, (40, 1), 3, space(2))
    assert "structured genome" in check(EXAMPLE, (40, 1), 3, free_space)
    assert repair(free, (40, 1), 3, space(2)) is None and repair(EXAMPLE, (40, 1), 3, free_space) is None
    child = mutate(free, np.random.default_rng(0), space(2), (40, 1), 3)
    assert isinstance(child, StructuredGenome) and check(child, (40, 1), 3, space(2)) is None


@pytest.mark.parametrize("rank, given, resolved", [
    (2, {}, "structured"), (3, {}, "structured"), (4, {"space": "auto"}, "structured"), (1, {}, "free"),
    (2, {"layer_types": ["dense", "dropout"]}, "free"), (2, {"space": "free"}, "free"),
    (1, {"space": "structured"}, "structured")])
def test_the_default_space_is_structured_for_spatial_input_and_free_for_tables(rank, given, resolved):
    space = SearchSpace.from_config(given, input_rank=rank)
    assert space.space == resolved and space.to_config()["space"] == resolved
    assert SearchSpace(input_rank=rank, layer_types=space.layer_types).space == (
        "structured" if rank > 1 and "conv" in space.layer_types else "free")


@pytest.mark.parametrize("given, message", [
    ({"space": "fancy"}, "`search.space` must be one of 'auto', 'free', 'structured'"),
    ({"space": "structured", "stages": [0, 2]}, "`search.stages` must be an integer >= 1"),
    ({"space": "structured", "blocks": [3, 1]}, "`search.blocks` must be [min, max] with min <= max"),
    ({"space": "structured", "layer_types": ["dense", "dropout"]}, "must include 'conv'"),
    ({"space": "structured", "layer_types": ["conv"], "dense_layers": [1, 2]}, "`search.dense_layers` asks for"),
])
def test_structured_settings_are_checked_and_named(given, message):
    with pytest.raises(ValueError) as info:
        SearchSpace.from_config(given, input_rank=2)
    assert message in str(info.value)


def test_structured_settings_reach_the_space():
    sp = space(3, stages=[2, 2], blocks=[1, 1], dense_layers=[0, 0], layer_types=["conv", "avgpool"],
               strides=[1], skip_connections=False)
    assert sp.to_config()["space"] == "structured" and sp.to_config()["stages"] == [2, 2]
    rng = np.random.default_rng(3)
    for _ in range(20):
        g = random_genome(rng, sp, (8, 8, 1), 3)
        assert len(g.stages) == 2 and g.stages[1].down in ("avgpool", "none") and not g.dense
        assert not g.norm and not g.residual and g.dropout == 0.0


@pytest.mark.parametrize("structured", [True, False])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_templates_are_valid_for_their_kind_in_both_spaces(kind, structured):
    rank, shape = KINDS[kind]
    sp = SearchSpace.from_config({"space": "structured" if structured else "free"}, input_rank=rank)
    found = templates(sp, shape, 3)
    assert len(found) == len(templates_for(shape))      # all distinct, none left out
    for g in found:
        assert isinstance(g, StructuredGenome if structured else Genome) and check(g, shape, 3, sp) is None
        lowered = g.to_genome() if structured else g
        has_conv = any(x.kind == "conv" for x in lowered.layers)
        assert has_conv == (rank > 1) and any(x.kind in ("conv", "dense") for x in lowered.layers)
    small = SearchSpace.from_config({"space": "structured" if structured else "free", "max_params": 5000},
                                    input_rank=rank)
    assert all(count_params(g, shape, 3) <= 5000 for g in templates(small, shape, 3))


def test_every_spatial_input_starts_from_a_full_resolution_detector_and_a_pooled_cnn():
    def full_resolution(g: StructuredGenome) -> bool:
        return all(st.down == "none" for st in g.stages)
    seq = templates(space(2), KINDS["sequence"][1], 3)
    # the FCN (three stages) and the detector (one), both at full resolution with max pooling
    assert sorted(len(g.stages) for g in seq if full_resolution(g) and g.reduction == "global_max") == [1, 3]
    assert any(not full_resolution(g) and g.reduction == "global_average" for g in seq)
    for kind in ("image", "volume"):
        rank, shape = KINDS[kind]
        found = templates(space(rank), shape, 3)
        # one stage at full resolution only (deeper full-resolution networks cost 5x on 16x16 images)
        assert [len(g.stages) for g in found if full_resolution(g) and g.reduction == "global_max"] == [1]
        assert sum(not full_resolution(g) for g in found) == 2
    # a regression leaves the detector out and its FCN averages (max pooling was the worst start for a
    # sequence's R^2, the detector the weakest start with either pooling)
    for kind in ("sequence", "image", "volume"):
        rank, shape = KINDS[kind]
        reg = templates(space(rank), shape, 1, "regression")
        assert len(reg) == len(templates(space(rank), shape, 3)) - 1
        assert not any(g.reduction == "global_max" or len(g.stages) == 1 for g in reg)
    seq = templates(space(2), KINDS["sequence"][1], 1, "regression")
    assert [len(g.stages) for g in seq if full_resolution(g) and g.reduction == "global_average"] == [3]


def test_templates_come_best_first_for_their_task():
    """With few workers the first population's head trains first: a classifier of sequences or
    images starts from the detector (the best start alone on signals and stripes), a regression
    from the small CNN with batch norm and a dense layer (the best on peaks)."""
    for kind in ("sequence", "image", "volume"):
        rank, shape = KINDS[kind]
        first = templates(space(rank), shape, 3)[0]
        assert len(first.stages) == 1 and first.reduction == "global_max" and not first.dense
        first = templates(space(rank), shape, 1, "regression")[0]
        assert len(first.stages) == 2 and first.norm and first.dense and first.reduction == "global_average"
    assert [g.residual for g in templates(space(1), KINDS["table"][1], 3)] == [False, True]


@pytest.mark.parametrize("name", ["regularized", "mu_plus_lambda", "nsga2", "random"])
def test_starting_points_are_the_first_asks_each_once_also_after_replay(name):
    sp = space(3)
    shape = (8, 8, 1)
    start = templates(sp, shape, 3)
    params = {"regularized": {"population_size": 4, "sample_size": 2}, "mu_plus_lambda": {"mu": 4},
              "nsga2": {"population_size": 4}, "random": {}}[name]
    strategy = make_strategy(name, sp, shape, 3, rng_seed=5, budget_evaluations=12, initial=start, **params)
    asked = []
    while not strategy.done():
        g = strategy.ask()
        assert g is not None
        asked.append(g)
        strategy.tell(g, -float(count_params(g, shape, 3)))
    assert asked[:len(start)] == start and len({g.key() for g in asked}) == 12
    assert all(check(g, shape, 3, sp) is None for g in asked)
    again = make_strategy(name, sp, shape, 3, rng_seed=5, budget_evaluations=12, initial=start, **params)
    again.replay([{"event": "ask", "genome": asked[0].to_dict()}])        # the first went out before a kill
    assert again.ask() == start[1]


def _fields_apart(a: StructuredGenome, b: StructuredGenome) -> int:
    da, db = a.to_dict(), b.to_dict()
    return sum(da[k] != db[k] for k in da)


@pytest.mark.parametrize("seed", range(5))
def test_after_the_templates_the_first_population_alternates_their_mutants_and_random_genomes(seed):
    rank, shape = KINDS["sequence"]
    sp = space(rank)
    starts = templates(sp, shape, 4)
    st = make_strategy("regularized", sp, shape, 4, rng_seed=seed, initial=starts, population_size=12, sample_size=3)
    asked = [st.ask() for _ in range(12)]
    assert [g.key() for g in asked[:len(starts)]] == [g.key() for g in starts]
    after = range(len(starts), len(asked))            # even asks after the templates: mutants; odd: random
    mutants, randoms = [asked[i] for i in after if i % 2 == 0], [asked[i] for i in after if i % 2]
    # a mutant is one move away from a template (one field, or the stage list and what repair fits to it)
    assert all(min(_fields_apart(g, t) for t in starts) <= 2 for g in mutants)
    assert len({g.key() for g in asked}) == len(asked)
    # random genomes spread: on the whole, further from every template than the mutants
    far = np.mean([min(_fields_apart(g, t) for t in starts) for g in randoms])
    near = np.mean([min(_fields_apart(g, t) for t in starts) for g in mutants])
    assert far > near


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_compact_draw_is_small_valid_and_varied(kind):
    rank, shape = KINDS[kind]
    sp = space(rank)
    rng = np.random.default_rng(0)
    drawn = [random_genome(rng, sp, shape, 3, compact=True) for _ in range(40)]
    assert len({g.key() for g in drawn}) > 30                     # the other genes still spread
    for g in drawn:
        assert check(g, shape, 3, sp) is None, check(g, shape, 3, sp)
        if rank == 1:                                             # a table's blocks are its dense widths
            assert 1 <= len(g.dense) <= 2
        else:
            assert 1 <= len(g.stages) <= 2 and all(st.blocks == 1 for st in g.stages) and len(g.dense) <= 1
    if rank > 1:                                                  # both counts it allows are drawn
        assert {len(g.stages) for g in drawn} == {1, 2}


@pytest.mark.parametrize("compact", [True, False])
def test_the_first_populations_random_genomes_are_compact_when_asked(compact):
    rank, shape = KINDS["sequence"]
    sp = space(rank)
    st = make_strategy("regularized", sp, shape, 4, rng_seed=3, population_size=16, sample_size=3,
                       compact_start=compact)
    asked = [st.ask() for _ in range(16)]                        # no templates: every one random
    blocks = [sum(s.blocks for s in g.stages) for g in asked]
    if compact:
        assert max(blocks) <= 2 and max(len(g.stages) for g in asked) <= 2
    else:
        assert max(blocks) > 2
