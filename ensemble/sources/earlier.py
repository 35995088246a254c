"""An earlier search's candidates, read from its run directory: what ``evolve.start_from``
(a new search starts from its best genomes) and ``pbt.start`` (a population starts from its
best networks) take. Checked first: a run directory, of mode "evolve", on samples of this
run's shape, with at least one finished candidate; each problem is a one-line
``ConfigError`` naming the setting."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ensemble.config import ConfigError, RunConfig, read_saved_config
from ensemble.results.journal import read_journal
from ensemble.results.records import MemberRecord, as_records
from ensemble.results.rundir import RunDirectory
from ensemble.task import get_task
from ensemble.task.metrics import higher_is_better


@dataclass(frozen=True)
class EarlierSearch:
    """A finished or stopped mode "evolve" run: its config and its finished candidates, best first."""

    path: str
    config: RunConfig
    best_first: list[MemberRecord]
    metric: str


def earlier_search(run_path: str, setting: str, meta: dict, instead: str) -> EarlierSearch:
    """The mode "evolve" run at ``run_path``, its finished candidates ranked by its own metric
    (as this task names it), best first. ``setting`` (``evolve.start_from``) and ``instead``
    (what else the user may give) word the errors. Raises ``ConfigError``."""
    path = Path(run_path)
    rd = RunDirectory(path)
    where = f"`{setting}` {run_path!r}"
    if not path.exists():
        raise ConfigError(f"{where} does not exist (a relative path is taken from the config file's folder); "
                          f"give a mode \"evolve\" run's directory, or {instead}")
    if not (path / rd.JOURNAL).is_file() or not (path / rd.CONFIG).is_file():
        raise ConfigError(f"{where} is not a run directory (no {rd.JOURNAL} and {rd.CONFIG} there); give a "
                          f"mode \"evolve\" run's directory, or {instead}")
    source_cfg = read_saved_config(path / rd.CONFIG)
    if source_cfg.mode != "evolve":
        raise ConfigError(f"{where} is a mode {source_cfg.mode!r} run; it must be a mode \"evolve\" run "
                          "(its candidates are where this run starts)")
    if (path / rd.DATA).is_file():
        try:
            theirs = json.loads((path / rd.DATA).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{where}: its {rd.DATA} cannot be read ({exc})") from None
        shape, task = theirs.get("input_shape"), theirs.get("task")
        if task is not None and task != meta["task"]:
            raise ConfigError(f"{where} searched a {task} task, but this run is {meta['task']}: its candidates "
                              "were ranked on the other task's scores; start from a run of the same task (or "
                              f"{instead})")
        if shape is not None and list(shape) != list(meta["input_shape"]):
            raise ConfigError(f"{where} searched samples of shape {list(shape)}, but this run's samples have "
                              f"shape {list(meta['input_shape'])}; start from a run on the same data and "
                              "`data.reshape`")
    metric = get_task(meta["task"]).default_metric(source_cfg.ensemble.metric)
    records = [r for r in as_records(read_journal(path / rd.JOURNAL))
               if r.ok and r.genome is not None and r.val.get(metric) is not None]
    if not records:
        raise ConfigError(f"{where} has no finished candidates yet")
    sign = -1.0 if higher_is_better(metric) else 1.0
    records.sort(key=lambda r: (sign * r.val[metric], r.id))
    return EarlierSearch(str(path), source_cfg, records, metric)


def kept(run_dir: RunDirectory, setting: str, path: str, read: Callable[[], Any]) -> Any:
    """What this run takes from the earlier run at ``path`` (``setting``: ``evolve.start_from``,
    ``pbt.start``): ``read()`` (JSON) when the run starts, kept in its own run directory
    (``RunDirectory.STARTED_FROM``), and that copy again on ``--resume``. A resumed run so
    starts from the same points after the earlier run was moved, purged from a scratch file
    system, or continued (its best genomes then differ, and the replayed search would ask
    others than the journal holds)."""
    saved = started_from(run_dir)
    if setting in saved:
        return saved[setting]["value"]
    value = json.loads(json.dumps(read()))         # as a resume reads it back: lists, not tuples
    run_dir.path.mkdir(parents=True, exist_ok=True)
    run_dir.write_json(run_dir.STARTED_FROM, {**saved, setting: {"path": path, "value": value}})
    return value


def started_from(run_dir: RunDirectory | None) -> dict:
    """The run's kept starting points (``kept``), by setting; {} when none (or unreadable: the
    earlier run is then read again)."""
    if run_dir is None or not (run_dir.path / run_dir.STARTED_FROM).is_file():
        return {}
    try:
        saved = json.loads((run_dir.path / run_dir.STARTED_FROM).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def trained_keys(run_path: str, meta: dict) -> frozenset[str]:
    """``evolve.start_from``: the keys of every genome the earlier search trained (finished or
    failed), so that the new search asks none of them again: with the same seed it would
    otherwise draw the same first population and train it to the same results."""
    from evolve import genome_from_dict
    rd = RunDirectory(Path(run_path))
    keys = set()
    for record in as_records(read_journal(rd.path / rd.JOURNAL)):
        if record.genome is not None:
            try:
                keys.add(genome_from_dict(record.genome).key())
            except ValueError:                # a genome this version cannot read: never asked anyway
                continue
    return frozenset(keys)


def start_genomes(run_path: str, meta: dict, space, count: int, origins: list | None = None) -> list:
    """``evolve.start_from``: the best ``count`` distinct genomes of the earlier search, each
    moved into this run's search ``space`` (``evolve.repair``; one it cannot hold is passed
    over); ``origins``, when given, receives each one's id in the earlier run. Raises
    ``ConfigError`` when none fits."""
    from evolve import genome_from_dict, repair
    earlier = earlier_search(run_path, "evolve.start_from", meta, "\"\" to start from random genomes")
    shape, n_outputs = tuple(meta["input_shape"]), meta["n_outputs"]
    out, keys = [], set()
    for record in earlier.best_first:
        try:
            genome = repair(genome_from_dict(record.genome), shape, n_outputs, space)
        except ValueError:                    # a genome this version cannot read: passed over
            continue
        if genome is not None and genome.key() not in keys:
            out.append(genome)
            keys.add(genome.key())
            if origins is not None:
                origins.append(record.id)
        if len(out) >= count:
            break
    if not out:
        from evolve import SearchSpace
        searched = SearchSpace.from_config(dict(earlier.config.search), input_rank=len(shape)).space
        raise ConfigError(f"`evolve.start_from` {run_path!r}: none of its {len(earlier.best_first)} finished "
                          f"candidates fits this search space (it searched `search.space` {searched!r}, this run "
                          f"{space.space!r}); widen `[search]` or start from a run of the same space")
    return out
