"""A split the data gives (``datafeed.splits``): separate files, a split column, index arrays.
Each way gives exactly the rows it names, validation is drawn from train when only train
and test are given, and each mistake is one message naming its setting. No TensorFlow."""

import numpy as np
import pandas as pd
import pytest

from datafeed.prepare import prepare_with_rows
from datafeed.readers import DataError
from datafeed.splits import read_data
from ensemble.config import ConfigError, Problems, resolve_config

ARCH = [{"layers": [{"type": "Dense", "units": 4}]}]


def data_cfg(**kw):
    return resolve_config({"data": kw, "architectures": ARCH}).data


def prepared(data, seed=0):
    got = read_data(data)
    return got, *prepare_with_rows(got.x, got.y, got.info, data, seed, got.rows)


@pytest.fixture
def table(tmp_path):
    """60 rows, features a b c, a label, and a `part` column: 40 train, 8 val, 12 test (shuffled)."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(60, 3)), columns=["a", "b", "c"])
    frame["label"] = np.arange(60) % 3
    part = np.array(["train"] * 40 + [" Valid"] * 4 + ["validation"] * 4 + ["TEST"] * 12)
    frame["part"] = rng.permutation(part)
    return frame


def test_a_split_column_gives_exactly_its_rows_and_is_not_a_feature(tmp_path, table):
    table.to_csv(tmp_path / "d.csv", index=False)
    got, arrays, meta, rows = prepared(data_cfg(source=str(tmp_path / "d.csv"), split_column="part"))
    part = table["part"].str.strip().str.lower().to_numpy()
    assert rows["train"].tolist() == np.flatnonzero(part == "train").tolist()
    assert rows["val"].tolist() == np.flatnonzero(np.isin(part, ["valid", "validation"])).tolist()
    assert rows["test"].tolist() == np.flatnonzero(part == "test").tolist()
    assert meta["feature_names"] == ["a", "b", "c"] and meta["input_shape"] == [3]
    assert meta["split_from"] == "column" and meta["val_drawn"] is False
    assert np.allclose(arrays["y_test"], table["label"].to_numpy()[rows["test"]])


def test_a_split_column_without_val_rows_draws_validation_from_train_only(tmp_path, table):
    table["part"] = table["part"].replace({" Valid": "train", "validation": "train"})
    table.to_parquet(tmp_path / "d.parquet")
    data = data_cfg(source=str(tmp_path / "d.parquet"), split_column="part", val_fraction=0.25)
    got, _, meta, rows = prepared(data)
    given_train = np.flatnonzero(table["part"].to_numpy() == "train")
    assert got.rows["val"] is None and meta["val_drawn"] is True
    assert rows["test"].tolist() == np.flatnonzero(table["part"].to_numpy() == "TEST").tolist()
    assert sorted([*rows["train"], *rows["val"]]) == given_train.tolist()     # validation only from train
    assert len(rows["val"]) == 12                                             # a quarter of the 48
    assert rows["val"].tolist() == prepared(data)[3]["val"].tolist()          # seeded


def test_separate_files_are_train_then_val_then_test(tmp_path, table):
    table = table.drop(columns="part")
    table.iloc[:40].to_csv(tmp_path / "train.csv", index=False)
    table.iloc[40:48].to_csv(tmp_path / "val.csv", index=False)
    table.iloc[48:][["c", "label", "a", "b"]].to_csv(tmp_path / "test.csv", index=False)   # another order
    data = data_cfg(source=str(tmp_path / "train.csv"), val_source=str(tmp_path / "val.csv"),
                    test_source=str(tmp_path / "test.csv"))
    got, arrays, meta, rows = prepared(data)
    assert {s: (r[0], r[-1] + 1) for s, r in rows.items()} == {"train": (0, 40), "val": (40, 48), "test": (48, 60)}
    assert np.allclose(got.x, table[["a", "b", "c"]].to_numpy())             # the columns matched by name
    assert meta["split_from"] == "sources" and meta["sizes"] == {"train": 40, "val": 8, "test": 12}
    only_test = data_cfg(source=str(tmp_path / "train.csv"), test_source=str(tmp_path / "test.csv"))
    _, _, meta, rows = prepared(only_test)
    assert meta["val_drawn"] and rows["test"].tolist() == list(range(40, 52))
    assert sorted([*rows["train"], *rows["val"]]) == list(range(40))


def test_a_class_that_no_training_row_has_is_refused(tmp_path, table):
    """A test file with a new label ('unknown', 3 rows) became a class no member ever saw, and the only
    word of it was "class 'unknown' holds 0 of 255 training rows, so about 0 of the 100 test rows"."""
    from ensemble.task.metrics import rare_class_note
    table = table.drop(columns="part")
    table["label"] = np.array(["a", "b", "c"])[table["label"]]
    table.iloc[:48].to_csv(tmp_path / "train.csv", index=False)
    test = table.iloc[48:].copy()
    test.loc[test.index[[1, 4, 5]], "label"] = "unknown"
    test.to_csv(tmp_path / "test.csv", index=False)
    with pytest.raises(DataError, match=r"the test split \(`data.test_source`\) holds 3 row\(s\) of class\(es\) "
                                        r"'unknown' that no training row has \(first rows, counted from 0 in the "
                                        r"test split: \[1, 4, 5\]\)"):
        prepared(data_cfg(source=str(tmp_path / "train.csv"), test_source=str(tmp_path / "test.csv")))
    assert rare_class_note("accuracy", np.array([0] * 50 + [2] * 3), ["a", "u", "b"], 10).startswith(
        "class 'b' holds 3 of 53")                           # the class with rows, not the one without


def test_index_arrays_give_exactly_their_rows(tmp_path, table):
    table.drop(columns="part").to_csv(tmp_path / "d.csv", index=False)
    test = np.array([59, 55, 52, 50])                       # in any order: sorted in splits.npz
    np.savez(tmp_path / "split.npz", train=np.arange(40), val=np.arange(40, 50), test=test)
    _, _, meta, rows = prepared(data_cfg(source=str(tmp_path / "d.csv"), split_file=str(tmp_path / "split.npz")))
    assert rows["test"].tolist() == sorted(test.tolist()) and rows["val"].tolist() == list(range(40, 50))
    assert meta["split_from"] == "indices" and meta["sizes"] == {"train": 40, "val": 10, "test": 4}


def test_npz_arrays_in_separate_files(tmp_path):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(30, 4, 2)), rng.normal(size=30)
    np.savez(tmp_path / "train.npz", x=x[:20], y=y[:20])
    np.savez(tmp_path / "test.npz", x=x[20:], y=y[20:])
    _, arrays, meta, rows = prepared(data_cfg(source=str(tmp_path / "train.npz"),
                                              test_source=str(tmp_path / "test.npz")))
    assert rows["test"].tolist() == list(range(20, 30)) and np.allclose(arrays["y_test"], y[20:])
    np.savez(tmp_path / "bad.npz", x=x[20:, :3], y=y[20:])
    with pytest.raises(DataError, match=r"`data.test_source` .*bad.npz.*shape \[3, 2\].*\[4, 2\]"):
        read_data(data_cfg(source=str(tmp_path / "train.npz"), test_source=str(tmp_path / "bad.npz")))
    np.savez(tmp_path / "ints.npz", x=x[20:].astype(np.int64), y=y[20:])
    with pytest.raises(DataError, match=r"`data.test_source` .*ints.npz.*int64.*float64"):
        read_data(data_cfg(source=str(tmp_path / "train.npz"), test_source=str(tmp_path / "ints.npz")))


@pytest.mark.parametrize("values, message", [
    (["train"] * 50 + ["holdout"] * 10, r"`data.split_column` 'part' holds values that name no split: 'holdout' "
                                        r"\(10 rows\)"),
    (["train"] * 60, r"`data.split_column` 'part' marks no test rows"),
])
def test_split_column_mistakes(tmp_path, table, values, message):
    table["part"] = values
    table.to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(DataError, match=message):
        read_data(data_cfg(source=str(tmp_path / "d.csv"), split_column="part"))


def test_split_column_missing_or_on_arrays(tmp_path, table):
    table.drop(columns="part").to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(DataError, match=r"`data.split_column` names column 'part', but .* has columns a, b, c"):
        read_data(data_cfg(source=str(tmp_path / "d.csv"), split_column="part"))
    np.savez(tmp_path / "d.npz", x=np.zeros((20, 2)), y=np.zeros(20))
    with pytest.raises(DataError, match=r"`data.split_column` is for CSV/Parquet sources, but .* is npz"):
        read_data(data_cfg(source=str(tmp_path / "d.npz"), split_column="part"))


@pytest.mark.parametrize("arrays, message", [
    ({"train": np.arange(40), "test": np.arange(35, 50)}, r"`train` and `test` overlap in 5 row\(s\) \(first: \[35,"),
    ({"train": np.arange(40), "test": np.array([40, 60])}, r"`test` refers to row 60, but `data.source` has 60 rows"),
    ({"train": np.arange(40), "test": np.array([], dtype=int)}, r"`test` is empty"),
    ({"train": np.arange(40)}, r"must hold `train` and `test`"),
    ({"train": np.arange(40), "test": np.arange(40, 50), "valid": np.arange(50, 60)}, r"nothing else"),
    ({"train": np.arange(40), "test": np.arange(60) >= 50}, r"integer row indices.*np.flatnonzero"),
    ({"train": np.array([1, 1, 2]), "test": np.arange(40, 50)}, r"`train` lists row 1 more than once"),
])
def test_index_file_mistakes(tmp_path, table, arrays, message):
    table.drop(columns="part").to_csv(tmp_path / "d.csv", index=False)
    np.savez(tmp_path / "split.npz", **arrays)
    with pytest.raises(DataError, match=r"`data.split_file` .*split.npz.*" + message):
        read_data(data_cfg(source=str(tmp_path / "d.csv"), split_file=str(tmp_path / "split.npz")))


def test_index_file_missing(tmp_path, table):
    table.drop(columns="part").to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(DataError, match=r"`data.split_file` .*nope.npz' does not exist"):
        read_data(data_cfg(source=str(tmp_path / "d.csv"), split_file=str(tmp_path / "nope.npz")))


def test_separate_files_mistakes_name_their_file_and_setting(tmp_path, table):
    table = table.drop(columns="part")
    table.iloc[:40].to_csv(tmp_path / "train.csv", index=False)
    table.iloc[40:].rename(columns={"c": "d"}).to_csv(tmp_path / "test.csv", index=False)
    with pytest.raises(DataError, match=r"`data.test_source` .*test.csv' has other columns than `data.source`: "
                                        r"missing \['c'\], extra \['d'\]"):
        read_data(data_cfg(source=str(tmp_path / "train.csv"), test_source=str(tmp_path / "test.csv")))
    with pytest.raises(DataError, match=r"`data.test_source` file .*absent.csv' does not exist"):
        read_data(data_cfg(source=str(tmp_path / "train.csv"), test_source=str(tmp_path / "absent.csv")))
    table.iloc[40:].to_parquet(tmp_path / "test.parquet")
    with pytest.raises(DataError, match=r"`data.test_source` .* is parquet, but `data.source` is csv"):
        read_data(data_cfg(source=str(tmp_path / "train.csv"), test_source=str(tmp_path / "test.parquet")))
    with pytest.raises(DataError, match=r"`data.source` 'digits' is a built-in dataset"):
        read_data(data_cfg(source="digits", test_source=str(tmp_path / "test.csv")))


@pytest.mark.parametrize("data, message", [
    ({"split_column": "part", "split_file": "s.npz"},
     "`data.split_column` and `data.split_file` both give the split (a column and index arrays); keep one"),
    ({"test_source": "t.csv", "split_column": "part"},
     "`data.test_source` and `data.split_column` both give the split (separate files and a column); keep one"),
    ({"val_source": "v.csv"}, "`data.val_source` needs `data.test_source`"),
    ({"split_file": "s.npz", "test_fraction": 0.2},
     "`data.test_fraction` draws a random test split, but `data.split_file` gives the test rows; "
     "remove `data.test_fraction`"),
    ({"test_source": "t.csv", "val_source": "v.csv", "val_fraction": 0.2},
     "`data.val_fraction` draws validation rows from the training rows, but `data.val_source` gives them"),
    ({"split_column": "label"}, "`data.split_column` 'label' is the target column `data.label`"),
    ({"split_column": "part", "features": ["a", "part"]}, "`data.split_column` 'part' is listed in `data.features`"),
])
def test_conflicting_settings_are_one_config_error_each(data, message):
    found = Problems()
    resolve_config({"data": {"source": "d.csv", **data}, "architectures": ARCH}, problems=found)
    assert len(found.messages) == 1 and found.messages[0].startswith(message), found.messages
    with pytest.raises(ConfigError):
        resolve_config({"data": {"source": "d.csv", **data}, "architectures": ARCH})


def test_a_given_split_with_a_val_fraction_alone_is_fine_and_a_saved_config_reads_back():
    from ensemble.config import dump_toml, read_saved_config
    cfg = resolve_config({"data": {"source": "d.csv", "test_source": "t.csv", "val_fraction": 0.5},
                          "architectures": ARCH})
    assert cfg.data.val_fraction == 0.5
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:           # every default written out, fractions included
        (Path(tmp) / "config.toml").write_text(dump_toml(cfg))
        assert read_saved_config(Path(tmp) / "config.toml").data == cfg.data


@pytest.mark.parametrize("test, val, message", [
    ("./d.csv", "", "`data.test_source` is `data.source` itself"),
    ("{dir}/d.csv", "", "`data.test_source` is `data.source` itself"),
    ("../{name}/d.csv", "", "`data.test_source` is `data.source` itself"),
    ("t.csv", "d.csv", "`data.val_source` is `data.source` itself"),
    ("t.csv", "./t.csv", "`data.test_source` is `data.val_source` itself"),
])
def test_the_training_file_given_again_as_other_rows_is_refused_however_it_is_written(tmp_path, test, val, message):
    """`test_source = source` scored the networks on rows they trained on; refused when the strings
    matched, but not for the same file written another way (an absolute path, ../dir/d.csv)."""
    from ensemble.config import load_config
    for name in ("d.csv", "t.csv"):
        (tmp_path / name).write_text("a,label\n1,0\n2,1\n")
    given = {"test": test.format(dir=tmp_path, name=tmp_path.name), "val": val}
    lines = [f'test_source = "{given["test"]}"'] + ([f'val_source = "{given["val"]}"'] if val else [])
    (tmp_path / "c.toml").write_text("[data]\nsource = \"d.csv\"\nlabel = \"label\"\n" + "\n".join(lines) + "\n"
                                     "[[architectures]]\nlayers = [{type = \"Dense\", units = 2}]\n")
    found = Problems()
    load_config(tmp_path / "c.toml", found)
    assert [m for m in found.messages if m.startswith(message)] and "its rows would be" in " ".join(found.messages)
