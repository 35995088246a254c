"""Ensemble runs from an HDF5 file and from a Parquet file, through config only, on 2 pretend nodes."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi


def write_h5(path):
    import h5py
    d = load_digits()
    with h5py.File(path, "w") as f:
        f["/images"] = d.images.astype(np.float32)[..., None]      # (n, 8, 8, 1)
        f["/labels"] = d.target
    return 'x = "/images"\ny = "/labels"'


def write_parquet(path):
    d = load_digits()
    frame = pd.DataFrame(d.data, columns=[f"px{i}" for i in range(64)])
    frame["digit"] = d.target
    frame.to_parquet(path)
    return 'label = "digit"'


@pytest.mark.parametrize("suffix, writer, layers", [
    ("h5", write_h5, '{type = "Conv2D", filters = 4, kernel_size = 3, activation = "relu"}, {type = "Flatten"}'),
    pytest.param("parquet", write_parquet, '{type = "Dense", units = 16, activation = "relu"}',
                 marks=pytest.mark.long),       # make test-long: the parquet reader has its unit tests
])
def test_run_from_file(tmp_path, suffix, writer, layers):
    data = tmp_path / f"digits.{suffix}"
    keys = writer(data)
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent(f"""
        [data]
        source = "digits.{suffix}"
        {{keys}}
        [train]
        epochs = 8
        learning_rate = 0.005
        [[architectures]]
        members = 2
        layers = [{layers}]
        [runtime]
        pretend_nodes = 2
        verify_broadcast = true
    """).replace("{keys}", keys))
    run_dir = tmp_path / "run"
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)])
    assert proc.returncode == 0, proc.stderr
    ens = json.loads((run_dir / "ensemble.json").read_text())
    assert ens["ensemble"]["test"]["accuracy"] > 0.5
    meta = json.loads((run_dir / "data.json").read_text())
    assert meta["input_shape"] == ([8, 8, 1] if suffix == "h5" else [64])
