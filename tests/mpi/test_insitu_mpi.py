"""In-situ inference under real mpiexec: every simulation rank's answers about its own rows
equal ``ensemble.predict`` on the same rows (to 1e-6), for both placements; a bad run
directory fails on every rank at once; the graph is traced once, at load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ensemble import load as load_ensemble
from tests.conftest import ROOT, run_mpi
from tests.mpi.test_predict_mpi import make_run

pytestmark = pytest.mark.mpi
PROG = str(ROOT / "tests" / "mpi" / "insitu_prog.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A Gaussian-and-plain regression ensemble with two targets, and an iris classifier."""
    base = tmp_path_factory.mktemp("insitu_mpi")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 5)).astype(np.float32) * [1, 10, 100, 0.1, 1] + 3
    y = np.stack([x[:, 0] + 0.01 * x[:, 2], x[:, 1] * x[:, 3]], axis=1)
    np.savez(base / "two_targets.npz", x=x, y=y)
    make_run(base / "reg", {"source": str(base / "two_targets.npz"), "task": "regression"},
             [{"id": "g-000", "weight": 0.4, "gaussian": True}, {"id": "plain-000", "weight": 0.2},
              {"id": "g-001", "weight": 0.1, "gaussian": True}])
    make_run(base / "cls", {"source": "iris"},
             [{"id": f"m-{i:03d}", "weight": w} for i, w in enumerate((0.5, 0.3, 0.2))])
    return base


def check(runs, out, placement: str, n_sim: int, names=("reg", "cls")) -> None:
    """Each simulation rank's three steps, against ``ensemble.load(run).predict_details``."""
    for name in names:
        ens = load_ensemble(runs / name)
        for rank in range(n_sim):
            for step in range(3):
                got = np.load(out / f"{placement}-{name}-{rank}-{step}.npz")
                assert len(got["x"]) == 1 + 13 * rank + 40 * step
                want = ens.predict_details(got["x"])
                flat = {f"{k}.{kk}": vv for k, v in want.items() if isinstance(v, dict) for kk, vv in v.items()}
                flat.update({k: v for k, v in want.items() if not isinstance(v, dict)})
                assert set(got.files) - {"x"} == set(flat)
                for key, value in flat.items():
                    np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5,   # float32 rounding
                                               err_msg=f"{placement} {name} {key}")
                if name == "reg":       # a real spread, not zeros that would match anything
                    assert (got["std"] > 0).all() and got["mean"].shape == (len(got["x"]), 2)


def infos(out, placement: str, name: str, n: int) -> list[dict]:
    return [json.loads((out / f"{placement}-{name}-w{r}.json").read_text()) for r in range(n)]


def check_info(out, placement: str, name: str, n: int) -> None:
    """What every rank says about itself: the error seen on the missing run, tracings, roles,
    and (placement "node") the server's batches."""
    if placement == "local":
        for info in infos(out, "local", name, n):
            assert "does not exist" in info["missing"]          # the same error on every rank, no hang
            assert not info["serving"] and info["sim_size"] == n and info["calls"] == 3
            assert info["traces_at_load"] == 1 and info["traces"] == 1     # warmed at load; no retrace per step
        return
    server, *clients = infos(out, "node", name, n)
    c = n - 1
    assert server["serving"] and server["traces"] == 1 and "does not exist" in server["missing"]
    assert server["requests"] == 3 * c
    assert server["rows"] == sum(1 + 13 * r + 40 * s for r in range(c) for s in range(3))
    # the server waits for all its clients each step (batch_wait 30 s): one batch per step
    assert server["batches"] == 3 and server["largest_batch"] == sum(1 + 13 * r + 80 for r in range(c))
    assert sorted(i["sim_rank"] for i in clients) == list(range(c))
    assert all(not i["serving"] and i["sim_size"] == c and i["traces"] == 0 for i in clients)
    assert server["tensorflow"] and not any(i["tensorflow"] for i in clients)    # clients stay light


@pytest.mark.long                 # make test-long, with the -n 4 case (make test's 12 minutes are spent)
@pytest.mark.slow
def test_both_placements_every_rank_equals_predict_three_ranks(runs, tmp_path):
    """-n 3, the regression ensemble (Gaussian and plain members, intervals): "local" (3 ranks
    predicting), then "node" (one server batching two clients)."""
    proc = run_mpi(3, [PROG, str(tmp_path), str(runs / "reg")], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check(runs, tmp_path, "local", 3, ("reg",))
    check_info(tmp_path, "local", "reg", 3)
    check(runs, tmp_path, "node", 2, ("reg",))
    check_info(tmp_path, "node", "reg", 3)


@pytest.mark.long
@pytest.mark.slow
def test_both_placements_every_rank_equals_predict(runs, tmp_path):
    """-n 4, both ensembles: "local" (4 ranks predicting), then "node" (one server, three clients)."""
    proc = run_mpi(4, [PROG, str(tmp_path), str(runs / "reg"), str(runs / "cls")], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check(runs, tmp_path, "local", 4)
    check(runs, tmp_path, "node", 3)
    for name in ("reg", "cls"):
        check_info(tmp_path, "local", name, 4)
        check_info(tmp_path, "node", name, 4)


@pytest.mark.long
@pytest.mark.slow
def test_the_example_collects_and_runs_with_a_server(tmp_path):
    """examples/heat_insitu.py at a tiny size: `collect` on 2 ranks writes (features, outcome)
    rows; an ensemble made on them (seeded weights, no training) runs inside the simulation
    with placement "node" (1 server, 2 simulation ranks); threshold 0 keeps every patch."""
    example = str(ROOT / "examples" / "heat_insitu.py")
    size = ["--local", "32", "--patch", "8", "--warm", "0", "--every", "10"]
    proc = run_mpi(2, [example, "collect", "--out", str(tmp_path / "rows.npz"), "--steps", "60", *size], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = np.load(tmp_path / "rows.npz")
    assert rows["x"].shape == (2 * 16 * 5, 8) and rows["y"].shape == (2 * 16 * 5,)    # 16 patches, t = 0..20 by 5
    make_run(tmp_path / "run", {"source": str(tmp_path / "rows.npz"), "task": "regression"},
             [{"id": "g-000", "weight": 0.5, "gaussian": True}, {"id": "g-001", "weight": 0.5, "gaussian": True}])
    proc = run_mpi(3, [example, "run", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out"),
                       "--placement", "node", "--steps", "60", "--threshold", "0", *size], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = json.loads((tmp_path / "out" / "snapshots.json").read_text())["log"]
    assert [r["step"] for r in log] == [0, 10, 20, 30, 40, 50, 60]
    assert all(r["snapshots"] == r["patches"] == 2 * 16 for r in log)
    assert "mae" in log[0] and "mae" not in log[-1]          # scored HORIZON (40) steps later
    snap = np.load(tmp_path / "out" / "snapshots" / "step000010-rank0001.npz")
    assert snap["fields"].shape == (16, 2, 8, 8) and list(snap["patches"]) == list(range(16))
    assert "224 of 224 patches written" in proc.stdout and "] 14 requests in" in proc.stdout


def test_a_client_that_never_closes_and_mixed_placements_end_the_job(runs, tmp_path):
    """A "node" client whose script ended without close() left its server in serve() and the
    job hung; ranks loading with different placements waited in different collectives, for ever."""
    proc = run_mpi(3, [str(ROOT / "tests" / "mpi" / "insitu_exit_prog.py"), str(tmp_path), str(runs / "reg")],
                   timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(3):
        said = (tmp_path / f"mixed-{rank}.txt").read_text()
        assert "every rank must load with the same placement" in said and "'node', 'local'" in said
    assert (tmp_path / "served.txt").read_text() == "2"                  # both clients' one request
    assert (tmp_path / "client-0.txt").read_text() == "(3, 2)" and (tmp_path / "client-1.txt").read_text() == "(0, 2)"
    assert proc.stderr.count("ended without session.close(): closed as Python exits") == 2
