"""Predicting on a streamed run's own test rows (given by ``data.test_source``):
``ensemble predict RUN --data test`` and the notebook's ``data``/``data_batches``/
``predict_split`` read the files a chunk at a time (never the whole data), write the
predictions as they come, and give the metrics ``ensemble.json`` recorded; under
``mpiexec -n 2`` the same file. ``PredictionWriter`` writes, batch by batch, what
``write_predictions`` writes whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

from ensemble.config import resolve_config
from ensemble.inference.load import EnsembleRun, Member
from ensemble.inference.outputs import PredictionWriter, write_predictions
from ensemble.inference.streamed import concat_results
from tests.conftest import run_mpi

ROOT = Path(__file__).resolve().parents[2]


def tiny_run(task: str) -> EnsembleRun:
    cfg = resolve_config({"architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})
    meta = {"task": task, "n_outputs": 3 if task == "classification" else 1, "input_shape": [2],
            "class_names": ["a", "bb", "c"] if task == "classification" else []}
    return EnsembleRun("run", cfg, meta, (Member("m", 1.0, "m.keras"),), np.zeros(2, np.float32),
                       np.ones(2, np.float32), {})


def result_of(task: str, n: int, rng) -> dict:
    if task == "classification":
        p = rng.dirichlet(np.ones(3), size=n)
        return {"proba": p, "total": rng.random(n), "aleatoric": rng.random(n), "epistemic": rng.random(n)}
    mean, std = rng.normal(size=n), rng.random(n) + 0.1
    return {"mean": mean, "var": std ** 2, "std": std, "aleatoric": std ** 2 / 2, "epistemic": std ** 2 / 2,
            "intervals": {"50": 0.67 * std, "90": 1.64 * std}}


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".npz"])
def test_the_writer_writes_batch_by_batch_what_is_written_whole(tmp_path, task, suffix):
    rng = np.random.default_rng(0)
    run = tiny_run(task)
    parts = [result_of(task, n, rng) for n in (5, 7, 3)]
    ys = [rng.integers(0, 3, len(p[next(iter(p))])) for p in parts]
    writer = PredictionWriter(tmp_path / f"batches{suffix}", run, 15)
    for part, y in zip(parts, ys):
        writer.write(part, y)
    assert not (tmp_path / f"batches{suffix}").exists()          # whole or not at all
    writer.close()
    write_predictions(tmp_path / f"whole{suffix}", run, concat_results(parts), np.concatenate(ys))
    if suffix == ".npz":
        with np.load(tmp_path / f"batches{suffix}") as a, np.load(tmp_path / f"whole{suffix}") as b:
            assert sorted(a.files) == sorted(b.files)
            for k in a.files:
                np.testing.assert_array_equal(a[k], b[k])
    else:
        read = pd.read_csv if suffix == ".csv" else pd.read_parquet
        pd.testing.assert_frame_equal(read(tmp_path / f"batches{suffix}"), read(tmp_path / f"whole{suffix}"))
    short = PredictionWriter(tmp_path / f"short{suffix}", run, 16)
    short.write(parts[0], ys[0])
    with pytest.raises(ValueError, match="5 rows written, 16 expected"):
        short.close()
    assert not list(tmp_path.glob("short*"))                     # nothing left behind


SCRIPT = """
import json, sys
import numpy as np
import ensemble
import datafeed.shards, datafeed.splits, datafeed.streaming
from ensemble.predict import main
cfg = {"name": "streamed", "seed": 2, "data": {"source": "shards", "test_source": "held", "stream": True},
       "train": {"epochs": 2, "batch_size": 64},
       "architectures": [{"members": 2, "layers": [{"type": "Dense", "units": 16, "activation": "relu"}]}]}
ens = ensemble.run_config(cfg, overwrite=True)
glob_code = main([str(ens.path), "--data", "held/*.h5", "--out", "glob.npz"])   # a glob, as data.source takes

def whole(*args, **kw):
    raise AssertionError("the whole dataset was read")
datafeed.splits.read_data = whole
datafeed.shards.read_all = whole
reads = []
read_rows = datafeed.streaming.read_rows
def spy(ss, i, start, stop, want_x=True, want_y=True):
    if want_x:
        reads.append(stop - start)
    return read_rows(ss, i, start, stop, want_x, want_y)
datafeed.streaming.read_rows = spy
code = main([str(ens.path), "--data", "test", "--out", "cli.npz"])
metrics = ens.predict_split("test", out="api.csv")
x, y = ens.data("test")
batches = list(ens.data_batches("test"))
import dataclasses
small = ens.config.replace(data=ens.config.data.replace(node_memory_gb=1e-4))   # 100 kB: the split would not fit
ens._run = dataclasses.replace(ens._run, config=small)
try:
    ens.data("test")
    refused = ""
except ValueError as exc:
    refused = str(exc)
print("RESULT", json.dumps({"refused": refused, "glob_code": glob_code,
    "code": code, "reads": reads, "metrics": metrics, "recorded": ens.metrics, "path": str(ens.path),
    "x": x.tolist(), "y": y.tolist(), "batches": len(batches),
    "same": bool(np.array_equal(np.concatenate([b[0] for b in batches]), x))}))
"""


@pytest.fixture
def shards(tmp_path):
    d = load_digits()
    for name in ("shards", "held"):
        (tmp_path / name).mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(d.target)), 6)):   # the last two: the test rows
        with h5py.File(tmp_path / ("held" if i >= 4 else "shards") / f"digits{i}.h5", "w") as f:
            f["x"], f["y"] = d.data[part].astype(np.float32), d.target[part]
    return d


@pytest.mark.slow
@pytest.mark.mpi
def test_a_streamed_runs_test_rows_are_predicted_a_chunk_at_a_time(tmp_path, shards):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": "-1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.split("RESULT ", 1)[1])
    run = tmp_path / got["path"]                                 # relative to its working directory
    test = np.load(run / "splits.npz")["test"]
    assert test.tolist() == list(range(1199, 1797))               # data.test_source's rows, after the training files'
    assert got["code"] == 0 and "read a chunk at a time" in proc.stdout + proc.stderr
    assert max(got["reads"]) <= 300 < len(shards.target)         # a file's rows at most, never the whole
    np.testing.assert_array_equal(got["x"], shards.data[test])   # data("test"): the rows splits.npz records
    assert got["y"] == shards.target[test].tolist()
    assert got["batches"] > 1 and got["same"]
    assert "more than `data.memory_share`" in got["refused"] and "data_batches('test')" in got["refused"]
    for key, value in got["recorded"].items():                   # what ensemble.json recorded for the test split
        assert got["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    with np.load(tmp_path / "cli.npz") as cli:
        assert cli["proba"].shape == (len(test), 10)
        assert cli["target"].tolist() == [str(v) for v in shards.target[test]]
        api = pd.read_csv(tmp_path / "api.csv")
        np.testing.assert_allclose(api[[f"p_{c}" for c in range(10)]].to_numpy(), cli["proba"], atol=1e-6)
        proc = run_mpi(2, ["-m", "ensemble.predict", str(run), "--data", "test", "--out", str(tmp_path / "two.npz")],
                       timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with np.load(tmp_path / "two.npz") as two:
            np.testing.assert_allclose(two["proba"], cli["proba"], atol=1e-6)
        assert got["glob_code"] == 0
        with np.load(tmp_path / "glob.npz") as glob:
            np.testing.assert_allclose(glob["proba"], cli["proba"], atol=1e-6)


def test_a_streamed_runs_targets_come_back_without_reading_a_feature(tmp_path, shards, monkeypatch):
    import argparse

    import datafeed.shards
    import datafeed.splits
    from ensemble.config import locate
    from ensemble.inference.load import PredictError, run_arrays
    from ensemble.orchestrate.prepare import prepare_run
    raw = {"name": "s", "output_dir": str(tmp_path / "runs"),
           "data": {"source": "shards", "test_source": "held", "stream": True},
           "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]}
    cfg = locate(resolve_config(raw), tmp_path)
    arrays, meta, rd, lock = prepare_run(cfg, argparse.Namespace(run_dir=str(tmp_path / "run"), resume=False,
                                                                 overwrite=False))
    lock.release()

    def whole(*args, **kw):
        raise AssertionError("the whole dataset was read")
    monkeypatch.setattr(datafeed.splits, "read_data", whole)
    monkeypatch.setattr(datafeed.shards, "read_all", whole)
    again = run_arrays(rd.path, cfg, meta)                        # what reselect reads
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(again[f"y_{split}"], arrays[f"y_{split}"])
        assert not any(k.startswith("x_") and k not in ("x_mean", "x_scale") for k in again)
    np.testing.assert_array_equal(again["x_mean"], arrays["x_mean"])
    (tmp_path / "held" / "digits5.h5").unlink()                  # not the data the run trained on
    with pytest.raises(PredictError, match=r"not what the run trained on \(5 files of 1498 rows now, 6 of 1797 then\)"):
        run_arrays(rd.path, cfg, meta)
