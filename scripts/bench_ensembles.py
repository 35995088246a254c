"""The ensemble panel: is the selected ensemble better than its best member, and do its
intervals hold their promise, over many small and larger datasets and splits?

    python scripts/bench_ensembles.py train [--kind mlp|two] [--jobs 2] [--seeds 5] [--datasets a b ...]
    python scripts/bench_ensembles.py evaluate [--kind mlp|two] [--write docs/ensembles.md]
    python scripts/bench_ensembles.py ece        # how far a temperature can take the ECE (both kinds)
    python scripts/bench_ensembles.py defaults --roots A B   # other selection defaults, draws pooled

``train`` runs the project (``ensemble.run_config``, the same run directory a CLI run
writes) on every (dataset, seed) of the panel: 8 MLP members of one shape (``--kind two``: 4
and 4 of two shapes, docs/ensembles-two.md; Gaussian NLL heads for regression), one split per
seed. It keeps the run directories under ``bench_out/ensembles[-KIND]/runs`` (``--root``); a
pair already finished is not trained again.
On two datasets it also predicts a test set made progressively harder (Gaussian noise
added to every feature, in units of the feature's spread) and keeps the spread of the
ensemble and the coverage of its intervals (``bench_shift.json``).

``evaluate`` needs no TensorFlow: from each run's stored validation and test predictions it
builds, with the project's own selection, calibration and metrics, (a) the ensemble every
selection method chooses, (b) the best member (ranked on validation as the leaderboard
ranks), (c) the uniform average of all members (a deep ensemble), and reads (d) the linear
baseline the run fitted; then prints one table per dataset and the summary the acceptance
asks for (win rates with counts, mean coverage with its standard error), and writes a plot
of nominal against observed coverage. With ``--write`` it writes the panel's page of the
documentation (dated), so the tables there are this script's output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEMBERS = 8
SHIFT_LEVELS = (0.0, 0.25, 0.5, 1.0, 2.0)


# --------------------------------------------------------------------------- panel
@dataclass(frozen=True)
class Dataset:
    name: str
    task: str                         # "classification" | "regression"
    what: str                         # one line for the tables
    source: str | Callable[[], tuple[np.ndarray, np.ndarray]]   # a built-in name, or a generator
    shift: bool = False               # also measured on shifted test inputs


def _moons() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_moons
    x, y = make_moons(n_samples=600, noise=0.3, random_state=0)
    rng = np.random.default_rng(0)
    return np.hstack([x, rng.normal(size=(len(x), 4))]), y          # 4 irrelevant features


def _classification() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification
    return make_classification(n_samples=2000, n_features=20, n_informative=8, n_classes=3,
                               n_clusters_per_class=2, flip_y=0.05, random_state=0)


def _hastie() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_hastie_10_2
    x, y = make_hastie_10_2(n_samples=1200, random_state=0)
    return x, (y > 0).astype(np.int64)


def _friedman1() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_friedman1
    return make_friedman1(n_samples=500, n_features=8, noise=1.0, random_state=0)


def _friedman2_large() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_friedman2
    x, y = make_friedman2(n_samples=3000, noise=60.0, random_state=0)
    return x, y


def _heteroscedastic() -> tuple[np.ndarray, np.ndarray]:
    """y = sin(3 x0) + x1 / 2 + noise whose scale grows with |x0| (0.05 to 1.05)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, size=(1000, 5))
    y = np.sin(3 * x[:, 0]) + 0.5 * x[:, 1] + (0.05 + np.abs(x[:, 0])) * rng.normal(size=len(x))
    return x, y


def _heavy_tails() -> tuple[np.ndarray, np.ndarray]:
    """A sparse linear signal with Student-t (3 degrees of freedom) noise: Gaussian intervals
    are wrong-shaped here, conformal ones are not."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 10))
    y = x[:, 0] - 2 * x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + rng.standard_t(3, size=len(x))
    return x, y


PANEL = (
    Dataset("iris", "classification", "150 rows, 3 classes", "iris"),
    Dataset("wine", "classification", "178 rows, 3 classes", "wine"),
    Dataset("breast_cancer", "classification", "569 rows, 2 classes", "breast_cancer", shift=True),
    Dataset("moons", "classification", "600 rows, 2 noisy moons + 4 noise features", _moons),
    Dataset("hastie", "classification", "1,200 rows, 10 features (Hastie et al. 10.2)", _hastie),
    Dataset("digits", "classification", "1,797 rows, 8x8 images, 10 classes", "digits"),
    Dataset("classification3", "classification", "2,000 rows, 20 features, 3 classes, 5% flipped labels",
            _classification),
    Dataset("diabetes", "regression", "442 rows, 10 features", "diabetes"),
    Dataset("heavy_tails", "regression", "400 rows, Student-t(3) noise", _heavy_tails),
    Dataset("friedman1", "regression", "500 rows, Friedman #1, Gaussian noise", _friedman1),
    Dataset("heteroscedastic", "regression", "1,000 rows, noise scale 0.05-1.05 with |x0|", _heteroscedastic,
            shift=True),
    Dataset("friedman2", "regression", "3,000 rows, Friedman #2, Gaussian noise", _friedman2_large),
)
BY_NAME = {d.name: d for d in PANEL}


#: the members of one panel run: ``mlp``, 8 of one shape (only their seeds differ); ``two``, 4 of
#: that shape and 4 of another (wider, tanh, dropout), as the demo mixes two architectures
KINDS = {
    "mlp": [{"name": "mlp", "members": MEMBERS, "layers": [
        {"type": "Dense", "units": 64, "activation": "relu"},
        {"type": "Dense", "units": 32, "activation": "relu"}]}],
    "two": [{"name": "mlp", "members": MEMBERS // 2, "layers": [
        {"type": "Dense", "units": 64, "activation": "relu"},
        {"type": "Dense", "units": 32, "activation": "relu"}]},
        {"name": "wide", "members": MEMBERS - MEMBERS // 2, "layers": [
            {"type": "Dense", "units": 128, "activation": "tanh"},
            {"type": "Dropout", "rate": 0.2},
            {"type": "Dense", "units": 64, "activation": "tanh"}]}],
}


def default_root(kind: str) -> Path:
    return ROOT / "bench_out" / ("ensembles" if kind == "mlp" else f"ensembles-{kind}")


def config(d: Dataset, seed: int, root: Path, kind: str = "mlp", holdout: float | None = None) -> dict:
    """The run of one (dataset, seed): the project's defaults but for the members' shapes
    (``KINDS``) and a longer training (early stopping ends it); ``holdout``:
    ``data.calibration_holdout`` (None: its default)."""
    source = d.source
    if callable(source):
        path = root / "data" / f"{d.name}.npz"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            x, y = source()
            np.savez(path, x=x.astype(np.float32), y=y)
        source = str(path)
    return {
        "name": f"{d.name}-s{seed}", "output_dir": str(root / "runs"), "seed": seed,
        "data": {"source": source, "task": d.task, "val_fraction": 0.2, "test_fraction": 0.2,
                 **({} if holdout is None else {"calibration_holdout": holdout})},
        "train": {"epochs": 100, "patience": 10, "learning_rate": 3e-3, "batch_size": 32},
        "architectures": KINDS[kind],
    }


def run_path(root: Path, name: str, seed: int) -> Path:
    return root / "runs" / f"{name}-s{seed}"


# --------------------------------------------------------------------------- train
def _shifted(run: Path, task: str) -> dict:
    """The ensemble on its test inputs made harder, two ways, at each level (in units of
    each feature's spread on the test split): Gaussian noise added to every feature
    ("noise"), and every feature moved by the level ("offset", a covariate shift). Per level:
    mean spread, accuracy or coverage, and how well the spread tells the changed inputs
    from the clean ones (AUROC)."""
    from sklearn.metrics import roc_auc_score

    import ensemble
    ens = ensemble.load(run)
    x, y = ens.data("test")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y)
    scale = x.std(axis=0)
    rng = np.random.default_rng(0)
    out: dict = {}
    for kind in ("noise", "offset"):
        clean = None
        rows = []
        for level in SHIFT_LEVELS:
            xs = x + level * scale * (rng.normal(size=x.shape) if kind == "noise" else 1.0)
            d = ens.predict_details(xs.astype(np.float32))
            spread = d["total"] if task == "classification" else d["std"].reshape(len(x), -1).mean(axis=1)
            row = {"level": level, "spread": float(np.mean(spread))}
            if task == "classification":
                row["accuracy"] = float(np.mean(d["proba"].argmax(axis=1) == y.reshape(-1)))
            else:
                mean = d["mean"].reshape(len(x), -1)
                for key, width in d["intervals"].items():
                    row[f"coverage{key}"] = float(np.mean(np.abs(y.reshape(len(x), -1) - mean)
                                                          <= width.reshape(len(x), -1)))
            if clean is None:
                clean = spread
            else:
                labels = np.r_[np.zeros(len(clean)), np.ones(len(spread))]
                row["auroc"] = float(roc_auc_score(labels, np.r_[clean, spread]))
            rows.append(row)
        out[kind] = rows
    return out


def _has_shift(run: Path) -> bool:
    path = run / "bench_shift.json"
    return path.is_file() and "offset" in json.loads(path.read_text())


def train_pairs(pairs: list[tuple[str, int]], root: Path, kind: str = "mlp", holdout: float | None = None) -> None:
    """Train each (dataset, seed) here, one after another (one TensorFlow start-up)."""
    import ensemble
    for name, seed in pairs:
        d = BY_NAME[name]
        run = run_path(root, name, seed)
        if (run / "ensemble.json").is_file() and (not d.shift or _has_shift(run)):
            continue
        t = time.perf_counter()
        if not (run / "ensemble.json").is_file():
            ensemble.run_config(config(d, seed, root, kind, holdout), overwrite=True)
        if d.shift:
            (run / "bench_shift.json").write_text(json.dumps(_shifted(run, d.task), indent=1))
        print(f"trained {name} seed {seed} in {time.perf_counter() - t:.0f} s", flush=True)


def train(args: argparse.Namespace) -> None:
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    names = args.datasets or [d.name for d in PANEL]
    pairs = [(n, s) for s in range(1, args.seeds + 1) for n in names
             if not (run_path(root, n, s) / "ensemble.json").is_file()
             or (BY_NAME[n].shift and not _has_shift(run_path(root, n, s)))]
    print(f"{len(pairs)} (dataset, seed) runs to train with {args.jobs} processes", flush=True)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    procs = []
    for j in range(args.jobs):
        share = pairs[j::args.jobs]
        if not share:
            continue
        log = open(root / f"train-{j}.log", "a")
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "_train", "--root", str(root), "--kind", args.kind,
             *([] if args.holdout is None else ["--holdout", str(args.holdout)]),
             "--pairs", json.dumps(share)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a training process failed (exit codes {codes}); see {root}/train-*.log")


# ------------------------------------------------------------------------ evaluate
METHODS = ("auto", "shrunk", "greedy", "bagged", "uniform", "best")
LABEL = {"auto": "selected (default)", "shrunk": "shrunk", "greedy": "greedy", "bagged": "bagged",
         "uniform": "uniform average",
         "best": "best member", "linear": "linear baseline",
         "previous": "previous default (as the run wrote it)"}


def load_run(run: Path) -> dict:
    """What a finished run kept: its config and task, the split's targets, every kept
    member's validation and test predictions, the best member as the leaderboard ranks it,
    and the linear baseline's test metrics."""
    from ensemble.config import read_saved_config
    from ensemble.config.vocabulary import PROPER_SCORES
    from ensemble.inference.load import run_arrays
    from ensemble.results.artifacts import Artifacts
    from ensemble.results.rundir import RunDirectory
    from ensemble.results.selection import rank_members
    from ensemble.results.summary import finished_records
    from ensemble.task import get_task
    rd = RunDirectory(run)
    cfg = read_saved_config(rd.path / rd.CONFIG)
    meta = json.loads((rd.path / rd.DATA).read_text())
    summary = json.loads((rd.path / rd.ENSEMBLE).read_text())
    task = get_task(meta["task"])
    metric = task.default_metric(cfg.ensemble.metric)
    lines = rd.read_lines()
    artifacts = Artifacts(rd, metric, cfg.ensemble.candidates, cfg.ensemble.keep_models)
    artifacts.restore(lines, tidy=False)
    try:
        arrays = {i: artifacts.load(i) for i in artifacts.pool()}
    finally:
        artifacts.close()
    finished = finished_records([r for r in lines if "event" not in r])
    best = rank_members(finished, metric, PROPER_SCORES[task.name])[0].id
    targets = run_arrays(rd.path, cfg, meta)
    shift = rd.path / "bench_shift.json"
    return {"cfg": cfg, "task": task, "metric": metric, "arrays": arrays, "best": best,
            "targets": {"val": targets["y_val"], "test": targets["y_test"]},
            "baseline": (summary.get("baseline") or {}).get("test"),
            "holdout": meta.get("calibration_holdout", 0.0),
            # the ensemble the run chose, when the selection code that wrote it was the previous
            # default (greedy or bagged by 2-fold CV, the best member alone when in-sample better)
            "previous": {"test": summary["ensemble"]["test"], "members": len(summary["members"])}
            if "fallback_to_best_member" in summary.get("selection", {}) else None,
            "shift": json.loads(shift.read_text()) if shift.is_file() else None}


def assess(run: dict) -> dict:
    """Every method's ensemble on one run, scored by the project's own code."""
    from ensemble.config.vocabulary import proper_score
    from ensemble.results.selection import choose_ensemble
    from ensemble.results.summary import score_weights
    task, arrays, cfg = run["task"], run["arrays"], run["cfg"]
    gaussian = all("val_var" in a for a in arrays.values())
    proper = proper_score(task.name, gaussian)
    val_preds = {i: a["val_pred"] for i, a in arrays.items()}
    val_vars = {i: a["val_var"] for i, a in arrays.items()} if gaussian else None
    out: dict = {"proper": proper, "n_val": len(run["targets"]["val"]), "n_test": len(run["targets"]["test"])}
    for method in METHODS:
        why = None
        if method == "uniform":
            weights = {i: 1.0 / len(arrays) for i in arrays}
        elif method == "best":
            weights = {run["best"]: 1.0}
        else:
            choice = choose_ensemble(val_preds, run["targets"]["val"], proper, method=method, rank_metric=run["metric"],
                                     k=cfg.ensemble.k, val_vars=val_vars, seed=cfg.seed)
            weights, why = choice["weights"], choice["why"]
        scored = score_weights(task, weights, arrays, run["targets"], cfg.ensemble.calibration, cfg.seed, gaussian,
                               run["holdout"])
        w = np.array(list(weights.values()))
        out[method] = {"test": scored["metrics"]["test"], "members": len(weights),
                       "calibration_rows": (scored["calibration"] or {}).get("rows"),
                       "size": float(1.0 / np.sum(w ** 2)), "why": why,
                       "calibration": (scored["calibration"] or {}).get("method", "none"), "curve": scored["curve"]}
        if method == "auto":              # the other recalibrations of the same ensemble
            for setting in (("none", "variance_scaling", "conformal") if task.name == "regression"
                            else ("none", "temperature")):
                other = score_weights(task, weights, arrays, run["targets"], setting, cfg.seed, gaussian,
                                      run["holdout"])
                out[f"auto/{setting}"] = {"test": other["metrics"]["test"], "curve": other["curve"]}
    out["linear"] = {"test": run["baseline"]} if run["baseline"] else None
    out["previous"] = run["previous"]
    out["shift"] = run["shift"]
    return out


def _mean_sd(values: list[float]) -> str:
    v = np.asarray(values, dtype=np.float64)
    return f"{v.mean():.4g} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.2g}"


def _better_or_equal(a: float, b: float, higher: bool) -> bool:
    return a >= b - 1e-12 if higher else a <= b + 1e-12


def coverage_se(level: float, seeds: list[tuple[int | None, int]]) -> float:
    """The standard error of a dataset's observed coverage at ``level`` (the mean over its
    seeds), counting both sources of chance: the test rows (binomial) and the calibration rows.
    Split conformal's coverage given ``m`` calibration rows is Beta(k, m + 1 - k) distributed,
    k = ceil((m + 1) level) (Vovk 2012; Angelopoulos and Bates 2021, section 3.2): with 45
    calibration rows a 95% interval's coverage varies by 3 points from one calibration set to
    the next (taken as the measure for variance scaling too). ``seeds``: (calibration rows or
    None, test rows) per seed."""
    from ensemble.task.calibration import coverage_spread
    var = 0.0
    for m, n in seeds:
        var += level * (1.0 - level) / n
        if m:
            var += coverage_spread(level, m) ** 2
    return math.sqrt(var) / len(seeds)


def summarise(results: dict[str, dict[int, dict]]) -> tuple[str, dict]:
    """The panel's tables (markdown) and the acceptance figures."""
    from ensemble.task.metrics import COVERAGE_LEVELS, coverage_name, higher_is_better
    lines, figures = [], {"pairs": 0, "beats_best": 0, "ece_pairs": 0, "ece_le_best": 0, "worse_than_uniform": [],
                          "coverage": {lv: [] for lv in COVERAGE_LEVELS}, "below_nominal": [], "below_nominal_cal": []}
    for d in PANEL:
        seeds = results.get(d.name)
        if not seeds:
            continue
        first = next(iter(seeds.values()))
        proper = first["proper"]
        accuracy = "accuracy" if d.task == "classification" else "mse"
        extra = ["ece"] if d.task == "classification" else [coverage_name(lv) for lv in COVERAGE_LEVELS]
        cols = [proper, accuracy, *extra]
        lines.append(f"\n### {d.name}: {d.what} ({d.task}, {len(seeds)} seeds, "
                     f"{first['n_val']} validation / {first['n_test']} test rows)\n")
        lines.append("| | " + " | ".join(f"test {c}" for c in cols) + " | members (effective) |")
        lines.append("|---" * (len(cols) + 2) + "|")
        for method in (*METHODS, "previous", "linear"):
            rows = [r[method] for r in seeds.values() if r.get(method)]
            if not rows:
                continue
            cells = [_mean_sd([r["test"][c] for r in rows]) if all(c in r["test"] for r in rows) else ""
                     for c in cols]
            size = (f"{np.mean([r['members'] for r in rows]):.1f}"
                    + (f" ({np.mean([r['size'] for r in rows]):.1f})" if "size" in rows[0] else "")
                    if "members" in rows[0] else "")
            lines.append(f"| {LABEL[method]} | " + " | ".join(cells) + f" | {size} |")
        higher = higher_is_better(proper)
        diffs = []
        for r in seeds.values():
            figures["pairs"] += 1
            figures["beats_best"] += _better_or_equal(r["auto"]["test"][proper], r["best"]["test"][proper], higher)
            diffs.append((r["auto"]["test"][proper] - r["uniform"]["test"][proper]) * (-1 if higher else 1))
            if d.task == "classification":
                figures["ece_pairs"] += 1
                figures["ece_le_best"] += r["auto"]["test"]["ece"] <= r["best"]["test"]["ece"] + 1e-12
        diffs_ = np.asarray(diffs)
        se = diffs_.std(ddof=1) / math.sqrt(len(diffs_)) if len(diffs_) > 1 else 0.0
        if diffs_.mean() > se:
            figures["worse_than_uniform"].append(f"{d.name} ({diffs_.mean():+.4g}, SE {se:.2g})")
        if d.task == "regression":
            n = sum(r["n_test"] for r in seeds.values())
            for lv in COVERAGE_LEVELS:
                observed = float(np.mean([r["auto"]["test"][coverage_name(lv)] for r in seeds.values()]))
                figures["coverage"][lv].append(observed)
                if observed < lv - 2 * math.sqrt(lv * (1 - lv) / n):
                    figures["below_nominal"].append(f"{d.name} at {lv:.0%}: {observed:.3f} over {n} test rows")
                se = coverage_se(lv, [(r["auto"]["calibration_rows"], r["n_test"]) for r in seeds.values()])
                if observed < lv - 2 * se:
                    figures["below_nominal_cal"].append(f"{d.name} at {lv:.0%}: {observed:.3f} (SE {se:.3f})")
        whys = sorted({r["auto"]["why"] for r in seeds.values()})
        lines.append("\nselected: " + "; ".join(f"seed {s}: {r['auto']['members']} members "
                                                  f"(effective {r['auto']['size']:.1f})"
                                                  for s, r in sorted(seeds.items())))
        lines.append("\n" + "\n".join(f"- {w}" for w in whys))
    return "\n".join(lines), figures


def acceptance(figures: dict) -> str:
    from ensemble.task.metrics import COVERAGE_LEVELS
    pairs = figures["pairs"]
    out = ["| figure | measured | asked |", "|---|---|---|",
           f"| selected ensemble's test proper score at least its best member's | "
           f"{figures['beats_best']} of {pairs} pairs ({figures['beats_best'] / max(pairs, 1):.0%}) | at least 90% |",
           f"| datasets where the selected ensemble is worse than the uniform average by more than the "
           f"seed-to-seed standard error | {', '.join(figures['worse_than_uniform']) or 'none'} | none |",
           f"| classification: ensemble's ECE at most its best member's | {figures['ece_le_best']} of "
           f"{figures['ece_pairs']} pairs ({figures['ece_le_best'] / max(figures['ece_pairs'], 1):.0%}) | "
           f"at least 80% |"]
    for lv in COVERAGE_LEVELS:
        v = np.asarray(figures["coverage"][lv])
        if len(v):
            se = v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else 0.0
            out.append(f"| regression: mean observed coverage of the {lv:.0%} interval over {len(v)} datasets | "
                       f"{v.mean():.3f} ± {se:.3f} | within 0.03 of {lv:.2f}"
                       + (" |" if lv >= 0.8 else " (not asked) |"))
    out.append(f"| regression datasets below nominal by more than twice the binomial SE | "
               f"{'; '.join(figures['below_nominal']) or 'none'} | none |")
    out.append(f"| the same, with the SE that also counts the calibration rows' own chance (`coverage_se`) | "
               f"{'; '.join(figures['below_nominal_cal']) or 'none'} | (not asked) |")
    return "\n".join(out)


def methods_table(results: dict[str, dict[int, dict]]) -> str:
    """Every method against the best member and the uniform average, over all pairs: how
    the default was chosen."""
    from ensemble.task.metrics import higher_is_better
    rows = []
    for method in (*METHODS, "previous"):
        vs_best = vs_uniform = ece = ece_pairs = pairs = alone = 0
        worse = []
        for d in PANEL:
            diffs = []
            for r in results.get(d.name, {}).values():
                if not r.get(method):
                    continue
                p = r["proper"]
                higher = higher_is_better(p)
                pairs += 1
                alone += r[method].get("members") == 1
                vs_best += _better_or_equal(r[method]["test"][p], r["best"]["test"][p], higher)
                vs_uniform += _better_or_equal(r[method]["test"][p], r["uniform"]["test"][p], higher)
                diffs.append((r[method]["test"][p] - r["uniform"]["test"][p]) * (-1 if higher else 1))
                if "ece" in r[method]["test"]:
                    ece_pairs += 1
                    ece += r[method]["test"]["ece"] <= r["best"]["test"]["ece"] + 1e-12
            if len(diffs) > 1 and np.mean(diffs) > np.std(diffs, ddof=1) / math.sqrt(len(diffs)):
                worse.append(d.name)
        if pairs:
            rows.append(f"| {LABEL[method]} | {vs_best} of {pairs} | {vs_uniform} of {pairs} | "
                        f"{ece} of {ece_pairs} | {len(worse)} ({', '.join(worse) or '-'}) | {alone} |")
    return ("| method | test proper score at least the best member's | at least the uniform average's | "
            "ECE at most the best member's | datasets worse than the uniform average by more than the SE | "
            "one-member ensembles |\n|---|---|---|---|---|---|\n" + "\n".join(rows))


def shift_table(results: dict[str, dict[int, dict]]) -> str:
    """Spread, accuracy or coverage, and AUROC of the spread against the level of each
    shift, averaged over seeds, for the datasets measured under shift."""
    out = []
    for d in PANEL:
        runs = [r["shift"] for r in results.get(d.name, {}).values() if r.get("shift") and "noise" in r["shift"]]
        if not runs:
            continue
        for kind, what in (("noise", "Gaussian noise added to every feature"),
                           ("offset", "every feature moved by the level (covariate shift)")):
            keys = [k for k in runs[0][kind][0] if k != "level"] + ["auroc"]
            out.append(f"\n**{d.name}, {kind}**: {what}; {len(runs)} seeds; level in units of each feature's "
                       f"spread; spread = {'predictive entropy' if d.task == 'classification' else 'predicted std'}\n")
            out.append("| level | " + " | ".join(keys) + " |")
            out.append("|---" * (len(keys) + 1) + "|")
            for j, level in enumerate(SHIFT_LEVELS):
                cells = [f"{np.mean([r[kind][j][k] for r in runs]):.3f}" if k in runs[0][kind][j] else ""
                         for k in keys]
                out.append(f"| {level} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def coverage_plot(results: dict[str, dict[int, dict]], path: Path) -> None:
    """Nominal against observed coverage of the selected ensemble's recalibrated intervals,
    one line per regression dataset (seeds pooled), with the binomial band of the panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 5))
    pooled: dict[str, list] = {}
    levels = None
    for d in PANEL:
        runs = [r["auto"] for r in results.get(d.name, {}).values() if r["auto"].get("curve")]
        if not runs:
            continue
        levels = np.array([int(k) / 100 for k in runs[0]["curve"]["levels"]])
        rows = np.array([r["curve"]["rows"]["test"] for r in runs], dtype=np.float64)
        observed = np.array([r["curve"]["test"] for r in runs])
        mean = (observed * rows[:, None]).sum(axis=0) / rows.sum()
        ax.plot(levels, mean, marker=".", label=d.name)
        pooled.setdefault("obs", []).append(observed * rows[:, None])
        pooled.setdefault("rows", []).append(rows)
    if levels is None:
        return
    n = np.concatenate(pooled["rows"]).sum()
    band = 2 * np.sqrt(levels * (1 - levels) / n)
    ax.fill_between(levels, levels - band, levels + band, color="0.85", label=f"±2 binomial SE ({int(n)} rows)")
    ax.plot([0, 1], [0, 1], color="k", lw=0.8)
    ax.set_xlabel("nominal coverage")
    ax.set_ylabel("observed test coverage")
    ax.set_title("Recalibrated intervals of the selected ensemble")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def evaluate(args: argparse.Namespace) -> None:
    root = Path(args.root)
    results: dict[str, dict[int, dict]] = {}
    t = time.perf_counter()
    names = args.datasets or [d.name for d in PANEL]
    for name in names:
        for seed in range(1, args.seeds + 1):
            run = run_path(root, name, seed)
            if (run / "ensemble.json").is_file():
                results.setdefault(name, {})[seed] = assess(load_run(run))
    tables, figures = summarise(results)
    plot = Path(args.write).with_name(f"{Path(args.write).stem}-coverage.png") if args.write else root / "coverage.png"
    coverage_plot(results, plot)
    text = (f"## Acceptance\n\n{acceptance(figures)}\n\n## Every method\n\n{methods_table(results)}\n\n"
            f"## Per dataset\n{tables}\n\n"
            f"## Under shift\n{shift_table(results)}\n")
    print(text)
    print(f"({sum(len(v) for v in results.values())} runs evaluated in {time.perf_counter() - t:.0f} s; "
          f"coverage plot: {plot})")
    if args.write:
        page = Path(args.write)
        header = page.read_text().split(MARK)[0] if page.is_file() and MARK in page.read_text() else ""
        kind = "" if args.kind == "mlp" else f" --kind {args.kind}"
        shapes = " and ".join(f"{a['members']} `{a['name']}`" for a in KINDS[args.kind])
        page.write_text(header + MARK + f"\n\nGenerated by `python scripts/bench_ensembles.py evaluate{kind} --write "
                        f"{args.write}` on {time.strftime('%Y-%m-%d')} from the runs `python "
                        f"scripts/bench_ensembles.py train{kind}` made ({shapes} members per run, "
                        f"{args.seeds} seeds).\n\n![coverage]({plot.name})\n\n" + text)


MARK = "<!-- generated by scripts/bench_ensembles.py below this line -->"


def ece_study(args: argparse.Namespace) -> None:
    """How far a temperature can take the selected ensemble's test ECE below its best
    member's (recalibrated by default), per rule of fitting it: the default, always the
    validation log loss's minimum, its median over 50 bootstrap resamples of the validation
    rows, Mix-n-Match's ensemble temperature scaling (Zhang et al. 2020), and the oracle (the
    temperature of least ECE on the test split itself: what no rule fitted on validation can
    beat). Reads the stored runs; prints one markdown table."""
    from scipy.optimize import minimize, minimize_scalar

    from ensemble.results.selection import choose_ensemble
    from ensemble.task import calibration as C
    from ensemble.task.metrics import classification_metrics

    def ece(y, p):
        return classification_metrics(y, p)["ece"]

    def nll_t(y, p):
        res = minimize_scalar(lambda lt: C._log_loss(y, p, math.exp(lt)), bounds=(math.log(0.2), math.log(5.0)),
                              method="bounded")
        return math.exp(res.x)

    def boot_t(y, p):
        rng = np.random.default_rng(0)
        return float(np.exp(np.median([math.log(nll_t(y[i], p[i]))
                                       for i in (rng.integers(0, len(y), len(y)) for _ in range(50))])))

    def ets(y, p, q):
        t, k = nll_t(y, p), p.shape[1]

        def mix(a, x):
            w = np.exp(a) / np.exp(a).sum()
            return w[0] * C._scaled(x, t) + w[1] * x + w[2] / k
        a = minimize(lambda a: -np.mean(np.log(np.clip(mix(a, p)[np.arange(len(y)), y], 1e-12, 1))),
                     np.zeros(3), method="Nelder-Mead").x
        return mix(a, q)

    def geometric(w, arrays, split):
        """The selected members pooled in log space: softmax of the weighted mean log probability."""
        logp = sum(w[i] * np.log(np.clip(arrays[i][split], 1e-12, 1.0)) for i in w)
        e = np.exp(logp - logp.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    rng = np.random.default_rng(1)
    noise: dict[str, list[tuple[float, float, float, float]]] = {}
    grid = np.exp(np.linspace(math.log(0.2), math.log(5.0), 300))
    held = {"out": False}          # whether the run kept calibration rows from early stopping (the default's input)
    rules = {"default (`auto`)": lambda y, p, q: C._scaled(q, C.fit_temperature(
                 y, p, soften_only=not held["out"])["temperature"]),
             "sharpening allowed (`auto` before 2026-11-29)": lambda y, p, q: C._scaled(
                 q, C.fit_temperature(y, p)["temperature"]),
             "none (T = 1)": lambda y, p, q: q,
             "validation log loss, always": lambda y, p, q: C._scaled(q, nll_t(y, p)),
             "its median over 50 bootstraps": lambda y, p, q: C._scaled(q, boot_t(y, p)),
             "ensemble temperature scaling": ets}
    rows = {}
    for kind in KINDS:
        root = default_root(kind)
        for d in PANEL:
            if d.task != "classification":
                continue
            for seed in range(1, args.seeds + 1):
                if not (run_path(root, d.name, seed) / "ensemble.json").is_file():
                    continue
                run = load_run(run_path(root, d.name, seed))
                arrays, yv, yt = run["arrays"], run["targets"]["val"].reshape(-1), run["targets"]["test"].reshape(-1)
                held["out"] = len(C.holdout_rows(len(yv), run["holdout"])[1]) < len(yv)
                w = choose_ensemble({i: a["val_pred"] for i, a in arrays.items()}, yv, "log_loss", method="auto",
                                    rank_metric=run["metric"], k=run["cfg"].ensemble.k, seed=run["cfg"].seed)["weights"]
                pv = sum(w[i] * arrays[i]["val_pred"] for i in w)
                pt = sum(w[i] * arrays[i]["test_pred"] for i in w)
                b = arrays[run["best"]]
                best = rules["default (`auto`)"](yv, b["val_pred"], b["test_pred"])
                be, bl = ece(yt, best), C._log_loss(yt, best, 1.0)
                pooled = {"": (pv, pt),
                          "log-space pooling, ": tuple(geometric(w, arrays, x) for x in ("val_pred", "test_pred"))}
                for name, rule in rules.items():
                    for pooling, (pv_, pt_) in pooled.items():
                        if pooling and name not in ("default (`auto`)", "none (T = 1)"):
                            continue
                        q = rule(yv, pv_, pt_)
                        got = rows.setdefault((kind, pooling + name), [0, 0, 0, []])
                        got[0] += ece(yt, q) <= be + 1e-12
                        got[1] += C._log_loss(yt, q, 1.0) <= bl + 1e-12
                        got[2] += 1
                        got[3].append(C._log_loss(yt, q, 1.0) - C._log_loss(yt, pt, 1.0))
                oracle = rows.setdefault((kind, "oracle: least test ECE"), [0, 0, 0, []])
                oracle[0] += min(ece(yt, C._scaled(pt, t)) for t in grid) <= be + 1e-12
                oracle[2] += 1
                q = rules["default (`auto`)"](yv, pv, pt)      # how far the test rows alone move the comparison
                diffs = [ece(yt[i], q[i]) - ece(yt[i], best[i]) for i in (rng.integers(0, len(yt), len(yt))
                                                                           for _ in range(200))]
                noise.setdefault(kind, []).append((ece(yt, q) - be, float(np.std(diffs)),
                                                   float(np.quantile(diffs, 0.05)), float(np.quantile(diffs, 0.95))))
    print("| members | temperature | test ECE at most the best member's | test log loss at most the best "
          "member's | mean change of test log loss against T = 1 |")
    print("|---|---|---|---|---|")
    for (kind, name), (e, wins, n, dl) in rows.items():
        loss = "-" if not dl else f"{wins} of {n}"
        change = "-" if not dl else f"{np.mean(dl):+.4f}"
        print(f"| {kind} | {name} | {e} of {n} ({100 * e / n:.0f}%) | {loss} | {change} |")
    print()
    for kind, pairs in noise.items():
        d = np.array(pairs)
        print(f"{kind}: test ECE of the default ensemble minus its best member's, over {len(d)} pairs: mean "
              f"{d[:, 0].mean():+.4f} (SE {d[:, 0].std(ddof=1) / math.sqrt(len(d)):.4f}), median size "
              f"{np.median(np.abs(d[:, 0])):.4f}; its bootstrap SD over the test rows (200 resamples) median "
              f"{np.median(d[:, 1]):.4f}; the ensemble worse with 90% confidence (5% quantile > 0) in "
              f"{int((d[:, 2] > 0).sum())} pairs, better (95% quantile < 0) in {int((d[:, 3] < 0).sum())}")


#: what ``defaults`` compares with the default (shrunk bagged selection, shrink 0.25, that
#: another selection must beat out of fold by depart_z standard errors): (base, shrink)
DEFAULTS = {"default": ("shrunk", None), "shrink 0.5": ("shrunk", 0.5), "shrink 0.75": ("shrunk", 0.75),
            "uniform base": ("uniform", None)}


def defaults_study(args: argparse.Namespace) -> None:
    """The acceptance figures under other choices of "auto"'s default, over the runs of every
    ``--roots`` folder pooled (the same dataset's runs of another draw count as more seeds):
    the shrinkage toward the uniform average, or the uniform average itself as what another
    selection must beat. Reads the stored runs; prints a line per choice."""
    import ensemble.results.selection as S
    global METHODS
    runs = []
    for r, root in enumerate(args.roots):
        for d in PANEL:
            for seed in range(1, args.seeds + 1):
                run = run_path(Path(root), d.name, seed)
                if (run / "ensemble.json").is_file():
                    runs.append((d.name, r * args.seeds + seed, load_run(run)))
    auto, shrink, methods = S._auto, S.SHRINK, METHODS
    METHODS = ("auto", "uniform", "best")             # what the figures need
    print(f"{len(runs)} runs from {', '.join(args.roots)}")
    try:
        for name, (base, value) in DEFAULTS.items():
            S.SHRINK = shrink if value is None else value
            S._auto = (auto if base == "shrunk" else      # the uniform average: the largest top_k
                       lambda cv, higher, _: auto(cv, higher, max((c for c in cv if c.startswith("top_")),
                                                                  key=lambda c: int(c[4:]))))
            results: dict[str, dict[int, dict]] = {}
            for dataset, seed, run in runs:
                results.setdefault(dataset, {})[seed] = assess(run)
            f = summarise(results)[1]
            print(f"{name}: test proper score at least the best member's in {f['beats_best']} of {f['pairs']} "
                  f"pairs; ECE at most the best member's in {f['ece_le_best']} of {f['ece_pairs']}; worse than "
                  f"the uniform average beyond the SE on: "
                  f"{', '.join(w.split(' (')[0] for w in f['worse_than_uniform']) or 'none'}", flush=True)
    finally:
        S._auto, S.SHRINK, METHODS = auto, shrink, methods


# ------------------------------------------------------------------------ command
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("train", "evaluate", "ece", "defaults", "_train"))
    p.add_argument("--kind", choices=sorted(KINDS), default="mlp",
                   help="the members of every run (KINDS): mlp, 8 of one shape; two, 4 and 4 of two shapes")
    p.add_argument("--root", help="where the runs are kept (default bench_out/ensembles[-KIND])")
    p.add_argument("--roots", nargs="+", help="defaults: the run folders pooled (default: --root)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=2, help="training processes (one TensorFlow thread each)")
    p.add_argument("--datasets", nargs="+", choices=sorted(BY_NAME))
    p.add_argument("--pairs", help=argparse.SUPPRESS)
    p.add_argument("--holdout", type=float, help="train: `data.calibration_holdout` of every run (default: the "
                   "schema's); give it a --root of its own")
    p.add_argument("--write", help="write the documentation page (markdown) here")
    args = p.parse_args(argv)
    args.root = args.root or str(default_root(args.kind))
    if args.stage == "_train":
        train_pairs([tuple(x) for x in json.loads(args.pairs)], Path(args.root), args.kind, args.holdout)
    elif args.stage == "train":
        train(args)
    elif args.stage == "defaults":
        args.roots = args.roots or [args.root]
        defaults_study(args)
    elif args.stage == "ece":
        ece_study(args)
    else:
        evaluate(args)


if __name__ == "__main__":
    main()
