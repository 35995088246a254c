"""The project's search against DeepHyper, side by side in one invocation, and the cost of the
project's surrogate on the master.

Digits (the first comparison; the project's MLP space against the same space in DeepHyper):

    pip install --target /tmp/dh deephyper==0.13.2      # or: pip install -e ".[bench]"
    python scripts/bench_search.py --budget 60 --deephyper-path /tmp/dh

The suite where the architecture matters (``scripts/search_problems.py``: signals, textures,
peaks), one run after the other, each appended to a results file as it ends (JSON lines), then
the table of medians over seeds and time-to-target ratios:

    python scripts/bench_search.py --problem signals,textures,peaks --seeds 1,2,3 --budget 150 \\
        --workers 2 --samples 1000 --sides project,surrogate,dh_re,dh_cbo \\
        --deephyper-path /tmp/dh --results bench_out/search_suite.jsonl
    python scripts/bench_search.py --table bench_out/search_suite.jsonl

Sides: ``project`` (``mode = "evolve"``, regularized evolution, ``search.space = "structured"``,
templates on), ``surrogate`` (the same with ``evolve.surrogate = "forest"``), ``compact`` (the same
with ``evolve.compact_start = true``), ``asha`` (with ``evolve.discard = "asha"``), ``dh_re``
(DeepHyper's regularized evolution) and ``dh_cbo`` (DeepHyper's Bayesian optimisation, CBO) over
a fixed-shape space a practitioner would write (0-3 conv blocks with doubling filters and
optional pooling, 0-2 dense layers, dropout, activation, optimizer, learning rate, batch size).
Every side: the project's own split of the same data, the same worker processes on the same
cores, the same budget, the same training per candidate (``--epochs``, default 30; ``--patience``,
default 5; best weights kept), the same regularized-evolution population (``--population``).

The master's cost of the surrogate (no training; µs per ask at 1,000 and 10,000 results):

    python scripts/bench_search.py --surrogate-cost
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from benchkit import mpiexec, workspace, write_block  # noqa: E402

from ensemble.config.vocabulary import proper_score  # noqa: E402
from ensemble.results.records import MemberRecord  # noqa: E402

SEED = 3
DIGITS = {"epochs": 20, "patience": 4}
PROJECT_CONFIG = """
name = "bench_search"
mode = "evolve"
seed = {seed}
[data]
source = "digits"
task = "classification"
test_fraction = 0.2
[train]
epochs = 20
patience = 4
member_time_limit = 120
[evolve]
strategy = "regularized"
evaluations = 100000
time_limit = {budget}
population_size = 12
sample_size = 4{extra}
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
SUITE_CONFIG = """
name = "bench_search"
mode = "evolve"
seed = {seed}
[data]
source = "{source}"
task = "{task}"
[train]
epochs = {epochs}
patience = {patience}
member_time_limit = 120
[evolve]
strategy = "regularized"
evaluations = 100000
time_limit = {budget}
population_size = {population}
sample_size = {sample}{extra}
[search]
space = "structured"
max_params = 100000
[ensemble]
metric = "{metric}"
"""
#: the proper score of a project run's test split, the first of these its summary has: log loss
#: (classification), Gaussian NLL (regression with a variance), MSE (the vocabulary's names)
PROPER_SCORES = (proper_score("classification"), proper_score("regression"), proper_score("regression", False))
DEEPHYPER: list[str] = []          # --deephyper-path, appended to sys.path (the venv's numpy and TensorFlow first)
PROJECT_SIDES = {"project": "", "surrogate": '\nsurrogate = "forest"', "asha": '\ndiscard = "asha"',
                 "inherit": "\ninherit = true", "compact": "\ncompact_start = true"}
DH_SIDES = ("dh_re", "dh_cbo")


class Problem:
    """One benchmark problem: its data file (None: digits), task, metric and project config."""

    def __init__(self, name: str, folder: Path, samples: int, epochs: int = 30, patience: int = 5,
                 population: int = 12):
        self.name, self.population = name, population
        if name == "digits":
            self.source, self.task, self.metric, self.training = None, "classification", "accuracy", DIGITS
            return
        from search_problems import PROBLEMS
        make, self.task = PROBLEMS[name]
        self.metric = "accuracy" if self.task == "classification" else "r2"
        self.training = {"epochs": epochs, "patience": patience}
        self.source = folder / "data" / f"{name}-{samples}.npz"
        if not self.source.is_file():
            import numpy as np
            self.source.parent.mkdir(parents=True, exist_ok=True)
            x, y = make(n=samples)
            np.savez(self.source, x=x, y=y)

    def config(self, seed: int, budget: float, extra: str = "") -> str:
        if self.source is None:
            return PROJECT_CONFIG.format(seed=seed, budget=budget, extra=extra)
        return SUITE_CONFIG.format(seed=seed, budget=budget, extra=extra, source=self.source, task=self.task,
                                   metric=self.metric, population=self.population,
                                   sample=max(2, self.population // 3), **self.training)


# ------------------------------------------------------------------------------ the project
def project_side(problem: Problem, folder: Path, seed: int, budget: float, workers: int, extra: str = "") -> dict:
    cfg = folder / "project.toml"
    cfg.write_text(problem.config(seed, budget, extra))
    run_dir = folder / "project_run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    launched = time.time()
    proc = subprocess.run([mpiexec(), "-n", str(workers + 1), sys.executable, "-m", "ensemble.run", str(cfg),
                           "--run-dir", str(run_dir), "--overwrite"], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the project's search failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    done = sorted((r for r in records if "event" not in r and MemberRecord.from_json(r).status.evaluated),
                  key=lambda r: r["received"])                 # finished or discarded: evaluations
    curve, best = [], -math.inf
    for r in done:
        if MemberRecord.from_json(r).ok:
            best = max(best, r["val"][problem.metric])
        curve.append((r["received"] - launched, best))
    summary = json.loads((run_dir / "ensemble.json").read_text())
    return {"evaluations": len(done), "best_val": best, "curve": curve,
            "best_test": summary["best_member"]["test"][problem.metric],
            "ensemble_test": summary["ensemble"]["test"][problem.metric],
            # the proper scores of the ensemble and its best member
            "proper": {who: {k: v for k, v in summary[who]["test"].items() if k in PROPER_SCORES}
                       for who in ("ensemble", "best_member")},
            "surrogate": summary.get("search", {}).get("surrogate")}


# ------------------------------------------------------------------------------ DeepHyper
def split_arrays(problem: Problem, seed: int) -> dict:
    """The project's own split (same seed, same normalisation) for DeepHyper's side."""
    import tomllib

    from datafeed.prepare import prepare_with_rows
    from datafeed.readers import read_dataset
    from ensemble.config import resolve_config
    cfg = resolve_config(tomllib.loads(problem.config(seed, 60)))
    x, y, info = read_dataset(cfg.data)
    arrays, _, _ = prepare_with_rows(x, y, info, cfg.data, cfg.seed)
    return {k: arrays[k] for k in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")}


def _score(model, x, y, task: str) -> float:
    import numpy as np
    pred = model.predict(x, verbose=0, batch_size=512)
    if task == "classification":
        return float(np.mean(pred.argmax(axis=1) == y.reshape(-1)))
    y = y.reshape(len(y), -1)[:, 0]
    return float(1 - np.sum((y - pred[:, 0]) ** 2) / np.sum((y - y.mean()) ** 2))


def run_candidate(job) -> dict:
    """DeepHyper's run function: one network of the fixed-shape space, trained as the project
    trains a candidate (same epochs, patience, best weights kept)."""
    import numpy as np
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    p = job.parameters
    task = os.environ["BENCH_SEARCH_TASK"]
    epochs, patience = (int(v) for v in os.environ["BENCH_SEARCH_TRAINING"].split(","))
    with np.load(os.environ["BENCH_SEARCH_DATA"]) as f:
        d = {k: f[k] for k in f.files}
    keras.utils.set_random_seed(int(p.get("seed", 0)))
    shape = d["x_train"].shape[1:]
    inputs = keras.Input(shape)
    h = inputs
    if "depth" in p:                                  # digits: the MLP space
        for i in range(int(p["depth"])):
            h = keras.layers.Dense(int(p[f"units_{i}"]), activation=p[f"activation_{i}"])(h)
            if p[f"dropout_{i}"] > 0:
                h = keras.layers.Dropout(float(p[f"dropout_{i}"]))(h)
    else:                                             # the suite: conv blocks, then dense layers
        conv = keras.layers.Conv1D if len(shape) == 2 else keras.layers.Conv2D
        pool = keras.layers.MaxPooling1D if len(shape) == 2 else keras.layers.MaxPooling2D
        for i in range(int(p["conv_blocks"])):
            h = conv(int(p["filters"]) * 2 ** i, int(p["kernel_size"]), padding="same", activation=p["activation"])(h)
            if p["pooling"] == "yes" and min(h.shape[1:-1]) >= 2:
                h = pool(2)(h)
        if int(p["conv_blocks"]) > 0:
            pooling = {("average", 2): keras.layers.GlobalAveragePooling1D,
                       ("average", 3): keras.layers.GlobalAveragePooling2D,
                       ("max", 2): keras.layers.GlobalMaxPooling1D, ("max", 3): keras.layers.GlobalMaxPooling2D}
            h = pooling[(p.get("reduction", "average"), len(shape))]()(h)
        else:
            h = keras.layers.Flatten()(h)
        for _ in range(int(p["dense_layers"])):
            h = keras.layers.Dense(int(p["units"]), activation=p["activation"])(h)
        if p["dropout"] > 0:
            h = keras.layers.Dropout(float(p["dropout"]))(h)
    if task == "classification":
        out = keras.layers.Dense(int(d["y_train"].max()) + 1, activation="softmax")(h)
        loss = "sparse_categorical_crossentropy"
    else:
        out, loss = keras.layers.Dense(1)(h), "mse"
    model = keras.Model(inputs, out)
    opt = {"adam": keras.optimizers.Adam, "rmsprop": keras.optimizers.RMSprop, "sgd": keras.optimizers.SGD,
           "adamw": keras.optimizers.AdamW}[p["optimizer"]](learning_rate=float(p["learning_rate"]))
    model.compile(optimizer=opt, loss=loss)
    model.fit(d["x_train"], d["y_train"], batch_size=int(p["batch_size"]), epochs=epochs, verbose=0,
              validation_data=(d["x_val"], d["y_val"]),
              callbacks=[keras.callbacks.EarlyStopping(monitor="val_loss", patience=patience,
                                                       restore_best_weights=True)])
    return {"objective": _score(model, d["x_val"], d["y_val"], task),
            "metadata": {"test": _score(model, d["x_test"], d["y_test"], task)}}


def deephyper_problem(digits: bool, reductions: bool = False):
    """DeepHyper's space: digits' MLP space, or the suite's fixed-shape CNN space (with
    `reductions`: a 12th parameter, global average or global max pooling after the conv blocks)."""
    from deephyper.hpo import HpProblem
    space = HpProblem()
    if digits:
        space.add_hyperparameter((1, 3), "depth")
        for i in range(3):
            space.add_hyperparameter((16, 128), f"units_{i}")
            space.add_hyperparameter(["relu", "elu", "tanh"], f"activation_{i}")
            space.add_hyperparameter((0.0, 0.5), f"dropout_{i}")
        space.add_hyperparameter(["adam", "rmsprop", "adamw"], "optimizer")
        space.add_hyperparameter((3e-4, 1e-2, "log-uniform"), "learning_rate")
        space.add_hyperparameter([32, 64, 128], "batch_size")
        return space
    space.add_hyperparameter((0, 3), "conv_blocks")
    space.add_hyperparameter([8, 16, 32], "filters")           # doubled at each block
    space.add_hyperparameter([3, 5, 7], "kernel_size")
    space.add_hyperparameter(["yes", "no"], "pooling")
    space.add_hyperparameter((0, 2), "dense_layers")
    space.add_hyperparameter([16, 32, 64, 128], "units")
    space.add_hyperparameter((0.0, 0.5), "dropout")
    space.add_hyperparameter(["relu", "elu", "gelu", "tanh", "swish"], "activation")
    space.add_hyperparameter(["adam", "sgd", "rmsprop", "adamw"], "optimizer")
    space.add_hyperparameter((1e-4, 1e-2, "log-uniform"), "learning_rate")
    space.add_hyperparameter([16, 32, 64, 128], "batch_size")
    if reductions:
        space.add_hyperparameter(["average", "max"], "reduction")
    return space


def deephyper_side(problem: Problem, folder: Path, seed: int, budget: float, workers: int,
                   method: str = "dh_re", reductions: bool = False) -> dict:
    """DeepHyper's search in a fresh Python process, timed from its launch as the project's
    ``mpiexec`` is: both sides pay for starting Python and importing TensorFlow on the clock
    (a search run in this process would start with TensorFlow already imported, and its
    forked workers with it)."""
    import numpy as np
    np.savez(folder / "split.npz", **split_arrays(problem, seed))
    job = {"folder": str(folder), "task": problem.task, "epochs": problem.training["epochs"],
           "patience": problem.training["patience"], "seed": seed, "budget": budget, "workers": workers,
           "method": method, "digits": problem.source is None, "population": problem.population,
           "reductions": reductions}
    (folder / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    launched = time.time()
    proc = subprocess.run([sys.executable, __file__, *(["--deephyper-path", DEEPHYPER[0]] if DEEPHYPER else []),
                           "--deephyper-job", str(folder / "job.json")], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"DeepHyper's search failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run = json.loads((folder / "result.json").read_text())
    run["curve"] = [(t - launched, b) for t, b in run["curve"]]      # wall-clock stamps -> from launch
    return run


def deephyper_job(path: Path) -> None:
    """The fresh process of ``deephyper_side``: the search, its results in result.json beside the job
    (the curve in wall-clock seconds)."""
    job = json.loads(path.read_text())
    folder = Path(job["folder"])
    from deephyper.evaluator import Evaluator
    from deephyper.hpo import CBO, RegularizedEvolution
    os.environ.update(BENCH_SEARCH_DATA=str(folder / "split.npz"), BENCH_SEARCH_TASK=job["task"],
                      BENCH_SEARCH_TRAINING=f"{job['epochs']},{job['patience']}")
    space = deephyper_problem(job["digits"], job.get("reductions", False))
    evaluator = Evaluator.create(run_candidate, method="process", method_kwargs={"num_workers": job["workers"]})
    log_dir = str(folder / job["method"])
    if job["method"] == "dh_re":
        size = job["population"] if not job["digits"] else 12
        search = RegularizedEvolution(space, random_state=job["seed"], log_dir=log_dir, population_size=size,
                                      sample_size=max(2, size // 3) if not job["digits"] else 4)
    else:
        search = CBO(space, random_state=job["seed"], log_dir=log_dir)
    results = search.search(evaluator, timeout=int(job["budget"]))
    results = results[results["objective"].apply(lambda v: isinstance(v, (int, float)))]
    gather = next(c for c in results.columns if "timestamp_gather" in c)
    results = results.sort_values(gather)
    # DeepHyper's timestamps count from its evaluator's creation (time.monotonic): to wall-clock time
    offset = float(evaluator.timestamp) + time.time() - time.monotonic()
    curve, best = [], -math.inf
    for _, row in results.iterrows():
        best = max(best, float(row["objective"]))
        curve.append((float(row[gather]) + offset, best))
    top = results.loc[results["objective"].astype(float).idxmax()]
    test_col = next(c for c in results.columns if c.endswith("test"))
    (folder / "result.json").write_text(json.dumps(
        {"evaluations": len(results), "best_val": best, "curve": curve, "best_test": float(top[test_col]),
         "ensemble_test": None}))


# ------------------------------------------------------------------------------ figures
def reached(curve, target: float) -> float | None:
    """Seconds from launch until the best so far reached ``target`` (None: never)."""
    return next((t for t, b in curve if b >= target - 1e-12), None)


def best_by(curve, seconds: float) -> float:
    return max((b for t, b in curve if t <= seconds), default=-math.inf)


def ratios(runs: dict[str, dict], budget: float, against: str = "dh_re") -> dict[str, dict[str, float]]:
    """Per side: time to reach ``against``'s half-budget best and final best, over ``against``'s
    own time to reach them (inf: never reached)."""
    base = runs[against]
    targets = {"half": best_by(base["curve"], budget / 2), "final": base["best_val"]}
    out = {}
    for side, run in runs.items():
        row = {}
        for name, target in targets.items():
            mine, theirs = reached(run["curve"], target), reached(base["curve"], target)
            row[name] = math.inf if mine is None or not theirs else mine / theirs
        out[side] = row
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return math.nan if not n else xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _fmt(x: float, digits: int = 3) -> str:
    return "never" if x == math.inf else "-" if x != x else f"{x:.{digits}f}"


#: the column names of each side a table can compare times with (``--against``)
AGAINST = {"dh_re": "DH-RE", "dh_cbo": "CBO", "project": "the plain project's"}


def table(path: Path, against: tuple[str, ...] = ("dh_re", "dh_cbo")) -> str:
    """The markdown table of a results file: per problem and side, the median over seeds
    (min-max); times to the half-budget and final best of each side in ``against``."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[tuple[str, int], dict[str, dict]] = {}
    for r in rows:
        groups.setdefault((r["problem"], r["seed"]), {})[r["side"]] = r
    per: dict[tuple[str, str], dict[str, list]] = {}
    for (problem, _), runs in sorted(groups.items()):
        budget = next(iter(runs.values()))["budget"]
        rel = {base: ratios(runs, budget, base) for base in against if base in runs}
        for side, r in runs.items():
            label = side + (" (+ global max pooling)" if r.get("dh_space") == "reductions" else "")
            acc = per.setdefault((problem, label), {k: [] for k in ("val", "test", "ens", "eps", "proper")})
            acc["val"].append(r["best_val"])
            acc["test"].append(r["best_test"])
            if r.get("ensemble_test") is not None:
                acc["ens"].append(r["ensemble_test"])
            acc["eps"].append(r["evaluations"] / r["budget"])
            if r.get("proper"):                  # the ensemble's proper score at most its best member's
                score = next(k for k in PROPER_SCORES if k in r["proper"]["ensemble"])
                acc["proper"].append(r["proper"]["ensemble"][score] <= r["proper"]["best_member"][score] + 1e-12)
            for base, times in rel.items():
                acc.setdefault("half " + base, []).append(times[side]["half"])
                acc.setdefault("final " + base, []).append(times[side]["final"])
    out = ["| problem | side | seeds | best val | its test | ensemble test | ensemble's proper score <= best "
           "member's | evaluations / s | " + " | ".join(
               f"time to {AGAINST[b]} half-budget best (ratio) | time to {AGAINST[b]} final best (ratio)"
               for b in against) + " |",
           "|---" * (8 + 2 * len(against)) + "|"]

    def cell(xs: list[float]) -> str:
        if not xs:
            return "-"
        return f"{_fmt(_median(xs))} ({_fmt(min(xs))}-{_fmt(max(xs))})" if len(xs) > 1 else _fmt(xs[0])
    order = {s: i for i, s in enumerate((*PROJECT_SIDES, *DH_SIDES))}
    for (problem, side), acc in sorted(per.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1].split()[0], 9))):
        proper = f"{sum(acc['proper'])} of {len(acc['proper'])}" if acc["proper"] else "-"
        times = " | ".join(f"{cell(acc.get('half ' + b, []))} | {cell(acc.get('final ' + b, []))}" for b in against)
        out.append(f"| {problem} | {side} | {len(acc['val'])} | {cell(acc['val'])} | {cell(acc['test'])} | "
                   f"{cell(acc['ens'])} | {proper} | {cell(acc['eps'])} | {times} |")
    return "\n".join(out)


# ------------------------------------------------------------------------------ the master's cost
def _toy_fitness(genome, i: int) -> float:
    layers = genome.to_genome().layers if hasattr(genome, "to_genome") else genome.layers
    return -abs(len(layers) - 5) + (i % 7) * 0.01

def surrogate_cost(results: tuple[int, ...] = (1000, 10000), asks: int = 100, candidates: int = 12) -> str:
    """CPU µs per ask of regularized evolution with and without the surrogate, after ``results``
    results (random genomes of the structured and free spaces on 64-step signals, a toy
    fitness); the CPU seconds of one refit at that many results, and that refit shared by the
    asks until the next one. CPU time (``time.process_time``), so that other jobs on the same
    cores do not count."""
    import numpy as np
    import sklearn.ensemble  # noqa: F401  (imported before the clock starts)

    from evolve import SearchSpace, make_strategy, random_genome
    from evolve.surrogate import Surrogate
    lines = ["| space | results | ask without (µs) | ask with (µs) | one refit (s) | "
             "asks between refits | ask with, refit shared (µs) |", "|---|---|---|---|---|---|---|"]
    shape = (64, 1)
    for kind in ("structured", "free"):
        space = SearchSpace.from_config({"space": kind, "max_params": 100000}, input_rank=2)
        rng = np.random.default_rng(0)
        pool = [random_genome(rng, space, shape, 4) for _ in range(max(results) + 2 * asks)]
        pool = list({g.key(): g for g in pool}.values())
        for n in results:
            cost, sur = {}, None
            for use in (False, True):
                sur = Surrogate(space, shape, 4, candidates=candidates, min_results=16, seed=0) if use else None
                st = make_strategy("regularized", space, shape, 4, rng_seed=0, surrogate=sur,
                                   population_size=12, sample_size=4)
                st.replay([{"genome": g.to_dict(), "fitness": _toy_fitness(g, i)} for i, g in enumerate(pool[:n])])
                if sur is not None:
                    start = time.process_time()
                    sur.predict(pool[:1])                           # the refit at this many results, apart
                    fit = time.process_time() - start
                start = time.process_time()
                for _ in range(asks):
                    st.ask()                                       # results not told: no refit in between
                cost[use] = (time.process_time() - start) / asks * 1e6
            assert sur is not None
            between = max(8, sur.boundary(n) // 10)
            lines.append(f"| {kind} | {n:,} | {cost[False]:.0f} | {cost[True]:.0f} | {fit:.2f} | "
                         f"{between} | {cost[True] + fit / between * 1e6:.0f} |")
    return "\n".join(lines)


def _helpers_cpu(st) -> tuple[float, int]:
    """CPU seconds the screening helpers of ``st`` used so far (Linux ``/proc``) and the
    children they screened; (0, 0) without helpers."""
    if st.ahead is None:
        return 0.0, 0
    tick, cpu = os.sysconf("SC_CLK_TCK"), 0.0
    for h in st.ahead.helpers:
        fields = Path(f"/proc/{h.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / tick           # utime, stime
    return cpu, sum(h.state.get("surrogate_screens", 0) for h in st.ahead.helpers)


def ahead_cost(results: tuple[int, ...] = (1000, 10000), rates: tuple[int, ...] = (100, 300, 1000),
               seconds: float = 5.0, candidates: int = 12, in_flight: int = 64, helpers: tuple[int, ...] = (1,)) -> str:
    """The master asked at a fixed rate, screening in the loop against screening ahead in a
    helper process (``evolve.screening``): regularized evolution on the structured space
    (64-step signals, a toy fitness), after ``results`` results; every ``1 / rate`` s the
    master asks a child and tells the result of the oldest of ``in_flight`` out. Per setting:
    the asks a second it reached, the master process's CPU per ask and its CPU share of
    the wall time (``time.process_time``: its writer and reader threads included, the helper
    not), the share of bred asks that got a screened child, and the children screened per
    CPU-second: of the master in the loop, of the helpers ahead (their ``/proc`` CPU time, so
    what one helper gives with a core of its own, whatever else the machine runs)."""
    import numpy as np
    import sklearn.ensemble  # noqa: F401  (imported before the clock starts)

    from evolve import SearchSpace, make_strategy, random_genome
    from evolve.screening import AHEAD_CHILDREN, Ahead
    from evolve.surrogate import Surrogate
    lines = ["| results | asked at (/s) | screened | reached (/s) | master CPU per ask (µs) | master CPU share | "
             "bred asks screened | screened children per CPU-second |", "|---|---|---|---|---|---|---|---|"]
    shape = (64, 1)
    space = SearchSpace.from_config({"space": "structured", "max_params": 100000}, input_rank=2)
    rng = np.random.default_rng(0)
    pool = [random_genome(rng, space, shape, 4) for _ in range(max(results))]
    pool = list({g.key(): g for g in pool}.values())
    for n in results:
        for ahead in (-1, 0, *helpers):            # -1: no surrogate at all, the floor
            sur = Surrogate(space, shape, 4, candidates=candidates, min_results=16, seed=0)
            st = make_strategy("regularized", space, shape, 4, rng_seed=0, surrogate=sur if ahead == 0 else None,
                               population_size=12, sample_size=4)
            if ahead > 0:
                st.attach(Ahead(st, sur, AHEAD_CHILDREN, ahead))
            st.replay([{"genome": g.to_dict(), "fitness": _toy_fitness(g, i)} for i, g in enumerate(pool[:n])])
            if st.ahead is not None:                   # the helper caught up: its first batch is in
                until = time.monotonic() + 120
                while len(st.ahead.ready) < AHEAD_CHILDREN and time.monotonic() < until:
                    time.sleep(0.05)
            out: deque = deque()
            for rate in rates:
                before = dict(st.ahead.counts) if st.ahead is not None else None
                helper0 = _helpers_cpu(st)
                asks, cpu0, t0 = 0, time.process_time(), time.perf_counter()
                due = t0
                while time.perf_counter() - t0 < seconds:
                    g = st.ask()
                    out.append(g)
                    if len(out) > in_flight:
                        x = out.popleft()
                        st.tell(x, _toy_fitness(x, asks))
                    asks += 1
                    due += 1.0 / rate
                    time.sleep(max(0.0, due - time.perf_counter()))
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                if st.ahead is not None and before is not None:
                    served = st.ahead.counts["served"] - before["served"]
                    bred = served + st.ahead.counts["missed"] - before["missed"]
                    share = f"{served / max(bred, 1):.0%}"
                    made = helper0[1]
                    used, made = _helpers_cpu(st)[0] - helper0[0], _helpers_cpu(st)[1] - made
                    rate_per_cpu = f"{made / used:,.0f}" if used > 0 and made > 0 else "-"
                else:
                    share, rate_per_cpu = ("100%", f"{1 / (cpu / asks):,.0f}") if ahead == 0 else ("-", "-")
                how = (f"ahead, {ahead} helper{'s' if ahead > 1 else ''}" if ahead > 0 else
                       "in the loop" if ahead == 0 else "no surrogate")
                lines.append(f"| {n:,} | {rate:,} | {how} | {asks / wall:,.0f} | "
                             f"{cpu / asks * 1e6:,.0f} | {cpu / wall:.0%} | {share} | {rate_per_cpu} |")
            st.close()
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--problem", default="digits", help="digits, or a comma list of signals, textures, peaks, stripes")
    p.add_argument("--seeds", default=str(SEED), help="comma list of seeds (the split's and the searches')")
    p.add_argument("--sides", default="dh_re,project", help="comma list of " + ", ".join([*PROJECT_SIDES, *DH_SIDES]))
    p.add_argument("--budget", type=float, default=60.0, help="seconds of search on each side")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--samples", type=int, default=1000, help="samples of a suite problem")
    p.add_argument("--epochs", type=int, default=30, help="a suite candidate's epochs, on every side")
    p.add_argument("--patience", type=int, default=5, help="a suite candidate's early-stopping patience")
    p.add_argument("--population", type=int, default=12,
                   help="regularized evolution's population on every side (suite; sample size a third)")
    p.add_argument("--surrogate-min", type=int, help="evolve.surrogate_min_results of the surrogate side")
    p.add_argument("--deephyper-path", help="a folder DeepHyper was installed into with pip --target")
    p.add_argument("--asha", action="store_true", help="the project's side with evolve.discard = \"asha\"")
    p.add_argument("--results", help="append each run to this JSON-lines file")
    p.add_argument("--table", help="print the table of a results file and stop (with --write: into that page's "
                   "generated block; with --plot: best-so-far against time, a panel per problem)")
    p.add_argument("--against", default="dh_re,dh_cbo",
                   help="--table: comma list of the sides whose times the others are compared with (" +
                        ", ".join(AGAINST) + ")")
    p.add_argument("--write", help="--table, --ahead-cost: the docs page to write the table into")
    p.add_argument("--surrogate-cost", action="store_true", help="the surrogate's cost on the master, and stop")
    p.add_argument("--candidates", type=int, default=12, help="--surrogate-cost: children screened per ask")
    p.add_argument("--ahead-cost", action="store_true",
                   help="the master asked at fixed rates, screening in its loop against ahead (evolve.screening)")
    p.add_argument("--helpers", default="1", help="--ahead-cost: comma list of helper counts to measure")
    p.add_argument("--plot", help="write best-so-far validation against wall time here (PNG; one problem and seed)")
    p.add_argument("--keep", help="folder to keep the runs in")
    p.add_argument("--dh-reductions", action="store_true",
                   help="DeepHyper's space gains a choice of global average or global max pooling (write to "
                        "a results file of its own: the table does not tell the two spaces apart)")
    p.add_argument("--deephyper-job", help=argparse.SUPPRESS)    # the fresh process of DeepHyper's side
    args = p.parse_args()
    if args.table:
        text = table(Path(args.table), tuple(args.against.split(",")))
        print(text)
        if args.write:
            write_block(Path(args.write), "bench_search suite",
                        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python "
                        f"scripts/bench_search.py --table {args.table} --against {args.against} --write {args.write}`"
                        + (f" (plot: `--plot {args.plot}`)" if args.plot else "") + ".\n\n" + text)
        if args.plot:
            plot_suite(Path(args.table), Path(args.plot))
        return 0
    if args.surrogate_cost:
        print(surrogate_cost(candidates=args.candidates))
        return 0
    if args.ahead_cost:
        text = ahead_cost(candidates=args.candidates, helpers=tuple(int(h) for h in args.helpers.split(",")))
        print(text)
        if args.write:
            write_block(Path(args.write), "bench_search ahead",
                        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python "
                        f"scripts/bench_search.py --ahead-cost --helpers {args.helpers} --write {args.write}` "
                        f"(load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores).\n\n" + text)
        return 0
    if args.deephyper_path:
        sys.path.append(args.deephyper_path)              # after the venv: its numpy and TensorFlow win
        DEEPHYPER.append(args.deephyper_path)
    if args.deephyper_job:
        deephyper_job(Path(args.deephyper_job))
        return 0
    sides = [s for s in args.sides.split(",") if s]
    if args.asha:
        sides = [("asha" if s == "project" else s) for s in sides]
    unknown = set(sides) - set(PROJECT_SIDES) - set(DH_SIDES)
    if unknown:
        raise SystemExit(f"--sides: unknown {sorted(unknown)}; choose among {[*PROJECT_SIDES, *DH_SIDES]}")
    with workspace(args.keep, "bench_search_") as folder:
        for name in args.problem.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                problem = Problem(name, folder, args.samples, args.epochs, args.patience, args.population)
                runs = {}
                for side in sides:
                    where = folder / f"{name}-s{seed}-{side}"
                    where.mkdir(parents=True, exist_ok=True)
                    started = time.time()
                    if side in DH_SIDES:
                        run = deephyper_side(problem, where, seed, args.budget, args.workers, side,
                                             args.dh_reductions)
                        run["dh_space"] = "reductions" if args.dh_reductions else "practitioner"
                    else:
                        extra = PROJECT_SIDES[side]
                        if side == "surrogate" and args.surrogate_min:
                            extra += f"\nsurrogate_min_results = {args.surrogate_min}"
                        run = project_side(problem, where, seed, args.budget, args.workers, extra)
                    run.update(problem=name, seed=seed, side=side, budget=args.budget, workers=args.workers,
                               samples=args.samples, training=problem.training, population=args.population,
                               started=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started)),
                               wall=round(time.time() - started, 1))
                    runs[side] = run
                    print(f"{name} seed {seed} {side}: {run['evaluations']} evaluations, best val "
                          f"{run['best_val']:.4f}, its test {run['best_test']:.4f}"
                          + (f", ensemble {run['ensemble_test']:.4f}" if run.get("ensemble_test") is not None else "")
                          + (f", surrogate {run['surrogate']}" if run.get("surrogate") else ""), flush=True)
                    if args.results:
                        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
                        with open(args.results, "a") as f:
                            f.write(json.dumps(run) + "\n")
                if "dh_re" in runs and len(runs) > 1:
                    for side, row in ratios(runs, args.budget).items():
                        print(f"  {side}: time to DH-RE's half-budget best / DH-RE's: {_fmt(row['half'], 2)}, "
                              f"to its final best: {_fmt(row['final'], 2)}")
                if args.plot:
                    plot(runs, Path(args.plot), problem.metric)
    return 0


def plot_suite(results: Path, path: Path) -> None:
    """Best validation so far against seconds since launch: a panel per problem, a line per
    (side, seed), one colour per side."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    problems = sorted({r["problem"] for r in rows})
    sides = sorted({r["side"] for r in rows})
    fig = Figure(figsize=(4.5 * len(problems), 3.6))
    axes = fig.subplots(1, len(problems), squeeze=False)[0]
    colours = dict(zip(sides, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    for ax, problem in zip(axes, problems):
        mine = [r for r in rows if r["problem"] == problem]
        low = min(best_by(r["curve"], r["budget"] / 4) for r in mine)      # the axis from where a quarter in
        top = max(r["best_val"] for r in mine)
        if math.isfinite(low) and low < top:
            ax.set_ylim(low - 0.05 * (top - low), top + 0.05 * (top - low))
        for r in mine:
            curve = [(t, b) for t, b in r["curve"] if b > -math.inf]
            ax.step([c[0] for c in curve], [c[1] for c in curve], where="post", color=colours[r["side"]], alpha=0.7,
                    label=r["side"])
        handles, labels = ax.get_legend_handles_labels()
        first = dict(zip(labels, handles))                  # one legend entry per side
        ax.legend(list(first.values()), list(first), fontsize=8)
        ax.set(title=problem, xlabel="seconds since launch", ylabel="best validation so far")
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=90, bbox_inches="tight")


def plot(runs: dict[str, dict], path: Path, metric: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for name, s in runs.items():
        ax.step([c[0] for c in s["curve"]], [c[1] for c in s["curve"]], where="post", label=name)
    ax.set(xlabel="seconds since launch", ylabel=f"best validation {metric} so far")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100, bbox_inches="tight")


if __name__ == "__main__":
    sys.exit(main())
