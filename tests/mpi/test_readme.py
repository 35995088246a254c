"""The README's "Your own data" section, run as it stands: its config block on a small CSV,
then every command of its shell block in order (check, mpirun run, status, predict), with
the venv's ``ensemble`` and ``mpirun`` first on PATH as after ``source .venv/bin/activate``.
(``make demo`` and ``make test`` are what CI and the demo run.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.mpi


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_is_a_landing_page():
    assert len((ROOT / "README.md").read_bytes()) < 12_000


@pytest.mark.long                 # make test-long (about 40 s); the landing-page test stays in make test
def test_the_readme_config_and_commands_run_as_they_stand(tmp_path):
    config = next(b for b in blocks("toml") if 'name = "mine"' in b)
    commands = next(b for b in blocks("bash") if "ensemble check" in b)
    (tmp_path / "mine.toml").write_text(config)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(160, 4))
    table = pd.DataFrame(x, columns=["a", "b", "c", "d"]).assign(target=(x[:, 0] + x[:, 1] > 0).astype(int))
    (tmp_path / "data").mkdir()
    table.to_csv(tmp_path / "data" / "mine.csv", index=False)
    table.drop(columns="target").head(20).to_csv(tmp_path / "new.csv", index=False)

    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "2",
           "OMP_NUM_THREADS": "1"}
    ran = []
    for line in commands.splitlines():
        command = line.split("#")[0].strip()
        if not command or command.startswith("source "):
            continue
        proc = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        ran.append(command.split()[0:2])
    assert [c[1] if c[0] == "ensemble" else c[0] for c in ran] == ["check", "mpirun", "status", "predict"]
    preds = pd.read_csv(tmp_path / "preds.csv")
    assert len(preds) == 20 and {"prediction", "total_entropy"} <= set(preds.columns)
    assert (tmp_path / "runs" / "mine" / "report.html").is_file()
