"""Prediction inputs (issue 17): columns matched by name in every input that has names, --keep
carried through, arrays without names checked for width and dtype; the in-process API.

The runs are made without training (members with seeded random weights, saved as a run
saves them, by ``make_run`` of the MPI predict tests), so each test pays for reading and
prediction only; nothing here starts mpiexec.
"""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pandas as pd
import pytest
from numpy.lib.recfunctions import repack_fields

from ensemble import predict as P
from ensemble.config import resolve_config
from ensemble.inference.load import EnsembleRun
from tests.mpi.test_predict_mpi import make_run

NAMES = ["a", "b", "c", "d"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A classification run trained on a CSV (feature names a..d, string labels) and a
    regression run trained on an npz (no names)."""
    base = tmp_path_factory.mktemp("predict_inputs")
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(100, 4)) * [1, 10, 0.1, 5] + 2).astype(np.float32)
    train = pd.DataFrame(x, columns=NAMES)
    train["label"] = np.where(x[:, 0] + x[:, 2] > 2, "pos", "neg")
    train.to_csv(base / "train.csv", index=False)
    make_run(base / "cls", {"source": str(base / "train.csv")},
             [{"id": "m-000", "weight": 0.6}, {"id": "m-001", "weight": 0.4}])
    np.savez(base / "train.npz", x=x, y=x[:, 0] * 2 + x[:, 3])
    make_run(base / "reg", {"source": str(base / "train.npz"), "task": "regression"},
             [{"id": "r-000", "weight": 1.0}])
    return base


@pytest.fixture(scope="module")
def rows():
    """12 new rows in training order, their labels and string IDs with leading zeros."""
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(12, 4)) * [1, 10, 0.1, 5] + 2).astype(np.float32)
    return x, np.where(x[:, 0] + x[:, 2] > 2, "pos", "neg"), [f"{i:03d}" for i in range(12)]


def shuffled_table(rows) -> pd.DataFrame:
    """The rows as a table: columns out of training order, an ID, the labels and an unused column."""
    x, y, ids = rows
    frame = pd.DataFrame(x, columns=NAMES)[["d", "b", "a", "c"]]
    frame.insert(0, "sample_id", ids)
    frame.insert(3, "label", y)
    frame["notes"] = "seen"
    return frame


def compound(frame: pd.DataFrame, text: bool = False) -> np.ndarray:
    """The table as a structured array: as h5py writes it (fixed bytes IDs, variable-length
    labels), or with unicode text (``text``, as an npz can hold it without pickling)."""
    dtype = [("sample_id", "U8" if text else "S8"), ("d", "f4"), ("b", "f8"),
             ("label", "U8" if text else h5py.string_dtype()), ("a", "f4"), ("c", "f4"),
             ("notes", "U8" if text else "S4")]
    out = np.zeros(len(frame), dtype=dtype)
    for name, kind in dtype:
        out[name] = [v.encode() for v in frame[name]] if kind in ("S8", "S4") else frame[name]
    return out


# ------------------------------------------------------------------ names, in every named input
def test_every_named_input_gives_the_training_order(base, rows, tmp_path, caplog):
    """CSV, Parquet, HDF5 compound, npz structured and a DataFrame: the same features (picked by
    name, in training order), targets, kept IDs, and the unused column listed in a warning."""
    run = P.load_run(base / "cls")
    x, y, ids = rows
    expected_x = P.prepare_features(run, x)
    frame = shuffled_table(rows)
    frame.to_csv(tmp_path / "rows.csv", index=False)
    frame.to_parquet(tmp_path / "rows.parquet", index=False)
    with h5py.File(tmp_path / "rows.h5", "w") as f:
        f["table"] = compound(frame)
    np.savez(tmp_path / "rows.npz", x=compound(frame, text=True))
    got = {"csv": P.load_input(run, str(tmp_path / "rows.csv"), keep=["sample_id"]),
           "parquet": P.load_input(run, str(tmp_path / "rows.parquet"), keep="sample_id"),
           "hdf5": P.load_input(run, str(tmp_path / "rows.h5"), x="table", keep=["sample_id"]),
           "npz": P.load_input(run, str(tmp_path / "rows.npz"), keep=["sample_id"]),
           "frame": P.data_input(run, frame, keep=["sample_id"])}
    for kind, inp in got.items():
        # a table's text holds the float32 values' shortest repr, read as float64: equal to float32's rounding
        np.testing.assert_allclose(inp.x, expected_x, rtol=0, atol=4e-6, err_msg=kind)
        assert np.asarray(run.class_names)[inp.y].tolist() == y.tolist(), kind
        assert inp.kept["sample_id"].tolist() == ids, kind                  # text, leading zeros kept
        assert inp.ignored == ["notes"], kind
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 5 and all("1 column(s) not used by the ensemble, ignored: 'notes'" in w
                                      for w in warnings)


def test_targets_that_cannot_be_scored_leave_the_predictions_unscored(base, rows, tmp_path, caplog):
    """New rows whose label column is empty, holds an unknown class or, for regression, gaps:
    predicting needs no targets, so the rows are predicted and the metrics left out with a
    warning saying why (it was an error, and for regression gaps metrics of NaN with R^2 1.0);
    ``evaluate``, which asks for the metrics, still refuses."""
    run, x = P.load_run(base / "cls"), rows[0]
    frame = shuffled_table(rows)
    for labels, why in ((None, "targets are missing in 12 of 12 rows"),
                        (["pos"] * 11 + ["bird"], "targets hold labels ['bird'] that are not classes")):
        frame["label"] = labels
        frame.to_csv(tmp_path / "rows.csv", index=False)
        caplog.clear()
        for got in (P.load_input(run, str(tmp_path / "rows.csv")), P.data_input(run, frame)):
            assert got.y is None
            np.testing.assert_allclose(got.x, P.prepare_features(run, x), rtol=0, atol=4e-6)   # the text's digits
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert sum(why in w and "predicting without scoring them" in w for w in warnings) == 2, warnings
        with pytest.raises(P.PredictError, match=why.replace("[", r"\[")):
            P.encode_targets(run, frame["label"].to_numpy(), len(frame))
    reg = P.load_run(base / "reg")
    y = x[:, 0] * 2 + x[:, 3]
    y[[2, 5]] = np.nan
    np.savez(tmp_path / "gaps.npz", x=x, y=y)
    assert P.load_input(reg, str(tmp_path / "gaps.npz")).y is None
    assert "targets are missing in 2 of 12 rows (first rows, counted from 0: [2, 5])" in caplog.text


def test_a_table_with_a_header_and_no_rows_says_so(base, rows, tmp_path):
    """It said the empty columns (object dtype) were not numeric."""
    shuffled_table(rows).iloc[:0].to_csv(tmp_path / "empty.csv", index=False)
    with pytest.raises(P.PredictError, match="has its columns but no rows: nothing to predict"):
        P.load_input(P.load_run(base / "cls"), str(tmp_path / "empty.csv"))


def test_an_empty_file_and_a_column_named_twice_are_said(base, rows, tmp_path):
    """A 0-byte CSV gave pandas' "No columns to parse from file", without the file; a header with
    a name twice was read as NAME and NAME.1, the second said "not used" and the first predicted on."""
    (tmp_path / "zero.csv").write_text("")
    with pytest.raises(P.PredictError, match="zero.csv' is empty"):
        P.load_input(P.load_run(base / "cls"), str(tmp_path / "zero.csv"))
    table = shuffled_table(rows)
    first = table.columns[0]
    table.insert(2, "dup", table[first])
    table.to_csv(tmp_path / "twice.csv", index=False, header=[*table.columns[:2], first, *table.columns[3:]])
    with pytest.raises(P.PredictError, match=f"column\\(s\\) '{first}' appear more than once in the header"):
        P.load_input(P.load_run(base / "cls"), str(tmp_path / "twice.csv"))


def test_class_names_that_are_numbers_match_only_as_numbers(tmp_path):
    """Classes 3, 7, 9: a label read as 7.0 (pandas, after a gap) is class 7; a label 1 is no class
    (it was taken for the index of class 7)."""
    x = np.random.default_rng(0).normal(size=(60, 2)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.array([3, 7, 9] * 20))
    make_run(tmp_path / "run", {"source": str(tmp_path / "d.npz"), "task": "classification"},
             [{"id": "m-000", "weight": 1.0}])
    run = P.load_run(tmp_path / "run")
    assert run.class_names == ["3", "7", "9"]
    assert P.encode_targets(run, np.array([7.0, 3.0, 9.0]), 3).tolist() == [1, 0, 2]
    with pytest.raises(P.PredictError, match=r"labels \['1'\] that are not classes"):
        P.encode_targets(run, np.array([1, 3]), 2)


def test_numbers_for_classes_that_are_names_are_refused_with_the_order(tmp_path):
    """Classes blob, hstripe, vstripe (trained on names): a user's own codes 0=hstripe, 1=vstripe,
    2=blob were taken for indices into the sorted names, and every image scored wrong (accuracy
    0.0, no warning). Numbers are refused, the classes' order named; names still score."""
    x = np.random.default_rng(0).normal(size=(60, 2)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.array(["hstripe", "vstripe", "blob"] * 20))
    make_run(tmp_path / "run", {"source": str(tmp_path / "d.npz"), "task": "classification"},
             [{"id": "m-000", "weight": 1.0}])
    run = P.load_run(tmp_path / "run")
    assert run.class_names == ["blob", "hstripe", "vstripe"]
    assert P.encode_targets(run, np.array(["vstripe", "blob"]), 2).tolist() == [2, 0]
    with pytest.raises(P.PredictError, match=r"numbers, but this ensemble's classes are names .*0: 'blob', "
                                             r"1: 'hstripe', 2: 'vstripe'"):
        P.encode_targets(run, np.array([0, 1, 2]), 3)
    with pytest.raises(P.PredictError, match="one-hot rows, but this ensemble's classes are blob"):
        P.encode_targets(run, np.eye(3, dtype=int), 3)
    assert P.encode_targets(run, np.array([b"vstripe", b"blob"]), 2).tolist() == [2, 0]     # h5py's strings
    np.savez(tmp_path / "n.npz", x=x, y=np.array([0, 1, 2] * 20))
    make_run(tmp_path / "numbered", {"source": str(tmp_path / "n.npz"), "task": "classification"},
             [{"id": "m-000", "weight": 1.0}])
    numbered = P.load_run(tmp_path / "numbered")
    assert P.encode_targets(numbered, np.eye(3, dtype=int)[[2, 0]], 2).tolist() == [2, 0]      # one-hot: indices
    np.savez(tmp_path / "h.npz", x=x, y=np.array([0.5, 1.5, 2.5] * 20))          # fractional numbers as classes
    make_run(tmp_path / "halves", {"source": str(tmp_path / "h.npz"), "task": "classification"},
             [{"id": "m-000", "weight": 1.0}])
    assert P.encode_targets(P.load_run(tmp_path / "halves"), np.array([2.5, 0.5]), 2).tolist() == [2, 0]


def test_a_missing_column_and_an_extra_one_fail_naming_the_missing(base, rows, tmp_path):
    """The acceptance case: the count is right, the names are not."""
    run = P.load_run(base / "cls")
    frame = shuffled_table(rows).drop(columns=["c", "notes", "label"])
    assert frame.shape[1] == len(NAMES)
    frame.to_csv(tmp_path / "rows.csv", index=False)
    with h5py.File(tmp_path / "rows.h5", "w") as f:
        f["x"] = repack_fields(compound(shuffled_table(rows))[["sample_id", "d", "b", "label", "a", "notes"]])
    message = r"lacks 1 of the 4 columns the ensemble was trained on: 'c'; it has other columns \('sample_id'"
    with pytest.raises(P.PredictError, match=message):
        P.load_input(run, str(tmp_path / "rows.csv"))
    with pytest.raises(P.PredictError, match=message):
        P.predict_frame(run, frame)
    with pytest.raises(P.PredictError, match=r"rows.h5'.*lacks 1 of the 4 columns .*: 'c'"):
        P.load_input(run, str(tmp_path / "rows.h5"))


def test_non_numeric_training_column_is_named(base, rows, tmp_path):
    run = P.load_run(base / "cls")
    frame = shuffled_table(rows)
    frame["b"] = "n/a"
    with pytest.raises(P.PredictError, match=r"the DataFrame: column\(s\) 'b' \((object|str)\) are not numeric, "
                                             "but the ensemble takes them as features$"):
        P.data_input(run, frame)


# ----------------------------------------------------------------------------------- --keep
def test_keep_carries_columns_first_in_row_order(base, rows, tmp_path):
    """Text IDs exactly as written, a feature that is also kept (raw values), first in every output."""
    run = P.load_run(base / "cls")
    x, y, ids = rows
    shuffled_table(rows).to_csv(tmp_path / "rows.csv", index=False)
    inp = P.load_input(run, str(tmp_path / "rows.csv"), keep=["sample_id,a"])
    assert list(inp.kept) == ["sample_id", "a"]
    np.testing.assert_allclose(inp.kept["a"], x[:, 0], rtol=1e-7)                 # as the CSV writes it
    result = P.predict_arrays(run, inp.x)
    for suffix in (".csv", ".parquet", ".npz"):
        P.write_predictions(tmp_path / f"p{suffix}", run, result, inp.y, inp.kept)
    csv = pd.read_csv(tmp_path / "p.csv", dtype={"sample_id": str})
    parquet = pd.read_parquet(tmp_path / "p.parquet")
    npz = np.load(tmp_path / "p.npz")                                     # no pickle needed
    assert list(csv.columns[:3]) == list(parquet.columns[:3]) == ["sample_id", "a", "prediction"]
    assert list(npz.files[:2]) == ["sample_id", "a"]
    for got in (csv["sample_id"], parquet["sample_id"], npz["sample_id"]):
        assert list(got) == ids
    np.testing.assert_allclose(csv[["p_neg", "p_pos"]].to_numpy(), result["proba"], rtol=1e-6)
    assert csv["target"].tolist() == y.tolist()


def test_keep_errors_say_why(base, rows, tmp_path):
    run = P.load_run(base / "cls")
    shuffled_table(rows).to_csv(tmp_path / "rows.csv", index=False)
    with pytest.raises(P.PredictError, match=r"--keep names 'site', but .*rows.csv' has no such column; its "
                                             r"columns are 'sample_id', 'd', 'b', 'label', 'a', 'c', 'notes'"):
        P.load_input(run, str(tmp_path / "rows.csv"), keep=["sample_id", "site"])
    np.savez(tmp_path / "plain.npz", x=rows[0])
    with pytest.raises(P.PredictError, match=r"--keep sample_id: .*plain.npz' holds a plain array \(npz\) "
                                             "without column names"):
        P.load_input(run, str(tmp_path / "plain.npz"), keep=["sample_id"])
    with pytest.raises(P.PredictError, match="--data test regenerates the run's test split as arrays"):
        P.load_input(run, "test", keep=["sample_id"])
    with pytest.raises(P.PredictError, match="--keep 'p_pos': the output has a prediction column"):
        P.predict_frame(run, shuffled_table(rows).rename(columns={"sample_id": "p_pos"}), keep=["p_pos"])
    with pytest.raises(P.PredictError, match="plain array without column names"):
        P.predict_frame(run, rows[0], keep=["sample_id"])


# ------------------------------------------------------------------------- the Python API
def test_predict_frame_equals_the_library_and_keeps_the_index(base, rows):
    run = P.load_run(base / "cls")
    x, y, ids = rows
    frame = shuffled_table(rows).set_index(pd.Index(range(100, 112), name="row"))
    out = P.predict_frame(base / "cls", frame, keep=["sample_id"])
    expected = P.predict_arrays(run, P.prepare_features(run, x))
    assert list(out.columns) == ["sample_id", "prediction", "p_neg", "p_pos", "total_entropy", "aleatoric",
                                 "epistemic", "target"]
    assert out.index.equals(frame.index) and out["sample_id"].tolist() == ids
    np.testing.assert_allclose(out[["p_neg", "p_pos"]].to_numpy(), expected["proba"], rtol=1e-12)
    assert out["target"].tolist() == y.tolist()
    plain = P.predict_frame(run, x)                                  # an array: width/dtype checked
    np.testing.assert_allclose(plain[["p_neg", "p_pos"]].to_numpy(), expected["proba"], rtol=1e-12)
    assert "target" not in plain


def test_a_run_without_names_takes_table_columns_in_order_but_not_kept_ones(base, rows, tmp_path):
    """Trained on an npz: no names to match; the table's columns other than the kept ones are
    its features, in file order (regression, kept columns first in the output)."""
    run = P.load_run(base / "reg")
    assert not run.meta["feature_names"]
    x = rows[0]
    frame = pd.DataFrame(x, columns=["w", "x", "y", "z"])
    frame.insert(2, "sample_id", rows[2])
    out = P.predict_frame(run, frame, keep=["sample_id"])
    expected = P.predict_arrays(run, P.prepare_features(run, x))
    assert list(out.columns) == ["sample_id", "mean", "std", "aleatoric_var", "epistemic_var",
                                 *(f"{side}_{level}" for level in ("50", "80", "90", "95")
                                   for side in ("lower", "upper"))]
    np.testing.assert_allclose(out["upper_90"] - out["mean"], 1.6448536269514722 * out["std"], rtol=1e-9)
    np.testing.assert_allclose(out["mean"], expected["mean"], rtol=1e-12)
    with pytest.raises(P.PredictError, match=r"column\(s\) 'sample_id' \((object|str)\) are not numeric, .* "
                                             "trained on arrays without column names"):
        P.predict_frame(run, frame)                                   # the ID is a feature unless kept


# ----------------------------------------------------------------------- arrays without names
def bare_run(shape: list[int], reshape: list[int] | None = None) -> EnsembleRun:
    arch = {"name": "m", "members": 1, "layers": [{"type": "Dense", "units": 4}]}
    config = resolve_config({"architectures": [arch], "data": {} if reshape is None else {"reshape": reshape}})
    return EnsembleRun("r", config, {"task": "regression", "n_outputs": 1,
                                                            "input_shape": shape}, (),
                       np.zeros(shape, np.float32), np.ones(shape, np.float32), {})


def test_plain_arrays_are_checked_for_width_shape_and_dtype(base, tmp_path):
    run = bare_run([8, 8, 1])
    x = np.arange(3 * 64, dtype=np.float64).reshape(3, 64)
    for form in (x, x.reshape(3, 8, 8, 1), x.reshape(3, 8, 8)):       # flat, the training shape, squeezed
        np.testing.assert_array_equal(P.prepare_features(run, form, "'x.npz'"), x.reshape(3, 8, 8, 1))
    with pytest.raises(P.PredictError, match=r"'x.npz' has samples of shape \[4, 16\], but the ensemble was "
                                             r"trained on input shape \[8, 8, 1\]; .* flat \(64 values\)"):
        P.prepare_features(run, x.reshape(3, 4, 16), "'x.npz'")
    reshaped = bare_run([8, 8, 1], reshape=[8, 8, 1])             # the raw training shape is not kept
    assert P.prepare_features(reshaped, x.reshape(3, 4, 16)).shape == (3, 8, 8, 1)
    with pytest.raises(P.PredictError, match=r"'x.npz' has 10 features per sample \(shape \[10\]\), but the "
                                             r"ensemble was trained on 64 \(input shape \[8, 8, 1\]\)"):
        P.prepare_features(run, np.zeros((3, 10)), "'x.npz'")
    with pytest.raises(P.PredictError, match=r"'x.npz': features must be numbers, but have dtype <U1"):
        P.prepare_features(run, np.full((3, 64), "a"), "'x.npz'")
    cls = P.load_run(base / "cls")
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = np.zeros((5, 3), np.float32)
        f["s"] = np.array([[b"a"] * 4] * 5)
    with pytest.raises(P.PredictError, match=r"plain.h5' has 3 features per sample .* trained on 4"):
        P.load_input(cls, str(tmp_path / "plain.h5"))
    with pytest.raises(P.PredictError, match=r"plain.h5': features must be numbers, but have dtype \|S1"):
        P.load_input(cls, str(tmp_path / "plain.h5"), x="s")


def test_pandas_hdf5_tables_are_refused_because_pandas_unpickles_them(base, tmp_path):
    """A pandas HDF5 table can hold pickled objects that run code when read: refused, with or
    without PyTables, before anything of the file but its layout is read."""
    run = P.load_run(base / "cls")
    with h5py.File(tmp_path / "pandas.h5", "w") as f:                # the layout DataFrame.to_hdf leaves
        f.create_group("frame").attrs["pandas_type"] = "frame"
    with pytest.raises(P.PredictError, match="'frame' is a pandas HDF5 table .* unpickles .* Parquet"):
        P.load_input(run, str(tmp_path / "pandas.h5"), x="frame")


def test_one_flat_row_is_one_sample(base, rows):
    run, x = P.load_run(base / "cls"), rows[0]
    np.testing.assert_array_equal(P.prepare_features(run, x[0]), P.prepare_features(run, x[:1]))
    with pytest.raises(P.PredictError, match="has 3 features per sample"):
        P.prepare_features(run, x[0, :3][None])


def test_predicting_on_the_training_file_is_recognised(tmp_path):
    from types import SimpleNamespace
    (tmp_path / "train.csv").write_text("a,label\n1,0\n")
    (tmp_path / "new.csv").write_text("a,label\n1,0\n")
    run = SimpleNamespace(config=SimpleNamespace(data=SimpleNamespace(source=str(tmp_path / "train.csv"))))
    assert P._is_training_file(f"{tmp_path}/./train.csv", run)
    assert not P._is_training_file(str(tmp_path / "new.csv"), run) and not P._is_training_file("test", run)


def test_one_sample_shaped_as_in_training_is_one_sample_and_masked_entries_are_missing(caplog):
    """An image (16, 16, 1) given alone was read as 16 samples of (16, 1) and refused; a masked
    array (what netCDF4 returns) lost its mask and its fill values were predicted on."""
    from types import SimpleNamespace

    from ensemble.inference.inputs import data_input, prepare_features
    data = SimpleNamespace(reshape=[], label="", normalize="standard")
    run = SimpleNamespace(input_shape=[4, 4, 1], shift=np.zeros((4, 4, 1)), scale=np.ones((4, 4, 1)),
                          config=SimpleNamespace(data=data), meta={"feature_names": []})
    img = np.arange(16.0).reshape(4, 4, 1)
    assert prepare_features(run, img).shape == (1, 4, 4, 1)
    assert prepare_features(run, np.stack([img] * 3)).shape == (3, 4, 4, 1)
    masked = np.ma.masked_array(np.stack([img, img]), mask=np.stack([img, img]) > 14)
    with pytest.raises(P.PredictError, match="NaN/inf values or masked entries"):
        prepare_features(run, masked)
    with pytest.raises(P.PredictError, match="NaN/inf values or masked entries"):
        data_input(run, masked)                    # ensemble.load(run).predict(masked): the mask was dropped
    assert prepare_features(run, np.ma.masked_array(np.stack([img]))).shape == (1, 4, 4, 1)    # none masked
    flat = SimpleNamespace(input_shape=[3], shift=np.zeros(3), scale=np.ones(3), config=SimpleNamespace(data=data),
                           meta={"feature_names": []})
    caplog.clear()
    with caplog.at_level(logging.INFO):
        data_input(flat, pd.DataFrame(np.ones((2, 3))))                 # a frame's own 0, 1, 2: said quietly
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        data_input(flat, pd.DataFrame(np.ones((2, 3)), columns=["c", "a", "b"]))
    assert "taken by position in their order, not by name" in caplog.records[-1].getMessage()
    assert caplog.records[-1].levelno == logging.WARNING
    caplog.clear()
    prepare_features(flat, np.array([[1.0, -2.0, 3.0], [0.5, 40.0, 0.0], [9.0, 9.0, 9.0]]))
    far = [r.getMessage() for r in caplog.records if "outside the training data" in r.getMessage()]
    assert len(far) == 1 and "1 of 3 samples have a feature more than 10 training standard deviations" in far[0]
    assert "up to 40" in far[0] and "first rows, counted from 0: [1]" in far[0]


def test_a_handle_refuses_its_run_directory_once_written_again(tmp_path):
    """A notebook cell re-run with ``overwrite=True`` left the older handle reading the new
    run's files (its test rows, its models) against its own summary and weights, unsaid; after
    ``reselect``, a handle that had predicted went on answering with the replaced ensemble."""
    import os

    import ensemble
    make_run(tmp_path / "run", {"source": "iris"}, [{"id": "m-000", "weight": 1.0}])
    ens = ensemble.load(tmp_path / "run")
    x = np.ones((2, 4))
    first = ens.predict(x)[0]
    later = (tmp_path / "run" / "ensemble.json").stat().st_mtime_ns + 10**9
    os.utime(tmp_path / "run" / "ensemble.json", ns=(later, later))
    assert first.shape == (2, 3)
    for use in (lambda: ens.predict(x), lambda: ens.members, lambda: ens.metrics, lambda: ens.data("test"),
                lambda: ens.predict_frame(x)):
        with pytest.raises(P.PredictError, match="was written again since it was loaded"):
            use()                                                 # its models in memory are not the run's now
    assert "written again since loaded" in repr(ens) and ens.task == "classification"
    fresh = ensemble.load(tmp_path / "run")
    with pytest.raises(P.PredictError, match="was written again since it was loaded"):
        os.utime(tmp_path / "run" / "ensemble.json", ns=(later + 1, later + 1))
        fresh.predict(x)                                          # none read yet: they would be the new run's


def test_a_run_trained_with_categories_encodes_new_rows_as_in_training(tmp_path, caplog):
    """A run whose table had a text column of few values (one input per value): new rows give the
    column as text, in any column order; a value training never saw is all 0, warned; the
    column missing is named as the table's column, not as its inputs."""
    rng = np.random.default_rng(0)
    train = pd.DataFrame({"a": rng.normal(size=60), "site": ["x", "y", "z"] * 20})
    train["label"] = np.where(train["a"] > 0, "pos", "neg")
    train.to_csv(tmp_path / "train.csv", index=False)
    make_run(tmp_path / "run", {"source": str(tmp_path / "train.csv")}, [{"id": "m-000", "weight": 1.0}])
    run = P.load_run(tmp_path / "run")
    assert run.meta["feature_names"] == ["a", "site=x", "site=y", "site=z"]
    new = pd.DataFrame({"site": ["z", "x", "w"], "a": [0.5, -1.0, 0.0]})
    with caplog.at_level(logging.WARNING):
        got = P.data_input(run, new)
    norm = np.load(tmp_path / "run" / "normalization.npz")
    raw = np.array([[0.5, 0, 0, 1], [-1.0, 1, 0, 0], [0.0, 0, 0, 0]])
    np.testing.assert_allclose(got.x, (raw - norm["shift"]) / norm["scale"], rtol=1e-6)
    assert "'site': 'w'" in caplog.text and "all 0" in caplog.text
    new.to_csv(tmp_path / "new.csv", index=False)
    np.testing.assert_allclose(P.load_input(run, str(tmp_path / "new.csv")).x, got.x)
    with pytest.raises(P.PredictError, match=r"lacks 1 of the 2 columns .*: 'site'"):
        P.data_input(run, new[["a"]])


def test_a_gap_or_a_typo_in_new_rows_is_named_by_column_and_row(base, rows):
    """One NaN cell refused the file without naming its column; a stray text cell named the column
    as "not numeric", not the cell."""
    run = P.load_run(base / "cls")
    frame = shuffled_table(rows)
    frame.loc[3, "c"] = np.nan
    with pytest.raises(P.PredictError, match=r"1 NaN/inf values in column\(s\) 'c' \(1\) \(first rows, counted "
                                             r"from 0: \[3\]\)"):
        P.data_input(run, frame)
    frame = shuffled_table(rows).astype({"b": object})
    frame.loc[2, "b"] = "abc"
    with pytest.raises(P.PredictError, match=r"column 'b' holds numbers but for row 2: 'abc'"):
        P.data_input(run, frame)


def test_a_run_with_impute_fills_new_rows_as_in_training(tmp_path, caplog):
    frame = pd.DataFrame({"a": np.arange(40.0), "b": np.r_[np.nan, np.arange(39.0) * 2]})
    frame["label"] = np.where(frame["a"] > 20, "hi", "lo")
    frame.to_csv(tmp_path / "train.csv", index=False)
    make_run(tmp_path / "run", {"source": str(tmp_path / "train.csv"), "impute": "median"},
             [{"id": "m-000", "weight": 1.0}])
    run = P.load_run(tmp_path / "run")
    fill = run.meta["impute"]["values"]
    new = pd.DataFrame({"a": [1.0, np.nan], "b": [np.nan, 4.0]})
    with caplog.at_level(logging.WARNING):
        got = P.data_input(run, new).x
    expected = P.data_input(run, pd.DataFrame({"a": [1.0, fill[0]], "b": [fill[1], 4.0]})).x
    np.testing.assert_allclose(got, expected)
    assert "2 missing value(s) in 2 row(s) filled with their feature's training median" in caplog.text


def test_one_file_of_one_sample_is_scored_with_its_scalar_target():
    """`predict RUN --data vols/v0001.h5` (a volume and its scalar target, a run trained on a folder
    of them) said "TypeError: len() of unsized object"."""
    from types import SimpleNamespace

    from ensemble.inference.inputs import encode_targets
    run = SimpleNamespace(task="regression", n_outputs=1)
    assert encode_targets(run, np.array(2.5), 1).tolist() == [2.5]
    with pytest.raises(P.PredictError, match="1 targets for 3 samples"):
        encode_targets(run, np.array(2.5), 3)


def test_a_dict_of_columns_and_a_row_as_a_series_are_matched_by_name(caplog):
    """ens.predict({"a": [..], ...}) said "the array holds no samples (features of shape [])"."""
    from types import SimpleNamespace

    from ensemble.inference.inputs import data_input
    data = SimpleNamespace(reshape=[], label="", normalize="standard")
    run = SimpleNamespace(input_shape=[3], shift=np.zeros(3), scale=np.ones(3), config=SimpleNamespace(data=data),
                          meta={"feature_names": ["a", "b", "c"]})
    frame = pd.DataFrame({"c": [3.0, 6.0], "a": [1.0, 4.0], "b": [2.0, 5.0]})
    expected = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(data_input(run, frame.to_dict("list")).x, expected)
    np.testing.assert_array_equal(data_input(run, {"b": 2.0, "c": 3.0, "a": 1.0}).x, expected[:1])   # one row
    np.testing.assert_array_equal(data_input(run, frame.iloc[1]).x, expected[1:])          # df.iloc[1]: a row
    assert data_input(run, frame.iloc[1]).index.tolist() == [1]          # predict_frame's rows: one, labelled 1
    assert data_input(run, frame.set_index(pd.Index(["p", "q"]))).index.tolist() == ["p", "q"]   # (not a, b, c)
    with pytest.raises(P.PredictError, match="lacks 2 of the 3 columns"):
        data_input(run, frame["a"])                                                        # df["a"]: a column
