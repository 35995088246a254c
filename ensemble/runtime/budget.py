"""When the master stops handing out work: wall-time deadline and failure share.

A 1,000-rank allocation must not be burnt by a run whose members all fail, and the
leaderboard and ensemble must be written before the scheduler kills the job. Pure
Python, so it is tested without MPI.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

MIN_FAILURES = 3           # a share is only judged once this many members have failed


class DurationQuantile:
    """The ``q`` quantile of the members' durations seen so far, or the slowest (``q`` None).

    O(1) per member at any number: durations fall into log-spaced bins 2% wide (1 ms to
    11 days), and the quantile is read from the bins once per ``EVERY`` new durations, so
    it is within 2% of the exact one. The budget's stop rule asks it before every spec."""

    EVERY = 64
    LOW, RATIO, BINS = 1e-3, 1.02, 1200

    def __init__(self, q: float | None = None):
        if q is not None and not 0.0 < q <= 1.0:
            raise ValueError(f"a quantile must be in (0, 1], but got {q}")
        self.q = q
        self.slowest = 0.0
        self.counts = [0] * self.BINS
        self.n = 0
        self._value = 0.0
        self._log_ratio = math.log(self.RATIO)

    def observe(self, seconds: float) -> None:
        self.slowest = max(self.slowest, seconds)
        if self.q is None:
            return
        b = int(math.log(max(seconds, self.LOW) / self.LOW) / self._log_ratio)
        self.counts[min(b, self.BINS - 1)] += 1
        self.n += 1
        if self.n % self.EVERY == 1 or self.n < self.EVERY:
            self._refresh()

    def _refresh(self) -> None:
        want, seen = self.q * self.n, 0          # type: ignore[operator]
        for b, c in enumerate(self.counts):
            seen += c
            if seen >= want:
                self._value = min(self.slowest, self.LOW * self.RATIO ** (b + 1))
                return
        self._value = self.slowest

    def value(self) -> float:
        return self.slowest if self.q is None else self._value


#: a spec's keys (UNIX seconds, the master's clock) for the run's deadline and the latest a member
#: may start to end by it (``RunBudget.cap``)
ENDS_BY, START_BY = "ends_by", "start_by"


class RunBudget:
    """Tracks results; says when to stop handing out work and caps each member's time."""

    def __init__(self, time_limit: float | None, finish_reserve: float, max_failed_share: float,
                 clock: Callable[[], float] = time.time, end_time: float | None = None,
                 stop_quantile: float | None = None):
        self.clock = clock
        self.durations = DurationQuantile(stop_quantile)
        start = clock()
        ends = [t for t in (start + time_limit if time_limit else None, end_time) if t is not None]
        self.deadline = min(ends) - finish_reserve if ends else None
        self.max_failed_share = max_failed_share
        self.slowest = 0.0
        self.n_ok = self.n_failed = 0
        self.reason: str | None = None
        self.failures_stopped = False               # the reason is `max_failed_share`, or a fatal failure

    def observe(self, evaluated: bool, seconds: float | None, fatal: str | None = None) -> None:
        """A member ended after ``seconds`` of training: ``evaluated`` (finished, or stopped by
        early discarding, which is no failure), else it failed or hit its limit; ``fatal``: why
        its failure stops the run (``records.fatal_failure``: every member would fail alike)."""
        if fatal and not self.failures_stopped:
            self.failures_stopped = True
            self.reason = fatal
        if evaluated:
            self.n_ok += 1
            self.slowest = max(self.slowest, float(seconds or 0.0))
            self.durations.observe(float(seconds or 0.0))
        else:
            self.n_failed += 1
        total = self.n_ok + self.n_failed
        if self.n_failed >= MIN_FAILURES and self.n_failed / total > self.max_failed_share \
                and not (self.reason and self.failures_stopped):        # a fatal failure's reason stays
            self.failures_stopped = True
            self.reason = (f"{self.n_failed} of the first {total} members to end failed, more than "
                           f"`runtime.max_failed_share` = {self.max_failed_share:g}; stopping instead of "
                           "burning the allocation (see the failures in journal.jsonl)")

    def expected_member_seconds(self) -> float:
        """How long one more member may take: the ``stop_quantile`` of the members seen
        (``runtime.stop_quantile``), or the slowest seen when it is not set."""
        return self.durations.value()

    def should_stop(self) -> bool:
        """True once no new member should start."""
        if self.reason:
            return True
        if self.deadline is not None and self.clock() + self.expected_member_seconds() > self.deadline:
            self.reason = ("the run's time limit is near (`runtime.time_limit` or the job's end as the scheduler "
                           "set it, less `runtime.finish_reserve`); stopped handing out members")
            return True
        return False

    def cap(self, spec: dict) -> dict:
        """Shorten the member's own time limit so it ends before the deadline, and say by when it
        may start (``START_BY``) and must end (``ENDS_BY``): a spec a worker holds ahead
        (``runtime.specs_in_hand``) starts later than it is handed out, and its worker trims its
        limit, or hands it back unstarted, then (``runtime.executor.on_start``)."""
        if self.deadline is None:
            return spec
        left = max(1.0, self.deadline - self.clock())
        if spec["member_time_limit"] > left:
            spec = {**spec, "member_time_limit": left}
        return {**spec, ENDS_BY: round(self.deadline, 3),
                START_BY: round(self.deadline - self.expected_member_seconds(), 3)}
