"""MPI program behind tests/mpi/test_insitu_mpi.py's exit test: ``mpiexec -n 3 python insitu_exit_prog.py OUT RUN``.

First rank 0 loads with placement "node" and the others with "local": every rank must raise
(they would wait in different collectives); each writes what it raised to OUT/mixed-<rank>.txt.
Then placement "node": the clients ask once (one of them about no rows) and their script ends
without close(); the job must end (the server's serve() returns once every client is closed as
Python exits).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mpi4py import MPI

from ensemble.inference import insitu
from ensemble.inference.load import PredictError

world = MPI.COMM_WORLD
out, run = Path(sys.argv[1]), sys.argv[2]
try:
    insitu.load(run, world, "node" if world.Get_rank() == 0 else "local")
    said = "loaded"
except PredictError as exc:
    said = str(exc)
(out / f"mixed-{world.Get_rank()}.txt").write_text(said)

session = insitu.load(run, world, "node", servers_per_node=1, batch_wait=0.01)
if session.serving:
    stats = session.serve()
    (out / "served.txt").write_text(str(stats.requests))
else:
    width = int(np.prod(session.run.input_shape))
    rows = 3 if session.comm.Get_rank() == 0 else 0         # a rank with nothing to ask this step
    got = session.predict(np.ones((rows, width), np.float32))     # and no close(): the script just ends
    (out / f"client-{session.comm.Get_rank()}.txt").write_text(str(got["mean"].shape))
