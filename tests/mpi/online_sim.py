"""A tiny simulation for the online-training tests: ``mpirun -n S python online_sim.py OUT [options]
: -n E python -m ensemble.run CONFIG``. Each step every rank sends a batch of samples
(y = a smooth function of x) and asks for the newest ensemble; it stops once it has loaded
``--generations`` published ensembles (or after ``--max-seconds``, or ``--stop-after`` steps:
an early end), then closes and writes its stream's stats as JSON to OUT.rank<r>.json."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--generations", type=int, default=2)
    p.add_argument("--max-seconds", type=float, default=150.0)
    p.add_argument("--stop-after", type=int, default=0, help="steps, then close (an early end)")
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    from ensemble.inference import online
    stream = online.connect()
    comm, rank = stream.comm, stream.comm.Get_rank()
    rng = np.random.default_rng(rank)
    t0, step, predicted = time.monotonic(), 0, []
    while time.monotonic() - t0 < a.max_seconds:
        x = rng.normal(size=(a.batch, 4)).astype(np.float32)
        y = np.sin(x[:, 0]) + 0.5 * x[:, 1]
        stream.send(x, y)
        ens = stream.ensemble()
        if ens is not None:
            predicted.append([stream.generation, float(ens.predict(x[:4])["mean"][0])])
        step += 1
        if a.stop_after and step >= a.stop_after:
            break
        if len(stream.stats.loaded) >= a.generations:
            break
        time.sleep(0.02)
    stats = stream.close()
    out = {"rank": rank, "size": comm.Get_size(), "steps": step, "loaded": stats.loaded, "sent": stats.sent,
           "dropped": stats.dropped, "dropped_remote": stats.dropped_remote, "latencies": stats.latencies,
           "failures": stats.failures, "predicted": predicted[-3:], "generation": stream.generation}
    with open(f"{a.out}.rank{rank}.json", "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
