"""A run on a virtual clock: the real master code, simulated workers, no MPI, no sleeping.

``simulate`` drives the same ``dispatch`` loop, spec sources (ensemble list or any
evolution strategy), budget, journal (real file, group commit on the virtual clock) and
``run_stats`` as a real run, with a ``SimExecutor`` in place of the MPI one:

- a member's duration comes from the rehearsal settings (log-normal) or a replayed
  journal (``ensemble.train.rehearsal.member_seconds``); its record is a rehearsal record;
- a spec reaches its worker ``latency`` seconds after the master sends it, a result the
  master ``latency`` after the member ends; each message costs the master
  ``message_seconds`` (a send or a receive: measure it with ``scripts/bench_dispatch.py``'s
  ping-pong); workers hold specs in hand exactly as the MPI executor's ``Slots`` say;
- the master's own cost is measured, not assumed: the real time its code takes between
  two waits (source, journal, budget) advances the virtual clock, so results that arrive
  while it is busy queue up as they would on a real machine.

Not simulated: start-up (the utilisation it reports is after start-up, as the journal's),
in-training reports, failures of ranks, the file system's fsync latency beyond this machine's.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from pathlib import Path

from ensemble.orchestrate.dispatch import dispatch
from ensemble.results.journal import Journal
from ensemble.results.rundir import RunDirectory
from ensemble.results.timeline import run_stats
from ensemble.runtime.budget import RunBudget
from ensemble.runtime.executor import Decide, Slots, result_seconds
from ensemble.train.member import guarded


KEPT = ("started", "ended", "received", "status")


class VirtualClock:
    """Seconds since the simulated start. While the master's code runs, real time passes on
    it (times ``speed``); while the master waits, the executor moves it to the next event."""

    def __init__(self, start: float = 0.0, speed: float = 1.0):
        self.base, self.speed = start, speed
        self.mark = time.perf_counter()

    def __call__(self) -> float:
        return self.base + (time.perf_counter() - self.mark) * self.speed

    def set(self, t: float) -> None:
        self.base, self.mark = t, time.perf_counter()


class SimExecutor:
    """The Executor protocol over ``workers`` simulated workers (see the module docstring)."""

    def __init__(self, workers: int, duration: Callable[[dict], float], record: Callable[[dict, float], dict],
                 clock: VirtualClock, *, in_hand: int | None = None, latency: float = 0.0,
                 message_seconds: float = 0.0, group_size: int = 1, batch: int = 256):
        self.workers, self.duration, self.record, self.clock = workers, duration, record, clock
        self.latency, self.message_seconds, self.group_size, self.batch = latency, message_seconds, group_size, batch
        self.slots = Slots(workers, in_hand)
        self.free_at = [0.0] * workers
        self.events: list[tuple] = []
        self.seq = 0
        self.idle_seconds = 0.0
        self.messages = 0

    def free(self) -> int:
        return len(self.slots.ready)

    def busy(self) -> int:
        return self.slots.busy

    def submit(self, spec: dict) -> None:
        sent = self.clock() + self.message_seconds
        self.clock.set(sent)
        worker = self.slots.take(spec)
        start = max(sent + self.latency, self.free_at[worker])
        end = start + self.duration(spec)
        self.free_at[worker] = end
        self.seq += 1
        heapq.heappush(self.events, (end + self.latency, self.seq, worker, spec, start, end))
        self.messages += 1

    def _result(self, worker: int, spec: dict, start: float, end: float) -> dict:
        result = self.record(spec, end - start)
        result.update(started=round(start, 4), ended=round(end, 4), worker=worker,
                      rank=1 + worker * self.group_size, host=f"sim{worker}")
        self.slots.done(worker, result_seconds(result))
        return result

    def wait(self, decide: Decide, idle: Callable[[], None] | None = None) -> list[dict]:
        now = self.clock()
        arrival = self.events[0][0]
        if arrival > now:                        # nothing in yet: the master waits
            self.idle_seconds += arrival - now
            if idle is not None:                 # group commit ticks at least once a wait
                self.clock.set(min(arrival, now + 1.0))
                idle()
            now = arrival
        results = []
        while self.events and self.events[0][0] <= now and len(results) < self.batch:
            _, _, worker, spec, start, end = heapq.heappop(self.events)
            results.append(self._result(worker, spec, start, end))
        self.messages += len(results)
        self.clock.set(now + self.message_seconds * len(results))
        return results

    def shutdown(self) -> None:
        self.events.clear()


def simulate(cfg: dict, meta: dict, data, run_dir: RunDirectory, workers: int, *, latency: float = 0.0,
             message_seconds: float = 0.0, replay: str | Path | None = None, speed: float = 1.0) -> dict:
    """Run ``cfg`` (its spec source, budget, journal) on ``workers`` simulated workers;
    returns ``run_stats`` of the journal it wrote, with the master's account and timings."""
    from ensemble.orchestrate.session import in_hand, make_source
    from ensemble.train.rehearsal import RehearsalTrainer, member_seconds, replay_durations

    rt = cfg["runtime"]
    settings = {**cfg["rehearsal"], "predictions": False}      # no member files
    trainer = RehearsalTrainer({**cfg, "rehearsal": settings}, meta, data)
    durations = replay_durations(replay) if replay else None
    source, total = make_source(cfg, meta, run_dir, [])
    clock = VirtualClock(0.0, speed)
    executor = SimExecutor(workers, lambda spec: member_seconds(spec, settings, durations),
                           lambda spec, seconds: guarded(lambda: trainer.record(spec, seconds), spec, 0),
                           clock, in_hand=in_hand(rt), latency=latency, message_seconds=message_seconds,
                           group_size=rt["group_size"])
    budget = RunBudget(rt["time_limit"], rt["finish_reserve"], rt["max_failed_share"], clock=clock)
    records: list[dict] = []
    real0 = time.perf_counter()
    with Journal(run_dir / run_dir.JOURNAL, rt["journal_sync_seconds"], clock=clock) as journal:
        opened = {"event": "open", "time": 0.0, "job_started": 0.0, "workers": workers,
                  "group_size": rt["group_size"], "ranks": 1 + workers * rt["group_size"], "host": "simulated",
                  "trainer": "simulated", "specs_in_hand": rt["specs_in_hand"]}
        journal.event(opened)
        clock.set(0.0)

        def on_results(results: list[dict]) -> None:
            journal.extend(results)
            records.extend({k: r.get(k) for k in KEPT} for r in results)     # what run_stats reads
            for result in results:
                budget.observe(result)
        account = dispatch(executor, source, on_results, should_stop=budget.should_stop, adjust=budget.cap,
                           idle=journal.sync_if_due, clock=clock)
        wall = clock()
        busy = wall - executor.idle_seconds
        closed = {"event": "close", "time": round(wall, 4), "results": account["results"],
                  "master_wall_seconds": round(wall, 4), "master_busy_seconds": round(busy, 4),
                  "master_cpu_seconds": round(busy, 4), "journal_syncs": journal.syncs + 1,
                  "journal_bytes": journal.bytes}
        journal.event(closed)
    stats = run_stats(records, [opened, closed])
    stats.update(simulated_seconds=round(wall, 3), real_seconds=round(time.perf_counter() - real0, 3),
                 journal_bytes=journal.bytes, messages=executor.messages, latency=latency,
                 message_seconds=message_seconds, expected_members=total)
    return stats
