"""Layer 4: one object per mode (``base.Mode``), registered here by the name ``mode`` takes.

``mode_of(cfg)`` is how the rest of the code reaches a mode: the session asks it for its
source and decider, the worker for its trainer, the preflight for its checks, status for
its section. ``make_trainer`` chooses a worker's trainer: rehearsal (no TensorFlow), a
user's trainer factory (``runtime.trainer = "pkg.mod:fn"``), or the mode's Keras trainer.
"""

from __future__ import annotations

from ensemble.config import RunConfig
from ensemble.config.vocabulary import MODES as MODE_NAMES
from ensemble.modes.base import Mode, RunContext
from ensemble.modes.ensemble_list import EnsembleMode
from ensemble.modes.evolve import EvolveMode
from ensemble.modes.online import OnlineMode
from ensemble.modes.pbt import PbtMode
from ensemble.modes.trainers import make_trainer

MODES: dict[str, Mode] = {m.name: m for m in (EnsembleMode(), EvolveMode(), PbtMode(), OnlineMode())}
assert tuple(MODES) == MODE_NAMES, "ensemble.config.vocabulary.MODES names the registered modes"


def mode_of(cfg: RunConfig) -> Mode:
    """The mode object of a run."""
    return MODES[cfg.mode]


def unread_tables(cfg: RunConfig, config_path: str) -> list[str]:
    """Tables the config file sets that its mode does not read (``Mode.tables``, and
    ``[[architectures]]`` in a mode that builds none): each a line naming the mode that would.
    ``check`` notes them, and rank 0 warns of them at a run's start."""
    import tomllib

    try:
        with open(config_path, "rb") as f:
            given = set(tomllib.load(f))
    except (OSError, ValueError):
        return []
    mode, notes = mode_of(cfg), []
    for other in MODES.values():
        for table in other.tables:
            if table in given and table not in mode.tables:
                notes.append(f"[{table}] is set, but mode {cfg.mode!r} does not read it (mode {other.name!r} "
                             f"does: `mode = \"{other.name}\"`?)")
    if "architectures" in given and not mode.uses_architectures:
        notes.append(f"[[architectures]] is set, but mode {cfg.mode!r} does not build them (it searches its own)")
    return notes


__all__ = ["MODES", "Mode", "RunContext", "make_trainer", "mode_of", "unread_tables"]
