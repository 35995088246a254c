"""Master and worker loops: dynamic hand-out of member specs to free workers.

The master asks a spec source for the next spec whenever a worker is free, so a fast
worker never waits for a slow one; results are handled the moment they arrive. With no
workers (``-n 1``) the master trains every member itself, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ensemble.mpi import ANY_SOURCE, ANY_TAG, TAG_RESULT, TAG_SPEC, TAG_STOP, poll_recv, polite_bcast


class SpecSource(Protocol):
    """What the master needs from an ensemble list or a search strategy."""

    def next_spec(self) -> dict | None:
        """The next spec to train, or None when nothing can be handed out now."""

    def tell(self, result: dict) -> None:
        """A result has arrived (finished or failed)."""


class SpecList:
    """The fixed member list of an ensemble run, minus members already finished."""

    def __init__(self, specs: list[dict], done_ids: set[str] = frozenset()):
        self.pending = [s for s in specs if s["id"] not in done_ids]

    def next_spec(self) -> dict | None:
        return self.pending.pop(0) if self.pending else None

    def tell(self, result: dict) -> None:
        pass


def run_master(comm, source: SpecSource, on_result: Callable[[dict], None],
               train_local: Callable[[dict], dict], max_sleep: float = 0.05,
               should_stop: Callable[[], bool] = lambda: False,
               adjust: Callable[[dict], dict] = lambda spec: spec,
               workers: list[int] | None = None) -> None:
    """Hand specs to workers (group leaders) until the source runs dry (or ``should_stop``)
    and every worker has reported; ``adjust`` may change a spec just before it is handed out."""
    workers = list(range(1, comm.Get_size())) if workers is None else list(workers)
    if not workers:
        while not should_stop() and (spec := source.next_spec()) is not None:
            result = train_local(adjust(spec))
            source.tell(result)
            on_result(result)
        return
    free, busy = list(workers), {}
    try:
        while True:
            while free and not should_stop():
                spec = source.next_spec()
                if spec is None:
                    break
                worker = free.pop(0)
                spec = adjust(spec)
                comm.send(spec, dest=worker, tag=TAG_SPEC)
                busy[worker] = spec
            if not busy:
                break
            result, worker, _ = poll_recv(comm, ANY_SOURCE, TAG_RESULT, max_sleep)
            busy.pop(worker)
            free.append(worker)
            source.tell(result)
            on_result(result)
    finally:
        for worker in workers:
            comm.send(None, dest=worker, tag=TAG_STOP)


def run_worker(comm, train: Callable[[dict], dict | None], max_sleep: float = 0.05, group=None) -> int:
    """Train specs from the master until told to stop; returns how many were trained.

    With a member group, only its leader talks to the master; it broadcasts each spec
    (or the stop) inside the group, every rank of the group trains, the leader reports.
    """
    leader = group is None or group.Get_rank() == 0
    count = 0
    while True:
        spec = None
        if leader:
            spec, _, tag = poll_recv(comm, 0, ANY_TAG, max_sleep)
            spec = None if tag == TAG_STOP else spec
        if group is not None and group.Get_size() > 1:
            spec = polite_bcast(group, spec, 0, max_sleep)
        if spec is None:
            return count
        result = train(spec)
        if leader:
            comm.send(result, dest=0, tag=TAG_RESULT)
        count += 1
