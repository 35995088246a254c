"""Search problems where the architecture matters, made here (no download), and how much it
matters on each: the gap between a linear model, an MLP and a small CNN.

    python scripts/search_problems.py gap [--seeds 2]        # the table in docs/search.md
    python scripts/search_problems.py write DIR               # DIR/<problem>.npz for configs
    python scripts/search_problems.py spaces --problem signals --budget 150 [--seeds 2]
    python scripts/search_problems.py templates [--seeds 4] [--problem stripes]   # evolve/templates.py's table
    python scripts/search_problems.py draws [--count 12] [--problem signals]   # random draws: whole or compact
    python scripts/search_problems.py ceiling [--samples 1500]   # the Bayes accuracy of each classification problem

Problems (each an .npz of x, y; the project splits it as any data file):
- ``signals``: 1-D signals of 64 steps, 4 classes; a class is a motif of 8 steps placed at a
  random position, under noise of the motif's size: a convolution finds it wherever it is,
  a dense layer must learn every position.
- ``textures``: 16x16 images, 3 classes of oriented stripes (horizontal, vertical,
  diagonal) in a patch at a random place, under noise: locality and pooling matter.
- ``peaks``: regression on 1-D sequences of 48 steps: the target is the height of the
  largest of three bumps at random positions, plus a little noise.
- ``stripes``: ``textures`` made harder (added 2026-11-25, when every side of the benchmark
  reached 1.000 on ``textures`` within seconds, so it could no longer tell them apart): four
  orientations (the anti-diagonal added) under noise as strong as the stripes.

``templates`` trains each template (``evolve/templates.py``) and the variants it was chosen
against alone on each problem (1,500 samples, 20 epochs, patience 4, as the suite's
candidates), built by the project's own path (``evolve.decode`` then
``ensemble.train.architecture.build_layers``), and prints validation medians.
``draws`` trains random structured genomes drawn from the whole space and from its compact
part (the fewest stages or one more, one block each: how a first population's random genomes
are drawn) the same way, one split, and prints what a draw scores and costs.
``gap`` trains, on one split per seed, a linear model (logistic or ridge regression), an
MLP (two dense layers of 64) and a small CNN (two convolution blocks with pooling, global
average pooling, a dense layer), each with early stopping, and prints test accuracy (R^2
for ``peaks``). ``spaces`` runs the project's search (``mode = "evolve"``, 2 workers,
``evolve.time_limit`` = the budget) with ``search.space = "free"`` and ``"structured"`` on
one problem and prints best validation and test per side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))


MOTIF = 8                               # a signal's motif: steps
SIGNAL_AMPLITUDE = (1.0, 2.0)           # its amplitude, uniform between these
PATCH = 7                               # a stripes patch: pixels a side


def _signals(n: int, length: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``signals`` and the class motifs it placed (for ``ceiling``)."""
    rng = np.random.default_rng(seed)
    motifs = rng.normal(size=(classes, MOTIF))
    motifs /= np.linalg.norm(motifs, axis=1, keepdims=True) / np.sqrt(MOTIF)
    y = rng.integers(0, classes, n)
    x = rng.normal(0.0, 1.0, (n, length))
    where = rng.integers(0, length - MOTIF, n)
    amplitude = rng.uniform(*SIGNAL_AMPLITUDE, n)
    for i in range(n):
        x[i, where[i]:where[i] + MOTIF] += amplitude[i] * motifs[y[i]]
    return x[..., None].astype(np.float32), y, motifs


def signals(n: int = 3000, length: int = 64, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x, y, _ = _signals(n, length, classes, seed)
    return x, y


def _stripe_kernels(classes: int) -> np.ndarray:
    """The patches of stripes, one per class: horizontal, vertical, diagonal, anti-diagonal."""
    i, j = np.mgrid[0:PATCH, 0:PATCH]
    return np.stack([np.sin(i * np.pi / 2), np.sin(j * np.pi / 2), np.sin((i + j) * np.pi / 2),
                     np.sin((i - j) * np.pi / 2)][:classes])


def _oriented_patches(n: int, size: int, seed: int, classes: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """``size`` x ``size`` images of Gaussian noise (sd ``noise``), each with a 7x7 patch of
    stripes at a random place; the class is the stripes' orientation (horizontal, vertical,
    diagonal, anti-diagonal: the first ``classes``)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.normal(0.0, noise, (n, size, size))
    kernels = _stripe_kernels(classes)
    top, left = rng.integers(0, size - PATCH, n), rng.integers(0, size - PATCH, n)
    for k in range(n):
        x[k, top[k]:top[k] + PATCH, left[k]:left[k] + PATCH] += kernels[y[k]]
    return x[..., None].astype(np.float32), y


def textures(n: int = 3000, size: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return _oriented_patches(n, size, seed, classes=3, noise=0.6)


def stripes(n: int = 3000, size: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``textures`` made harder: four orientations (the anti-diagonal added) under noise of
    the stripes' own amplitude, so that a small CNN is near 0.8 at 1,500 samples and no side
    of the benchmark starts at 1.000."""
    return _oriented_patches(n, size, seed, classes=4, noise=1.0)


def peaks(n: int = 3000, length: int = 48, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    heights = rng.uniform(0.5, 3.0, (n, 3))
    centres = rng.integers(4, length - 4, (n, 3))
    x = (heights[:, :, None] * np.exp(-0.5 * ((t[None, None] - centres[:, :, None]) / 1.5) ** 2)).sum(axis=1)
    x += rng.normal(0.0, 0.3, x.shape)
    return x[..., None].astype(np.float32), heights.max(axis=1) + rng.normal(0.0, 0.05, n)


PROBLEMS = {"signals": (signals, "classification"), "textures": (textures, "classification"),
            "peaks": (peaks, "regression"), "stripes": (stripes, "classification")}


def write(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, (make, _) in PROBLEMS.items():
        path = folder / f"{name}.npz"
        if not path.is_file():
            x, y = make()
            np.savez(path, x=x, y=y)
        out[name] = path
    return out


# ----------------------------------------------------------------------------- gap
def _split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.random.default_rng(seed).permutation(n)
    return rows[: int(0.6 * n)], rows[int(0.6 * n): int(0.8 * n)], rows[int(0.8 * n):]


def _fit_and_score(model, optimizer, x, y, rows: tuple, task: str, epochs: int, patience: int,
                   batch_size: int) -> float:
    """Train ``model`` on rows ``rows[0]`` with early stopping on ``rows[1]`` (best weights kept) and
    score it on ``rows[2]``: accuracy, or R^2 for regression."""
    import keras
    from sklearn.metrics import r2_score
    tr, va, scored = rows
    model.compile(optimizer=optimizer,
                  loss="sparse_categorical_crossentropy" if task == "classification" else "mse")
    model.fit(x[tr], y[tr], validation_data=(x[va], y[va]), epochs=epochs, batch_size=batch_size, verbose=0,
              callbacks=[keras.callbacks.EarlyStopping(patience=patience, restore_best_weights=True)])
    pred = model.predict(x[scored], verbose=0)
    return (float(np.mean(pred.argmax(axis=1) == y[scored])) if task == "classification"
            else float(r2_score(y[scored], pred[:, 0])))


def _keras_model(kind: str, shape: tuple, task: str, outputs: int):
    import keras
    inputs = keras.Input(shape)
    conv = keras.layers.Conv1D if len(shape) == 2 else keras.layers.Conv2D
    pool = keras.layers.MaxPooling1D if len(shape) == 2 else keras.layers.MaxPooling2D
    gap = keras.layers.GlobalAveragePooling1D if len(shape) == 2 else keras.layers.GlobalAveragePooling2D
    if kind == "mlp":
        h = keras.layers.Flatten()(inputs)
        h = keras.layers.Dense(64, activation="relu")(h)
        h = keras.layers.Dense(64, activation="relu")(h)
    else:
        h = conv(16, 5 if len(shape) == 2 else 3, padding="same", activation="relu")(inputs)
        h = pool(2)(h)
        h = conv(32, 3, padding="same", activation="relu")(h)
        h = pool(2)(h)
        h = gap()(h)
        h = keras.layers.Dense(32, activation="relu")(h)
    out = keras.layers.Dense(outputs, activation="softmax" if task == "classification" else None)(h)
    return keras.Model(inputs, out)


def gap(seeds: int) -> str:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.metrics import r2_score

    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(1)
    rows = ["| problem | task | samples | linear | MLP | CNN | CNN - MLP |", "|---|---|---|---|---|---|---|"]
    for name, (make, task) in PROBLEMS.items():
        x, y = make()
        scores: dict[str, list[float]] = {"linear": [], "mlp": [], "cnn": []}
        for seed in range(seeds):
            tr, va, te = _split(len(x), seed)
            flat = x.reshape(len(x), -1)
            mu, sd = flat[tr].mean(axis=0), flat[tr].std(axis=0) + 1e-8
            if task == "classification":
                lin = LogisticRegression(max_iter=2000).fit((flat[tr] - mu) / sd, y[tr])
                scores["linear"].append(float(np.mean(lin.predict((flat[te] - mu) / sd) == y[te])))
            else:
                lin = Ridge().fit((flat[tr] - mu) / sd, y[tr])
                scores["linear"].append(float(r2_score(y[te], lin.predict((flat[te] - mu) / sd))))
            for kind in ("mlp", "cnn"):
                keras.utils.set_random_seed(seed)
                outputs = int(y.max()) + 1 if task == "classification" else 1
                model = _keras_model(kind, x.shape[1:], task, outputs)
                scores[kind].append(_fit_and_score(model, keras.optimizers.Adam(2e-3), x, y, (tr, va, te), task,
                                                   epochs=40, patience=5, batch_size=64))
        m = {k: float(np.median(v)) for k, v in scores.items()}
        metric = "accuracy" if task == "classification" else "R^2"
        rows.append(f"| {name} | {task} ({metric}) | {len(x):,} | {m['linear']:.3f} | {m['mlp']:.3f} | "
                    f"{m['cnn']:.3f} | {m['cnn'] - m['mlp']:+.3f} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- ceiling
def _log_evidence(scores: np.ndarray, energy: np.ndarray, amplitudes: np.ndarray, noise: float) -> np.ndarray:
    """log p(x | class) up to a constant shared by the classes, for a template at an unknown
    position (uniform) with an unknown amplitude (uniform over ``amplitudes``) under white
    Gaussian noise: ``scores`` (n, classes, positions) are <x window, template>, ``energy``
    (classes,) the templates' squared norms."""
    terms = (amplitudes[None, None, None] * scores[..., None]
             - 0.5 * amplitudes[None, None, None] ** 2 * energy[None, :, None, None]) / noise ** 2
    flat = terms.reshape(len(terms), terms.shape[1], -1)
    top = flat.max(axis=2, keepdims=True)
    return (top + np.log(np.exp(flat - top).sum(axis=2, keepdims=True)))[..., 0]


def bayes_accuracy(problem: str, n: int) -> float:
    """The accuracy of the Bayes classifier, which knows how ``problem``'s samples are made
    (the class templates, their positions and amplitudes uniform, the noise), on ``n`` samples
    made as the benchmark makes them (the same templates): no network trained on such data
    can do better, in expectation."""
    from numpy.lib.stride_tricks import sliding_window_view
    if problem == "signals":
        x, y, motifs = _signals(n, 64, 4, 0)
        windows = sliding_window_view(x[..., 0], MOTIF, axis=1)[:, :64 - MOTIF]    # every place it may be
        scores = np.einsum("ntk,ck->nct", windows, motifs)
        amplitudes, noise, energy = np.linspace(*SIGNAL_AMPLITUDE, 41), 1.0, (motifs ** 2).sum(axis=1)
    elif problem in ("stripes", "textures"):
        classes, noise = (4, 1.0) if problem == "stripes" else (3, 0.6)
        x, y = _oriented_patches(n, 16, 0, classes, noise)
        kernels = _stripe_kernels(classes)
        places = 16 - PATCH
        windows = sliding_window_view(x[..., 0], (PATCH, PATCH), axis=(1, 2))[:, :places, :places]
        scores = np.einsum("nijkl,ckl->ncij", windows, kernels).reshape(n, classes, -1)
        amplitudes, energy = np.ones(1), (kernels ** 2).sum(axis=(1, 2))
    else:
        raise SystemExit(f"ceiling: {problem!r} is a regression; only the classification problems have one here")
    return float(np.mean(_log_evidence(scores, energy, amplitudes, noise).argmax(axis=1) == y))


def ceiling(samples: int) -> str:
    """The Bayes accuracy of each classification problem, and how noisy a validation score is
    at the default split of ``samples`` (the benchmark's)."""
    rows = ["| problem | Bayes accuracy | over samples | binomial SE of a validation accuracy near it "
            f"(the default split of {samples:,} samples) |", "|---|---|---|---|"]
    from datafeed.prepare import split_indices
    from ensemble.config import resolve_config
    data = resolve_config({"mode": "evolve", "data": {"source": "given.npz"}}).data      # the default split
    val = len(split_indices(np.zeros(samples), "regression", data.val_fraction, data.test_fraction, 0)["val"])
    for name in ("signals", "stripes", "textures"):
        acc = bayes_accuracy(name, 20000)
        rows.append(f"| {name} | {acc:.3f} | 20,000 | {np.sqrt(acc * (1 - acc) / val):.3f} ({val} rows) |")
    return "\n".join(rows)


# ----------------------------------------------------------------------- templates
def template_variants() -> dict:
    """The templates and what they were chosen against, by name (structured genomes)."""
    from evolve.templates import IMAGE_TEMPLATES, SEQUENCE_TEMPLATES
    cnn, fcn, deep = SEQUENCE_TEMPLATES["cnn"], SEQUENCE_TEMPLATES["fcn"], IMAGE_TEMPLATES["deep"]
    detector = IMAGE_TEMPLATES["detector"]
    return {"cnn (GAP)": cnn, "cnn, global max pooling": cnn.replace(reduction="global_max"),
            "FCN, global average pooling (sequence regression)": fcn.replace(reduction="global_average"),
            "FCN, global max pooling (sequence classification)": fcn,
            "detector (images)": detector, "detector with batch norm": detector.replace(norm=True),
            "detector, global average pooling (regression)": detector.replace(reduction="global_average"),
            "three pooled stages (images, volumes)": deep}


def compare_templates(seeds: int, only: str | None = None) -> str:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.architecture import build_layers, make_optimizer
    from evolve import SearchSpace, decode
    configure_tensorflow(1)
    variants = template_variants()
    problems = {only: PROBLEMS[only]} if only else PROBLEMS
    rows = ["| template | " + " | ".join(problems) + " |", "|---|" + "---|" * len(problems)]
    cells: dict[str, list[str]] = {name: [] for name in variants}
    for problem, (make, task) in problems.items():
        x, y = make(n=1500)
        shape, outputs = x.shape[1:], int(y.max()) + 1 if task == "classification" else 1
        space = SearchSpace.from_config({"space": "structured"}, input_rank=len(shape))
        for name, genome in variants.items():
            scores, started = [], time.perf_counter()
            for seed in range(seeds):
                tr, va, _ = _split(len(x), seed)
                keras.utils.set_random_seed(seed)
                model = build_layers(decode(genome, shape, space, outputs), shape, outputs, task)
                scores.append(_fit_and_score(model, make_optimizer(genome.optimizer, genome.learning_rate), x, y,
                                             (tr, va, va), task, epochs=20, patience=4,
                                             batch_size=genome.batch_size))
            cells[name].append(f"{np.median(scores):.3f} ({time.perf_counter() - started:.0f} s)")
            print(problem, name, np.round(scores, 3), flush=True)
    rows += [f"| {name} | " + " | ".join(c) + " |" for name, c in cells.items()]
    return "\n".join(rows)


def compare_draws(count: int, only: str | None = None) -> str:
    """Random genomes of the structured space drawn as a search's first population draws them,
    from the whole space and ``compact`` (the fewest stages or one more, one block each), each
    trained alone on one split: what a random draw is worth, and what it costs."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.architecture import build_layers, make_optimizer
    from evolve import SearchSpace, decode
    from evolve.structured_operators import random_structured
    configure_tensorflow(1)
    problems = {only: PROBLEMS[only]} if only else PROBLEMS
    rows = ["| problem | draw | genomes | median validation | best | upper quartile | median seconds | "
            "validation per second of training (median) |", "|---|---|---|---|---|---|---|---|"]
    for problem, (make, task) in problems.items():
        x, y = make(n=1500)
        shape, outputs = x.shape[1:], int(y.max()) + 1 if task == "classification" else 1
        space = SearchSpace.from_config({"space": "structured", "max_params": 100000}, input_rank=len(shape))
        tr, va, _ = _split(len(x), 0)
        for compact in (False, True):
            rng = np.random.default_rng(7)
            scores, seconds = [], []
            for i in range(count):
                genome = random_structured(rng, space, shape, outputs, compact=compact)
                keras.utils.set_random_seed(i)
                started = time.perf_counter()
                model = build_layers(decode(genome, shape, space, outputs), shape, outputs, task)
                score = _fit_and_score(model, make_optimizer(genome.optimizer, genome.learning_rate), x, y,
                                       (tr, va, va), task, epochs=20, patience=4, batch_size=genome.batch_size)
                scores.append(score if np.isfinite(score) else -1.0)
                seconds.append(time.perf_counter() - started)
                print(problem, "compact" if compact else "whole", i, f"{scores[-1]:.3f}", f"{seconds[-1]:.1f} s",
                      genome.summary(shape), flush=True)
            rate = np.array(scores) / np.array(seconds)
            rows.append(f"| {problem} | {'compact' if compact else 'whole space'} | {count} | "
                        f"{np.median(scores):.3f} | {max(scores):.3f} | {np.quantile(scores, 0.75):.3f} | "
                        f"{np.median(seconds):.1f} | {np.median(rate):.3f} |")
    return "\n".join(rows)


# -------------------------------------------------------------------------- spaces
SPACES_CONFIG = """
name = "{name}"
mode = "evolve"
seed = {seed}
[data]
source = "{source}"
task = "{task}"
[train]
epochs = 30
patience = 5
member_time_limit = 120
[evolve]
strategy = "regularized"
evaluations = 100000
time_limit = {budget}
population_size = 12
sample_size = 4
[search]
space = "{space}"
max_params = 100000
[ensemble]
metric = "{metric}"
"""


def spaces(problem: str, budget: float, seeds: int, folder: Path) -> str:
    from benchkit import mpiexec
    data = write(folder / "data")
    task = PROBLEMS[problem][1]
    metric = "accuracy" if task == "classification" else "r2"
    rows = [f"| seed | space | evaluations | best validation {metric} | its test {metric} | "
            f"ensemble test {metric} |", "|---|---|---|---|---|---|"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    for seed in range(1, seeds + 1):
        for space in ("free", "structured"):
            name = f"{problem}-{space}-s{seed}"
            cfg = folder / f"{name}.toml"
            cfg.write_text(SPACES_CONFIG.format(name=name, seed=seed, source=data[problem], task=task,
                                                budget=budget, space=space, metric=metric))
            run_dir = folder / "runs" / name
            proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-m", "ensemble.run", str(cfg),
                                   "--run-dir", str(run_dir), "--overwrite"], cwd=ROOT, env=env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
            summary = json.loads((run_dir / "ensemble.json").read_text())
            best = summary["best_member"]
            rows.append(f"| {seed} | {space} | {summary['counts']['ok']} | {best['val'][metric]:.3f} | "
                        f"{best['test'][metric]:.3f} | {summary['ensemble']['test'][metric]:.3f} |")
            print(rows[-1], flush=True)
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("gap", "write", "spaces", "templates", "draws", "ceiling"))
    p.add_argument("folder", nargs="?", default=str(ROOT / "bench_out" / "search_problems"))
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--problem", choices=sorted(PROBLEMS), help="spaces: the problem (signals); templates: only "
                                                                "this one (all)")
    p.add_argument("--budget", type=float, default=150.0)
    p.add_argument("--count", type=int, default=12, help="draws: genomes drawn of each kind per problem")
    p.add_argument("--samples", type=int, default=1500, help="ceiling: the benchmark's samples (its split's size)")
    args = p.parse_args()
    t = time.perf_counter()
    if args.command == "write":
        print("\n".join(str(v) for v in write(Path(args.folder)).values()))
    elif args.command == "gap":
        print(gap(args.seeds))
    elif args.command == "templates":
        print(compare_templates(args.seeds, args.problem))
    elif args.command == "draws":
        print(compare_draws(args.count, args.problem))
    elif args.command == "ceiling":
        print(ceiling(args.samples))
    else:
        print(spaces(args.problem or "signals", args.budget, args.seeds, Path(args.folder)))
    print(f"({time.perf_counter() - t:.0f} s, {time.strftime('%Y-%m-%d')})")


if __name__ == "__main__":
    main()
