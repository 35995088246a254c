"""A fault-injecting trainer for the resilience tests: ``runtime.trainer = "tests.mpi.faults:trainer"``.

The run's workers call ``trainer(cfg, meta, data, run_dir, rank, group)`` (a trainer factory,
``runtime.trainer``); it trains every member as the Keras trainer does
(``ensemble.train.member.run_member``) except those named in ``ENSEMBLE_TEST_FAULTS``
(``"id:kind,id:kind"``), which fail the way ``kind`` says:

- ``raise``: training raises a ``RuntimeError`` (a failed record of that kind);
- ``nan``: the member trains on NaN features, so its loss is NaN from the first step (a
  failed record of kind ``nan_loss``, from the trainer's own check);
- ``limit``: the member trains with a time limit it cannot meet (a time-limit record);
- ``exit``: the rank dies at once, as if killed;
- ``full``: writing the member's model finds the disk full (``OSError`` ENOSPC, as a full file
  system or quota raises it).

Fault injection lives here, in the tests, and nowhere in the product. The test folder must
be importable on every rank (``tests.conftest.run_mpi`` puts the repository on PYTHONPATH).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

#: the variable naming the members to fail and how
VARIABLE = "ENSEMBLE_TEST_FAULTS"
KINDS = ("raise", "nan", "limit", "exit", "full")


def faults(text: str | None = None) -> dict[str, str]:
    """member id -> kind, from ``text`` (default: the environment's ``ENSEMBLE_TEST_FAULTS``)."""
    text = os.environ.get(VARIABLE, "") if text is None else text
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        member, _, kind = item.partition(":")
        kind = kind or "raise"
        if kind not in KINDS:
            raise ValueError(f"{VARIABLE}: unknown fault {kind!r} for {member!r}; use one of {', '.join(KINDS)}")
        out[member] = kind
    return out


def env(**members: str) -> dict[str, str]:
    """The environment entry that fails ``members`` (id -> kind), for ``run_mpi(..., env=...)``."""
    return {VARIABLE: ",".join(f"{member}:{kind}" for member, kind in members.items())}


def _nan_features(data: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """``data`` with NaN training features (a copy; the shared views stay as they are)."""
    return {**data, "x_train": np.full(np.shape(data["x_train"]), np.nan, dtype=np.float32)}


def trainer(cfg, meta: dict, data: Mapping[str, np.ndarray], run_dir, rank: int, group=None):
    """The trainer factory: ``train(spec, report) -> record``, failing the members it is told to."""
    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.member import guarded, run_member

    rt = cfg.runtime
    configure_tensorflow(rt.threads, rt.precision, rt.jit_compile, rt.deterministic)
    if group is not None and group.Get_size() == 1:
        group = None
    told = faults()

    def fail(spec: dict) -> NoReturn:
        raise RuntimeError(f"injected failure in member {spec['id']} ({VARIABLE})")

    def full(spec: dict) -> NoReturn:
        import errno
        try:
            raise OSError(errno.ENOSPC, "No space left on device", f"models/{spec['id']}.keras")
        except OSError as exc:                      # as Keras wraps it: the disk's error is the context
            raise RuntimeError(f"could not save {spec['id']}") from exc

    def train(spec: dict, report=None) -> dict | None:
        kind = told.get(spec["id"])
        if kind == "exit":
            os._exit(9)
        if kind == "raise":
            return guarded(lambda: fail(spec), spec, rank)
        if kind == "full":
            return guarded(lambda: full(spec), spec, rank)
        if kind == "nan":
            return run_member(spec, _nan_features(data), meta, run_dir, rank, group, report)
        if kind == "limit":
            return run_member({**spec, "member_time_limit": 1e-9}, data, meta, run_dir, rank, group, report)
        return run_member(spec, data, meta, run_dir, rank, group, report)

    return train
