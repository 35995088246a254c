"""The project's search against DeepHyper's regularized evolution, side by side in one
invocation: the same digits split, the same MLP search space, the same 3 worker processes
on the same cores, the same wall-time budget.

    pip install --target /tmp/dh deephyper==0.13.2      # or: pip install -e ".[bench]"
    python scripts/bench_search.py --budget 60 --deephyper-path /tmp/dh

The space, on both sides: 1 to 3 Dense layers of 16 to 128 units, each with an activation
from relu, elu, tanh, and a dropout rate from 0 to 0.5 after it; adam, rmsprop or adamw; a
learning rate from 3e-4 to 1e-2 (log); a batch size of 32, 64 or 128. Every candidate trains
up to 20 epochs with early stopping (patience 4, best weights kept). The project's genome
expresses the same choices with its own operators (a dropout gene is a layer of its own,
and it may add skip connections); DeepHyper samples a fixed-shape configuration.

Printed: per side, evaluations, best validation accuracy, the time from launch to
DeepHyper's final best, and the test accuracy of each side's best model and of the
project's ensemble; ``--plot PATH`` draws best-so-far validation accuracy against wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from benchkit import mpiexec, workspace  # noqa: E402

from ensemble.results.records import MemberRecord  # noqa: E402

EPOCHS, PATIENCE, SEED = 20, 4, 3
PROJECT_CONFIG = f"""
name = "bench_search"
mode = "evolve"
seed = {SEED}
[data]
source = "digits"
task = "classification"
test_fraction = 0.2
[train]
epochs = {EPOCHS}
patience = {PATIENCE}
member_time_limit = 120
[evolve]
strategy = "regularized"
evaluations = 100000
population_size = 12
sample_size = 4
[search]
layer_types = ["dense", "dropout"]
min_depth = 1
max_depth = 6
units = [16, 128]
activations = ["relu", "elu", "tanh"]
dropout = [0.0, 0.5]
learning_rate = [3e-4, 1e-2]
batch_size = [32, 64, 128]
optimizers = ["adam", "rmsprop", "adamw"]
skip_connections = false
[ensemble]
metric = "accuracy"
"""


def project_side(folder: Path, budget: float, workers: int, extra: str = "") -> dict:
    cfg = folder / "project.toml"
    text = PROJECT_CONFIG.replace("evaluations = 100000", f"evaluations = 100000\ntime_limit = {budget}{extra}")
    cfg.write_text(text)
    run_dir = folder / "project_run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    launched = time.time()
    proc = subprocess.run([mpiexec(), "-n", str(workers + 1), sys.executable, "-m", "ensemble.run", str(cfg),
                           "--run-dir", str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the project's search failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    done = sorted((r for r in records if "event" not in r and MemberRecord.from_json(r).status.evaluated),
                  key=lambda r: r["received"])                 # finished or discarded: evaluations
    curve, best = [], -1.0
    for r in done:
        if MemberRecord.from_json(r).ok:
            best = max(best, r["val"]["accuracy"])
        curve.append((r["received"] - launched, best))
    summary = json.loads((run_dir / "ensemble.json").read_text())
    return {"evaluations": len(done), "best_val": best, "curve": curve,
            "best_test": summary["best_member"]["test"]["accuracy"],
            "ensemble_test": summary["ensemble"]["test"]["accuracy"]}


def split_arrays() -> dict:
    """The project's own digits split (same seed, same normalisation) for DeepHyper's side."""
    sys.path.insert(0, str(ROOT))
    import tomllib

    from datafeed.prepare import prepare_with_rows
    from datafeed.readers import read_dataset
    from ensemble.config import resolve_config
    cfg = resolve_config(tomllib.loads(PROJECT_CONFIG))
    x, y, info = read_dataset(cfg.data)
    arrays, _, _ = prepare_with_rows(x, y, info, cfg.data, cfg.seed)
    return {k: arrays[k] for k in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")}


DATA_FILE = None


def run_candidate(job) -> dict:
    """DeepHyper's run function: one MLP, trained as the project trains a candidate."""
    import numpy as np
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    p = job.parameters
    with np.load(os.environ["BENCH_SEARCH_DATA"]) as f:
        d = {k: f[k] for k in f.files}
    keras.utils.set_random_seed(int(p.get("seed", 0)))
    inputs = keras.Input((d["x_train"].shape[1],))
    h = inputs
    for i in range(int(p["depth"])):
        h = keras.layers.Dense(int(p[f"units_{i}"]), activation=p[f"activation_{i}"])(h)
        if p[f"dropout_{i}"] > 0:
            h = keras.layers.Dropout(float(p[f"dropout_{i}"]))(h)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))
    opt = {"adam": keras.optimizers.Adam, "rmsprop": keras.optimizers.RMSprop,
           "adamw": keras.optimizers.AdamW}[p["optimizer"]](learning_rate=float(p["learning_rate"]))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(d["x_train"], d["y_train"], batch_size=int(p["batch_size"]), epochs=EPOCHS, verbose=0,
              validation_data=(d["x_val"], d["y_val"]),
              callbacks=[keras.callbacks.EarlyStopping(monitor="val_loss", patience=PATIENCE,
                                                       restore_best_weights=True)])
    val = model.evaluate(d["x_val"], d["y_val"], verbose=0)[1]
    test = model.evaluate(d["x_test"], d["y_test"], verbose=0)[1]
    return {"objective": float(val), "metadata": {"test": float(test)}}


def deephyper_side(folder: Path, budget: float, workers: int) -> dict:
    import numpy as np
    from deephyper.evaluator import Evaluator
    from deephyper.hpo import HpProblem, RegularizedEvolution
    np.savez(folder / "split.npz", **split_arrays())
    os.environ["BENCH_SEARCH_DATA"] = str(folder / "split.npz")
    os.environ["OMP_NUM_THREADS"] = "1"
    problem = HpProblem()
    problem.add_hyperparameter((1, 3), "depth")
    for i in range(3):
        problem.add_hyperparameter((16, 128), f"units_{i}")
        problem.add_hyperparameter(["relu", "elu", "tanh"], f"activation_{i}")
        problem.add_hyperparameter((0.0, 0.5), f"dropout_{i}")
    problem.add_hyperparameter(["adam", "rmsprop", "adamw"], "optimizer")
    problem.add_hyperparameter((3e-4, 1e-2, "log-uniform"), "learning_rate")
    problem.add_hyperparameter([32, 64, 128], "batch_size")
    launched = time.monotonic()
    evaluator = Evaluator.create(run_candidate, method="process", method_kwargs={"num_workers": workers})
    search = RegularizedEvolution(problem, random_state=SEED, log_dir=str(folder / "deephyper"),
                                  population_size=12, sample_size=4)
    results = search.search(evaluator, timeout=int(budget))
    results = results[results["objective"].apply(lambda v: isinstance(v, (int, float)))]
    gather = next(c for c in results.columns if "timestamp_gather" in c)
    start = next((c for c in results.columns if "timestamp_start" in c or "timestamp_submit" in c), None)
    results = results.sort_values(gather)
    # DeepHyper's timestamps count from its evaluator's creation (time.monotonic); from the launch here
    offset = float(evaluator.timestamp - launched)
    curve, best = [], -1.0
    for _, row in results.iterrows():
        best = max(best, float(row["objective"]))
        curve.append((float(row[gather]) + offset, best))
    top = results.loc[results["objective"].astype(float).idxmax()]
    test_col = next(c for c in results.columns if c.endswith("test"))
    return {"evaluations": len(results), "best_val": best, "curve": curve, "best_test": float(top[test_col]),
            "ensemble_test": None, "timestamps": [gather, start]}


def reached(curve, target: float):
    return next((t for t, b in curve if b >= target - 1e-12), None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=60.0, help="seconds of search on each side")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--deephyper-path", help="a folder DeepHyper was installed into with pip --target")
    p.add_argument("--asha", action="store_true", help="the project's side with evolve.discard = \"asha\"")
    p.add_argument("--plot", help="write best-so-far validation accuracy against wall time here (PNG)")
    p.add_argument("--keep", help="folder to keep the runs in")
    args = p.parse_args()
    if args.deephyper_path:
        sys.path.append(args.deephyper_path)              # after the venv: its numpy and TensorFlow win
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), args.deephyper_path]))
    with workspace(args.keep, "bench_search_") as folder:
        sides = {"deephyper": deephyper_side(folder, args.budget, args.workers),
                 "project": project_side(folder, args.budget, args.workers,
                                         '\ndiscard = "asha"' if args.asha else "")}
        target = sides["deephyper"]["best_val"]
        print(f"\n{'side':10s}{'evals':>7s}{'best val':>10s}{'to DH best':>12s}{'best test':>11s}{'ensemble':>10s}")
        for name, s in sides.items():
            t = reached(s["curve"], target)
            when = "never" if t is None else f"{t:.1f} s"
            ens = "" if s["ensemble_test"] is None else f"{s['ensemble_test']:.4f}"
            print(f"{name:10s}{s['evaluations']:7d}{s['best_val']:10.4f}{when:>12s}{s['best_test']:11.4f}{ens:>10s}")
        dh_wall = max(t for t, _ in sides["deephyper"]["curve"])
        t = reached(sides["project"]["curve"], target)
        if t is not None:
            print(f"the project reaches DeepHyper's final best ({target:.4f}) in {t:.1f} s: "
                  f"{t / dh_wall:.2f} of DeepHyper's {dh_wall:.1f} s")
        (folder / "bench_search.json").write_text(json.dumps(sides, indent=1))
        if args.plot:
            import matplotlib
            matplotlib.use("Agg")
            from matplotlib.figure import Figure
            fig = Figure(figsize=(7, 4))
            ax = fig.subplots()
            for name, s in sides.items():
                ax.step([c[0] for c in s["curve"]], [c[1] for c in s["curve"]], where="post", label=name)
            ax.set(xlabel="seconds since launch", ylabel="best validation accuracy so far", ylim=(0.9, 1.0))
            ax.legend()
            ax.grid(alpha=0.3)
            fig.savefig(args.plot, dpi=100, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
