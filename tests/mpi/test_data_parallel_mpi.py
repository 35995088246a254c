"""Data-parallel members under real MPI: ``mpiexec -n 2 python tests/mpi/dp_prog.py``.

One run (about 40 s here) checks that G=2 ends with the weights of G=1 at the same
global batch (SGD with momentum and Adam, uneven last shards of 1 and 2 rows), that
one fused Allreduce is made per step, and that a stop asked by one rank stops both.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi

PROG = Path(__file__).with_name("dp_prog.py")


@pytest.fixture(scope="module")
def result() -> dict:
    proc = run_mpi(2, [str(PROG)], timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_two_ranks_end_with_the_weights_of_one_rank(result, optimizer):
    case = result[optimizer]
    assert case["ranks_differ"] == 0.0                      # both ranks hold the same model
    # float32 sums in another order (two half-batch means instead of one mean): ~1e-7
    assert case["max_rel_diff"] < 1e-5 and case["allclose_1e-5"], case
    assert case["history_max_rel_diff"] < 1e-5              # group-averaged logs = single-rank logs
    assert case["iterations"] == case["single_iterations"] == 20     # 5 global batches x 4 epochs


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_one_fused_allreduce_per_step(result, optimizer):
    case = result[optimizer]
    assert case["allreduce_calls"] == case["iterations"]
    assert case["buffer_floats"] == case["padded_params"] + 2   # all gradients (64-byte aligned) + rows + stop
    assert case["receive_buffers"] == 1                      # reused, never reallocated


def test_time_limit_on_one_rank_stops_both_at_the_same_epoch(result):
    r0, r1 = result["epoch_stop"]
    assert r0["epochs"] == r1["epochs"] == 2 and r0["iterations"] == r1["iterations"] == 10
    assert r1["requested"] and not r0["requested"] and r0["stopped"] and r1["stopped"]


def test_nan_stop_on_one_rank_mid_epoch_stops_both_after_the_next_step(result):
    r0, r1 = result["batch_stop"]
    assert r0["iterations"] == r1["iterations"] == 8 and r0["epochs"] == r1["epochs"] == 2
    assert r1["requested"] and not r0["requested"] and r0["stopped"] and r1["stopped"]


def test_batch_norm_statistics_and_validation_agree_across_ranks(result):
    assert result["bn_dropout"]["ranks_differ"] == 0.0
    assert result["bn_dropout"]["val_loss_equal"]
