"""Readers on small files written here; checks, splits and normalisation."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from datafeed.prepare import check_arrays, draw_validation, fit_normalizer, prepare, split_indices, split_off
from datafeed.readers import DataError, read_dataset
from ensemble.config import resolve_config
from ensemble.config.schema import ConfigError


def data_cfg(**kw):
    cfg = resolve_config({"data": kw, "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})
    return cfg.data


@pytest.fixture
def xy():
    rng = np.random.default_rng(0)
    return rng.normal(size=(60, 5)).astype(np.float32), rng.integers(0, 3, size=60)


def test_npz(tmp_path, xy):
    np.savez(tmp_path / "d.npz", feats=xy[0], labels=xy[1])
    x, y, _ = read_dataset(data_cfg(source=str(tmp_path / "d.npz"), x="feats", y="labels"))
    np.testing.assert_array_equal(x, xy[0])
    np.testing.assert_array_equal(y, xy[1])
    with pytest.raises(DataError, match=r"`data.x` names array 'x'.*feats, labels"):
        read_dataset(data_cfg(source=str(tmp_path / "d.npz")))


def test_npy_pair(tmp_path, xy):
    np.save(tmp_path / "x.npy", xy[0])
    np.save(tmp_path / "y.npy", xy[1])
    x, y, _ = read_dataset(data_cfg(source=str(tmp_path / "x.npy"), y="y.npy"))
    np.testing.assert_array_equal(x, xy[0])
    with pytest.raises(DataError, match="`data.y`"):
        read_dataset(data_cfg(source=str(tmp_path / "x.npy"), y="missing.npy"))


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_tables(tmp_path, xy, fmt):
    frame = pd.DataFrame(xy[0], columns=[f"f{i}" for i in range(5)])
    frame["target"] = xy[1]
    path = tmp_path / f"d.{fmt}"
    frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path)
    x, y, info = read_dataset(data_cfg(source=str(path), label="target"))
    np.testing.assert_allclose(x, xy[0], rtol=1e-6)
    assert info["feature_names"] == [f"f{i}" for i in range(5)]
    x, _, _ = read_dataset(data_cfg(source=str(path), label="target", features=["f1", "f3"]))
    assert x.shape == (60, 2)
    with pytest.raises(DataError, match=r"`data.label` names column 'label'"):
        read_dataset(data_cfg(source=str(path)))
    with pytest.raises(DataError, match=r"`data.features`.*\['nope'\]"):
        read_dataset(data_cfg(source=str(path), label="target", features=["nope"]))


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_several_target_columns_are_one_regression_output_each(tmp_path, xy, fmt):
    frame = pd.DataFrame(xy[0], columns=[f"f{i}" for i in range(5)])
    frame["t1"], frame["t2"] = xy[1], xy[0][:, 0] * 2          # integers and floats: still regression
    path = tmp_path / f"d.{fmt}"
    frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path)
    data = data_cfg(source=str(path), label=["t1", "t2"])
    x, y, info = read_dataset(data)
    assert x.shape == (60, 5) and info["feature_names"] == [f"f{i}" for i in range(5)]
    np.testing.assert_allclose(y, frame[["t1", "t2"]].to_numpy(), rtol=1e-6)
    _, meta = prepare(x, y, info, data, seed=0)
    assert meta["task"] == "regression" and meta["n_outputs"] == 2
    with pytest.raises(DataError, match=r"`data.label` names column 't3'"):
        read_dataset(data_cfg(source=str(path), label=["t1", "t3"]))


@pytest.mark.parametrize("bad", [[], ["t1", "t1"], ["t1", 3]])
def test_a_label_list_must_name_distinct_columns(bad):
    with pytest.raises(ConfigError, match=r"data.label.*distinct column names"):
        data_cfg(source="x.csv", label=bad)


def test_a_split_column_among_the_targets_is_refused():
    with pytest.raises(ConfigError, match=r"data.split_column.*target column"):
        data_cfg(source="x.csv", label=["t1", "part"], split_column="part")


def test_hdf5(tmp_path, xy):
    import h5py
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["/group/images"] = xy[0]
        f["/labels"] = xy[1]
    x, y, _ = read_dataset(data_cfg(source=str(tmp_path / "d.h5"), x="/group/images", y="/labels"))
    np.testing.assert_array_equal(x, xy[0])
    with pytest.raises(DataError, match=r"`data.y` names HDF5 dataset '/nope'.*/group/images"):
        read_dataset(data_cfg(source=str(tmp_path / "d.h5"), x="/group/images", y="/nope"))


def test_netcdf_fill_values_are_missing_values_and_one_nc_file_reads(tmp_path, xy):
    """NetCDF's fill value (9.97e36 where nothing was measured, `_FillValue`) was read as a
    number (a run fell from accuracy 1.0 to 0.32, unsaid); a single .nc file was refused."""
    import h5py

    from datafeed.shards import read_all
    x = xy[0].copy()
    x[[3, 7], 1] = 9.96921e36
    for name in ("sst.nc", "sst.h5"):
        with h5py.File(tmp_path / name, "w") as f:
            f["x"] = x
            f["x"].attrs["_FillValue"] = np.float32(9.96921e36)
            f["y"] = xy[1]
        got, _, _ = read_dataset(data_cfg(source=str(tmp_path / name)))
        assert np.isnan(got).sum() == 2 and np.isnan(got[[3, 7], 1]).all()
        with pytest.raises(DataError, match=r"features hold 2 NaN/inf values .*HDF5/NetCDF fill value"):
            check_arrays(got, xy[1])
    (tmp_path / "many").mkdir()
    counts = np.round(xy[0] * 10).astype(np.int64)
    counts[[3, 7], 1] = -999
    with h5py.File(tmp_path / "many" / "a.nc", "w") as f:           # integers with a missing_value
        f["x"] = counts
        f["x"].attrs["missing_value"] = np.int64(-999)
        f["y"] = xy[1]
    shards, _, _ = read_all(data_cfg(source=str(tmp_path / "many")), True)
    assert np.isnan(shards[[3, 7], 1]).all()


def test_builtin_and_missing_file(tmp_path):
    x, y, info = read_dataset(data_cfg(source="digits"))
    assert x.shape == (1797, 64) and len(info["class_names"]) == 10
    with pytest.raises(DataError, match="does not exist"):
        read_dataset(data_cfg(source=str(tmp_path / "none.npz")))
    with pytest.raises(DataError, match=r"\$NO_SUCH_VARIABLE not set here"):     # the config expands a set one
        read_dataset(data_cfg(source=str(tmp_path / "$NO_SUCH_VARIABLE" / "d.npz")))
    with pytest.raises(DataError, match="`data.source`.*known suffix"):
        read_dataset(data_cfg(source=str(tmp_path / "data.weird")))


def test_bad_arrays():
    x = np.zeros((20, 3))
    with pytest.raises(DataError, match="x has 20 samples, y has 19"):
        check_arrays(x, np.zeros(19))
    with pytest.raises(DataError, match=r"targets are one number \(3.0\).*`data.y`"):
        check_arrays(x, np.array(3.0))                 # a .npy of one number: a TypeError traceback before
    with pytest.raises(DataError, match=r"no values per sample \(shape \[20, 0\]\)"):
        check_arrays(np.zeros((20, 0)), np.zeros(20))  # the run aborted in oneDNN on every worker
    x[4, 1] = np.nan
    with pytest.raises(DataError, match=r"NaN/inf.*\[4\]"):
        check_arrays(x, np.zeros(20))


def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path):
    """'a,b,label,label': pandas read the second 'label' as the feature 'label.1', and the run trained
    on the first while the classes leaked in as an input."""
    (tmp_path / "d.csv").write_text("a,b,label,label\n" + "".join(f"{i},{-i},{i % 2},x{i % 3}\n" for i in range(30)))
    with pytest.raises(DataError, match="'label' appear more than once in the header.*'label.1'"):
        read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="label"))
    (tmp_path / "e.csv").write_text("a,01,1,label,,\n" + "".join(f"{i},{i},{-i},{i % 2},,\n" for i in range(30)))
    x, _, info = read_dataset(data_cfg(source=str(tmp_path / "e.csv"), label="label", exclude=["Unnamed: 4",
                                                                                              "Unnamed: 5"]))
    assert info["feature_names"] == ["a", "01", "1"]           # names as written; empty ones are no name twice
    (tmp_path / "n.csv").write_text("".join(f"0,0,{i}\n" for i in range(30)))         # no header: data first
    with pytest.raises(DataError, match="the names are numbers: if the first line is data, add a header"):
        read_dataset(data_cfg(source=str(tmp_path / "n.csv"), label="2"))


def test_the_label_among_the_features_and_no_feature_left_are_refused(tmp_path):
    """features = ["b", "label"] trained on the answer (the baseline scored 1.0); every column
    excluded passed check, then aborted in oneDNN on every worker."""
    pd.DataFrame({"a": range(30), "b": range(30), "label": [0, 1] * 15}).to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(DataError, match="`data.features` lists 'label', which `data.label` also names"):
        read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="label", features=["b", "label"]))
    with pytest.raises(DataError, match="`data.features` lists 'a' more than once"):     # "AttributeError: 'Data
        read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="label", features=["a", "a"]))   # Frame'..."
    with pytest.raises(DataError, match="no feature column is left"):
        read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="label", exclude=["a", "b"]))


def test_split_is_seeded_disjoint_and_stratified():
    y = np.repeat(np.arange(4), 50)
    a = split_indices(y, "classification", 0.2, 0.2, seed=3)
    b = split_indices(y, "classification", 0.2, 0.2, seed=3)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    allidx = np.concatenate(list(a.values()))
    assert len(np.unique(allidx)) == 200
    assert [len(a[k]) for k in ("train", "val", "test")] == [120, 40, 40]
    for k in a:                                   # every class in its share
        np.testing.assert_array_equal(np.bincount(y[a[k]]), np.full(4, len(a[k]) // 4))
    c = split_indices(y, "classification", 0.2, 0.2, seed=4)
    assert not np.array_equal(a["test"], c["test"])


@pytest.mark.parametrize("counts,fraction", [((50, 30, 20), 0.1), ((7, 7, 7), 0.5), ((900, 60, 3, 37), 0.15),
                                             ((1,), 0.3)])
def test_split_off_holds_ceil_of_the_fraction_in_proportion_to_every_stratum(counts, fraction):
    strata = np.repeat(np.arange(len(counts)), counts)
    idx = np.arange(len(strata)) * 3 + 1                              # any row ids, aligned with strata
    n = len(idx)
    for seed in range(20):
        rest, held = split_off(idx, strata, fraction, seed)
        assert len(held) == min(max(int(np.ceil(fraction * n)), 1), n - 1) if n > 1 else len(held) == 0
        assert sorted([*rest, *held]) == idx.tolist()
        got = np.bincount(strata[(held - 1) // 3], minlength=len(counts))
        assert np.all(np.abs(got - np.array(counts) * len(held) / n) < 1)    # each stratum's share, rounded
    a, b = split_off(idx, None, fraction, 5), split_off(idx, None, fraction, 5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_drawing_a_split_imports_no_scikit_learn():
    """Rank 0 draws the split while every worker waits for the data: importing scikit-learn
    for it cost seconds of CPU there (scipy and pandas with it)."""
    code = ("import sys, numpy as np\n"
            "from datafeed.prepare import draw_validation, split_indices\n"
            "y = np.arange(90) % 3\n"
            "split_indices(y, 'classification', 0.2, 0.2, 1)\n"
            "draw_validation(y, np.arange(60), 'classification', 0.2, 1)\n"
            "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    rest, val = draw_validation(np.arange(90) % 3, np.arange(60), "classification", 0.2, 1)
    assert len(val) == 12 and np.bincount(np.arange(90)[val] % 3).tolist() == [4, 4, 4]


def test_normalisation_fits_on_train_only():
    rng = np.random.default_rng(1)
    x = rng.normal(5.0, 2.0, size=(300, 4)).astype(np.float32)
    y = (rng.random(300) > 0.5).astype(int)
    cfg = data_cfg(source="digits", task="classification")
    arrays, meta = prepare(x, y, {}, cfg, seed=0)
    np.testing.assert_allclose(arrays["x_train"].mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(arrays["x_train"].std(axis=0), 1, atol=1e-4)
    assert abs(arrays["x_test"].mean()) > 1e-4                 # test statistics were not used
    shift, scale = fit_normalizer(x, "minmax")
    assert np.allclose(shift, x.min(axis=0)) and np.all(scale > 0)
    assert meta["sizes"] == {"train": 210, "val": 45, "test": 45} and meta["n_outputs"] == 2


def test_constant_feature_and_reshape_and_regression():
    x = np.ones((100, 8), dtype=np.float32)
    x[:, 0] = np.arange(100)
    y = np.linspace(0, 1, 100)
    arrays, meta = prepare(x, y, {}, data_cfg(source="digits", task="regression", reshape=[2, 4]), seed=0)
    assert meta["task"] == "regression" and meta["input_shape"] == [2, 4]
    assert np.isfinite(arrays["x_train"]).all() and arrays["x_train"].shape[1:] == (2, 4)
    with pytest.raises(DataError, match=r"`data.reshape` \[3, 3\] holds 9 values"):
        prepare(x, y, {}, data_cfg(source="digits", reshape=[3, 3]), seed=0)


def test_string_labels_are_encoded():
    x = np.random.default_rng(0).normal(size=(30, 2))
    y = np.array(["cat", "dog", "eel"] * 10)
    arrays, meta = prepare(x, y, {}, data_cfg(source="digits"), seed=0)
    assert meta["task"] == "classification" and meta["class_names"] == ["cat", "dog", "eel"]
    assert set(np.unique(arrays["y_train"])) <= {0, 1, 2}


@pytest.mark.parametrize("task", ["auto", "classification", "regression"])
@pytest.mark.parametrize("kind", ["strings", "integers", "floats"])
def test_missing_targets_are_refused_naming_the_rows(tmp_path, kind, task):
    """An empty cell in the label column: pandas reads NaN (strings: object with NaN; integers:
    floats). It was a traceback (strings), a class called "nan" (integers as classes) or a
    complaint about regression targets (integers, task auto)."""
    if task == "regression" and kind == "strings":
        pytest.skip("strings are no regression targets")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(40, 2)), columns=["a", "b"])
    frame["y"] = {"strings": np.array(["cat", "dog"] * 20, dtype=object), "integers": np.array([3, 7] * 20),
                  "floats": rng.normal(size=40)}[kind]
    frame.loc[[4, 9], "y"] = None
    frame.to_csv(tmp_path / "d.csv", index=False)
    data = data_cfg(source=str(tmp_path / "d.csv"), label="y", task=task)
    x, y, info = read_dataset(data)
    with pytest.raises(DataError, match=r"`data.label`\) are missing in 2 of 40 rows .*\[4, 9\]\); drop those rows"):
        prepare(x, y, info, data, seed=0)
    np.savez(tmp_path / "d.npz", x=x, y=y)                   # arrays: the targets are `data.y` (it said data.label)
    with pytest.raises(DataError, match=r"\(`data.y`\) are missing in 2 of 40 rows"):
        prepare(x, y, info, data_cfg(source=str(tmp_path / "d.npz"), task=task), seed=0)


def test_missing_targets_of_nullable_columns_are_found():
    """Parquet's nullable integers reach numpy as objects holding pandas' NA, whose comparison is
    no bool (`v != v` raised)."""
    from datafeed.prepare import missing_rows
    assert missing_rows(pd.array([1, None, 3], dtype="Int64").to_numpy()).tolist() == [1]
    assert missing_rows(np.array(["a", np.nan, None, "b"], dtype=object)).tolist() == [1, 2]


def test_labels_keep_the_values_they_have():
    """Classes are the labels found: 1, 2, 3 are three classes (not four with an empty class 0);
    labels counting from 0 keep their values as codes; whole numbers read as floats (a column
    pandas read with gaps) are named as integers."""
    x = np.random.default_rng(0).normal(size=(60, 2))
    for y, names in (([1, 2, 3] * 20, ["1", "2", "3"]), ([0, 1, 3] * 20, ["0", "1", "2", "3"]),
                     ([3.0, 7.0, 9.0] * 20, ["3", "7", "9"])):
        arrays, meta = prepare(x, np.array(y), {}, data_cfg(source="digits", task="classification"), seed=0)
        assert meta["class_names"] == names and meta["n_outputs"] == len(names), y[:3]
        codes = np.concatenate([arrays[f"y_{s}"] for s in ("train", "val", "test")])
        assert set(codes) == {names.index(str(int(v))) for v in y[:3]}


def test_prepare_with_rows_gives_the_split_as_row_indices():
    """The rows a run saves as splits.npz: disjoint, covering every row, and the very rows
    each split's arrays were made from (before normalisation)."""
    from datafeed.prepare import apply_normalizer, prepare_with_rows
    rng = np.random.default_rng(3)
    x = rng.normal(size=(203, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=203)
    arrays, meta, rows = prepare_with_rows(x, y, {}, data_cfg(source="digits", val_fraction=0.2), seed=7)
    assert set(rows) == {"train", "val", "test"}
    assert all(r.dtype == np.int64 and np.all(np.diff(r) > 0) for r in rows.values())
    np.testing.assert_array_equal(np.sort(np.concatenate(list(rows.values()))), np.arange(203))
    for split, r in rows.items():
        assert len(r) == meta["sizes"][split]
        np.testing.assert_array_equal(arrays[f"y_{split}"], y[r])
        np.testing.assert_array_equal(arrays[f"x_{split}"], apply_normalizer(x[r], arrays["x_mean"], arrays["x_scale"]))
    again, _ = prepare(x, y, {}, data_cfg(source="digits", val_fraction=0.2), seed=7)
    assert set(again) == set(arrays)                       # prepare: the same arrays, no rows to broadcast


def test_a_stray_text_cell_is_named_not_its_column(tmp_path):
    """One typo in a column of numbers names the cell (it said the column was not numeric and to
    drop it); a text column of too many values to be categories is to be left out or encoded."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(40, 2)), columns=["a", "b"]).astype(object)
    frame.loc[7, "b"] = "abc"
    frame["colour"] = ["red", "blue"] * 20
    frame["when"] = pd.date_range("2020-01-01", periods=40).strftime("%Y-%m-%d")
    frame["y"] = [0, 1] * 20
    frame.to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(DataError) as err:
        read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="y"))
    assert "column 'b' holds numbers but for 1 cell(s) that are not (row 7: 'abc'" in str(err.value)
    assert "feature columns ['when'] are not numeric (such as '2020-01-01' in 'when') and have too many" \
        in str(err.value)
    assert '`data.exclude = ["when"]`' in str(err.value) and "colour" not in str(err.value)


def test_text_columns_of_few_values_are_categories_one_input_each(tmp_path):
    """A text column of few values (a site, a material) is one 0/1 input per value, where the
    column stood; a missing cell is 0 in all of them; another split's file is encoded with the
    training file's categories, a value they lack all 0 and noted. It was refused."""
    from datafeed.prepare import data_notes, prepare_with_rows
    from datafeed.splits import read_data
    frame = pd.DataFrame({"t": np.arange(30.0), "site": ["b", "a", "c"] * 10, "p": np.ones(30),
                          "y": np.arange(30.0) % 2})
    frame.loc[4, "site"] = None
    frame.to_csv(tmp_path / "train.csv", index=False)
    x, y, info = read_dataset(data_cfg(source=str(tmp_path / "train.csv"), label="y"))
    assert info["feature_names"] == ["t", "site=a", "site=b", "site=c", "p"]
    assert info["categories"] == {"site": ["a", "b", "c"]}
    np.testing.assert_array_equal(x[:5, 1:4], [[0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0]])
    test = frame.iloc[:10].copy()
    test["site"] = ["a", "d"] * 5                  # "d": never in training
    test[["p", "site", "t", "y"]].to_csv(tmp_path / "test.csv", index=False)     # columns in another order
    data = data_cfg(source=str(tmp_path / "train.csv"), label="y", test_source=str(tmp_path / "test.csv"))
    got = read_data(data)
    assert got.info["feature_names"] == info["feature_names"]
    np.testing.assert_array_equal(got.x[30:32, 1:4], [[1, 0, 0], [0, 0, 0]])
    arrays, meta, _ = prepare_with_rows(got.x, got.y, got.info, data, 0, got.rows)
    assert meta["categories"] == {"site": ["a", "b", "c"]}
    notes = " ".join(data_notes(got.info, arrays, meta))
    assert "read as categories" in notes and "'site': 'd'" in notes and "test.csv" in notes


@pytest.mark.parametrize("sep, decimal", [(";", "."), (";", ","), ("\t", "."), ("|", ".")])
def test_semicolon_tab_and_bar_separated_files_read_as_their_dialect(tmp_path, xy, sep, decimal):
    """A spreadsheet's export with semicolons (and decimal commas), or tabs: the same table
    (it was one column named 'f0;f1;...', refused as having no label column)."""
    frame = pd.DataFrame(np.round(xy[0], 3), columns=[f"f{i}" for i in range(5)])
    frame["target"] = xy[1]
    frame.to_csv(tmp_path / "d.csv", index=False, sep=sep, decimal=decimal)
    x, y, _ = read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="target"))
    np.testing.assert_allclose(x, frame.iloc[:, :5].to_numpy(), rtol=1e-6)
    np.testing.assert_array_equal(y, xy[1])


def test_classification_of_fractional_numbers_is_refused_naming_regression():
    """`data.task = "classification"` on a continuous target made a class of every row, silently."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 2)), rng.normal(size=50)
    with pytest.raises(DataError, match=r"fractional numbers with 50 distinct values in 50 rows .*set "
                                        r"`data.task = \"regression\"`"):
        prepare(x, y, {}, data_cfg(source="digits", task="classification"), seed=0)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_large_offset_keeps_its_digits_until_normalised(tmp_path, fmt):
    """A Unix time (1.6e9 + 30 s of spread) in float32 keeps 3 distinct values of 600; the
    features are read and normalised in float64, and only then made float32."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=600)
    frame = pd.DataFrame({"t": 1.6e9 + 30 * z, "lum": 10 ** (40 + z), "label": (z > 0).astype(int)})
    path = tmp_path / f"d.{fmt}"
    frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path)
    data = data_cfg(source=str(path), label="label", normalize="standard")
    x, y, info = read_dataset(data)
    arrays, meta = prepare(x, y, info, data, seed=0)
    t = arrays["x_train"][:, 0]
    assert arrays["x_train"].dtype == np.float32 and np.isfinite(arrays["x_train"]).all()    # 1e43: no inf
    assert len(np.unique(t)) > 400                     # float32 first: 3
    assert arrays["x_mean"].dtype == np.float64
    got = (x[:, 0] - arrays["x_mean"][0]) / arrays["x_scale"][0]
    assert np.corrcoef(got, z)[0, 1] > 0.9999


def test_a_regression_target_with_a_large_offset_keeps_its_digits():
    """A total energy or a Unix time as the target (1.6e9 + 100 a + noise): float32 kept 6 distinct
    values of 800, and the members, the ridge baseline and the test metrics saw only those. The
    targets stay float64; members standardise them in float64 and only then take float32."""
    from ensemble.task import get_task
    rng = np.random.default_rng(1)
    x = rng.normal(size=(800, 5))
    y = 1.6e9 + 100 * x[:, 0] + rng.normal(size=800)
    arrays, meta = prepare(x, y, {}, data_cfg(source="t.npz", task="regression"), seed=0)
    got = np.concatenate([arrays[f"y_{s}"] for s in ("train", "val", "test")])
    assert len(np.unique(got)) == 800                                          # float32: 6
    task = get_task("regression")
    shift, scale = task.target_scaling(arrays["y_train"])
    z = task.target_transform(shift, scale)(arrays["y_train"])
    assert abs(np.std(z) - 1.0) < 1e-6 and np.corrcoef(z, arrays["x_train"][:, 0])[0, 1] > 0.99
    back, _ = task.decode(z[:, None].astype(np.float64), shift, scale)
    np.testing.assert_allclose(back, arrays["y_train"], rtol=0, atol=1e-3)


def test_a_run_made_with_float32_targets_is_resumed_and_rescored_on_them():
    """A run made before targets were float64: its data.json has a float32 digest and no dtype. Read again,
    its data is the same (a float32 digest compared), and its targets are the float32 ones its members were
    scored on (`predict --data test` gave mse 6153 against ensemble.json's 5176). A new run's digest is of the
    float64 values: a target corrected by +10 on 1.6e9 is seen (float32 hides it)."""
    from datafeed.prepare import TARGETS_DIGEST, TARGETS_DTYPE, as_run_made, data_changed, targets_digest
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4))
    y = 1.6e9 + 100 * x[:, 0] + rng.normal(size=300)
    cfg = data_cfg(source="t.npz", task="regression")
    arrays, meta = prepare(x, y, {}, cfg, seed=0)
    norm = (arrays["x_mean"], arrays["x_scale"])
    old = {k: v for k, v in meta.items() if not k.startswith("targets_")}
    old[TARGETS_DIGEST] = targets_digest(y.astype(np.float32))                 # as 175a247 wrote it
    again, fresh = prepare(x, y, {}, cfg, seed=0)
    assert data_changed(old, fresh, norm, norm) is None
    as_run_made(again, fresh, old)
    assert again["y_test"].dtype == np.float32 and TARGETS_DTYPE not in fresh
    assert fresh[TARGETS_DIGEST] == old[TARGETS_DIGEST]                       # data.json stays in its form
    edited = y.copy()
    edited[10] += 10.0
    _, now = prepare(x, edited, {}, cfg, seed=0)
    assert data_changed(old, now, norm, norm) is None                         # float32 cannot see it
    assert "its targets are not the run's" in data_changed(meta, now, norm, norm)    # a new run does
    kept, same = prepare(x, y, {}, cfg, seed=0)
    as_run_made(kept, same, meta)
    assert kept["y_test"].dtype == np.float64                                  # a new run: untouched


def test_bool_and_nullable_numeric_columns_are_features(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=40), "flag": rng.random(40) > 0.5,
                          "count": rng.integers(0, 9, 40), "label": rng.integers(0, 2, 40)}).convert_dtypes()
    assert str(frame["count"].dtype) == "Int64" and str(frame["flag"].dtype) == "boolean"
    frame.to_parquet(tmp_path / "d.parquet")
    x, _, info = read_dataset(data_cfg(source=str(tmp_path / "d.parquet"), label="label"))
    assert info["feature_names"] == ["a", "flag", "count"] and x.dtype == np.float64
    np.testing.assert_array_equal(x[:, 1], frame["flag"].astype(float).to_numpy())


def test_an_index_or_id_column_is_noted_and_data_exclude_leaves_it_out(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"sample_id": [f"{i:04d}" for i in range(50)], "a": rng.normal(size=50),
                          "year": 1950 + np.arange(50), "count": rng.integers(0, 5, 50),
                          "label": rng.integers(0, 2, 50)})
    frame["sample_id"] = frame["sample_id"].astype(int)
    frame.to_csv(tmp_path / "d.csv")                     # the index too: "Unnamed: 0"
    x, _, info = read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="label"))
    assert info["feature_names"] == ["Unnamed: 0", "sample_id", "a", "year", "count"]
    assert info["id_like"] == ["Unnamed: 0", "sample_id", "year"]     # named so, or counting up by one
    from datafeed.readers import id_like_note
    assert 'data.exclude = ["Unnamed: 0", "sample_id", "year"]' in id_like_note(info["id_like"])
    x, _, info = read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="label",
                                       exclude=["Unnamed: 0", "sample_id"]))
    assert info["feature_names"] == ["a", "year", "count"] and x.shape == (50, 3) and info["id_like"] == ["year"]
    frame.to_parquet(tmp_path / "d.parquet", index=False)
    x, _, info = read_dataset(data_cfg(source=str(tmp_path / "d.parquet"), label="label", exclude=["year"]))
    assert info["feature_names"] == ["sample_id", "a", "count"]
    with pytest.raises(DataError, match=r"`data.exclude` names column\(s\) 'site' that the table does not have"):
        read_dataset(data_cfg(source=str(tmp_path / "d.parquet"), label="label", exclude=["site"]))
    with pytest.raises(ConfigError, match="give one of the two"):
        data_cfg(source="d.csv", features=["a"], exclude=["year"])


def test_a_csv_preamble_and_spaces_after_commas_are_read(tmp_path):
    rows = "".join(f"{i * 0.5}, {i % 3}, {i % 2}\n" for i in range(30))
    (tmp_path / "d.csv").write_text("# instrument XYZ, run 2024-03-01\n# units: K, Pa\ntemp, pres, label\n" + rows)
    x, y, info = read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="label"))
    assert info["feature_names"] == ["temp", "pres"] and x.shape == (30, 2) and y.tolist()[:3] == [0, 1, 0]
    (tmp_path / "e.csv").write_text("temp,pres,Label \n" + rows.replace(" ", ""))
    with pytest.raises(DataError, match=r"has columns 'temp', 'pres', 'Label '; the nearest is 'Label '"):
        read_dataset(data_cfg(source=str(tmp_path / "e.csv"), label="label"))


def test_non_finite_features_are_named_by_column(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=30), "g417": rng.normal(size=30), "empty": np.nan,
                          "label": rng.integers(0, 2, 30)})
    frame.loc[[3, 20], "g417"] = np.nan
    frame.to_csv(tmp_path / "d.csv", index=False)
    data = data_cfg(source=str(tmp_path / "d.csv"), label="label")
    x, y, info = read_dataset(data)
    with pytest.raises(DataError, match=r"in column\(s\) 'g417' \(2\), 'empty' \(30 of 30\) \(first rows, "
                                        r"counted from 0: \[0, 1, 2, 3, 4\]\).*leave an empty column out with "
                                        r"`data.exclude`"):
        prepare(x, y, info, data, seed=0)


def test_a_class_of_one_or_two_rows_is_kept_in_training_and_said():
    from datafeed.prepare import rare_note
    y = np.array([0] * 40 + [1] * 30 + [2] + [3] * 2)
    for seed in range(5):
        idx = split_indices(y, "classification", 0.2, 0.2, seed)
        assert {72, 71, 70} <= set(idx["train"].tolist())
        assert sorted(np.concatenate(list(idx.values())).tolist()) == list(range(len(y)))
        assert set(y[idx["val"]]) == set(y[idx["test"]]) == {0, 1}      # still stratified
    note = rare_note(y, ["a", "b", "rare", "few"])
    assert "'rare' (1 row), 'few' (2 rows) have fewer than 3 rows" in note
    assert rare_note(np.array([0] * 5 + [1] * 3), ["a", "b"]) is None
    plain = split_indices(np.array([0] * 40 + [1] * 30), "classification", 0.2, 0.2, 3)
    again = split_indices(np.array([0] * 40 + [1] * 30), "classification", 0.2, 0.2, 3)
    assert all((plain[s] == again[s]).all() for s in plain)


def test_regression_targets_far_from_the_rest_are_named():
    from datafeed.prepare import outlier_note
    rng = np.random.default_rng(0)
    y = rng.normal(size=600) * 3
    assert outlier_note(y) is None and outlier_note(np.exp(rng.normal(size=600))) is None   # a skew is no outlier
    y[[5, 9]] = [5e4, 1e6]
    note = outlier_note(y)
    assert note.startswith("2 target value(s) lie more than 50 robust standard deviations") and "50000" in note
    assert outlier_note(np.column_stack([rng.normal(size=600), y])).startswith("2 target value(s)")


def test_labels_alike_but_for_case_or_spaces_are_noted():
    from datafeed.prepare import class_notes
    y = np.repeat(np.arange(4), 10)
    notes = class_notes(y, ["cat", "cat ", "Dog", "dog"])
    assert len(notes) == 1 and "'cat', 'cat '; 'Dog', 'dog'" in notes[0]
    assert class_notes(y, ["a", "b", "c", "d"]) == []


def test_several_targets_are_named_in_the_metadata(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=30), "t1": rng.normal(size=30), "t2": rng.normal(size=30)})
    frame.to_csv(tmp_path / "d.csv", index=False)
    data = data_cfg(source=str(tmp_path / "d.csv"), label=["t1", "t2"])
    _, meta = prepare(*read_dataset(data), data, seed=0)
    assert meta["target_names"] == ["t1", "t2"] and meta["n_outputs"] == 2


def test_one_hot_labels_a_label_column_and_bytes_are_classes(tmp_path, xy):
    """One-hot rows were a 3-output regression (task "auto") or refused with advice to make
    them one ("classification"); an (n, 1) label column was refused as "not one value per
    sample"; HDF5 strings (bytes) named the classes "b'cat'"."""
    from datafeed.prepare import data_notes, prepare_with_rows
    x, y = xy
    expected, _ = prepare(x, y, {}, data_cfg(), 1)
    for task in ("auto", "classification"):
        arrays, meta, _ = prepare_with_rows(x, np.eye(3, dtype=np.int64)[y], {}, data_cfg(task=task), 1, None)
        assert meta["task"] == "classification" and meta["class_names"] == ["0", "1", "2"]
        assert (arrays["y_test"] == expected["y_test"]).all() and meta["label_form"] == "one-hot"
        assert any("one-hot rows" in n for n in data_notes({}, arrays, meta))
    _, meta, _ = prepare_with_rows(x, np.eye(3)[y], {}, data_cfg(task="regression"), 1, None)
    assert meta["task"] == "regression" and meta["n_outputs"] == 3            # asked for: kept
    arrays, meta, _ = prepare_with_rows(x, y[:, None], {}, data_cfg(), 1, None)
    assert meta["task"] == "classification" and (arrays["y_test"] == expected["y_test"]).all()
    arrays, meta, _ = prepare_with_rows(x, (y + 1.0)[:, None], {}, data_cfg(), 1, None)   # floats 1., 2., 3.:
    assert meta["task"] == "classification" and meta["class_names"] == ["1", "2", "3"]   # a regression before
    # ... and a run made then keeps its task when read again
    from datafeed.prepare import with_run_task
    _, then, _ = prepare_with_rows(x, (y + 1.0)[:, None], {}, with_run_task(data_cfg(), {"task": "regression"}), 1,
                                   None)
    assert then["task"] == "regression" and with_run_task(data_cfg(task="classification"),
                                                          {"task": "regression"}).task == "classification"
    names = np.array([b"cat", b"dog", b"eel"], dtype=object)[y]
    for labels in (names, names.astype("S3")):
        _, meta, _ = prepare_with_rows(x, labels, {}, data_cfg(), 1, None)
        assert meta["class_names"] == ["cat", "dog", "eel"]


def test_integer_labels_with_gaps_are_noted_with_their_empty_classes():
    from datafeed.prepare import class_notes
    notes = class_notes(np.array([0, 2, 5] * 10), [str(i) for i in range(6)])
    assert len(notes) == 1 and notes[0].startswith("3 of 6 classes have no rows ('1', '3', '4')")
    assert class_notes(np.array([0, 1, 2] * 10), ["0", "1", "2"]) == []


def test_a_constant_regression_target_is_noted():
    from datafeed.prepare import constant_note
    rng = np.random.default_rng(0)
    y = np.column_stack([rng.normal(size=50), np.full(50, 3.0)])
    note = constant_note(y, ["t1", "t2"])
    assert note.startswith("target(s) 't2' (always 3) take one value in every row")
    assert constant_note(y[:, :1]) is None
    assert constant_note(np.full(20, 1.5)).startswith("the target is 1.5 in every row")


def test_samples_shaped_like_channels_first_images_are_noted():
    from datafeed.prepare import channels_note
    assert "np.moveaxis(x, 1, -1)" in channels_note([3, 16, 16]) and channels_note([1, 32, 32])
    for shape in ([16, 16, 3], [16, 16, 1], [8, 8, 8], [3, 5, 100], [64], [3, 16]):
        assert channels_note(shape) is None, shape


def test_data_changed_names_what_differs_and_not_how_it_is_read():
    from datafeed.prepare import data_changed
    norm = (np.zeros(3), np.ones(3))
    meta = {"sizes": {"train": 6, "val": 2, "test": 2}, "task": "classification", "class_names": ["a", "b"]}
    streamed = {**meta, "stream": {"rows": [5, 5], "sample_shape": [3]}}
    assert data_changed(meta, meta, norm, norm) is None
    assert data_changed(meta, streamed, norm, norm) is None        # a node with less memory streams it: the same
    more = {**streamed, "stream": {"rows": [5, 5, 5], "sample_shape": [3]}}
    assert "3 files of 15 rows now, 2 files of 10 rows then" in data_changed(streamed, more, norm, norm)
    assert "classes ['a', 'c']" in data_changed(meta, {**meta, "class_names": ["a", "c"]}, norm, norm)
    assert "normalise otherwise" in data_changed(meta, meta, norm, (np.ones(3), np.ones(3)))


def test_data_changed_sees_labels_changed_under_the_same_features():
    """A resume after every label moved by one class (the images kept) went through: the finished
    members' scores were from the old labels, the new ones' from the new, side by side."""
    from datafeed.prepare import data_changed
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 4)), np.arange(60) % 3
    data = data_cfg(source="digits")
    arrays, then = prepare(x, y, {}, data, seed=0)
    norm = (arrays["x_mean"], arrays["x_scale"])
    assert data_changed(then, prepare(x, y, {}, data, seed=0)[1], norm, norm) is None
    moved = prepare(x, (y + 1) % 3, {}, data, seed=0)[1]
    assert "its targets are not the run's" in data_changed(then, moved, norm, norm)
    older = {k: v for k, v in then.items() if k != "targets_digest"}       # a run made before the digest
    assert data_changed(older, moved, norm, norm) is None
    swapped = x.copy()                       # 2 rows of one class swap their features: means and spreads the same
    a, b = np.flatnonzero(y == 0)[:2]
    swapped[[a, b]] = swapped[[b, a]]
    assert "its features are not the run's" in data_changed(then, prepare(swapped, y, {}, data, seed=0)[1], norm, norm)


def test_a_streamed_file_rewritten_with_the_same_shape_is_seen(tmp_path):
    """A shard replaced with other values of the same shape went through `predict --data test` (the
    metrics of other rows, unsaid), `ens.data` and `check --resume`."""
    from datafeed.prepare import data_changed
    from datafeed.shards import files_digest
    rng = np.random.default_rng(0)
    paths = []
    for i in range(3):
        np.save(tmp_path / f"x_{i}.npy", rng.normal(size=(50, 40)).astype(np.float32))
        paths.append(str(tmp_path / f"x_{i}.npy"))
    before = files_digest(paths)
    assert files_digest(paths) == before
    np.save(tmp_path / "x_1.npy", rng.normal(size=(50, 40)).astype(np.float32))      # same shape, other values
    after = files_digest(paths)
    assert after != before
    meta = {"sizes": {"train": 100, "val": 25, "test": 25}, "task": "regression"}
    norm = (np.zeros(40), np.ones(40))
    then, now = ({**meta, "stream": {"rows": [50] * 3, "sample_shape": [40], "digest": d}} for d in (before, after))
    assert "its files hold other values" in data_changed(then, now, norm, norm)
    assert data_changed(then, then, norm, norm) is None


def test_a_misspelt_label_column_gets_the_nearest_name(tmp_path):
    frame = pd.DataFrame({"a": np.arange(20.0), "modulus": np.arange(20.0)})
    frame.to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(DataError, match=r"the nearest is 'modulus' \(did you mean it\?\)"):
        read_dataset(data_cfg(source=str(tmp_path / "d.csv"), label="modulos"))


def test_impute_median_fills_missing_features_from_the_training_rows_only(tmp_path):
    """`data.impute = "median"`: NaN features were refused outright (a user had to impute by hand
    and repeat it exactly before every predict); now each is its feature's training median."""
    from datafeed.prepare import impute_note, prepare_with_rows
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    x[:, 1] += 10.0
    x[[3, 7, 11], 1] = np.nan
    y = rng.normal(size=60)
    with pytest.raises(DataError, match=r"3 NaN/inf values .*set `data.impute = \"median\"`"):
        prepare_with_rows(x, y, {"feature_names": ["a", "b", "c"]}, data_cfg(source="digits", task="regression"), 0)
    data = data_cfg(source="digits", task="regression", impute="median", normalize="none")
    arrays, meta, rows = prepare_with_rows(x, y, {"feature_names": ["a", "b", "c"]}, data, 0)
    median = np.nanmedian(x[rows["train"], 1])
    assert meta["impute"]["values"][1] == pytest.approx(median) and meta["impute"]["filled"] == 3
    filled = np.concatenate([arrays[f"x_{s}"] for s in ("train", "val", "test")])
    order = np.concatenate([rows[s] for s in ("train", "val", "test")])
    np.testing.assert_allclose(filled[np.isin(order, [3, 7, 11]), 1], median, rtol=1e-6)
    assert "filled 3 missing value(s) with their feature's training median: 'b' (3)" in impute_note(meta["impute"])
    x[:, 2] = np.nan                                                  # nothing to fill from
    with pytest.raises(DataError, match=r"feature\(s\) 'c' are missing in every training row"):
        prepare_with_rows(x, y, {"feature_names": ["a", "b", "c"]}, data, 0)
    x[:, 2], x[5, 0] = 0.0, np.inf                                    # inf is no gap: still refused
    with pytest.raises(DataError, match=r"1 inf values"):
        prepare_with_rows(x, y, {"feature_names": ["a", "b", "c"]}, data, 0)


def test_a_given_test_split_beyond_the_training_range_is_said():
    """Training e0 in [-2, 1], the test file's in [-2, 3]: the ensemble's spread fell where it
    extrapolated, and nothing said the test rows lay outside."""
    from datafeed.prepare import data_notes, outside_note
    rng = np.random.default_rng(0)
    train = rng.uniform(-2, 1, size=(200, 3))
    test = rng.uniform(-2, 1, size=(50, 3))
    test[:20, 0] = rng.uniform(1.5, 3, size=20)
    note = outside_note(train, test, ["e0", "e1", "e2"])
    assert note.startswith("20 of 50 test rows lie outside the training rows' range") and "'e0' 20" in note
    assert outside_note(train, rng.uniform(-2, 1, size=(50, 3))) is None
    arrays = {"x_train": train, "x_test": test, **{f"y_{s}": np.zeros(5) for s in ("train", "val", "test")}}
    meta = {"task": "regression", "class_names": [], "feature_names": ["e0", "e1", "e2"]}
    given = data_notes({}, arrays, {**meta, "split_from": "sources"})
    assert any("outside the training rows' range" in n for n in given)
    assert not any("outside" in n for n in data_notes({}, arrays, {**meta, "split_from": "random"}))   # drawn alike
