"""Executors: where member specs are trained, behind one small interface.

The master calls only what the ``Executor`` protocol declares: ``free()``,
``submit(spec)``, ``busy()``, ``wait(decide, idle)``, ``answer(spec_id, decision)`` and
``shutdown()``, and reads ``workers``, ``idle_seconds`` and ``report_bytes``:

- ``SerialExecutor`` trains in this process (``mpirun -n 1``, notebooks, tests);
- ``MpiExecutor`` hands specs to worker ranks (group leaders) over MPI; the workers
  run ``serve`` with a ``Trainer`` (``OneByOne`` wraps a function; a packing trainer
  trains several specs at once);
- ``ensemble.orchestrate.simulate.SimExecutor`` trains nothing, on a virtual clock.
A Dask or Ray executor would be one more class with the same members
(tests/ensemble/test_seams.py runs one contract suite over them all).

While a member trains, its trainer may call ``report(payload)`` (per epoch or per round)
and gets back the master's decision: ``CONTINUE``, ``STOP`` (end training now, keep what
was learned), or ``{"action": "update", "settings": {...}}`` (new instructions, such as a
learning rate). The master answers with ``decide(spec, payload)``. Early discarding and
population-based training stand on this; a trainer that never reports pays nothing.
``decide`` may also return None: the member waits (holds) until the master calls
``answer(spec_id, decision)``, so a synchronous round (population-based training) can
answer every member once the last one has reported.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

CONTINUE = {"action": "continue"}
STOP = {"action": "stop"}
ACTIONS = ("continue", "stop", "update")

#: (spec, report payload) -> decision, or None: hold the member until ``answer(spec_id, ...)``
Decide = Callable[[dict, dict], "dict | None"]
#: the function a trainer calls with a report; returns the master's decision
Report = Callable[[dict], dict]
#: (spec, report) -> result record (or None on a group rank that is not the leader)
TrainFn = Callable[[dict, Report], "dict | None"]


class Trainer(Protocol):
    """The Trainer seam: what a worker (``serve``) and the executors call to train members.

    ``trainer(spec, report)`` trains one member and returns its record (a JSON-able dict,
    the MPI boundary; None on a group rank that is not the leader). A trainer that packs
    (``pack`` > 1) trains up to ``pack`` specs of equal ``pack_key`` at once with
    ``train_many``; a ``pack_key`` of None means "alone". ``ahead(upcoming, now)``: the
    worker holds ``upcoming`` (sent ahead) and is about to train ``now``; a trainer may
    prepare ``upcoming`` meanwhile (``runtime.pretrace``) or do nothing."""

    pack: int
    #: whether ``ahead`` does anything (a worker then waits a moment for the next spec: ``serve``)
    looks_ahead: bool
    #: whether its members take helpers at the end of the run (``runtime.tail``); ``serve``
    #: then sets ``tail`` (a ``WorkerTail``) before the first member
    elastic: bool
    tail: Any

    def __call__(self, spec: dict, report: Report) -> dict | None: ...

    def pack_key(self, spec: dict) -> Any: ...

    def train_many(self, specs: list[dict]) -> list[dict]: ...

    def ahead(self, upcoming: dict, now: dict) -> None: ...

    def help(self, spec: dict, leader: int) -> None:
        """Help rank ``leader`` train ``spec`` until it ends (an elastic trainer's helper side)."""


#: seconds a worker whose trainer looks ahead waits, before training, for the next spec
AHEAD_WAIT = 0.05
#: seconds between a waiting master's looks for stragglers its idle workers may help (``runtime.tail``)
TAIL_CHECK_SECONDS = 0.5


class OneByOne:
    """A Trainer from a plain function ``(spec, report) -> record``: no packing; ``ahead``,
    if given, is called as ``ahead(upcoming, now)``. With ``help`` (``(spec, leader, tail)``)
    the trainer is elastic: ``train`` is then called as ``train(spec, report, tail)``."""

    pack = 1

    def __init__(self, train: TrainFn, ahead: Callable[[dict, dict], Any] | None = None,
                 help: Callable[[dict, int, Any], None] | None = None):
        self._train, self._ahead, self._help = train, ahead, help
        self.looks_ahead = ahead is not None
        self.elastic = help is not None
        self.tail = None

    def __call__(self, spec: dict, report: Report) -> dict | None:
        if self.elastic:
            return self._train(spec, report, self.tail)
        return self._train(spec, report)

    def help(self, spec: dict, leader: int) -> None:
        if self._help is None:
            raise RuntimeError("this trainer takes no helpers")
        self._help(spec, leader, self.tail)

    def ahead(self, upcoming: dict, now: dict) -> None:
        if self._ahead is not None:
            self._ahead(upcoming, now)

    def pack_key(self, spec: dict) -> Any:
        return None

    def train_many(self, specs: list[dict]) -> list[dict]:
        return [r for r in (self(spec, go_on_report) for spec in specs) if r is not None]


def go_on_report(payload: dict) -> dict:
    """The report function of a member nobody decides about."""
    return CONTINUE


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
    """What the master's loop needs from wherever members are trained (the Executor seam;
    ``tests/ensemble/test_seams.py`` runs one contract suite on every implementation)."""

    #: workers (member groups) members train on
    workers: int
    #: seconds ``wait`` spent with nothing to do, or None where the executor cannot tell (it
    #: trains in the master's own thread)
    idle_seconds: float | None
    #: bytes of in-training reports received (the master's share of the traffic)
    report_bytes: int

    def free(self) -> int:
        """How many more specs can be handed out now."""

    def submit(self, spec: dict) -> None:
        """Hand ``spec`` out for training (only when ``free() > 0``)."""

    def busy(self) -> int:
        """Specs submitted whose result has not been returned by ``wait``."""

    def wait(self, decide: Decide, idle: Callable[[], None] | None = None) -> list[dict]:
        """Block until at least one result is in; return every result already waiting (a
        bounded batch), answering reports with ``decide``. ``idle()`` is called now and then
        while nothing arrives (the journal's group commit uses it)."""

    def shutdown(self) -> None:
        """No more specs: release the workers."""

    def answer(self, spec_id: str, decision: dict) -> None:
        """Send a decision to the member ``decide`` held (returned None for)."""

    def tail(self, dry: bool) -> None:
        """Whether the source is dry (nothing more will be submitted): from then on, an
        executor that can lets idle workers help the members still training
        (``runtime.tail``); others do nothing."""


class HeldReports:
    """Reports the master has not answered yet (``decide`` returned None), by spec id: each
    entry is the function that delivers the decision to that member."""

    def __init__(self) -> None:
        self._held: dict[str, Callable[[dict], None]] = {}

    def hold(self, spec_id: str, deliver: Callable[[dict], None]) -> None:
        if spec_id in self._held:
            raise RuntimeError(f"{spec_id} reported again before its last report was answered")
        self._held[spec_id] = deliver

    def answer(self, spec_id: str, decision: dict) -> None:
        deliver = self._held.pop(spec_id, None)
        if deliver is None:
            raise KeyError(f"no report of {spec_id} is waiting for an answer")
        deliver(check_decision(decision))

    def __len__(self) -> int:
        return len(self._held)


def gather(poll: Callable[[], list[dict] | None], batch: int, cap: float,
           idle: Callable[[], None] | None = None) -> tuple[list[dict], float]:
    """The master's wait, for every executor that polls: ``poll()`` returns None when nothing
    came in, else the results what came in carried (possibly none: a report, a room
    update). Sleeps while nothing comes (1e-4 s, doubling up to ``cap``: no core spins),
    calling ``idle()`` each time, until a result is in; then takes, without waiting, what
    else is already in up to ``batch`` results. Returns (results, seconds waited idle)."""
    results: list[dict] = []
    sleep, waited_since, waited = 1e-4, None, 0.0
    while not results:
        got = poll()
        if got is None:
            if waited_since is None:
                waited_since = time.perf_counter()
            if idle is not None:
                idle()
            time.sleep(sleep)
            sleep = min(sleep * 2, cap)
            continue
        if waited_since is not None:
            waited += time.perf_counter() - waited_since
            waited_since, sleep = None, 1e-4
        results.extend(got)
    while len(results) < batch and (got := poll()) is not None:    # whatever else is in: one batch
        results.extend(got)
    return results, waited


def sleep_cap(max_sleep: float, mean_seconds: float | None) -> float:
    """The longest nap between a master's probes: ``max_sleep``, or less when members are
    short (``mean_seconds``), so the master answers well within one member's time."""
    return max_sleep if mean_seconds is None else min(max_sleep, max(5e-4, 0.1 * mean_seconds))


#: a spec handed back unstarted (``on_start``): the master records nothing, a resume hands it out
UNSTARTED = "unstarted"


def on_start(spec: dict, now: float | None = None) -> dict:
    """A spec as its worker starts it: one held ahead (``runtime.specs_in_hand``) starts later
    than it was handed out, so its ``member_time_limit``, capped then to end by the run's
    deadline (``budget.ENDS_BY``), is what is left of it now; past the latest start
    (``budget.START_BY``) it is marked ``UNSTARTED`` and not trained (a run of 2 s members held 6
    deep ran 8 s past its 20 s limit)."""
    from ensemble.runtime.budget import ENDS_BY, START_BY
    if spec.get(ENDS_BY) is None:
        return spec
    now = time.time() if now is None else now
    if now > spec[START_BY]:
        return {**spec, UNSTARTED: True}
    left = spec[ENDS_BY] - now
    return {**spec, "member_time_limit": left} if left < spec["member_time_limit"] else spec


def timed(train: Trainer, spec: dict, report: Report) -> dict | None:
    """``train(spec, report)`` with the worker's wall clock stamped on the record:
    ``started`` and ``ended`` (UNIX seconds), from which a run's utilisation is computed."""
    started = time.time()
    result = train(spec, report)
    if result is not None:
        result["started"], result["ended"] = round(started, 4), round(time.time(), 4)
    return result


class SerialExecutor:
    """Train in this process, one spec at a time, in submission order."""

    def __init__(self, make_trainer: Callable[[], Trainer]):
        self._make_trainer, self._trainer = make_trainer, None
        self._queue: deque[dict] = deque()
        self.workers = 1
        self.idle_seconds: float | None = None       # the master trains: it is never idle
        self.report_bytes = 0

    def free(self) -> int:
        return 0 if self._queue else 1

    def submit(self, spec: dict) -> None:
        self._queue.append(spec)

    def busy(self) -> int:
        return len(self._queue)

    def wait(self, decide: Decide, idle: Callable[[], None] | None = None) -> list[dict]:
        """Train the next spec here; ``idle()`` runs on each of its reports, the only moments
        this master is not training (the journal's group commit and the heartbeat need them)."""
        spec = self._queue.popleft()
        if self._trainer is None:                 # imports TensorFlow only when there is work
            self._trainer = self._make_trainer()

        def report(payload: dict) -> dict:
            if idle is not None:
                idle()
            decision = decide(spec, payload)
            if decision is None:
                raise RuntimeError(f"the master held {spec['id']}'s report for an answer, but a serial run "
                                   "trains one member at a time: nothing else could ever report; start more "
                                   "ranks (mpirun -n P)")
            return check_decision(decision)
        result = timed(self._trainer, spec, report)
        result["worker"] = 0
        return [result]

    def shutdown(self) -> None:
        self._queue.clear()

    def answer(self, spec_id: str, decision: dict) -> None:
        raise RuntimeError("a serial run holds no reports")

    def tail(self, dry: bool) -> None:
        """Nothing: one slot, no one to help."""


#: ``specs_in_hand = "auto"``: one spec in hand once members average over LONG_MEMBER seconds
#: (a queued spec would only make the end of the run less even; back to more below
#: SHORT_MEMBER), else enough to cover COVER_SECONDS of round trip to the master, 2 to MAX_IN_HAND
SHORT_MEMBER, LONG_MEMBER, COVER_SECONDS, MAX_IN_HAND = 8.0, 12.0, 0.1, 4


class Slots:
    """Which worker gets the next spec: O(1) per operation at any number of workers.

    Each worker holds up to ``target`` specs (the one it trains and the next ones) in
    the order it trains them; ``ready`` lists a worker once per free place. With
    ``in_hand = None`` (auto) the target follows the members' mean duration (see
    ``LONG_MEMBER``), reconsidered once per ``max(64, workers)`` results, and a change
    rebuilds ``ready`` (O(workers), so O(1) per result).
    """

    def __init__(self, workers: int, in_hand: int | None = 1, block: int = 1):
        self.auto = in_hand is None
        self.target = 1 if self.auto else in_hand
        self.held: list[deque[dict]] = [deque() for _ in range(workers)]
        # round-robin, ``block`` at a time (a worker that packs members gets consecutive specs)
        self.ready: deque[int] = deque(w for _ in range(-(-self.target // block)) for w in range(workers)
                                       for _ in range(min(block, self.target)))
        while len(self.ready) > workers * self.target:
            self.ready.pop()
        self.busy = 0
        self.mean_seconds: float | None = None     # running mean of members' durations
        self._every, self._count = max(64, workers), 0

    def take(self, spec: dict) -> int:
        worker = self.ready.popleft()
        self.held[worker].append(spec)
        self.busy += 1
        return worker

    def training(self, worker: int) -> dict:
        """The spec ``worker`` trains now (a report is about it)."""
        return self.held[worker][0]

    def done(self, worker: int, seconds: float | None = None, spec_id: str | None = None) -> dict:
        """``worker`` finished its current spec (after ``seconds``), or the one named ``spec_id``
        (packed members may finish out of order): returns the spec."""
        held = self.held[worker]
        if spec_id is None or held[0].get("id") == spec_id:
            spec = held.popleft()
        else:
            spec = next(s for s in held if s.get("id") == spec_id)
            held.remove(spec)
        if len(self.held[worker]) < self.target:     # a worker is in ready once per free place
            self.ready.append(worker)
        self.busy -= 1
        if seconds is not None:
            mean = self.mean_seconds
            self.mean_seconds = seconds if mean is None else mean + 0.1 * (seconds - mean)
            if self.auto and self._count % self._every == 0:
                self.retarget()
            self._count += 1
        return spec

    def wanted(self) -> int:
        mean = max(self.mean_seconds or 0.0, 1e-6)
        if mean > LONG_MEMBER or (self.target == 1 and mean > SHORT_MEMBER):
            return 1
        return min(MAX_IN_HAND, 2 + int(COVER_SECONDS / mean))

    def retarget(self) -> None:
        want = self.wanted()
        if want != self.target:
            self.target = want
            self.ready = deque(w for w, held in enumerate(self.held) for _ in range(want - len(held)))


def result_seconds(result: dict) -> float | None:
    """How long a finished member kept its worker; None for a failure (failures are often
    instant and must not make the master queue more specs per worker)."""
    if result.get("status") != "ok" or "ended" not in result:
        return None
    return result["ended"] - result["started"]


class MpiExecutor:
    """Hand specs to worker ranks (group leaders) that run ``serve``; results and reports
    arrive as messages.

    A worker holds up to ``in_hand`` specs (None: auto, see ``Slots``), so it starts its
    next member the moment it sends a result instead of waiting a round trip for the
    master. Every operation is O(1) in the number of workers. Waiting probes and sleeps
    with a back-off instead of spinning a core, napping less when members are short;
    once a message is in, everything else already waiting (up to ``batch``) is taken too.
    """

    def __init__(self, comm, workers: list[int], max_sleep: float = 0.05, in_hand: int | None = 1,
                 batch: int = 256, local: Callable[[], Trainer] | None = None, block: int = 1,
                 helpers: int = 0):
        from ensemble.runtime import mpi  # only here: the serial path needs no MPI
        from ensemble.runtime.tail import TailPlan
        self.mpi = mpi
        self.plan = TailPlan(helpers)               # the end of the run: who helps whom (runtime.tail)
        self._dry = False
        self._idle_check = 0.0                      # when the master next looks for stragglers to help
        self.comm, self.max_sleep, self.batch = comm, max_sleep, batch
        self.leaders = list(workers)
        self.index = {rank: i for i, rank in enumerate(self.leaders)}
        self.local = LocalWorker(local) if local is not None else None     # the master's own slot, last
        self.workers = len(self.leaders) + (self.local is not None)
        self.slots = Slots(self.workers, in_hand, block)
        self.idle_seconds = 0.0                     # time spent waiting with nothing to do
        self._sends: deque = deque()                # specs on their way (non-blocking sends)
        self.held = HeldReports()                   # reports answered later (``answer``)
        self.report_bytes = 0                       # pickled size of the reports received (the master's traffic)

    def free(self) -> int:
        return len(self.slots.ready)

    def submit(self, spec: dict) -> None:
        slot = self.slots.take(spec)
        if slot == len(self.leaders):               # the master's own training thread
            self.local.inbox.put(spec)
            return
        if len(self.slots.held[slot]) == 1:         # it starts now (nothing else in its hands)
            self.plan.started(slot, spec["id"], time.monotonic())
        # non-blocking: a worker busy training takes the spec when it is done, the master
        # never waits for it (a blocking send can, once a worker's receive queue is full)
        worker = self.leaders[slot]
        self._sends.append(self.comm.isend(spec, dest=worker, tag=self.mpi.TAG_SPEC))
        log.debug("spec %s to rank %d", spec.get("id"), worker)
        while self._sends and self._sends[0].Test():
            self._sends.popleft()

    def busy(self) -> int:
        return self.slots.busy

    def _handle(self, message, worker: int, tag: int, decide: Decide) -> dict | None:
        mpi = self.mpi
        if tag == mpi.TAG_REPORT:                   # about the spec the worker trains now
            spec = self.slots.training(self.index[worker])
            self.report_bytes += len(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
            decision = decide(spec, message)
            if decision is None:
                self.held.hold(spec["id"], lambda d: self.comm.send(d, dest=worker, tag=mpi.TAG_DECISION))
                log.debug("report from rank %d on %s: held", worker, spec.get("id"))
                return None
            self.comm.send(check_decision(decision), dest=worker, tag=mpi.TAG_DECISION)
            log.debug("report from rank %d on %s: %s", worker, spec.get("id"), decision["action"])
            return None
        if tag == mpi.TAG_HELP:                     # a member's worker turned its helpers away
            for w in self.plan.decline(self.index[worker], message["declined"]):
                self._help(w)
            return None
        if tag != mpi.TAG_RESULT:
            raise RuntimeError(f"master got an unexpected message (tag {tag}) from rank {worker}")
        slot = message["worker"] = self.index[worker]
        self.slots.done(slot, result_seconds(message), message.get("id"))
        log.debug("result of %s from rank %d", message.get("id"), worker)
        freed = self.plan.ended(slot)
        held = self.slots.held[slot]
        if held:                                    # its next spec starts now
            self.plan.started(slot, held[0]["id"], time.monotonic())
        if self._dry:
            for w in (slot, *freed):
                self._help(w)
            self._help_idle()
        return message

    def tail(self, dry: bool) -> None:
        """From the first ``dry``: every idle worker, and each that goes idle later, helps the
        longest-running member with room (``TailPlan``); a member's worker is told of each
        helper (``TAG_HELP``) and takes it in at its next epoch end (``runtime.tail``)."""
        if not dry or self._dry or not self.plan.max_helpers:
            return
        self._dry = True
        for w in range(len(self.leaders)):
            self._help(w)

    def _help(self, w: int) -> None:
        if self.slots.held[w] or self.plan.busy(w):
            return
        got = self.plan.assign(w, time.monotonic(), self.slots.mean_seconds)
        if got is not None:
            self._send_help(w, *got)

    def _help_idle(self) -> None:
        """Idle workers no member could take before (none was a straggler yet): again."""
        if self.plan.idle:
            for w, leader, spec_id in self.plan.assign_idle(time.monotonic(), self.slots.mean_seconds):
                self._send_help(w, leader, spec_id)

    def _send_help(self, w: int, leader: int, spec_id: str) -> None:
        spec = self.slots.training(leader)
        mpi, rank = self.mpi, self.leaders[w]
        self._sends.append(self.comm.isend({"spec": spec, "leader": self.leaders[leader]}, dest=rank,
                                           tag=mpi.TAG_HELP))
        self._sends.append(self.comm.isend({"id": spec_id, "helper": rank}, dest=self.leaders[leader],
                                           tag=mpi.TAG_HELP))
        log.debug("rank %d helps rank %d with %s", rank, self.leaders[leader], spec_id)

    def sleep_cap(self) -> float:
        """The longest nap between probes (``sleep_cap``; a worker's next spec covers the
        member's time the master may take to answer)."""
        return sleep_cap(self.max_sleep, self.slots.mean_seconds)

    def _local_results(self, decide: Decide) -> list[dict]:
        """What the master's own thread has for the loop: its reports answered, its results."""
        out = []
        slot = len(self.leaders)
        while (report := self.local.pending_report()) is not None:
            payload, reply = report
            spec = self.slots.training(slot)
            decision = decide(spec, payload)
            if decision is None:
                self.held.hold(spec["id"], reply.put)
            else:
                reply.put(check_decision(decision))
        while (result := self.local.result()) is not None:
            result["worker"] = slot
            self.slots.done(slot, result_seconds(result))
            out.append(result)
        return out

    def wait(self, decide: Decide, idle: Callable[[], None] | None = None) -> list[dict]:
        def poll() -> list[dict] | None:
            if self.local is not None and (mine := self._local_results(decide)):
                return mine
            got = self.mpi.try_recv(self.comm)
            if got is None:
                return None
            result = self._handle(*got, decide)
            return [] if result is None else [result]

        def lull() -> None:
            if idle is not None:
                idle()
            now = time.monotonic()
            if self.plan.idle and now >= self._idle_check:   # a member may have become a straggler
                self._idle_check = now + TAIL_CHECK_SECONDS
                self._help_idle()
        results, waited = gather(poll, self.batch, self.sleep_cap(), lull)
        self.idle_seconds += waited
        return results

    def shutdown(self) -> None:
        self.mpi.polite_wait(self._sends, self.max_sleep)      # every spec delivered before the stops
        self._sends.clear()
        for worker in self.leaders:
            self.comm.send(None, dest=worker, tag=self.mpi.TAG_STOP)
        if self.local is not None:
            self.local.stop()

    def answer(self, spec_id: str, decision: dict) -> None:
        self.held.answer(spec_id, decision)


class LocalWorker:
    """The master's own training slot (``runtime.master_trains``): a thread that trains the
    specs the master hands it, so rank 0's GPU is not idle. The thread makes no MPI call;
    its results and reports go through queues the master's loop reads between probes, so
    the loop (and every decision) stays on the main thread, which keeps answering the
    workers while the member trains (TensorFlow's kernels run without the GIL)."""

    def __init__(self, make_trainer: Callable[[], Trainer]):
        import queue
        import threading
        self._queue_empty = queue.Empty
        self.inbox: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._reports: queue.Queue = queue.Queue()
        self._make_trainer = make_trainer
        self._thread = threading.Thread(target=self._run, name="master-trainer", daemon=True)
        self._thread.start()

    def _report(self, payload: dict) -> dict:
        import queue
        reply: queue.Queue = queue.Queue(maxsize=1)
        self._reports.put((payload, reply))
        return reply.get()

    def _run(self) -> None:
        trainer = None
        while (spec := self.inbox.get()) is not None:
            spec = on_start(spec)                       # held ahead as a worker's are
            if spec.get(UNSTARTED):
                self._results.put({"id": spec["id"], UNSTARTED: True})
                continue
            try:
                if trainer is None:                     # imports TensorFlow on the first spec
                    trainer = self._make_trainer()
                result = timed(trainer, spec, self._report)
            except BaseException as exc:                # noqa: BLE001 - the master must hear of it
                result = {"crash": f"the master's training thread failed on {spec.get('id')}: "
                                   f"{type(exc).__name__}: {exc}"}
            self._results.put(result)

    def result(self) -> dict | None:
        try:
            result = self._results.get_nowait()
        except self._queue_empty:
            return None
        if "crash" in result:
            raise RuntimeError(result["crash"])
        return result

    def pending_report(self):
        try:
            return self._reports.get_nowait()
        except self._queue_empty:
            return None

    def stop(self) -> None:
        self.inbox.put(None)
        self._thread.join()


#: seconds a worker that packs waits for more specs to fill its pack (they are on their way:
#: the master keeps two packs' worth in every worker's hands)
PACK_WAIT = 0.25


def _pack_with(train: Trainer, spec: dict, inbox: deque, refill: Callable[[], None]) -> list[dict]:
    """``spec`` and the specs in hand it can be trained with, packed (``train.pack`` of them at
    most, equal ``train.pack_key``), taken out of ``inbox`` in order; just ``[spec]`` when the
    trainer does not pack or nothing matches. ``refill()`` moves specs that have arrived into
    ``inbox``; a pack not full yet waits up to ``PACK_WAIT`` for more (a stop ends the wait)."""
    size = train.pack
    key = train.pack_key(spec) if size > 1 else None
    if key is None:
        return [spec]
    pack, deadline, sleep = [spec], time.monotonic() + PACK_WAIT, 1e-3
    while True:
        refill()
        for other in list(inbox):
            if len(pack) == size or other is None:
                break
            if train.pack_key(other) == key:
                inbox.remove(other)
                pack.append(other)
        if len(pack) == size or None in inbox or time.monotonic() > deadline:
            return pack
        time.sleep(sleep)
        sleep = min(2 * sleep, 0.05)


@dataclass(frozen=True)
class Help:
    """In a worker's inbox: help rank ``leader`` train ``spec`` (the end of the run, ``runtime.tail``)."""

    spec: dict
    leader: int


def serve(comm, train: Trainer, max_sleep: float = 0.05, group=None, startup: dict | None = None) -> int:
    """A worker rank: train specs from the master until told to stop; returns how many.
    Its first result carries ``startup`` (when the process reached each start-up step).

    Specs the master sent ahead wait in a local queue; the worker waits (sleeping) only
    when it holds none. With a member group, only its leader talks to the master; it
    broadcasts each spec (or the stop), and each decision on a report, inside the group,
    so every rank of the group trains the same spec and takes the same decision at the
    same step.
    """
    from ensemble.runtime.mpi import (
        ANY_TAG,
        TAG_DECISION,
        TAG_HELP,
        TAG_REPORT,
        TAG_RESULT,
        TAG_STOP,
        polite_bcast,
        poll_recv,
        try_recv,
    )
    leader = group is None or group.Get_rank() == 0
    grouped = group is not None and group.Get_size() > 1
    inbox: deque = deque()
    tail = None
    if train.elastic and not grouped:                  # the end of the run may send helpers (runtime.tail)
        from ensemble.runtime.tail import WorkerTail
        tail = train.tail = WorkerTail(comm, max_sleep)

    def report(payload: dict) -> dict:
        decision = None
        if leader:
            comm.send(payload, dest=0, tag=TAG_REPORT)
            decision, _, _ = poll_recv(comm, 0, TAG_DECISION, max_sleep)
        return polite_bcast(group, decision, 0, max_sleep) if grouped else decision

    def take(got) -> None:
        message, _, tag = got
        if tag == TAG_HELP:
            if "helper" in message:                # for a member this worker trains no longer
                tail.release([message["helper"]])
            else:                                  # this worker helps a member at the end of the run
                inbox.append(Help(message["spec"], int(message["leader"])))
            return
        inbox.append(None if tag == TAG_STOP else message)

    def drain() -> None:
        while (got := try_recv(comm, 0, ANY_TAG)) is not None:        # specs sent ahead (or the stop)
            take(got)

    def next_spec_briefly() -> None:
        """Wait up to ``AHEAD_WAIT`` for the spec the master sends on the last result."""
        deadline = time.monotonic() + AHEAD_WAIT
        while (got := try_recv(comm, 0, ANY_TAG)) is None and time.monotonic() < deadline:
            time.sleep(AHEAD_WAIT / 25)
        if got is not None:
            take(got)

    count = 0
    sends_ahead = False                    # the master has sent a spec before this worker asked
    while True:
        spec = None
        if leader:
            drain()
            sends_ahead = sends_ahead or bool(inbox)
            while not inbox:                 # (a stale help message adds nothing: wait on)
                take(poll_recv(comm, 0, ANY_TAG, max_sleep))
            spec = inbox.popleft()
            if isinstance(spec, dict):
                spec = on_start(spec)        # the leader's clock decides for its whole group
        if grouped:
            spec = polite_bcast(group, spec, 0, max_sleep)
        if spec is None:
            log.debug("told to stop after %d specs", count)
            return count
        if isinstance(spec, Help):
            log.debug("helping rank %d with %s", spec.leader, spec.spec.get("id"))
            train.help(spec.spec, spec.leader)
            continue
        if spec.get(UNSTARTED):              # too late to end by the run's deadline: handed back
            if leader:
                comm.send({"id": spec["id"], UNSTARTED: True}, dest=0, tag=TAG_RESULT)
            continue
        pack = _pack_with(train, spec, inbox, drain) if leader and not grouped else [spec]
        if len(pack) > 1:                  # packed members (runtime.members_per_rank): one graph, K results
            limit = pack[0]["member_time_limit"]       # they start with the first: its time is theirs
            pack = [pack[0], *({**s, "member_time_limit": min(s["member_time_limit"], limit)} for s in pack[1:])]
            log.debug("training %s packed", ", ".join(s.get("id") for s in pack))
            started = time.time()
            results = train.train_many(pack)
            for result in results:
                result["started"], result["ended"] = round(started, 4), round(time.time(), 4)
        else:
            log.debug("training %s", spec.get("id"))
            if leader and not grouped and train.looks_ahead:
                if not inbox and sends_ahead:
                    next_spec_briefly()
                if inbox and isinstance(inbox[0], dict):
                    train.ahead(inbox[0], spec)      # the next spec held: prepared meanwhile
            results = [timed(train, spec, report)]
        if leader:
            for result in results:
                if count == 0 and startup:
                    result["startup"] = startup
                comm.send(result, dest=0, tag=TAG_RESULT)
                count += 1
        else:
            count += 1
