"""``python -m ensemble.reselect RUN_DIR [--method M] [--k K] [--metric M] ...``: choose a
finished run's ensemble again, another way, without training anything.

Selection works on the validation predictions the run kept (``store/``): after a complete
run these are the selected members and the best ``ensemble.keep_models`` (see README,
"what a run keeps"), so a re-selection chooses among those. The data file is read again
for the validation and test targets (the same split: the seed and fractions are in the
saved config.toml). The new selection is written as ``ensemble.json`` (and
``ensemble_test_predictions.npz``); the previous ones are kept as ``ensemble-N.json`` and
``ensemble_test_predictions-N.npz`` (N = 1, 2, ...: the oldest has the smallest N), so
``python -m ensemble.predict`` uses the new one and nothing is lost. No MPI, no TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("ensemble.reselect")

EXIT_USAGE = 2


class ReselectError(RuntimeError):
    """The run directory cannot be re-selected; the message says why and what to do."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from ensemble.config.vocabulary import CALIBRATIONS, METRICS
    from ensemble.results.selection import CHOICES
    p = argparse.ArgumentParser(prog="python -m ensemble.reselect",
                                description="Choose a finished run's ensemble again without training; "
                                            "the old ensemble.json is kept as ensemble-N.json.")
    p.add_argument("run_dir", help="a finished run directory (with ensemble.json)")
    p.add_argument("--method", choices=CHOICES, help="ensemble.method (default: the run's)")
    p.add_argument("--k", type=int, help="ensemble.k, for --method top_k (default: the run's)")
    p.add_argument("--metric", choices=sorted(METRICS), help="ensemble.metric: what is reported and ranked")
    p.add_argument("--selection-metric", choices=["auto", *sorted(METRICS)],
                   help="ensemble.selection_metric: the score selection optimises (auto: log loss / NLL)")
    p.add_argument("--calibration", choices=list(CALIBRATIONS), help="ensemble.calibration")
    return p.parse_args(argv)


def reselect(run_dir: str | Path, overrides: dict) -> dict:
    """Re-select the ensemble of the finished run in ``run_dir`` with ``overrides`` of its
    ``[ensemble]`` settings; returns the new summary (also written as ensemble.json). It
    writes the run, so it takes the run's lock: not while a job runs on it."""
    from ensemble.results.lock import RunLock, RunLocked
    lock = RunLock(Path(run_dir), what="ensemble.reselect")
    if Path(run_dir).is_dir():
        try:
            lock.acquire()
        except RunLocked as exc:
            raise ReselectError(str(exc)) from None
    try:
        return _reselect(run_dir, overrides)
    finally:
        lock.release()


def _reselect(run_dir: str | Path, overrides: dict) -> dict:
    from ensemble.config import ConfigError, read_saved_config
    from ensemble.config.schema import check_task_settings
    from ensemble.results.artifacts import Artifacts
    from ensemble.results.records import as_records, journal_shortfall, latest
    from ensemble.results.rundir import DAMAGED_FIX, RunDirectory
    from ensemble.results.summary import build_ensemble, finished_records

    t0 = time.perf_counter()
    rd = RunDirectory(Path(run_dir))
    for name in (rd.CONFIG, rd.DATA, rd.ENSEMBLE, rd.JOURNAL):
        if not (rd.path / name).is_file():
            why = ("the run has not chosen an ensemble yet; finish it with `python -m ensemble.run CONFIG "
                   "--resume`" if name == rd.ENSEMBLE else "it is not a run directory of ensemble.run")
            raise ReselectError(f"{str(rd.path / name)!r} does not exist: {why}")
    try:
        saved = read_saved_config(rd.path / rd.CONFIG)
    except ConfigError as exc:
        raise ReselectError(str(exc)) from None
    meta = json.loads((rd.path / rd.DATA).read_text())
    try:
        old = json.loads((rd.path / rd.ENSEMBLE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReselectError(f"{str(rd.path / rd.ENSEMBLE)!r} cannot be read ({exc}): {DAMAGED_FIX}") from None
    lines = rd.read_lines()
    records = [r for r in lines if "event" not in r]
    short = journal_shortfall(old, as_records(records))
    if short:
        raise ReselectError(f"{short}; re-selecting from it would drop members: restore the journal, or continue "
                            "the run with `--resume`, which trains the missing ones again")
    ens = saved.ensemble.replace(**{k: v for k, v in overrides.items() if v is not None})
    if ens.k < 1:
        raise ReselectError(f"--k must be a positive integer, but got {ens.k}")
    cfg = saved.replace(ensemble=ens)                # the run's config with the new [ensemble] settings
    try:
        check_task_settings(cfg, meta["task"], "the run's task is")
    except ConfigError as exc:
        raise ReselectError(str(exc).replace("`ensemble.", "`--").replace("_metric`", "-metric`")) from None

    from ensemble.inference.load import PredictError, run_arrays
    try:
        arrays = run_arrays(rd.path, cfg, meta)
    except PredictError as exc:
        raise ReselectError(f"{exc}; re-selection needs the run's targets") from None

    artifacts = Artifacts(rd, old.get("metric") or saved.ensemble.metric, saved.ensemble.candidates,
                          saved.ensemble.keep_models)
    artifacts.restore(lines, tidy=False)
    try:
        from ensemble.modes import mode_of
        among = mode_of(cfg).selection_pool(cfg, list(latest(as_records(records)).values()))   # online: its window
        with_models = [i for i in artifacts.pool()                  # the ensemble must be loadable
                       if (rd.model_path(i).is_file() or cfg.runtime.trainer == "rehearsal")
                       and (among is None or i in among)]
        if not with_models:
            raise ReselectError(f"no member of {str(rd.path)!r} has both stored predictions and a model file")
        backup = rd.archive_ensemble(old)
        summary = build_ensemble(rd, records, cfg, meta, arrays["y_val"], arrays["y_test"], artifacts,
                                 pool=with_models)
    finally:
        artifacts.close()
    kept = {k: old[k] for k in ("run", "search", "kept", "rehearsal", "baseline", "online") if k in old}
    summary.update(kept)
    changed = any(old.get(k) != summary.get(k) for k in ("members", "calibration"))
    summary["reselected"] = {"previous": backup, "settings": {k: getattr(ens, k) for k in (
        "method", "k", "metric", "selection_metric", "calibration")}, "pool": len(with_models),
        "n_finished": len(finished_records(records)), "changed": changed,
        "seconds": round(time.perf_counter() - t0, 3)}
    if summary.get("metric") != old.get("metric"):        # ranked on another metric: the leaderboard follows
        from ensemble.results.summary import leaderboard, leaderboard_csv
        rd.write_text(rd.LEADERBOARD, leaderboard_csv(leaderboard(records, summary["metric"])))
    rd.write_json(rd.ENSEMBLE, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ensemble.results.summary import format_comparison
    from ensemble.runtime.logs import setup_logging
    setup_logging(0)
    overrides = {"method": args.method, "k": args.k, "metric": args.metric,
                 "selection_metric": args.selection_metric, "calibration": args.calibration}
    try:
        summary = reselect(args.run_dir, overrides)
    except ReselectError as exc:
        log.error(f"reselect: {exc}")
        return EXIT_USAGE
    log.info(format_comparison(summary))
    log.info(f"wrote {Path(args.run_dir) / 'ensemble.json'} (the previous one: "
             f"{summary['reselected']['previous']})" + ("" if summary["reselected"]["changed"] else
                                                        "; the same members, weights and calibration"))
    from ensemble.results.rundir import RunDirectory
    stale = RunDirectory(Path(args.run_dir)).stale_exports() if summary["reselected"]["changed"] else None
    if stale:                                        # last, under the table: not scrolled away
        log.warning(stale)
    from ensemble.results.report import report_line
    log.info(report_line(args.run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
