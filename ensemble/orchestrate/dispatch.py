"""The master's loop: a spec source x an executor x a budget.

Whenever the executor has a free slot the source is asked for the next spec, so a fast
worker never waits for a slow one; every result goes to the source (``tell``) and to
``on_result`` (journal, budget, progress) the moment it arrives. In-training reports
are answered by ``decide``. The same loop drives the serial and the MPI executor.
"""

from __future__ import annotations

from collections.abc import Callable

from ensemble.runtime.executor import Decide, Executor, go_on
from ensemble.sources import SpecSource


def dispatch(executor: Executor, source: SpecSource, on_result: Callable[[dict], None], *,
             should_stop: Callable[[], bool] = lambda: False,
             adjust: Callable[[dict], dict] = lambda spec: spec,
             decide: Decide = go_on) -> None:
    """Hand specs out until the source runs dry (or ``should_stop``) and every submitted
    spec has come back; ``adjust`` may change a spec just before it is handed out."""
    try:
        while True:
            while executor.free() and not should_stop():
                spec = source.next_spec()
                if spec is None:
                    break
                executor.submit(adjust(spec))
            if not executor.busy():
                break
            result = executor.wait(decide)
            source.tell(result)
            on_result(result)
    finally:
        executor.shutdown()
