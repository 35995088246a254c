"""Acceptance: one run's outputs cannot disagree about what became of its members.

Real ranks (``mpiexec -n 4``), members that sleep instead of training (no TensorFlow): a
rehearsal list of members, some failing (``rehearsal.failure_rate``), and a search with
early discarding (asha) whose members also fail and hit their "time limit"
(``tests/mpi/discarding_trainer.py``). For each, search.csv (a search), leaderboard.csv,
ensemble.json's ``counts``, the report's header and ``ensemble.status --json`` give the same
numbers of ok, failed, discarded, stopped and limit members, and those agree with the
journal read as ``MemberRecord``s."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from ensemble.results.records import Counts, Status
from ensemble.results.rundir import RunDirectory
from tests.conftest import ROOT, run_mpi

pytestmark = pytest.mark.mpi

ENSEMBLE = """
name = "listed"
seed = 4
[data]
source = "digits"
[[architectures]]
name = "m"
members = 14
layers = [{type = "Dense", units = 8}]
[runtime]
trainer = "rehearsal"
max_failed_share = 0.9
[rehearsal]
seconds = 0.2
failure_rate = 0.3
"""

SEARCH = """
name = "searched"
mode = "evolve"
seed = 5
[data]
source = "digits"
[train]
epochs = 8
[evolve]
strategy = "regularized"
evaluations = 24
population_size = 5
sample_size = 3
discard = "asha"
discard_epochs = 2
discard_factor = 2
discard_grace = 3
[search]
max_depth = 2
units = [8, 48]
[runtime]
trainer = "tests.mpi.discarding_trainer:make"
max_failed_share = 0.9
[rehearsal]
seconds = 0.4
failure_rate = 0.15
"""

KEYS = [s.value for s in Status]


def run(tmp_path, config: str) -> RunDirectory:
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent(config))
    run_dir = tmp_path / "run"
    proc = run_mpi(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return RunDirectory(run_dir)


def by_status(column: pd.Series) -> dict[str, int]:
    counts = column.value_counts().to_dict()
    assert set(counts) <= set(KEYS), counts
    return {k: int(counts.get(k, 0)) for k in KEYS}


def outputs(rd: RunDirectory) -> dict[str, dict[str, int]]:
    """Each output's counts of members by status."""
    records, events = rd.records()
    issued = {e.data["id"] for e in events if e.kind.value == "issued"}
    journal = Counts.of_records(records, issued=len(issued)).as_dict()
    out = {"journal": {k: journal[k] for k in KEYS}}
    summary = json.loads((rd / rd.ENSEMBLE).read_text())
    out["ensemble.json"] = {k: summary["counts"][k] for k in KEYS}
    assert summary["counts"]["ended"] == journal["ended"]
    board = pd.read_csv(rd / rd.LEADERBOARD)
    assert board["id"].is_unique
    out["leaderboard.csv"] = by_status(board["status"])
    if (rd / rd.SEARCH_TABLE).is_file():
        search = pd.read_csv(rd / rd.SEARCH_TABLE)
        out["search.csv"] = by_status(search["status"])
    page = (rd / "report.html").read_text()
    header = re.search(r"<p class='counts' data-counts='([^']*)'>([^<]*)", page)
    assert header, "the report has no counts in its header"
    shown = json.loads(html.unescape(header.group(1)))
    out["report"] = {k: shown[k] for k in KEYS}
    assert Counts.from_dict(shown).summary() in html.unescape(header.group(2))     # the words say the numbers
    proc = subprocess.run([sys.executable, "-m", "ensemble.status", str(rd.path), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    out["ensemble.status"] = {k: status["counts"][k] for k in KEYS}
    assert status["counts"]["ended"] == journal["ended"] and status["finished"] == journal["ok"]
    return out


def assert_agree(found: dict[str, dict[str, int]]) -> None:
    want = found["journal"]
    wrong = {name: got for name, got in found.items() if got != want}
    assert not wrong, f"the journal says {want}, but " + "; ".join(f"{n} says {g}" for n, g in wrong.items())


def test_a_rehearsal_with_failures_counts_alike_everywhere(tmp_path):
    rd = run(tmp_path, ENSEMBLE)
    found = outputs(rd)
    assert_agree(found)
    c = found["journal"]
    assert c["ok"] + c["failed"] == 14 and c["failed"] > 0 and c["ok"] > 0     # failure_rate 0.3 drew some


@pytest.mark.long          # make test-long: the rehearsal with failures above counts alike
def test_a_search_with_discarding_counts_alike_everywhere(tmp_path):
    rd = run(tmp_path, SEARCH)
    found = outputs(rd)
    assert "search.csv" in found
    assert_agree(found)
    c = found["journal"]
    assert sum(c.values()) == 24
    assert c["discarded"] > 0 and c["failed"] > 0 and c["limit"] > 0 and c["ok"] > 0, c
    summary = json.loads((rd / rd.ENSEMBLE).read_text())
    records, _ = rd.records()
    discarded = {r.id for r in records if r.status is Status.DISCARDED}
    assert not discarded & {m["id"] for m in summary["members"]}                # never selected
    assert summary["best_member"]["id"] not in discarded
