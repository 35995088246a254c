"""When the master stops handing out work: wall-time deadline and failure share.

A 1,000-rank allocation must not be burnt by a run whose members all fail, and the
leaderboard and ensemble must be written before the scheduler kills the job. Pure
Python, so it is tested without MPI.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MIN_FAILURES = 3           # a share is only judged once this many members have failed


class RunBudget:
    """Tracks results; says when to stop handing out work and caps each member's time."""

    def __init__(self, time_limit: float | None, finish_reserve: float, max_failed_share: float,
                 clock: Callable[[], float] = time.time, end_time: float | None = None):
        self.clock = clock
        start = clock()
        ends = [t for t in (start + time_limit if time_limit else None, end_time) if t is not None]
        self.deadline = min(ends) - finish_reserve if ends else None
        self.max_failed_share = max_failed_share
        self.slowest = 0.0
        self.n_ok = self.n_failed = 0
        self.reason: str | None = None

    def observe(self, evaluated: bool, seconds: float | None) -> None:
        """A member ended after ``seconds`` of training: ``evaluated`` (finished, or stopped by
        early discarding, which is no failure), else it failed or hit its limit."""
        if evaluated:
            self.n_ok += 1
            self.slowest = max(self.slowest, float(seconds or 0.0))
        else:
            self.n_failed += 1
        total = self.n_ok + self.n_failed
        if self.n_failed >= MIN_FAILURES and self.n_failed / total > self.max_failed_share:
            self.reason = (f"{self.n_failed} of {total} members failed, more than "
                           f"`runtime.max_failed_share` = {self.max_failed_share:g}; stopping instead of "
                           "burning the allocation (see the failures in journal.jsonl)")

    def expected_member_seconds(self) -> float:
        """A cautious estimate of one more member: the slowest seen so far."""
        return self.slowest

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
        """Shorten the member's own time limit so it ends before the deadline."""
        if self.deadline is None:
            return spec
        left = max(1.0, self.deadline - self.clock())
        if spec["member_time_limit"] > left:
            spec = {**spec, "member_time_limit": left}
        return spec
