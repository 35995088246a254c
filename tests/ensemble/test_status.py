"""``ensemble.status`` from synthetic run directories: counts from the journal and the
heartbeat, a torn last line, a silent (dead) job, a run without status.json, the CLI; the
heartbeat's writer (when due, kept alive from a thread, an exception written as the state)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from ensemble import status as S
from ensemble.results.heartbeat import Heartbeat, read_heartbeat
from ensemble.results.records import MemberRecord
from ensemble.results.summary import leaderboard
from ensemble.status import STALE_BEATS


def record(i: int, ok: bool = True, t: float = 1000.0) -> dict:
    r = {"id": f"m-{i:03d}", "status": "ok" if ok else "failed", "received": t + i, "started": t + i - 1,
         "ended": t + i - 0.1, "val": {"accuracy": 0.5 + i / 100}, "test": {"accuracy": 0.5}}
    if not ok:
        r["error"] = {"kind": "nan_loss", "message": "NaN"}
        del r["val"]
    return r


def make(tmp_path, n_ok=5, n_failed=1, beat: dict | None = None, torn: bool = False, config: str = ""):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"event": "open", "time": 999.0, "job_started": 995.0, "workers": 3}]
    lines += [record(i) for i in range(n_ok)] + [record(n_ok + i, ok=False) for i in range(n_failed)]
    text = "".join(json.dumps(x) + "\n" for x in lines)
    if torn:
        text += '{"id": "m-999", "status": "o'              # the master is mid-append
    (run / "journal.jsonl").write_text(text)
    if beat is not None:
        (run / "status.json").write_text(json.dumps(beat))
    (run / "config.toml").write_text(config or CONFIG)
    return run


CONFIG = ('[data]\nsource = "digits"\n[[architectures]]\nname = "m"\nmembers = 12\n'
          'layers = [{type = "Dense", units = 8}]\n')


def test_counts_come_from_the_journal_and_the_heartbeat(tmp_path):
    beat = {"state": "running", "time": 1006.0, "every": 10.0, "total": 12, "metric": "accuracy", "running": 3,
            "queued": 3, "workers": 3, "deadline": 1100.0}
    run = make(tmp_path, beat=beat, torn=True)
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1010.0)
    assert (s["finished"], s["failed"], s["done"], s["running"], s["queued"], s["total"]) == (5, 1, 6, 3, 3, 12)
    assert s["state"] == "running" and s["best"]["id"] == "m-004" and s["budget_left_seconds"] == 90.0
    assert s["age_seconds"] == 15.0 and s["eta_seconds"] == pytest.approx(6 / s["recent_members_per_second"])
    text = S.format_status(s)
    assert "5 finished, 1 failed, 3 running, 3 queued of 12 on 3 workers" in text and "ETA" in text
    assert "best member so far: m-004" in text and "budget: 90 s left of the job's time limit" in text


def test_the_tail_reads_a_torn_line_once_it_is_whole(tmp_path):
    run = make(tmp_path, torn=True)
    tail = S.JournalTail(run / "journal.jsonl")
    tail.read()
    assert len(tail.records) == 6
    with open(run / "journal.jsonl", "a") as fh:             # the master finishes the line, and one more
        fh.write('k", "received": 1009.0, "val": {"accuracy": 0.9}}\n' + json.dumps(record(7)) + "\n")
    tail.read()
    assert [r.id for r in tail.records][-2:] == ["m-999", "m-007"]


def test_a_silent_job_is_called_dead_with_how_to_resume(tmp_path):
    beat = {"state": "running", "time": 1000.0, "every": 10.0, "total": 12}
    run = make(tmp_path, beat=beat)
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1000.0 + 600)
    assert s["state"] == "silent" and "looks dead" in S.format_status(s) and "--resume" in S.format_status(s)


def test_a_job_elsewhere_is_called_silent_after_three_missed_heartbeats(tmp_path):
    from ensemble.config import resolve_config
    every = resolve_config({"architectures": [{"name": "m", "layers": [{"type": "Dense", "units": 4}]}]}) \
        .runtime.heartbeat_seconds
    assert STALE_BEATS * every <= 15.0                        # a dead job is told within about 15 s
    beat = {"state": "running", "time": 1000.0, "every": every, "total": 12, "host": "another-node", "pid": 1}
    run = make(tmp_path, beat=beat)
    tail = S.JournalTail(run / "journal.jsonl")
    assert S.run_status(run, tail, now=1000.0 + 2.9 * every)["state"] == "running"
    assert S.run_status(run, tail, now=1000.0 + 3.1 * every)["state"] == "silent"


def test_a_job_killed_on_this_host_is_called_dead_at_once(tmp_path):
    """kill -9 leaves status.json saying "running"; its master's pid is gone, so status need
    not wait a minute of missed heartbeats to say so."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    beat = {"state": "running", "time": 1000.0, "every": 10.0, "total": 12, "running": 3,
            "host": socket.gethostname(), "pid": gone.pid}
    run = make(tmp_path, beat=beat)
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1001.0)
    assert s["state"] == "dead" and s["running"] == 0
    text = S.format_status(s)
    assert f"process {gone.pid}" in text and "--resume" in text and "ETA" not in text
    assert S.main([str(run), "--watch", "0.1"]) == 0          # one refresh, then out: it refreshed for ever
    (tmp_path / "b").mkdir()
    alive = make(tmp_path / "b", beat={**beat, "pid": os.getpid()})
    assert S.run_status(alive, S.JournalTail(alive / "journal.jsonl"), now=1001.0)["state"] == "running"


def test_without_a_heartbeat_the_journal_and_config_still_answer(tmp_path):
    run = make(tmp_path)
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1010.0)
    assert s["state"] == "unknown" and s["total"] == 12 and s["running"] is None and s["finished"] == 5
    assert "5 finished, 1 failed of 12" in S.format_status(s)


def test_a_finished_run_shows_its_ensemble(tmp_path):
    run = make(tmp_path, beat={"state": "done", "time": 1010.0, "total": 6, "metric": "accuracy"})
    (run / "ensemble.json").write_text(json.dumps({"metric": "accuracy", "members": [{}, {}],
                                                   "ensemble": {"test": {"accuracy": 0.97}}}))
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=2000.0)
    assert s["state"] == "done" and s["eta_seconds"] is None
    assert (s["age_seconds"], s["ended_seconds_ago"]) == (15.0, 990.0)     # how long it took, when it ended
    assert S.format_status(s).startswith("run: done after 15 s, 16.5 min ago")
    assert "ensemble (2 members): test accuracy 0.9700" in S.format_status(s)


def test_heartbeat_writes_when_due_and_merges_fields(tmp_path):
    clock = [0.0]
    beat = Heartbeat(tmp_path, every=5.0, clock=lambda: clock[0], total=10)
    beat.beat(done=1)
    clock[0] = 2.0
    beat.beat(done=2)                                          # not due: nothing written
    assert read_heartbeat(tmp_path)["done"] == 1 and beat.writes == 1
    clock[0] = 6.0
    beat.beat(late=True, done=3)                               # late: not before twice `every`
    assert beat.writes == 1
    beat.beat(done=3)
    beat.final("done", done=10)
    got = read_heartbeat(tmp_path)
    assert got["state"] == "done" and got["done"] == 10 and got["total"] == 10 and beat.writes == 3
    assert not list(tmp_path.glob("*.part"))


def test_a_new_journal_is_read_from_its_start(tmp_path):
    run = make(tmp_path, n_ok=5)
    tail = S.JournalTail(run / "journal.jsonl")
    tail.read()
    (run / "journal.jsonl").write_text(json.dumps(record(0)) + "\n")        # the run started over
    tail.read()
    assert [r.id for r in tail.records] == ["m-000"] and tail.events == []


def test_a_run_that_has_only_its_config_is_starting(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(CONFIG.replace("12", "4"))
    assert S.main([str(run)]) == 0
    assert "run: starting" in capsys.readouterr().out


def test_heartbeat_takes_the_counts_and_writes_an_exception_as_the_state(tmp_path):
    counts = {"done": 0}
    beat = Heartbeat(tmp_path, every=60.0, counts=lambda: dict(counts), total=4)
    with pytest.raises(KeyboardInterrupt), beat:
        beat.beat()
        counts["done"] = 2
        raise KeyboardInterrupt
    got = read_heartbeat(tmp_path)
    assert got["state"] == "stopped" and "interrupted" in got["reason"] and got["done"] == 2
    counts.update(running=2, held_ahead=2)        # specs out when it stopped: none runs once it is over
    Heartbeat(tmp_path, every=60.0, counts=lambda: dict(counts)).final("stopped", reason="Ctrl-C")
    got = read_heartbeat(tmp_path)
    assert (got["running"], got["held_ahead"], got["done"]) == (0, 0, 2)
    with pytest.raises(ValueError), Heartbeat(tmp_path, every=60.0):
        raise ValueError("bad spec")
    assert read_heartbeat(tmp_path)["error"] == "ValueError: bad spec"


def test_kept_alive_beats_from_a_thread_until_final(tmp_path):
    beat = Heartbeat(tmp_path, every=0.05)
    with beat.kept_alive("finishing"):
        time.sleep(0.4)                                        # a long selection: no loop beats
        assert read_heartbeat(tmp_path)["state"] == "finishing" and beat.writes >= 4
        beat.final("done")
        writes = beat.writes
        time.sleep(0.2)
        assert beat.writes == writes                           # the thread stops at the final state
    assert read_heartbeat(tmp_path)["state"] == "done"
    with pytest.raises(RuntimeError), Heartbeat(tmp_path, every=0.05).kept_alive("finishing"):
        raise RuntimeError("disk full")
    assert read_heartbeat(tmp_path)["error"] == "RuntimeError: disk full"


def test_a_serial_master_is_idle_on_each_report_of_the_member_it_trains():
    from ensemble.runtime.executor import SerialExecutor, go_on

    def trainer(spec, report):
        for epoch in range(3):
            report({"epoch": epoch})
        return {"id": spec["id"], "status": "ok"}
    ex, calls = SerialExecutor(lambda: trainer), []
    ex.submit({"id": "m0"})
    assert ex.wait(go_on, idle=lambda: calls.append(1))[0]["id"] == "m0" and len(calls) == 3


def test_cli_errors_and_json(tmp_path, capsys):
    assert S.main([str(tmp_path / "nothing")]) == S.EXIT_USAGE
    assert "not a run directory" in capsys.readouterr().err
    run = make(tmp_path, beat={"state": "done", "time": 1010.0, "total": 6, "metric": "accuracy"})
    assert S.main([str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] == 5
    assert S.main([str(run), "--watch", "0.1"]) == 0                # a finished run: one refresh, then out


def test_progress_counts_what_is_out_and_the_best_so_far():
    from ensemble.orchestrate.progress import Progress
    p = Progress(10, "mse", workers=2, done=3, lines=0)
    for i in range(5):
        p.hand_out({"id": f"m{i}"})
    ok = {"status": "ok", "epochs": 3, "params": 10, "train_seconds": 1.0}    # whole records: a debug log prints them
    p.add([MemberRecord.from_json(x) for x in (
        {"id": "m0", "val": {"mse": 2.0}, **ok}, {"id": "m1", "val": {"mse": 1.5}, **ok},
        {"id": "m2", "status": "failed", "error": {"kind": "nan_loss", "message": "NaN"}})])
    c = p.counts()                                  # 5 out, 3 back: 2 running on 2 workers, none ahead
    assert (c["done"], c["failed"], c["running"], c["held_ahead"], c["queued"]) == (6, 1, 2, 0, 2)
    assert c["best"] == {"id": "m1", "value": 1.5}                     # lower mse is better
    # a member at its time limit is "limit" in status.json as in ensemble.json's counts, not "failed"
    p.add([MemberRecord.from_json({"id": "m3", "status": "limit", "error": {"kind": "time_limit", "message": "t"}})])
    c = p.counts()
    assert (c["failed"], c["limit"], c["stopped"]) == (1, 1, 0)
    assert p.summary().startswith("[7/10] 1 failed, 1 stopped by their time limit, ")
    # a tie is told apart as the leaderboard tells it (the proper score), not by who came first
    q = Progress(None, "accuracy", workers=2, lines=0)
    q.add([MemberRecord.from_json({"id": i, "val": {"accuracy": 0.9, "log_loss": loss}, **ok})
           for i, loss in (("m0", 0.4), ("m1", 0.2), ("m2", 0.3))])
    assert q.counts()["best"]["id"] == "m1"
    board = leaderboard([MemberRecord.from_json({"id": i, "val": {"accuracy": 0.9, "log_loss": loss}, **ok})
                         for i, loss in (("m0", 0.4), ("m1", 0.2), ("m2", 0.3))], "accuracy")
    assert board["id"].iloc[0] == "m1"


SEARCH = ('mode = "evolve"\n[data]\nsource = "digits"\n[evolve]\nstrategy = "regularized"\nevaluations = 1000\n'
          'time_limit = 720.0\n')


def search_run(tmp_path, beat: dict | None, n: int = 3, issued: int = 0, opens=((999.0, 995.0),)) -> object:
    """A search of 1000 evaluations with a 12-minute budget, ``n`` results in, ``issued``
    candidates handed out."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"event": "open", "time": t, "job_started": js, "workers": 2} for t, js in opens]
    lines += [{"event": "issued", "id": f"e{i:04d}", "evaluation": i} for i in range(issued)]
    lines += [{"id": f"e{i:04d}", "status": "ok", "received": opens[-1][0] + 20.0 * (i + 1),
               "val": {"accuracy": 0.5 + i / 100}} for i in range(n)]
    (run / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run / "config.toml").write_text(SEARCH)
    if beat is not None:
        (run / "status.json").write_text(json.dumps(beat))
    return run


def test_a_time_budget_that_ends_first_sets_the_eta_and_claims_no_queue(tmp_path):
    """The user's case: 1000 evaluations and 12 minutes; at 3 results a minute the count
    would take hours, so the time budget ends the run: ETA is the time left, nothing is
    called queued, and the estimate of what still ends is about rate x time left."""
    beat = {"state": "running", "time": 1059.0, "every": 10.0, "total": 1000, "metric": "accuracy",
            "running": 2, "workers": 2, "deadline": None}
    run = search_run(tmp_path, beat)
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1060.0)
    assert s["ends_by"] == "time" and s["time_limit"] == "`evolve.time_limit`"
    assert s["budget_left_seconds"] == 999.0 + 720.0 - 1060.0 == s["eta_seconds"]
    assert s["queued"] is None and s["queued_up_to"] == 995
    assert s["expected_more"] == round(s["recent_members_per_second"] * s["eta_seconds"]) < 100
    text = S.format_status(s)
    assert "queued" not in text and "ETA 11.0 min (the time budget ends first)" in text, text
    assert (f"budget: 11.0 min left of `evolve.time_limit`: then no member starts; about {s['expected_more']} "
            "more end by then, not all 997 left to 1000") in text


def test_without_a_heartbeat_the_time_budget_comes_from_the_config(tmp_path):
    run = search_run(tmp_path, None)
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1060.0)
    assert s["total"] == 1000 and s["budget_left_seconds"] == 659.0 and s["ends_by"] == "time"
    assert s["eta_seconds"] is None                       # no heartbeat: the state is unknown, no ETA


def test_a_resumed_search_counts_the_time_it_already_searched(tmp_path):
    """evolve.time_limit is search time over all jobs: a first job searched 100 s (its last
    result 100 s after its open), so the second job has 620 s from its open."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"event": "open", "time": 0.0, "workers": 2}, {"id": "e0000", "status": "ok", "received": 100.0},
             {"event": "open", "time": 5000.0, "workers": 2}]
    (run / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run / "config.toml").write_text(SEARCH)
    (run / "status.json").write_text(json.dumps({"state": "running", "time": 5010.0, "total": 1000,
                                                 "deadline": None, "running": 2}))
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=5010.0)
    assert s["budget_left_seconds"] == 610.0


def test_a_search_its_time_limit_ended_says_why_it_trained_fewer(tmp_path):
    """Done at 3 of 1000 read as if 997 were lost."""
    beat = {"state": "done", "time": 1720.0, "total": 1000, "metric": "accuracy", "running": 0, "workers": 2,
            "deadline": None}
    run = search_run(tmp_path, beat)
    text = S.format_status(S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1800.0))
    assert "the other 997 were never started: `evolve.time_limit` ended the run first" in text, text


def test_when_the_count_ends_first_the_queue_and_eta_are_the_counts(tmp_path):
    beat = {"state": "running", "time": 1059.0, "total": 8, "metric": "accuracy", "running": 2, "workers": 2,
            "deadline": None}
    run = search_run(tmp_path, beat)
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1060.0)
    assert s["ends_by"] == "evaluations" and s["queued"] == 3 and s["left"] == 5
    assert s["eta_seconds"] == pytest.approx(5 / s["recent_members_per_second"], abs=0.1)
    assert "3 queued of 8" in S.format_status(s)


def test_counts_by_status_and_issued_agree_with_ensemble_json_keys(tmp_path):
    """finished is ok only; discarded (new and old journals), failed and stopped by a limit
    (old journals: failed with kind time_limit) apart; issued from the search's events."""
    beat = {"state": "running", "time": 1059.0, "total": 1000, "metric": "accuracy", "running": 2, "workers": 2,
            "deadline": None}
    run = search_run(tmp_path, beat, n=5, issued=19)
    with open(run / "journal.jsonl", "a") as fh:
        for line in ({"id": "e0005", "status": "ok", "val": {"accuracy": 0.99}, "discarded": {"epoch": 2}},
                     {"id": "e0006", "status": "discarded", "val": {"accuracy": 0.98}, "discarded": {"epoch": 2}},
                     {"id": "e0007", "status": "failed", "error": {"kind": "time_limit", "message": "slow"}},
                     {"id": "e0008", "status": "failed", "error": {"kind": "nan_loss", "message": "NaN"}}):
            fh.write(json.dumps(line) + "\n")
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1060.0)
    assert s["counts"] == {"ok": 5, "failed": 1, "discarded": 2, "stopped": 0, "limit": 1, "ended": 9,
                           "issued": 19}
    assert (s["finished"], s["failed"], s["discarded"], s["limit"], s["done"]) == (5, 1, 2, 1, 9)
    assert s["best"]["id"] == "e0004"                         # a discarded candidate is never the best
    text = S.format_status(s)
    assert "members: 5 finished, 1 failed, 2 discarded early, 1 stopped by their time limit, 2 running" in text
    assert "(19 handed out)" in text


def test_a_stopped_run_says_what_is_left_for_resume(tmp_path):
    run = make(tmp_path, beat={"state": "stopped", "time": 1010.0, "total": 12, "running": 2,
                               "reason": "interrupted by Ctrl-C or a signal"})
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1020.0)
    assert (s["running"], s["queued"], s["left"], s["eta_seconds"]) == (0, None, 6, None)
    # and the one that failed, which a resume of an ensemble tries again (status said 6, --resume trained 7)
    assert "6 of 12 members not trained yet and 1 that ended without a result; --resume trains these 7" \
        in S.format_status(s)
    pbt = {**s, "mode": "pbt", "recent_members_per_second": 1176.4, "members_per_second": 2.0, "resume_trains": None}
    text = S.format_status(pbt)                 # a population: every member ends at the last round
    assert "6 of 12 members not finished; --resume continues them from their last round" in text
    assert "/s recently" not in text and "not trained yet" not in text


def test_an_unreadable_config_is_no_reason_to_fail(tmp_path):
    run = make(tmp_path, config="this is = not [toml")
    s = S.run_status(run, S.JournalTail(run / "journal.jsonl"), now=1010.0)
    assert s["total"] is None and s["finished"] == 5


def test_expected_members_by_mode():
    from ensemble.config import resolve_config
    assert S.expected_members(None) is None
    arch = [{"name": n, "members": k, "layers": [{"type": "Dense", "units": 4}]} for n, k in (("a", 3), ("b", 4))]
    assert S.expected_members(resolve_config({"data": {"source": "digits"}, "architectures": arch})) == 7
    assert S.expected_members(resolve_config({"mode": "evolve", "data": {"source": "digits"},
                                              "evolve": {"evaluations": 9}})) == 9
    pbt = {"mode": "pbt", "data": {"source": "digits"}, "architectures": arch}
    assert S.expected_members(resolve_config({**pbt, "pbt": {"population": 0}})) is None
    assert S.expected_members(resolve_config({**pbt, "pbt": {"population": 6}})) == 6


def test_status_piped_into_a_reader_that_stops_early_ends_quietly(tmp_path):
    """`ensemble status RUN | head -1`: a BrokenPipeError traceback, exit 1, before."""
    run = make(tmp_path, n_ok=40)
    read, write = os.pipe()
    os.close(read)                      # the reader has gone before the first line
    proc = subprocess.run([sys.executable, "-m", "ensemble.status", str(run)], stdout=write,
                          stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    os.close(write)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_a_journal_cut_short_is_said_by_status_and_refused_by_reselect(tmp_path):
    """ensemble.json counted 8 finished members, the journal (truncated) holds 5: status said "done,
    5 finished" without a word, and reselect silently re-selected from the 5, overwriting ensemble.json."""
    from ensemble.reselect import ReselectError, reselect
    run = make(tmp_path, n_ok=5, n_failed=0, beat={"state": "done", "time": time.time()})
    (run / "ensemble.json").write_text(json.dumps({"metric": "accuracy", "counts": {"ok": 8}, "members": []}))
    (run / "data.json").write_text(json.dumps({"task": "classification"}))
    status = S.run_status(run, S.JournalTail(run / "journal.jsonl"))
    assert status["warning"] == ("journal.jsonl holds 5 finished member(s), but ensemble.json counted 8: the "
                                 "journal was cut short or replaced")
    assert "warning: journal.jsonl holds 5" in S.format_status(status)
    with pytest.raises(ReselectError, match="re-selecting from it would drop members"):
        reselect(run, {})


def test_watch_waits_for_a_run_that_has_not_written_its_folder_yet(tmp_path, capsys, monkeypatch):
    run = tmp_path / "runs" / "later"
    naps = []

    def sleep(seconds):                          # the run writes its folder during the second nap
        naps.append(seconds)
        if len(naps) == 2:
            run.mkdir(parents=True)
            (run / "config.toml").write_text(CONFIG.replace("12", "4"))
            (run / "status.json").write_text(json.dumps({"state": "done", "time": 1010.0, "total": 4}))
    monkeypatch.setattr(S.time, "sleep", sleep)
    assert S.main([str(run), "--watch", "2"]) == 0
    out = capsys.readouterr().out
    assert f"waiting for a run to write {str(run)!r}" in out and naps == [2.0, 2.0]
    assert "later: done" in out and "of 4" in out
    other = tmp_path / "notes"
    other.mkdir()
    (other / "x.txt").write_text("mine")       # a folder of something else: refused at once, as without --watch
    assert S.main([str(other), "--watch", "2"]) == S.EXIT_USAGE and len(naps) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_a_resumed_run_took_its_jobs_time_not_the_gap_between_them(tmp_path):
    """Two jobs of 15 s and 3 s an hour apart said "done after 61 min"."""
    lines = [{"event": "open", "time": 1000.0, "job_started": 998.0, "workers": 2},
             record(1, t=1000.0), record(2, t=1000.0), {"event": "close", "time": 1013.0},
             {"event": "open", "time": 4600.0, "job_started": 4600.0, "workers": 2},
             record(3, t=4600.0 - 3), {"event": "close", "time": 4603.0}]
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "status.json").write_text(json.dumps({"state": "done", "time": 4603.0}))
    s = S.run_status(tmp_path, S.JournalTail(tmp_path / "journal.jsonl"), now=4700.0)
    assert (s["jobs"], s["run_seconds"], s["age_seconds"]) == (2, 18.0, 3605.0)
    assert "done after 18 s over 2 jobs, 97 s ago" in S.format_status(s)


def test_a_job_killed_in_its_start_up_is_dead_not_starting(tmp_path):
    """kill -9 of the master after config.toml, before the journal and the first heartbeat: status
    said "starting ... if that lasts, see the job's log" for ever."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()                                                  # a process of this host that has ended
    (tmp_path / "config.toml").write_text(CONFIG)
    (tmp_path / "run.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": gone.pid}))
    s = S.run_status(tmp_path, S.JournalTail(tmp_path / "journal.jsonl"))
    assert s["state"] == "dead" and f"its master (process {gone.pid} on this host) is gone" in S.format_status(s)
    (tmp_path / "run.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    assert S.run_status(tmp_path, S.JournalTail(tmp_path / "journal.jsonl"))["state"] == "starting"


def test_a_torn_status_json_is_said_so_not_called_missing(tmp_path):
    (tmp_path / "config.toml").write_text(CONFIG)
    (tmp_path / "journal.jsonl").write_text(json.dumps(record(1)) + "\n")
    (tmp_path / "status.json").write_text('{"state": "runn')
    text = S.format_status(S.run_status(tmp_path, S.JournalTail(tmp_path / "journal.jsonl")))
    assert "status.json cannot be read (cut short" in text and "no status.json" not in text
