"""A rehearsal trainer whose later members wait for a file: ``runtime.trainer = "tests.mpi.gate:trainer"``.

A test that must act in the middle of a run (stop a tracking server once it holds some
members, and only then let the rest train) cannot count on timing: on a loaded machine a
run of short members may be over before the thing to wait for has happened. Here the
members numbered ``ENSEMBLE_TEST_GATE_AFTER`` and later (by the number ending their id)
sleep until the file ``ENSEMBLE_TEST_GATE`` exists, for at most ``WAIT_SECONDS``, then train
as ``runtime.trainer = "rehearsal"`` does, so a run with the file already there gives the
same records as the gated one. Lives in the tests, not in the product.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

#: the file later members wait for, and from which member number on they wait
FILE, AFTER = "ENSEMBLE_TEST_GATE", "ENSEMBLE_TEST_GATE_AFTER"
#: a gate never opened lets the members go after this long (the test then fails on its own terms, never hangs)
WAIT_SECONDS = 300.0


def env(gate: Path, after: int) -> dict[str, str]:
    """The environment entries that hold members ``after`` and later until ``gate`` exists."""
    return {FILE: str(gate), AFTER: str(after)}


def trainer(cfg, meta: dict, data, run_dir, rank: int, group=None):
    """The trainer factory: the rehearsal trainer, behind the gate."""
    from ensemble.train.member import guarded
    from ensemble.train.rehearsal import RehearsalTrainer
    rehearse = RehearsalTrainer(cfg, meta, data, leader=group is None or group.Get_rank() == 0)
    gate, after = Path(os.environ[FILE]), int(os.environ[AFTER])

    def train(spec: dict, report=None) -> dict | None:
        number = re.search(r"(\d+)$", spec["id"])
        if number and int(number.group(1)) >= after:
            end = time.monotonic() + WAIT_SECONDS
            while not gate.exists() and time.monotonic() < end:
                time.sleep(0.05)
        return guarded(lambda: rehearse(spec, report), spec, rank)

    return train
