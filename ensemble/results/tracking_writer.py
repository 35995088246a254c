"""``python -m ensemble.results.tracking_writer``: the master's tracking writer process.

Started by ``tracking.Tracking`` with a pipe on its stdin; writes TensorBoard event files
and talks to the MLflow server (``tracking.serve``), so none of that runs in the master's
interpreter. Its console lines go to the master's console. It runs at the lowest CPU
priority (nice 19) and each sink keeps to a share of a core (``tracking.cpu_share``) until
the run ends: when members end faster than that it falls behind and drops at the end what
``tracking.finish_seconds`` did not let it write, instead of taking CPU time from the ranks.
"""

from __future__ import annotations

import os
import sys

from ensemble.results.tracking import serve
from ensemble.runtime.logs import setup_logging

if __name__ == "__main__":
    os.nice(19)           # on a busy node the master and the workers come first; the writer drops instead
    setup_logging(0)
    serve(sys.stdin.buffer)
