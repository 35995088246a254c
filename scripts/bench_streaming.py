"""Streaming's memory and speed (issue 33): ``python scripts/bench_streaming.py memory|speed``.

``memory``: HDF5 shards of 16 KiB samples (4096 float32 features, 10 classes) make datasets
of 1x, 2x, 4x and 8x a fixed memory cap (``--cap-gb``: ``data.node_memory_gb`` x
``data.memory_share``, the setting that makes ``data.stream = "auto"`` stream; no ulimit or
cgroup). Each size is trained as a whole ensemble run, ``mpiexec -n 3`` (a master and two
workers, 2 members, 1 epoch), and every rank's peak resident memory (``ru_maxrss``) is
printed, and, for the streamed runs, the peak of ``ensemble predict RUN --data test`` (one
process; the test rows are read a chunk at a time); sizes up to ``--memory-max-x`` times the
cap also run in memory (``data.stream = false``) beside it, for contrast. The files are made once in ``--dir``
(8x the cap on disk; the smaller sizes are folders of links to the first files) and removed
at the end unless ``--keep``.

``speed``: one process, one dataset that fits in memory, a tiny MLP; the in-memory pipeline
(``datafeed.pipeline.make_dataset``) and the streaming one (``datafeed.streaming.Streamed``)
train an epoch each in turn, ``--reps`` times after a warm-up epoch; each repetition's ratio
of samples per second (streamed over in memory), their median, quartiles and range, for
narrow rows (64 features) and wide ones (4096).

``--write PAGE`` writes either table, dated, into PAGE between its
``<!-- bench_streaming memory|speed -->`` marks (docs/your-data.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FILE_ROWS = 1024                       # rows per shard file


def write_shards(folder: Path, n_files: int, features: int, seed: int = 0, start: int = 0) -> None:
    """``n_files`` HDF5 files of ``FILE_ROWS`` rows: features normal, a label from a fixed linear map."""
    import h5py
    folder.mkdir(parents=True, exist_ok=True)
    w = np.random.default_rng(12345).normal(size=(features, 10)).astype(np.float32) / np.sqrt(features)
    for i in range(start, start + n_files):
        rng = np.random.default_rng(seed * 100003 + i)
        x = rng.standard_normal((FILE_ROWS, features), dtype=np.float32)
        y = np.argmax(x @ w + 0.5 * rng.standard_normal((FILE_ROWS, 10), dtype=np.float32), axis=1)
        with h5py.File(folder / f"part{i:05d}.h5", "w") as f:
            f["x"], f["y"] = x, y


def predict_wrapper() -> None:
    """``bench_streaming.py predict RUN_DIR OUT PEAK``: ``ensemble predict RUN_DIR --data test``,
    then its peak resident memory written to PEAK."""
    from ensemble.predict import main
    code = main([sys.argv[2], "--data", "test", "--out", sys.argv[3]])
    Path(sys.argv[4]).write_text(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
    sys.exit(code)


def rank_wrapper() -> None:
    """``bench_streaming.py rank CONFIG RUN_DIR``: run ``ensemble.run`` on this rank, then write
    its peak resident memory to ``$BENCH_PEAKS/rank<N>.json``."""
    from ensemble.run import main
    code = main([sys.argv[2], "--run-dir", sys.argv[3]])
    from mpi4py import MPI
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rank = MPI.COMM_WORLD.Get_rank()
    Path(os.environ["BENCH_PEAKS"], f"rank{rank}.json").write_text(json.dumps({"rank": rank, "peak": peak}))
    sys.exit(code)


CONFIG = """
seed = 1
[data]
source = "{source}"
stream = {stream}
node_memory_gb = {node_gb}
memory_share = {share}
shuffle_buffer = 2048
[train]
epochs = 1
batch_size = 256
patience = 5
[[architectures]]
members = 2
layers = [{{type = "Dense", units = 16, activation = "relu"}}]
[runtime]
threads = 1
"""


def run_size(folder: Path, stream: str, node_gb: float, share: float, work: Path, tag: str) -> dict:
    cfg = work / f"{tag}.toml"
    cfg.write_text(textwrap.dedent(CONFIG.format(source=folder, stream=stream, node_gb=node_gb, share=share)))
    run_dir = work / f"run-{tag}"
    shutil.rmtree(run_dir, ignore_errors=True)
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    peaks_dir = work / f"peaks-{tag}"
    peaks_dir.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "BENCH_PEAKS": str(peaks_dir),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.monotonic()
    proc = subprocess.run([mpiexec, "-n", "3", sys.executable, __file__, "rank", str(cfg), str(run_dir)],
                          capture_output=True, text=True, env=env, timeout=1800)
    seconds = time.monotonic() - t0
    peaks = sorted((json.loads(p.read_text()) for p in peaks_dir.glob("rank*.json")), key=lambda r: r["rank"])
    journal = [json.loads(x) for x in (run_dir / "journal.jsonl").read_text().splitlines()] \
        if (run_dir / "journal.jsonl").exists() else []
    ok = sum(1 for r in journal if r.get("status") == "ok" and "val" in r)
    streamed = "stream" in json.loads((run_dir / "data.json").read_text()) if (run_dir / "data.json").exists() else None
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
    predict = None
    if streamed and proc.returncode == 0:         # the test rows, read a chunk at a time, through the members
        peak = work / f"predict-{tag}.json"
        got = subprocess.run([sys.executable, __file__, "predict", str(run_dir), str(work / f"test-{tag}.npz"),
                              str(peak)], capture_output=True, text=True, env=env, timeout=1800)
        if got.returncode != 0:
            print(got.stderr[-3000:], file=sys.stderr)
        test_rows = len(np.load(run_dir / "splits.npz")["test"])
        predict = {"code": got.returncode, "peak": json.loads(peak.read_text())["peak"] if peak.exists() else 0,
                   "rows": test_rows, "gb": round(test_rows * 4096 * 4 / 1e9, 3)}
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"code": proc.returncode, "peaks": [p["peak"] for p in peaks], "members_ok": ok,
            "streamed": streamed, "seconds": round(seconds, 1), "predict": predict}


def bench_memory(args) -> None:
    features = 4096
    row = features * 4
    cap = args.cap_gb * 1e9
    files_1x = max(1, round(cap / (FILE_ROWS * row)))
    base = Path(args.dir)
    full = base / "all"
    have = len(list(full.glob("*.h5"))) if full.exists() else 0
    need = 8 * files_1x
    if have < need:
        print(f"writing {need - have} files of {FILE_ROWS * row / 2**20:.0f} MiB to {full} ...", flush=True)
        write_shards(full, need - have, features, start=have)
    node_gb, share = args.cap_gb / 0.25, 0.25
    work = Path(tempfile.mkdtemp(prefix="bench-streaming-"))
    rows = []
    try:
        for x in (1, 2, 4, 8):
            folder = base / f"x{x}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            for i in range(x * files_1x):
                (folder / f"part{i:05d}.h5").symlink_to(full / f"part{i:05d}.h5")
            size = x * files_1x * FILE_ROWS * row
            for stream in (["\"auto\"", "false"] if x <= args.memory_max_x else ["\"auto\""]):
                got = run_size(folder, stream, node_gb, share, work, f"x{x}-{stream.strip(chr(34))}")
                line = {"x": x, "gb": round(size / 1e9, 3), "setting": stream.strip('"'), **got}
                rows.append(line)
                peaks = ", ".join(f"{p / 2**20:.0f}" for p in got["peaks"])
                print(f"{x}x cap ({size / 1e9:.2f} GB), data.stream={stream}: streamed={got['streamed']} "
                      f"members ok {got['members_ok']}/2, exit {got['code']}, {got['seconds']} s; "
                      f"peak RSS per rank (MiB, rank 0 first): {peaks}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    result = {"cap_gb": args.cap_gb, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    print(json.dumps(result))
    if args.write:
        write_block(Path(args.write), "memory", memory_table(result, args))


def memory_table(result: dict, args) -> str:
    """The memory figures as the docs show them (``--write``), with the streamed peaks' spread."""
    def mib(v: float) -> str:
        return f"{v / 2**20:,.0f}"

    def predicted(p: dict | None) -> str:
        if not p:
            return "-"
        return f"{p['gb']:.2f} GB, {mib(p['peak'])} MiB" if p["code"] == 0 else f"failed (exit {p['code']})"
    lines = [f"Measured {result['date']}, `python scripts/bench_streaming.py memory --cap-gb {args.cap_gb:g} "
             f"--memory-max-x {args.memory_max_x} --write {args.write}`:", "",
             "| dataset on disk | `data.stream` | streamed | members | peak RSS rank 0 | peak RSS workers "
             "| `predict --data test`: test rows, peak RSS |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        peaks = r["peaks"] or [0]
        setting = '"auto"' if r["setting"] == "auto" else "false"
        lines.append(f"| {r['gb']:.2f} GB ({r['x']}x) | {setting} | "
                     f"{'yes' if r['streamed'] else 'no'} | {r['members_ok']}/2 | {mib(peaks[0])} MiB | "
                     f"{', '.join(mib(p) for p in peaks[1:])} MiB | {predicted(r.get('predict'))} |")
    streamed = [r for r in result["rows"] if r["setting"] == "auto" and r["peaks"]]
    if len(streamed) > 1:
        for which, name in ((0, "rank 0"), (slice(1, None), "workers")):
            vals = [max(r["peaks"][which]) if isinstance(which, slice) else r["peaks"][which] for r in streamed]
            lines.append("")
            lines.append(f"Streamed, {name}: peak from {mib(vals[0])} MiB at 1x to {mib(vals[-1])} MiB at "
                         f"{streamed[-1]['x']}x the cap, {100 * (max(vals) / min(vals) - 1):.1f}% between the "
                         "lowest and the highest.")
    ran = [r["predict"] for r in streamed if r.get("predict")]
    if ran:
        lines.append("")
        lines.append(f"`ensemble predict RUN --data test` (one process, the test rows a chunk at a time): peak "
                     f"from {mib(ran[0]['peak'])} MiB ({ran[0]['gb']:.2f} GB of test rows) to "
                     f"{mib(ran[-1]['peak'])} MiB ({ran[-1]['gb']:.2f} GB, more than the cap).")
    return "\n".join(lines)


def speed_pair(features: int, n_files: int, batch: int, reps: int) -> dict:
    """One dataset that fits: the in-memory and the streamed pipeline train the same tiny MLP,
    an epoch each in turn (which goes first alternates), ``reps`` times after a warm-up epoch;
    each repetition's ratio of samples per second, streamed over in memory."""
    import keras

    from datafeed.pipeline import make_dataset, member_indices
    from datafeed.prepare import prepare_with_rows
    from datafeed.splits import read_data
    from datafeed.streaming import Streamed, prepare_stream, stream_plan
    from ensemble.config import resolve_config
    folder = Path(tempfile.mkdtemp(prefix="bench-speed-"))
    try:
        write_shards(folder, n_files, features)
        arch = [{"layers": [{"type": "Dense", "units": 16}]}]
        mem = resolve_config({"data": {"source": str(folder), "stream": False}, "architectures": arch}).data
        got = read_data(mem)
        arrays, meta, _ = prepare_with_rows(got.x, got.y, got.info, mem, 0, got.rows)
        del got
        st = resolve_config({"data": {"source": str(folder), "stream": True}, "architectures": arch}).data
        s_arrays, s_meta, _ = prepare_stream(stream_plan(st), st, 0)
        n = len(arrays["y_train"])
        pipelines = {"memory": make_dataset(arrays["x_train"], arrays["y_train"], member_indices(n, 0, False),
                                            batch, 0),
                     "stream": Streamed(s_meta, s_arrays).train_dataset(batch, 0)}
        models = {}
        for name, ds in pipelines.items():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(32, activation="relu"),
                                      keras.layers.Dense(10, activation="softmax")])
            model.compile("adam", "sparse_categorical_crossentropy")
            model.fit(ds, epochs=1, verbose=0)          # warm-up: tracing, the file cache
            models[name] = model
        rates: dict[str, list[float]] = {k: [] for k in pipelines}
        cpu: dict[str, list[float]] = {k: [] for k in pipelines}       # CPU seconds per sample, all threads
        for r in range(reps):
            for name in (("memory", "stream") if r % 2 == 0 else ("stream", "memory")):
                t0, c0 = time.perf_counter(), time.process_time()
                models[name].fit(pipelines[name], epochs=1, verbose=0)
                rates[name].append(n / (time.perf_counter() - t0))
                cpu[name].append((time.process_time() - c0) / n)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ratios = sorted(s / m for s, m in zip(rates["stream"], rates["memory"]))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"features": features, "rows": n, "batch": batch, "reps": reps,
            "memory": round(statistics.median(rates["memory"])), "stream": round(statistics.median(rates["stream"])),
            "ratio": round(statistics.median(ratios), 3), "ratio_q1": round(q[0], 3), "ratio_q3": round(q[2], 3),
            "ratio_min": round(ratios[0], 3), "ratio_max": round(ratios[-1], 3),
            "cpu_ratio": round(statistics.median(s / m for s, m in zip(cpu["stream"], cpu["memory"])), 3)}


def bench_speed(args) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(1)
    load = os.getloadavg()[0]
    rows = []
    for features, n_files in ((64, args.files), (4096, max(2, args.files // 4))):
        got = speed_pair(features, n_files, args.batch, args.reps)
        rows.append(got)
        print(f"{features} features, {got['rows']} training rows, batch {args.batch}: in memory {got['memory']} "
              f"samples/s, streamed {got['stream']} samples/s (medians); streamed / in memory: median "
              f"{got['ratio']:.2f}, quartiles {got['ratio_q1']:.2f}-{got['ratio_q3']:.2f}, range "
              f"{got['ratio_min']:.2f}-{got['ratio_max']:.2f} over {args.reps} paired epochs; CPU time per sample "
              f"{got['cpu_ratio']:.2f}x", flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "load": [round(load, 1), round(os.getloadavg()[0], 1)],
              "cores": os.cpu_count(), "rows": rows}
    print(json.dumps(result))
    if args.write:
        write_block(Path(args.write), "speed", speed_table(result, args))


def speed_table(result: dict, args) -> str:
    """The speed figures as the docs show them (``--write``)."""
    lines = [f"Measured {result['date']} on {result['cores']} cores (load average {result['load'][0]} before, "
             f"{result['load'][1]} after), `python scripts/bench_streaming.py speed --reps {args.reps} --write "
             f"{args.write}`:", "",
             "| features per sample | training rows | in memory | streamed | streamed / in memory: median "
             "| quartiles | range | CPU time per sample, streamed / in memory |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['features']:,} | {r['rows']:,} | {r['memory']:,} /s | {r['stream']:,} /s | "
                     f"**{r['ratio']:.2f}** | {r['ratio_q1']:.2f}-{r['ratio_q3']:.2f} | "
                     f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f} | {r['cpu_ratio']:.2f} |")
    return "\n".join(lines)


def write_block(page: Path, name: str, text: str) -> None:
    """Replace what lies between ``<!-- bench_streaming NAME -->`` and ``<!-- /bench_streaming NAME -->``."""
    begin, end = f"<!-- bench_streaming {name} -->", f"<!-- /bench_streaming {name} -->"
    old = page.read_text()
    if begin not in old or end not in old:
        raise SystemExit(f"{page} has no {begin} ... {end} block to write into")
    head, rest = old.split(begin, 1)
    page.write_text(head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1])
    print(f"wrote the {name} table into {page}")


def plot(args) -> None:
    """Peak RSS per rank against the dataset's size, from the JSON lines ``memory`` printed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for path in args.logs:
        found = [json.loads(line) for line in Path(path).read_text().splitlines() if line.startswith('{"cap_gb"')]
        for got in found:
            for setting, style in (("auto", "o-"), ("false", "s--")):
                rows = [r for r in got["rows"] if r["setting"] == setting and r["peaks"]]
                if not rows:
                    continue
                label = "streamed" if setting == "auto" else "in memory"
                for which, name in ((0, "rank 0"), (-1, "worker")):
                    ax.plot([r["gb"] for r in rows], [r["peaks"][which] / 2**20 for r in rows], style,
                            label=f"{label}, {name} (cap {got['cap_gb']:g} GB)")
                ran = [r for r in rows if r.get("predict") and r["predict"]["code"] == 0]
                if ran:
                    ax.plot([r["gb"] for r in ran], [r["predict"]["peak"] / 2**20 for r in ran], "^:",
                            label=f"predict --data test on the streamed run (cap {got['cap_gb']:g} GB)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("dataset on disk, GB (1x, 2x, 4x, 8x the cap)")
    ax.set_ylabel("peak resident memory, MiB")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        return rank_wrapper()
    if len(sys.argv) > 1 and sys.argv[1] == "predict":
        return predict_wrapper()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    mem = sub.add_parser("memory", help="peak RSS per rank as the dataset grows past a memory cap")
    mem.add_argument("--cap-gb", type=float, default=0.25, help="the memory cap: data streams above it")
    mem.add_argument("--memory-max-x", type=int, default=2, help="also run in memory up to this many caps")
    mem.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "bench-streaming-data"))
    mem.add_argument("--keep", action="store_true", help="keep the files for another run")
    mem.add_argument("--write", help="write the table into this page (between its bench_streaming marks)")
    speed = sub.add_parser("speed", help="streaming vs in-memory samples/s on data that fits")
    speed.add_argument("--files", type=int, default=48, help="shards of 1024 rows (64 features; a quarter "
                                                              "as many of 4096)")
    speed.add_argument("--batch", type=int, default=128)
    speed.add_argument("--reps", type=int, default=7, help="paired epochs (in memory, streamed) per dataset")
    speed.add_argument("--write", help="write the table into this page (between its bench_streaming marks)")
    pl = sub.add_parser("plot", help="plot the peak RSS lines of `memory` logs")
    pl.add_argument("logs", nargs="+", help="what `memory` printed")
    pl.add_argument("--out", default=str(ROOT / "docs" / "streaming-memory.png"))
    args = parser.parse_args()
    {"memory": bench_memory, "speed": bench_speed, "plot": plot}[args.what](args)


if __name__ == "__main__":
    main()
