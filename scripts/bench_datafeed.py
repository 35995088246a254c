"""Benchmark: how fast and how lean the data reaches every rank, three ways side by side.

(a) shared: root memory-maps the .npy and ``broadcast_arrays`` puts one copy per
    (pretend) node into MPI shared memory;
(b) load:   every rank ``np.load``s the whole file itself (full read, no mmap);
(c) pickle: root loads it and mpi4py's pickled ``comm.bcast`` sends it to all.

For each size and rank count it reports the time until every rank holds the data
(barrier to barrier, max over ranks) and the data memory: peak resident set (VmHWM)
minus each rank's baseline, summed over ranks; also the summed Pss (shared pages
split among the processes mapping them) while the data is held. Cases whose
estimated memory exceeds 80% of MemAvailable are skipped. The files are written
first, so every method reads from the page cache.

    python scripts/bench_datafeed.py --sizes-gib 1 2.5 --ranks 4 8 --pretend-nodes 2

The last line of output is one JSON object with all figures and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
METHODS = ("shared", "load", "pickle")
GIB = 2**30
FEATURES = 256


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-gib", type=float, nargs="+", default=[1.0, 2.5])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--pretend-nodes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per mpiexec run")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.file, args.pretend_nodes)
    return drive(args)


# ----------------------------------------------------------------------------- driver

def drive(args: argparse.Namespace) -> int:
    """Write the datasets, run every case in its own mpiexec, print lines and the JSON."""
    command = " ".join(["python", "scripts/bench_datafeed.py", "--sizes-gib",
                        *map(str, args.sizes_gib), "--ranks", *map(str, args.ranks),
                        "--pretend-nodes", str(args.pretend_nodes)])
    report: dict = {"command": command, "cpus": os.cpu_count(),
                    "mem_total_gib": round(meminfo("MemTotal") / GIB, 1),
                    "pretend_nodes": args.pretend_nodes, "cases": []}
    tmp = Path(tempfile.mkdtemp(prefix="bench_datafeed_"))
    try:
        for size in args.sizes_gib:
            path = write_dataset(tmp / f"x_{size:g}gib.npy", size)
            for ranks in args.ranks:
                case = {"size_gib": size, "ranks": ranks, "results": {}}
                for method in METHODS:
                    result = run_case(method, path, size, ranks, args)
                    case["results"][method] = result
                    print(describe(size, ranks, method, result), flush=True)
                case["ratios"] = ratios(case["results"], size, args.pretend_nodes)
                print(f"  ratios: {case['ratios']}", flush=True)
                report["cases"].append(case)
            path.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    line = json.dumps(report)
    if args.out:
        args.out.write_text(line + "\n")
    print(line)
    return 0


def write_dataset(path: Path, size_gib: float) -> Path:
    """A float32 (rows, 256) .npy of about ``size_gib``; value at flat index i is i % 1000003."""
    rows = max(1, int(size_gib * GIB) // (4 * FEATURES))
    t0 = time.perf_counter()
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, FEATURES))
    step = max(1, (64 * 2**20) // (4 * FEATURES))
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        out[lo:hi] = (np.arange(lo * FEATURES, hi * FEATURES, dtype=np.int64) % 1000003).reshape(-1, FEATURES)
    out.flush()
    del out
    print(f"wrote {path.name}: {rows} x {FEATURES} float32 = {path.stat().st_size / GIB:.2f} GiB "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


def estimate_gib(method: str, size: float, ranks: int, pretend_nodes: int) -> float:
    """Memory a case needs: one copy per node; one per rank; pickle: two per rank + root's array.

    The pickle figure is what the 1 GiB runs measured (root 3 copies, others 2).
    """
    return {"shared": size * min(pretend_nodes, ranks), "load": size * ranks,
            "pickle": size * (2 * ranks + 1)}[method]


def run_case(method: str, path: Path, size: float, ranks: int, args: argparse.Namespace) -> dict:
    """One mpiexec run of the worker; a dict of figures, or {'status': 'skipped/failed: ...'}."""
    need = estimate_gib(method, size, ranks, args.pretend_nodes)
    available = meminfo("MemAvailable") / GIB
    if need > 0.8 * available:
        return {"status": f"skipped: would need {need:.1f} GiB, 80% of MemAvailable is {0.8 * available:.1f} GiB"}
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, str(Path(__file__).resolve()),
           "--worker", method, "--file", str(path), "--pretend-nodes", str(args.pretend_nodes)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("ENSEMBLE_PRETEND_NODES", None)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": f"failed: timed out after {args.timeout:g} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("BENCH "):
            result = json.loads(line[len("BENCH "):])
            if "error" in result:
                return {"status": f"failed: {result['error']}"}
            return {"status": "ok", **result}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": f"failed: exit {proc.returncode}: {tail[:300]}"}


def ratios(results: dict, size: float, pretend_nodes: int) -> dict:
    """Times of (b) and (c) over (a), and (a)'s summed data memory per node copy."""
    def ok(m: str) -> dict | None:
        return results[m] if results[m]["status"] == "ok" else None
    a, b, c = ok("shared"), ok("load"), ok("pickle")
    out = {}
    if a and b:
        out["time_load_over_shared"] = round(b["seconds"] / a["seconds"], 2)
    if a and c:
        out["time_pickle_over_shared"] = round(c["seconds"] / a["seconds"], 2)
    if a:
        copies = size * min(pretend_nodes, a["ranks"])
        out["shared_mem_over_node_copies"] = round(a["data_gib_sum"] / copies, 3)
        out["shared_pss_over_node_copies"] = round(a["pss_data_gib_sum"] / copies, 3)
    return out


def describe(size: float, ranks: int, method: str, r: dict) -> str:
    head = f"{size:g} GiB, {ranks} ranks, {method:6s}:"
    if r["status"] != "ok":
        return f"{head} {r['status']}"
    return (f"{head} {r['seconds']:7.2f} s until every rank holds the data; data memory "
            f"{r['data_gib_sum']:.2f} GiB summed VmHWM (peak {r['hwm_gib_sum']:.2f} incl. baseline "
            f"{r['base_gib_sum']:.2f}), {r['pss_data_gib_sum']:.2f} GiB summed Pss")


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        sys.exit("no mpiexec found: install the `mpich` wheel (pip install mpich)")
    return found


def meminfo(key: str) -> int:
    """A /proc/meminfo figure in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


# ----------------------------------------------------------------------------- worker

def proc_kib(path: str, key: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def worker(method: str, file: str, pretend_nodes: int) -> int:
    """One rank of one case: load the data by ``method``, measure, root prints BENCH json."""
    sys.path.insert(0, str(REPO))
    from mpi4py import MPI

    from datafeed.distribute import broadcast_arrays

    comm = MPI.COMM_WORLD
    try:
        with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
            f.write("5")
    except OSError:
        pass
    base = proc_kib("/proc/self/status", "VmRSS")
    base_pss = proc_kib("/proc/self/smaps_rollup", "Pss")
    keep = None
    try:
        comm.Barrier()
        t0 = MPI.Wtime()
        if method == "shared":
            keep = broadcast_arrays(comm, {"x": np.load(file, mmap_mode="r")} if comm.rank == 0 else None,
                                    pretend_nodes=pretend_nodes)
            x = keep["x"]
        elif method == "load":
            x = np.load(file)
        else:
            x = comm.bcast(np.load(file) if comm.rank == 0 else None, root=0)
        comm.Barrier()
        seconds = MPI.Wtime() - t0
    except Exception as exc:  # noqa: BLE001 - report any failure, then stop all ranks
        print("BENCH " + json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
        comm.Abort(2)
    hwm = proc_kib("/proc/self/status", "VmHWM")
    pss = proc_kib("/proc/self/smaps_rollup", "Pss")
    rng = np.random.default_rng(comm.rank)
    flat_idx = np.append(rng.integers(0, x.size, 1000), x.size - 1)
    correct = bool(np.array_equal(x.reshape(-1)[flat_idx], (flat_idx % 1000003).astype(np.float32)))
    figures = comm.gather((seconds, base, hwm, base_pss, pss, correct), root=0)
    if comm.rank == 0:
        s, b, h, bp, p, c = zip(*figures)
        kib = 2**20
        print("BENCH " + json.dumps({
            "ranks": comm.size, "seconds": round(max(s), 3), "correct": all(c),
            "data_gib_sum": round(sum(hh - bb for hh, bb in zip(h, b)) / kib, 3),
            "hwm_gib_sum": round(sum(h) / kib, 3), "base_gib_sum": round(sum(b) / kib, 3),
            "pss_data_gib_sum": round(sum(pp - bb for pp, bb in zip(p, bp)) / kib, 3),
            "data_gib_per_rank": [round((hh - bb) / kib, 3) for hh, bb in zip(h, b)]}), flush=True)
    comm.Barrier()
    if keep is not None:
        keep.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
