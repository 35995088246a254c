"""A test trainer (``runtime.trainer = "tests.mpi.discarding_trainer:make"``): the rehearsal
trainer (members sleep, no TensorFlow) whose epoch reports differ by member, so early
discarding (``evolve.discard = "asha"``) has something to judge and stops some; a few
members end as if stopped by their time limit (kind ``time_limit``), so every status a
run can record occurs in a run of seconds (tests/mpi/test_counts_agree_mpi.py)."""

from __future__ import annotations

from ensemble.train.member import MemberFailed, guarded
from ensemble.train.rehearsal import RehearsalTrainer

LIMITED = 7          # a member whose seed is divisible by this ends at its "time limit"


def make(cfg, meta, data, run_dir, rank, group=None):
    rehearse = RehearsalTrainer(cfg, meta, data, leader=group is None or group.Get_rank() == 0)

    def train(spec: dict, report=None):
        quality = (spec["seed"] % 101) / 101                 # a different learning curve per member

        def told(payload: dict):
            logs = {**payload.get("logs", {}), "val_loss": (1.5 - quality) / payload["epoch"]}
            return report({**payload, "logs": logs})

        def run():
            if spec["seed"] % LIMITED == 0:
                raise MemberFailed("time_limit", f"{spec['id']} stands for a member stopped by its time limit")
            return rehearse(spec, told if report is not None else None)
        return guarded(run, spec, rank)
    return train
