"""Bad configs and bad data at -n 3: a clear message from rank 0, before any member is handed
out, and every rank ends (``run_mpi``'s timeout fails a hang)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

DENSE = '[[architectures]]\nlayers = [{type = "Dense", units = 4}]\n'


def npz(tmp_path, **arrays):
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    return path


def x(n=40, d=4):
    return np.random.default_rng(0).normal(size=(n, d)).astype(np.float32)


def y(n=40):
    return np.arange(n) % 2


def case_nan(tmp_path):
    bad = x()
    bad[3, 1] = np.nan
    return f'[data]\nsource = "{npz(tmp_path, x=bad, y=y())}"\n' + DENSE


def case_length(tmp_path):
    return f'[data]\nsource = "{npz(tmp_path, x=x(), y=y(39))}"\n' + DENSE


def case_npz_name(tmp_path):
    return f'[data]\nsource = "{npz(tmp_path, feats=x(), y=y())}"\n' + DENSE


def case_csv_column(tmp_path):
    path = tmp_path / "d.csv"
    pd.DataFrame({"a": x()[:, 0], "target": y()}).to_csv(path, index=False)
    return f'[data]\nsource = "{path}"\nlabel = "class"\n' + DENSE


def case_h5_dataset(tmp_path):
    import h5py
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = x(), y()
    return f'[data]\nsource = "{path}"\nx = "/images"\n' + DENSE


def case_reshape(tmp_path):
    return f'[data]\nsource = "{npz(tmp_path, x=x(), y=y())}"\nreshape = [3, 3]\n' + DENSE


def case_latin1(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes("a,b,label\n".encode() + b"".join(f"{i},{i % 3},caf\xe9\n".encode("latin-1") for i in range(40)))
    return f'[data]\nsource = "{path}"\n' + DENSE


CASES = [
    # (what is tried, config text or a function writing data and returning it, expected message)
    ("unknown key", "[train]\nepocs = 3\n" + DENSE, "unknown setting `train.epocs` (did you mean 'epochs'?)"),
    ("wrong type", '[train]\nepochs = "ten"\n' + DENSE, "`train.epochs` must be an integer"),
    ("impossible value", "[data]\nval_fraction = 1.5\n" + DENSE, "`data.val_fraction` must be between 0 and 1"),
    ("not TOML", "name = \n", "is not valid TOML"),
    ("unknown layer type", '[[architectures]]\nlayers = [{type = "Dense2", units = 4}]\n',
     "`architectures[0].layers[0].type` must be one of"),
    ("no budget for evolve", 'mode = "evolve"\n[evolve]\nevaluations = 0\n', "`evolve.evaluations` must be > 0"),
    ("unknown search key", 'mode = "evolve"\n[search]\nmax_dept = 3\n', "unknown setting `search.max_dept`"),
    ("group size does not divide the workers", "[runtime]\ngroup_size = 3\n" + DENSE,
     "`runtime.group_size` must divide the 2 worker ranks"),
    ("missing data file", '[data]\nsource = "/nonexistent/d.npz"\n' + DENSE, "does not exist"),
    ("NaN in features", case_nan, "NaN/inf values"),
    ("x/y length mismatch", case_length, "x has 40 samples, y has 39"),
    ("missing npz array", case_npz_name, "`data.x` names array 'x'"),
    ("missing CSV column", case_csv_column, "`data.label` names column 'class'"),
    ("missing HDF5 dataset", case_h5_dataset, "`data.x` names HDF5 dataset '/images'"),
    ("reshape does not fit", case_reshape, "`data.reshape` [3, 3] holds 9 values per sample, but each sample has 4"),
    ("Conv2D on flat vectors", '[[architectures]]\nlayers = [{type = "Conv2D", filters = 2, kernel_size = 3}]\n',
     "needs 3 axes per sample"),
    ("user model not importable", '[[architectures]]\nmodel = "no_such_package.models:build"\n',
     "cannot import module 'no_such_package.models'"),
    ("user builder without softmax", '[[architectures]]\nmodel = "tests.mpi.user_models:logits_mlp"\n',
     "`model` 'tests.mpi.user_models:logits_mlp' must output class probabilities"),
    ("gaussian loss on labels", '[train]\nloss = "gaussian_nll"\n' + DENSE, "is for regression"),
    ("a latin-1 CSV", case_latin1, "is not UTF-8 text"),
    ("search space too small for the data", 'mode = "evolve"\n[data]\nreshape = [8, 8, 1]\n[search]\nmax_params = 50\n',
     "raise `search.max_params`"),
]


@pytest.mark.parametrize("what, text, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_fast_on_every_rank(tmp_path, what, text, message):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text(tmp_path) if callable(text) else text)
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(tmp_path / "run")], timeout=60)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert proc.stderr.count(message) == 1                    # said once, by rank 0
    assert not (tmp_path / "run" / "journal.jsonl").exists()  # before any member: nothing half-written


def test_resume_without_a_run_is_refused(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(DENSE)
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(tmp_path / "none"), "--resume"],
                   timeout=60)
    assert proc.returncode != 0 and "holds no journal.jsonl to resume from" in proc.stderr


def test_a_run_directory_that_cannot_be_written_is_said_once_and_every_rank_ends(tmp_path):
    """Not a bad setting but a file system that refuses (here a run directory under a file;
    a read-only or full one alike): one message naming it, no traceback per rank."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(DENSE)
    (tmp_path / "file").write_text("a file, not a directory")
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(tmp_path / "file" / "run")], timeout=60)
    assert proc.returncode != 0                               # every rank ended: run_mpi fails a hang
    assert proc.stderr.count("cannot write the run directory") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "fatal error" not in proc.stderr, proc.stderr
