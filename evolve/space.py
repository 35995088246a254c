"""The search space: which layers, widths and hyperparameters evolution may try.

Built from the ``[search]`` table of the config with ``SearchSpace.from_config``;
every key has a default, so ``[search]`` may be empty. Errors name the key as
``search.<key>`` and say what is allowed.

Two kinds of list: a *range* ``[min, max]`` (``units`` and ``filters``: the powers of two
in between; ``dropout``: uniform; ``learning_rate``: log-uniform) and a *choice* list
(``layer_types``, ``kernel_sizes``, ``strides``, ``pool_sizes``, ``activations``,
``batch_size``, ``optimizers``, ``reductions``: one of the values given, nothing in
between). ``min_depth``/``max_depth`` bound the number of layers; ``max_params`` caps
the size. docs/search.md has the table, with the defaults.

``space`` picks the genome: "free" (a list of layer genes, ``evolve.genome``) or
"structured" (stages of conv blocks with downsampling and widening between them, then a
reduction and dense layers; dense blocks for flat tables: ``evolve.structured``). A *count*
``[min, max]`` (``stages``, ``blocks``, ``dense_layers``: any integer in between) shapes the
structured genome only, as ``min_depth``/``max_depth`` shape the free one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ensemble.config.vocabulary import ACTIVATIONS as _VOCAB_ACTIVATIONS
from ensemble.config.vocabulary import OPTIMIZERS as _VOCAB_OPTIMIZERS

LAYER_TYPES = ("conv", "maxpool", "avgpool", "dense", "dropout", "batchnorm")
SPATIAL_TYPES = frozenset({"conv", "maxpool", "avgpool"})
ACTIVATIONS = _VOCAB_ACTIVATIONS          # one vocabulary with configs and training
OPTIMIZERS = tuple(_VOCAB_OPTIMIZERS)
REDUCTIONS = ("global_average", "global_max", "flatten")
SPACES = ("auto", "free", "structured")


def default_layer_types(input_rank: int) -> tuple[str, ...]:
    """Flat vectors get an MLP space, sequences/images/volumes a conv space."""
    if input_rank == 1:
        return ("dense", "dropout", "batchnorm")
    return ("conv", "maxpool", "dense", "dropout", "batchnorm")


def powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two in [lo, hi]; sampling uniformly from them is log-uniform."""
    return tuple(2 ** e for e in range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1))


def _name(key: str) -> str:
    return f"`search.{key}`"


def _as_int(key: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or int(v) != v:
        raise ValueError(f"{_name(key)} must be an integer >= {lo}, but got {v!r}")
    if v < lo:
        raise ValueError(f"{_name(key)} must be an integer >= {lo}, but got {v!r}")
    return int(v)


def _as_float(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{_name(key)} must be a finite number, but got {v!r}")
    return float(v)


def _as_list(key: str, v: Any, what: str) -> list:
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)) or len(v) == 0:
        raise ValueError(f"{_name(key)} must be a non-empty list of {what}, but got {v!r}")
    return list(v)


def _int_range(key: str, v: Any) -> tuple[int, int]:
    items = _as_list(key, v, "two integers [min, max]")
    if len(items) != 2:
        raise ValueError(f"{_name(key)} must be [min, max] (two integers), but got {v!r}")
    lo, hi = (_as_int(key, x) for x in items)
    if lo > hi:
        raise ValueError(f"{_name(key)} must be [min, max] with min <= max, but got {v!r}")
    if not powers_of_two(lo, hi):
        raise ValueError(f"{_name(key)} must contain a power of two, but got {v!r}")
    return lo, hi


def _count_range(key: str, v: Any, lo: int) -> tuple[int, int]:
    items = _as_list(key, v, "two integers [min, max]")
    if len(items) != 2:
        raise ValueError(f"{_name(key)} must be [min, max] (two integers), but got {v!r}")
    a, b = (_as_int(key, x, lo) for x in items)
    if a > b:
        raise ValueError(f"{_name(key)} must be [min, max] with min <= max, but got {v!r}")
    return a, b


def _choices(key: str, v: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    items = _as_list(key, v, "names")
    out = []
    for x in items:
        if x not in allowed:
            raise ValueError(f"{_name(key)} entries must be among {list(allowed)}, but got {x!r}")
        if x not in out:
            out.append(x)
    return tuple(out)


def _rate_range(key: str, v: Any, lo: float | None, below: float | None) -> tuple[float, float]:
    """A [min, max] range of rates: 0 <= min <= max < 1 (``lo`` 0, ``below`` 1: dropout) or
    0 < min <= max (``lo`` None: a learning rate)."""
    items = _as_list(key, v, "two rates [min, max]")
    a, b = (_as_float(key, x) for x in items) if len(items) == 2 else (math.nan, math.nan)
    if lo is not None and not lo <= a <= b < below:
        raise ValueError(f"{_name(key)} must be [min, max] with {lo:g} <= min <= max < {below:g}, but got {v!r}")
    if lo is None and not 0.0 < a <= b:
        raise ValueError(f"{_name(key)} must be [min, max] with 0 < min <= max, but got {v!r}")
    return a, b


def _int_choices(key: str, v: Any) -> tuple[int, ...]:
    items = _as_list(key, v, "positive integers")
    return tuple(sorted({_as_int(key, x) for x in items}))


class SpaceError(ValueError):
    """Every problem of a ``[search]`` table (``problems``), one per line when printed."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class SearchSpace:
    """Ranges and choices for genomes; frozen so it can be shared and pickled."""

    input_rank: int
    layer_types: tuple[str, ...]                      # choice
    min_depth: int = 1                                # number of layer genes, with max_depth
    max_depth: int = 6
    units: tuple[int, int] = (16, 512)                # range [min, max]: the powers of two in it
    filters: tuple[int, int] = (8, 128)               # range [min, max]: the powers of two in it
    kernel_sizes: tuple[int, ...] = (1, 3, 5, 7)      # choice
    strides: tuple[int, ...] = (1, 2)                 # choice
    pool_sizes: tuple[int, ...] = (2,)                # choice
    activations: tuple[str, ...] = ("relu", "elu", "gelu", "tanh", "swish")   # choice
    dropout: tuple[float, float] = (0.0, 0.5)         # range [min, max], uniform (steps of 0.05)
    skip_connections: bool = True
    learning_rate: tuple[float, float] = (1e-4, 1e-2)  # range [min, max], log-uniform
    batch_size: tuple[int, ...] = (16, 32, 64, 128)   # choice
    optimizers: tuple[str, ...] = ("adam", "sgd", "rmsprop", "adamw")         # choice
    reductions: tuple[str, ...] = REDUCTIONS          # choice: spatial maps -> vector (GAP, GMP, Flatten)
    max_params: int = 2_000_000
    space: str = "auto"                               # the genome: free layer list or structured; "auto":
                                                      # structured for spatial input, free for tables
    stages: tuple[int, int] = (1, 3)                  # structured, spatial: count [min, max]
    blocks: tuple[int, int] = (1, 3)                  # structured: conv blocks per stage; tables: dense blocks
    dense_layers: tuple[int, int] = (0, 2)            # structured, spatial: dense layers after the reduction

    KEYS: ClassVar[frozenset[str]] = frozenset({
        "layer_types", "min_depth", "max_depth", "units", "filters", "kernel_sizes",
        "strides", "pool_sizes", "activations", "dropout", "skip_connections",
        "learning_rate", "batch_size", "optimizers", "reductions", "max_params",
        "space", "stages", "blocks", "dense_layers"})

    def __post_init__(self) -> None:
        if self.space == "auto":
            # structured where the suite chose it (spatial input, docs/search-benchmark.md), unless the
            # layer types leave it no conv blocks to build; tables keep the free MLP space
            object.__setattr__(self, "space", "structured" if self.input_rank > 1 and "conv" in self.layer_types
                               else "free")

    #: the keys only one genome reads: the other ignores them (``unused_keys``)
    FREE_ONLY: ClassVar[tuple[str, ...]] = ("min_depth", "max_depth")
    STRUCTURED_ONLY: ClassVar[tuple[str, ...]] = ("stages", "blocks", "dense_layers")

    def unused_keys(self, given: Mapping[str, Any]) -> list[str]:
        """The keys of ``given`` (the config's ``[search]``) that this space's genome does not
        read: ``min_depth``/``max_depth`` under the structured genome (its depth is stages x
        blocks, and dense layers), ``stages``/``blocks``/``dense_layers`` under the free one."""
        other = self.FREE_ONLY if self.structured else self.STRUCTURED_ONLY
        return [k for k in other if k in given]

    @property
    def unit_choices(self) -> tuple[int, ...]:
        return powers_of_two(*self.units)

    @property
    def filter_choices(self) -> tuple[int, ...]:
        return powers_of_two(*self.filters)

    @property
    def structured(self) -> bool:
        """True for ``search.space = "structured"`` (genomes are ``StructuredGenome``)."""
        return self.space == "structured"

    @property
    def spatial(self) -> bool:
        """True when samples have spatial axes (rank 2-4, channels last)."""
        return self.input_rank >= 2

    def training_problem(self, optimizer: str, batch_size: int, reduction: str,
                         learning_rate: float) -> str | None:
        """Why a genome's training settings and reduction fall outside this space (None: they
        do not); the one check of them for free and structured genomes alike."""
        if optimizer not in self.optimizers:
            return f"optimizer {optimizer!r} not in search.optimizers"
        if batch_size not in self.batch_size:
            return f"batch_size {batch_size} not in search.batch_size"
        if reduction not in self.reductions:
            return f"reduction {reduction!r} not in search.reductions"
        lo, hi = self.learning_rate
        if not lo * (1 - 1e-9) <= learning_rate <= hi * (1 + 1e-9):
            return f"learning_rate {learning_rate:g} outside search.learning_rate"
        return None

    @classmethod
    def from_config(cls, d: Mapping[str, Any] | None, input_rank: int) -> "SearchSpace":
        """Validate the ``[search]`` table; ``input_rank`` is the rank of one sample. Every
        problem at once: raises ``SpaceError`` listing them."""
        if isinstance(input_rank, bool) or input_rank not in (1, 2, 3, 4):
            raise SpaceError(["evolve needs samples of rank 1 (vectors), 2 (sequences), "
                              f"3 (images) or 4 (volumes), but the input rank is {input_rank!r}"])
        errors: list[str] = []
        kw = cls._parse(dict(d or {}), input_rank, errors)
        if errors:
            raise SpaceError(errors)
        return cls(**kw)

    @classmethod
    def problems(cls, d: Mapping[str, Any] | None) -> list[str]:
        """What is wrong with the ``[search]`` table whatever the data (the checks that need the
        samples' rank are left to ``from_config``): for the config's own check."""
        errors: list[str] = []
        cls._parse(dict(d or {}), None, errors)
        return errors

    @classmethod
    def _parse(cls, d: dict, input_rank: int | None, errors: list[str]) -> dict[str, Any]:
        """The keyword arguments of a space from ``d``, each problem appended to ``errors`` (a key
        found wrong is left at its default, so the checks after it still run); ``input_rank``
        None leaves out the checks that need it."""
        unknown = sorted(set(d) - cls.KEYS)
        if unknown:
            errors.append(f"{_name(unknown[0])} is not a search setting; allowed keys are {sorted(cls.KEYS)}")
        kw: dict[str, Any] = {"input_rank": input_rank}
        rank = 2 if input_rank is None else input_rank          # the default layer types of spatial data

        def take(key: str, parse: Any) -> None:
            if key in d:
                try:
                    kw[key] = parse(d[key])
                except ValueError as exc:
                    errors.append(str(exc))

        lt = default_layer_types(rank)
        if "layer_types" in d:
            try:
                lt = _choices("layer_types", d["layer_types"], LAYER_TYPES)
                if not {"conv", "dense"} & set(lt):
                    raise ValueError(f"{_name('layer_types')} needs at least one of 'conv', 'dense', "
                                     f"but got {list(lt)}")
                if input_rank == 1 and SPATIAL_TYPES & set(lt):
                    bad = sorted(SPATIAL_TYPES & set(lt))[0]
                    raise ValueError(f"{_name('layer_types')} entry {bad!r} needs samples of rank 2-4 "
                                     "(sequences, images, volumes), but the input samples are flat vectors (rank "
                                     "1): give them their shape with `data.reshape` (for signals of 64 values, "
                                     "[64, 1]), or leave the spatial types out")
            except ValueError as exc:
                errors.append(str(exc))
                lt = default_layer_types(rank)
        kw["layer_types"] = lt
        take("min_depth", lambda v: _as_int("min_depth", v))
        take("max_depth", lambda v: _as_int("max_depth", v, lo=0))
        min_depth, max_depth = kw.get("min_depth", cls.min_depth), kw.get("max_depth", cls.max_depth)
        if max_depth < min_depth:
            errors.append(f"{_name('max_depth')} must be >= {_name('min_depth')} ({min_depth}), but got {max_depth}")
        for key in ("units", "filters"):
            take(key, lambda v, key=key: _int_range(key, v))
        for key in ("kernel_sizes", "strides", "pool_sizes", "batch_size"):
            take(key, lambda v, key=key: _int_choices(key, v))
        if "pool_sizes" in kw and min(kw["pool_sizes"]) < 2:
            errors.append(f"{_name('pool_sizes')} entries must be >= 2, but got {list(kw.pop('pool_sizes'))}")
        take("activations", lambda v: _choices("activations", v, ACTIVATIONS))
        take("optimizers", lambda v: _choices("optimizers", v, OPTIMIZERS))
        take("reductions", lambda v: _choices("reductions", v, REDUCTIONS))
        take("dropout", lambda v: _rate_range("dropout", v, 0.0, 1.0))
        take("learning_rate", lambda v: _rate_range("learning_rate", v, None, None))
        if "skip_connections" in d:
            if isinstance(d["skip_connections"], bool):
                kw["skip_connections"] = d["skip_connections"]
            else:
                errors.append(f"{_name('skip_connections')} must be true or false, but got {d['skip_connections']!r}")
        take("max_params", lambda v: _as_int("max_params", v))
        if "space" in d:
            if d["space"] in SPACES:
                kw["space"] = d["space"]
            else:
                errors.append(f"{_name('space')} must be one of {', '.join(map(repr, SPACES))}, but got {d['space']!r}")
        for key, lo in (("stages", 1), ("blocks", 1), ("dense_layers", 0)):
            take(key, lambda v, key=key, lo=lo: _count_range(key, v, lo))
        if kw.get("space") == "structured" and input_rank is not None:
            need = "conv" if input_rank > 1 else "dense"
            if need not in lt:
                errors.append(f"{_name('space')} \"structured\" on samples of rank {input_rank} builds "
                              f"{need} blocks, so {_name('layer_types')} must include {need!r}, but got {list(lt)}")
            elif input_rank > 1 and "dense" not in lt and kw.get("dense_layers", cls.dense_layers)[0] > 0:
                errors.append(f"{_name('dense_layers')} asks for at least one dense layer, but "
                              f"{_name('layer_types')} has no 'dense': {list(lt)}")
        return kw

    def to_config(self) -> dict:
        """The resolved ``[search]`` table (JSON/TOML-able), defaults filled in."""
        out: dict[str, Any] = {}
        for key in sorted(self.KEYS):
            v = getattr(self, key)
            out[key] = list(v) if isinstance(v, tuple) else v
        return out
