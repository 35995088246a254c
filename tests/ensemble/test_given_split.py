"""A run with its own split: rank 0's preparation records exactly the given rows in
splits.npz (and how they were given, in data.json), every later reader (``run_arrays`` for
predict's ``--data test`` and reselect, ``run_split`` for ``ensemble.load(run).data``) reads
those rows again, and ``--check`` reports the split or its problems. No MPI; one end-to-end
run in a subprocess (TensorFlow), marked slow."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from datafeed.prepare import fit_normalizer
from ensemble.config import locate, resolve_config
from ensemble.inference.load import run_arrays, run_split
from ensemble.orchestrate.check import EXIT_PROBLEMS, check_main
from ensemble.orchestrate.prepare import prepare_run
from ensemble.results.rundir import RunDirectory

ROOT = Path(__file__).resolve().parents[2]
N = 60


@pytest.fixture
def table() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(rng.normal(size=(N, 3)) * [1, 10, 100], columns=["a", "b", "c"])
    frame["label"] = np.array(["x", "y", "z"])[np.arange(N) % 3]
    return frame


def ways(tmp_path: Path, table: pd.DataFrame) -> dict[str, tuple[dict, dict, pd.DataFrame]]:
    """Each way of giving a split: its [data] settings, the rows it gives in the data as
    the run reads it (val None: drawn from train), and that data."""
    test = np.array([5, 11, 23, 42, 47, 50, 58])
    val = np.array([1, 2, 30, 31, 32])
    part = np.full(N, "train", dtype=object)
    part[test], part[val] = "test", "validation"
    table.assign(part=part).to_csv(tmp_path / "column.csv", index=False)
    table.to_csv(tmp_path / "all.csv", index=False)
    np.savez(tmp_path / "split.npz", train=np.setdiff1d(np.arange(N), test), test=test)
    table.iloc[:45].to_csv(tmp_path / "train.csv", index=False)
    table.iloc[45:].to_csv(tmp_path / "test.csv", index=False)
    train = np.setdiff1d(np.arange(N), np.concatenate([test, val]))
    return {
        "column": ({"source": "column.csv", "split_column": "part"}, {"train": train, "val": val, "test": test},
                   table),
        "indices": ({"source": "all.csv", "split_file": "split.npz"},
                    {"train": np.setdiff1d(np.arange(N), test), "val": None, "test": test}, table),
        "sources": ({"source": "train.csv", "test_source": "test.csv"},
                    {"train": np.arange(45), "val": None, "test": np.arange(45, N)}, table),
    }


def config(tmp_path: Path, data: dict):
    raw = {"name": "given", "output_dir": str(tmp_path / "runs"), "data": {**data, "label": "label"},
           "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]}
    return locate(resolve_config(raw), tmp_path)


@pytest.mark.parametrize("way", ["column", "indices", "sources"])
def test_the_run_records_the_given_rows_and_every_later_reader_reads_them(tmp_path, table, way):
    data, given, frame = ways(tmp_path, table)[way]
    cfg = config(tmp_path, data)
    args = argparse.Namespace(run_dir=str(tmp_path / "run"), resume=False, overwrite=False)
    arrays, meta, rd, lock = prepare_run(cfg, args)
    lock.release()
    run_dir = rd.path
    splits = np.load(run_dir / RunDirectory.SPLITS)
    assert str(splits["split_from"]) == way and meta["split_from"] == way
    assert json.loads((run_dir / RunDirectory.DATA).read_text())["split_from"] == way
    assert splits["test"].tolist() == given["test"].tolist()
    if given["val"] is None:                                      # drawn from the given train rows only
        assert meta["val_drawn"] and len(splits["val"]) > 0
        assert sorted([*splits["train"], *splits["val"]]) == given["train"].tolist()
    else:
        assert splits["val"].tolist() == given["val"].tolist()
        assert splits["train"].tolist() == given["train"].tolist()
    x_test, y_test = run_split(run_dir, cfg, meta, "test")        # ensemble.load(run).data("test")
    assert np.allclose(x_test, frame[["a", "b", "c"]].to_numpy()[given["test"]])
    assert y_test.tolist() == frame["label"].to_numpy()[given["test"]].tolist()
    again = run_arrays(run_dir, cfg, meta)                        # predict --data test, reselect
    for key in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        assert np.array_equal(again[key], arrays[key]), key
    assert np.array_equal(arrays["y_test"], np.unique(frame["label"], return_inverse=True)[1][given["test"]])


@pytest.mark.parametrize("way", ["drawn", "indices"])
def test_a_resumed_run_keeps_the_split_it_was_made_with(tmp_path, table, way):
    """A resume reads the run's own splits.npz, not a split drawn again: a run made by a
    version that drew its splits another way (here: rows moved between its splits) resumes
    on its own rows, and the data a changed file no longer fits is refused, not re-split."""
    files = ways(tmp_path, table)
    data = {"source": "all.csv"} if way == "drawn" else files[way][0]
    cfg = config(tmp_path, data)
    args = argparse.Namespace(run_dir=str(tmp_path / "run"), resume=False, overwrite=False)
    _, meta, rd, lock = prepare_run(cfg, args)
    lock.release()
    (rd.path / rd.JOURNAL).touch()                                # members were trained: a journal
    made = rd.load_splits()
    swap_out, swap_in = made["train"][:2], made["test"][:2]      # another draw of the same sizes
    other = {"train": np.sort([*made["train"][2:], *swap_in]), "val": made["val"],
             "test": np.sort([*made["test"][2:], *swap_out])}
    rd.write_npz(rd.SPLITS, **other, split_from=np.array(meta["split_from"]))
    rd.save_normalization(                                          # and normalised on its own training rows
        *fit_normalizer(table[["a", "b", "c"]].to_numpy()[other["train"]], "standard"))
    arrays, again, rd, lock = prepare_run(cfg, argparse.Namespace(run_dir=str(rd.path), resume=True,
                                                                   overwrite=False))
    lock.release()
    assert {k: v.tolist() for k, v in rd.load_splits().items()} == {k: v.tolist() for k, v in other.items()}
    codes = np.unique(table["label"], return_inverse=True)[1]
    assert arrays["y_test"].tolist() == codes[other["test"]].tolist()
    assert again["val_drawn"] == meta["val_drawn"] and again["sizes"] == meta["sizes"]
    table.iloc[:N // 2].to_csv(tmp_path / "all.csv", index=False)       # not the data the run was made on
    with pytest.raises(ValueError, match="has 30 rows"):
        prepare_run(cfg, argparse.Namespace(run_dir=str(rd.path), resume=True, overwrite=False))
    table.iloc[::-1].to_csv(tmp_path / "all.csv", index=False)      # the same rows, in another order
    with pytest.raises(ValueError, match="--resume: the data .* is not what the run was trained on: its training "
                                         "rows normalise otherwise"):
        prepare_run(cfg, argparse.Namespace(run_dir=str(rd.path), resume=True, overwrite=False))
    table.to_csv(tmp_path / "all.csv", index=False)                 # the refused resume left no lock behind
    prepare_run(cfg, argparse.Namespace(run_dir=str(rd.path), resume=False, overwrite=True))[3].release()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(textwrap.dedent(text))
    return path


REHEARSAL = """
    [runtime]
    trainer = "rehearsal"
    [[architectures]]
    layers = [{type = "Dense", units = 4}]
"""


def test_check_says_how_the_split_is_given_and_reports_its_problems(tmp_path, table, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "-1"))
    ways(tmp_path, table)
    good = write(tmp_path, '[data]\nsource = "column.csv"\nsplit_column = "part"\n' + textwrap.dedent(REHEARSAL))
    assert check_main(str(good)) == 0
    out = capsys.readouterr().out
    assert "splits: train 48, validation 5, test 7, given by column 'part' (`data.split_column`)" in out
    np.savez(tmp_path / "split.npz", train=np.arange(40), test=np.arange(30, 60))
    bad = write(tmp_path, '[data]\nsource = "all.csv"\nsplit_file = "split.npz"\n' + textwrap.dedent(REHEARSAL))
    assert check_main(str(bad)) == EXIT_PROBLEMS
    out = capsys.readouterr().out
    assert "1 problem(s) found" in out and "`train` and `test` overlap in 10 row(s)" in out
    both = write(tmp_path, '[data]\nsource = "all.csv"\nsplit_file = "split.npz"\ntest_fraction = 0.2\n'
                 + textwrap.dedent(REHEARSAL))
    assert check_main(str(both)) == EXIT_PROBLEMS
    out = capsys.readouterr().out
    assert "`data.test_fraction` draws a random test split, but `data.split_file` gives the test rows" in out


END_TO_END = """
import json, sys
import numpy as np
import ensemble
from ensemble.inference.inputs import read_input
from ensemble.inference.load import load_run
cfg = {"name": "own", "data": {"source": "train.csv", "test_source": "test.csv", "label": "label"},
       "train": {"epochs": 1, "batch_size": 16},
       "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]}
ens = ensemble.run_config(cfg, overwrite=True)
x, y = ens.data("test")
splits = np.load(ens.path / "splits.npz")
_, y_test = read_input(load_run(ens.path), "test")             # predict --data test
with np.load(ens.path / "ensemble_test_predictions.npz") as f:
    scored = f["y"].tolist()
print("RESULT", json.dumps({"x": x.tolist(), "y": y.tolist(), "test": splits["test"].tolist(),
                            "split_from": str(splits["split_from"]), "predict_y": y_test.tolist(),
                            "scored_y": scored}))
"""


@pytest.mark.slow
def test_a_run_on_separate_files_trains_and_its_notebook_api_reads_the_test_file(tmp_path, table):
    ways(tmp_path, table)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": "-1"}
    proc = subprocess.run([sys.executable, "-c", END_TO_END], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.split("RESULT ", 1)[1])
    test = table.iloc[45:]
    assert got["split_from"] == "sources" and got["test"] == list(range(45, N))
    assert np.allclose(got["x"], test[["a", "b", "c"]].to_numpy()) and got["y"] == test["label"].tolist()
    codes = np.unique(table["label"], return_inverse=True)[1][45:].tolist()
    assert got["predict_y"] == codes and got["scored_y"] == codes
    assert "split given by separate files (`data.test_source`)" in proc.stdout + proc.stderr   # the start line


def test_the_data_rewritten_with_its_rows_in_another_order_is_refused_by_every_reader(tmp_path, table):
    """``ensemble.load(run).data("test")`` checked the row count only: the same samples written
    in another order gave the run's training rows as its test split, unsaid (``predict --data
    test`` refused them). Every reader now checks the normalisation too."""
    from ensemble.inference.load import PredictError
    table.to_csv(tmp_path / "all.csv", index=False)
    cfg = config(tmp_path, {"source": "all.csv"})
    args = argparse.Namespace(run_dir=str(tmp_path / "run"), resume=False, overwrite=False)
    _, meta, rd, lock = prepare_run(cfg, args)
    lock.release()
    x_test, _ = run_split(rd.path, cfg, meta, "test")
    assert np.allclose(x_test, table[["a", "b", "c"]].to_numpy()[np.load(rd.path / RunDirectory.SPLITS)["test"]])
    table.iloc[::-1].to_csv(tmp_path / "all.csv", index=False)                 # the same rows, reversed
    for read in (lambda: run_split(rd.path, cfg, meta, "test"), lambda: run_arrays(rd.path, cfg, meta)):
        with pytest.raises(PredictError, match="normalise otherwise than the run's normalization.npz says"):
            read()


def test_a_streamed_run_resumed_on_other_files_is_refused(tmp_path):
    """A shard added between a streamed run and its --resume: the resume said nothing, the
    split's row numbers pointed at other rows, and members trained before and after were
    scored on different rows and selected together (``predict --data test`` refused it)."""
    rng = np.random.default_rng(0)
    (tmp_path / "shards").mkdir()
    for i in range(4):
        x = rng.normal(size=(50, 3))
        np.savez(tmp_path / "shards" / f"part_{i:03d}.npz", x=x, y=x[:, 0] + 0.1 * rng.normal(size=50))
    cfg = config(tmp_path, {"source": "shards/*.npz", "stream": True, "label": ""})
    args = argparse.Namespace(run_dir=str(tmp_path / "run"), resume=False, overwrite=False)
    _, meta, rd, lock = prepare_run(cfg, args)
    lock.release()
    assert meta["stream"]["rows"] == [50] * 4
    (rd.path / rd.JOURNAL).touch()
    again = argparse.Namespace(run_dir=str(rd.path), resume=True, overwrite=False)
    prepare_run(cfg, again)[3].release()                               # the same files: resumed
    x = rng.normal(size=(50, 3))
    np.savez(tmp_path / "shards" / "part_001b.npz", x=x, y=x[:, 0])
    with pytest.raises(ValueError, match=r"--resume: .* its files are not the same \(5 files of 250 rows now, "
                                         r"4 files of 200 rows then\)"):
        prepare_run(cfg, again)
