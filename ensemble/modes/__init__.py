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


__all__ = ["MODES", "Mode", "RunContext", "make_trainer", "mode_of"]
