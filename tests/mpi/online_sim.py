"""A tiny simulation for the online-training tests: ``mpirun -n S python online_sim.py OUT [options]
: -n E python -m ensemble.run CONFIG``. Each step every rank sends a batch of samples
(y = a smooth function of x) and asks for the newest ensemble; it stops once it has loaded
``--generations`` published ensembles (or after ``--max-seconds``, or ``--stop-after`` steps:
an early end; with ``--break-publish``, rank 0 also waits for one published after the fault),
then closes and writes its stream's stats as JSON to OUT.rank<r>.json."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def break_publish(stream, fault: dict) -> None:
    """The fault of ``--break-publish``, one step at a time: once generation 1 is loaded, the
    published file is moved aside and a directory put in its place; once the ensemble side
    says a publication failed, the file goes back (``fault["failed"]``: that generation)."""
    import re
    import shutil
    from pathlib import Path
    published = Path(stream.run_dir or ".") / "ensemble.json"
    if "aside" not in fault and stream.generation >= 1:
        fault["aside"] = published.with_name("ensemble.json.aside")
        published.rename(fault["aside"])
        published.mkdir()
        (published / "blocker").write_text("a directory where the file goes: os.replace fails")
    elif "aside" in fault and "failed" not in fault:
        said = [re.search(r"could not publish generation (\d+)", f) for f in stream.stats.failures]
        if any(said):
            fault["failed"] = int(next(m for m in said if m).group(1))
            shutil.rmtree(published)
            fault["aside"].rename(published)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--generations", type=int, default=2)
    p.add_argument("--max-seconds", type=float, default=150.0)
    p.add_argument("--stop-after", type=int, default=0, help="steps, then close (an early end)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--break-publish", action="store_true",
                   help="rank 0, once generation 1 is loaded: put a directory where ensemble.json goes, so the "
                        "next publish fails for real (its atomic replace cannot), and take it away once the "
                        "ensemble side has said so")
    p.add_argument("--no-close", action="store_true", help="end without stream.close() (a forgetful script)")
    a = p.parse_args()
    from ensemble.inference import online
    stream = online.connect()
    comm, rank = stream.comm, stream.comm.Get_rank()
    rng = np.random.default_rng(rank)
    t0, step, predicted, fault = time.monotonic(), 0, [], {}
    while time.monotonic() - t0 < a.max_seconds:
        x = rng.normal(size=(a.batch, 4)).astype(np.float32)
        y = np.sin(x[:, 0]) + 0.5 * x[:, 1]
        stream.send(x, y)
        ens = stream.ensemble()
        if ens is not None:
            predicted.append([stream.generation, float(ens.predict(x[:4])["mean"][0])])
        if a.break_publish and rank == 0:
            break_publish(stream, fault)
        step += 1
        if a.stop_after and step >= a.stop_after:
            break
        if len(stream.stats.loaded) >= a.generations and (
                not (a.break_publish and rank == 0) or stream.generation >= fault.get("failed", 1 << 30)):
            break
        time.sleep(0.02)
    stats = stream.stats if a.no_close else stream.close()
    out = {"rank": rank, "size": comm.Get_size(), "steps": step, "loaded": stats.loaded, "sent": stats.sent,
           "dropped": stats.dropped, "dropped_remote": stats.dropped_remote, "latencies": stats.latencies,
           "failures": stats.failures, "predicted": predicted[-3:], "generation": stream.generation,
           "publish_failed": fault.get("failed")}
    with open(f"{a.out}.rank{rank}.json", "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
