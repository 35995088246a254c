"""Streaming (``datafeed.streaming``) and node-local staging (``datafeed.staging``).

Rank 0's streaming preparation gives the in-memory path's split, targets and normalisation
without reading the features whole; a member's pipeline gives every training row once per
epoch (a bootstrap's rows as often as in memory), group ranks read disjoint chunks and take
the same number of steps, and the order depends on the seed only."""

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from datafeed import streaming
from datafeed.prepare import prepare_with_rows
from datafeed.readers import DataError
from datafeed.shards import close_files
from datafeed.splits import read_data
from datafeed.staging import stage_files, stage_root
from datafeed.streaming import Streamed, prepare_stream, stream_plan, will_stream
from ensemble.config import resolve_config

ARCH = [{"layers": [{"type": "Dense", "units": 4}]}]


def data_cfg(**kw):
    return resolve_config({"data": kw, "architectures": ARCH}).data


@pytest.fixture
def shards(tmp_path, monkeypatch):
    """5 HDF5 files of 40..56 rows, 6 features, 3 classes; chunks of 16 rows."""
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 16 * 6 * 4)
    rng = np.random.default_rng(0)
    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(5):
        x = (rng.normal(size=(40 + 4 * i, 6)) * [1, 2, 3, 4, 5, 6] + 7).astype(np.float32)
        with h5py.File(folder / f"s{i}.h5", "w") as f:
            f["x"], f["y"] = x, rng.integers(0, 3, len(x))
    return folder


def both(source, **kw):
    """(in-memory arrays, meta, rows), (streamed arrays, meta, rows) of one config."""
    data = data_cfg(source=str(source), stream=False, **kw)
    got = read_data(data)
    memory = prepare_with_rows(got.x, got.y, got.info, data, 0, got.rows)
    data = data_cfg(source=str(source), stream=True, **kw)
    plan = stream_plan(data)
    assert plan is not None
    return memory, prepare_stream(plan, data, 0)


@pytest.mark.parametrize("kw", [{}, {"normalize": "minmax", "reshape": [2, 3]}])
def test_streaming_prepares_the_in_memory_split_targets_and_normalisation(shards, kw):
    (arrays, meta, rows), (s_arrays, s_meta, s_rows) = both(shards, **kw)
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(rows[split], s_rows[split])
        np.testing.assert_array_equal(arrays[f"y_{split}"], s_arrays[f"y_{split}"])
        assert f"x_{split}" not in s_arrays                       # the features are never held whole
        feed = Streamed(s_meta, s_arrays)
        np.testing.assert_allclose(np.concatenate(list(feed.chunks(split))), arrays[f"x_{split}"], atol=1e-5)
    np.testing.assert_allclose(s_arrays["x_mean"], arrays["x_mean"], rtol=1e-6)
    np.testing.assert_allclose(s_arrays["x_scale"], arrays["x_scale"], rtol=1e-6)
    assert s_meta["input_shape"] == meta["input_shape"] and s_meta["sizes"] == meta["sizes"]
    assert s_meta["stream"]["files"] == sorted(str(p) for p in shards.iterdir())
    json.dumps(s_meta)                                            # data.json takes it as it is


def test_a_split_file_is_used_as_given_when_streaming(shards, tmp_path):
    n = 40 + 44 + 48 + 52 + 56
    np.savez(tmp_path / "split.npz", train=np.arange(0, n - 60), test=np.arange(n - 30, n))
    _, (_, meta, rows) = both(shards, split_file=str(tmp_path / "split.npz"))
    assert rows["test"].tolist() == list(range(n - 30, n)) and meta["val_drawn"]
    assert set(rows["train"]) | set(rows["val"]) == set(range(n - 60))


def test_auto_streams_what_exceeds_the_memory_share(shards):
    nbytes = (40 + 44 + 48 + 52 + 56) * 6 * 4
    small = data_cfg(source=str(shards), node_memory_gb=4 * nbytes / 1e9, memory_share=0.3)
    large = data_cfg(source=str(shards), node_memory_gb=2 * nbytes / 1e9, memory_share=0.3)
    assert stream_plan(small) is None and stream_plan(large) is not None
    assert will_stream(small, nbytes) is False and will_stream(large, nbytes) is True
    assert stream_plan(data_cfg(source="digits")) is None


def test_streaming_errors_name_the_setting(shards, tmp_path):
    with pytest.raises(DataError, match=r"`data\.stream = true`.*built-in"):
        stream_plan(data_cfg(source="digits", stream=True))
    with h5py.File(shards / "s2.h5", "a") as f:
        f["x"][3, 1] = np.nan
    data = data_cfg(source=str(shards), stream=True)
    with pytest.raises(DataError, match=r"s2\.h5.*NaN/inf"):
        prepare_stream(stream_plan(data), data, 0)


def test_a_test_source_streams_after_the_training_files_as_in_memory(shards, tmp_path):
    held = tmp_path / "held"
    held.mkdir()
    rng = np.random.default_rng(1)
    for i in range(2):
        with h5py.File(held / f"t{i}.h5", "w") as f:
            f["x"], f["y"] = rng.normal(size=(20 + i, 6)).astype(np.float32), rng.integers(0, 3, 20 + i)
    (arrays, meta, rows), (s_arrays, s_meta, s_rows) = both(shards, test_source=str(held))
    assert s_meta["split_from"] == "sources" and len(s_meta["stream"]["files"]) == 7
    n_train = 5 * 40 + 4 * (0 + 1 + 2 + 3 + 4)
    assert s_rows["test"].tolist() == list(range(n_train, n_train + 41))     # the test files' rows, after train's
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(rows[split], s_rows[split])
        np.testing.assert_array_equal(arrays[f"y_{split}"], s_arrays[f"y_{split}"])
    feed = Streamed(s_meta, s_arrays)
    np.testing.assert_allclose(np.concatenate(list(feed.chunks("test"))), arrays["x_test"], atol=1e-5)
    close_files()                                                 # the reader keeps HDF5 files open
    with h5py.File(held / "t1.h5", "w") as f:
        f["x"], f["y"] = np.zeros((5, 7), np.float32), np.zeros(5, np.int64)
    with pytest.raises(DataError, match=r"`data\.test_source` .*held.*t1\.h5.*shape \[7\]"):
        stream_plan(data_cfg(source=str(shards), stream=True, test_source=str(held)))
    np.savez(tmp_path / "t.npz", x=np.zeros((5, 6), np.float32), y=np.zeros(5, np.int64))
    with pytest.raises(DataError, match=r"`data\.test_source` .*t\.npz.* is npz, but `data\.source` is hdf5"):
        stream_plan(data_cfg(source=str(shards), stream=True, test_source=str(tmp_path / "t.npz")))
    x = rng.normal(size=(20, 6)).astype(np.float32)
    x[4, 2] = np.nan                              # a test file that no training row shares a chunk with
    with h5py.File(held / "t1.h5", "w") as f:
        f["x"], f["y"] = x, rng.integers(0, 3, 20)
    data = data_cfg(source=str(shards), stream=True, test_source=str(held))
    with pytest.raises(DataError, match=r"t1\.h5.* of `data\.test_source` holds NaN/inf"):
        prepare_stream(stream_plan(data), data, 0)


@pytest.mark.slow
def test_the_pipeline_gives_each_row_once_or_as_the_bootstrap_says_and_groups_read_disjoint_chunks(shards):
    (arrays, _, _), (s_arrays, s_meta, _) = both(shards)
    feed = Streamed(s_meta, s_arrays)
    x_train = arrays["x_train"]

    def rows_of(ds):
        return np.concatenate([b[0] for b in ds.as_numpy_iterator()])

    def key(x):                                                   # rows as sortable tuples
        return sorted(map(tuple, np.round(x, 4)))
    one = rows_of(feed.train_dataset(16, seed=5))
    assert key(one) == key(x_train)                               # every row once per epoch
    again = feed.train_dataset(16, seed=5)
    first, second = rows_of(again), rows_of(again)
    np.testing.assert_array_equal(first, one)                     # the seed fixes the order ...
    assert not np.array_equal(first, second)                      # ... which changes every epoch
    from datafeed.pipeline import member_indices
    boot = rows_of(feed.train_dataset(16, seed=5, bootstrap=True))
    assert key(boot) == key(x_train[member_indices(len(x_train), 5, True)])
    parts = [feed.train_dataset(16, seed=5, shard=(r, 2)) for r in range(2)]
    batches = [[b[0] for b in p.as_numpy_iterator()] for p in parts]
    assert len(batches[0]) == len(batches[1]) > 0                 # the same steps on every rank
    assert all(len(b) == 8 for bs in batches for b in bs)         # each its half of the global batch
    got = [set(map(tuple, np.round(np.concatenate(bs), 4))) for bs in batches]
    assert not got[0] & got[1] and got[0] | got[1] <= set(map(tuple, np.round(x_train, 4)))
    assert len(got[0] | got[1]) >= len(x_train) - 2 * 16 - 16     # at most a batch and a chunk dropped
    before = streaming.EVAL_BATCH
    streaming.EVAL_BATCH = 16                                     # validation in several batches, the last short
    try:
        val = feed.eval_dataset("val")
        served = [b[0] for b in val.as_numpy_iterator()]
    finally:
        streaming.EVAL_BATCH = before
    assert int(val.cardinality()) == len(served) > 1               # known: Keras never finds the end by running out
    np.testing.assert_allclose(np.concatenate(served), arrays["x_val"], atol=1e-5)


def test_staging_copies_once_per_node_and_reuses_the_copy(shards, tmp_path, monkeypatch):
    data = data_cfg(source=str(shards), stream=True)
    ss = stream_plan(data)
    moved = stage_files(ss, str(tmp_path / "local"))
    assert sorted(moved) == [s.path for s in ss.shards]
    for src, dst in moved.items():
        assert open(src, "rb").read() == open(dst, "rb").read()
    stamp = {p: os.stat(p).st_mtime_ns for p in moved.values()}
    assert stage_files(ss, str(tmp_path / "local")) == moved
    assert {p: os.stat(p).st_mtime_ns for p in moved.values()} == stamp   # not copied again
    monkeypatch.setenv("STAGE_HERE", str(tmp_path / "env"))
    assert stage_root("$STAGE_HERE", ss.source).parent == tmp_path / "env"
    monkeypatch.delenv("STAGE_HERE")
    with pytest.raises(DataError, match=r"`data\.stage_dir`.*unset environment variable"):
        stage_files(ss, "$STAGE_HERE/x")


def test_a_stale_lock_of_a_dead_process_is_taken_over(shards, tmp_path):
    ss = stream_plan(data_cfg(source=str(shards), stream=True))
    root = stage_root(str(tmp_path / "local"), ss.source)
    root.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket
    (root / "lock").write_text(f"{socket.gethostname()} {int(dead.stdout)}")
    moved = stage_files(ss, str(tmp_path / "local"))
    assert all(os.path.exists(p) for p in moved.values()) and not (root / "lock").exists()


@pytest.mark.parametrize("fmt", ["npz", "npy", "parquet"])
def test_every_shard_format_streams_the_in_memory_rows(tmp_path, monkeypatch, fmt):
    import pandas as pd
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 8 * 5 * 4)
    rng = np.random.default_rng(2)
    for i in range(3):
        x, y = rng.normal(size=(30 + i, 5)).astype(np.float32), rng.integers(0, 2, 30 + i)
        if fmt == "npz":
            np.savez(tmp_path / f"s{i}.npz", x=x, y=y)
        elif fmt == "npy":
            np.save(tmp_path / f"x_{i}.npy", x)
            np.save(tmp_path / f"y_{i}.npy", y)
        else:
            frame = pd.DataFrame(x, columns=list("abcde"))
            frame["label"] = y
            frame.to_parquet(tmp_path / f"s{i}.parquet", row_group_size=7)
    (arrays, _, rows), (s_arrays, s_meta, s_rows) = both(tmp_path)
    feed = Streamed(s_meta, s_arrays)
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(rows[split], s_rows[split])
        np.testing.assert_allclose(np.concatenate(list(feed.chunks(split))), arrays[f"x_{split}"], atol=1e-5)
    assert len(feed.table) == 3 if fmt == "npz" else len(feed.table) > 3   # an .npz whole; else in chunks


def test_packed_members_and_a_population_cannot_read_streams():
    from ensemble.config import ConfigError
    from ensemble.orchestrate.prepare import check_streaming
    check_streaming(resolve_config({"architectures": ARCH}))                          # one by one: fine
    packed = resolve_config({"architectures": ARCH, "runtime": {"members_per_rank": 2}})
    with pytest.raises(ConfigError, match=r"`runtime\.members_per_rank`"):
        check_streaming(packed)
    with pytest.raises(ConfigError, match=r"mode \"pbt\" read it from memory.*`data\.stream = false`"):
        check_streaming(resolve_config({"architectures": ARCH, "mode": "pbt"}))
    with pytest.raises(ConfigError, match=r"trainer cannot read"):
        check_streaming(resolve_config({"architectures": ARCH, "runtime": {"trainer": "mymod:make"}}))
