"""mode = "pbt" with real ranks: a member copies another's weights (worker to worker, none
through rank 0) and the two then predict alike; a job killed -9 mid-run resumes at the
round after the last one journalled, with a lineage that has no gap and no duplicate."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest

from ensemble.results.journal import read_lines
from tests.conftest import kill_when, run_mpi

pytestmark = pytest.mark.mpi

BASE = """
name = "pbt"
mode = "pbt"
seed = 5
[data]
source = "digits"
task = "classification"
[train]
optimizer = "adam"
batch_size = 64
[[architectures]]
name = "mlp"
layers = [{{type = "Dense", units = 16, activation = "relu"}}]
[pbt]
round_epochs = 1
rounds = {rounds}
exploit = "truncation"
fraction = 0.34
explore = "perturb"
factors = [1.0]
hyperparameters = ["learning_rate"]
ranges = {{learning_rate = [{low}, {high}]}}
"""


def write(tmp_path, **kw):
    cfg = tmp_path / "pbt.toml"
    cfg.write_text(textwrap.dedent(BASE.format(**kw)))
    return cfg


def test_a_copied_member_predicts_as_its_donor_and_no_state_goes_through_rank_0(tmp_path):
    # learning rates so small that training after the copy changes nothing visible: the
    # receiver must then predict what its donor predicts, to float tolerance
    cfg = write(tmp_path, rounds=2, low=1e-10, high=1e-10)
    cfg.write_text(cfg.read_text() + "[evolve]\nevaluations = 5\n")      # a table pbt does not read
    run_dir = tmp_path / "run"
    proc = run_mpi(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[evolve] is set, but mode 'pbt' does not read it" in proc.stderr     # as check says it
    lineage = pd.read_csv(run_dir / "pbt.csv")
    assert sorted(lineage["round"].unique()) == [1, 2] and len(lineage) == 6
    copied = lineage[lineage["copied_from"].notna()]
    assert len(copied) == 1 and int(copied["round"].iloc[0]) == 1        # after the last round nobody copies
    receiver, donor = copied["id"].iloc[0], copied["copied_from"].iloc[0]
    other = next(i for i in lineage["id"].unique() if i not in (receiver, donor))
    assert (lineage["rank"] > 0).all()                                   # members live on workers only

    records = {x["id"]: x for x in read_lines(run_dir / "journal.jsonl") if "event" not in x}
    assert {r["status"] for r in records.values()} == {"ok"}
    state = int(lineage.loc[lineage["id"] == donor, "state_bytes"].iloc[0])
    assert records[donor]["exchange"]["bytes_sent"] == state
    assert records[receiver]["exchange"]["bytes_received"] == state
    assert records[other]["exchange"]["bytes_sent"] == records[other]["exchange"]["bytes_received"] == 0
    assert records[receiver]["exchange"]["copies"] == [{"round": 1, "from": donor}]
    summary = json.loads((run_dir / "ensemble.json").read_text())
    assert summary["pbt"]["bytes_moved_this_job"] == state
    # what rank 0 received in all: the reports, a few hundred bytes each, not the state
    assert summary["master_report_bytes"] < 6 * 2000 < state

    import keras

    from ensemble.inference.api import load
    from ensemble.inference.inputs import prepare_features
    from ensemble.inference.load import load_run
    from ensemble.results.rundir import RunDirectory
    x_test = prepare_features(load_run(run_dir), load(run_dir).data("test")[0][:64])
    preds = {m: keras.models.load_model(RunDirectory(run_dir).model_path(m)).predict(x_test, verbose=0)
             for m in (receiver, donor, other)}
    np.testing.assert_allclose(preds[receiver], preds[donor], atol=1e-5)
    assert np.abs(preds[other] - preds[donor]).max() > 1e-3


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_killed_during_a_round_resumes_after_the_last_journalled_one(tmp_path):
    cfg = write(tmp_path, rounds=6, low=1e-4, high=3e-2)
    dense = 'layers = [{type = "Dense", units = 16, activation = "relu"}]'
    assert dense in cfg.read_text()                      # dropout: training draws random numbers
    cfg.write_text(cfg.read_text().replace(dense, dense[:-1] + ', {type = "Dropout", rate = 0.3}]'))
    run_dir = tmp_path / "run"
    journal = run_dir / "journal.jsonl"
    kill_when(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)],
              lambda: journal.exists() and sum(x.get("event") == "pbt_round" for x in read_lines(journal)) >= 2,
              180, "round 2's journal line")
    before = [x["round"] for x in read_lines(run_dir / "journal.jsonl") if x.get("event") == "pbt_round"]
    assert 2 <= before[-1] < 6, f"the kill came too late to test a resume ({before})"
    assert not [x for x in read_lines(run_dir / "journal.jsonl") if "event" not in x]

    fewer = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=240)
    said = fewer.stdout + fewer.stderr                   # the next job got fewer nodes: a traceback and exit 1
    assert fewer.returncode == 2 and "Traceback" not in said, said
    assert "config error: the population this run started with has 3 members" in said
    proc = run_mpi(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir), "--resume"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = read_lines(run_dir / "journal.jsonl")
    opens = [i for i, x in enumerate(lines) if x.get("event") == "open"]
    assert len(opens) == 2
    resumed = [x["round"] for x in lines[opens[1]:] if x.get("event") == "pbt_round"]
    assert resumed == list(range(before[-1] + 1, 7)), (before, resumed)   # no round trained twice
    lineage = pd.read_csv(run_dir / "pbt.csv")
    assert len(lineage) == 3 * 6
    assert not lineage.duplicated(["round", "id"]).any()
    assert sorted(lineage["round"].unique()) == list(range(1, 7))
    records = [x for x in lines if "event" not in x]
    assert len(records) == 3 and {r["status"] for r in records} == {"ok"}
    assert {r["epochs"] for r in records} == {6}
    assert "resume: the population continues after round" in proc.stdout + proc.stderr
    # the same population uninterrupted: every round after the kill scores as it did (each round
    # trains from its own seed; a resumed member trained its next round from its first one's)
    whole = tmp_path / "whole"
    assert run_mpi(4, ["-m", "ensemble.run", str(cfg), "--run-dir", str(whole)], timeout=240).returncode == 0
    uninterrupted = pd.read_csv(whole / "pbt.csv").sort_values(["round", "id"]).reset_index(drop=True)
    mine = lineage.sort_values(["round", "id"]).reset_index(drop=True)
    score = [c for c in mine.columns if c.startswith("val_")][0]
    np.testing.assert_allclose(mine[score], uninterrupted[score], rtol=1e-4)


MIXED = """
name = "pbtg"
mode = "pbt"
seed = 2
[data]
source = "digits"
[train]
batch_size = 64
[[architectures]]
name = "small"
layers = [{type = "Dense", units = 8, activation = "relu"}]
[[architectures]]
name = "wide"
layers = [{type = "Dense", units = 48, activation = "relu"}, {type = "Dropout", rate = 0.1}]
optimizer = "sgd"
[pbt]
round_epochs = 1
rounds = 3
hyperparameters = ["learning_rate", "dropout", "weight_decay", "momentum"]
ranges = {learning_rate = [1e-3, 3e-2], momentum = [0.5, 0.9]}
[runtime]
group_size = 2
"""


@pytest.mark.long                       # make test-long: kept out of make test's 12 minutes
def test_groups_of_two_take_a_copy_together_across_architectures(tmp_path):
    cfg = tmp_path / "pbtg.toml"
    cfg.write_text(MIXED)
    run_dir = tmp_path / "run"
    proc = run_mpi(5, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lineage = pd.read_csv(run_dir / "pbt.csv")
    assert len(lineage) == 2 * 3 and set(lineage["rank"]) == {1, 3}          # the two group leaders
    copies = lineage[lineage["copied_from"].notna()]
    assert len(copies) == 2                                                # after rounds 1 and 2
    for _, row in copies.iterrows():                                       # the receiver becomes its donor
        donor = lineage[(lineage["round"] == row["round"]) & (lineage["id"] == row["copied_from"])].iloc[0]
        after = lineage[(lineage["round"] == row["round"] + 1) & (lineage["id"] == row["id"])].iloc[0]
        assert after["arch"] == donor["arch"] and after["state_bytes"] == donor["state_bytes"]
    records = [x for x in read_lines(run_dir / "journal.jsonl") if "event" not in x]
    assert {r["status"] for r in records} == {"ok"} and len(records) == 2
