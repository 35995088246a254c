"""The MPI executor with real ranks and trainers that need no TensorFlow: in-training
reports reach the master, its decisions reach the worker (and every rank of a group)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n, group_size, nodes", [(3, 1, None), (5, 2, None), (5, 2, 3)])
def test_reports_and_decisions_cross_mpi(tmp_path, n, group_size, nodes):
    """With 3 (pretend) nodes holding ranks 0-1, 2-3 and 4, the groups are 2-3 (one node) and 1, 4:
    contiguous ranks made both groups span two nodes."""
    out = tmp_path / "out.json"
    proc = run_mpi(n, [str(ROOT / "tests/mpi/executor_prog.py"), str(out), str(group_size),
                       *([str(nodes)] if nodes else [])], timeout=120)
    assert proc.returncode == 0, proc.stderr
    master, *workers = json.loads(out.read_text())
    results = {r["id"]: r for r in master["results"]}
    assert sorted(results) == [f"m{i}" for i in range(6)]
    assert results["m1"]["epochs"] == 2                      # stopped by the master at epoch 2
    assert results["m2"]["lr"] == 0.25 and results["m2"]["epochs"] == 4
    assert all(r["epochs"] == 4 for i, r in results.items() if i not in ("m1",))
    groups = sorted({tuple(w["group"]) for w in workers})
    assert groups == ([(1, 4), (2, 3)] if nodes else [tuple(range(a, a + group_size)) for a in range(1, n, group_size)])
    assert {r["rank"] for r in results.values()} <= {g[0] for g in groups}          # leaders report
    by_spec: dict[str, list] = {}
    for w in workers:
        for s in w["seen"]:
            by_spec.setdefault(s["id"], []).append((tuple(s["actions"]), s["lr"]))
    for spec_id, views in by_spec.items():                 # every rank of a group saw the same
        assert len(views) == group_size and len(set(views)) == 1, (spec_id, views)
