"""Member specs, the small plain dicts that cross MPI and say what one member is, and the
spec source of an ensemble run: the fixed member list."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from ensemble.config import RunConfig, member_train_settings
from ensemble.results.records import MemberRecord
from ensemble.sources.base import Hooks

_M32 = 0xFFFFFFFF


def _hash_constants(calls: int) -> list[tuple[int, int]]:
    """numpy's SeedSequence hashmix multiplies by a constant that steps with every call,
    whatever the values: the (xor, multiply) pair of each call, computed once."""
    const, out = 0x43B0D7E5, []
    for _ in range(calls):
        xor = const
        const = (const * 0x931E8875) & _M32
        out.append((xor, const))
    return out


_HASH = _hash_constants(64)


def derive_seed(*parts: int) -> int:
    """A well-mixed 31-bit seed from the run seed and a member's coordinates: the first word
    of ``numpy.random.SeedSequence(parts).generate_state(1)``, masked to 31 bits, computed
    in plain Python with the hash's constants computed once (the master makes one per
    member it hands out: about 5 us; the test checks it against numpy)."""
    entropy = []
    for part in parts:                     # numpy's coercion: each int as little-endian 32-bit words
        part = int(part)
        if part < 0:
            raise ValueError(f"seed parts must be >= 0, but got {part}")
        entropy.append(part & _M32)
        while part > _M32:
            part >>= 32
            entropy.append(part & _M32)
    h = _HASH if len(entropy) <= 4 + (len(_HASH) - 16) // 4 else _hash_constants(16 + 4 * len(entropy))
    pool = []
    for i in range(4):
        xor, mult = h[i]
        v = (((entropy[i] if i < len(entropy) else 0) ^ xor) * mult) & _M32
        pool.append(v ^ (v >> 16))
    k = 4
    for src in range(4):
        for dst in range(4):
            if src != dst:
                xor, mult = h[k]
                k += 1
                v = ((pool[src] ^ xor) * mult) & _M32
                r = (0xCA01F9DD * pool[dst] - 0x4973F715 * (v ^ (v >> 16))) & _M32
                pool[dst] = r ^ (r >> 16)
    for word in entropy[4:]:
        for dst in range(4):
            xor, mult = h[k]
            k += 1
            v = ((word ^ xor) * mult) & _M32
            r = (0xCA01F9DD * pool[dst] - 0x4973F715 * (v ^ (v >> 16))) & _M32
            pool[dst] = r ^ (r >> 16)
    value = ((pool[0] ^ 0x8B51F9DD) * ((0x8B51F9DD * 0x58F38DED) & _M32)) & _M32
    return (value ^ (value >> 16)) & 0x7FFFFFFF


class Others(Collection[str]):
    """The member ids a source skips: those ``done`` and those not ``mine`` (another
    sub-master's share of the list, ``RunContext.mine``); iterating gives the done ones."""

    def __init__(self, done: Collection[str], mine: Callable[[str], bool]):
        self.done, self.mine = done, mine

    def __contains__(self, member_id: object) -> bool:
        return member_id in self.done or not self.mine(str(member_id))

    def __iter__(self) -> Iterator[str]:
        return iter(self.done)

    def __len__(self) -> int:
        return len(self.done)


def member_count(cfg: RunConfig) -> int:
    return sum(arch.members for arch in cfg.architectures)


def member_specs(cfg: RunConfig, skip: Collection[str] = frozenset()) -> Iterator[dict]:
    """Every member of an ensemble run, in a fixed order: per architecture, ``members`` seeds,
    less the ids in ``skip``. Made one at a time, as they are handed out: a list of 100,000
    members costs no memory, and skipping 100,000 finished ones costs no seeds."""
    for a in range(len(cfg.architectures)):
        yield from arch_specs(cfg, a, skip)


def arch_specs(cfg: RunConfig, a: int, skip: Collection[str] = frozenset()) -> Iterator[dict]:
    """The members of architecture number ``a``, in order, less the ids in ``skip``."""
    arch = cfg.architectures[a]
    settings = member_train_settings(cfg, arch).to_dict()
    layers = None if arch.layers is None else [dict(layer) for layer in arch.to_dict()["layers"]]
    for j in range(arch.members):
        member_id = f"{arch.name}-{j:03d}"
        if member_id in skip:
            continue
        yield {
            "id": member_id,
            "arch": arch.name,
            "layers": layers,
            "model": arch.model,
            "params": dict(arch.params),
            "seed": derive_seed(cfg.seed, a, j),
            **settings,
        }


def prior_cost(spec: dict) -> float:
    """A member's cost before anything is measured, in arbitrary units: its epochs times
    (1 + the widths of its layers: units, filters x kernel area). Only its order between
    architectures matters, and only until each architecture's first member has ended."""
    width = 0.0
    for layer in spec.get("layers") or []:
        kernel = layer.get("kernel_size", 1)
        area = float(kernel) ** 2 if isinstance(kernel, int | float) else float(sum(kernel) ** 2 / 4)
        width += float(layer.get("units", 0) or 0) + float(layer.get("filters", 0) or 0) * area
    return float(spec.get("epochs", 1) or 1) * (1.0 + width)


class SpecList:
    """The fixed member list of an ensemble run, minus members already finished (a Source)."""

    def __init__(self, specs: Iterable[dict], done_ids: Collection[str] = frozenset(), total: int | None = None):
        self.pending = (s for s in specs if s["id"] not in done_ids)
        self.total = total
        self._dry = False

    def bind(self, hooks: Hooks) -> None:
        pass

    def next_spec(self) -> dict | None:
        spec = next(self.pending, None)
        self._dry = spec is None
        return spec

    def dry(self) -> bool:
        return self._dry

    def tell(self, record: MemberRecord) -> MemberRecord:
        return record

    def finish(self, records: list[MemberRecord]) -> dict[str, Any]:
        return {}


class CostOrdered(SpecList):
    """The member list, longest predicted first (``runtime.order = "cost"``): the longest
    processing time rule, which leaves the short members for the end of the run, where
    they fill the workers around the last long ones.

    A member's predicted cost is its architecture's mean training seconds measured so far
    in this run; an architecture not measured yet is predicted from ``prior_cost`` scaled by
    what the measured ones cost per unit of it (before any result: the prior alone). Within
    an architecture the list order stays (their members are alike: nothing to predict), so
    one architecture is handed out exactly as the list; every member goes out once. The
    architecture being handed out stays until another is predicted ``1 / STICK`` times
    longer, so near-equal ones do not alternate (a packing worker packs one architecture)."""

    STICK = 0.8

    def __init__(self, cfg: RunConfig, done_ids: Collection[str] = frozenset(), total: int | None = None,
                 last: Collection[str] = frozenset()):
        super().__init__((), done_ids, total)
        # ``last``: members that failed in an earlier job, tried again once every other member is out
        self.pending_by_arch = {arch.name: (s for s in arch_specs(cfg, a, done_ids) if s["id"] not in last)
                                for a, arch in enumerate(cfg.architectures)}
        self.retries = (s for s in member_specs(cfg, done_ids) if s["id"] in last) if last else iter(())
        self.heads: dict[str, dict | None] = {name: next(it, None) for name, it in self.pending_by_arch.items()}
        self.prior = {name: prior_cost(spec) for name, spec in self.heads.items() if spec is not None}
        self.seconds: dict[str, tuple[float, int]] = {}        # arch -> (sum of seconds, count)
        self.current: str | None = None

    def predicted(self, arch: str) -> float:
        """The predicted seconds (or prior units, before any measurement) of ``arch``'s members."""
        if arch in self.seconds:
            total, n = self.seconds[arch]
            return total / n
        rates = [s / n / self.prior[a] for a, (s, n) in self.seconds.items() if self.prior.get(a)]
        return self.prior.get(arch, 1.0) * (sum(rates) / len(rates) if rates else 1.0)

    def next_spec(self) -> dict | None:
        live = [name for name, spec in self.heads.items() if spec is not None]
        if not live:
            spec = next(self.retries, None)
            self._dry = spec is None
            return spec
        name = max(live, key=self.predicted)           # ties: the first in the list
        if self.current in live and self.predicted(self.current) >= self.STICK * self.predicted(name):
            name = self.current                        # no flapping between near-equal architectures
        self.current = name
        spec = self.heads[name]
        self.heads[name] = next(self.pending_by_arch[name], None)
        return spec

    def tell(self, record: MemberRecord) -> MemberRecord:
        if record.ok and record.arch in self.heads and record.train_seconds is not None:
            total, n = self.seconds.get(record.arch, (0.0, 0))
            self.seconds[record.arch] = (total + float(record.train_seconds), n + 1)
        return record
