"""The structured genome (``search.space = "structured"``): a network good by construction.

Spatial input (sequences, images, volumes): *stages* of conv blocks; each stage after the
first may begin by downsampling (a strided first conv, or max/average pooling) and is at
least as wide as the one before; then the reduction (global average pooling or flatten) and
a few dense layers. Flat tables: a stack of dense blocks. Every block shares the genome's
activation, normalisation (batch norm after each block), residual flag and dropout.

A structured genome is lowered to the free genome's layer genes (``to_genome``), so it is
decoded, counted and built by the same path as a free one (``evolve.decode``), and crosses
MPI and the journal as a plain dict (``to_dict``/``from_dict``, exact round trip; the
``stages`` field tells it from a free genome's ``layers``: ``genome_from_dict``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from evolve.genome import Genome, Keyed, LayerGene, memo
from evolve.space import REDUCTIONS, SearchSpace

#: how a stage begins: as it is, with a strided first conv, or with pooling
DOWNSAMPLES = ("none", "stride", "maxpool", "avgpool")
_STAGE_FIELDS = ("blocks", "width", "kernel", "down", "factor")
_FIELDS = ("stages", "dense", "activation", "norm", "residual", "dropout", "reduction", "optimizer",
           "learning_rate", "batch_size")


def _pos_int(where: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"structured genome {where} must be an integer >= {lo}, but got {v!r}")
    return v


@dataclass(frozen=True)
class Stage:
    """Conv blocks of one width and kernel at one resolution; ``down``/``factor``: how it begins."""

    blocks: int
    width: int
    kernel: int
    down: str = "none"
    factor: int = 1                 # stride or pool size of the downsampling; 1 with "none"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in _STAGE_FIELDS}

    @classmethod
    def from_dict(cls, d: Any) -> "Stage":
        if not isinstance(d, dict) or set(d) != set(_STAGE_FIELDS):
            raise ValueError(f"a stage needs exactly the fields {list(_STAGE_FIELDS)}, but got {d!r}")
        if d["down"] not in DOWNSAMPLES:
            raise ValueError(f"a stage's down must be among {list(DOWNSAMPLES)}, but got {d['down']!r}")
        return cls(_pos_int("stage blocks", d["blocks"]), _pos_int("stage width", d["width"]),
                   _pos_int("stage kernel", d["kernel"]), d["down"], _pos_int("stage factor", d["factor"]))

    def summary(self) -> str:
        down = {"none": "", "stride": f"s{self.factor}", "maxpool": f"MP{self.factor}",
                "avgpool": f"AP{self.factor}"}[self.down]
        return f"{down}{self.blocks}xC{self.width}k{self.kernel}"


@dataclass(frozen=True)
class StructuredGenome(Keyed):
    """Stages, dense widths, shared block settings and training hyperparameters; frozen and hashable.

    ``dense``: the dense layers after the reduction (spatial input) or the dense blocks
    (flat tables, where ``stages`` is empty)."""

    stages: tuple[Stage, ...]
    dense: tuple[int, ...]
    activation: str = "relu"
    norm: bool = True
    residual: bool = False
    dropout: float = 0.0
    reduction: str = "global_average"
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    batch_size: int = 64

    def replace(self, **changes: Any) -> "StructuredGenome":
        if "stages" in changes:
            changes["stages"] = tuple(changes["stages"])
        if "dense" in changes:
            changes["dense"] = tuple(changes["dense"])
        return replace(self, **changes)

    def to_genome(self) -> Genome:
        """The same network as a free genome (layer genes), which ``evolve.decode`` builds
        (made once per genome: ``evolve.genome.memo``).

        A stage: its pooling (if it begins with one), then per block a conv (strided in the
        first block if the stage begins so; residual except in the very first block, whose
        input is the raw channels) and a batch norm. Spatial input: then the dense layers, each
        followed by dropout (or one dropout on the maps when there are none). Tables: dense
        blocks, each with batch norm and dropout, residual but the first."""
        lowered = self.__dict__.get("_lowered")
        if lowered is not None:
            return lowered
        layers: list[LayerGene] = []
        act, rate = self.activation, self.dropout
        first = True
        for st in self.stages:
            if st.down in ("maxpool", "avgpool"):
                layers.append(LayerGene.make(st.down, pool_size=st.factor))
            for b in range(st.blocks):
                stride = st.factor if st.down == "stride" and b == 0 else 1
                layers.append(LayerGene.make("conv", filters=st.width, kernel_size=st.kernel, strides=stride,
                                             activation=act, residual=self.residual and not first))
                first = False
                if self.norm:
                    layers.append(LayerGene.make("batchnorm"))
        table = not self.stages
        for units in self.dense:
            layers.append(LayerGene.make("dense", units=units, activation=act,
                                         residual=table and self.residual and not first))
            first = False
            if table and self.norm:
                layers.append(LayerGene.make("batchnorm"))
            if rate > 0:
                layers.append(LayerGene.make("dropout", rate=rate))
        if rate > 0 and not self.dense:
            layers.append(LayerGene.make("dropout", rate=rate))
        return memo(self, "_lowered", Genome(layers=tuple(layers), optimizer=self.optimizer,
                                             learning_rate=self.learning_rate, batch_size=self.batch_size,
                                             reduction=self.reduction))

    @property
    def depth(self) -> int:
        """Layers of the lowered genome (conv, pooling, batch norm, dense, dropout)."""
        return len(self.to_genome().layers)

    def to_dict(self) -> dict:
        """Plain JSON-able dict; ``StructuredGenome.from_dict(g.to_dict()) == g``."""
        return {"stages": [s.to_dict() for s in self.stages], "dense": list(self.dense),
                "activation": self.activation, "norm": self.norm, "residual": self.residual,
                "dropout": self.dropout, "reduction": self.reduction, "optimizer": self.optimizer,
                "learning_rate": self.learning_rate, "batch_size": self.batch_size}

    @classmethod
    def from_dict(cls, d: dict) -> "StructuredGenome":
        """Inverse of ``to_dict``; raises ValueError on a malformed dict."""
        if not isinstance(d, dict) or set(d) != set(_FIELDS):
            got = sorted(d) if isinstance(d, dict) else d
            raise ValueError(f"a structured genome needs exactly the fields {list(_FIELDS)}, but got {got!r}")
        if not isinstance(d["stages"], (list, tuple)) or not isinstance(d["dense"], (list, tuple)):
            raise ValueError("a structured genome's stages and dense must be lists")
        lr, rate = d["learning_rate"], d["dropout"]
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"genome learning_rate must be a positive number, but got {lr!r}")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise ValueError(f"genome dropout must be in [0, 1), but got {rate!r}")
        for name in ("norm", "residual"):
            if not isinstance(d[name], bool):
                raise ValueError(f"genome {name} must be true or false, but got {d[name]!r}")
        if d["reduction"] not in REDUCTIONS:
            raise ValueError(f"genome reduction must be among {list(REDUCTIONS)}, but got {d['reduction']!r}")
        for name in ("activation", "optimizer"):
            if not isinstance(d[name], str):
                raise ValueError(f"genome {name} must be a name, but got {d[name]!r}")
        return cls(stages=tuple(Stage.from_dict(s) for s in d["stages"]),
                   dense=tuple(_pos_int("dense width", u) for u in d["dense"]),
                   activation=d["activation"], norm=d["norm"], residual=d["residual"], dropout=float(rate),
                   reduction=d["reduction"], optimizer=d["optimizer"], learning_rate=float(lr),
                   batch_size=_pos_int("batch_size", d["batch_size"]))

    def summary(self, input_shape: tuple[int, ...] | list[int] | None = None) -> str:
        """The lowered genome's one line in the genome notation (docs/search.md), e.g.
        ``in 40x1: C32k3(relu)-BN-MP2-C64k3(relu)+r-BN-GAP-D64(relu)-do0.1 | adam lr=1e-3 bs=32``."""
        return self.to_genome().summary(input_shape)


AnyGenome = Genome | StructuredGenome


def genome_from_dict(d: dict) -> AnyGenome:
    """A free or a structured genome from its dict (a journal's, a spec's); ValueError if neither."""
    if isinstance(d, dict) and "stages" in d:
        return StructuredGenome.from_dict(d)
    return Genome.from_dict(d)


# -- the structured space ---------------------------------------------------------------------

def downsamples(space: SearchSpace) -> tuple[tuple[str, int], ...]:
    """(down, factor) a later stage may begin with: strided conv for each stride > 1 in
    ``search.strides``, pooling for each window in ``search.pool_sizes`` when its kind is among
    ``search.layer_types``, and "none" (the stage only widens)."""
    out = [("stride", s) for s in space.strides if s > 1]
    out += [(k, p) for k in ("maxpool", "avgpool") if k in space.layer_types for p in space.pool_sizes]
    return (*out, ("none", 1))


def structure_problem(g: StructuredGenome, space: SearchSpace) -> str | None:
    """Why ``g`` lies outside the structured space (None if inside); shapes are ``analyse``'s."""
    def within(name: str, n: int, bounds: tuple[int, int]) -> str | None:
        return None if bounds[0] <= n <= bounds[1] else f"{n} {name} outside {list(bounds)}"
    if space.spatial:
        why = within("stages", len(g.stages), space.stages) or within(
            "dense layers", len(g.dense), space.dense_layers if "dense" in space.layer_types else (0, 0))
        if why:
            return f"{why} (search.stages, search.dense_layers)"
        downs = downsamples(space)
        for i, st in enumerate(g.stages):
            where = f"stage {i + 1}"
            if (i == 0 and st.down != "none") or (st.down, st.factor) not in downs:
                return f"{where} begins with {st.down} {st.factor}, not allowed there"
            if not space.blocks[0] <= st.blocks <= space.blocks[1]:
                return f"{where} has {st.blocks} blocks, outside search.blocks {list(space.blocks)}"
            if st.width not in space.filter_choices:
                return f"{where} width {st.width} not in search.filters {list(space.filter_choices)}"
            if i and st.width < g.stages[i - 1].width:
                return f"{where} is narrower ({st.width}) than the stage before ({g.stages[i - 1].width})"
            if st.kernel not in space.kernel_sizes:
                return f"{where} kernel {st.kernel} not in search.kernel_sizes"
    elif g.stages:
        return "stages need samples with spatial axes, but these are flat vectors"
    elif not space.blocks[0] <= len(g.dense) <= space.blocks[1]:
        return f"{len(g.dense)} dense blocks outside search.blocks {list(space.blocks)}"
    if any(u not in space.unit_choices for u in g.dense):
        return f"dense widths {list(g.dense)} not all in search.units {list(space.unit_choices)}"
    if g.activation not in space.activations:
        return f"activation {g.activation!r} not in search.activations"
    if g.norm and "batchnorm" not in space.layer_types:
        return "batch norm, but search.layer_types has no 'batchnorm'"
    if g.residual and not space.skip_connections:
        return "residual, but search.skip_connections is false"
    lo, hi = space.dropout if "dropout" in space.layer_types else (0.0, 0.0)
    if not lo - 1e-9 <= g.dropout <= hi + 1e-9:
        return f"dropout {g.dropout:g} outside search.dropout"
    return space.training_problem(g.optimizer, g.batch_size, g.reduction, g.learning_rate)
