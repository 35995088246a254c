"""The master's loop: a spec source x an executor x a budget.

Whenever the executor has a free slot the source is asked for the next spec, so a fast
worker never waits for a slow one; results come back in batches (everything that
arrived while the master was busy), each goes to the source (``tell``), and the batch to
``on_results`` (journal, budget, progress). In-training reports are answered by
``decide``. The same loop drives the serial, the MPI and the simulated executor; its
cost per result does not depend on the number of workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ensemble.runtime.executor import Decide, Executor, go_on
from ensemble.sources import SpecSource


def dispatch(executor: Executor, source: SpecSource, on_results: Callable[[list[dict]], None], *,
             should_stop: Callable[[], bool] = lambda: False,
             adjust: Callable[[dict], dict] = lambda spec: spec,
             decide: Decide = go_on, idle: Callable[[], None] | None = None,
             clock: Callable[[], float] = time.time) -> dict:
    """Hand specs out until the source runs dry (or ``should_stop``) and every submitted
    spec has come back; ``adjust`` may change a spec just before it is handed out.
    The loop's CPU time is this thread's (``thread_time``): a master that also trains, in
    another thread (``runtime.master_trains``), does not count that as the loop's load.

    Each result gets ``dispatched`` and ``received`` (``clock``, the master's). Returns the
    master's own account: results, wall and CPU seconds of the loop, and the seconds it
    spent waiting with nothing to do (when the executor measures that)."""
    sent: dict[str, float] = {}
    count = 0
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    while True:
        while executor.free() and not should_stop():
            spec = source.next_spec()
            if spec is None:
                break
            spec = adjust(spec)
            sent[spec["id"]] = round(clock(), 4)
            executor.submit(spec)
        if not executor.busy():
            break
        results = executor.wait(decide, idle)
        now = round(clock(), 4)
        for result in results:
            result["dispatched"], result["received"] = sent.pop(result["id"], None), now
            source.tell(result)
        on_results(results)
        count += len(results)
    # Only a loop that ran out releases the workers: on Ctrl-C or an error the job is ending,
    # and a stop sent to a worker that is already gone could block rank 0 until the launcher
    # kills it, before the journal and status.json are closed on the way out.
    executor.shutdown()
    wall = time.perf_counter() - wall0
    idle_seconds = getattr(executor, "idle_seconds", None)
    return {"results": count, "master_wall_seconds": round(wall, 4),
            "master_cpu_seconds": round(time.thread_time() - cpu0, 4),
            "master_busy_seconds": None if idle_seconds is None else round(wall - idle_seconds, 4)}
