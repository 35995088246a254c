"""Runs on a folder of shards: in memory and streamed (staged node-locally), the streamed
run's metrics within tolerance of the in-memory run's for the same seed, a data-parallel
group of 2 reading disjoint chunks within tolerance of a group of 1, and every data mistake
of issue 33 (a shard of another shape, an unreadable file, an empty glob, overlapping splits,
a missing split) failing every rank promptly, before any training, with the file and the
setting named once by rank 0."""

from __future__ import annotations

import json
import textwrap

import h5py
import numpy as np
import pytest
from sklearn.datasets import load_digits

from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

CONFIG = """
seed = 3
[data]
source = "shards"
stream = STREAM
stage_dir = "STAGE"
[train]
epochs = 6
batch_size = 64
[[architectures]]
members = 2
layers = [{type = "Dense", units = 16, activation = "relu"}]
[runtime]
group_size = GROUP
"""


@pytest.fixture
def shards(tmp_path):
    d = load_digits()
    folder = tmp_path / "shards"
    folder.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(d.target)), 6)):
        with h5py.File(folder / f"digits{i}.h5", "w") as f:
            f["x"], f["y"] = d.data[part].astype(np.float32), d.target[part]
    return folder


def run(tmp_path, n, name, stream="true", group=1, stage=""):
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(textwrap.dedent(CONFIG).replace("STREAM", stream).replace("GROUP", str(group))
                   .replace("STAGE", stage))
    run_dir = tmp_path / name
    proc = run_mpi(n, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=400)
    return run_dir, proc


def members(run_dir):
    lines = [json.loads(x) for x in (run_dir / "journal.jsonl").read_text().splitlines()]
    return {r["id"]: r for r in lines if r.get("status") == "ok" and "val" in r}


@pytest.mark.long
@pytest.mark.slow
def test_a_streamed_run_on_shards_matches_the_in_memory_run(tmp_path, shards):
    stage = tmp_path / "node-local"
    streamed, proc = run(tmp_path, 3, "streamed", "true", stage=str(stage))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    memory, proc = run(tmp_path, 3, "memory", "false")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = json.loads((streamed / "data.json").read_text())
    assert len(meta["stream"]["files"]) == 6 and "stream" not in json.loads((memory / "data.json").read_text())
    with np.load(streamed / "splits.npz") as a, np.load(memory / "splits.npz") as b:
        for split in ("train", "val", "test"):
            np.testing.assert_array_equal(a[split], b[split])
    staged = [p.name for p in next(stage.iterdir()).iterdir()]
    assert len([n for n in staged if n.endswith(".h5")]) == 6 and "done.json" in staged
    got, want = members(streamed), members(memory)
    assert len(got) == len(want) == 2
    for mid, rec in got.items():                      # another batch order, the same rows and seed
        assert rec["val"]["log_loss"] == pytest.approx(want[mid]["val"]["log_loss"], rel=0.05)
        assert rec["test"]["accuracy"] == pytest.approx(want[mid]["test"]["accuracy"], abs=0.06)
    assert json.loads((streamed / "ensemble.json").read_text())["ensemble"]["test"]["accuracy"] > 0.5


@pytest.mark.long
@pytest.mark.slow
def test_a_group_of_two_reading_disjoint_chunks_matches_a_group_of_one_and_ranks_change_nothing(tmp_path, shards):
    grouped, proc = run(tmp_path, 3, "grouped", group=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    single, proc = run(tmp_path, 2, "single", group=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got, want = members(grouped), members(single)
    assert len(got) == len(want) == 2
    for mid, rec in got.items():
        assert rec["val"]["log_loss"] == pytest.approx(want[mid]["val"]["log_loss"], rel=0.05)
        assert rec["test"]["accuracy"] == pytest.approx(want[mid]["test"]["accuracy"], abs=0.06)
    wider, proc = run(tmp_path, 3, "wider", group=1)        # the same seed on more ranks: the same members
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for mid, rec in members(wider).items():
        assert rec["val"] == want[mid]["val"] and rec["epochs"] == want[mid]["epochs"]


def test_a_shard_with_another_shape_stops_every_rank_before_training(tmp_path, shards):
    with h5py.File(shards / "digits4.h5", "w") as f:
        f["x"], f["y"] = np.zeros((10, 63), np.float32), np.zeros(10, np.int64)
    run_dir, proc = run(tmp_path, 3, "bad")
    assert proc.returncode != 0
    assert "digits4.h5" in proc.stderr and "`data.x`" in proc.stderr and "[63]" in proc.stderr
    assert not (run_dir / "journal.jsonl").exists()


def broken(tmp_path, shards, kind):
    """The config's extra [data] lines and the words the error must hold, for each mistake."""
    if kind == "unreadable file":
        (shards / "digits2.h5").write_bytes(b"not an HDF5 file")
        return "", ["digits2.h5", "`data.source`", "cannot be read as hdf5"]
    if kind == "empty glob":
        return "", ["`data.source`", "matches no files"]
    if kind == "overlapping splits":
        np.savez(tmp_path / "split.npz", train=np.arange(1000), test=np.arange(990, 1200))
        return f'split_file = "{tmp_path / "split.npz"}"\n', ["split.npz", "`data.split_file`",
                                                             "`train` and `test` overlap in 10 row(s)"]
    np.savez(tmp_path / "split.npz", train=np.arange(1000))          # a missing split: no test rows
    return f'split_file = "{tmp_path / "split.npz"}"\n', ["split.npz", "`data.split_file`",
                                                         "must hold `train` and `test`"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["unreadable file", "empty glob", "overlapping splits", "missing split"])
def test_each_data_mistake_stops_every_rank_before_training_naming_the_file_and_setting(tmp_path, shards, kind):
    extra, words = broken(tmp_path, shards, kind)
    source = "shards/*.nc" if kind == "empty glob" else "shards"
    cfg = tmp_path / "bad.toml"
    cfg.write_text(textwrap.dedent(CONFIG).replace("STREAM", "true").replace("GROUP", "1").replace("STAGE", "")
                   .replace('source = "shards"', f'source = "{source}"\n{extra}'))
    run_dir = tmp_path / "bad"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr              # every rank: exit 3, no hang
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)
    assert proc.stderr.count("data error:") == 1, proc.stderr           # said once, by rank 0
    assert not (run_dir / "journal.jsonl").exists()
