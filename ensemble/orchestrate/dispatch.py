"""The master's loop: a spec source x an executor x a budget.

Whenever the executor has a free slot the source is asked for the next spec, so a fast
worker never waits for a slow one; results come back in batches (everything that
arrived while the master was busy), each is marked by the decider and told to the source, and the batch goes to
``on_results`` (journal, budget, progress). In-training reports are answered by the
decider. The same loop drives the serial, the MPI and the simulated executor; its
cost per result does not depend on the number of workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ensemble.results.records import MemberRecord
from ensemble.runtime import stopping
from ensemble.runtime.executor import UNSTARTED, Executor
from ensemble.sources.base import Decider, GoOn, Source


def dispatch(executor: Executor, source: Source, on_results: Callable[[list[MemberRecord]], None], *,
             decider: Decider | None = None, should_stop: Callable[[], bool] = lambda: False,
             adjust: Callable[[dict], dict] = lambda spec: spec, idle: Callable[[], None] | None = None,
             clock: Callable[[], float] = time.time) -> dict:
    """Hand specs out until the source runs dry (or ``should_stop``) and every submitted
    spec has come back; the decider stamps each spec and then ``adjust`` may change it just
    before it is handed out. The loop's CPU time is this thread's (``thread_time``): a
    master that also trains, in another thread (``runtime.master_trains``), does not count
    that as the loop's load.

    Each result crosses from JSON to a ``MemberRecord`` here, with the master's
    ``dispatched`` and ``received`` (``clock``); the decider marks it, the source is told
    it, and the batch goes to ``on_results`` (journal, budget, progress). Returns the
    master's own account: results, wall (``clock``) and CPU seconds of the loop, and the seconds it
    spent waiting with nothing to do (when the executor measures that)."""
    decider = decider if decider is not None else GoOn()
    sent: dict[str, float] = {}
    count = 0
    wall0, cpu0 = clock(), time.thread_time()
    while True:
        stopping.take()                        # a signal's stop dropped on its way (runtime.stopping)
        while executor.free() and not should_stop():
            spec = source.next_spec()
            if spec is None:
                break
            spec = adjust(decider.stamp(spec))
            sent[spec["id"]] = round(clock(), 4)
            executor.submit(spec)
        executor.tail(should_stop() or source.dry())     # nothing more to hand out: idle workers may help
        if not executor.busy():
            break
        results = executor.wait(decider.decide, idle)
        now = round(clock(), 4)
        records = []
        for result in results:                 # the master's two times set before the one crossing
            if result.get(UNSTARTED):          # held ahead past the run's latest start: nothing ran, nothing
                sent.pop(str(result["id"]), None)    # is recorded, and a resume hands it out
                continue
            result["dispatched"], result["received"] = sent.pop(str(result["id"]), None), now
            records.append(source.tell(decider.mark(MemberRecord.from_json(result))))
        on_results(records)
        count += len(records)
    # Only a loop that ran out releases the workers: on Ctrl-C or an error the job is ending,
    # and a stop sent to a worker that is already gone could block rank 0 until the launcher
    # kills it, before the journal and status.json are closed on the way out.
    executor.shutdown()
    wall = clock() - wall0
    idle_seconds = executor.idle_seconds
    return {"results": count, "master_wall_seconds": round(wall, 4),
            "master_cpu_seconds": round(time.thread_time() - cpu0, 4),
            "master_busy_seconds": None if idle_seconds is None else round(wall - idle_seconds, 4)}
