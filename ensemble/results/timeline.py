"""How busy a run kept its workers, computed from the journal alone.

Each member record carries ``dispatched`` and ``received`` (master clock), ``started``
and ``ended`` (the worker's clock), ``worker`` (group index), ``rank`` and ``host``; the
journal's ``open`` and ``close`` event lines give the number of workers and the master's
own time. A resumed run has one segment per job, each from its ``open`` event to the next.
Records are ``MemberRecord``s and events ``Event``s (plain journal lines are read as them).

Per segment: startup is the time from the job's start to the first member's start;
the time available is workers x (last result - first start); utilisation is the time
members trained (ended - started, failed ones included, plus the seconds helper ranks
spent in a member's crew at the end of the run, ``runtime.tail``) over the time available,
so a worker that waits for work, starts late, or idles at the end counts against it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ensemble.results.events import Event, EventKind
from ensemble.results.records import REUSED_TRACE, MemberRecord, as_records


def as_events(events: Iterable[Event | Mapping[str, Any]]) -> list[Event]:
    """``events`` typed (a plain line is read with ``Event.from_json``; unknown kinds left out)."""
    out = []
    for e in events:
        event = e if isinstance(e, Event) else Event.from_json(e)
        if event is not None:
            out.append(event)
    return out


def _timed(r: MemberRecord) -> bool:
    return r.started is not None and r.ended is not None and r.received is not None


def _segments(records: list[MemberRecord], events: list[Event]) \
        -> list[tuple[Event, Event | None, list[MemberRecord]]]:
    opens = sorted((e for e in events if e.kind is EventKind.OPEN), key=lambda e: e.data["time"])
    closes = sorted((e for e in events if e.kind is EventKind.CLOSE), key=lambda e: e.data["time"])
    timed = sorted((r for r in records if _timed(r)), key=lambda r: r.received)
    out, i = [], 0
    for n, seg in enumerate(opens):
        until = opens[n + 1].data["time"] if n + 1 < len(opens) else math.inf
        mine = []
        while i < len(timed) and timed[i].received < until:
            if timed[i].received >= seg.data["time"]:
                mine.append(timed[i])
            i += 1
        close = next((c for c in closes if seg.data["time"] <= c.data["time"] < until), None)
        out.append((seg, close, mine))
    return out


def jobs_seconds(records: Iterable[MemberRecord | Mapping[str, Any]], events: Iterable[Event | Mapping[str, Any]],
                 now: float) -> tuple[float, int] | None:
    """How long the run's jobs ran, added up (the time between a stopped job and its
    ``--resume`` is no run time), and how many jobs: each from its start (``job_started``, else
    its ``open``) to its ``close``, else to its last result, else to its ``open`` (a job lost
    before any); the last job without a close up to ``now`` (it runs). None without jobs."""
    segments = _segments(as_records(records), as_events(events))
    if not segments:
        return None
    total = 0.0
    for n, (seg, close, mine) in enumerate(segments):
        start = float(seg.data.get("job_started", seg.data["time"]))
        end = (close.data["time"] if close is not None else now if n == len(segments) - 1
               else max((r.received for r in mine), default=seg.data["time"]))
        total += max(0.0, float(end) - start)
    return total, len(segments)


#: start-up, from a process's creation to its first member's start: (phase, from stamp, to stamp)
PHASES = (("python", "process", "main"), ("mpi_and_config", "main", "mpi_and_config"),
          ("data", "mpi_and_config", "data"), ("tensorflow", "data", "trainer"))


def startup_phases(records: Iterable[MemberRecord | Mapping[str, Any]]) -> dict:
    """Where a job's start-up went, from the stamps each worker's first result carries:
    python (interpreter and imports before ``main``), mpi_and_config, data (rank 0 reads,
    every rank receives its node's copy), tensorflow (the trainer's set-up: what is left of
    importing TensorFlow, which workers start while rank 0 prepares, and configuring it),
    first_build (model build of the first member), and total (process creation to the first
    member's start). Each as the slowest worker's and the mean over workers, in seconds;
    ``{}`` without stamps (rehearsal runs have no TensorFlow)."""
    firsts = [r for r in as_records(records) if isinstance(r.extra.get("startup"), Mapping) and r.started is not None]
    per_phase: dict[str, list[float]] = {}
    for r in firsts:
        st = r.extra["startup"]
        build = r.extra.get("build_seconds")
        for name, a, b in PHASES:
            if st.get(a) is not None and st.get(b) is not None:
                per_phase.setdefault(name, []).append(max(0.0, st[b] - st[a]))
        if build is not None:
            per_phase.setdefault("first_build", []).append(build)
        begin = st.get("process") if st.get("process") is not None else st.get("main")
        if begin is not None:
            per_phase.setdefault("total", []).append(max(0.0, r.started + (build or 0.0) - begin))
    return {name: {"slowest": round(max(v), 3), "mean": round(sum(v) / len(v), 3)}
            for name, v in per_phase.items()}


def run_stats(records: Iterable[MemberRecord | Mapping[str, Any]], events: Iterable[Event | Mapping[str, Any]]) -> dict:
    """The run's utilisation, startup, members/s and master load (see the module docstring).
    ``members`` counts the timed trainings (a member trained again on resume twice) and
    ``failed`` those that ended without a result (not ``Status.evaluated``); the run's
    counts of members are ``records.Counts``."""
    records, events = as_records(records), as_events(events)
    n = failed = 0
    training = available = working = startup = 0.0
    master_busy = master_cpu = master_wall = 0.0
    sub_busy: list[float] = []                    # each sub-master's busy share (its own share's dispatch)
    workers, syncs, segments, group = 0, 0, 0, 1
    for seg, close, mine in _segments(records, events):
        if not mine:
            continue
        segments += 1
        workers, group = seg.data["workers"], int(seg.data.get("group_size") or 1)
        first = min(r.started for r in mine)
        last = max(r.received for r in mine)
        span = max(last - first, 1e-9)
        spans: dict[tuple, float] = {}         # packed members (runtime.members_per_rank) share one span of
        for r in mine:                           # their worker's time: counted once (it said 358% busy)
            spans.setdefault((r.rank, r.extra.get("worker"), r.started, r.ended),
                             r.ended - r.started + r.helper_seconds)
        training += sum(spans.values())
        available += workers * span
        working += span
        startup += max(0.0, first - seg.data.get("job_started", seg.data["time"]))
        n += len(mine)
        failed += sum(not r.status.evaluated for r in mine)
        shut = close.data if close is not None else {}
        if shut.get("master_wall_seconds"):
            master_busy += shut["master_busy_seconds"]
            master_cpu += shut["master_cpu_seconds"]
            master_wall += shut["master_wall_seconds"]
            syncs += shut.get("journal_syncs", 0)
        sub_busy += [s["master_busy_seconds"] / s["master_wall_seconds"] for s in shut.get("shares", ())
                     if s.get("master_wall_seconds") and s.get("master_busy_seconds") is not None]
    if not n:
        return {}
    out = {"members": n, "failed": failed, "workers": workers, "group_size": group, "segments": segments,
           "utilisation": round(training / available, 4) if available else None,
           "startup_seconds": round(startup, 3), "training_seconds": round(training, 3),
           "dispatch_seconds": round(working, 3),
           "members_per_second": round(n / working, 2) if working else None}
    phases = startup_phases(records)
    if phases:
        out["startup_phases"] = phases
    costs = member_costs(records)
    if costs:
        out["member_costs"] = costs
    if master_wall:
        out.update(master_busy_share=round(master_busy / master_wall, 4),
                   master_cpu_share=round(master_cpu / master_wall, 4),
                   master_cpu_us_per_result=round(1e6 * master_cpu / n, 1), journal_syncs=syncs)
    if sub_busy:                                  # a hierarchy whose sub-masters ran their own shares
        out["sub_master_busy_share"] = round(max(sub_busy), 4)
    return out


#: a member's phases (``costs`` in its record), in the order they happen; "validation" is
#: inside "first_epoch" and "epochs" and is shown apart
COST_PHASES = ("build", "first_epoch", "epochs", "predict", "write", "other")


def member_costs(records: Iterable[MemberRecord | Mapping[str, Any]]) -> dict:
    """Where finished members' time went: per phase the mean seconds per member, its share of
    their training time and the total (members whose records carry ``costs``; older
    journals and the rehearsal trainer have none)."""
    ok = [r for r in as_records(records) if r.ok and r.costs]
    timed = [r.costs for r in ok]
    if not timed:
        return {}
    total = sum(sum(c.get(p, 0.0) for p in COST_PHASES) for c in timed) or 1e-9
    out = {"members": len(timed), REUSED_TRACE: sum(r.reused_trace for r in ok)}
    for phase in (*COST_PHASES, "validation"):
        seconds = sum(c.get(phase, 0.0) for c in timed)
        out[phase] = {"mean": round(seconds / len(timed), 4), "share": round(seconds / total, 4),
                      "total": round(seconds, 3)}
    return out


def format_stats(stats: dict) -> str:
    """The console line for ``run_stats`` (and one for the start-up phases when there are any)."""
    if not stats:
        return "run: no timed members"
    w, g = stats["workers"], stats.get("group_size", 1)
    on = f"{w} member group{'s' if w != 1 else ''} of {g} ranks" if g > 1 else f"{w} worker{'s' if w != 1 else ''}"
    text = (f"run: {stats['members']} members on {on}, utilisation "
            f"{100 * stats['utilisation']:.1f}%, startup {stats['startup_seconds']:.1f} s, "
            f"{stats['members_per_second']:.2f} members/s")
    if "master_busy_share" in stats:
        text += (f", master busy {100 * stats['master_busy_share']:.1f}% "
                 f"(CPU {100 * stats['master_cpu_share']:.1f}%, {stats['master_cpu_us_per_result']:.0f} us/result)")
    if "sub_master_busy_share" in stats:
        text += f", busiest sub-master {100 * stats['sub_master_busy_share']:.1f}% busy"
    phases = stats.get("startup_phases")
    if phases:
        text += "\nstart-up, slowest worker: " + ", ".join(
            f"{name.replace('_', ' ')} {phases[name]['slowest']:.1f} s" for name in
            ("python", "mpi_and_config", "data", "tensorflow", "first_build") if name in phases)
        if "total" in phases:
            text += f"; launch to first member training {phases['total']['slowest']:.1f} s"
    costs = stats.get("member_costs")
    if costs and any(costs[name]["total"] > 0 for name in ("build", "first_epoch", "epochs")):   # not PBT's
        # members, whose training is in their rounds: their records hold only the last predict and write
        text += "\nmember time, mean of " + str(costs["members"]) + ": " + ", ".join(
            f"{name.replace('_', ' ')} {costs[name]['mean']:.2f} s ({100 * costs[name]['share']:.0f}%)"
            for name in COST_PHASES if costs[name]["total"] > 0)
        if costs["validation"]["total"] > 0:
            text += f"; validation inside the epochs {costs['validation']['mean']:.2f} s"
        if costs.get(REUSED_TRACE):
            text += f"; {costs[REUSED_TRACE]} trained on a kept model (no tracing)"
    return text
