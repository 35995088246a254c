"""User builders at -n 2: a builder that forgets the softmax fails before any
member trains, with the whole message; a builder module beside the config file is imported
on every rank from any working directory; the split is saved as row indices."""

from __future__ import annotations

import json
import re
import textwrap

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

from ensemble.results.rundir import RunDirectory
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi


def test_a_logits_builder_fails_before_training_with_the_whole_message(tmp_path):
    cfg = tmp_path / "logits.toml"
    cfg.write_text(textwrap.dedent("""
        [data]
        source = "digits"
        [train]
        epochs = 300                 # 4 members x 300 epochs: minutes of training if it ever started
        patience = 300
        [[architectures]]
        name = "forgot_softmax"
        members = 4
        model = "tests.mpi.user_models:logits_mlp"
    """))
    proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(tmp_path / "run")], timeout=120)
    assert proc.returncode == 2, proc.stderr                     # a config error, as the config check's
    line = [x for x in proc.stderr.splitlines() if "must output class probabilities" in x]
    assert len(line) == 1, proc.stderr                           # said once, by rank 0
    assert line[0].startswith(f"config error in {cfg}: `architectures[0]` (forgot_softmax): "
                              "`model` 'tests.mpi.user_models:logits_mlp' must output class probabilities")
    assert line[0].endswith('end the model with a softmax, e.g. keras.layers.Dense(10, activation="softmax")')
    assert not re.search(r"\[\d+/4\]", proc.stdout), proc.stdout   # no member's progress line: none trained
    assert not (tmp_path / "run" / "journal.jsonl").exists()     # no member was handed out


def test_builder_beside_the_config_and_the_saved_split(tmp_path):
    """The builder's module lies only beside the config and the job starts elsewhere: the
    worker imports it too (its member trains). splits.npz indexes the CSV's rows: the test
    targets the ensemble was scored on are y[splits["test"]]."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    d = load_digits()
    frame = pd.DataFrame(d.data, columns=[f"px{i}" for i in range(64)])
    frame.insert(0, "digit", d.target)
    frame.to_csv(project / "digits.csv", index=False)
    (project / "beside_config_models.py").write_text(textwrap.dedent("""
        def mlp(input_shape, n_outputs, units=16):
            import keras
            inputs = keras.Input(shape=input_shape)
            hidden = keras.layers.Dense(units, activation="relu")(inputs)
            return keras.Model(inputs, keras.layers.Dense(n_outputs, activation="softmax")(hidden))
    """))
    cfg = project / "c.toml"
    cfg.write_text(textwrap.dedent("""
        [data]
        source = "digits.csv"
        label = "digit"
        [train]
        epochs = 2
        [[architectures]]
        members = 2
        model = "beside_config_models:mlp"
        params = {units = 8}
    """))
    run_dir = tmp_path / "run"
    proc = run_mpi(2, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], cwd=elsewhere, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(x) for x in (run_dir / "journal.jsonl").read_text().splitlines() if '"event"' not in x]
    assert [r["status"] for r in records] == ["ok", "ok"] and {r["rank"] for r in records} == {1}

    splits = RunDirectory(run_dir).load_splits()
    assert all(s.dtype == np.int64 for s in splits.values())
    rows = np.concatenate([splits["train"], splits["val"], splits["test"]])
    np.testing.assert_array_equal(np.sort(rows), np.arange(len(frame)))        # disjoint, every row once
    sizes = json.loads((run_dir / "data.json").read_text())["sizes"]
    assert {k: len(v) for k, v in splits.items()} == sizes
    with np.load(run_dir / "ensemble_test_predictions.npz") as preds:
        np.testing.assert_array_equal(preds["y"], frame["digit"].to_numpy()[splits["test"]])
