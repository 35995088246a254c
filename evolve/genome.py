"""Genome: an immutable, hashable description of one network and its training.

A genome is a tuple of layer genes plus hyperparameters. It crosses MPI and goes
into the journal as a plain dict (``to_dict``/``from_dict``, exact round trip);
``key()`` is a stable content hash used as the fitness-cache key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, TypeVar

from evolve.space import LAYER_TYPES, REDUCTIONS

T = TypeVar("T")

Scalar = int | float | str | bool


@dataclass(frozen=True)
class LayerGene:
    """One layer: its kind ('conv', 'dense', ...) and params sorted by name."""

    kind: str
    params: tuple[tuple[str, Scalar], ...] = ()

    @classmethod
    def make(cls, kind: str, **params: Scalar) -> "LayerGene":
        return cls(kind, tuple(sorted(params.items())))

    def get(self, name: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == name:
                return v
        return default

    def replace(self, **changes: Scalar) -> "LayerGene":
        """A copy with some params changed (or added)."""
        d = dict(self.params)
        d.update(changes)
        return LayerGene.make(self.kind, **d)

    def to_dict(self) -> dict:
        return {"type": self.kind, **dict(self.params)}

    @classmethod
    def from_dict(cls, d: dict) -> "LayerGene":
        if not isinstance(d, dict) or d.get("type") not in LAYER_TYPES:
            raise ValueError(f"a layer gene needs 'type' among {list(LAYER_TYPES)}, but got {d!r}")
        params = {k: v for k, v in d.items() if k != "type"}
        for k, v in params.items():
            if not isinstance(v, (int, float, str, bool)):
                raise ValueError(f"layer gene param {k!r} must be a scalar, but got {v!r}")
        return cls.make(d["type"], **params)

    def summary(self) -> str:
        """This layer in the genome notation (docs/search.md): ``C32k3s2(relu)`` conv with 32
        filters, kernel 3, stride 2 (left out when 1) and its activation; ``MP2``/``AP2`` max/
        average pooling over 2; ``D128(gelu)`` dense; ``do0.2`` dropout; ``BN`` batch
        normalisation; a ``+r`` suffix marks a residual (skip) connection."""
        k = self.kind
        act = f"({self.get('activation')})" if self.get("activation") is not None else ""
        if k == "conv":
            s = f"C{self.get('filters')}k{self.get('kernel_size')}"
            s += (f"s{self.get('strides')}" if self.get("strides", 1) != 1 else "") + act
        elif k in ("maxpool", "avgpool"):
            s = ("MP" if k == "maxpool" else "AP") + str(self.get("pool_size"))
        elif k == "dense":
            s = f"D{self.get('units')}{act}"
        elif k == "dropout":
            s = f"do{self.get('rate'):g}"
        elif k == "batchnorm":
            s = "BN"
        else:
            s = k
        return s + ("+r" if self.get("residual") else "")


def format_sci(x: float) -> str:
    """Compact scientific notation: 1e-3 rather than 0.001 or 1.0e-03; 1.2e7."""
    mant, exp = f"{x:.1e}".split("e")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}e{int(exp)}"


def memo(genome: Any, name: str, value: T) -> T:
    """Keep ``value`` on a frozen genome (its key, its lowering: functions of its fields,
    which never change) and return it. Not a field: equality, hashing and ``replace`` ignore
    it, and pickling leaves it out (``unmemoed``)."""
    genome.__dict__[name] = value
    return value


def unmemoed(genome: Any) -> dict:
    """A genome's pickled state: its fields, without what ``memo`` kept."""
    return {k: v for k, v in genome.__dict__.items() if not k.startswith("_")}


class Keyed:
    """What both kinds of genome (free, structured) share: the content key of their
    ``to_dict``, made once (``memo``), and a pickled state without what was memoised."""

    def to_dict(self) -> dict:
        raise NotImplementedError

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def key(self) -> str:
        """Stable content hash (same in every process and run); made once per genome."""
        return self.__dict__.get("_key") or memo(self, "_key",
                                                 hashlib.sha1(self.canonical_json().encode()).hexdigest()[:16])

    def __getstate__(self) -> dict:
        return unmemoed(self)


@dataclass(frozen=True)
class Genome(Keyed):
    """Layers plus training hyperparameters; frozen, hashable and picklable."""

    layers: tuple[LayerGene, ...]
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    batch_size: int = 64
    reduction: str = "global_average"  # how a conv stack meets the dense head

    @property
    def depth(self) -> int:
        return len(self.layers)

    def replace(self, **changes: Any) -> "Genome":
        d = {"layers": self.layers, "optimizer": self.optimizer,
             "learning_rate": self.learning_rate, "batch_size": self.batch_size,
             "reduction": self.reduction}
        d.update(changes)
        d["layers"] = tuple(d["layers"])
        return Genome(**d)

    def to_dict(self) -> dict:
        """Plain JSON-able dict; ``Genome.from_dict(g.to_dict()) == g``."""
        return {"layers": [g.to_dict() for g in self.layers], "optimizer": self.optimizer,
                "learning_rate": self.learning_rate, "batch_size": self.batch_size,
                "reduction": self.reduction}

    @classmethod
    def from_dict(cls, d: dict) -> "Genome":
        """Inverse of ``to_dict``; raises ValueError on a malformed dict."""
        if not isinstance(d, dict) or not isinstance(d.get("layers"), (list, tuple)):
            raise ValueError(f"a genome dict needs a 'layers' list, but got {d!r}")
        unknown = set(d) - {"layers", "optimizer", "learning_rate", "batch_size", "reduction"}
        if unknown:
            raise ValueError(f"unknown genome fields {sorted(unknown)}")
        lr, bs = d.get("learning_rate", 1e-3), d.get("batch_size", 64)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"genome learning_rate must be a positive number, but got {lr!r}")
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise ValueError(f"genome batch_size must be a positive integer, but got {bs!r}")
        red = d.get("reduction", "global_average")
        if red not in REDUCTIONS:
            raise ValueError(f"genome reduction must be among {list(REDUCTIONS)}, but got {red!r}")
        return cls(layers=tuple(LayerGene.from_dict(x) for x in d["layers"]),
                   optimizer=str(d.get("optimizer", "adam")), learning_rate=float(lr),
                   batch_size=bs, reduction=red)

    def summary(self, input_shape: tuple[int, ...] | list[int] | None = None) -> str:
        """One line: how the input is treated, the layers in order, the hyperparameters,
        e.g. ``in 8x8x1: C32k3(relu)-MP2-GAP-D128(elu)-do0.2 | adam lr=1e-3 bs=64``.

        ``GAP`` (global average pooling), ``GMP`` (global max pooling) or ``Flatten`` marks
        where spatial maps become one vector (``reduction``): before the first dense layer
        after spatial input, or at the end. ``in 8x8x1:`` / ``in 64:`` is the shape of one
        sample the network sees (after ``data.reshape``); only with ``input_shape`` can a
        genome without conv/pooling layers show whether its input is a flat vector or an
        image reduced first (``GAP-D128``). The notation is documented in docs/search.md."""
        shape = tuple(int(n) for n in input_shape) if input_shape is not None else None
        spatial = shape is not None and len(shape) > 1
        reduce_ = {"flatten": "Flatten", "global_max": "GMP"}.get(self.reduction, "GAP")
        tokens = []
        for gene in self.layers:
            if gene.kind == "dense" and spatial:
                tokens.append(reduce_)
                spatial = False
            elif gene.kind in ("conv", "maxpool", "avgpool"):
                spatial = True
            tokens.append(gene.summary())
        if spatial:
            tokens.append(reduce_)
        body = "-".join(tokens) or "(no hidden layers)"
        head = f"in {'x'.join(map(str, shape))}: " if shape is not None else ""
        return f"{head}{body} | {self.optimizer} lr={format_sci(self.learning_rate)} bs={self.batch_size}"
