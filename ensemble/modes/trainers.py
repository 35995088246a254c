"""A worker's trainer: ``runtime.trainer`` chooses it, the mode shapes the Keras one.

- "rehearsal": members sleep and return made-up records (no TensorFlow);
- "package.module:function": the user's trainer factory, called as
  ``function(cfg, meta, data, run_dir, rank, group)``; it returns the function
  ``train(spec, report) -> record`` (trained one by one);
- "keras": TensorFlow configured from ``[runtime]``, then the mode's Keras trainer.
Every choice returns the declared Trainer seam (``runtime.executor.Trainer``).
"""

from __future__ import annotations

import importlib
from typing import Any

from ensemble.config import ConfigError, RunConfig
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import OneByOne, Trainer

KERAS, REHEARSAL = "keras", "rehearsal"


def load_factory(ref: str) -> Any:
    """The function a ``"package.module:function"`` reference names (a clear error otherwise)."""
    module, _, name = ref.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name, None)
    except ImportError as exc:
        raise ConfigError(f"`runtime.trainer` {ref!r}: module {module!r} cannot be imported ({exc}); put its "
                          "folder on PYTHONPATH") from None
    if not callable(factory):
        raise ConfigError(f"`runtime.trainer` {ref!r}: {module!r} has no function {name!r}")
    return factory


def make_trainer(cfg: RunConfig, meta: dict, data: Any, run_dir: RunDirectory, rank: int, group: Any = None,
                 comm: Any = None) -> Trainer:
    """The trainer of this rank (``group``: its member group's communicator, if any; ``comm``:
    the world's, for members that exchange state)."""
    from ensemble.modes import mode_of
    from ensemble.train.member import guarded
    rt = cfg.runtime
    if rt.trainer == REHEARSAL:
        from ensemble.train.rehearsal import RehearsalTrainer
        rehearse = RehearsalTrainer(cfg, meta, data, leader=group is None or group.Get_rank() == 0)
        if group is not None and group.Get_size() > 1:      # a member group's communicator is fixed: no helpers
            return OneByOne(lambda spec, report: guarded(lambda: rehearse(spec, report), spec, rank))
        return OneByOne(lambda spec, report, tail: guarded(lambda: rehearse(spec, report, tail), spec, rank),
                        help=lambda spec, leader, tail: rehearse.help(spec, leader, tail))
    if rt.trainer != KERAS:
        return OneByOne(load_factory(rt.trainer)(cfg, meta, data, run_dir, rank, group))
    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(rt.threads, rt.precision, rt.jit_compile, rt.deterministic, rt.traced_models)
    if group is not None and group.Get_size() == 1:
        group = None                                  # G = 1: no communication at all
    return mode_of(cfg).keras_trainer(cfg, meta, data, run_dir, rank, group, comm)
