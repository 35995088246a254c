"""Executors: where member specs are trained, behind one small interface.

The master's dispatch loop (``ensemble.orchestrate.dispatch``) only ever calls
``free()``, ``submit(spec)``, ``busy()``, ``wait(decide)`` and ``shutdown()``:

- ``SerialExecutor`` trains in this process (``mpirun -n 1``, notebooks, tests);
- ``MpiExecutor`` hands specs to worker ranks (group leaders) over MPI; the workers
  run ``serve``. A Dask or Ray executor would be a third class with these five methods.

While a member trains, its trainer may call ``report(payload)`` (per epoch or per round)
and gets back the master's decision: ``CONTINUE``, ``STOP`` (end training now, keep what
was learned), or ``{"action": "update", "settings": {...}}`` (new instructions, such as a
learning rate). The master answers with ``decide(spec, payload)``. Early discarding and
population-based training stand on this; a trainer that never reports pays nothing.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

CONTINUE = {"action": "continue"}
STOP = {"action": "stop"}
ACTIONS = ("continue", "stop", "update")

#: (spec, report payload) -> decision
Decide = Callable[[dict, dict], dict]
#: the function a trainer calls with a report; returns the master's decision
Report = Callable[[dict], dict]
#: (spec, report) -> result record (or None on a group rank that is not the leader)
Trainer = Callable[[dict, Report], "dict | None"]


def go_on(spec: dict, payload: dict) -> dict:
    """The default decision: every member trains to its own end."""
    return CONTINUE


def check_decision(decision: dict) -> dict:
    """A decision must name one of ``ACTIONS``; "update" carries a ``settings`` table."""
    if not isinstance(decision, dict) or decision.get("action") not in ACTIONS:
        raise ValueError(f"a decision must be a dict with action in {ACTIONS}, but got {decision!r}")
    if decision["action"] == "update" and not isinstance(decision.get("settings"), dict):
        raise ValueError(f"an \"update\" decision needs a `settings` dict, but got {decision!r}")
    return decision


class Executor(Protocol):
    """What the master's loop needs from wherever members are trained."""

    def free(self) -> int:
        """How many more specs can start now."""

    def submit(self, spec: dict) -> None:
        """Start training ``spec`` (only when ``free() > 0``)."""

    def busy(self) -> int:
        """Specs submitted whose result has not been returned by ``wait``."""

    def wait(self, decide: Decide) -> dict:
        """Block until the next result and return it, answering reports with ``decide``."""

    def shutdown(self) -> None:
        """No more specs: release the workers."""


class SerialExecutor:
    """Train in this process, one spec at a time, in submission order."""

    def __init__(self, make_trainer: Callable[[], Trainer]):
        self._make_trainer, self._trainer = make_trainer, None
        self._queue: deque[dict] = deque()

    def free(self) -> int:
        return 0 if self._queue else 1

    def submit(self, spec: dict) -> None:
        self._queue.append(spec)

    def busy(self) -> int:
        return len(self._queue)

    def wait(self, decide: Decide) -> dict:
        spec = self._queue.popleft()
        if self._trainer is None:                 # imports TensorFlow only when there is work
            self._trainer = self._make_trainer()
        return self._trainer(spec, lambda payload: check_decision(decide(spec, payload)))

    def shutdown(self) -> None:
        self._queue.clear()


class MpiExecutor:
    """Hand specs to worker ranks (group leaders) that run ``serve``; results and reports
    arrive as messages. Waiting probes and sleeps instead of spinning a core."""

    def __init__(self, comm, workers: list[int], max_sleep: float = 0.05):
        from ensemble.runtime import mpi            # only here: the serial path needs no MPI
        self.mpi = mpi
        self.comm, self.workers, self.max_sleep = comm, list(workers), max_sleep
        self._free: deque[int] = deque(self.workers)
        self._running: dict[int, dict] = {}

    def free(self) -> int:
        return len(self._free)

    def submit(self, spec: dict) -> None:
        worker = self._free.popleft()
        self.comm.send(spec, dest=worker, tag=self.mpi.TAG_SPEC)
        self._running[worker] = spec
        log.debug("spec %s to rank %d", spec.get("id"), worker)

    def busy(self) -> int:
        return len(self._running)

    def wait(self, decide: Decide) -> dict:
        while True:
            mpi = self.mpi
            message, worker, tag = mpi.poll_recv(self.comm, mpi.ANY_SOURCE, mpi.ANY_TAG, self.max_sleep)
            if tag == mpi.TAG_REPORT:
                decision = check_decision(decide(self._running[worker], message))
                self.comm.send(decision, dest=worker, tag=mpi.TAG_DECISION)
                log.debug("report from rank %d on %s: %s", worker, self._running[worker].get("id"),
                          decision["action"])
                continue
            if tag != mpi.TAG_RESULT:
                raise RuntimeError(f"master got an unexpected message (tag {tag}) from rank {worker}")
            spec = self._running.pop(worker)
            self._free.append(worker)
            log.debug("result of %s from rank %d", spec.get("id"), worker)
            return message

    def shutdown(self) -> None:
        for worker in self.workers:
            self.comm.send(None, dest=worker, tag=self.mpi.TAG_STOP)


def serve(comm, train: Trainer, max_sleep: float = 0.05, group=None) -> int:
    """A worker rank: train specs from the master until told to stop; returns how many.

    With a member group, only its leader talks to the master; it broadcasts each spec
    (or the stop), and each decision on a report, inside the group, so every rank of the
    group trains the same spec and takes the same decision at the same step.
    """
    from ensemble.runtime.mpi import (ANY_TAG, TAG_DECISION, TAG_REPORT, TAG_RESULT, TAG_STOP, poll_recv,
                                      polite_bcast)
    leader = group is None or group.Get_rank() == 0
    grouped = group is not None and group.Get_size() > 1

    def report(payload: dict) -> dict:
        decision = None
        if leader:
            comm.send(payload, dest=0, tag=TAG_REPORT)
            decision, _, _ = poll_recv(comm, 0, TAG_DECISION, max_sleep)
        return polite_bcast(group, decision, 0, max_sleep) if grouped else decision

    count = 0
    while True:
        spec = None
        if leader:
            spec, _, tag = poll_recv(comm, 0, ANY_TAG, max_sleep)
            spec = None if tag == TAG_STOP else spec
        if grouped:
            spec = polite_bcast(group, spec, 0, max_sleep)
        if spec is None:
            log.debug("told to stop after %d specs", count)
            return count
        log.debug("training %s", spec.get("id"))
        result = train(spec, report)
        if leader:
            comm.send(result, dest=0, tag=TAG_RESULT)
        count += 1
