"""The fast engine of ``python -m ensemble.simulate --engine fast``: the dispatch loop as a
model, for the scenario table (up to 127,488 workers x 100 members, 12.7 million members).

``orchestrate.simulate`` runs the real master code and costs about 0.3-0.5 ms of this
machine per member: a Summit-sized run (2.8 million members) takes most of an hour and
keeps every record in memory (8 GB). This engine keeps what decides utilisation and
nothing else, at about 1-2 us per member:

- the master is one server: each result costs it ``cost.result`` plus a receive
  (``message_seconds``), each spec handed out ``cost.dispatch`` plus a send, taken in
  arrival order (a result that arrives while it is busy waits); the cost model is the real
  master's, measured (``simulate.MASTER_COST_US``);
- each worker holds up to ``in_hand`` specs as ``runtime.Slots`` deals them (auto: the
  same rule), starts the next the moment one ends, and a spec reaches it ``latency``
  after it is sent, a result the master ``latency`` after it ends;
- the specs go out in list order or, ``order = "cost"``, longest predicted first
  (``sources.members.CostOrdered``, given each architecture's cost: its measured
  mean, so within one architecture the list order stays);
- a time limit stops the hand-out when the budget's rule says so (``RunBudget``: the
  slowest member seen, or ``stop_quantile`` of those seen); a member still training at
  the deadline is cut there and its time counts as lost;
- ``tail = "helpers"`` (``runtime.tail_helpers``, the runtime's rule): once the list is dry,
  an idle worker joins the running member that has trained longest, once it has trained
  ``STRAGGLER`` x the members' running mean (the master knows elapsed times, not
  durations), as a data-parallel helper, up to ``max_group`` ranks; a worker no member
  can take yet waits and is tried again at each later event. A group of g ranks trains at
  ``g * efficiency ** log2(g)`` times one rank's speed after ``join_seconds`` of moving
  the member's state (the runtime measures instead: a crew that does not pay parts, which
  is not modelled).

Utilisation is ``run_stats``'s: member-seconds of useful training (as one rank would
train them) over workers x (last result taken - first start). The engine is checked
against the session engine in ``tests/ensemble/test_simulate_fast.py``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from ensemble.orchestrate.simulate import MasterCost
from ensemble.runtime.budget import DurationQuantile
from ensemble.runtime.executor import COVER_SECONDS, MAX_IN_HAND, SHORT_MEMBER
from ensemble.runtime.tail import AUTO_HELPERS, EFFICIENCY, STRAGGLER, speedup

TAILS = ("none", "helpers")


@dataclass(frozen=True)
class Scenario:
    """One row of the table: the allocation, the members' durations and the master."""

    workers: int
    cost: MasterCost
    message_seconds: float = 10e-6
    latency: float = 0.0005
    in_hand: int | None = None               # None: the auto rule of ``Slots``
    tail: str = "none"
    max_group: int = AUTO_HELPERS + 1
    efficiency: float = EFFICIENCY           # a helper group's parallel efficiency per doubling
    join_seconds: float = 5.0
    time_limit: float | None = None          # the deadline, seconds after the start
    stop_quantile: float | None = None       # None: the slowest member seen (``RunBudget``)


def auto_in_hand(mean_seconds: float) -> int:
    """``Slots``' auto target for members of ``mean_seconds`` (one for long members)."""
    if mean_seconds > SHORT_MEMBER:
        return 1
    return min(MAX_IN_HAND, 2 + int(COVER_SECONDS / max(mean_seconds, 1e-6)))


def lognormal_durations(members: int, seconds: float, spread: float, seed: int = 0,
                        arch_costs: tuple[float, ...] = (1.0,)) -> tuple[np.ndarray, np.ndarray]:
    """(durations, architecture index) of ``members`` spread round-robin over architectures
    whose median seconds are ``seconds`` times ``arch_costs``, log-normal with sigma ``spread``."""
    rng = np.random.default_rng([seed, 35])
    arch = np.arange(members) % len(arch_costs)
    factor = np.asarray(arch_costs, dtype=float)[arch]
    return seconds * factor * np.exp(spread * rng.standard_normal(members)), arch


def run(s: Scenario, durations: np.ndarray) -> dict:
    """Simulate handing out ``durations`` (seconds, in hand-out order) to ``s.workers``."""
    n, workers = len(durations), s.workers
    c_res = s.cost.result + s.message_seconds
    c_disp = s.cost.dispatch + s.message_seconds
    lat = s.latency
    k = s.in_hand or auto_in_hand(float(np.mean(durations)) if n else 1.0)
    if k == 1 and s.tail == "none" and s.time_limit is None:
        return _run_one_in_hand(workers, durations, c_res, c_disp, lat)
    dur = durations.tolist()
    deadline = s.time_limit
    est = DurationQuantile(s.stop_quantile)
    held: list[deque] = [deque() for _ in range(workers)]
    m = 0.0                                        # when the master is next free
    nxt = 0
    stopped = False

    def hand_out(w: int) -> None:
        nonlocal m, nxt, stopped
        if nxt >= n or stopped:
            return
        if deadline is not None and m + est.value() > deadline:
            stopped = True
            return
        m += c_disp
        held[w].append((m + lat, nxt))
        nxt += 1

    for _ in range(k):                             # the first fill: round-robin, as Slots deals
        for w in range(workers):
            hand_out(w)
    events: list[tuple[float, int, int, int]] = []  # (end, worker, member, version)
    start = [0.0] * n
    version = [0] * workers
    for w in range(workers):
        if held[w]:
            arrive, j = held[w].popleft()
            start[j] = arrive
            events.append((arrive + dur[j], w, j, 0))
    heapq.heapify(events)
    first = min((e[0] - dur[e[2]] for e in events), default=0.0)
    useful = lost = 0.0
    last = 0.0
    done = 0
    helpers = s.tail == "helpers"
    group: dict[int, list[int]] = {}               # leader -> helper workers (tail = helpers)
    work_left: dict[int, tuple[float, float, int]] = {}   # leader -> (work left, at time, group size)
    oldest: list[tuple[float, int, int]] = []      # (start, leader, member) of members that may take a helper
    pop, push = heapq.heappop, heapq.heappush

    def speed(g: int) -> float:
        return speedup(g, s.efficiency)

    mean: list[float | None] = [None]              # the master's running mean of durations (``Slots``)
    idle: list[int] = []                           # idle workers no member could take yet

    def ready(t: float) -> bool:
        """Whether the longest-running member that takes helpers is a straggler at ``t``."""
        while oldest:
            begun, leader, member = oldest[0]
            state = work_left.get(leader)
            if state is None or running[leader] != member or state[2] >= s.max_group:
                pop(oldest)
                continue
            return mean[0] is None or t - begun >= STRAGGLER * mean[0]
        return False

    def join(w: int, t: float) -> bool:
        """Idle worker ``w`` helps the longest-running member that takes helpers, if it is a
        straggler (``runtime.tail.TailPlan``: the master knows elapsed times, not durations);
        the member's end moves as its crew grows, after ``join_seconds`` of moving state."""
        nonlocal m
        if not ready(t):                            # none takes helpers, or no straggler yet: ``w`` waits
            idle.append(w)
            return False
        _, leader, member = oldest[0]
        left, at, g = work_left[leader]
        left -= (t - at) * speed(g)
        end_new = t + s.join_seconds + max(0.0, left - s.join_seconds * speed(g)) / speed(g + 1)
        m = max(m, t) + c_disp                      # the master tells the group
        group.setdefault(leader, []).append(w)
        work_left[leader] = (max(0.0, left - s.join_seconds * speed(g)), t + s.join_seconds, g + 1)
        version[leader] += 1
        push(events, (end_new, leader, member, version[leader]))
        return True

    running = [-1] * workers
    for e in events:
        running[e[1]] = e[2]
        if helpers:
            work_left[e[1]] = (dur[e[2]], start[e[2]], 1)
    dry = False                                    # the list has run dry: the helpers' heap is kept
    limited = deadline is not None
    while events:
        t, w, j, ver = pop(events)
        if ver != version[w]:
            continue
        if limited and t > deadline:               # the budget's cap: it ends at the deadline
            t = max(deadline, start[j])            # type: ignore[type-var]
            lost += t - start[j]
        else:
            useful += dur[j]
            if limited:
                est.observe(dur[j])
        done += 1
        if helpers:
            mean[0] = dur[j] if mean[0] is None else mean[0] + 0.1 * (dur[j] - mean[0])
        m = (m if m > t + lat else t + lat) + c_res
        if m > last:
            last = m
        if helpers:
            running[w] = -1
            work_left.pop(w, None)
            freed = [w] + group.pop(w, [])
        else:
            freed = (w,)
        for v in freed:
            hv = held[v]
            if nxt < n and not stopped:            # the master hands the freed place a spec
                if limited and m + est.value() > deadline:
                    stopped = True
                else:
                    m += c_disp
                    hv.append((m + lat, nxt))
                    nxt += 1
            if hv:
                arrive, j2 = hv.popleft()
                begin = t if t > arrive else arrive
                start[j2] = begin
                push(events, (begin + dur[j2], v, j2, version[v]))
                if helpers:
                    running[v] = j2
                    work_left[v] = (dur[j2], begin, 1)
                    if dry:
                        push(oldest, (begin, v, j2))
            elif helpers and (nxt >= n or stopped):
                if not dry:                        # from now on idle workers help the running members
                    dry = True
                    oldest.extend((start[running[u]], u, running[u]) for u in work_left if running[u] >= 0)
                    heapq.heapify(oldest)
                join(v, t)
        while idle and ready(t):                   # a member may have become a straggler since
            v = idle.pop()
            if running[v] < 0:
                join(v, t)
    span = max(last - first, 1e-9)
    return {"workers": workers, "members": done, "in_hand": k, "utilisation": round(useful / (workers * span), 4),
            "lost_to_deadline": round(lost / (workers * span), 4), "simulated_seconds": round(last, 3),
            "master_busy_share": round(min(1.0, done * (c_res + c_disp) / span), 4),    # span: from the first result
            "members_per_second": round(done / span, 2), "handed_out": nxt}


def _run_one_in_hand(workers: int, durations: np.ndarray, c_res: float, c_disp: float, lat: float) -> dict:
    """``run``'s common case, three times faster: one spec per worker, no tail policy, no
    deadline. A worker's next spec is sent when the master has taken its result, so the
    worker starts it a latency later (``run`` gives the same figures, tested)."""
    n = len(durations)
    dur = durations.tolist()
    m = 0.0
    events = []
    for w in range(min(workers, n)):                # the first fill
        m += c_disp
        events.append((m + lat + dur[w], w))
    first = c_disp + lat
    nxt = len(events)
    heapq.heapify(events)
    useful = 0.0
    replace, pop = heapq.heapreplace, heapq.heappop
    while events:
        t, w = events[0]
        arrive = t + lat
        m = (m if m > arrive else arrive) + c_res
        if nxt < n:
            m += c_disp
            replace(events, (m + lat + dur[nxt], w))
            nxt += 1
        else:
            pop(events)
    useful = float(np.sum(durations))
    span = max(m - first, 1e-9)
    return {"workers": workers, "members": n, "in_hand": 1, "utilisation": round(useful / (workers * span), 4),
            "lost_to_deadline": 0.0, "simulated_seconds": round(m, 3),
            "master_busy_share": round(min(1.0, n * (c_res + c_disp) / span), 4),
            "members_per_second": round(n / span, 2),
            "handed_out": n}


def sub_masters_for(workers: int, mean_seconds: float, cost: MasterCost, message_seconds: float = 10e-6,
                    busy: float = 0.5) -> int:
    """How many sub-masters keep each under ``busy``: the results per second ``workers``
    members of ``mean_seconds`` send, times one member's cost at the master (1: one master)."""
    load = workers / max(mean_seconds, 1e-9) * (cost.per_member() + 2 * message_seconds)
    return max(1, math.ceil(load / busy))


#: the fewest worker groups a sub-master serves: below it one master is never the bottleneck
#: worth a rank (and a hierarchy of a few workers each only adds a hop)
MIN_SHARE = 64


def hierarchy_shape(workers: int, mean_seconds: float | None, cost: MasterCost, message_seconds: float = 10e-6,
                    busy: float = 0.5, min_share: int = MIN_SHARE) -> int:
    """The hierarchy's shape, for the simulator's ``--sub-masters auto`` and the runtime's
    ``runtime.sub_masters = "auto"`` alike: how many sub-masters (0: one master, flat) serve
    ``workers`` groups whose members take ``mean_seconds`` (None: not measured yet, flat).
    ``sub_masters_for`` keeps each under ``busy``, at most one per ``min_share`` workers; a
    single sub-master would only add a hop, so fewer than 2 is flat."""
    if mean_seconds is None:
        return 0
    subs = min(sub_masters_for(workers, mean_seconds, cost, message_seconds, busy), workers // min_share)
    return subs if subs >= 2 else 0


def run_hierarchy(s: Scenario, durations: np.ndarray, sub_masters: int) -> dict:
    """The runtime's hierarchy in mode ensemble (``runtime.sub_masters``,
    ``orchestrate.submasters.serve_share``): ``sub_masters`` masters, each serving its own
    share of the workers with its own static share of the list (its own journal), run as
    ``run`` runs one; the top master only coordinates (its cost is left out: a tally per
    sub-master a second). Static shares: a sub-master whose share ends early does not help
    another's tail (the runtime's do not either)."""
    if sub_masters <= 1:
        return {**run(s, durations), "sub_masters": 1}
    parts = [run(Scenario(**{**s.__dict__, "workers": len(range(i, s.workers, sub_masters))}),
                  durations[i::sub_masters]) for i in range(sub_masters)]
    span = max(p["simulated_seconds"] for p in parts)          # every part starts at about the same time
    useful = sum(p["utilisation"] * p["workers"] * p["simulated_seconds"] for p in parts)
    done = sum(p["members"] for p in parts)
    return {"workers": s.workers, "members": done, "in_hand": parts[0]["in_hand"], "sub_masters": sub_masters,
            "utilisation": round(useful / (s.workers * span), 4), "lost_to_deadline": 0.0,
            "simulated_seconds": round(span, 3), "master_busy_share": max(p["master_busy_share"] for p in parts),
            "members_per_second": round(done / span, 2), "handed_out": sum(p["handed_out"] for p in parts)}
