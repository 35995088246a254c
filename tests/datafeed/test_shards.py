"""Many files as one dataset (``datafeed.shards``): a folder or a glob of npz/npy/HDF5/Parquet
shards reads as the files' rows in sorted order; one sample per file is detected; and each
mistake (another sample shape, another dtype, an empty glob, an unreadable file) is one
message naming the file and the setting. No TensorFlow."""

import h5py
import numpy as np
import pandas as pd
import pytest

from datafeed.readers import DataError, read_dataset
from datafeed.shards import scan
from datafeed.splits import read_data
from ensemble.config import resolve_config

ARCH = [{"layers": [{"type": "Dense", "units": 4}]}]


def data_cfg(**kw):
    return resolve_config({"data": kw, "architectures": ARCH}).data


def blocks(n_files=3, rows=7, shape=(4,), seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(rows + i, *shape)).astype(np.float32), rng.integers(0, 3, rows + i))
            for i in range(n_files)]


def write(tmp_path, fmt, parts):
    for i, (x, y) in enumerate(parts):
        if fmt == "npz":
            np.savez(tmp_path / f"s{i:03d}.npz", x=x, y=y)
        elif fmt == "npy":
            np.save(tmp_path / f"x_{i:03d}.npy", x)
            np.save(tmp_path / f"y_{i:03d}.npy", y)
        elif fmt == "hdf5":
            with h5py.File(tmp_path / f"s{i:03d}.h5", "w") as f:
                f["x"], f["y"] = x, y
        else:
            frame = pd.DataFrame(x.reshape(len(x), -1), columns=[f"f{j}" for j in range(x[0].size)])
            frame["label"] = y
            frame.to_parquet(tmp_path / f"s{i:03d}.parquet", row_group_size=3)


@pytest.mark.parametrize("fmt", ["npz", "npy", "hdf5", "parquet"])
def test_a_folder_of_shards_reads_as_their_rows_in_order(tmp_path, fmt):
    parts = blocks()
    write(tmp_path, fmt, parts)
    x, y, info = read_dataset(data_cfg(source=str(tmp_path)))
    np.testing.assert_array_equal(x, np.concatenate([p[0] for p in parts]))
    np.testing.assert_array_equal(y, np.concatenate([p[1] for p in parts]))
    assert info["files"] == 3
    ss = scan(data_cfg(source=str(tmp_path)))
    assert ss.rows == 7 + 8 + 9 and ss.sample_shape == (4,) and list(ss.starts) == [0, 7, 15, 24]


def test_a_glob_selects_its_files_and_netcdf_reads_as_hdf5(tmp_path):
    parts = blocks(4)
    for i, (x, y) in enumerate(parts):
        with h5py.File(tmp_path / f"run{i}.nc", "w") as f:
            f["fields/x"], f["y"] = x, y
    x, y, _ = read_dataset(data_cfg(source=str(tmp_path / "run[12].nc"), x="/fields/x"))
    np.testing.assert_array_equal(x, np.concatenate([parts[1][0], parts[2][0]]))
    np.testing.assert_array_equal(y, np.concatenate([parts[1][1], parts[2][1]]))


def test_one_sample_per_file_is_detected_from_a_scalar_target(tmp_path):
    rng = np.random.default_rng(1)
    vols = rng.normal(size=(12, 4, 4, 4)).astype(np.float32)
    for i, v in enumerate(vols):
        with h5py.File(tmp_path / f"vol{i:02d}.h5", "w") as f:
            f["x"], f["y"] = v, float(i) / 3
    got = read_data(data_cfg(source=str(tmp_path / "*.h5")))
    assert got.x.shape == (12, 4, 4, 4)
    np.testing.assert_array_equal(got.x, vols)
    np.testing.assert_allclose(got.y, np.arange(12) / 3)


def test_threads_reading_one_sample_files_never_read_a_file_another_closed(tmp_path):
    """A streamed folder of one-sample HDF5 files, validation read by 4 threads at once: a file the
    open-file cache evicted was closed under another thread's read, and members failed with h5py's
    "invalid identifier type" in 2 of 3 runs."""
    from concurrent.futures import ThreadPoolExecutor

    from datafeed.shards import OPEN_FILES, close_files, read_rows
    rng = np.random.default_rng(2)
    vols = rng.normal(size=(6 * OPEN_FILES, 4, 4, 4)).astype(np.float32)
    for i, v in enumerate(vols):
        with h5py.File(tmp_path / f"v{i:03d}.h5", "w") as f:
            f["x"], f["y"] = v, float(i)
    ss = scan(data_cfg(source=str(tmp_path / "*.h5")))
    assert ss.per_sample

    def read(i):
        x, y = read_rows(ss, i % len(vols), 0, 1)
        return i % len(vols), x, y
    try:
        with ThreadPoolExecutor(8) as pool:
            for i, x, y in pool.map(read, range(20 * len(vols))):
                np.testing.assert_array_equal(x[0], vols[i])
                assert y[0] == float(i)
    finally:
        close_files()


def test_a_split_column_over_parquet_shards(tmp_path):
    parts = blocks(2, rows=10)
    for i, (x, y) in enumerate(parts):
        frame = pd.DataFrame(x, columns=list("abcd"))
        frame["label"], frame["part"] = y, (["train"] * 7 + ["test"] * 3 + ["train"] * i)
        frame.to_parquet(tmp_path / f"p{i}.parquet")
    got = read_data(data_cfg(source=str(tmp_path), split_column="part"))
    assert got.x.shape == (21, 4)
    assert got.rows["test"].tolist() == [7, 8, 9, 17, 18, 19]


def test_a_shard_with_another_sample_shape_is_named(tmp_path):
    parts = blocks(3)
    parts[2] = (np.zeros((5, 5), np.float32), np.zeros(5, np.int64))
    write(tmp_path, "hdf5", parts)
    with pytest.raises(DataError, match=r"s002\.h5.*`data\.x`.*shape \[5\].*s000\.h5.*\[4\]"):
        read_dataset(data_cfg(source=str(tmp_path)))


def test_a_shard_with_another_dtype_kind_is_named(tmp_path):
    parts = blocks(2)
    parts[1] = (parts[1][0], parts[1][1].astype(str))
    write(tmp_path, "npz", parts)
    with pytest.raises(DataError, match=r"s001\.npz.*`data\.y`.*dtype"):
        read_dataset(data_cfg(source=str(tmp_path)))


def test_several_target_columns_over_parquet_shards_are_refused_naming_the_way(tmp_path):
    write(tmp_path, "parquet", blocks())
    with pytest.raises(DataError, match=r"`data.label` lists 2 target columns.*\(n, k\) array `data.y`"):
        read_dataset(data_cfg(source=str(tmp_path), label=["label", "f0"]))


def test_an_empty_glob_and_an_empty_folder_are_errors_naming_data_source(tmp_path):
    with pytest.raises(DataError, match=r"`data\.source` glob .*\*\.h5.* matches no files"):
        read_dataset(data_cfg(source=str(tmp_path / "*.h5")))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match=r"`data\.source` directory .* holds no data files"):
        read_dataset(data_cfg(source=str(tmp_path)))


def test_an_unreadable_shard_is_named(tmp_path):
    write(tmp_path, "hdf5", blocks(2))
    (tmp_path / "s001.h5").write_bytes(b"not an hdf5 file at all")
    with pytest.raises(DataError, match=r"`data\.source`.*s001\.h5.* cannot be read as hdf5"):
        read_dataset(data_cfg(source=str(tmp_path)))


def test_a_missing_dataset_and_a_missing_targets_file_are_named(tmp_path):
    write(tmp_path, "hdf5", blocks(1))
    with pytest.raises(DataError, match=r"`data\.x` names HDF5 dataset 'feat'.*s000\.h5"):
        read_dataset(data_cfg(source=str(tmp_path), x="feat"))
    npy = tmp_path / "npy"
    npy.mkdir()
    write(npy, "npy", blocks(2))
    (npy / "y_001.npy").unlink()
    with pytest.raises(DataError, match=r"`data\.y`.*y_001\.npy.*does not exist"):
        read_dataset(data_cfg(source=str(npy)))


def test_mixed_formats_in_a_folder_are_an_error(tmp_path):
    write(tmp_path, "npz", blocks(1))
    write(tmp_path, "hdf5", blocks(1))
    with pytest.raises(DataError, match=r"mixes formats"):
        read_dataset(data_cfg(source=str(tmp_path)))


def test_parquet_shards_are_read_by_column_name_and_other_columns_are_refused(tmp_path):
    """A file whose columns come in another order is read by name (not by position), and its
    names reach the metadata (predict matches a new table's columns by them, streamed too);
    a file with other feature columns is refused, naming it and the columns."""
    from datafeed.streaming import prepare_stream, stream_plan
    parts = blocks(3, rows=10)
    order = [list("abcd"), list("abcd"), list("dcba")]
    for i, ((x, y), cols) in enumerate(zip(parts, order)):
        frame = pd.DataFrame(x, columns=list("abcd"))[cols]
        frame["label"] = y
        frame.to_parquet(tmp_path / f"p{i}.parquet")
    data = data_cfg(source=str(tmp_path), label="label", task="regression")
    x, _, info = read_dataset(data)
    np.testing.assert_array_equal(x, np.concatenate([p[0] for p in parts]))
    assert info["feature_names"] == list("abcd")
    streamed = data_cfg(source=str(tmp_path), label="label", task="regression", stream=True)
    _, meta, _ = prepare_stream(stream_plan(streamed), streamed, 0)
    assert meta["feature_names"] == list("abcd")
    frame = pd.read_parquet(tmp_path / "p1.parquet").rename(columns={"d": "e"})
    frame.to_parquet(tmp_path / "p1.parquet")
    with pytest.raises(DataError, match=r"p1\.parquet.*other feature columns.*p0\.parquet.*lacks d.*has e"):
        read_dataset(data)
    assert read_dataset(data_cfg(source=str(tmp_path), label="label", features=list("abc")))[0].shape == (33, 3)


def test_a_text_column_of_parquet_shards_is_refused_by_name(tmp_path):
    """Shards cannot agree on categories file by file: a text feature is refused at the scan,
    naming the column and the way out (it failed reading rows: could not convert 'C' to float)."""
    for i, (x, y) in enumerate(blocks(2, rows=10)):
        frame = pd.DataFrame(x, columns=list("abcd"))
        frame["site"], frame["label"] = (["A", "C"] * len(y))[:len(y)], y
        frame.to_parquet(tmp_path / f"p{i}.parquet")
    with pytest.raises(DataError, match=r"column\(s\) 'site' of file .*p0\.parquet.* are not numbers .*data.exclude"):
        read_dataset(data_cfg(source=str(tmp_path), label="label", task="regression"))
    assert read_dataset(data_cfg(source=str(tmp_path), label="label", task="regression",
                                 exclude=["site"]))[0].shape[1] == 4


def test_a_glob_of_csv_files_says_to_join_them_or_use_parquet(tmp_path):
    for i in range(2):
        pd.DataFrame({"a": [1.0, 2.0], "y": [0, 1]}).to_csv(tmp_path / f"t{i}.csv", index=False)
    with pytest.raises(DataError, match=r"t0\.csv.* is a text table, which is read from one file only.*Parquet"):
        read_dataset(data_cfg(source=str(tmp_path / "*.csv"), label="y"))
