"""What the notebook API says when it is used wrongly: each message names the cause and the fix
(a new user's trial: an array given as `data.source`, a config file given to ``load``, a
``run_config`` whose data cannot be read)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ensemble
from ensemble.config import ConfigError, resolve_config
from ensemble.inference.load import PredictError
from tests.conftest import ROOT


def test_an_array_given_as_the_data_source_is_named_by_its_shape_not_printed():
    with pytest.raises(ConfigError) as err:
        resolve_config({"data": {"source": np.zeros((1000, 30))},
                        "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})
    text = str(err.value)
    assert "an array of shape [1000, 30]" in text and "np.savez" in text and len(text) < 400


def test_a_config_file_given_to_load_names_where_its_run_went(tmp_path):
    config = tmp_path / "m.toml"
    config.write_text('name = "m"\n[[architectures]]\nlayers = [{type = "Dense", units = 4}]\n')
    with pytest.raises(PredictError, match=r"is a file, not a run directory; .*runs/m"):
        ensemble.load(config)


def test_run_config_raises_with_the_reason_the_run_stopped(tmp_path):
    """It raised "failed with exit code 3; its log above says why", the reason only logged."""
    code = textwrap.dedent(f"""
        import ensemble
        try:
            ensemble.run_config({{"name": "e", "output_dir": {str(tmp_path / 'runs')!r},
                                 "data": {{"source": "nothere.npz"}},
                                 "architectures": [{{"layers": [{{"type": "Dense", "units": 4}}]}}]}})
        except RuntimeError as exc:
            print("RAISED", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "RAISED the run of <config 'e'> failed with exit code 3: data error: `data.source` file" in proc.stdout, \
        proc.stdout + proc.stderr
    assert "nothere.npz' does not exist" in proc.stdout
