"""Member specs, the small plain dicts that cross MPI and say what one member is, and the
spec source of an ensemble run: the fixed member list."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import numpy as np

from ensemble.config import member_train_settings


class SpecSource(Protocol):
    """What the master needs from an ensemble list or a search strategy."""

    def next_spec(self) -> dict | None:
        """The next spec to train, or None when nothing can be handed out now."""

    def tell(self, result: dict) -> None:
        """A result has arrived (finished or failed)."""


def derive_seed(*parts: int) -> int:
    """A well-mixed 31-bit seed from the run seed and a member's coordinates."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def member_count(cfg: dict) -> int:
    return sum(arch["members"] for arch in cfg["architectures"])


def member_specs(cfg: dict) -> Iterator[dict]:
    """Every member of an ensemble run, in a fixed order: per architecture, ``members`` seeds.
    Made one at a time, as they are handed out: a list of 100,000 members costs no memory."""
    for a, arch in enumerate(cfg["architectures"]):
        settings = member_train_settings(cfg, arch)
        for j in range(arch["members"]):
            yield {
                "id": f"{arch['name']}-{j:03d}",
                "arch": arch["name"],
                "layers": arch["layers"],
                "model": arch["model"],
                "params": arch["params"],
                "seed": derive_seed(cfg["seed"], a, j),
                **settings,
            }


class SpecList:
    """The fixed member list of an ensemble run, minus members already finished."""

    def __init__(self, specs: Iterable[dict], done_ids: set[str] = frozenset()):
        self.pending = (s for s in specs if s["id"] not in done_ids)

    def next_spec(self) -> dict | None:
        return next(self.pending, None)

    def tell(self, result: dict) -> None:
        pass
