"""A run on a virtual clock: the real master code, simulated workers, no MPI, no sleeping.

``simulate`` runs the real master session (``orchestrate.session.MasterSession``: the
mode's source and decider, budget, retention, journal with group commit on the virtual
clock, ``run_stats``) with a ``SimExecutor`` in place of the MPI one, so any config a real
run accepts simulates: early discarding and PBT rounds included.

- a member's duration comes from the rehearsal settings (log-normal) or a replayed
  journal (``ensemble.train.rehearsal.member_seconds``); its record is a rehearsal record;
- a member that reports (``report_every`` epochs: early discarding, PBT rounds) reports at
  the matching share of its duration, with a made-up learning curve towards its record's
  quality; it waits for the master's answer (a held report waits for ``answer``), and a
  stop ends it there;
- a spec reaches its worker ``latency`` seconds after the master sends it, a result the
  master ``latency`` after the member ends; each message costs the master
  ``message_seconds`` (a send or a receive: measure it with ``scripts/bench_dispatch.py``'s
  ping-pong); workers hold specs in hand exactly as the MPI executor's ``Slots`` say;
- at the end of the run (``runtime.tail_helpers``) the executor plans helpers with the MPI
  executor's ``TailPlan``; a helper joins at its member's next epoch end and a crew of g
  ranks trains at ``tail.speedup(g, tail.EFFICIENCY)`` times one rank, as a rehearsal
  member does (members that report to the master are not helped here);
- the master's own cost is measured (``cost=None``): the real time its code takes between
  two waits (source, journal, budget) advances the virtual clock, so results that arrive
  while it is busy queue up as they would on a real machine; or it comes from a cost
  model (``cost``: a ``MasterCost``, seconds per result and per spec handed out, measured
  once on the real master code: ``MASTER_COST_US``), and then the machine's load of the moment
  does not change the answer: the same command gives the same figure.

``SimExecutor`` also measures the real master code it runs, apart from its own work (the
simulated workers' records, the event heap): the CPU seconds between its calls, split
into the code from a ``wait`` to the next ``free`` (results: records, source, journal,
budget, progress) and from a ``free`` to the next ``wait`` (the next specs: source, stamp,
budget cap). ``calibrate`` turns that into a ``MasterCost``.

Not simulated: start-up (the utilisation it reports is after start-up, as the journal's),
the cost of moving a PBT member's state, failures of ranks, the file system's fsync
latency beyond this machine's.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ensemble.config import RunConfig
from ensemble.results.rundir import RunDirectory
from ensemble.results.timeline import run_stats
from ensemble.runtime.budget import RunBudget
from ensemble.runtime.executor import TAIL_CHECK_SECONDS, Decide, Slots, check_decision, result_seconds
from ensemble.train.member import guarded


@dataclass(frozen=True)
class MasterCost:
    """The master's own seconds per result taken in (record, source, journal, budget,
    progress) and per spec handed out (source, stamp, cap), beyond the message costs."""

    result: float
    dispatch: float

    def per_member(self) -> float:
        return self.result + self.dispatch


#: the cost model of the reproducible mode, per mode: microseconds of the real master code
#: per result and per spec handed out, measured on the 2-core development machine
#: (``python scripts/bench_scale.py calibrate``: CPU time, the least of 3; recorded 2026-11-24, docs/scale.md)
MASTER_COST_US: dict[str, tuple[float, float]] = {"ensemble": (232.0, 58.0), "evolve": (376.0, 802.0)}


def cost_source(mode: str) -> str:
    """Which mode's measured master cost ``master_cost(mode)`` uses, in words."""
    return (f"the {mode} mode's measured model" if mode in MASTER_COST_US else
            f"the ensemble mode's measured model (the {mode} mode's master was not measured)")


def master_cost(mode: str) -> MasterCost:
    """The recorded cost model of ``mode``'s master (ensemble's for a mode not measured)."""
    result_us, dispatch_us = MASTER_COST_US.get(mode, MASTER_COST_US["ensemble"])
    return MasterCost(result_us * 1e-6, dispatch_us * 1e-6)


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
    """The Executor seam over ``workers`` simulated workers (see the module docstring).

    Every worker runs the specs it holds one after another; ``events`` is the heap of what
    happens next: a spec arriving at its worker, a report or a result arriving at the
    master, a decision arriving at a worker."""

    def __init__(self, workers: int, duration: Callable[[dict], float], record: Callable[[dict, float, int, str], dict],
                 clock: VirtualClock, *, in_hand: int | None = None, latency: float = 0.0,
                 message_seconds: float = 0.0, group_size: int = 1, batch: int = 256,
                 curve: Callable[[dict, int, int], dict] | None = None, cost: MasterCost | None = None,
                 helpers: int = 0):
        from ensemble.runtime.tail import TailPlan
        self.workers, self.duration, self.record, self.clock = workers, duration, record, clock
        self.plan = TailPlan(helpers)                  # the end of the run, as ``MpiExecutor`` plans it
        self._dry = False
        self._idle_check = 0.0
        self.cost = cost if cost is not None else MasterCost(0.0, 0.0)
        # the real master code's seconds and calls, after a wait (results) and after a submit (specs)
        self.code = {"result": 0.0, "results": 0, "dispatch": 0.0, "dispatches": 0}
        self._after = "result"
        self._left: float | None = None                 # nothing is counted before the first call
        self.latency, self.message_seconds, self.group_size, self.batch = latency, message_seconds, group_size, batch
        self.curve = curve if curve is not None else (lambda spec, epoch, epochs: {})
        self.slots = Slots(workers, in_hand)
        self.queues: list[deque] = [deque() for _ in range(workers)]
        self.running: list[dict | None] = [None] * workers
        self.events: list[tuple] = []
        self.seq = 0
        self.idle_seconds: float | None = 0.0
        self.report_bytes = 0
        self.messages = 0
        self.held: dict[str, int] = {}                 # spec id -> its worker, while the master holds its report
        self._decide: Decide | None = None

    def _push(self, t: float, kind: str, worker: int, item: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, worker, item))

    def free(self) -> int:
        self._enter()                          # the loop asks before each spec: what ran since was results
        self._leave("dispatch")
        return len(self.slots.ready)

    def busy(self) -> int:
        return self.slots.busy

    def _enter(self) -> None:
        """The master's code ran from the last call until now: count it where it belongs."""
        if self._left is not None:
            self.code[self._after] += time.thread_time() - self._left

    def _leave(self, after: str) -> None:
        self._after, self._left = after, time.thread_time()

    def submit(self, spec: dict) -> None:
        self._enter()
        self.code["dispatches"] += 1
        sent = self.clock() + self.message_seconds + self.cost.dispatch
        self.clock.set(sent)
        worker = self.slots.take(spec)
        if len(self.slots.held[worker]) == 1:           # it starts on arrival: the master's view
            self.plan.started(worker, spec["id"], sent)
        self._push(sent + self.latency, "arrive", worker, spec)
        self.messages += 1
        self._leave("dispatch")

    # -- a worker's side ---------------------------------------------------------------------
    def _start_next(self, worker: int, t: float) -> None:
        if self.running[worker] is not None or not self.queues[worker]:
            return
        spec = self.queues[worker].popleft()
        epochs = max(1, int(spec.get("epochs", 1)))
        every = int(spec.get("report_every") or 0)
        state = {"spec": spec, "start": t, "seconds": self.duration(spec), "epochs": epochs, "every": every,
                 "epoch": 0, "done": 0.0, "at": t, "crew": 1, "version": 0, "joined": []}
        self.running[worker] = state
        self._advance(worker, t)

    def _advance(self, worker: int, t: float) -> None:
        """The member trains on from ``t``: to its next report, or to its end. As a real member
        does, it reports after its last epoch too when that is a reporting epoch (a population's
        last round is decided on that report)."""
        state = self.running[worker]
        per_epoch = state["seconds"] / state["epochs"]
        nxt = state["epoch"] + state["every"]
        if not state["every"] or nxt > state["epochs"]:
            left = state["seconds"] - state["done"] if not state["every"] else \
                (state["epochs"] - state["epoch"]) * per_epoch
            self._push(t + left / self._speed(state), "end", worker, (state, state["version"]))
            return
        when = t + (nxt - state["epoch"]) * per_epoch
        state["epoch"] = nxt
        self._push(when + self.latency, "report", worker, nxt)

    @staticmethod
    def _speed(state: dict) -> float:
        from ensemble.runtime.tail import EFFICIENCY, speedup
        return speedup(state["crew"], EFFICIENCY)

    def _arrived(self, worker: int, t: float, spec_id: str) -> None:
        """A helper for ``spec_id`` reaches its worker: it joins at the member's next epoch end
        (none before the member ends: it goes back, freed with the result). Members that
        report to the master are not helped here."""
        state = self.running[worker]
        if state is None or state["spec"]["id"] != spec_id or state["every"]:
            return
        per = state["seconds"] / state["epochs"]
        progress = state["done"] + (t - state["at"]) * self._speed(state)
        boundary = (math.floor(progress / per + 1e-9) + 1) * per
        if boundary >= state["seconds"] - 1e-9:
            return
        self._push(state["at"] + (boundary - state["done"]) / self._speed(state), "join", worker,
                   (state, state["version"]))

    def _join(self, worker: int, t: float, state: dict) -> None:
        state["done"] += (t - state["at"]) * self._speed(state)
        state["at"], state["crew"], state["version"] = t, state["crew"] + 1, state["version"] + 1
        state["joined"].append(t)
        self._advance(worker, t)

    def _end(self, worker: int, t: float, epochs: int, stopped: str) -> None:
        state = self.running[worker]
        spec = state["spec"]
        result = self.record(spec, t - state["start"], epochs, stopped)
        result.update(started=round(state["start"], 4), ended=round(t, 4), worker=worker,
                      rank=1 + worker * self.group_size, host=f"sim{worker}")
        if state["crew"] > 1:
            from ensemble.results.records import helped_fields
            result.update(helped_fields(state["crew"] - 1, sum(t - j for j in state["joined"])))
        self.running[worker] = None
        self._push(t + self.latency, "result", worker, result)
        self._start_next(worker, t)

    def tail(self, dry: bool) -> None:
        """As ``MpiExecutor.tail``: from the first ``dry``, idle workers help stragglers; a
        helper joins its member at the member's next epoch end, and a crew of g ranks trains
        at ``tail.speedup(g, tail.EFFICIENCY)`` times one rank (the rehearsal's model; the
        Keras guards, which turn helpers away or part a crew that does not pay, are not
        modelled)."""
        if not dry or self._dry or not self.plan.max_helpers:
            return
        self._dry = True
        for w in range(self.workers):
            self._help(w, self.clock())

    def _help(self, w: int, t: float) -> None:
        if self.slots.held[w] or self.plan.busy(w):
            return
        got = self.plan.assign(w, t, self.slots.mean_seconds)
        if got is not None:
            leader, spec_id = got
            self.messages += 2
            self._push(t + self.message_seconds + self.latency, "help", leader, spec_id)

    def _help_idle(self, t: float) -> None:
        for _helper, leader, spec_id in self.plan.assign_idle(t, self.slots.mean_seconds):
            self.messages += 2
            self._push(t + self.message_seconds + self.latency, "help", leader, spec_id)

    def answer(self, spec_id: str, decision: dict) -> None:
        """A decision for a held report reaches its worker ``latency`` from now."""
        worker = self.held.pop(spec_id)
        self.messages += 1
        self._push(self.clock() + self.message_seconds + self.latency, "decision", worker, check_decision(decision))

    # -- the master's side -------------------------------------------------------------------
    def _handle(self, t: float, kind: str, worker: int, item: Any, results: list[dict]) -> None:
        if kind == "arrive":
            self.queues[worker].append(item)
            self._start_next(worker, t)
        elif kind == "end":
            state, version = item
            if self.running[worker] is state and state["version"] == version:
                self._end(worker, t, state["epochs"], "epochs")
        elif kind == "help":                           # at the member's worker
            self._arrived(worker, t, item)
        elif kind == "join":
            state, version = item
            if self.running[worker] is state and state["version"] == version:
                self._join(worker, t, state)
        elif kind == "report":                         # at the master (``t``: its arrival)
            state = self.running[worker]
            spec = state["spec"]
            payload = {"epoch": item, "round": item // max(1, state["every"]), "rank": 1 + worker * self.group_size,
                       **self.curve(spec, item, state["epochs"])}
            self.messages += 1
            self.report_bytes += 200
            decision = self._decide(spec, payload)
            if decision is None:
                self.held[spec["id"]] = worker
            else:
                self._push(t + self.message_seconds + self.latency, "decision", worker, check_decision(decision))
        elif kind == "decision":                       # at the worker
            state = self.running[worker]
            if item["action"] == "stop":
                self._end(worker, t, state["epoch"], "master")
            else:
                self._advance(worker, t)
        elif kind == "result":
            self.slots.done(worker, result_seconds(item))
            results.append(item)
            freed = self.plan.ended(worker)
            if self.slots.held[worker]:
                self.plan.started(worker, self.slots.held[worker][0]["id"], t)
            if self._dry:
                for w in (worker, *freed):
                    self._help(w, t)
                self._help_idle(t)

    def wait(self, decide: Decide, idle: Callable[[], None] | None = None) -> list[dict]:
        self._enter()
        self._decide = decide
        results: list[dict] = []
        while self.events and len(results) < self.batch:
            t = self.events[0][0]
            now = self.clock()
            if t > now:
                if results:                             # everything already in goes back now
                    break
                if self.plan.idle and self._dry:        # as the MPI master: a look for stragglers
                    check = max(now, self._idle_check)  # every TAIL_CHECK_SECONDS while it waits
                    if check < t:
                        self.idle_seconds += check - now
                        self.clock.set(check)
                        self._idle_check = check + TAIL_CHECK_SECONDS
                        self._help_idle(check)
                        continue
                self.idle_seconds += t - now            # nothing in yet: the master waits
                if idle is not None:                    # group commit ticks at least once a wait
                    self.clock.set(min(t, now + 1.0))
                    idle()
                self.clock.set(max(t, self.clock()))
            _, _, kind, worker, item = heapq.heappop(self.events)
            self._handle(max(t, 0.0), kind, worker, item, results)
            if not self.events and not results and self.held:
                raise RuntimeError(f"simulation: {len(self.held)} member(s) wait for an answer that never comes")
        self.messages += len(results)
        self.clock.set(self.clock() + (self.message_seconds + self.cost.result) * len(results))
        self.code["results"] += len(results)
        self._leave("result")
        return results

    def calibrate(self) -> MasterCost:
        """The real master code's mean seconds per result and per spec handed out, as run."""
        code = self.code
        return MasterCost(code["result"] / max(1, code["results"]), code["dispatch"] / max(1, code["dispatches"]))

    def shutdown(self) -> None:
        self.events.clear()


def learning_curve(metric: str, accuracy: float) -> Callable[[dict, int, int], dict]:
    """A made-up report payload for a simulated member at ``epoch`` of ``epochs``: its
    validation value climbs towards a quality drawn from its seed (as its record's)."""
    from ensemble.task.metrics import higher_is_better
    up = higher_is_better(metric)

    def curve(spec: dict, epoch: int, epochs: int) -> dict:
        rng = np.random.default_rng([spec["seed"], 29])
        quality = float(np.clip(accuracy + rng.normal(0.0, 0.05), 0.0, 1.0))
        value = quality * (1.0 - 0.5 * math.exp(-3.0 * epoch / epochs))
        shown = value if up else 1.0 - value
        return {"ok": True, "val": {metric: shown},
                "logs": {"loss": 1.0 - value, "val_loss": 1.0 - value, f"val_{metric}": shown}}
    return curve


def simulate(cfg: RunConfig, meta: dict, data, run_dir: RunDirectory, workers: int, *, latency: float = 0.0,
             message_seconds: float = 0.0, replay: str | Path | None = None, speed: float = 1.0,
             report: bool = False, cost: MasterCost | None = None) -> dict:
    """Run ``cfg`` through the real master session on ``workers`` simulated workers; returns
    ``run_stats`` of the journal it wrote, with the master's account and timings. ``report``:
    also write report.html (``python -m ensemble.simulate`` does; about a second of plotting).
    ``cost``: the master's cost model (the reproducible mode: ``speed`` is then 0, the
    machine's time does not move the virtual clock); None: its real time, times ``speed``.
    The stats carry what the real master code took per result and per spec
    (``master_code_us_per_result``, ``master_code_us_per_dispatch``), whichever mode."""
    if cost is not None:
        speed = 0.0
    from ensemble.modes import mode_of
    from ensemble.orchestrate.session import MasterSession, in_hand
    from ensemble.task import get_task
    from ensemble.train.rehearsal import RehearsalTrainer, member_seconds, replay_durations

    rt = cfg.runtime
    settings = cfg.rehearsal.replace(predictions=False)          # no member files
    sim_cfg = cfg.replace(rehearsal=settings)
    trainer = RehearsalTrainer(sim_cfg, meta, data)
    durations = replay_durations(replay) if replay else None
    clock = VirtualClock(0.0, speed)
    metric = get_task(meta["task"]).default_metric(cfg.ensemble.metric)
    executor = SimExecutor(workers, lambda spec: member_seconds(spec, settings, durations),
                           lambda spec, seconds, epochs, stopped: guarded(
                               lambda: trainer.record(spec, seconds, epochs, stopped), spec, 0, watched=False),
                           clock, in_hand=in_hand(cfg, mode_of(cfg)), latency=latency,
                           message_seconds=message_seconds, group_size=rt.group_size,
                           curve=learning_curve(metric, settings.accuracy), cost=cost,
                           helpers=mode_of(cfg).tail_helpers(cfg, workers))
    budget = RunBudget(rt.time_limit, rt.finish_reserve, rt.max_failed_share, clock=clock,
                       stop_quantile=rt.stop_quantile)
    real0 = time.perf_counter()
    session = MasterSession(sim_cfg, meta, data, run_dir, executor, budget, clock=clock, heartbeat=False,
                            predictions=False, report=report, job_started=0.0,
                            open_fields={"ranks": 1 + workers * rt.group_size, "host": "simulated"})
    clock.set(0.0)
    session.run()
    wall = session.account["master_wall_seconds"]
    stats = run_stats(session.records, session.events)
    stats.update(simulated_seconds=round(clock(), 3), real_seconds=round(time.perf_counter() - real0, 3),
                 journal_bytes=session.journal_bytes, messages=executor.messages, latency=latency,
                 message_seconds=message_seconds, expected_members=mode_of(cfg).expected_members(cfg, workers),
                 master_loop_seconds=wall)
    code = executor.calibrate()
    stats.update(master_code_us_per_result=round(1e6 * code.result, 2),
                 master_code_us_per_dispatch=round(1e6 * code.dispatch, 2),
                 cost_model=None if cost is None else {"result_us": round(1e6 * cost.result, 3),
                                                       "dispatch_us": round(1e6 * cost.dispatch, 3)})
    return stats
