"""The run report: ``RUN_DIR/report.html``, one self-contained page a scientist opens after ``scp``.

Everything comes from the run directory (journal, ensemble.json, the ensemble's test
predictions, config.toml, data.json), so the report can be written at the end of a run,
again later (``python -m ensemble.report RUN_DIR``), or for a run that is still going or
stopped early (what is not there yet is left out, and the page says so). The plots are
drawn with matplotlib's object interface (no pyplot state, no display) and also written
as PNG files beside it (``RUN_DIR/report/*.png``); the HTML embeds them as base64 and
references nothing outside itself. A plot that fails is replaced by its error message:
a report is never the reason a run fails.

Plots: the leaderboard; classification reliability (ensemble vs best member) and
accuracy against the share of most-confident samples kept; regression predicted against
true with the ensemble's intervals, error against predicted spread with the rank
correlation, and the coverage curve (nominal against observed, with its binomial band);
for searches the metric of every evaluation and the best so far against
evaluations and wall time; cost (parameters, training time) against the metric with the
Pareto front; a per-rank timeline of every member with the run's utilisation.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ensemble.config import ConfigError, RunConfig, read_saved_config
from ensemble.config.vocabulary import PROPER_SCORES
from ensemble.results.events import Event, EventKind
from ensemble.results.heartbeat import read_heartbeat, state_words, untrained_lines
from ensemble.results.records import SEARCH, Counts, MemberRecord, Status, as_records, latest
from ensemble.results.rundir import DAMAGED_FIX, RunDirectory
from ensemble.results.selection import rank_members
from ensemble.results.summary import (
    baseline_beats,
    baseline_judged,
    calibration_lines,
    epochs_note,
    majority_warning,
    selection_text,
)
from ensemble.results.timeline import as_events, run_stats
from ensemble.task import get_task
from ensemble.task.metrics import higher_is_better, metric_task, metric_text

REPORT, FOLDER = "report.html", "report"
MAX_BARS = 40            # leaderboard: the best 40 members by name; more would be unreadable
MAX_LANES = 64           # timeline: the first 64 ranks (the title says how many there were)


@dataclass
class RunView:
    """What the report reads from a run directory; every part but the path may be missing.
    ``records`` and ``events`` are the journal typed (``RunDirectory.records``); every count
    and plot derives from their ``Status`` (``counts``: ``records.Counts``, as ensemble.json
    and ``ensemble.status`` count)."""
    path: Path
    config: RunConfig | None = None
    config_text: str = ""
    meta: dict = field(default_factory=dict)
    summary: dict | None = None
    damaged: str | None = None          # why ensemble.json could not be read, when it is there
    records: list[MemberRecord] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    test: dict | None = None                      # ensemble_test_predictions.npz
    metric: str | None = None

    def __post_init__(self) -> None:              # raw journal lines are read as records and events
        self.records = as_records(self.records)
        self.events = as_events(self.events)

    @property
    def task(self) -> str | None:
        return (self.summary or {}).get("task") or self.meta.get("task")

    @property
    def mode(self) -> str | None:
        return None if self.config is None else self.config.mode

    @property
    def final(self) -> list[MemberRecord]:
        """Each member's final record (``records.latest``), in journal order."""
        return list(latest(self.records).values())

    @property
    def counts(self) -> Counts:
        issued = {e.data.get("id") for e in self.events if e.kind is EventKind.ISSUED}
        return Counts.of_records(self.records, issued=len(issued))

    @property
    def finished(self) -> list[MemberRecord]:
        """Members that finished (``Status.OK``): the only ones ranked, plotted as results and selected."""
        return [r for r in self.final if r.status.ranked]

    @property
    def failed(self) -> list[MemberRecord]:
        """Members that ended without a result: failed, stopped or at their time limit."""
        return [r for r in self.final if not r.status.evaluated]

    @property
    def selected(self) -> dict[str, float]:
        return {m["id"]: float(m["weight"]) for m in (self.summary or {}).get("members", [])}

    def ranked(self) -> list[MemberRecord]:
        metric = self.metric
        if not metric:
            return self.finished
        return rank_members([r for r in self.finished if metric in r.val], metric,
                            PROPER_SCORES[metric_task(metric)])


def read_view(run_dir: str | Path) -> RunView:
    """The run directory's files as the report needs them; raises ``FileNotFoundError`` when
    it is not a run directory at all."""
    rd = RunDirectory(Path(run_dir))
    if not rd.path.is_dir() or not (rd.path / rd.JOURNAL).is_file():
        raise FileNotFoundError(f"{str(rd.path)!r} is not a run directory of ensemble.run (no "
                                f"{rd.JOURNAL}); pass the folder a run wrote (runs/<name> or its --run-dir)")
    view = RunView(rd.path)
    view.records, view.events = rd.records()
    if (rd.path / rd.CONFIG).is_file():
        view.config_text = (rd.path / rd.CONFIG).read_text()
        try:
            view.config = read_saved_config(rd.path / rd.CONFIG)
        except ConfigError:                     # the page still shows the text
            view.config = None
    for name, attr in ((rd.DATA, "meta"), (rd.ENSEMBLE, "summary")):
        try:
            setattr(view, attr, json.loads((rd.path / name).read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            if name == rd.ENSEMBLE and (rd.path / name).is_file():
                view.damaged = f"{name} cannot be read ({exc}): {DAMAGED_FIX}"
    if view.summary is not None and (rd.path / rd.TEST_PREDICTIONS).is_file():
        with np.load(rd.path / rd.TEST_PREDICTIONS) as f:
            view.test = {k: f[k] for k in f.files}
    view.metric = (view.summary or {}).get("metric") or _configured_metric(view)
    return view


def _configured_metric(view: RunView) -> str | None:
    """The metric the config names, ``auto`` resolved by the task (None while it is unknown)."""
    if view.config is None:
        return None
    setting = view.config.ensemble.metric
    if setting != "auto":
        return setting
    return get_task(view.task).default_metric(setting) if view.task else None


# -- plots ------------------------------------------------------------------------------
def _figure(width: float = 7.5, height: float = 4.0):
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def plot_leaderboard(view: RunView):
    """Every finished member's validation and test metric (the best ``MAX_BARS``), the
    selected ones marked with their weight, the ensemble's and the baseline's lines."""
    ranked, metric = view.ranked(), view.metric
    if not ranked or not metric:
        return None
    shown = ranked[:MAX_BARS]
    fig = _figure(8.5, 4.2)
    ax = fig.subplots()
    x = np.arange(len(shown))
    val = [r.val.get(metric, np.nan) for r in shown]
    test = [r.test.get(metric, np.nan) for r in shown]
    ax.plot(x, val, "o", color="#1f77b4", label="member, validation")
    ax.plot(x, test, "s", color="#ff7f0e", mfc="none", label="member, test")
    chosen = view.selected
    picked = [i for i, r in enumerate(shown) if r.id in chosen]
    if picked:
        ax.plot(picked, [val[i] for i in picked], "*", ms=15, color="#2ca02c", zorder=3,
                label="selected (weight above)")
        for i in picked:
            ax.annotate(f"{chosen[shown[i].id]:.2f}", (i, val[i]), textcoords="offset points",
                        xytext=(0, 9), ha="center", fontsize=7, color="#2ca02c")
    ens = (view.summary or {}).get("ensemble", {})
    for split, style in (("test", "-"), ("val", "--")):
        value = ens.get(split, {}).get(metric)
        if value is not None:
            ax.axhline(value, color="#2ca02c", ls=style, lw=1.2, label=f"ensemble, {split}")
    base = (view.summary or {}).get("baseline", {}).get("test", {}).get(metric)
    if base is not None:
        ax.axhline(base, color="#7f7f7f", ls=":", lw=1.5, label=f"{view.summary['baseline']['model']}, test")
    ax.set_xticks(x, [r.id for r in shown], rotation=70, fontsize=7)
    ax.set_ylabel(metric)
    more = f" (the best {len(shown)} of {len(ranked)})" if len(ranked) > len(shown) else ""
    ax.set_title(f"Leaderboard: {metric} by member{more}, ranked on validation")
    ax.legend(fontsize=7, ncols=2)
    ax.grid(alpha=0.3)
    return fig


def _reliability(proba: np.ndarray, y: np.ndarray, bins: int = 10, least: int = 15):
    """(mean confidence, accuracy, samples) per bin of equal mass: the samples sorted by
    confidence and cut into `bins` groups of equal size (fewer when that would leave fewer
    than `least` samples in one), so no point rests on a handful of samples."""
    conf = proba.max(axis=1)
    right = proba.argmax(axis=1) == y
    order = np.argsort(conf, kind="stable")
    groups = np.array_split(order, max(1, min(bins, len(conf) // least)))
    return np.array([(conf[g].mean(), right[g].mean(), len(g)) for g in groups if len(g)])


def _kept_accuracy(proba: np.ndarray, y: np.ndarray):
    """Accuracy on the most confident share of samples, for every share (accuracy-rejection)."""
    order = np.argsort(-proba.max(axis=1), kind="stable")
    right = (proba.argmax(axis=1) == y)[order]
    n = np.arange(1, len(right) + 1)
    return n / len(right), np.cumsum(right) / n


def plot_classification(view: RunView):
    """Reliability diagram (ensemble vs best member) and accuracy against the share kept."""
    t = view.test
    if view.task != "classification" or not t or "proba" not in t:
        return None
    y = t["y"]
    fig = _figure(9.5, 4.0)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot([0, 1], [0, 1], color="#999", lw=1, ls="--", label="perfectly calibrated")
    ece = (view.summary or {}).get("ensemble", {}).get("test", {}).get("ece")
    best = (view.summary or {}).get("best_member", {})
    curves = [("ensemble", t["proba"], "#2ca02c", ece)]
    if "best_proba" in t:
        curves.append((f"best member {best.get('id', '')}", t["best_proba"], "#1f77b4",
                       best.get("test", {}).get("ece")))
    for label, proba, color, e in curves:
        rel = _reliability(proba, y)
        shown = label + (f" (ECE {e:.3f})" if e is not None else "")
        # two binomial standard errors of each bin's accuracy: a bin of 3 samples may swing by 0.5
        band = 2 * np.sqrt(np.clip(rel[:, 1] * (1 - rel[:, 1]), 0.25 / rel[:, 2], None) / rel[:, 2])
        ax1.errorbar(rel[:, 0], rel[:, 1], yerr=band, fmt="o-", color=color, capsize=2, lw=1, label=shown)
        for c, a, count in rel:              # a bin of 3 samples says little: show how many
            ax1.annotate(f"{int(count)}", (c, a), textcoords="offset points", xytext=(4, -10), fontsize=6,
                         color=color)
        share, acc = _kept_accuracy(proba, y)
        ax2.plot(share, acc, color=color, label=label)
    ax1.set(xlabel="confidence (highest class probability); bins of equal size, numbers: samples per bin",
            ylabel="accuracy in bin (± 2 binomial SE)",
            title="Reliability on the test split", xlim=(0, 1.02), ylim=(0, 1.02))
    ax2.set(xlabel="share of test samples kept (most confident first)", ylabel="accuracy of those kept",
            title="Accuracy against confidence")
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return fig


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (average ranks for ties); NaN where either side is constant (one member
    without a variance head has no spread: scipy warned on the console)."""
    from scipy.stats import spearmanr
    if np.ptp(np.asarray(a, dtype=np.float64)) == 0 or np.ptp(np.asarray(b, dtype=np.float64)) == 0:
        return float("nan")
    value = spearmanr(a, b).statistic
    return float(value) if np.isfinite(value) else float("nan")


#: the outputs of a multi-target regression the report draws, a row of panels each
PLOTTED_OUTPUTS = 4


def plot_regression(view: RunView):
    """Predicted against true with the 90% intervals, and |error| against predicted spread
    (a useful spread grows with the error: the rank correlation says how much); a row per
    output (the first ``PLOTTED_OUTPUTS`` of several targets), named by its target."""
    t = view.test
    if view.task != "regression" or not t or "mean" not in t:
        return None
    outputs = 1 if np.ndim(t["mean"]) == 1 else int(np.shape(t["mean"])[1])
    rows = min(outputs, PLOTTED_OUTPUTS)
    names = (view.meta or {}).get("target_names") or [str(j) for j in range(outputs)]
    curve = ((view.summary or {}).get("calibration") or {}).get("coverage_curve")
    fig = _figure(13.5 if curve else 9.5, 4.2 * rows)
    axes = np.atleast_2d(fig.subplots(rows, 3 if curve else 2))
    if curve:
        _coverage_curve(axes[0, 2], curve, (view.summary or {}).get("calibration", {}).get("method", "none"))
        for ax in axes[1:, 2]:
            ax.axis("off")
    r2 = (view.summary or {}).get("ensemble", {}).get("test", {}).get("r2")
    per_target = (view.summary or {}).get("per_target") or {}
    for j in range(rows):
        def column(a, j=j) -> np.ndarray:
            a = np.asarray(a, dtype=float)
            return a if a.ndim == 1 else a[:, j]
        y, mean, std = column(t["y"]), column(t["mean"]), column(t["std"])
        lower = column(t["lower_90"]) if "lower_90" in t else mean - 1.645 * std
        upper = column(t["upper_90"]) if "upper_90" in t else mean + 1.645 * std
        own_r2 = (per_target.get(names[j]) or {}).get("r2") if outputs > 1 else r2
        _predicted_against_true(axes[j, 0], y, mean, lower, upper, own_r2,
                                f"target {names[j]}: " if outputs > 1 else "")
        _error_against_spread(axes[j, 1], y, mean, std)
    if outputs > rows:
        fig.suptitle(f"the first {rows} of {outputs} targets", fontsize=8)
    return fig


def _predicted_against_true(ax, y, mean, lower, upper, r2, prefix: str) -> None:
    inside = (y >= lower) & (y <= upper)
    ax.errorbar(y, mean, yerr=[mean - lower, upper - mean], fmt="none", ecolor="#bbb", lw=0.8, zorder=1)
    ax.scatter(y[inside], mean[inside], s=10, color="#1f77b4", label="true value inside the 90% interval",
               zorder=2)
    ax.scatter(y[~inside], mean[~inside], s=12, color="#d62728", label="outside", zorder=2)
    lo, hi = float(min(y.min(), mean.min())), float(max(y.max(), mean.max()))
    ax.plot([lo, hi], [lo, hi], color="#999", ls="--", lw=1)
    ax.set(xlabel="true", ylabel="ensemble mean (90% interval)",
           title=f"{prefix}Predicted against true: {inside.mean():.0%} inside the 90% intervals"
                 + (f"\nR² {r2:.3f}" if r2 is not None else ""))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _error_against_spread(ax, y, mean, std) -> None:
    err = np.abs(y - mean)
    rho = spearman(std, err)
    ax.scatter(std, err, s=10, color="#1f77b4", alpha=0.7, label="test sample")
    order = np.argsort(std)
    chunks = np.array_split(order, min(10, max(1, len(order) // 10)))
    ax.plot([std[c].mean() for c in chunks], [err[c].mean() for c in chunks], "o-", color="#ff7f0e",
            label="mean |error| per spread decile")
    grid = np.linspace(0, float(std.max()) * 1.05, 50)
    ax.plot(grid, grid * math.sqrt(2 / math.pi), color="#999", ls="--", lw=1,
            label="expected if Gaussian and calibrated")
    ax.set(xlabel="predicted standard deviation", ylabel="|error|",
           title=f"Error against predicted spread\nSpearman rank correlation {rho:.2f}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _coverage_curve(ax, curve: dict, method: str) -> None:
    """Nominal against observed coverage of the recalibrated intervals on the test split, with
    the band two binomial standard errors wide that a calibrated ensemble stays inside."""
    levels = np.array([int(k) / 100 for k in curve["levels"]])
    n = curve["rows"]["test"]
    band = 2 * np.sqrt(levels * (1 - levels) / n)
    ax.fill_between(levels, levels - band, levels + band, color="#ddd", label=f"± 2 binomial SE ({n} test rows)")
    ax.plot([0, 1], [0, 1], color="#999", ls="--", lw=1)
    ax.plot(levels, curve["test"], "o-", color="#2ca02c", ms=4, label=f"test ({method} intervals)")
    ax.plot(levels, curve["val"], ".:", color="#1f77b4", lw=1, label="validation (where they were fitted)")
    ax.set(xlabel="nominal coverage of the central interval", ylabel="observed coverage",
           title="Coverage curve", xlim=(0, 1), ylim=(0, 1.02))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _t0(view: RunView) -> float:
    """When the run's first job started (its processes, before imports and the data broadcast)."""
    opens = [e.data.get("job_started", e.time) for e in view.events if e.kind is EventKind.OPEN]
    times = [r.started for r in view.records if r.started is not None]
    return min(opens + times) if opens or times else 0.0


def _legend(axes) -> None:
    """A legend on the first panel that has labelled points (none may: every panel can be one
    architecture's column, and an empty legend() warns on the run's console)."""
    labelled = [ax for ax in axes if ax.get_legend_handles_labels()[0]]
    if labelled:
        labelled[0].legend(fontsize=7)


def plot_search(view: RunView):
    """Every finished evaluation's validation metric and the best so far, against evaluations
    and against wall time since the run began; candidates discarded early (a low-fidelity
    value, not a result) and failures at the bottom, as ticks and crosses."""
    metric = view.metric
    if not any(SEARCH in r.extra for r in view.records) or not metric:      # a search's candidates
        return None
    evaluated = sorted(view.final, key=lambda r: r.received or 0.0)
    t0 = _t0(view)
    higher = higher_is_better(metric)
    values = np.array([r.val.get(metric, np.nan) if r.status.ranked else np.nan for r in evaluated])
    discarded = np.array([r.status is Status.DISCARDED for r in evaluated])
    wall = np.array([(r.received if r.received is not None else t0) - t0 for r in evaluated])
    best = (np.fmax if higher else np.fmin).accumulate(np.where(np.isnan(values), -np.inf if higher else np.inf,
                                                                values))
    best = np.where(np.isfinite(best), best, np.nan)
    n = np.arange(1, len(evaluated) + 1)
    fig = _figure(9.5, 4.0)
    axes = fig.subplots(1, 2, sharey=True)
    ok = ~np.isnan(values)
    lo, hi = (np.nanmin(values), np.nanmax(values)) if ok.any() else (0.0, 0.0)
    floor = lo - 0.05 * ((hi - lo) or 1.0)             # below every result: these are none
    for ax, x, label in ((axes[0], n, "evaluation (in the order results arrived)"),
                         (axes[1], wall, "wall time since the job began (s)")):
        ax.plot(x[ok], values[ok], "o", ms=4, color="#1f77b4", alpha=0.7, label="finished evaluation")
        ax.step(x, best, where="post", color="#2ca02c", lw=1.8, label="best so far")
        if discarded.any():
            ax.plot(x[discarded], np.full(discarded.sum(), floor), "|", ms=9, color="#7f7f7f",
                    label="discarded early")
        failed = ~ok & ~discarded
        if failed.any():
            ax.plot(x[failed], np.full(failed.sum(), floor), "x", color="#d62728", label="failed")
        ax.set(xlabel=label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"validation {metric}")
    _legend(axes)
    strategy = view.config.evolve.strategy if view.config is not None else ""
    fig.suptitle(f"Search ({strategy}): {len(evaluated)} evaluations"
                 + (f", best validation {metric} {hi if higher else lo:.4f}" if ok.any() else "")
                 + f"\n{view.counts.summary()}", fontsize=10)
    return fig


def plot_population(view: RunView):
    """mode "pbt": each member's validation metric round by round (one line per member), a
    grey arrow from the donor to the receiver at every copy; and the learning rate each
    member trained with, on a log scale."""
    rounds = [e.data for e in view.events if e.kind is EventKind.PBT_ROUND]
    if not rounds:
        return None
    by_member: dict[str, list[tuple[int, float, float | None]]] = {}
    copies = []
    for e in rounds:
        for m in e["members"]:
            value = m.get("value") if m.get("value") is not None else np.nan
            by_member.setdefault(m["id"], []).append((e["round"], value, (m.get("hparams") or {}).get("learning_rate")))
            if m.get("copied_from"):
                copies.append((e["round"], m["id"], m["copied_from"]))
    metric = rounds[0]["members"][0].get("metric", view.metric or "")
    fig = _figure(9.5, 4.0)
    axes = fig.subplots(1, 2)
    colours = {}
    for member, points in sorted(by_member.items()):
        r, v, lr = (np.array([p[i] for p in points], dtype=float) for i in range(3))
        line, = axes[0].plot(r, v, "-o", ms=3, lw=1.2, alpha=0.85)
        colours[member] = line.get_color()
        axes[1].step(r, lr, where="post", color=line.get_color(), lw=1.2, alpha=0.85)
    values = {(r, m): v for m, pts in by_member.items() for r, v, _ in pts}
    for r, receiver, donor in copies:
        start, end = values.get((r, donor)), values.get((r + 1, receiver))
        if start is not None and end is not None and np.isfinite(start) and np.isfinite(end):
            axes[0].annotate("", xy=(r + 1, end), xytext=(r, start),
                             arrowprops={"arrowstyle": "->", "color": "#777777", "lw": 0.8, "alpha": 0.6})
    axes[0].set(xlabel="round", ylabel=f"validation {metric}")
    axes[1].set(xlabel="round", ylabel="learning rate", yscale="log")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"Population: {len(by_member)} members, {len(rounds)} rounds, {len(copies)} copies "
                 "(arrows: a member copying another's weights)")
    return fig


def pareto_front(cost: np.ndarray, value: np.ndarray, higher: bool) -> np.ndarray:
    """Indices of the points no other point beats on both (lower cost, better value), by cost."""
    order = np.lexsort((-value if higher else value, cost))
    front, best = [], None
    for i in order:
        v = value[i]
        if best is None or (v > best if higher else v < best):
            front.append(i)
            best = v
    return np.array(front, dtype=int)


def _cost(r: MemberRecord, key: str) -> float | None:
    """A member's cost by name: its parameters, training seconds, or another recorded number."""
    return {"params": r.params, "train_seconds": r.train_seconds}.get(key, r.extra.get(key))


def plot_costs(view: RunView):
    """Parameter count and training time (or inference time per sample, the second objective
    of a multi-objective search) against the validation metric, each with its Pareto front."""
    metric, ranked = view.metric, view.finished
    ranked = [r for r in ranked if metric and metric in r.val]
    if len(ranked) < 2:
        return None
    higher = higher_is_better(metric)
    value = np.array([r.val[metric] for r in ranked])
    second = view.config.evolve.settings.get("objectives") if view.config is not None else None
    costs = [("params", "parameters", True)]
    costs.append(("predict_seconds_per_sample", "inference seconds per sample", True) if second == "metric_time"
                 else ("train_seconds", "training seconds", False))
    fig = _figure(9.5, 4.0)
    axes = fig.subplots(1, 2, sharey=True)
    chosen = view.selected
    for ax, (key, label, log) in zip(axes, costs):
        cost = np.array([float(_cost(r, key) or np.nan) for r in ranked])
        good = np.isfinite(cost) & (cost > 0 if log else np.isfinite(cost))
        if not good.any():
            ax.set_title(f"no {label} recorded")
            continue
        c, v = cost[good], value[good]
        if np.unique(c).size == 1:                 # one architecture: a column of points says nothing
            ax.set_title(f"every member: {c[0]:,.4g} {label}", fontsize=9)
            ax.set_xticks([])
            ax.grid(alpha=0.3)
            continue
        ax.scatter(c, v, s=14, color="#1f77b4", alpha=0.7, label="member")
        front = pareto_front(c, v, higher)
        ax.step(c[front], v[front], where="post", color="#d62728", lw=1.2, label="Pareto front")
        picked = [i for i, r in enumerate(r for r, g in zip(ranked, good) if g) if r.id in chosen]
        if picked:
            ax.plot(c[picked], v[picked], "*", ms=12, color="#2ca02c", label="selected")
        if log:
            ax.set_xscale("log")
        ax.set(xlabel=label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"validation {metric}")
    _legend(axes)
    fig.suptitle("Cost against the metric" + (" (the search's two objectives: left and right)"
                                               if second else ""), fontsize=10)
    return fig


def plot_timeline(view: RunView):
    """One lane per rank, one bar per training from its start to its end (blue: finished;
    light blue: discarded early; red: failed, stopped or at its time limit), each worker's
    start-up before its first member (grey: Python, MPI, data; orange: TensorFlow and the
    first build); the gaps are the idle time. Utilisation (``results.timeline``) in the title."""
    timed = [r for r in view.records if r.started is not None and r.ended is not None]
    if not timed:
        return None
    t0 = _t0(view)
    ranks = sorted({int(r.rank or 0) for r in timed})
    lanes = {rank: i for i, rank in enumerate(ranks[:MAX_LANES])}
    fig = _figure(9.5, max(2.5, min(9.0, 0.28 * len(lanes) + 1.6)))
    ax = fig.subplots()
    per_lane: dict[tuple[str, int], list] = {}
    for r in timed:
        lane = lanes.get(int(r.rank or 0))
        color = "#1f77b4" if r.status.ranked else "#9ecae1" if r.status.evaluated else "#d62728"
        if lane is not None:
            per_lane.setdefault((color, lane), []).append((r.started - t0, max(r.ended - r.started, 1e-3)))
    for r in timed:                       # each worker's own start-up, from its first result's stamps
        lane, st = lanes.get(int(r.rank or 0)), r.extra.get("startup")
        if lane is None or not isinstance(st, dict):
            continue
        begin = st.get("process") if st.get("process") is not None else st.get("main")
        ready = st.get("data")                        # then TensorFlow's import and set-up, the first build
        if begin is not None and ready is not None:
            ax.broken_barh([(begin - t0, max(ready - begin, 1e-3))], (lane - 0.25, 0.5), facecolors="#bdbdbd",
                           edgecolors="none")
            ax.broken_barh([(ready - t0, max(r.started - ready, 1e-3))], (lane - 0.25, 0.5), facecolors="#fdae6b",
                           edgecolors="none")
    for (color, lane), bars in per_lane.items():
        # a white edge between bars: members back to back on one rank stay apart
        ax.broken_barh(bars, (lane - 0.4, 0.8), facecolors=color, edgecolors="white", linewidth=0.6)
    for e in view.events:                 # each job's start-up: imports, data broadcast, until the open
        if e.kind is EventKind.OPEN:
            start = e.data.get("job_started", e.time) - t0
            ax.axvspan(start, e.time - t0, color="#ddd", zorder=0)
            ax.axvline(start, color="#999", ls="--", lw=1)
    ax.set_yticks(range(len(lanes)), [f"rank {r}" for r in lanes], fontsize=7 if len(lanes) < 24 else 5)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the job began; grey band: the master's start-up; per rank: grey, Python, MPI "
                  "and data;\norange, TensorFlow and the first build; blue, a member training; light blue, "
                  "discarded early; red, failed; white, idle", fontsize=8)
    stats = (view.summary or {}).get("run") or run_stats(view.records, view.events)
    util = stats.get("utilisation")
    more = f", first {len(lanes)} of {len(ranks)} ranks shown" if len(ranks) > len(lanes) else ""
    ax.set_title(f"Timeline: {len(timed)} trainings on {len(ranks)} ranks"
                 + (f", utilisation {util:.1%}" if util is not None else "") + more)
    ax.grid(alpha=0.3, axis="x")
    return fig


PLOTS = {
    "leaderboard": plot_leaderboard,
    "classification": plot_classification,
    "regression": plot_regression,
    "search": plot_search,
    "population": plot_population,
    "costs": plot_costs,
    "timeline": plot_timeline,
}


# -- the page ---------------------------------------------------------------------------
def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return metric_text(v) if math.isfinite(v) else str(v)
        return html.escape("" if v is None else str(v))
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


#: under the validation table: why its figures flatter every row of it
VALIDATION_CAVEAT = ("The validation rows chose the best member and the ensemble's weights, stopped the members' "
                     "training early and fitted the ensemble's calibration: their figures are optimistic, most for "
                     "the ensemble; the test split's are the honest ones.")


def _answer(view: RunView) -> str:
    """Ensemble, best member and linear baseline side by side, on test and validation."""
    s = view.summary
    if view.damaged:
        return f"<p><b>{html.escape(view.damaged)}</b></p>"
    if not s or "ensemble" not in s:
        return "<p>No ensemble yet: the run has not finished (or saved no predictions).</p>"
    rows_in = [(f"ensemble ({len(s['members'])} member{'s' * (len(s['members']) != 1)})", s["ensemble"]),
               (f"best member {s['best_member']['id']}", s["best_member"])]
    base = s.get("baseline") or {}
    if "test" in base:
        rows_in.append((f"baseline: {base['model']} (same rows)", base))
    keys = list(s["ensemble"]["test"])
    out = []
    for split in ("test", "val"):
        rows = [[name, *(part.get(split, {}).get(k, "") for k in keys)] for name, part in rows_in]
        out.append(f"<h3>{'Test' if split == 'test' else 'Validation'} split</h3>" + _table([""] + keys, rows))
    per_target = s.get("per_target") or {}
    if per_target:                              # several regression targets: each in its own units
        columns = list(dict.fromkeys(k for values in per_target.values() for k in values))
        out.append("<h3>Each target (test split, its own units)</h3>"
                   + _table(["target"] + columns, [[name, *(values.get(k, "") for k in columns)]
                                                   for name, values in per_target.items()]))
    out.append(f"<p>{html.escape(VALIDATION_CAVEAT)}</p>")
    if base.get("skipped"):
        out.append(f"<p>Linear baseline skipped: {html.escape(base['skipped'])}</p>")
    return "".join(out)


def _notes(view: RunView) -> str:
    s = view.summary or {}
    items = []
    selection = selection_text(s)
    if selection:
        items.append(f"Selection: {html.escape(selection)}")
    note = epochs_note(s)
    if note:
        items.append(html.escape(note[0].upper() + note[1:]))
    cal = s.get("calibration")
    if cal:
        promise = calibration_lines(cal, ((view.meta or {}).get("sizes") or {}).get("val"))   # as the console says
        items.append(f"Calibration: {cal.get('method', 'none')}"
                     + (f", temperature {cal['temperature']:.3f}" if "temperature" in cal else "")
                     + (f": {html.escape(' '.join(promise))}" if promise else
                        f" ({html.escape(cal['why'])})" if cal.get("why") else ""))
    base = s.get("baseline") or {}
    ens = s.get("ensemble", {}).get("test", {})
    judged = baseline_judged(s) if "ensemble" in s else []
    if judged:                                  # as the console judges (``summary.baseline_beats``)
        beaten = baseline_beats(s)
        shown = beaten or judged
        ahead = all(ens[m] > base["test"][m] if higher_is_better(m) else ens[m] < base["test"][m] for m in judged)
        verdict = ("The linear baseline beats the ensemble" if beaten else
                   "The ensemble beats the linear baseline" if ahead else
                   "The ensemble is at least as good as the linear baseline")
        items.append(f"<b>{verdict}</b> on test " + "; ".join(
            f"{m}: ensemble {metric_text(ens[m])}, baseline {metric_text(base['test'][m])}" for m in shown)
            + f" ({html.escape(str(base['model']))}, fitted on {base.get('train_rows', '?')} training rows)")
    major = majority_warning(s) if "ensemble" in s else None
    if major:
        items.append(f"<b>Warning:</b> {html.escape(major)}")
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else ""


#: networks the report lists by name (the best on validation, and every ensemble member)
LISTED = 10


def _networks(view: RunView) -> str:
    """The networks as text: a search's first-population best against its best, then the
    best networks on validation and the ensemble's members with their weights and each
    one's architecture in the genome notation (docs/search.md), which the plots do not show."""
    metric = view.metric
    ranked = [r for r in view.ranked() if r.status.ranked and metric and r.val.get(metric) is not None]
    if not ranked:                              # as the leaderboard ranks them: ties by the proper score
        return ""
    weights = {m["id"]: float(m.get("weight", 0.0)) for m in (view.summary or {}).get("members", [])}
    shown = ranked[:LISTED] + [r for r in ranked[LISTED:] if r.id in weights]
    out = ["<h2>Networks</h2>"]
    search = (view.summary or {}).get("search") or {}
    if search.get("initial_best") and search.get("search_best"):
        a, b = search["initial_best"], search["search_best"]
        out.append(f"<p>The search ({search.get('evaluations', '?')} evaluations, a first population of "
                   f"{search.get('initial_population', '?')}): the best of its first population, "
                   f"<b>{html.escape(a['id'])}</b>, scored validation {html.escape(metric)} {metric_text(a['val'])}; "
                   f"its best, <b>{html.escape(b['id'])}</b>, {metric_text(b['val'])} (test {metric_text(b['test'])})"
                   f": <code>{html.escape(str(b.get('genome', '')))}</code>.</p>")
    rows = "".join(
        f"<tr><td>{html.escape(r.id)}</td><td>{metric_text(r.val[metric])}</td>"
        f"<td>{metric_text(r.test[metric]) if r.test.get(metric) is not None else ''}</td>"
        f"<td>{f'{weights[r.id]:.3f}' if r.id in weights else ''}</td>"
        f"<td style='text-align:left'><code>{html.escape(r.summary or r.arch or '')}</code></td></tr>" for r in shown)
    out.append(f"<p>The {min(LISTED, len(ranked))} best on validation {html.escape(metric)}"
               + (" and every ensemble member" if len(shown) > min(LISTED, len(ranked)) else "")
               + f" (of {len(ranked)}); weight: the member's in the ensemble.</p>"
               f"<table><tr><th>id</th><th>val {html.escape(metric)}</th><th>test {html.escape(metric)}</th>"
               f"<th>weight</th><th>network</th></tr>{rows}</table>")
    return "\n".join(out)


def _failures(view: RunView) -> str:
    failed = view.failed
    if not failed:
        return "<p>No member failed.</p>"
    rows = [[r.id, r.status.label, r.error_kind, "" if r.rank is None else r.rank, r.error_message]
            for r in failed[:200]]
    more = f"<p>The first 200 of {len(failed)} are listed; the journal has all.</p>" if len(failed) > 200 else ""
    return _table(["member", "status", "kind", "rank", "error"], rows) + more


def _how(view: RunView) -> str:
    opens = [e.data for e in view.events if e.kind is EventKind.OPEN]
    rows = []
    for n, e in enumerate(opens, 1):
        env = e.get("environment", {})
        rows.append([n, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"])), e.get("ranks"),
                     e.get("workers"), e.get("group_size"), e.get("host"), " ".join(env.get("argv", [])) or "?"])
    out = [_table(["job", "started", "ranks", "workers", "group size", "master host", "command line"], rows)]
    env = opens[-1].get("environment", {}) if opens else {}
    versions = env.get("versions") or {}
    if versions:
        out.append(_table(["component", "version"], [[k, v] for k, v in versions.items()]))
    else:
        out.append("<p>The journal records no versions (a run written before they were recorded).</p>")
    stats = (view.summary or {}).get("run") or run_stats(view.records, view.events)
    if stats:
        out.append(_table(["run figure", "value"], _flat(stats)))
    return "".join(out)


def _flat(table: dict, prefix: str = "") -> list[list]:
    """Rows (name, value) of a nested dict, nested keys joined by dots (no raw JSON in a cell)."""
    rows: list[list] = []
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows.extend(_flat(value, name + "."))
        elif isinstance(value, (list, tuple)):
            rows.append([name, ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value)])
        else:
            rows.append([name, value])
    return rows


STYLE = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1000px;
margin:2em auto;padding:0 1em;color:#222}h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;
padding-bottom:.2em;margin-top:1.6em}h3{font-size:1em}table{border-collapse:collapse;margin:.6em 0;font-size:.85em}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee}pre{background:#f6f6f6;padding:.8em;overflow:auto;font-size:.8em}
.err{color:#b00}"""


def _state(view: RunView) -> str:
    """The run's state as ``ensemble.status`` says it (done, stopped early and why, failed and
    the error, members never trained and what trains them), from its status.json, escaped,
    ending a sentence."""
    beat = read_heartbeat(view.path) or {}
    total = beat.get("total")
    s = {**beat, "run_dir": str(view.path), "total": total, "time_limit": None,     # its seconds, not its name
         "state": beat.get("state") or ("done" if view.summary else "unknown"),
         "left": None if total is None else max(0, int(total) - view.counts.ended)}
    head, note = state_words(s)
    said = "; ".join(x for x in (note, *untrained_lines(s, beat.get("members_end_apart"))) if x)
    return f"<b class='state'>{html.escape(head)}</b>" + (f": {html.escape(said)}." if said else ".")


def render(view: RunView, images: dict[str, bytes | str]) -> str:
    """The HTML page: ``images`` maps each plot's name to its PNG bytes or an error text."""
    name = view.config.name if view.config is not None else view.path.name
    mode = view.mode or "unknown"
    sizes = view.meta.get("sizes", {})
    state = _state(view)
    counts = view.counts
    handed = f" of {counts.issued} handed out" if counts.issued > counts.ended else ""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(name)}: run report</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>Run report: {html.escape(name)}</h1>",
             f"<p class='counts' data-counts='{html.escape(json.dumps(counts.as_dict()))}'>"
             f"{html.escape(str(view.task))} ({html.escape(mode)} mode); members: {counts.summary()}{handed}; "
             f"split sizes {html.escape(json.dumps(sizes))}; run {state} "
             f"Written {time.strftime('%Y-%m-%d %H:%M:%S')} from <code>{html.escape(str(view.path))}</code>.</p>",
             "<h2>The answer</h2>", _answer(view), _notes(view)]
    titles = {"leaderboard": "Leaderboard", "classification": "Uncertainty: calibration and confidence",
              "regression": "Uncertainty: intervals and spread", "search": "Search progress",
              "population": "Population-based training: metric and learning rate by round",
              "costs": "Cost against the metric", "timeline": "Timeline: who trained what, when"}
    for key, img in images.items():
        parts.append(f"<h2>{titles[key]}</h2>")
        if isinstance(img, bytes):
            parts.append(f"<img alt='{key}' src='data:image/png;base64,{base64.b64encode(img).decode()}'>")
        else:
            parts.append(f"<p class='err'>This plot could not be drawn: {html.escape(img)}</p>")
    parts += [_networks(view), "<h2>Failures</h2>", _failures(view), "<h2>How the run was made</h2>", _how(view),
              "<h2>Config</h2>", f"<pre>{html.escape(view.config_text)}</pre>", "</body></html>"]
    return "\n".join(parts)


def write_report(run_dir: str | Path) -> Path:
    """Write ``RUN_DIR/report.html`` and ``RUN_DIR/report/<plot>.png``; return the HTML's path.
    A plot that fails is reported on the page; only an unreadable run directory raises."""
    from ensemble.results.rundir import atomic_write
    view = read_view(run_dir)
    folder = view.path / FOLDER
    folder.mkdir(exist_ok=True)
    images: dict[str, bytes | str] = {}
    from matplotlib import rc_context
    for key, draw in PLOTS.items():
        try:
            with rc_context({"axes.titlesize": 9}):    # two panels' titles side by side must not overlap
                fig = draw(view)
                if fig is None:
                    continue
                images[key] = _png(fig)
            atomic_write(folder / f"{key}.png", lambda tmp, data=images[key]: tmp.write_bytes(data))
        except Exception as exc:            # noqa: BLE001 - one bad plot must not cost the report
            images[key] = f"{type(exc).__name__}: {exc}"
    out = view.path / REPORT
    page = render(view, images)
    atomic_write(out, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    return out


def report_line(run_dir: str | Path) -> str:
    """Write the report and say where; never raises (the end of a run or a re-selection
    must not fail over a plot): on any error, the line says what went wrong instead."""
    try:
        return f"report: {write_report(run_dir)}"
    except Exception as exc:                # noqa: BLE001 - see the docstring
        return (f"report: not written ({type(exc).__name__}: {exc}); try again with "
                f"`python -m ensemble.report {run_dir}`")
