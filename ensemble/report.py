"""End of a run: leaderboard, ensemble selection and averaging, ensemble.json, console table.

Works from the journal records and the predictions the members saved, so it needs no
TensorFlow and can be re-run on a finished run directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from ensemble import metrics as M
from ensemble.selection import rank_members, select


def default_metric(task: str, setting: str) -> str:
    if setting != "auto":
        return setting
    return "accuracy" if task == "classification" else "mse"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never half a file."""
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def finished_records(records: list[dict]) -> list[dict]:
    """The last 'ok' record of each member id (a resumed run may hold earlier failures)."""
    last = {}
    for r in records:
        if r.get("status") == "ok":
            last[r["id"]] = r
    return list(last.values())


def leaderboard(records: list[dict], metric: str) -> pd.DataFrame:
    """Finished members ranked by the validation metric, then failed ones."""
    rows = []
    ranked = rank_members(finished_records(records), metric)
    for pos, r in enumerate(ranked, 1):
        row = {"rank": pos, "id": r["id"], "arch": r.get("arch"), "status": "ok"}
        row.update({f"val_{k}": v for k, v in r["val"].items()})
        row.update({f"test_{k}": v for k, v in r["test"].items()})
        row.update({k: r.get(k) for k in ("params", "epochs", "stopped", "train_seconds", "seed")})
        row["mpi_rank"] = r.get("rank")
        if r.get("summary"):
            row["genome"] = r["summary"]
        rows.append(row)
    ok = {r["id"] for r in ranked}
    for r in records:
        if r.get("status") != "ok" and r["id"] not in ok:
            rows.append({"rank": None, "id": r["id"], "arch": r.get("arch"), "status": r.get("status"),
                         "error": r.get("error", {}).get("message")})
    return pd.DataFrame(rows)


def _load(run_dir: Path, member_id: str, split: str, what: str = "pred") -> np.ndarray | None:
    path = run_dir / "members" / member_id / f"{split}_{what}.npy"
    return np.load(path) if path.exists() else None


def build_ensemble(run_dir: Path, records: list[dict], cfg: dict, meta: dict,
                   y_val: np.ndarray, y_test: np.ndarray) -> dict:
    """Select members on validation predictions, average them, score on the test split."""
    task = meta["task"]
    metric = default_metric(task, cfg["ensemble"]["metric"])
    ranked = rank_members(finished_records(records), metric)
    if not ranked:
        raise RuntimeError(f"no member finished (of {len(records)} tried); see "
                           f"{run_dir / 'journal.jsonl'} for each failure")
    preds = {"val": {r["id"]: _load(run_dir, r["id"], "val") for r in ranked}}
    variances = {"val": {r["id"]: _load(run_dir, r["id"], "val", "var") for r in ranked}}
    val_preds, val_vars = preds["val"], variances["val"]
    gaussian = all(v is not None for v in val_vars.values())
    method = cfg["ensemble"]["method"]
    if method == "auto":                   # Caruana's greedy when there is a choice to make
        method = "greedy" if len(ranked) > cfg["ensemble"]["k"] else "top_k"
    weights = select(val_preds, y_val, metric, method=method, k=cfg["ensemble"]["k"], task=task,
                     val_vars=val_vars if gaussian else None)
    ids = list(weights)
    w = np.array([weights[i] for i in ids])
    best = ranked[0]
    out = {"task": task, "metric": metric, "method": method,
           "members": [{"id": i, "weight": float(weights[i])} for i in ids],
           "n_finished": len(ranked), "n_failed": len({r["id"] for r in records} - {r["id"] for r in ranked})}
    preds["test"] = {i: _load(run_dir, i, "test") for i in ids}
    variances["test"] = {i: _load(run_dir, i, "test", "var") for i in ids}
    stack = {s: np.stack([preds[s][i] for i in ids]) for s in ("val", "test")}
    if task == "classification":
        unc = {s: M.classification_uncertainty(stack[s], w) for s in ("val", "test")}
        out["ensemble"] = {s: M.classification_metrics(y, unc[s]["proba"])
                           for s, y in (("val", y_val), ("test", y_test))}
        t = unc["test"]
        per_sample = {"proba": t["proba"], "prediction": t["proba"].argmax(axis=1), "total_entropy": t["total"],
                      "aleatoric": t["aleatoric"], "epistemic": t["epistemic"]}
    else:
        var = {s: np.stack([variances[s][i] if variances[s][i] is not None      # a non-Gaussian member
                            else np.zeros_like(preds[s][i]) for i in ids])    # adds no aleatoric part
               for s in ("val", "test")}
        mix = {s: M.regression_mixture(stack[s], var[s], w) for s in ("val", "test")}
        out["ensemble"] = {s: M.regression_metrics(y, mix[s]["mean"], mix[s]["var"] if gaussian else None)
                           for s, y in (("val", y_val), ("test", y_test))}
        t = mix["test"]
        per_sample = {"mean": t["mean"], "std": t["std"], "aleatoric_var": t["aleatoric"],
                      "epistemic_var": t["epistemic"]}
    out["best_member"] = {"id": best["id"], "val": best["val"], "test": best["test"]}
    np.savez(run_dir / "ensemble_test_predictions.npz", y=y_test, **per_sample)
    return out


def finalize(run_dir: Path, records: list[dict], cfg: dict, meta: dict,
             y_val: np.ndarray, y_test: np.ndarray, extra: dict | None = None) -> dict:
    """Write leaderboard.csv and ensemble.json (with ``extra`` sections); return the summary."""
    metric = default_metric(meta["task"], cfg["ensemble"]["metric"])
    board = leaderboard(records, metric)
    write_atomic(run_dir / "leaderboard.csv", board.to_csv(index=False))
    summary = build_ensemble(run_dir, records, cfg, meta, y_val, y_test)
    summary.update(extra or {})
    write_atomic(run_dir / "ensemble.json", json.dumps(summary, indent=2, allow_nan=True))
    return summary


def format_comparison(summary: dict) -> str:
    """The console table: ensemble against the best single member on the test split."""
    ens, best = summary["ensemble"]["test"], summary["best_member"]["test"]
    keys = [k for k in ens if k in best]
    lines = [f"{'test split':<28}" + "".join(f"{k:>12}" for k in keys)]
    n = len(summary["members"])
    lines.append(f"{f'ensemble ({n} members)':<28}" + "".join(f"{ens[k]:>12.4f}" for k in keys))
    lines.append(f"{'best member ' + summary['best_member']['id']:<28}"
                 + "".join(f"{best[k]:>12.4f}" for k in keys))
    metric = summary["metric"]
    if metric in ens:
        better = ens[metric] >= best[metric] if M.higher_is_better(metric) else ens[metric] <= best[metric]
        diff = ens[metric] - best[metric]
        lines.append(f"ensemble vs best member on test {metric}: {diff:+.4f} "
                     f"({'ensemble at least as good' if better else 'best member better'})")
    return "\n".join(lines)
