"""What the master prints while members come back, readable at 10 and at 100,000 members.

Up to ``runtime.progress_lines`` members: a line per result. More: a summary line every
``runtime.progress_seconds`` (done, failed, members/s, utilisation so far, ETA), and the
per-result lines at debug level. Everything is in the journal either way.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from ensemble.config.vocabulary import PROPER_SCORES
from ensemble.results.records import COUNTED, MemberRecord, Status
from ensemble.results.selection import rank_key
from ensemble.task.metrics import higher_is_better, metric_task, metric_text

log = logging.getLogger(__name__)

#: the statuses of a member that ended without a result, as status.json counts them (the keys of
#: ``Counts``: a member at its time limit is not "failed" there either)
WITHOUT_RESULT = (Status.FAILED, Status.LIMIT, Status.STOPPED)


def result_line(result: MemberRecord, done: int, total: int | None, metric: str, elapsed: float) -> str:
    head = f"[{done:>4}{'/' + str(total) if total else ''}] {result.id:<24}"          # no total: open-ended
    if result.status.evaluated:
        val = result.val.get(metric, float("nan"))
        body = (f"val {metric} {metric_text(val)}  {result.epochs or 0:>3} epochs  {result.params or 0:>8} params  "
                f"{result.train_seconds or 0.0:6.1f} s")
        if result.discarded:
            body += f"  discarded ({result.discarded['rule']} at epoch {result.discarded['epoch']})"
    else:                                                   # whole: the message says what to fix
        body = f"{result.status.label.upper()} {result.error_kind}: {result.error_message}"
    return f"{head} {body}  rank {result.rank}  +{elapsed:6.1f} s"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """The job's counts as results come back: done, failed, specs handed out and not back
    yet, the best member so far; logs them, and ``counts()`` is what status.json says."""

    def __init__(self, total: int | None, metric: str, workers: int, done: int = 0, lines: int = 100,
                 every: float = 10.0, clock: Callable[[], float] = time.time, ends_at: float | None = None):
        self.total, self.metric, self.workers = total, metric, max(1, workers)
        self.done, self.failed, self.discarded, self.new = done, 0, 0, 0     # failed: ended without a result
        self.without = dict.fromkeys(WITHOUT_RESULT, 0)  # ``failed`` by status: failed, limit, stopped
        self.done_before = done                          # finished by earlier jobs
        self.handed = 0                                  # specs this job handed out
        self.best: dict | None = None                    # {"id", "value"} on the validation metric
        self.higher = higher_is_better(metric)
        self.per_result = total is not None and total - done <= lines
        self.every, self.clock = every, clock
        self.ends_at = ends_at                           # when a time budget ends the run (``clock`` time)
        self.t0 = self.last = clock()
        self.first_start: float | None = None
        self.trained = 0.0

    def hand_out(self, spec: dict) -> dict:
        self.handed += 1
        return spec

    def counts(self) -> dict:
        """Done and failed; running (at most one per worker) and the specs held ahead by
        workers, both from specs out and not back; queued (None for an open-ended search)."""
        out = self.handed - self.new
        running = min(out, self.workers)
        return {"done": self.done, **{s.value: n for s, n in self.without.items()}, "discarded": self.discarded,
                "running": running,
                "held_ahead": out - running,
                "queued": None if self.total is None else max(0, self.total - self.done - running),
                "best": self.best}

    def _observe_best(self, r: MemberRecord) -> None:
        """The best so far as the leaderboard ranks (``selection.rank_key``: ties by the proper
        score, then id), not the first to reach the best value."""
        value = r.metric(self.metric) if r.status.ranked else None
        if value is None or not math.isfinite(value):
            return
        tie = r.val.get(PROPER_SCORES[metric_task(self.metric)])
        if self.best is None or self._key(value, r.id, tie) < self._key(self.best["value"], self.best["id"],
                                                                        self.best.get("tie")):
            self.best = {"id": r.id, "value": value, **({"tie": tie} if tie is not None else {})}

    def _key(self, value: float, member_id: str, tie: float | None) -> tuple:
        return rank_key(value, member_id, self.higher, tie)

    def add(self, results: list[MemberRecord]) -> None:
        now = self.clock()
        for r in results:
            self.done += 1
            self.new += 1
            self.failed += not r.status.evaluated
            if r.status in self.without:
                self.without[r.status] += 1
            self.discarded += r.status is Status.DISCARDED
            self._observe_best(r)
            if r.started is not None and r.ended is not None:
                self.first_start = r.started if self.first_start is None else min(self.first_start, r.started)
                self.trained += r.ended - r.started
            if self.per_result or log.isEnabledFor(logging.DEBUG):
                line = result_line(r, self.done, self.total, self.metric, now - self.t0)
                log.log(logging.INFO if self.per_result else logging.DEBUG, line)
        if not self.per_result and now - self.last >= self.every:
            self.last = now
            log.info(self.summary(now))

    def tally(self) -> dict:
        """This job's counts (a sub-master's share; ``take_tallies`` adds them up)."""
        return {"new": self.new, "failed": self.failed, "discarded": self.discarded, "handed": self.handed,
                "without": {s.value: n for s, n in self.without.items()},
                "best": self.best, "first_start": self.first_start, "trained": self.trained}

    def take_tallies(self, tallies: list[dict]) -> None:
        """The job's counts from the latest ``tally`` of each sub-master that runs a share of
        it (a master hierarchy); logs the summary line when one is due."""
        self.new = sum(t["new"] for t in tallies)
        self.done = self.done_before + self.new
        for key in ("failed", "discarded", "handed", "trained"):
            setattr(self, key, sum(t[key] for t in tallies))
        self.without = {s: sum(t["without"][s.value] for t in tallies) for s in WITHOUT_RESULT}
        starts = [t["first_start"] for t in tallies if t["first_start"] is not None]
        self.first_start = min(starts) if starts else None
        best = [t["best"] for t in tallies if t["best"] is not None]
        if best:
            self.best = min(best, key=lambda b: self._key(b["value"], b["id"], b.get("tie")))
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            log.info(self.summary(now))

    def summary(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = max(now - self.t0, 1e-9)
        rate = self.new / elapsed
        ended = ", ".join(f"{n} {COUNTED[s]}" for s, n in self.without.items() if n or s is Status.FAILED)
        text = f"[{self.done}{'/' + str(self.total) if self.total else ''}] {ended}, {rate:.1f} members/s"
        if self.first_start is not None and now > self.first_start:
            text += f", utilisation {100 * self.trained / (self.workers * (now - self.first_start)):.0f}%"
        return text + self.eta(rate, now) + f"  +{_duration(elapsed)}"

    def eta(self, rate: float, now: float) -> str:
        """The run's end: the members left at this rate, or the time budget's end if sooner."""
        by_count = max(0, self.total - self.done) / rate if self.total and rate > 0 else None
        by_time = max(0.0, self.ends_at - now) if self.ends_at is not None else None
        if by_time is not None and (by_count is None or by_time < by_count):
            return f", ETA {_duration(by_time)} (the time budget ends first)"
        return f", ETA {_duration(by_count)}" if by_count is not None else ""
