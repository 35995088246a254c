"""``python -m ensemble.status RUN_DIR [--watch [SECONDS]] [--json]``: how far a run is.

Reads only files the master writes atomically or appends to (``status.json``, the
journal, ``ensemble.json``, ``config.toml``), takes no lock and writes nothing, so it is
safe from a login node on the shared file system while the job runs (and after). The
journal gives what became of each member (exact, across resumed jobs; counted with
``records.Counts``, as ensemble.json and the report count them); ``status.json`` what only
the master knows: members in flight, the job's deadline, whether it is alive. ETA and what
is left follow the run's real budget: its evaluations or its time, whichever ends first.
``--watch`` reads only the journal lines appended since the last refresh.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

from ensemble.config import ConfigError, RunConfig, read_saved_config
from ensemble.modes import MODES, mode_of
from ensemble.results.events import Event, EventKind
from ensemble.results.heartbeat import FINAL, duration_words, read_heartbeat, state_words, untrained_lines
from ensemble.results.lock import RunLock, pid_alive
from ensemble.results.records import Counts, MemberRecord, Status, journal_shortfall, latest
from ensemble.results.rundir import RunDirectory
from ensemble.results.timeline import jobs_seconds
from ensemble.task.metrics import metric_text

EXIT_USAGE = 2
RECENT = 50                    # members/s over the last 50 results (and over the whole job)
STALE_BEATS = 3                # a running job silent for 3 heartbeats looks dead (15 s at the default)


class JournalTail:
    """The journal's whole lines, typed and read incrementally: a refresh reads only what was
    appended since the last one, and a line still being written is left for the next; a
    master hierarchy's sub-master journals (``RunDirectory.sub_journals``) are tailed beside
    it, and read again from the start once absorbed. ``issued`` holds the ids a search
    handed out (its ``issued`` events)."""

    def __init__(self, path: Path):
        self.path = path
        self.offsets: dict[Path, int] = {}
        self.records: list[MemberRecord] = []
        self.events: list[Event] = []
        self.issued: set[str] = set()

    def _start_over(self) -> None:
        self.offsets, self.records, self.events, self.issued = {}, [], [], set()

    def read(self) -> None:
        subs = RunDirectory(self.path.parent).sub_journals()
        if any(p != self.path and p not in subs for p in self.offsets):   # absorbed into the journal
            self._start_over()
        for path in [self.path, *subs]:
            self._read(path)

    def _read(self, path: Path) -> None:
        offset = self.offsets.get(path, 0)
        try:
            with open(path, "rb") as fh:
                if fh.seek(0, 2) < offset:              # a new journal (the run started over): all of it
                    self._start_over()
                    offset = 0
                fh.seek(offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1                # a torn last line: next time
        for line in chunk[:end].splitlines():
            try:
                item = json.loads(line)
            except ValueError:                      # not JSON, or not UTF-8: skipped
                continue
            if not isinstance(item, dict):
                continue
            if "event" in item:
                event = Event.from_json(item)
                if event is not None:
                    self.events.append(event)
                    if event.kind is EventKind.ISSUED and "id" in event.data:
                        self.issued.add(str(event.data["id"]))
            elif "id" in item:
                self.records.append(MemberRecord.from_json(item))
        self.offsets[path] = offset + end


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_run_config(run_dir: Path) -> RunConfig | None:
    """The run's own config.toml, typed; None when there is none yet or it cannot be read
    (the status of a run never fails over its config)."""
    path = run_dir / RunDirectory.CONFIG
    if not path.is_file():
        return None
    try:
        return read_saved_config(path)
    except ConfigError:
        return None


def expected_members(cfg: RunConfig | None) -> int | None:
    """Members a run is meant to end with, from its config alone (the heartbeat's ``total``
    wins when there is one; ``Mode.expected_members``)."""
    return (mode_of(cfg).expected_members(cfg) or None) if cfg is not None else None


def time_budget(cfg: RunConfig | None, beat: dict, tail: JournalTail) -> tuple[float | None, str | None]:
    """(when the run stops handing out members, which limit that is), or (None, None) without a
    time limit. The job's own end is the heartbeat's ``deadline`` (``runtime.time_limit`` or the
    scheduler's end, less ``runtime.finish_reserve``; from the config and this job's start when
    there is no heartbeat); a search also ends ``evolve.time_limit`` seconds of searching after
    it began, counted over its jobs (a resumed search goes on where it stopped)."""
    opens = sorted((e for e in tail.events if e.kind is EventKind.OPEN), key=lambda e: e.data["time"])
    ends: list[tuple[float, str]] = []
    if beat.get("deadline") is not None:
        ends.append((float(beat["deadline"]), "the job's time limit"))
    elif "deadline" not in beat and cfg is not None and cfg.runtime.time_limit and opens:
        ends.append((opens[-1].data["time"] + cfg.runtime.time_limit - cfg.runtime.finish_reserve,
                     "`runtime.time_limit`"))
    own = mode_of(cfg).search_time_limit(cfg) if cfg is not None else None
    if own is not None and opens:
        closes = [e.data["time"] for e in tail.events if e.kind is EventKind.CLOSE]
        received = [r.received for r in tail.records if r.received is not None]
        searched = 0.0
        for n, seg in enumerate(opens[:-1]):         # the earlier jobs' search time
            start, until = seg.data["time"], opens[n + 1].data["time"]
            last = max([t for t in closes + received if start <= t < until], default=start)
            searched += last - start
        ends.append((opens[-1].data["time"] + own[0] - searched, own[1]))
    if not ends:
        return None, None
    return min(ends)


def _gone_here(owner: dict) -> bool:
    """Whether the process a status.json or a run.lock names ran on this host and is gone."""
    return owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int) \
        and not pid_alive(owner["pid"])


def run_status(run_dir: Path, tail: JournalTail, now: float | None = None) -> dict:
    """The run's status as one dict (what ``--json`` prints); ``tail`` is read first.

    ``counts`` are ``Counts.as_dict()`` of the journal, the same keys and numbers as
    ``ensemble.json``'s ``counts`` (``finished``, ``failed``, ``discarded``, ``limit``,
    ``stopped`` and ``done`` repeat them). ``total`` is what the run expects (heartbeat, else
    config); ``ends_by`` says which budget ends the run first, ``evaluations`` or ``time``
    (None while that cannot be told): when it is time, ``eta_seconds`` is the time left,
    ``queued`` is None and ``expected_more`` estimates the members that still end by then;
    ``queued_up_to`` is the most that could still start."""
    from ensemble.config.vocabulary import PROPER_SCORES
    from ensemble.results.selection import rank_members
    from ensemble.task.metrics import metric_task
    now = time.time() if now is None else now
    tail.read()
    beat = read_heartbeat(run_dir) or {}
    torn = not beat and (run_dir / RunDirectory.STATUS).is_file()     # there, but cut short (a kill mid-write)
    summary = _read_json(run_dir / RunDirectory.ENSEMBLE)
    cfg = read_run_config(run_dir)
    # a finished run's ensemble.json says what it ranks on (`ensemble reselect --metric` changes it)
    metric = ((summary or {}).get("metric") if beat.get("state") not in ("running", "finishing") else None) \
        or beat.get("metric") or (summary or {}).get("metric")
    total = beat.get("total") if beat.get("total") is not None else expected_members(cfg)
    state = beat.get("state")
    if state is None:
        state = "done" if summary else ("unknown" if tail.records else "starting")
    if state == "starting":                  # no heartbeat yet: is the job that locked the run still there?
        holder = RunLock(run_dir).holder() or {}
        if _gone_here(holder):
            state, beat = "dead", {**beat, "pid": holder["pid"]}     # killed in its start-up, before a beat
    beat_age = None if "time" not in beat else now - beat["time"]
    if state in ("running", "finishing") and _gone_here(beat):
        state = "dead"                     # killed on this host: no need to wait for missed beats
    elif state in ("running", "finishing") and beat_age is not None and \
            beat_age > STALE_BEATS * beat.get("every", 10.0):
        state = "silent"
    ended_by_id = Counts.of_records(tail.records).ended
    running = beat.get("running")
    if state in FINAL or state == "dead":                   # the job is over: nothing runs
        running = 0 if running is not None else None
    elif running is not None and total is not None:        # the journal may be a beat ahead of status.json
        running = min(running, max(0, total - ended_by_id))
    issued = len(tail.issued) if tail.issued else ended_by_id + (running or 0)
    counts = Counts.of_records(tail.records, issued=issued)
    short = journal_shortfall(summary, tail.records)
    done = counts.ended
    out: dict = {"run_dir": str(run_dir), "metric": metric, "total": total, "counts": counts.as_dict(),
                 "done": done, "finished": counts.ok, **{k.value: counts.of(k) for k in Status if not k.ranked},
                 "issued": counts.issued, "running": running, "queued": None, "queued_up_to": None,
                 "left": None if total is None else max(0, total - done), "workers": beat.get("workers"),
                 **({"warning": short} if short else {})}
    opens = [e for e in tail.events if e.kind is EventKind.OPEN]
    started = opens[0].data.get("job_started", opens[0].time) if opens else beat.get("job_started")
    out["age_seconds"] = None if started is None else round(now - started, 1)
    out["heartbeat_age_seconds"] = None if beat_age is None else round(beat_age, 1)
    out["pid"] = beat.get("pid")
    out["state"] = state
    if torn:
        out["status_unreadable"] = True
    out["ended_seconds_ago"] = None
    closes = [e.time for e in tail.events if e.kind is EventKind.CLOSE]
    ended = beat.get("time") if state in FINAL else (closes[-1] if closes and state in ("done", "unknown") else None)
    if ended is not None:                                   # an old run's age is how long it took, not how old
        out["age_seconds"] = None if started is None else round(ended - started, 1)
        out["ended_seconds_ago"] = round(now - ended, 1)
    ran = jobs_seconds(tail.records, tail.events, now if ended is None else ended)
    out["jobs"], out["run_seconds"] = (ran[1], round(ran[0], 1)) if ran else (None, None)
    times = sorted(r.received for r in tail.records if r.received is not None)
    opened = float(opens[-1].data["time"]) if opens else None         # this job's dispatch began
    this_job = [t for t in times if opened is not None and t >= opened]
    out["members_per_second"] = None
    if this_job and opened is not None:
        span = (now if state == "running" else this_job[-1]) - opened
        out["members_per_second"] = round(len(this_job) / span, 3) if span > 0 else None
    recent = (this_job if opens else times)[-RECENT:]          # a resumed job's rate is its own
    out["recent_members_per_second"] = (round((len(recent) - 1) / (recent[-1] - recent[0]), 3)
                                        if len(recent) >= 3 and recent[-1] > recent[0] else None)
    _budget(out, cfg, beat, tail, now)
    out["best"] = None
    finished = [r for r in latest(tail.records).values() if r.status.ranked]
    if metric and finished:
        best = rank_members([r for r in finished if metric in r.val], metric, PROPER_SCORES[metric_task(metric)])
        if best:
            out["best"] = {"id": best[0].id, "val": best[0].val[metric], "test": best[0].test.get(metric)}
    if summary and "ensemble" in summary:
        out["ensemble"] = {"members": len(summary.get("members", [])),
                           "test": summary["ensemble"]["test"].get(summary.get("metric"))}
    if cfg is not None:
        out["mode"] = cfg.mode
        out["resume_trains"] = mode_of(cfg).resume_trains(cfg, tail.records, total)   # a stopped run's --resume
        section = mode_of(cfg).status_section(cfg, tail.events)
        if section is not None:                         # the mode's own progress, under its name
            out[cfg.mode] = section
    if beat.get("reason"):
        out["reason"] = beat["reason"]
    if beat.get("error"):
        out["error"] = beat["error"]
    return out


def _budget(out: dict, cfg: RunConfig | None, beat: dict, tail: JournalTail, now: float) -> None:
    """ETA, what is queued and which budget ends the run (see ``run_status``), into ``out``."""
    state, left, running = out["state"], out["left"], out["running"] or 0
    end, limit = time_budget(cfg, beat, tail)
    time_left = None if end is None or state in FINAL else max(0.0, end - now)
    out.update(budget_left_seconds=None if time_left is None else round(time_left, 1), time_limit=limit,
               ends_by=None, eta_seconds=None, expected_more=None)
    if state in FINAL:
        return
    rate = out["recent_members_per_second"] or out["members_per_second"]
    to_start = None if left is None else max(0, left - running)
    by_count = None if not left or not rate else left / rate           # seconds until `total` have ended
    if left is not None and time_left is None:                         # no time budget: the count ends it
        out.update(ends_by="evaluations", queued=to_start)
    elif left is None or (by_count is not None and by_count > time_left):
        out["ends_by"] = "time" if time_left is not None else None
        if rate and time_left is not None:
            more = round(rate * time_left)
            out["expected_more"] = more if left is None else min(left, more)
    elif by_count is not None:
        out.update(ends_by="evaluations", queued=to_start)
    out["queued_up_to"] = to_start
    if state != "running":
        return
    if out["ends_by"] == "time" and time_left is not None:
        out["eta_seconds"] = round(time_left, 1)
    elif by_count is not None:
        out["eta_seconds"] = round(by_count if time_left is None else min(by_count, time_left), 1)


def format_status(s: dict) -> str:
    """The human block ``python -m ensemble.status`` prints."""
    name = Path(s["run_dir"]).name
    state = s["state"]
    head, note = state_words(s)
    total = s["total"]
    if s["ended_seconds_ago"] is not None:               # a resumed run: its jobs' time, not the gaps between
        took = (f" after {duration_words(s['run_seconds'])} over {s['jobs']} jobs" if (s.get("jobs") or 0) > 1 and
                s.get("run_seconds") is not None else
                f" after {duration_words(s['age_seconds'])}" if s["age_seconds"] is not None else "")
        head += took + f", {duration_words(s['ended_seconds_ago'])} ago"
    elif s["age_seconds"] is not None:
        head += f", age {duration_words(s['age_seconds'])}"
    lines = [f"{name}: {head}"] + ([note] if note else []) + ([f"warning: {s['warning']}"] if s.get("warning") else [])
    c = s["counts"]
    parts = [Counts.from_dict(c).summary()]
    live = state in ("running", "finishing")
    if s["running"] is not None and live:
        parts.append(f"{s['running']} running")
    if s["queued"] is not None and live:
        parts.append(f"{s['queued']} queued")
    elif s["queued_up_to"] and live and s["ends_by"] != "time":
        parts.append(f"up to {s['queued_up_to']} queued")
    text = f"members: {', '.join(parts)}" + (f" of {total}" if total else "") \
        + (f" on {s['workers']} worker{'s' * (s['workers'] != 1)}" if s["workers"] else "")
    if c["issued"] > c["ended"] + (s["running"] or 0):
        text += f" ({c['issued']} handed out)"
    lines.append(text)
    apart = s.get("mode") not in MODES or MODES[s["mode"]].members_end_apart
    lines += untrained_lines(s, apart)
    rates = [r for r in (f"{s['recent_members_per_second']:.2f}/s recently" if s["recent_members_per_second"] else "",
                         f"{s['members_per_second']:.2f}/s this job" if s["members_per_second"] else "") if r
             and apart]
    if rates or s["eta_seconds"] is not None:
        lines.append("rate: " + (", ".join(rates) or "?")
                     + (f"; ETA {duration_words(s['eta_seconds'])}" if s["eta_seconds"] is not None else "")
                     + (" (the time budget ends first)" if s["ends_by"] == "time" and s["eta_seconds"] is not None
                        else ""))
    if s["budget_left_seconds"] is not None and state in ("running", "silent"):
        line = f"budget: {duration_words(s['budget_left_seconds'])} left of {s['time_limit']}: then no member starts"
        if live and s["ends_by"] == "time" and s["expected_more"] is not None:
            line += f"; about {s['expected_more']} more end by then" + (
                f", not all {s['left']} left to {total}" if s["left"] is not None else "")
        lines.append(line)
    if s.get("mode") in MODES and s.get(s["mode"]):      # the mode's own progress (``Mode.status_lines``)
        lines += MODES[s["mode"]].status_lines(s[s["mode"]])
    if s["best"]:
        b = s["best"]
        lines.append(f"best member{' so far' if live else ''}: {b['id']}  val {s['metric']} {metric_text(b['val'])}"
                     + (f", test {metric_text(b['test'])}" if b.get("test") is not None else ""))
    if s.get("ensemble"):
        e = s["ensemble"]
        lines.append(f"ensemble ({e['members']} member{'s' if e['members'] != 1 else ''}): test {s['metric']} "
                     f"{metric_text(e['test'])}")
    return "\n".join(lines)


def is_run_dir(path: Path) -> bool:
    """A folder a run has begun to write (its journal, status or config)."""
    return any((path / name).is_file() for name in (RunDirectory.JOURNAL, RunDirectory.STATUS, RunDirectory.CONFIG))


def _has_other_files(path: Path) -> bool:
    """A folder that exists with something in it (so no run is about to write it), or a file."""
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensemble.status",
                                description="How far a run is: members done, failed, running and queued, "
                                            "rate, ETA, best so far, budget left. Reads files only; takes no lock.")
    p.add_argument("run_dir", help="the run directory (runs/<name>, or the run's --run-dir)")
    p.add_argument("--watch", nargs="?", type=float, const=5.0, metavar="SECONDS",
                   help="refresh every SECONDS (default 5) until the run is over, or its master is gone from this "
                        "host (Ctrl-C stops watching)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    if args.watch is not None and args.watch <= 0:
        print(f"error: --watch needs a positive number of seconds, but got {args.watch}", file=sys.stderr)
        return EXIT_USAGE
    if args.watch is not None and not is_run_dir(run_dir) and not _has_other_files(run_dir):
        try:                            # started beside `mpirun ... &`: the run has not written it yet
            print(f"waiting for a run to write {str(run_dir)!r} (Ctrl-C stops watching)", flush=True)
            while not is_run_dir(run_dir) and not _has_other_files(run_dir):
                time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
    if not is_run_dir(run_dir):
        print(f"error: {str(run_dir)!r} is not a run directory of ensemble.run (no journal.jsonl, status.json "
              "or config.toml); pass the folder a run writes (runs/<name> or its --run-dir)", file=sys.stderr)
        return EXIT_USAGE
    tail = JournalTail(run_dir / RunDirectory.JOURNAL)
    try:
        while True:
            status = run_status(run_dir, tail)
            text = json.dumps(status) if args.json else format_status(status)
            if args.watch is not None and not args.json and sys.stdout.isatty():
                print("\033[2J\033[H", end="")         # clear the terminal between refreshes
            print(text, flush=True)
            if args.watch is None or status["state"] in FINAL or status["state"] == "dead":
                return 0                               # dead: killed on this host, nothing will write again
            if not args.json:
                print()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:             # `ensemble status RUN | head`: the reader has all it wants
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())      # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
