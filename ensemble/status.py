"""``python -m ensemble.status RUN_DIR [--watch [SECONDS]] [--json]``: how far a run is.

Reads only files the master writes atomically or appends to (``status.json``, the
journal, ``ensemble.json``, ``config.toml``), takes no lock and writes nothing, so it is
safe from a login node on the shared file system while the job runs (and after). The
journal gives what finished (exact, across resumed jobs); ``status.json`` what only the
master knows: members in flight and queued, the job's deadline, whether it is alive.
``--watch`` reads only the journal lines appended since the last refresh.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import tomllib
from pathlib import Path

from ensemble.results.heartbeat import FINAL, read_heartbeat
from ensemble.results.rundir import RunDirectory

EXIT_USAGE = 2
RECENT = 50                    # members/s over the last 50 results (and over the whole job)
STALE_BEATS = 3                # a running job silent for 3 heartbeats (and at least a minute) looks dead


class JournalTail:
    """The journal's whole lines, read incrementally: a refresh reads only what was appended
    since the last one, and a line still being written is left for the next."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0
        self.records: list[dict] = []
        self.events: list[dict] = []

    def read(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                if fh.seek(0, 2) < self.offset:         # a new journal (the run started over): all of it
                    self.offset, self.records, self.events = 0, [], []
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1                # a torn last line: next time
        for line in chunk[:end].splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(item, dict):
                (self.events if "event" in item else self.records).append(item)
        self.offset += end


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def run_status(run_dir: Path, tail: JournalTail, now: float | None = None) -> dict:
    """The run's status as one dict (what ``--json`` prints); ``tail`` is read first."""
    from ensemble.results.summary import finished_records
    from ensemble.results.selection import rank_members
    from ensemble.config.vocabulary import PROPER_SCORES
    from ensemble.task.metrics import higher_is_better, metric_task
    now = time.time() if now is None else now
    tail.read()
    beat = read_heartbeat(run_dir) or {}
    summary = _read_json(run_dir / RunDirectory.ENSEMBLE)
    cfg = {}
    if (run_dir / RunDirectory.CONFIG).is_file():
        cfg = tomllib.loads((run_dir / RunDirectory.CONFIG).read_text())
    finished = finished_records(tail.records)
    ok_ids = {r["id"] for r in finished}
    failed = len({r["id"] for r in tail.records if r.get("status") != "ok"} - ok_ids)
    metric = beat.get("metric") or (summary or {}).get("metric")
    total = beat.get("total", _expected(cfg))
    done = len(finished) + failed
    out: dict = {"run_dir": str(run_dir), "metric": metric, "total": total, "done": done,
                 "finished": len(finished), "failed": failed, "running": beat.get("running"), "queued": None,
                 "workers": beat.get("workers")}
    if out["running"] is not None and total is not None:   # the journal may be a beat ahead of status.json
        out["running"] = min(out["running"], max(0, total - done))
        out["queued"] = max(0, total - done - out["running"])
    opens = [e for e in tail.events if e.get("event") == "open"]
    started = opens[0].get("job_started", opens[0]["time"]) if opens else beat.get("job_started")
    out["age_seconds"] = None if started is None else round(now - started, 1)
    state = beat.get("state")
    if state is None:
        state = "done" if summary else ("unknown" if tail.records else "starting")
    beat_age = None if "time" not in beat else now - beat["time"]
    out["heartbeat_age_seconds"] = None if beat_age is None else round(beat_age, 1)
    if state in ("running", "finishing") and beat_age is not None and \
            beat_age > max(STALE_BEATS * beat.get("every", 10.0), 60.0):
        state = "silent"
    out["state"] = state
    out["ended_seconds_ago"] = None
    closes = [e["time"] for e in tail.events if e.get("event") == "close"]
    ended = beat.get("time") if state in FINAL else (closes[-1] if closes and state in ("done", "unknown") else None)
    if ended is not None:                                   # an old run's age is how long it took, not how old
        out["age_seconds"] = None if started is None else round(ended - started, 1)
        out["ended_seconds_ago"] = round(now - ended, 1)
    if state in FINAL and out["running"] is not None:       # the job is over: nothing runs, the rest waits
        out["running"], out["queued"] = 0, None if total is None else max(0, total - done)
    times = sorted(r["received"] for r in tail.records if "received" in r)
    this_job = [t for t in times if opens and t >= opens[-1]["time"]]
    out["members_per_second"] = None
    if this_job:
        span = (now if state == "running" else this_job[-1]) - opens[-1]["time"]
        out["members_per_second"] = round(len(this_job) / span, 3) if span > 0 else None
    recent = (this_job if opens else times)[-RECENT:]          # a resumed job's rate is its own
    out["recent_members_per_second"] = (round((len(recent) - 1) / (recent[-1] - recent[0]), 3)
                                        if len(recent) >= 3 and recent[-1] > recent[0] else None)
    rate = out["recent_members_per_second"] or out["members_per_second"]
    left = None if total is None else max(0, total - out["done"])
    out["eta_seconds"] = None if not left or not rate or state not in ("running",) else round(left / rate, 1)
    deadline = beat.get("deadline")
    out["budget_left_seconds"] = None if deadline is None or state in FINAL else round(deadline - now, 1)
    if out["eta_seconds"] is not None and deadline is not None:
        out["eta_seconds"] = min(out["eta_seconds"], max(0.0, deadline - now))
    out["best"] = None
    if metric and finished:
        best = rank_members([r for r in finished if metric in r.get("val", {})], metric,
                            PROPER_SCORES[metric_task(metric)])
        if best:
            out["best"] = {"id": best[0]["id"], "val": best[0]["val"][metric],
                           "test": best[0].get("test", {}).get(metric)}
    if summary and "ensemble" in summary:
        out["ensemble"] = {"members": len(summary.get("members", [])),
                           "test": summary["ensemble"]["test"].get(summary.get("metric"))}
    rounds = [e for e in tail.events if e.get("event") == "pbt_round"]
    if cfg.get("mode") == "pbt" or rounds:                   # a population's progress is in rounds
        out["pbt"] = {"round": rounds[-1]["round"] if rounds else 0,
                      "rounds": cfg.get("pbt", {}).get("rounds", 10)}
        if rounds:
            values = [(m["value"], m["id"]) for m in rounds[-1]["members"] if m.get("value") is not None]
            if values:
                up = higher_is_better(rounds[-1]["members"][0]["metric"])
                value, member = (max if up else min)(values)
                out["pbt"].update(best=member, value=value, metric=rounds[-1]["members"][0]["metric"],
                                  copies=sum(1 for e in rounds for m in e["members"] if m.get("copied_from")))
    if beat.get("reason"):
        out["reason"] = beat["reason"]
    if beat.get("error"):
        out["error"] = beat["error"]
    return out


def _expected(cfg: dict) -> int | None:
    """Members a run is meant to train, from its config alone (no heartbeat yet)."""
    if cfg.get("mode", "ensemble") == "evolve":
        return cfg.get("evolve", {}).get("evaluations")
    if cfg.get("mode") == "pbt":
        return cfg.get("pbt", {}).get("population") or None     # 0: one per worker group
    return sum(int(a.get("members", 1)) for a in cfg.get("architectures", [])) or None


def format_status(s: dict) -> str:
    """The human block ``python -m ensemble.status`` prints."""
    name = Path(s["run_dir"]).name
    state = s["state"]
    resume = f"the same command with `--run-dir {s['run_dir']} --resume` continues it"
    head, note = {"running": ("running", None),
                  "finishing": ("finishing", "selecting the ensemble, writing the outputs"),
                  "done": ("done", None),
                  "stopped": ("stopped early", f"{s.get('reason')}; {resume}"),
                  "failed": ("failed", s.get("error")),
                  "starting": ("starting", "no heartbeat and no member yet; if that lasts, see the job's log"),
                  "unknown": ("state unknown", "no status.json: a run from before it, or one killed before its "
                                               "first heartbeat"),
                  "silent": ("silent", f"no heartbeat for {_duration(s['heartbeat_age_seconds'])}: the job "
                                       f"looks dead; {resume}")}.get(state, (state, None))
    total = s["total"]
    if s["ended_seconds_ago"] is not None:
        head += (f" after {_duration(s['age_seconds'])}" if s["age_seconds"] is not None else "") \
            + f", {_duration(s['ended_seconds_ago'])} ago"
    elif s["age_seconds"] is not None:
        head += f", age {_duration(s['age_seconds'])}"
    lines = [f"{name}: {head}"] + ([note] if note else [])
    parts = [f"{s['finished']} finished", f"{s['failed']} failed"]
    if s["running"] is not None and state in ("running", "finishing"):
        parts.append(f"{s['running']} running")
    if s["queued"] is not None and state in ("running", "finishing"):
        parts.append(f"{s['queued']} queued")
    lines.append(f"members: {', '.join(parts)}" + (f" of {total}" if total else "")
                 + (f" on {s['workers']} workers" if s["workers"] else ""))
    rates = [f"{s['recent_members_per_second']:.2f}/s recently" if s["recent_members_per_second"] else None,
             f"{s['members_per_second']:.2f}/s this job" if s["members_per_second"] else None]
    rates = [r for r in rates if r]
    if rates or s["eta_seconds"] is not None:
        lines.append("rate: " + (", ".join(rates) or "?")
                     + (f"; ETA {_duration(s['eta_seconds'])}" if s["eta_seconds"] is not None else ""))
    if s["budget_left_seconds"] is not None and state in ("running", "silent"):
        lines.append(f"budget: {_duration(s['budget_left_seconds'])} left before the job stops handing out members")
    if s.get("pbt"):
        p = s["pbt"]
        lines.append(f"population: round {p['round']} of {p['rounds']} done"
                     + (f", best {p['best']} val {p['metric']} {p['value']:.4f}, {p['copies']} copies so far"
                        if "best" in p else ""))
    if s["best"]:
        b = s["best"]
        lines.append(f"best member so far: {b['id']}  val {s['metric']} {b['val']:.4f}"
                     + (f", test {b['test']:.4f}" if b.get("test") is not None else ""))
    if s.get("ensemble"):
        e = s["ensemble"]
        lines.append(f"ensemble ({e['members']} members): test {s['metric']} {e['test']:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensemble.status",
                                description="How far a run is: members done, failed, running and queued, "
                                            "rate, ETA, best so far, budget left. Reads files only; takes no lock.")
    p.add_argument("run_dir", help="the run directory (runs/<name>, or the run's --run-dir)")
    p.add_argument("--watch", nargs="?", type=float, const=5.0, metavar="SECONDS",
                   help="refresh every SECONDS (default 5) until the run is over (Ctrl-C stops watching)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not any((run_dir / name).is_file() for name in (RunDirectory.JOURNAL, RunDirectory.STATUS,
                                                        RunDirectory.CONFIG)):
        print(f"error: {str(run_dir)!r} is not a run directory of ensemble.run (no journal.jsonl, status.json "
              "or config.toml); pass the folder a run writes (runs/<name> or its --run-dir)", file=sys.stderr)
        return EXIT_USAGE
    if args.watch is not None and args.watch <= 0:
        print(f"error: --watch needs a positive number of seconds, but got {args.watch}", file=sys.stderr)
        return EXIT_USAGE
    tail = JournalTail(run_dir / RunDirectory.JOURNAL)
    try:
        while True:
            status = run_status(run_dir, tail)
            text = json.dumps(status) if args.json else format_status(status)
            if args.watch is not None and not args.json and sys.stdout.isatty():
                print("\033[2J\033[H", end="")         # clear the terminal between refreshes
            print(text, flush=True)
            if args.watch is None or status["state"] in FINAL:
                return 0
            if not args.json:
                print()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
