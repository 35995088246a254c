"""`python -m ensemble.reselect` on a finished run (rehearsal members, no TensorFlow): a
new ensemble.json from the kept predictions, the old one kept, no member retrained."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
name = "resel"
seed = 2
[[architectures]]
name = "a"
members = 40
layers = [{type = "Dense", units = 8}]
[ensemble]
candidates = 20
keep_models = 12
[runtime]
trainer = "rehearsal"
[rehearsal]
seconds = 0.0
accuracy = 0.7
"""


def reselect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ensemble.reselect", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_reselect_writes_a_new_ensemble_and_keeps_the_old(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    run_dir = tmp_path / "run"
    proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    first = json.loads((run_dir / "ensemble.json").read_text())
    assert first["selection"]["metric"] == "log_loss" and first["method"] in ("shrunk", "greedy", "bagged", "top_k")
    sel = first["selection"]
    assert sel["method"] == first["method"] and sel["why"] and len(first["members"]) == sel["picks"]
    assert sel["cv"] is None or {"top_1", "greedy", "bagged"} <= set(sel["cv"])
    assert len(first["members"]) > 1 or sel["single_member"]["z"] > 1.645
    journal = (run_dir / "journal.jsonl").read_text()

    proc = reselect(str(run_dir), "--method", "top_k", "--k", "3")
    assert proc.returncode == 0, proc.stderr
    second = json.loads((run_dir / "ensemble.json").read_text())
    assert json.loads((run_dir / "ensemble-1.json").read_text()) == first
    assert (run_dir / "ensemble_test_predictions-1.npz").is_file()
    assert second["method"] == "top_k" and len(second["members"]) == 3
    assert second["reselected"]["previous"] == "ensemble-1.json" and second["reselected"]["pool"] >= 3
    assert second["run"] == first["run"] and second["n_finished"] == first["n_finished"] == 40
    assert (run_dir / "journal.jsonl").read_text() == journal                  # nothing trained
    assert "ensemble (3 members)" in proc.stderr + proc.stdout

    (run_dir / "ensemble.onnx").write_bytes(b"an export of the second ensemble")
    proc = reselect(str(run_dir), "--method", "greedy", "--selection-metric", "accuracy")
    assert proc.returncode == 0, proc.stderr
    assert "ensemble.onnx in" in proc.stderr and "hold(s) the previous ensemble" in proc.stderr
    third = json.loads((run_dir / "ensemble.json").read_text())
    assert third["selection"]["metric"] == "accuracy" and third["reselected"]["previous"] == "ensemble-2.json"
    assert third["reselected"]["changed"]
    proc = reselect(str(run_dir), "--method", "greedy", "--selection-metric", "accuracy")    # the same again
    assert proc.returncode == 0, proc.stderr
    assert "the same members, weights and calibration" in proc.stdout and "hold(s) the previous" not in proc.stderr
    fourth = json.loads((run_dir / "ensemble.json").read_text())
    assert not fourth["reselected"]["changed"] and fourth["members"] == third["members"]

    proc = reselect(str(run_dir), "--metric", "log_loss")         # ranked on another metric: every part follows
    assert proc.returncode == 0, proc.stderr
    fifth = json.loads((run_dir / "ensemble.json").read_text())
    board = (run_dir / "leaderboard.csv").read_text().splitlines()
    assert fifth["metric"] == "log_loss" and board[1].split(",")[:2] == ["1", fifth["best_member"]["id"]]
    status = subprocess.run([sys.executable, "-m", "ensemble.status", str(run_dir)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120).stdout
    assert f"best member: {fifth['best_member']['id']}  val log_loss" in status, status  # it said accuracy for
    assert "): test log_loss" in status                                                  # the log loss

    proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=120)
    assert proc.returncode == 0, proc.stderr        # a spare link of a job chain: the reselected one is kept
    assert json.loads((run_dir / "ensemble-5.json").read_text()) == fifth
    assert "reselected" not in json.loads((run_dir / "ensemble.json").read_text())
    assert "is kept as ensemble-5.json" in proc.stderr + proc.stdout

    proc = reselect(str(run_dir), "--calibration", "conformal")
    assert proc.returncode == 2 and "--calibration" in proc.stderr and "classification" in proc.stderr
    proc = reselect(str(tmp_path))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
