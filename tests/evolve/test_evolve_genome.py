"""Genome: equality, hashing, pickling, dict round trip, key and summary."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evolve import Genome, LayerGene, SearchSpace
from evolve.operators import random_genome


def example() -> Genome:
    return Genome(
        layers=(LayerGene.make("conv", filters=32, kernel_size=3, strides=1,
                               activation="relu", residual=False),
                LayerGene.make("maxpool", pool_size=2),
                LayerGene.make("dense", units=128, activation="elu", residual=False),
                LayerGene.make("dropout", rate=0.2)),
        optimizer="adam", learning_rate=1e-3, batch_size=64)


def test_summary():
    assert example().summary() == "C32k3(relu)-MP2-GAP-D128(elu)-do0.2 | adam lr=1e-3 bs=64"
    g = example().replace(learning_rate=2.5e-4, reduction="flatten")
    assert g.summary((8, 8, 1)) == "in 8x8x1: C32k3(relu)-MP2-Flatten-D128(elu)-do0.2 | adam lr=2.5e-4 bs=64"


def test_summary_shows_how_the_input_is_treated():
    """The same dense genome is an MLP on flat vectors but averages an image first: the
    summary says which (with the input shape), and the reduction sits where decode puts it."""
    from evolve import decode
    mlp = Genome(layers=(LayerGene.make("dense", units=64, activation="gelu"), LayerGene.make("dropout", rate=0.1)))
    assert mlp.summary((64,)) == "in 64: D64(gelu)-do0.1 | adam lr=1e-3 bs=64"
    assert mlp.summary([8, 8, 1]) == "in 8x8x1: GAP-D64(gelu)-do0.1 | adam lr=1e-3 bs=64"
    assert mlp.replace(reduction="flatten").summary((8, 8, 1)).startswith("in 8x8x1: Flatten-D64(gelu)")
    conv = Genome(layers=(LayerGene.make("conv", filters=8, kernel_size=5, strides=2, activation="tanh", residual=True),
                          LayerGene.make("avgpool", pool_size=2), LayerGene.make("batchnorm")))
    assert conv.summary((28, 28, 1)).startswith("in 28x28x1: C8k5s2(tanh)+r-AP2-BN-GAP |")
    assert Genome(layers=()).summary((8, 8, 1)).startswith("in 8x8x1: GAP |")
    # one token per decoded layer, and GAP/Flatten exactly where decode puts the reduction layer
    for g, shape in ((example(), (8, 8, 1)), (example().replace(reduction="flatten"), (8, 8, 1)),
                     (mlp, (8, 8, 1)), (conv, (28, 28, 1)), (mlp, (64,))):
        tokens = g.summary(shape).split(": ", 1)[1].split(" | ")[0].split("-")
        kinds = [layer["type"] for layer in decode(g, shape)]
        assert [{"GAP": "GlobalAveragePooling", "Flatten": "Flatten"}.get(t) for t in tokens] == [
            k.rstrip("123D") if k.startswith(("GlobalAverage", "Flatten")) else None for k in kinds]


def test_gene_params_are_order_independent():
    a = LayerGene.make("dense", units=64, activation="relu")
    b = LayerGene.make("dense", activation="relu", units=64)
    assert a == b and hash(a) == hash(b) and a.params[0][0] == "activation"


def test_equality_hash_pickle():
    a, b = example(), example()
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert pickle.loads(pickle.dumps(a)) == a
    assert a != a.replace(batch_size=32)
    with pytest.raises(AttributeError):
        a.batch_size = 32  # frozen


def test_dict_round_trip_is_exact_through_json():
    space = SearchSpace.from_config({"space": "free"}, input_rank=3)
    rng = np.random.default_rng(0)
    for _ in range(50):
        g = random_genome(rng, space, (32, 32, 3), 10)
        d = json.loads(json.dumps(g.to_dict()))
        back = Genome.from_dict(d)
        assert back == g and back.key() == g.key() and back.to_dict() == g.to_dict()


def test_key_is_stable_across_processes():
    code = ("import json, sys; from evolve import Genome; "
            "print(Genome.from_dict(json.loads(sys.argv[1])).key())")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code, json.dumps(example().to_dict())],
                         capture_output=True, text=True, check=True, cwd=root,
                         env={"PYTHONHASHSEED": "123", "PYTHONPATH": str(root)})
    assert out.stdout.strip() == example().key()
    assert len(example().key()) == 16


@pytest.mark.parametrize("d", [
    {}, {"layers": "x"}, {"layers": [{"type": "lstm"}]},
    {"layers": [], "learning_rate": -1}, {"layers": [], "batch_size": 1.5},
    {"layers": [], "reduction": "max"}, {"layers": [], "colour": "red"},
    {"layers": [{"type": "dense", "units": [1]}]},
])
def test_from_dict_rejects_malformed(d):
    with pytest.raises(ValueError):
        Genome.from_dict(d)


def test_evolve_imports_without_tensorflow_or_mpi():
    code = ("import sys, evolve; bad = [m for m in ('tensorflow', 'keras', 'mpi4py') "
            "if m in sys.modules]; print(bad)")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=root, env={"PYTHONPATH": str(root)})
    assert out.stdout.strip() == "[]"
