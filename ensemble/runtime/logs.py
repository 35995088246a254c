"""Logging for a run: one console handler on rank 0, a per-rank debug file when asked.

Every module logs to a child of the ``ensemble`` logger (``logging.getLogger(__name__)``).
On rank 0 one handler writes INFO to stdout and WARNING and above to stderr, as bare
messages, so the console reads as before; the other ranks stay quiet on the console
(their failures travel to the master as results, fatal errors abort with rank and
host). ``runtime.debug_log = true`` adds ``<run_dir>/logs/rank-<r>.log`` per rank at
DEBUG level, with time, rank and logger name.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

ROOT = "ensemble"


class ConsoleHandler(logging.Handler):
    """Bare messages: below WARNING to stdout, WARNING and above to stderr, flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:                      # noqa: BLE001 - logging must never kill a run
            self.handleError(record)


def setup_logging(rank: int, level: str = "info") -> logging.Logger:
    """Configure the ``ensemble`` logger for this process (idempotent); returns it."""
    logger = logging.getLogger(ROOT)
    for handler in [h for h in logger.handlers if isinstance(h, ConsoleHandler)]:
        logger.removeHandler(handler)
    logger.propagate = False
    console = ConsoleHandler()
    console.setLevel(getattr(logging, level.upper()) if rank == 0 else logging.CRITICAL + 1)
    logger.addHandler(console)
    # the logger passes only what some handler keeps: a debug call in a hot loop costs nothing (a
    # handler at NOTSET, such as pytest's, keeps everything: the logger's own NOTSET would instead
    # defer to the root logger's WARNING)
    logger.setLevel(min(h.level if h.level > logging.NOTSET else logging.DEBUG for h in logger.handlers))
    return logger


def add_debug_file(run_dir: str | Path, rank: int) -> Path:
    """Log everything this rank says, at DEBUG, to ``<run_dir>/logs/rank-<rank>.log``."""
    path = Path(run_dir) / "logs" / f"rank-{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} %(name)s %(levelname)s: %(message)s"))
    logger = logging.getLogger(ROOT)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return path
