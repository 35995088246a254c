"""A rank that is stuck ends itself, and with it the job: never a hang.

A member's time limit (``train.member_time_limit``) stops its training at the next batch; it
cannot stop a builder that never returns, a read from a hung file system or a collective that
waits for a rank that is gone. Such a rank would hold its worker, and the job, until the
scheduler's time limit. ``Watchdog`` gives the work in hand a bound well past its time limit
(``stuck_seconds``); past it, the rank logs what was stuck with every thread's stack, and
exits (``EXIT_STUCK``): the launcher ends the job, and ``--resume`` treats the member as one
in flight when a job was lost (``results.crashes``: handed out again among the suspects, given
up when it is lost with the job again).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: the exit status of a rank that ended itself stuck (as timeout(1) exits)
EXIT_STUCK = 124
#: a member still running this long (at most, at least) after twice its time limit is stuck
#: (``stuck_seconds``): the limit counts training only, not the build, the data, the writes
STUCK_GRACE, STUCK_FLOOR = 300.0, 60.0


def stuck_seconds(time_limit: float | None) -> float | None:
    """How long work bounded by ``time_limit`` may run before it counts as stuck: twice the
    limit and as much again, between ``STUCK_FLOOR`` and ``STUCK_GRACE`` (the limit acts at a
    batch's end and counts training only; the build, a last epoch, the predictions and the
    writes come beside it): 1,500 s for the default 600 s, 64 s for 2 s. None: no limit, no
    watchdog."""
    if not time_limit or time_limit <= 0:
        return None
    return 2.0 * float(time_limit) + min(STUCK_GRACE, max(STUCK_FLOOR, float(time_limit)))


class _Monitor:
    """One thread per process that watches every open ``Watchdog``'s deadline: entering and
    leaving a watched block costs a lock and a dict entry, not a thread (a Timer a member cost
    about 0.4 ms, which a simulated run's replayed durations showed)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.watched: dict[int, tuple[float, Watchdog]] = {}
        self.thread: threading.Thread | None = None

    def add(self, dog: Watchdog, deadline: float) -> None:
        with self.cond:
            self.watched[id(dog)] = (deadline, dog)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
                self.thread.start()
            self.cond.notify()

    def remove(self, dog: Watchdog) -> None:
        with self.cond:
            self.watched.pop(id(dog), None)

    def _run(self) -> None:
        while True:
            with self.cond:
                if not self.watched:
                    self.cond.wait()
                    continue
                key, (due, dog) = min(self.watched.items(), key=lambda item: item[1][0])
                left = due - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
                del self.watched[key]
            dog._fire()


_MONITOR = _Monitor()


class Watchdog:
    """``with Watchdog(seconds, message):`` the block must end within ``seconds`` (None: no
    bound), else ``message`` is written with every thread's stack and the process exits with
    ``EXIT_STUCK`` (``exit``: the call that ends it, ``os._exit``; a test passes its own)."""

    def __init__(self, seconds: float | None, message: str, exit: Callable[[int], None] = os._exit):
        self.seconds, self.message, self.exit = seconds, message, exit
        self.fired = False

    def __enter__(self) -> Watchdog:
        if self.seconds is not None:
            _MONITOR.add(self, time.monotonic() + self.seconds)
        return self

    def __exit__(self, *exc) -> None:
        if self.seconds is not None:
            _MONITOR.remove(self)

    def _fire(self) -> None:
        self.fired = True
        log.debug("%s", self.message)                 # a rank's debug file, where it keeps one
        for handler in logging.getLogger().handlers:
            handler.flush()
        try:                                          # stderr: a worker's log says only warnings of its own
            sys.stderr.write(f"error: {self.message}\n[pid {os.getpid()}] stuck; every thread's stack:\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        except (OSError, ValueError):         # no usable stderr: the message above is what is left
            pass
        self.exit(EXIT_STUCK)
