"""No idle GPU for the master: with GPUs on the node (faked here the way a scheduler shows
them, a node-wide CUDA_VISIBLE_DEVICES list), rank 0 binds one and trains members in a
thread beside its loop; on a CPU-only node it trains nothing (today's behaviour)."""

from __future__ import annotations

import textwrap

import pytest

from ensemble.config import resolve_config
from ensemble.results.journal import read_journal
from ensemble.run import trains_on_master
from ensemble.runtime.env import Binding
from tests.conftest import run_mpi

CONFIG = """
name = "mt"
seed = 7
[data]
source = "digits"
[train]
epochs = 2
patience = 2
[[architectures]]
name = "mlp"
members = 6
layers = [{type = "Dense", units = 16, activation = "relu"}]
[runtime]
progress_lines = 0
"""


def test_auto_trains_on_the_master_only_with_a_gpu_of_its_own():
    gpu = Binding("nvidia", "CUDA_VISIBLE_DEVICES", "0", 0)
    hidden = Binding("nvidia", "CUDA_VISIBLE_DEVICES", "-1", 0, preset=True)
    auto = resolve_config({"architectures": [{"layers": [{"type": "Dense", "units": 2}]}]}).runtime
    assert auto.master_trains == "auto" and auto.group_size == 1
    assert trains_on_master(auto, gpu) and not trains_on_master(auto, None) and not trains_on_master(auto, hidden)
    assert not trains_on_master(auto.replace(group_size=2), gpu)
    assert trains_on_master(auto.replace(master_trains=True), None)
    assert not trains_on_master(auto.replace(master_trains=False), gpu)


@pytest.mark.mpi
@pytest.mark.long           # make test-long: trains_on_master's unit tests above decide; this runs it
@pytest.mark.parametrize("gpus, master_trains", [("0,1,2", True), (None, False)])
def test_three_ranks_the_master_trains_when_the_node_has_gpus(tmp_path, gpus, master_trains):
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    run_dir = tmp_path / "run"
    env = {"CUDA_VISIBLE_DEVICES": gpus} if gpus else {}
    proc = run_mpi(3, ["-m", "ensemble.run", str(cfg), "--run-dir", str(run_dir)], timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = read_journal(run_dir / "journal.jsonl")
    assert len(records) == 6 and all(r["status"] == "ok" for r in records)
    ranks = {r["rank"] for r in records}
    assert (0 in ranks) == master_trains and {1, 2} <= ranks
    assert ("and the master" in proc.stdout) == master_trains
