"""Run the MPI executor with trainers that need no TensorFlow (for tests/mpi/test_executor_mpi.py).

    mpiexec -n P python tests/mpi/executor_prog.py OUT.json [GROUP_SIZE [PRETEND_NODES]]

Rank 0 dispatches 6 specs over the workers (or groups), two in hand per worker; each trainer reports 4 epochs,
and the master stops "m1" at epoch 2 and sets a new learning rate for "m2" at epoch 1.
Every rank of a group records the decisions it saw, so the test can check they agree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ensemble.orchestrate.dispatch import dispatch
from ensemble.runtime import mpi
from ensemble.runtime.executor import CONTINUE, STOP, MpiExecutor, OneByOne, serve
from ensemble.sources import SpecList
from ensemble.sources.base import GoOn


class Decide(GoOn):
    """Stops m1 at epoch 2, sets m2's learning rate at epoch 1 (the Decider seam)."""

    def decide(self, spec, payload):
        if spec["id"] == "m1" and payload["epoch"] == 2:
            return STOP
        if spec["id"] == "m2" and payload["epoch"] == 1:
            return {"action": "update", "settings": {"learning_rate": 0.25}}
        return CONTINUE


def main() -> None:
    out, group_size = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1
    mpi.abort_on_exception()
    comm = mpi.world
    rank = comm.Get_rank()
    node = None
    if len(sys.argv) > 3:                       # groups cut inside (pretend) nodes, as ensemble.run cuts them
        from datafeed.distribute import nodes_of
        node, node_leaders = nodes_of(comm, int(sys.argv[3]))
    group, leaders = mpi.split_groups(comm, group_size, node)
    seen: list[dict] = []

    def train(spec, report):
        actions, lr = [], 1.0
        for epoch in range(1, 5):
            decision = report({"epoch": epoch, "rank": rank})
            actions.append(decision["action"])
            if decision["action"] == "stop":
                break
            if decision["action"] == "update":
                lr = decision["settings"]["learning_rate"]
        seen.append({"id": spec["id"], "actions": actions, "lr": lr})
        return {"id": spec["id"], "status": "ok", "epochs": len(actions), "lr": lr, "rank": rank}

    if rank == 0:
        results = []
        dispatch(MpiExecutor(comm, leaders, 0.01, in_hand=2), SpecList([{"id": f"m{i}"} for i in range(6)]),
                 results.extend, decider=Decide())
        payload = {"results": [r.to_json() for r in results]}
    else:
        serve(comm, OneByOne(train), 0.01, group)
        payload = {"seen": seen, "group": group.allgather(rank) if group is not None else [rank]}
    everything = comm.gather(payload, root=0)
    if rank == 0:
        out.write_text(json.dumps(everything))


if __name__ == "__main__":
    main()
