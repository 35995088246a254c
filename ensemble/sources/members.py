"""Member specs, the small plain dicts that cross MPI and say what one member is, and the
spec source of an ensemble run: the fixed member list."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Any

from ensemble.config import RunConfig, member_train_settings
from ensemble.results.records import MemberRecord
from ensemble.sources.base import Hooks

_M32 = 0xFFFFFFFF


def derive_seed(*parts: int) -> int:
    """A well-mixed 31-bit seed from the run seed and a member's coordinates: the first word
    of ``numpy.random.SeedSequence(parts).generate_state(1)``, masked to 31 bits, computed
    in plain Python (3x cheaper: the master makes one per member it hands out; the test
    checks it against numpy)."""
    entropy = []
    for part in parts:                     # numpy's coercion: each int as little-endian 32-bit words
        part = int(part)
        if part < 0:
            raise ValueError(f"seed parts must be >= 0, but got {part}")
        entropy.append(part & _M32)
        while part > _M32:
            part >>= 32
            entropy.append(part & _M32)
    const = 0x43B0D7E5

    def hashmix(value: int) -> int:
        nonlocal const
        value ^= const
        const = (const * 0x931E8875) & _M32
        value = (value * const) & _M32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        r = (0xCA01F9DD * x - 0x4973F715 * y) & _M32
        return r ^ (r >> 16)

    pool = [hashmix(entropy[i] if i < len(entropy) else 0) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for word in entropy[4:]:
        for dst in range(4):
            pool[dst] = mix(pool[dst], hashmix(word))
    value = ((pool[0] ^ 0x8B51F9DD) * ((0x8B51F9DD * 0x58F38DED) & _M32)) & _M32
    return (value ^ (value >> 16)) & 0x7FFFFFFF


def member_count(cfg: RunConfig) -> int:
    return sum(arch.members for arch in cfg.architectures)


def member_specs(cfg: RunConfig, skip: Collection[str] = frozenset()) -> Iterator[dict]:
    """Every member of an ensemble run, in a fixed order: per architecture, ``members`` seeds,
    less the ids in ``skip``. Made one at a time, as they are handed out: a list of 100,000
    members costs no memory, and skipping 100,000 finished ones costs no seeds."""
    for a, arch in enumerate(cfg.architectures):
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


class SpecList:
    """The fixed member list of an ensemble run, minus members already finished (a Source)."""

    def __init__(self, specs: Iterable[dict], done_ids: Collection[str] = frozenset(), total: int | None = None):
        self.pending = (s for s in specs if s["id"] not in done_ids)
        self.total = total

    def bind(self, hooks: Hooks) -> None:
        pass

    def next_spec(self) -> dict | None:
        return next(self.pending, None)

    def tell(self, record: MemberRecord) -> MemberRecord:
        return record

    def finish(self, records: list[MemberRecord]) -> dict[str, Any]:
        return {}
