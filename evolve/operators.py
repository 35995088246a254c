"""Variation and selection operators: plain functions over genomes and a numpy Generator.

Every genome these functions return is valid for the space (``check`` is None):
results are repaired, and an operator that cannot produce a valid child falls
back to a random genome. A structured space (``search.space = "structured"``) is handed to
its own operators (``evolve.structured_operators``), so callers need not know which it
is. DEAP's tools do the one-point crossover; they draw from Python's
``random`` module, so each call runs under ``python_random_from(rng)``, which seeds ``random`` from the Generator and
restores its previous state afterwards: results depend on ``rng`` only.
"""

from __future__ import annotations

import math
import random
from contextlib import contextmanager
from typing import Any, Iterator, Sequence, TypeVar

import numpy as np
from deap import base, tools

from evolve.decode import check
from evolve.genome import Genome, LayerGene
from evolve.repair import quantize_lr, quantize_rate, repair
from evolve.space import SPATIAL_TYPES, SearchSpace
from evolve.structured import AnyGenome, StructuredGenome
from evolve.structured_operators import crossover_structured, mutate_structured, random_structured

T = TypeVar("T")
MAX_TRIES = 30


class ObjectiveFitness(base.Fitness):
    """DEAP fitness with every objective maximised; weights per instance (no deap.creator)."""

    def __init__(self, values: Sequence[float] = ()):
        self.weights = (1.0,) * len(values)
        super().__init__(tuple(values))


class Candidate:
    """Lightweight individual for DEAP selection: an index and a fitness."""

    __slots__ = ("index", "fitness")

    def __init__(self, index: int, values: Sequence[float]):
        self.index = index
        self.fitness = ObjectiveFitness(values)


@contextmanager
def python_random_from(rng: np.random.Generator) -> Iterator[None]:
    """Seed ``random`` from ``rng`` for DEAP, then restore the caller's state."""
    saved = random.getstate()
    random.seed(int(rng.integers(2 ** 63)))
    try:
        yield
    finally:
        random.setstate(saved)


def _pick(rng: np.random.Generator, seq: Sequence[T]) -> T:
    return seq[int(rng.integers(len(seq)))]


_KIND_WEIGHTS = {"conv": 3.0, "dense": 3.0, "maxpool": 1.5, "avgpool": 1.5,
                 "dropout": 1.0, "batchnorm": 1.0}


def _pick_kind(rng: np.random.Generator, kinds: Sequence[str]) -> str:
    """Weight-bearing layers (conv, dense) are drawn more often than the rest."""
    w = np.array([_KIND_WEIGHTS[k] for k in kinds])
    return kinds[int(rng.choice(len(kinds), p=w / w.sum()))]


def _other(rng: np.random.Generator, seq: Sequence[T], current: Any) -> T:
    rest = [x for x in seq if x != current]
    return _pick(rng, rest) if rest else current


def random_gene(kind: str, rng: np.random.Generator, space: SearchSpace) -> LayerGene:
    """A gene of ``kind`` with every param drawn from the space."""
    if kind in ("conv", "dense"):
        p: dict[str, Any] = {"activation": _pick(rng, space.activations),
                             "residual": space.skip_connections and bool(rng.random() < 0.3)}
        if kind == "conv":
            p.update(filters=_pick(rng, space.filter_choices),
                     kernel_size=_pick(rng, space.kernel_sizes),
                     strides=_pick(rng, space.strides))
        else:
            p["units"] = _pick(rng, space.unit_choices)
        return LayerGene.make(kind, **p)
    if kind in ("maxpool", "avgpool"):
        return LayerGene.make(kind, pool_size=_pick(rng, space.pool_sizes))
    if kind == "dropout":
        return LayerGene.make(kind, rate=quantize_rate(float(rng.uniform(*space.dropout)), space))
    return LayerGene.make(kind)


def random_lr(rng: np.random.Generator, space: SearchSpace) -> float:
    lo, hi = space.learning_rate
    return quantize_lr(math.exp(rng.uniform(math.log(lo), math.log(hi))), space)


def random_genome(rng: np.random.Generator, space: SearchSpace, input_shape: tuple[int, ...],
                  n_outputs: int, compact: bool = False) -> AnyGenome:
    """A valid random genome; ValueError if the space admits none (e.g. max_params too small).
    ``compact``: a structured genome is drawn small (``random_structured``); a free one as always."""
    if space.structured:
        return random_structured(rng, space, input_shape, n_outputs, compact)
    reason = None
    for _ in range(MAX_TRIES):
        depth = int(rng.integers(space.min_depth, space.max_depth + 1))
        layers = tuple(random_gene(_pick_kind(rng, space.layer_types), rng, space)
                       for _ in range(depth))
        g = Genome(layers=layers, optimizer=_pick(rng, space.optimizers),
                   learning_rate=random_lr(rng, space), batch_size=_pick(rng, space.batch_size),
                   reduction=_pick(rng, space.reductions) if len(input_shape) > 1
                   else space.reductions[0])  # flat input: reduction is moot, keep it canonical
        fixed = repair(g, input_shape, n_outputs, space)
        if fixed is not None:
            return fixed
        reason = check(g, input_shape, n_outputs, space)
    raise ValueError(f"found no valid genome for input shape {tuple(input_shape)} in "
                     f"{MAX_TRIES} tries (last reason: {reason}); widen the search space, "
                     "e.g. raise `search.max_params`")


def _change_param(gene: LayerGene, rng: np.random.Generator, space: SearchSpace) -> LayerGene:
    """One param of ``gene`` moved: widths step on the power-of-two grid, choices resampled."""
    names = [n for n, _ in gene.params]
    if not names:
        return gene
    name = _pick(rng, names)
    v = gene.get(name)
    if name in ("units", "filters"):
        grid = space.unit_choices if name == "units" else space.filter_choices
        i = grid.index(v) if v in grid else len(grid) // 2
        new = grid[min(max(i + _pick(rng, (-1, 1)), 0), len(grid) - 1)]
    elif name == "residual":
        new = (not v) and space.skip_connections
    elif name == "rate":
        new = quantize_rate(v + float(rng.normal(0.0, 0.1)), space)
    else:
        choices = {"kernel_size": space.kernel_sizes, "strides": space.strides,
                   "pool_size": space.pool_sizes, "activation": space.activations}[name]
        new = _other(rng, choices, v)
    return gene.replace(**{name: new})


def _change_hyper(g: Genome, rng: np.random.Generator, space: SearchSpace,
                  spatial: bool) -> Genome:
    names = ("optimizer", "learning_rate", "batch_size") + (("reduction",) if spatial else ())
    name = _pick(rng, names)
    if name == "optimizer":
        return g.replace(optimizer=_other(rng, space.optimizers, g.optimizer))
    if name == "learning_rate":
        return g.replace(learning_rate=quantize_lr(
            g.learning_rate * 10 ** float(rng.normal(0.0, 0.3)), space))
    if name == "batch_size":
        sizes = space.batch_size
        i = sizes.index(g.batch_size) if g.batch_size in sizes else 0
        return g.replace(batch_size=sizes[min(max(i + _pick(rng, (-1, 1)), 0), len(sizes) - 1)])
    return g.replace(reduction=_other(rng, space.reductions, g.reduction))


def mutate(genome: AnyGenome, rng: np.random.Generator, space: SearchSpace,
           input_shape: tuple[int, ...], n_outputs: int) -> AnyGenome:
    """A valid child differing from ``genome``.

    One of: add, remove, replace a layer; change one layer param (widths step on
    the power-of-two grid); change one hyperparameter. Retried until the repaired
    child is valid and new, else a random genome."""
    if space.structured:
        return mutate_structured(genome, rng, space, input_shape, n_outputs)
    if isinstance(genome, StructuredGenome):
        return random_genome(rng, space, input_shape, n_outputs)
    kinds = [k for k in space.layer_types if len(input_shape) >= 2 or k not in SPATIAL_TYPES]
    for _ in range(MAX_TRIES):
        layers, n = list(genome.layers), genome.depth
        ops = ["change", "replace", "hyper"] if n else ["hyper"]
        ops += ["add"] if n < space.max_depth else []
        ops += ["remove"] if n > space.min_depth else []
        op = _pick(rng, ops)
        child = genome
        if op == "add":
            layers.insert(int(rng.integers(n + 1)), random_gene(_pick_kind(rng, kinds), rng, space))
        elif op == "remove":
            del layers[int(rng.integers(n))]
        elif op == "change":
            i = int(rng.integers(n))
            layers[i] = _change_param(layers[i], rng, space)
        elif op == "replace":
            layers[int(rng.integers(n))] = random_gene(_pick_kind(rng, kinds), rng, space)
        else:
            child = _change_hyper(genome, rng, space, len(input_shape) > 1)
        if op != "hyper":
            child = genome.replace(layers=layers)
        child = repair(child, input_shape, n_outputs, space)
        if child is not None and child != genome:
            return child
    return random_genome(rng, space, input_shape, n_outputs)


def crossover(a: AnyGenome, b: AnyGenome, rng: np.random.Generator, space: SearchSpace,
              input_shape: tuple[int, ...], n_outputs: int) -> tuple[AnyGenome, AnyGenome]:
    """One-point crossover of the layer lists (deap.tools.cxOnePoint) and uniform
    crossover of the hyperparameters; children are repaired (a parent stands in if not)."""
    if isinstance(a, StructuredGenome) or isinstance(b, StructuredGenome):
        if isinstance(a, StructuredGenome) and isinstance(b, StructuredGenome):
            return crossover_structured(a, b, rng, space, input_shape, n_outputs)
        return a, b
    la, lb = list(a.layers), list(b.layers)
    if min(len(la), len(lb)) >= 2:
        with python_random_from(rng):
            tools.cxOnePoint(la, lb)
    else:  # too short for cxOnePoint: cut-and-splice at independent points
        ca, cb = int(rng.integers(len(la) + 1)), int(rng.integers(len(lb) + 1))
        la, lb = la[:ca] + lb[cb:], lb[:cb] + la[ca:]
    hyper_a, hyper_b = {}, {}
    for name in ("optimizer", "learning_rate", "batch_size", "reduction"):
        va, vb = getattr(a, name), getattr(b, name)
        if rng.random() < 0.5:
            va, vb = vb, va
        hyper_a[name], hyper_b[name] = va, vb
    ca_ = repair(Genome(layers=tuple(la), **hyper_a), input_shape, n_outputs, space)
    cb_ = repair(Genome(layers=tuple(lb), **hyper_b), input_shape, n_outputs, space)
    return (ca_ if ca_ is not None else a), (cb_ if cb_ is not None else b)


def tournament(items: Sequence[T], fitnesses: Sequence[float | None], k: int,
               rng: np.random.Generator) -> T:
    """Best of ``k`` items drawn with replacement (as ``deap.tools.selTournament``: the first
    drawn wins a tie); None or NaN fitness counts as -inf. Drawn with ``rng`` itself: DEAP's
    reseeding of ``random`` for one tournament cost ten times the draw (a child is bred from
    one, and a surrogate screens a dozen children per child trained)."""
    if not items:
        raise ValueError("tournament needs at least one item")
    drawn = rng.integers(len(items), size=max(int(k), 1))
    best, winner = -math.inf, int(drawn[0])
    for i in drawn.tolist():
        f = fitnesses[i]
        if f is not None and not math.isnan(f) and f > best:
            best, winner = f, i
    return items[winner]
