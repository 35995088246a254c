"""Member specs: the small plain dicts that cross MPI and say what one member is."""

from __future__ import annotations

import numpy as np

from ensemble.config import member_train_settings


def derive_seed(*parts: int) -> int:
    """A well-mixed 31-bit seed from the run seed and a member's coordinates."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def member_specs(cfg: dict) -> list[dict]:
    """Every member of an ensemble run, in a fixed order: per architecture, ``members`` seeds."""
    specs = []
    for a, arch in enumerate(cfg["architectures"]):
        settings = member_train_settings(cfg, arch)
        for j in range(arch["members"]):
            specs.append({
                "id": f"{arch['name']}-{j:03d}",
                "arch": arch["name"],
                "layers": arch["layers"],
                "model": arch["model"],
                "params": arch["params"],
                "seed": derive_seed(cfg["seed"], a, j),
                **settings,
            })
    return specs
