"""Ensembles and evolutionary architecture search on MPI.

Layers, each importing only from layers below it (checked by tests/test_layering.py):

    6  run, predict, simulate,      ``python -m ensemble.run`` / ``.predict`` / ``.simulate`` /
       reselect, report, status,    ``.reselect`` / ``.report`` / ``.status`` / ``.jobscript``:
       jobscript                    entry points
    5  orchestrate                  one master session (real or simulated) = mode x executor x budget
                                    x run directory; dispatch; --check
    4  modes                        one object per mode (ensemble, evolve, pbt): its source, decider,
                                    trainer, preflight, status and report sections
    3  sources, train, inference    what to train next; training one member; using a run
    2  results                      run directory, journal, packed store, retention, selection, summary,
                                    report, heartbeat
    1  runtime, task                MPI, executors, budget, env, logging; classification/regression
    0  config                       one schema, one vocabulary

Packages of the same layer do not import each other. ``datafeed`` (data) and ``evolve``
(search, MPI-free) sit beside them and may use ``ensemble.config`` only. See
docs/architecture.md.

For notebooks: ``ensemble.load(run_dir)`` (a finished run's ensemble: predict, members,
leaderboard, config) and ``ensemble.run_config(config)`` (a small run in this process).
"""

from __future__ import annotations

import logging
from pathlib import Path


def load(run_dir: str | Path):
    """A finished run's ensemble, for notebooks and scripts: ``ens.predict(x)`` -> (mean,
    spread), ``ens.members``, ``ens.leaderboard``, ``ens.config`` (``inference.api.Ensemble``)."""
    from ensemble.inference.api import Ensemble
    return Ensemble(run_dir)


def run_config(config: dict | str | Path, run_dir: str | Path | None = None, *, resume: bool = False,
               overwrite: bool = False):
    """Run a config in this process, on one rank (no ``mpirun``), and ``load`` its result.

    ``config`` is a TOML file or a dict of the same tables (relative paths in a dict resolve
    against the working directory). The run is the one ``python -m ensemble.run`` makes:
    same run directory, journal and ensemble, the members trained one after another here.
    For a small config: a notebook's first look, a test, a tutorial. Raises ``ConfigError`` (a
    ``ValueError``) for a config with a mistake, before anything runs, and ``RuntimeError`` with
    the run's exit code and its last error line when the run fails.
    """
    from ensemble.config import load_config, locate, resolve_config
    from ensemble.run import main
    if isinstance(config, dict):
        cfg = locate(resolve_config(config, source="notebook"), Path.cwd())
        name = f"<config {cfg.name!r}>"
    else:
        cfg, name = load_config(config), str(config)
    argv = [name] + (["--run-dir", str(run_dir)] if run_dir is not None else [])
    argv += ["--resume"] * resume + ["--overwrite"] * overwrite
    made: list[str] = []
    errors = _Errors()                                 # what the run said when it stopped, for the exception
    logger = logging.getLogger("ensemble")
    logger.addHandler(errors)
    try:
        code = main(argv, config=cfg, made=made)
    finally:
        logger.removeHandler(errors)
    if code != 0 or not made:
        why = f": {errors.said[-1]}" if errors.said else "; its log above says why"
        raise RuntimeError(f"the run of {name} failed with exit code {code}{why}")
    return load(made[0])


class _Errors(logging.Handler):
    """The error lines a run logs (``run_config`` raises with the last)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())
