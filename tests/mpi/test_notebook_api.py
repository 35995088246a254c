"""The notebook example of docs/predict.md, run as it stands in a fresh process (one rank, no mpirun):
``ensemble.run_config`` trains, ``ensemble.load(...).predict`` reproduces ensemble.json's
test metrics, and the run wrote its report and the linear baseline row."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.mpi

CHECKS = """
import numpy as np
assert ens.evaluate(x, y) == __import__("pytest").approx(ens.metrics, rel=1e-9)
assert proba.shape == (len(x), 10) and np.allclose(proba.sum(axis=1), 1.0, atol=1e-5)
assert entropy.shape == (len(x),) and (entropy >= 0).all()
assert len(ens.leaderboard) == 3 and abs(ens.members["weight"].sum() - 1) < 1e-9
assert ens.config.train.epochs == 5
mean, spread = ens.predict(x[:4])                      # models stay loaded: a second call
assert np.allclose(mean, proba[:4], atol=1e-12)
print("CHECKED")
"""


def docs_example() -> str:
    text = (ROOT / "docs" / "predict.md").read_text()
    block = re.search(r"## In a notebook\n\n```python\n(.*?)```", text, re.S)
    assert block, "docs/predict.md has no '## In a notebook' python block"
    return block.group(1)


def test_the_docs_notebook_example_runs_and_reproduces_the_test_metrics(tmp_path):
    code = docs_example() + CHECKS
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "CHECKED" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "notebook"
    summary = json.loads((run / "ensemble.json").read_text())
    assert summary["baseline"]["model"] == "logistic regression"
    assert set(summary["baseline"]["test"]) == set(summary["ensemble"]["test"])
    assert (run / "report.html").is_file() and (run / "report" / "timeline.png").is_file()
    assert "logistic regression" in proc.stdout + proc.stderr          # the console table's baseline row
