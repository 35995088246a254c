"""Genome -> layer list for the model builder, with pure-Python shape inference.

``decode`` emits the layer schema that ``ensemble/architecture.py`` turns into
Keras (it appends the output layer itself). ``analyse`` infers shapes and counts
parameters without TensorFlow; ``check`` says why a genome is invalid for a
search space, ``repair`` (in ``evolve.repair``) fixes what can be fixed.

Conventions the builder must share, so the parameter count is exact:
conv padding is 'same' (out = ceil(n / stride)); pooling is 'valid' with
strides = pool_size (out = floor(n / pool)); a residual layer whose input and
output shapes differ projects its input with a 1x1 conv (same strides, bias) or a
Dense (bias); BatchNormalization counts 4 * channels (trainable + moving stats).

Batch normalisation in a searched network keeps its moving statistics with momentum
``BN_MOMENTUM`` (0.9, PyTorch's default and the NAS literature's), not Keras' 0.99: a
candidate trains for a few hundred steps and is judged on validation with the moving
statistics, which at 0.99 still lag far behind the batch statistics. On the suite's
signals (900 training samples, batch 32, early stopping with patience 4) the small CNN
template scored 0.35-0.48 validation accuracy at 0.99, stopped after 6-7 epochs, and
0.71-0.78 at 0.9 (docs/search-benchmark.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from evolve.genome import Genome, memo
from evolve.space import SPATIAL_TYPES, SearchSpace
from evolve.structured import AnyGenome, StructuredGenome, structure_problem

#: momentum of the moving mean and variance of a searched network's batch normalisation
BN_MOMENTUM = 0.9


@dataclass
class Analysis:
    """What a genome decodes to, or the first structural problem found."""

    layers: list[dict] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)  # after each layer
    n_params: int = 0  # hidden layers + residual projections + output layer
    problem: str | None = None
    problem_kind: str | None = None  # pool | stride | order | flat_input | gene | input
    problem_index: int | None = None  # 0-based gene index of the problem


def _fmt_map(spatial: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in spatial)


def _pos_int(gene, name: str) -> int:
    v = gene.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{gene.kind} param {name!r} must be a positive integer, but got {v!r}")
    return v


def analyse(genome: AnyGenome, input_shape: tuple[int, ...], n_outputs: int = 1) -> Analysis:
    """Decode and count parameters; never raises (problems go into ``.problem``). A
    structured genome is analysed as the free genome it lowers to. Made once per genome and
    input (kept on the genome, ``evolve.genome.memo``: repair, the surrogate's features and
    the build all read it); treat the answer as read-only."""
    if isinstance(genome, StructuredGenome):
        genome = genome.to_genome()
    try:
        memo_key: tuple | None = (tuple(int(n) for n in input_shape), int(n_outputs))
    except (TypeError, ValueError):
        memo_key = None
    done = genome.__dict__.get("_analyses")
    if done is not None and memo_key in done:
        return done[memo_key]
    out = _analyse(genome, input_shape, n_outputs)
    if memo_key is not None:
        if done is None:
            done = memo(genome, "_analyses", {})
        done[memo_key] = out
    return out


def _analyse(genome: Genome, input_shape: tuple[int, ...], n_outputs: int) -> Analysis:
    out = Analysis()
    try:
        shape = tuple(int(n) for n in input_shape)
        if not 1 <= len(shape) <= 4 or min(shape) < 1:
            raise ValueError
    except (TypeError, ValueError):
        out.problem, out.problem_kind = f"bad input shape {input_shape!r}", "input"
        return out
    d = len(shape) - 1  # number of spatial axes
    spatial: tuple[int, ...] | None = shape[:-1] if d else None
    ch = shape[-1]
    params = 0
    head_at: int | None = None  # gene index where the dense head started

    def reduce_() -> None:
        nonlocal spatial, ch
        if genome.reduction == "flatten":
            out.layers.append({"type": "Flatten"})
            ch = math.prod(spatial) * ch
        else:
            pooling = "GlobalMaxPooling" if genome.reduction == "global_max" else "GlobalAveragePooling"
            out.layers.append({"type": f"{pooling}{d}D"})
        spatial = None
        out.shapes.append((ch,))

    for i, gene in enumerate(genome.layers):
        where = f"at layer {i + 1}"
        try:
            if gene.kind in SPATIAL_TYPES:
                if d == 0:
                    out.problem = (f"{gene.kind} {where} needs spatial input, "
                                   "but samples are flat vectors")
                    out.problem_kind, out.problem_index = "flat_input", i
                    return out
                if spatial is None:
                    out.problem = (f"{gene.kind} {where} comes after the dense head "
                                   f"(starting at layer {head_at + 1})")
                    out.problem_kind, out.problem_index = "order", i
                    return out
            if gene.kind == "conv":
                f, k, s = (_pos_int(gene, n) for n in ("filters", "kernel_size", "strides"))
                if s > 1 and max(spatial) == 1:
                    out.problem = f"stride {s} on a {_fmt_map(spatial)} map {where}"
                    out.problem_kind, out.problem_index = "stride", i
                    return out
                layer = {"type": f"Conv{d}D", "filters": f, "kernel_size": k, "strides": s,
                         "padding": "same", "activation": str(gene.get("activation"))}
                params += k ** d * ch * f + f
                if gene.get("residual"):
                    layer["residual"] = True
                    if ch != f or s > 1:
                        params += ch * f + f
                spatial, ch = tuple(-(-n // s) for n in spatial), f
            elif gene.kind in ("maxpool", "avgpool"):
                p = _pos_int(gene, "pool_size")
                if min(spatial) < p:
                    past = "past a" if max(spatial) == 1 else "a"
                    out.problem = f"pooling {past} {_fmt_map(spatial)} map {where} (pool_size {p})"
                    out.problem_kind, out.problem_index = "pool", i
                    return out
                kind = "MaxPooling" if gene.kind == "maxpool" else "AveragePooling"
                layer = {"type": f"{kind}{d}D", "pool_size": p, "padding": "valid"}  # builder default: "same"
                spatial = tuple(n // p for n in spatial)
            elif gene.kind == "dense":
                if spatial is not None:
                    reduce_()
                if head_at is None:
                    head_at = i
                u = _pos_int(gene, "units")
                layer = {"type": "Dense", "units": u, "activation": str(gene.get("activation"))}
                params += ch * u + u
                if gene.get("residual"):
                    layer["residual"] = True
                    if ch != u:
                        params += ch * u + u
                ch = u
            elif gene.kind == "dropout":
                rate = gene.get("rate")
                if (isinstance(rate, bool) or not isinstance(rate, (int, float))
                        or not 0 <= rate < 1):
                    raise ValueError(f"dropout rate must be in [0, 1), but got {rate!r}")
                layer = {"type": "Dropout", "rate": float(rate)}
            elif gene.kind == "batchnorm":
                layer = {"type": "BatchNormalization", "momentum": BN_MOMENTUM}
                params += 4 * ch
            else:
                raise ValueError(f"unknown layer type {gene.kind!r}")
        except ValueError as e:
            out.problem, out.problem_kind, out.problem_index = f"layer {i + 1}: {e}", "gene", i
            return out
        out.layers.append(layer)
        out.shapes.append((*spatial, ch) if spatial is not None else (ch,))
    if spatial is not None:
        reduce_()
    n_out = max(int(n_outputs), 1)
    out.n_params = params + ch * n_out + n_out
    return out


def count_params(genome: AnyGenome, input_shape: tuple[int, ...], n_outputs: int) -> int | None:
    """Parameter count including the output layer, or None if the genome is broken."""
    a = analyse(genome, input_shape, n_outputs)
    return None if a.problem else a.n_params


def _space_problem(genome: AnyGenome, space: SearchSpace) -> str | None:
    """Why the genome lies outside the search space (None if inside)."""
    if space.structured or isinstance(genome, StructuredGenome):
        if not (space.structured and isinstance(genome, StructuredGenome)):
            kind = "structured" if isinstance(genome, StructuredGenome) else "free"
            return f"a {kind} genome, but search.space is {space.space!r}"
        return structure_problem(genome, space)
    if not space.min_depth <= genome.depth <= space.max_depth:
        return (f"depth {genome.depth} outside [{space.min_depth}, {space.max_depth}] "
                "(search.min_depth, search.max_depth)")
    problem = space.training_problem(genome.optimizer, genome.batch_size, genome.reduction,
                                     genome.learning_rate)
    if problem:
        return problem
    allowed = {"units": space.unit_choices, "filters": space.filter_choices,
               "kernel_size": space.kernel_sizes, "strides": space.strides,
               "pool_size": space.pool_sizes, "activation": space.activations}
    for i, g in enumerate(genome.layers):
        if g.kind not in space.layer_types:
            return f"layer {i + 1} type {g.kind!r} not in search.layer_types"
        for name, v in g.params:
            if name in allowed and v not in allowed[name]:
                return f"layer {i + 1} {name} {v!r} not in the search space {list(allowed[name])}"
            if name == "rate" and not space.dropout[0] - 1e-9 <= v <= space.dropout[1] + 1e-9:
                return f"layer {i + 1} dropout rate {v!r} outside search.dropout"
            if name == "residual" and v and not space.skip_connections:
                return f"layer {i + 1} is residual but search.skip_connections is false"
    return None


def check(genome: AnyGenome, input_shape: tuple[int, ...], n_outputs: int,
          space: SearchSpace) -> str | None:
    """The reason ``genome`` is invalid for this data and space, or None. Never raises."""
    return _problem(genome, space, lambda: analyse(genome, input_shape, n_outputs))


def _problem(genome: AnyGenome, space: SearchSpace, analysis) -> str | None:
    """``check``'s verdict, the analysis made by ``analysis()`` (once, after the space's own
    rules pass)."""
    try:
        reason = _space_problem(genome, space)
        if reason:
            return reason
        a = analysis()
        if a.problem:
            return a.problem
        if a.n_params > space.max_params:
            return f"{a.n_params:,} parameters > max_params {space.max_params:,}"
        return None
    except Exception as e:  # noqa: BLE001 - a malformed genome is a reason, not a crash
        return f"malformed genome: {type(e).__name__}: {e}"


def decode(genome: AnyGenome, input_shape: tuple[int, ...], space: SearchSpace | None = None,
           n_outputs: int | None = None) -> list[dict]:
    """Layer dicts for the model builder (output layer not included).

    Raises ValueError with the reason when the genome cannot be built; with
    ``space`` and ``n_outputs`` given it must also satisfy ``check``.
    """
    a = analyse(genome, input_shape, n_outputs or 1)
    reason = a.problem
    if reason is None and space is not None and n_outputs is not None:
        reason = _problem(genome, space, lambda: a)              # the analysis above, not a second one
    if reason:
        try:
            name = genome.summary(input_shape)
        except Exception:  # noqa: BLE001 - a genome too broken to summarise is named by its repr
            name = repr(genome)
        raise ValueError(f"cannot decode genome {name}: {reason}")
    return [dict(layer) for layer in a.layers]      # the caller's own: the analysis is kept on the genome
