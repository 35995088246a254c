"""End of a run: leaderboard, ensemble selection and averaging, ensemble.json, console table.

Works from the members' records (``MemberRecord``; a plain journal line is read as one)
and the candidates' predictions in the packed store, so it needs no TensorFlow; its cost
depends on ``ensemble.candidates``, not on how many members were trained. Every count it
writes (``ensemble.json``'s ``counts``, the leaderboard's ``status`` column) comes from
``Status`` and ``Counts``, as ``ensemble.status`` and the report do.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ensemble.config import EnsembleConfig, RunConfig
from ensemble.config.vocabulary import PROPER_SCORES, proper_score
from ensemble.results.artifacts import Artifacts
from ensemble.results.records import Counts, MemberRecord, Status, as_records, latest
from ensemble.results.rundir import RunDirectory
from ensemble.results.selection import choose_ensemble, rank_members
from ensemble.task import get_task
from ensemble.task.calibration import apply as apply_calibration
from ensemble.task.calibration import coverage_curve, coverage_spread, holdout_rows, rows_of
from ensemble.task.calibration import fit as fit_calibration
from ensemble.task.metrics import (
    COVERAGE_LEVELS,
    CURVE_LEVELS,
    METRICS,
    coverage_name,
    higher_is_better,
    level_key,
    metric_task,
    metric_text,
)

Records = Iterable[MemberRecord | Mapping[str, Any]]

log = logging.getLogger(__name__)


def finished_records(records: Records) -> list[MemberRecord]:
    """Each member that finished (``Status.OK``), by its final record (``latest``: a resumed
    run may hold earlier failures): the members that are ranked and may be selected. A
    candidate the search discarded early (``evolve.discard``) is trained only part of the way
    and is not one of them."""
    return [r for r in latest(as_records(records)).values() if r.status.ranked]


def discarded_records(records: Records) -> list[MemberRecord]:
    """The search's candidates stopped early (``Status.DISCARDED``), final record of each."""
    return [r for r in latest(as_records(records)).values() if r.status is Status.DISCARDED]


def metric_order(values: Mapping[str, Any]) -> list[str]:
    """The metric names of ``values`` in the vocabulary's order (then by name): a record read back from
    the journal holds them in another order than a fresh one, and a leaderboard's columns moved."""
    known = {name: i for i, name in enumerate(METRICS)}
    return sorted(values, key=lambda k: (known.get(k, len(known)), k))


def leaderboard(records: Records, metric: str) -> pd.DataFrame:
    """One row per member, by its final record: finished members ranked by the validation
    metric, then the discarded candidates, then those that failed, were stopped or hit
    their time limit. ``status`` is the ``Status`` value, as ``ensemble.json``'s counts name it."""
    final = latest(as_records(records))
    rows = []
    ranked = rank_members([r for r in final.values() if r.status.ranked], metric, PROPER_SCORES[metric_task(metric)])
    for pos, r in enumerate(ranked, 1):
        row = {"rank": pos, "id": r.id, "arch": r.arch, "status": r.status.value}
        row.update({f"val_{k}": r.val[k] for k in metric_order(r.val)})       # one order, resumed or not
        row.update({f"test_{k}": r.test[k] for k in metric_order(r.test)})
        row.update(params=r.params, epochs=r.epochs, stopped=r.extra.get("stopped"), train_seconds=r.train_seconds,
                   seed=r.seed, mpi_rank=r.rank)
        if r.summary:
            row["genome"] = r.summary
        rows.append(row)
    for r in final.values():
        if r.status is Status.DISCARDED:
            rows.append({"rank": None, "id": r.id, "arch": r.arch, "status": r.status.value,
                         **{f"val_{k}": v for k, v in r.val.items()}, "epochs": r.epochs,
                         "discarded_at_epoch": (r.discarded or {}).get("epoch"), "genome": r.summary})
    for r in final.values():
        if not r.status.evaluated:
            rows.append({"rank": None, "id": r.id, "arch": r.arch, "status": r.status.value,
                         "error_kind": r.error_kind, "error": r.error_message})
    return pd.DataFrame(rows)


#: leaderboard columns of whole numbers (pandas writes them as floats, 2410.0, once a row lacks them)
#: the most frequent class's test accuracy (its share of the test rows) from which the console
#: calls the classes imbalanced, when the ensemble does no better than answering that class
IMBALANCED_SHARE = 0.5
INTEGER_COLUMNS = ("rank", "params", "epochs", "seed", "mpi_rank", "discarded_at_epoch")


def leaderboard_csv(board: pd.DataFrame) -> str:
    """The leaderboard as leaderboard.csv holds it: whole numbers whole beside the empty cells
    of the rows that have none."""
    board = board.copy()
    for column in INTEGER_COLUMNS:
        if column in board:
            board[column] = board[column].astype("Int64")
    return board.to_csv(index=False)


def selection_metric(settings: EnsembleConfig, task: str, gaussian: bool) -> str:
    """The score selection minimises: ``ensemble.selection_metric``, or with "auto" the
    task's proper scoring rule (log loss; Gaussian NLL when the candidates predict a
    variance, else MSE)."""
    setting = settings.selection_metric
    if setting == "nll" and not gaussian:
        raise RuntimeError("`ensemble.selection_metric = \"nll\"` needs every candidate to predict a variance, "
                           "but some do not; set it to \"auto\" or \"mse\"")
    return proper_score(task, gaussian) if setting == "auto" else setting


def _selection_table(ids: list, choice: dict) -> dict:
    """What ensemble.json says about the selection."""
    return {"method": choice["method"], "k": choice["k"], "metric": choice["metric"],
            "val_score": choice["val_score"], "best_member": choice["best_member"],
            "effective_size": round(choice["effective_size"], 3), "picks": len(ids), "cv": choice["cv"],
            "why": choice["why"], "single_member": choice["single_member"]}


def score_weights(task: Any, weights: Mapping[Any, float], arrays: Mapping[Any, Mapping[str, np.ndarray]],
                  targets: Mapping[str, np.ndarray], calibration_setting: str, seed: int,
                  gaussian: bool, holdout: float = 0.0) -> dict:
    """The ensemble of ``weights`` over members' stored predictions (``arrays[id]``: "val_pred",
    "test_pred" and, for Gaussian members, "val_var", "test_var"), recalibrated on the
    validation split as ``ensemble.calibration`` says (on the rows ``data.calibration_holdout``
    kept from early stopping, ``holdout``: its share), scored on each split of ``targets``
    ({"val": y, "test": y}). Returns {"stats": split -> per-sample statistics, "metrics":
    split -> metrics, "calibration": the fitted calibration or None, "before": split ->
    metrics of the uncalibrated ensemble, "curve": a regression ensemble's coverage curve
    ({"levels": ["10", ...], "rows": split -> rows, split -> observed coverage per level},
    else None)}. Pure numpy: the run and the panel benchmark
    (``scripts/bench_ensembles.py``) score an ensemble the same way."""
    ids = list(weights)
    w = np.array([weights[i] for i in ids], dtype=np.float64)
    raw = {s: task.combine_outputs([(arrays[i][f"{s}_pred"], arrays[i].get(f"{s}_var")) for i in ids], w)
           for s in targets}
    n_val = len(targets["val"])
    rows = holdout_rows(n_val, holdout)[1]
    held_out = len(rows) < n_val                # kept from early stopping (``data.calibration_holdout``)
    calibration = fit_calibration(task.name, np.asarray(targets["val"])[rows], rows_of(raw["val"], rows, n_val),
                                  calibration_setting, seed, held_out=held_out,
                                  none_kept=None if holdout else "`data.calibration_holdout` is 0: none kept aside")
    if calibration is not None:
        calibration.update(rows=len(rows), held_out=held_out)
    stats = {s: apply_calibration(task.name, raw[s], calibration) for s in raw}
    metrics = {s: task.ensemble_metrics(targets[s], stats[s], gaussian) for s in stats}
    curve = None
    if task.name == "regression" and coverage_name(COVERAGE_LEVELS[0]) in metrics["val"]:
        curve = {"levels": [level_key(lv) for lv in CURVE_LEVELS], "rows": {s: len(targets[s]) for s in raw},
                 **{s: list(coverage_curve(targets[s], raw[s], calibration).values()) for s in raw}}
    return {"stats": stats, "calibration": calibration, "metrics": metrics, "curve": curve,
            "before": {s: task.ensemble_metrics(targets[s], apply_calibration(task.name, raw[s], None), gaussian)
                       for s in raw}}


def _settings(cfg: RunConfig, ens: EnsembleConfig | Mapping[str, Any] | None) -> EnsembleConfig:
    """``cfg.ensemble`` with ``ens`` instead (a whole section, or the settings it changes)."""
    if ens is None or isinstance(ens, EnsembleConfig):
        return ens or cfg.ensemble
    return cfg.ensemble.replace(**{k: v for k, v in ens.items() if v is not None})


def counts_of(records: Records, issued: int | None = None) -> Counts:
    """The run's counts, as ``ensemble.json`` writes them (``counts``)."""
    return Counts.of_records(as_records(records), issued=issued)


def _count_fields(counts: Counts) -> dict:
    """``counts`` (one key per ``Status`` value, ``ended``, ``issued``), and the older keys,
    derived from it: ``n_finished`` (ok), ``n_failed`` (ended without a result: failed,
    stopped or at their time limit), ``n_discarded``."""
    return {"counts": counts.as_dict(), "n_finished": counts.ok, "n_failed": counts.not_ok,
            "n_discarded": counts.discarded}


def build_ensemble(run_dir: RunDirectory, records: Records, cfg: RunConfig, meta: dict,
                   y_val: np.ndarray, y_test: np.ndarray, artifacts: Artifacts,
                   ens: EnsembleConfig | Mapping[str, Any] | None = None, pool: list[str] | None = None,
                   issued: int | None = None) -> dict:
    """Select members among the kept candidates on their validation predictions (a proper
    score by default, see ``selection.choose_ensemble``), average them, recalibrate the
    uncertainty on validation (``task.calibration``), score on the test split. Reads at
    most ``ensemble.candidates`` members' arrays, however many were trained. ``ens``
    overrides ``cfg.ensemble`` (a section, or the settings it changes) and ``pool`` the
    candidates (re-selection of a finished run); ``issued``: members handed out (``counts``)."""
    settings = _settings(cfg, ens)
    records = as_records(records)
    task = get_task(meta["task"])
    metric = task.default_metric(settings.metric)
    finished = finished_records(records)
    counts = counts_of(records, issued)
    if not finished:
        raise RuntimeError(f"no member finished ({counts.summary()}); see "
                           f"{run_dir / run_dir.JOURNAL} for each failure")
    by_id = {r.id: r for r in finished}
    tie = PROPER_SCORES[task.name]
    best = rank_members(finished, metric, tie)[0]
    pool = artifacts.pool() if pool is None else pool
    if not pool:
        raise RuntimeError(f"none of the {len(finished)} finished members has stored predictions to select "
                           f"from (see {run_dir / run_dir.STORE}); resume the run to train them again")
    arrays = {i: artifacts.load(i) for i in pool}
    val_preds = {i: arrays[i]["val_pred"] for i in pool}
    val_vars = {i: arrays[i].get("val_var") for i in pool}
    gaussian = all(v is not None for v in val_vars.values())
    choice = choose_ensemble(val_preds, y_val, selection_metric(settings, task.name, gaussian),
                             method=settings.method, rank_metric=metric, k=settings.k,
                             val_vars=val_vars if gaussian else None, seed=cfg.seed)
    weights = choice["weights"]
    ids = list(weights)
    members = []
    for i in ids:
        entry = {"id": i, "weight": float(weights[i])}
        if by_id[i].has_model:
            entry["model"] = run_dir.model_ref(i)
            if by_id[i].model_file is not None:                          # checked again by predict
                entry["model_file"] = by_id[i].model_file
        if by_id[i].extra.get("scaling"):
            entry.update(by_id[i].extra["scaling"])
        members.append(entry)
    out = {"task": task.name, "metric": metric, "method": choice["method"], "members": members,
           **_count_fields(counts), "n_candidates": len(pool), "selection": _selection_table(ids, choice)}
    scored = score_weights(task, weights, arrays, {"val": y_val, "test": y_test}, settings.calibration,
                           cfg.seed, gaussian, meta.get("calibration_holdout", 0.0))
    stats, calibration = scored["stats"], scored["calibration"]
    out["ensemble"] = scored["metrics"]
    out["calibration"] = {"method": "none"} if calibration is None else dict(calibration)
    out["calibration"]["before"] = scored["before"]
    if scored["curve"] is not None:
        out["calibration"]["coverage_curve"] = scored["curve"]
    out["best_member"] = {"id": best.id, "val": dict(best.val), "test": dict(best.test)}
    if task.name == "classification" and np.ndim(y_val) == 1 and len(y_val) and len(y_test):
        common = int(np.bincount(np.asarray(y_val, dtype=np.int64)).argmax())    # chosen without the test rows
        names = meta.get("class_names") or []
        out["majority"] = {"class": str(names[common]) if common < len(names) else str(common),
                           "test_accuracy": float(np.mean(np.asarray(y_test) == common))}
    ran_out = [r for r in finished if r.extra.get("stopped") == "epochs"]
    if ran_out and len(ran_out) == len(finished) and cfg.runtime.trainer != "rehearsal" and cfg.train.patience:
        out["epochs_spent"] = {"members": len(ran_out), "epochs": max(r.epochs or 0 for r in ran_out),
                               "patience": cfg.train.patience}
    per_target = per_target_metrics(meta, stats["test"], y_test) if task.name == "regression" else None
    if per_target:
        out["per_target"] = per_target
    per_sample = task.per_sample(stats["test"])
    if best.id in arrays:                 # the report sets the ensemble's reliability beside its own
        alone = task.combine_outputs([(arrays[best.id]["test_pred"], arrays[best.id].get("test_var"))],
                                     np.ones(1))
        per_sample.update({f"best_{k}": v for k, v in task.per_sample(alone).items()})
    run_dir.write_npz(run_dir.TEST_PREDICTIONS, y=y_test, **per_sample)
    return out


def per_target_metrics(meta: dict, stats: dict, y: np.ndarray) -> dict[str, dict[str, float]] | None:
    """A regression of several targets: each target's test mse, mae and r2 (and nll with a
    spread) in its own units, and the coverage of its calibrated intervals (``stats["intervals"]``),
    by its column name (``meta["target_names"]``: ``data.label``) or index; None for one target
    (the ensemble's metrics average the targets, the largest in its units weighing most, and
    pool the coverage: one target's intervals may miss while the pool looks right)."""
    from ensemble.task.metrics import regression_metrics
    mean = np.asarray(stats["mean"], dtype=np.float64)
    if mean.ndim != 2 or mean.shape[1] < 2:
        return None
    k = mean.shape[1]
    y = np.asarray(y, dtype=np.float64).reshape(mean.shape)
    var = np.asarray(stats["var"], dtype=np.float64).reshape(mean.shape) if stats.get("var") is not None else None
    spread = var is not None and bool(np.any(var > 0))
    names = [str(n) for n in meta.get("target_names") or ()]
    names = names if len(names) == k else [str(j) for j in range(k)]
    keep = ("mse", "mae", "r2", "nll")             # not the uncalibrated intervals' coverage: the calibrated ones'
    widths = {k: np.asarray(w, dtype=np.float64).reshape(mean.shape) for k, w in (stats.get("intervals") or {}).items()}
    from ensemble.task.metrics import coverage
    return {name: {**{key: value for key, value in regression_metrics(y[:, j], mean[:, j],
                                                                      var[:, j] if spread else None).items()
                      if key in keep and math.isfinite(value)},        # a constant target has no r2: no NaN
                   **{f"coverage{k}": coverage(y[:, j], mean[:, j], w[:, j]) for k, w in widths.items()}}
            for j, name in enumerate(names)}


def _reselected(run_dir: RunDirectory) -> dict | None:
    """The run's ensemble.json when `ensemble reselect` wrote it (None otherwise, or unreadable)."""
    path = run_dir.path / run_dir.ENSEMBLE
    try:
        summary = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and "reselected" in summary else None


def finalize(run_dir: RunDirectory, records: Records, cfg: RunConfig, meta: dict,
             y_val: np.ndarray, y_test: np.ndarray, extra: dict | None = None, ensemble: bool = True,
             artifacts: Artifacts | None = None, prune: bool = True, issued: int | None = None,
             pool: list[str] | None = None) -> dict:
    """Write leaderboard.csv and ensemble.json (with ``extra`` sections); return the summary.
    Without ``ensemble`` (a rehearsal that saved no predictions) no members are selected.
    With ``artifacts`` and ``prune`` (the run is complete), what the ensemble does not need
    is then removed (``Artifacts.prune``); a run that stopped early keeps every candidate,
    so that its resume selects as an uninterrupted run would. ``issued``: members handed
    out, when the caller knows (a search's ``issued`` events), for ``counts``; ``pool``: the
    candidates selection chooses from (default: every kept one; mode "online": its newest)."""
    t0 = time.perf_counter()
    records = as_records(records)
    task = get_task(meta["task"])
    metric = task.default_metric(cfg.ensemble.metric)
    board = leaderboard(records, metric)
    run_dir.write_text(run_dir.LEADERBOARD, leaderboard_csv(board))
    replacing = (run_dir.path / run_dir.ENSEMBLE).is_file()
    chosen = _reselected(run_dir)                 # an ensemble `ensemble reselect` chose: kept, not overwritten
    if chosen is not None:
        name = run_dir.archive_ensemble(chosen)
        log.warning(f"the ensemble `ensemble reselect` chose ({len(chosen.get('members', []))} members) is kept as "
                    f"{name}; ensemble.json is selected again by the config's [ensemble] settings")
    t_select = time.perf_counter()
    if ensemble:
        summary = build_ensemble(run_dir, records, cfg, meta, y_val, y_test, artifacts, issued=issued, pool=pool)
    else:
        summary = {"task": task.name, "metric": metric, "method": None, "members": [],
                   **_count_fields(counts_of(records, issued)), "rehearsal": True}
    select_seconds = time.perf_counter() - t_select
    summary.update(extra or {})
    if artifacts is not None:
        note = {"not_pruned": "the run stopped early: every candidate is kept for --resume"}
        pruned = {"models": 0}
        if prune:
            keep = [m["id"] for m in summary["members"]] + [m["id"] for m in (chosen or {}).get("members", [])]
            pruned = artifacts.prune(keep)          # the kept reselected ensemble stays loadable
            if pruned["line"] is not None:              # journalled before any file goes
                with run_dir.journal() as journal:
                    journal.event(pruned["line"])
            artifacts.remove_released()
            note = {"store_bytes_freed": artifacts.compact()}
        summary["kept"] = {"models": len(run_dir.model_files()), "candidates": len(artifacts.pool()),
                           "store_bytes": artifacts.store.bytes, "pruned_models": pruned["models"], **note}
    summary.setdefault("run", {}).update(finalize_seconds=round(time.perf_counter() - t0, 3),
                                         selection_seconds=round(select_seconds, 3))
    run_dir.write_json(run_dir.ENSEMBLE, summary)
    stale = run_dir.stale_exports() if replacing and prune else None
    if stale:
        log.warning(stale)
    return summary


def epochs_note(summary: dict) -> str | None:
    """What the console and the report say when no member stopped early: every one ran all its
    epochs, its validation loss still improving, and may be undertrained (on a small table 30
    epochs are 30 gradient steps: test mse 1927 against 166 with 400 epochs and early stopping)."""
    spent = summary.get("epochs_spent")
    if not spent:
        return None
    every = "the one member" if spent["members"] == 1 else f"every one of the {spent['members']} members"
    why = ("`train.epochs` is not more than `train.patience`, so early stopping could not end one"
           if spent["epochs"] <= spent.get("patience", 0) else
           "validation loss still improving within `train.patience`")
    return (f"{every} ran all {spent['epochs']} epochs without stopping early ({why}): members may be "
            "undertrained; raise `train.epochs` (early stopping ends each member once it stops improving)")


def calibration_lines(cal: dict, n_val: int | None = None) -> list[str]:
    """What a regression calibration's intervals promise, from the rows it was fitted on: split
    conformal on rows kept from training, its finite-sample spread over such sets of rows; a
    variance scaling, none; rows that also stopped training and chose the ensemble, why they
    were only widened ("auto") or may be too narrow (a method asked for). ``n_val``: the
    validation rows, for a calibration written before it said whether its rows were held out."""
    method, rows = cal.get("method"), cal.get("rows")
    if method not in ("conformal", "variance_scaling") or not rows:
        return []
    if not cal.get("held_out", rows < n_val if n_val else True):
        return [cal["why"] if cal.get("widen_only") else
                f"fitted on the {rows} validation rows that also stopped the members' training and chose the "
                "ensemble: their errors are smaller than new rows', and the intervals may cover less than nominal"]
    if method == "variance_scaling":
        return [f"fitted on {rows} validation rows kept from training: one scale factor, without split conformal's "
                "finite-sample guarantee"]
    spread = coverage_spread(0.9, rows)
    out = [f"fitted on {rows} validation rows kept from training: from one such set of rows to another, a 90% "
           f"interval covers at least 0.90 of new rows on average, give or take {spread:.2f} (more rows, "
           "`data.val_fraction`, narrow that)"]
    shown = [k for k in cal.get("capped", ()) if k in {level_key(lv) for lv in COVERAGE_LEVELS}]
    if shown:
        out.append(f"{', '.join(k + '%' for k in shown)}: {rows} rows are too few for split conformal to guarantee "
                   f"{'this level' if len(shown) == 1 else 'these levels'} (it would need an unbounded interval): "
                   "the largest validation error widened by the Gaussian tail beyond it; no guarantee")
    return out


def selection_text(summary: dict) -> str | None:
    """How the ensemble was chosen, as the console and the report say it: the method, its
    validation score (before calibration) against the best single member's on the same score,
    the effective size and why; None without a selection."""
    sel = summary.get("selection")
    if not sel:
        return None
    single, higher = sel["best_member"], higher_is_better(sel["metric"])
    worse = (sel["val_score"] < single["val_score"]) if higher else (sel["val_score"] > single["val_score"])
    return (f"{selection_how(sel)} on validation {sel['metric']} {metric_text(sel['val_score'])} before calibration "
            f"(best single member on it: {single.get('id', '?')} {metric_text(single['val_score'])}"
            + (f"; the leaderboard's best, {summary['best_member']['id']}, is best on {summary['metric']}"
               if single.get("id") not in (None, summary["best_member"]["id"]) else "")
            + ("; the ensemble is worse than it on these rows by design: weights kept near equal give up fit to "
               "the rows that chose them for what holds on new ones, which the test split tells" if worse and
               len(summary.get("members", ())) > 1 else "")
            + f"); effective size {sel['effective_size']:.2f} of {len(summary.get('members', ()))} member"
            + ("s" if len(summary.get("members", ())) != 1 else "")
            + (f" ({sel['why']})" if sel.get("why") else ""))


def selection_how(sel: dict) -> str:
    """The selection method as the console and the report name it ("top 3, equal weights", "shrunk")."""
    return f"top {sel.get('k') or sel['picks']}, equal weights" if sel["method"] == "top_k" else sel["method"]


def baseline_judged(summary: dict) -> list[str]:
    """The test metrics the ensemble is judged against the linear baseline on: the ranking
    metric and the task's proper score (a baseline one row behind on accuracy may be twice as
    good on log loss: 400 rows, 5.75% positives, 0.1145 against 0.2125), those both have."""
    ens, base = summary["ensemble"]["test"], (summary.get("baseline") or {}).get("test") or {}
    return [m for m in dict.fromkeys((summary.get("metric"), PROPER_SCORES.get(summary.get("task", ""))))
            if m in base and m in ens]


def baseline_beats(summary: dict) -> list[str]:
    """Of ``baseline_judged``, the metrics on which the baseline is strictly better than the
    ensemble (a tie is no win): the console warns of them and the report says them."""
    ens, base = summary["ensemble"]["test"], (summary.get("baseline") or {}).get("test") or {}
    return [m for m in baseline_judged(summary) if (base[m] > ens[m] if higher_is_better(m) else base[m] < ens[m])]


def majority_warning(summary: dict) -> str | None:
    """When the ensemble's test accuracy is no better than answering the most frequent class: why
    (imbalanced classes, or nothing learnt), for the console and the report; else None."""
    major, ens = summary.get("majority"), summary["ensemble"]["test"]
    if not major or "accuracy" not in ens or ens["accuracy"] > major["test_accuracy"]:
        return None
    imbalanced = major["test_accuracy"] >= IMBALANCED_SHARE
    return (f"answering the most frequent class ({major['class']!r}) for every row scores test accuracy "
            f"{metric_text(major['test_accuracy'])}, and the ensemble {metric_text(ens['accuracy'])}: " + (
                "with classes this imbalanced accuracy says little; compare the log loss "
                "(`ensemble.metric = \"log_loss\"` also ranks members by it)" if imbalanced else
                "the networks learnt nothing usable from the features: check the features and labels "
                "(`ensemble check`), the inputs' scale, or train longer"))


#: an uncalibrated 90% interval covering less than this share of the test rows is warned of
UNCALIBRATED_WARN = 0.8


def format_comparison(summary: dict) -> str:
    """The console table: ensemble against the best single member on the test split, then
    how the ensemble was chosen (effective size) and what its uncertainty is worth
    (coverage of the recalibrated intervals, or ECE before and after temperature scaling)."""
    ens, best = summary["ensemble"]["test"], summary["best_member"]["test"]
    keys = [k for k in ens if k in best]
    lines = [f"{'test split':<28}" + "".join(f"{k:>12}" for k in keys)]
    n = len(summary["members"])
    members = (f"ensemble ({n} members)" if n != 1 else       # a one-member ensemble names its member
               f"ensemble (1 member: {summary['members'][0]['id']})" if summary["members"] else "ensemble (1 member)")
    lines.append(f"{members:<28}" + "".join(metric_text(ens[k], 12) for k in keys))
    lines.append(f"{'best member ' + str(summary['best_member']['id']):<28}"
                 + "".join(metric_text(best[k], 12) for k in keys))
    base = (summary.get("baseline") or {}).get("test")
    if base:
        lines.append(f"{'baseline: ' + summary['baseline']['model']:<28}"
                     + "".join(metric_text(base[k], 12) if k in base else f"{'':>12}" for k in keys))
    metric = summary["metric"]
    if metric in ens:
        better = ens[metric] >= best[metric] if higher_is_better(metric) else ens[metric] <= best[metric]
        diff = ens[metric] - best[metric]
        lines.append(f"ensemble vs best member on test {metric}: {'+' if diff >= 0 else ''}{metric_text(diff)} "
                     f"({'ensemble at least as good' if better else 'best member better'})")
        beaten = baseline_beats(summary)
        if beaten:
            lines.append(f"warning: the linear baseline ({summary['baseline']['model']}, same training rows) "
                         "beats the ensemble on test " + "; ".join(
                             f"{m}: baseline {metric_text(base[m])}, ensemble {metric_text(ens[m])}" for m in beaten))
    for name, values in (summary.get("per_target") or {}).items():
        errors = "  ".join(f"{k} {metric_text(v)}" for k, v in values.items() if not k.startswith("coverage"))
        cover = "  ".join(f"{k[8:]}% {v:.2f}" for k, v in values.items() if k.startswith("coverage"))
        lines.append(f"  target {name}: test {errors}" + (f"   coverage {cover}" if cover else ""))
    major = majority_warning(summary)
    if major:
        lines.append(f"warning: {major}")
    note = epochs_note(summary)
    if note:
        lines.append(f"note: {note}")
    text = selection_text(summary)
    if text:
        lines.append(f"selection: {text}")
    cal = summary.get("calibration") or {}
    before = (cal.get("before") or {}).get("test", {})
    levels = [coverage_name(level) for level in COVERAGE_LEVELS if coverage_name(level) in ens]
    if levels:
        raw = "  ".join(f"{k[8:]}% {before[k]:.2f}" for k in levels if k in before)
        name = cal.get("method") if cal.get("method") not in (None, "none") else "uncalibrated"
        lines.append(f"test coverage of the {name} intervals: "
                     + "  ".join(f"{k[8:]}% {ens[k]:.2f}" for k in levels)
                     + (f"   (uncalibrated: {raw})" if raw and cal.get("method") != "none" else ""))
        lines += [f"  {line}" for line in calibration_lines(cal)]
        low = coverage_name(0.9)
        if name == "uncalibrated" and low in ens and ens[low] < UNCALIBRATED_WARN:
            lines.append(f"warning: the uncalibrated 90% intervals cover {ens[low]:.2f} of the test rows: they are the "
                         "members' own spread taken as Gaussian (their disagreement, and the noise a member with a "
                         "variance head predicts); `ensemble.calibration = \"auto\"` recalibrates them on validation "
                         "rows (`ensemble reselect RUN --calibration auto`, nothing trained again)")
    if cal.get("method") == "temperature" and cal["temperature"] == 1.0:
        lines.append("temperature scaling: kept T = 1 (" + (cal.get("why") or "a fitted temperature did not lower "
                                                           "the log loss of held-out validation rows") + ")")
    elif cal.get("method") == "temperature" and "ece" in before:
        lines.append(f"temperature {cal['temperature']:.3f}: test ECE {before['ece']:.4f} -> {ens['ece']:.4f}, "
                     f"log loss {before['log_loss']:.4f} -> {ens['log_loss']:.4f}")
    return "\n".join(lines)
