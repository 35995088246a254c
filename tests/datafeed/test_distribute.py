"""broadcast_arrays under real MPI: each test runs mpiexec on mpi_distribute_prog.py.

A subprocess timeout turns a deadlock into a failure instead of a hung test run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parents[2]
PROG = Path(__file__).with_name("mpi_distribute_prog.py")
ARRAY_NAMES = ["f32_2d", "i64_1d", "u8_4d", "empty", "fortran", "strided_be", "scalar", "memmap"]


def mpiexec() -> str:
    """The mpiexec next to this Python (the `mpich` wheel), else one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        pytest.skip("no mpiexec: install the `mpich` wheel (pip install mpich)")
    return found


def run_mpi(n: int, *args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the program on ``n`` ranks; return the process and one result dict per rank."""
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("ENSEMBLE_PRETEND_NODES", "_ENSEMBLE_DISTRIBUTE_CORRUPT")}
    full_env = {**inherited, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, str(PROG), *args],
                          capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)
    results, decoder, text = [], json.JSONDecoder(), proc.stdout
    start = text.find("RESULT ")
    while start >= 0:  # ranks' lines may arrive glued together; decode each object
        obj, end = decoder.raw_decode(text, start + len("RESULT "))
        results.append(obj)
        start = text.find("RESULT ", end)
    return proc, sorted(results, key=lambda r: r["rank"])


def write_npy(tmp_path: Path) -> str:
    path = tmp_path / "data.npy"
    np.save(path, np.arange(3000, dtype=np.float64).reshape(100, 30))
    return str(path)


def test_arrays_arrive_intact_read_only_and_in_one_copy(tmp_path: Path) -> None:
    """One real node: dtypes, shapes, values and order survive; views are read-only.

    Covers float32 2-D, int64 1-D, uint8 4-D, a 0-size array, a Fortran-ordered and a
    strided big-endian input (both arrive C-contiguous), a 0-d array and a memmap.
    """
    proc, results = run_mpi(3, "data", "--npy", write_npy(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["names"] == ARRAY_NAMES for r in results)
    assert all(r["node_size"] == 3 and r["leader"] == 0 for r in results)
    assert len({r["mapping"] for r in results}) == 1  # every rank maps the same shm object
    assert all(r["marker"] == 1 for r in results)  # and sees the leader's write


def test_small_chunks_and_pretend_nodes_keep_one_copy_per_node(tmp_path: Path) -> None:
    """-n 4, pretend_nodes=2, 1000-byte chunks (no multiple of any itemsize), verify on.

    "Same memory" is judged by the shm object backing each rank's view (device and
    inode in /proc/self/maps) and by a write of each leader that only its own ranks
    see; virtual addresses differ between processes even where the memory is shared.
    """
    proc, results = run_mpi(4, "data", "--npy", write_npy(tmp_path), "--pretend", "2",
                            "--chunk-bytes", "1000", "--verify")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(r["rank"], r["leader"], r["node_rank"]) for r in results] == \
        [(0, 0, 0), (1, 0, 1), (2, 2, 0), (3, 2, 1)]
    by_node = defaultdict(set)
    for r in results:
        by_node[r["leader"]].add(r["mapping"])
        assert r["marker"] == r["leader"] + 1  # sees its own node's write, not the other's
    assert all(len(maps) == 1 for maps in by_node.values())  # same memory within a node
    assert by_node[0].isdisjoint(by_node[2])  # different memory across nodes


def test_corrupted_transfer_raises_on_every_rank(tmp_path: Path) -> None:
    """A byte flipped on leader rank 2 after receipt fails verify on all 4 ranks, no hang."""
    proc, results = run_mpi(4, "data", "--verify", env={"ENSEMBLE_PRETEND_NODES": "2",
                                                        "_ENSEMBLE_DISTRIBUTE_CORRUPT": "2"})
    assert proc.returncode != 0
    assert [r["rank"] for r in results] == [0, 1, 2, 3], proc.stdout + proc.stderr[-3000:]
    for r in results:
        assert r["error"].startswith("RuntimeError: broadcast_arrays: checksum mismatch")
        assert "'f32_2d' on rank 2" in r["error"]


def test_object_array_is_rejected_on_every_rank() -> None:
    """A root-side input error becomes a ValueError everywhere, naming the array."""
    proc, results = run_mpi(3, "bad-input")
    assert proc.returncode != 0
    assert [r["rank"] for r in results] == [0, 1, 2], proc.stdout + proc.stderr[-3000:]
    assert all("array 'objects' has dtype object" in r["error"] for r in results)


@pytest.mark.slow
@pytest.mark.long          # make test-long: the chunked transfer's smaller tests above cover the path
def test_transfer_over_2_gib_with_verify() -> None:
    """2.2 GiB of uint8 in one array crosses two pretend nodes in 256 MiB messages."""
    proc, results = run_mpi(2, "big", "--gib", "2.2", "--pretend", "2", "--verify", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["n"] == int(2.2 * 2**30) and r["node_size"] == 1 for r in results)
