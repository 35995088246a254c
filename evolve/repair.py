"""Repair: turn an invalid genome into the nearest valid one, or give up (None).

Fixes, in order: values outside the space are moved to the nearest allowed
value; layer types not in the space are dropped; conv/pooling genes after the
dense head are moved in front of it (stable); pooling past the map is dropped; a
stride on a 1x1 map becomes 1; too deep is trimmed (dropout/batchnorm first),
too shallow is padded with the smallest dense (or conv) layer; too many
parameters halves the widest-costing width (or swaps Flatten for global average
pooling), greedily, until under ``max_params``. A structured genome, or a structured
space, is repaired by ``evolve.structured_operators.repair_structured`` (a free genome
cannot become a structured one: None).
"""

from __future__ import annotations

import math

from evolve.decode import analyse, check
from evolve.genome import Genome, LayerGene
from evolve.space import SPATIAL_TYPES, SearchSpace
from evolve.structured import AnyGenome, StructuredGenome

_WIDTH = {"conv": "filters", "dense": "units"}
_MAX_STEPS = 200


def _is_num(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def nearest(v, choices: tuple, log: bool = False):
    """The allowed value closest to ``v`` (in log2 if ``log``); middle one if ``v`` is junk."""
    if not all(_is_num(c) for c in choices):
        return v if isinstance(v, str) and v in choices else choices[0]
    if not _is_num(v) or (log and v <= 0):
        return choices[len(choices) // 2]
    dist = (lambda c: abs(math.log2(c) - math.log2(v))) if log else (lambda c: abs(c - v))
    return min(choices, key=dist)


def quantize_lr(lr: float, space: SearchSpace) -> float:
    """Two significant digits, clipped into search.learning_rate."""
    lo, hi = space.learning_rate
    if not _is_num(lr) or lr <= 0:
        lr = math.sqrt(lo * hi)
    return min(max(float(f"{lr:.2g}"), lo), hi)


def quantize_rate(rate: float, space: SearchSpace) -> float:
    """Multiples of 0.05, clipped into search.dropout."""
    lo, hi = space.dropout
    if not _is_num(rate):
        rate = (lo + hi) / 2
    return min(max(round(round(rate * 20) / 20, 2), lo), hi)


def clamp_gene(gene: LayerGene, space: SearchSpace) -> LayerGene | None:
    """Gene moved into the space (unknown params dropped); None if its type is not allowed."""
    k = gene.kind
    if k not in space.layer_types:
        return None
    if k in ("conv", "dense"):
        act = gene.get("activation")
        p = {"activation": act if act in space.activations else space.activations[0],
             "residual": bool(gene.get("residual")) and space.skip_connections}
        if k == "conv":
            p["filters"] = nearest(gene.get("filters"), space.filter_choices, log=True)
            p["kernel_size"] = nearest(gene.get("kernel_size"), space.kernel_sizes)
            p["strides"] = nearest(gene.get("strides"), space.strides)
        else:
            p["units"] = nearest(gene.get("units"), space.unit_choices, log=True)
        return LayerGene.make(k, **p)
    if k in ("maxpool", "avgpool"):
        return LayerGene.make(k, pool_size=nearest(gene.get("pool_size"), space.pool_sizes))
    if k == "dropout":
        return LayerGene.make(k, rate=quantize_rate(gene.get("rate"), space))
    return LayerGene.make(k)


def order_layers(layers: list[LayerGene], spatial_input: bool) -> list[LayerGene]:
    """Conv/pooling before the dense head; dropout/batchnorm travel with the layer before."""
    if not spatial_input:
        return [g for g in layers if g.kind not in SPATIAL_TYPES]
    section, keyed = 0, []
    for i, g in enumerate(layers):
        if g.kind in SPATIAL_TYPES:
            section = 0
        elif g.kind == "dense":
            section = 1
        keyed.append((section, i, g))
    return [g for _, _, g in sorted(keyed, key=lambda t: t[:2])]


def _trim(layers: list[LayerGene], max_depth: int) -> list[LayerGene]:
    layers = list(layers)
    while len(layers) > max_depth:
        light = [i for i, g in enumerate(layers) if g.kind in ("dropout", "batchnorm")]
        del layers[light[-1] if light else -1]
    return layers


def _pad(layers: list[LayerGene], space: SearchSpace) -> list[LayerGene] | None:
    layers = list(layers)
    act = space.activations[0]
    while len(layers) < space.min_depth:
        if "dense" in space.layer_types:
            layers.append(LayerGene.make("dense", units=space.unit_choices[0], activation=act,
                                         residual=False))
        elif "conv" in space.layer_types:
            conv = LayerGene.make("conv", filters=space.filter_choices[0], activation=act,
                                  kernel_size=space.kernel_sizes[0], strides=min(space.strides),
                                  residual=False)
            last = max((i for i, g in enumerate(layers) if g.kind in SPATIAL_TYPES), default=-1)
            layers.insert(last + 1, conv)
        else:
            return None
    return layers


def _shrink(g: Genome, input_shape, n_outputs: int, space: SearchSpace) -> Genome | None:
    """One greedy step: the single halving (or Flatten->GAP) that saves the most params."""
    cands = []
    for i, gene in enumerate(g.layers):
        name = _WIDTH.get(gene.kind)
        if name is None:
            continue
        grid = space.filter_choices if gene.kind == "conv" else space.unit_choices
        smaller = [c for c in grid if c < gene.get(name)]
        if smaller:
            layers = list(g.layers)
            layers[i] = gene.replace(**{name: smaller[-1]})
            cands.append(g.replace(layers=layers))
    if (g.reduction == "flatten" and "global_average" in space.reductions
            and any(x.kind in SPATIAL_TYPES for x in g.layers)):
        cands.append(g.replace(reduction="global_average"))
    scored = [(analyse(c, input_shape, n_outputs), c) for c in cands]
    scored = [(a.n_params, c) for a, c in scored if a.problem is None]
    return min(scored, key=lambda t: t[0])[1] if scored else None


def repair(genome: AnyGenome, input_shape: tuple[int, ...], n_outputs: int,
           space: SearchSpace) -> AnyGenome | None:
    """The nearest valid genome, or None if it cannot be fixed. Never raises."""
    if space.structured or isinstance(genome, StructuredGenome):
        if not (space.structured and isinstance(genome, StructuredGenome)):
            return None
        from evolve.structured_operators import repair_structured  # it builds on this module
        return repair_structured(genome, input_shape, n_outputs, space)
    try:
        if check(genome, input_shape, n_outputs, space) is None:
            return genome
        spatial_input = len(input_shape) >= 2
        layers = [c for c in (clamp_gene(x, space) for x in genome.layers) if c is not None]
        layers = _trim(order_layers(layers, spatial_input), space.max_depth)
        g = Genome(layers=tuple(layers), optimizer=nearest(genome.optimizer, space.optimizers),
                   learning_rate=quantize_lr(genome.learning_rate, space),
                   batch_size=nearest(genome.batch_size, space.batch_size),
                   reduction=nearest(genome.reduction, space.reductions))
        for _ in range(_MAX_STEPS):
            if len(g.layers) < space.min_depth:
                padded = _pad(list(g.layers), space)
                if padded is None:
                    return None
                g = g.replace(layers=padded)
                continue
            a = analyse(g, input_shape, n_outputs)
            if a.problem:
                i, layers = a.problem_index, list(g.layers)
                if a.problem_kind == "stride" and 1 in space.strides:
                    layers[i] = layers[i].replace(strides=1)
                elif a.problem_kind in ("pool", "stride", "flat_input", "gene"):
                    del layers[i]
                elif a.problem_kind == "order":
                    layers = order_layers(layers, spatial_input)
                else:
                    return None
                g = g.replace(layers=layers)
                continue
            if a.n_params > space.max_params:
                g = _shrink(g, input_shape, n_outputs, space)
                if g is None:
                    return None
                continue
            break
        return g if check(g, input_shape, n_outputs, space) is None else None
    except Exception:  # noqa: BLE001 - a genome repair cannot mend is dropped, not a crash
        return None
