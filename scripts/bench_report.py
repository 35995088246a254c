"""How long the run report takes as runs grow: a synthetic run directory of N members
(journal with timestamps, an evolve search, ensemble.json, test predictions), then
``write_report`` timed, whole and plot by plot. No MPI, no TensorFlow.

    python scripts/bench_report.py --members 1000 10000 100000

The report is written at the end of every run, so its cost is part of finishing one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ensemble.results import report as R
from tests.ensemble.test_report import make_run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, nargs="+", default=[1000, 10000, 100000])
    args = p.parse_args()
    rows = []
    for n in args.members:
        folder = Path(tempfile.mkdtemp(prefix="bench_report_"))
        try:
            run = make_run(folder / "run", "classification", evolve=True, n=n)
            t0 = time.perf_counter()
            R.write_report(run)
            whole = time.perf_counter() - t0
            view = R.read_view(run)
            plots = {}
            for name, draw in R.PLOTS.items():
                t = time.perf_counter()
                fig = draw(view)
                if fig is not None:
                    R._png(fig)
                    plots[name] = round(time.perf_counter() - t, 3)
            rows.append({"members": n, "report_seconds": round(whole, 3), "plots": plots})
            print(f"{n:>7} members: report {whole:6.2f} s  ("
                  + ", ".join(f"{k} {v:.2f}" for k, v in plots.items()) + ")", flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
