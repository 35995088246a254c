"""Operators of the structured space: draw, repair, mutate and cross structured genomes.

Every genome returned is valid for the space (``check`` is None), as with the free
operators (``evolve.operators``, which hand structured spaces to these). Mutations move
within the structure: add or remove a block, a stage or a dense layer; step a width
along its power-of-two grid (stages stay non-decreasing); change a kernel, how a stage
downsamples, the activation, normalisation, residual flag, dropout, reduction, optimizer,
learning rate or batch size. Repair moves values into the space, keeps the widths
non-decreasing, makes a stage that would shrink its maps past 1 start without
downsampling, and shrinks the network greedily (the change that saves the most
parameters) until it is under ``max_params``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from evolve.decode import analyse, check
from evolve.repair import nearest, quantize_lr, quantize_rate
from evolve.space import SearchSpace
from evolve.structured import AnyGenome, Stage, StructuredGenome, downsamples

T = TypeVar("T")
MAX_TRIES = 30
_MAX_STEPS = 200
_SCALARS = ("activation", "norm", "residual", "dropout", "reduction", "optimizer", "learning_rate", "batch_size")


def _pick(rng: np.random.Generator, seq: Sequence[T]) -> T:
    return seq[int(rng.integers(len(seq)))]


def _other(rng: np.random.Generator, seq: Sequence[T], current: Any) -> T:
    rest = [x for x in seq if x != current]
    return _pick(rng, rest) if rest else current


def _step(rng: np.random.Generator, grid: Sequence[int], value: int) -> int:
    """One step up or down the grid from ``value`` (its nearest point if off the grid)."""
    i = grid.index(value) if value in grid else len(grid) // 2
    return grid[min(max(i + _pick(rng, (-1, 1)), 0), len(grid) - 1)]


def _dense_bounds(space: SearchSpace) -> tuple[int, int]:
    """How many dense widths a genome has: layers after the reduction, or the table's blocks."""
    if not space.spatial:
        return space.blocks
    return space.dense_layers if "dense" in space.layer_types else (0, 0)


def _kernels(space: SearchSpace) -> tuple[int, ...]:
    """Kernels a stage is drawn with: wider than 1 where the space allows (a 1x1-only stage sees no
    neighbours); mutation and repair may still use any of ``search.kernel_sizes``."""
    return tuple(k for k in space.kernel_sizes if k > 1) or space.kernel_sizes


def _ordered(stages: list[Stage], i: int) -> list[Stage]:
    """Widths non-decreasing around stage ``i``, whose width was just set: narrower before, wider after."""
    w = stages[i].width
    return [st if j == i else Stage(st.blocks, min(st.width, w) if j < i else max(st.width, w),
                                           st.kernel, st.down, st.factor) for j, st in enumerate(stages)]


# -- repair --------------------------------------------------------------------------------------

def clamp(g: StructuredGenome, space: SearchSpace) -> StructuredGenome:
    """``g`` moved into the space's values and counts (shapes and size are not judged here)."""
    downs = downsamples(space)
    stages: list[Stage] = []
    if space.spatial:
        given = list(g.stages)[: space.stages[1]]
        while len(given) < space.stages[0]:
            last = given[-1] if given else Stage(space.blocks[0], space.filter_choices[0], _kernels(space)[0])
            given.append(Stage(space.blocks[0], last.width, last.kernel, *downs[0]))
        width = 0
        for i, st in enumerate(given):
            w = max(nearest(st.width, space.filter_choices, log=True), width)
            width = w
            down: tuple[str, int] = (st.down, st.factor)
            if i == 0:
                down = ("none", 1)
            elif down not in downs:
                same = [d for d in downs if d[0] == st.down]
                down = min(same, key=lambda d: abs(d[1] - st.factor)) if same else downs[0]
            stages.append(Stage(min(max(st.blocks, space.blocks[0]), space.blocks[1]), w,
                                nearest(st.kernel, space.kernel_sizes), *down))
    lo, hi = _dense_bounds(space)
    dense = [nearest(u, space.unit_choices, log=True) for u in g.dense][:hi]
    while len(dense) < lo:
        dense.append(dense[-1] if dense else space.unit_choices[0])
    act = g.activation if g.activation in space.activations else (
        "relu" if "relu" in space.activations else space.activations[0])
    return StructuredGenome(
        stages=tuple(stages), dense=tuple(dense), activation=act,
        norm=bool(g.norm) and "batchnorm" in space.layer_types,
        residual=bool(g.residual) and space.skip_connections,
        dropout=quantize_rate(g.dropout, space) if "dropout" in space.layer_types else 0.0,
        reduction=nearest(g.reduction, space.reductions) if space.spatial else space.reductions[0],
        optimizer=nearest(g.optimizer, space.optimizers), learning_rate=quantize_lr(g.learning_rate, space),
        batch_size=nearest(g.batch_size, space.batch_size))


def _stage_at(g: StructuredGenome, gene_index: int) -> int | None:
    """The stage whose lowered layers include gene ``gene_index`` (``StructuredGenome.to_genome``)."""
    end = 0
    for i, st in enumerate(g.stages):
        end += (st.down in ("maxpool", "avgpool")) + st.blocks * (1 + g.norm)
        if gene_index < end:
            return i
    return None


def _smaller(g: StructuredGenome, space: SearchSpace) -> list[StructuredGenome]:
    """Every one-step shrink: a stage or dense width down a grid step, a block, stage or dense
    layer fewer, Flatten -> global average pooling."""
    out = []
    lo, _ = _dense_bounds(space)
    for i, st in enumerate(g.stages):
        narrower = [w for w in space.filter_choices if w < st.width]
        if narrower:
            stages = list(g.stages)
            stages[i] = Stage(st.blocks, narrower[-1], st.kernel, st.down, st.factor)
            out.append(g.replace(stages=_ordered(stages, i)))
        if st.blocks > space.blocks[0]:
            stages = list(g.stages)
            stages[i] = Stage(st.blocks - 1, st.width, st.kernel, st.down, st.factor)
            out.append(g.replace(stages=stages))
    if len(g.stages) > space.stages[0]:
        out.append(g.replace(stages=g.stages[:-1]))
    for i, u in enumerate(g.dense):
        narrower = [w for w in space.unit_choices if w < u]
        if narrower:
            out.append(g.replace(dense=g.dense[:i] + (narrower[-1],) + g.dense[i + 1:]))
    if len(g.dense) > lo:
        out.append(g.replace(dense=g.dense[:-1]))
    if g.reduction == "flatten" and "global_average" in space.reductions and g.stages:
        out.append(g.replace(reduction="global_average"))
    return out


def repair_structured(g: AnyGenome, input_shape: tuple[int, ...], n_outputs: int,
                      space: SearchSpace) -> StructuredGenome | None:
    """The nearest valid structured genome, or None if it cannot be fixed. Never raises."""
    try:
        if not isinstance(g, StructuredGenome):
            return None
        if check(g, input_shape, n_outputs, space) is None:
            return g
        g = clamp(g, space)
        for _ in range(_MAX_STEPS):
            a = analyse(g, input_shape, n_outputs)
            if a.problem:
                i = (_stage_at(g, a.problem_index) if a.problem_kind in ("pool", "stride")
                     and a.problem_index is not None else None)
                if i is None or g.stages[i].down == "none":
                    return None
                stages = list(g.stages)
                stages[i] = Stage(stages[i].blocks, stages[i].width, stages[i].kernel)
                g = g.replace(stages=stages)
                continue
            if a.n_params > space.max_params:
                analysed = [(analyse(c, input_shape, n_outputs), c) for c in _smaller(g, space)]
                sizes = [(x.n_params, c) for x, c in analysed if x.problem is None]
                if not sizes:
                    return None
                g = min(sizes, key=lambda t: t[0])[1]
                continue
            break
        return g if check(g, input_shape, n_outputs, space) is None else None
    except Exception:  # noqa: BLE001 - a genome repair cannot mend is dropped, not a crash
        return None


# -- draw ----------------------------------------------------------------------------------------

def _widths(rng: np.random.Generator, grid: Sequence[int], n: int) -> list[int]:
    """``n`` dense widths, a funnel: each the same as the one before or a grid step narrower."""
    i = int(rng.integers(len(grid)))
    out = []
    for _ in range(n):
        out.append(grid[i])
        i = max(i - int(rng.random() < 0.5), 0)
    return out


def _low(rng: np.random.Generator, bounds: tuple[int, int], compact: bool) -> int:
    """A count within ``bounds``: any (uniform); ``compact``, the least or one more."""
    lo, hi = bounds
    return int(rng.integers(lo, (min(hi, lo + 1) if compact else hi) + 1))


def _draw(rng: np.random.Generator, space: SearchSpace, compact: bool = False) -> StructuredGenome:
    stages: list[Stage] = []
    if space.spatial:
        grid = space.filter_choices
        i = int(rng.integers(max(1, (len(grid) + 1) // 2)))          # start in the narrower half
        downs = [d for d in downsamples(space) if d[0] != "none"] or [("none", 1)]
        for s in range(_low(rng, space.stages, compact)):
            if s:
                i = min(i + int(rng.random() < 0.7), len(grid) - 1)  # widen, mostly
            stages.append(Stage(space.blocks[0] if compact else _low(rng, space.blocks, False), grid[i],
                                _pick(rng, _kernels(space)), *(_pick(rng, downs) if s else ("none", 1))))
    lo, hi = _dense_bounds(space)
    lr_lo, lr_hi = space.learning_rate
    return StructuredGenome(
        stages=tuple(stages), dense=tuple(_widths(rng, space.unit_choices, _low(rng, (lo, hi), compact))),
        activation=_pick(rng, space.activations),
        norm="batchnorm" in space.layer_types and bool(rng.random() < 0.5),
        residual=space.skip_connections and bool(rng.random() < 0.5),
        dropout=(quantize_rate(float(rng.uniform(*space.dropout)), space) if rng.random() < 0.5
                 else space.dropout[0]) if "dropout" in space.layer_types else 0.0,
        reduction=_pick(rng, space.reductions) if space.spatial else space.reductions[0],
        optimizer=_pick(rng, space.optimizers),
        learning_rate=quantize_lr(math.exp(rng.uniform(math.log(lr_lo), math.log(lr_hi))), space),
        batch_size=_pick(rng, space.batch_size))


def random_structured(rng: np.random.Generator, space: SearchSpace, input_shape: tuple[int, ...],
                      n_outputs: int, compact: bool = False) -> StructuredGenome:
    """A valid random structured genome; ValueError if the space admits none. ``compact``: the
    fewest stages or one more, the fewest blocks in each, the fewest dense layers or one more
    (the other genes drawn as always)."""
    reason = None
    for _ in range(MAX_TRIES):
        g = _draw(rng, space, compact)
        fixed = repair_structured(g, input_shape, n_outputs, space)
        if fixed is not None:
            return fixed
        reason = check(g, input_shape, n_outputs, space)
    raise ValueError(f"found no valid structured genome for input shape {tuple(input_shape)} in "
                     f"{MAX_TRIES} tries (last reason: {reason}); widen the search space, "
                     "e.g. raise `search.max_params` or lower `search.stages`")


# -- mutate --------------------------------------------------------------------------------------

def _operations(g: StructuredGenome, space: SearchSpace) -> dict[str, Callable[[np.random.Generator],
                                                                               StructuredGenome]]:
    """The mutations that apply to ``g``, by name, each drawing what it changes from ``rng``."""
    ops: dict[str, Callable[[np.random.Generator], StructuredGenome]] = {}
    stages, n = list(g.stages), len(g.stages)
    blo, bhi = space.blocks

    def blocks(delta: int) -> Callable[[np.random.Generator], StructuredGenome]:
        def op(rng: np.random.Generator) -> StructuredGenome:
            fit = [i for i, st in enumerate(stages) if blo <= st.blocks + delta <= bhi]
            i = _pick(rng, fit)
            st = stages[i]
            stages_ = stages[:i] + [Stage(st.blocks + delta, st.width, st.kernel, st.down, st.factor)] + stages[i + 1:]
            return g.replace(stages=stages_)
        return op

    def add_stage(rng: np.random.Generator) -> StructuredGenome:
        p = int(rng.integers(1, n + 1))
        prev = stages[p - 1]
        grid = space.filter_choices
        wider = grid[min(grid.index(prev.width) + 1, len(grid) - 1)] if prev.width in grid else prev.width
        downs = [d for d in downsamples(space) if d[0] != "none"] or [("none", 1)]
        return g.replace(stages=stages[:p] + [Stage(blo, wider, prev.kernel, *_pick(rng, downs))] + stages[p:])

    def width(rng: np.random.Generator) -> StructuredGenome:
        i = int(rng.integers(n))
        st = stages[i]
        changed = stages[:i] + [Stage(st.blocks, _step(rng, space.filter_choices, st.width), st.kernel,
                                      st.down, st.factor)] + stages[i + 1:]
        return g.replace(stages=_ordered(changed, i))

    def kernel(rng: np.random.Generator) -> StructuredGenome:
        i = int(rng.integers(n))
        st = stages[i]
        return g.replace(stages=stages[:i] + [Stage(st.blocks, st.width, _other(rng, space.kernel_sizes, st.kernel),
                                                    st.down, st.factor)] + stages[i + 1:])

    def down(rng: np.random.Generator) -> StructuredGenome:
        i = int(rng.integers(1, n))
        st = stages[i]
        d = _other(rng, downsamples(space), (st.down, st.factor))
        return g.replace(stages=stages[:i] + [Stage(st.blocks, st.width, st.kernel, *d)] + stages[i + 1:])

    if space.spatial:
        if any(st.blocks < bhi for st in stages):
            ops["add_block"] = blocks(1)
        if any(st.blocks > blo for st in stages):
            ops["remove_block"] = blocks(-1)
        if n < space.stages[1]:
            ops["add_stage"] = add_stage
        if n > space.stages[0]:
            ops["remove_stage"] = lambda rng: g.replace(stages=_without(rng, stages))
        if len(space.filter_choices) > 1:
            ops["width"] = width
        if len(space.kernel_sizes) > 1:
            ops["kernel"] = kernel
        if n > 1 and len(downsamples(space)) > 1:
            ops["down"] = down
        if len(space.reductions) > 1:
            ops["reduction"] = lambda rng: g.replace(reduction=_other(rng, space.reductions, g.reduction))
    dense, (dlo, dhi) = list(g.dense), _dense_bounds(space)
    if len(dense) < dhi:
        ops["add_dense"] = lambda rng: g.replace(dense=_insert(rng, dense, space))
    if len(dense) > dlo:
        ops["remove_dense"] = lambda rng: g.replace(dense=_without(rng, dense))
    if dense and len(space.unit_choices) > 1:
        ops["dense_width"] = lambda rng: g.replace(dense=_restep(rng, dense, space.unit_choices))
    if len(space.activations) > 1:
        ops["activation"] = lambda rng: g.replace(activation=_other(rng, space.activations, g.activation))
    if "batchnorm" in space.layer_types:
        ops["norm"] = lambda rng: g.replace(norm=not g.norm)
    if space.skip_connections:
        ops["residual"] = lambda rng: g.replace(residual=not g.residual)
    if "dropout" in space.layer_types and space.dropout[1] > space.dropout[0]:
        ops["dropout"] = lambda rng: g.replace(dropout=quantize_rate(g.dropout + float(rng.normal(0.0, 0.1)),
                                                                     space))
    if len(space.optimizers) > 1:
        ops["optimizer"] = lambda rng: g.replace(optimizer=_other(rng, space.optimizers, g.optimizer))
    if space.learning_rate[1] > space.learning_rate[0]:
        ops["learning_rate"] = lambda rng: g.replace(learning_rate=quantize_lr(
            g.learning_rate * 10 ** float(rng.normal(0.0, 0.3)), space))
    if len(space.batch_size) > 1:
        ops["batch_size"] = lambda rng: g.replace(batch_size=_step(rng, space.batch_size, g.batch_size))
    return ops


def _without(rng: np.random.Generator, items: list[T]) -> list[T]:
    """``items`` less one drawn at random."""
    i = int(rng.integers(len(items)))
    return items[:i] + items[i + 1:]


def _insert(rng: np.random.Generator, dense: list[int], space: SearchSpace) -> list[int]:
    """A dense width added: a copy of a neighbour (or a random width into an empty list)."""
    p = int(rng.integers(len(dense) + 1))
    width = dense[min(p, len(dense) - 1)] if dense else _pick(rng, space.unit_choices)
    return dense[:p] + [width] + dense[p:]


def _restep(rng: np.random.Generator, dense: list[int], grid: Sequence[int]) -> list[int]:
    i = int(rng.integers(len(dense)))
    return dense[:i] + [_step(rng, grid, dense[i])] + dense[i + 1:]


def mutate_structured(g: AnyGenome, rng: np.random.Generator, space: SearchSpace,
                      input_shape: tuple[int, ...], n_outputs: int) -> StructuredGenome:
    """A valid child differing from ``g`` by one move within the structure; random if none is found
    (or ``g`` is a free genome)."""
    if isinstance(g, StructuredGenome):
        ops = _operations(g, space)
        names = sorted(ops)
        for _ in range(MAX_TRIES if names else 0):
            child = repair_structured(ops[_pick(rng, names)](rng), input_shape, n_outputs, space)
            if child is not None and child != g:
                return child
    return random_structured(rng, space, input_shape, n_outputs)


def crossover_structured(a: StructuredGenome, b: StructuredGenome, rng: np.random.Generator,
                         space: SearchSpace, input_shape: tuple[int, ...],
                         n_outputs: int) -> tuple[StructuredGenome, StructuredGenome]:
    """Stages cut and spliced at a point of each parent (the dense lists too, for tables), dense
    heads swapped whole or not, the shared settings swapped one by one; repaired (a parent
    stands in for a child that cannot be)."""
    def splice(x: tuple, y: tuple) -> tuple[tuple, tuple]:
        i, j = int(rng.integers(len(x) + 1)), int(rng.integers(len(y) + 1))
        return x[:i] + y[j:], y[:j] + x[i:]
    sa, sb = splice(a.stages, b.stages)
    da, db = splice(a.dense, b.dense) if not space.spatial else (
        (b.dense, a.dense) if rng.random() < 0.5 else (a.dense, b.dense))
    va, vb = {}, {}
    for name in _SCALARS:
        x, y = getattr(a, name), getattr(b, name)
        if rng.random() < 0.5:
            x, y = y, x
        va[name], vb[name] = x, y
    ca = repair_structured(StructuredGenome(stages=sa, dense=da, **va), input_shape, n_outputs, space)
    cb = repair_structured(StructuredGenome(stages=sb, dense=db, **vb), input_shape, n_outputs, space)
    return (ca if ca is not None else a), (cb if cb is not None else b)
