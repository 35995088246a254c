"""Rank 0 before any training: read and check the data, the architectures and the search
space against it, and choose and create the run directory (or check the one resumed)."""

from __future__ import annotations

import argparse
import shutil
import tomllib
from pathlib import Path

from ensemble.config import ConfigError, dump_toml, resolve_config
from ensemble.results.rundir import RunDirectory


def prepare_run(cfg: dict, args) -> tuple[dict, dict, RunDirectory]:
    """Rank 0: read, check and prepare the data, check architectures, create the run directory."""
    from datafeed.prepare import prepare
    from datafeed.readers import read_dataset
    from ensemble.config.vocabulary import check_input_rank

    x, y, info = read_dataset(cfg["data"])
    arrays, meta = prepare(x, y, info, cfg["data"], cfg["seed"])
    if meta["task"] == "classification" and "gaussian_nll" in (
            [cfg["train"]["loss"]] + [a["loss"] for a in cfg["architectures"]]):
        raise ConfigError("`train.loss` \"gaussian_nll\" is for regression, but the labels make this "
                          "a classification task; remove it or set `data.task = \"regression\"`")
    for i, arch in enumerate(cfg["architectures"]):
        if arch["layers"]:
            msg = check_input_rank(arch["layers"], meta["input_shape"], f"architectures[{i}].layers")
            if msg:
                raise ConfigError(msg)
        else:
            from ensemble.train.architecture import ArchitectureError, load_builder
            try:
                load_builder(arch["model"])
            except ArchitectureError as exc:
                raise ConfigError(f"`architectures[{i}].model`: {exc}") from None
    if cfg["runtime"]["trainer"] == "rehearsal" and cfg["rehearsal"]["replay"]:
        from ensemble.train.rehearsal import replay_durations
        try:
            replay_durations(cfg["rehearsal"]["replay"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if cfg["mode"] == "evolve":
        from ensemble.sources.search import check_search
        check_search(cfg, meta)
    run_dir = RunDirectory(choose_run_dir(cfg, args))
    if args.resume:
        check_same_run(cfg, run_dir)
    run_dir.write_text(run_dir.CONFIG, dump_toml(cfg))
    run_dir.write_json(run_dir.DATA, meta)
    run_dir.save_normalization(arrays["x_mean"], arrays["x_scale"])
    return arrays, meta, run_dir


RESULT_SETTINGS = ("mode", "seed", "data", "train", "architectures", "evolve", "search", "ensemble")


def check_same_run(cfg: dict, run_dir: RunDirectory | Path) -> None:
    """--resume must not mix members of two different configs in one run."""
    run_dir = RunDirectory(run_dir) if not isinstance(run_dir, RunDirectory) else run_dir
    saved_path = run_dir / run_dir.CONFIG
    if not saved_path.exists():
        return
    saved = resolve_config(tomllib.loads(saved_path.read_text()), saved=True)
    for key in RESULT_SETTINGS:
        if saved[key] != cfg[key]:
            raise ConfigError(f"--resume: `{key}` differs from the run's saved config.toml in "
                              f"{str(run_dir.path)!r}; resume with the config the run started with "
                              "(only [runtime] settings may change)")


def choose_run_dir(cfg: dict, args: argparse.Namespace) -> Path:
    """Where this run writes; never silently mixes two runs in one directory."""
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        run_dir = Path(cfg["output_dir"]) / cfg["name"]
    has_results = RunDirectory(run_dir).has_journal()
    if args.resume:
        if not has_results:
            raise ConfigError(f"--resume: {str(run_dir)!r} holds no journal.jsonl to resume from; "
                              "start the run without --resume")
        return run_dir
    if run_dir.exists() and args.overwrite:
        shutil.rmtree(run_dir)
    elif has_results and args.run_dir:
        raise ConfigError(f"--run-dir {str(run_dir)!r} already holds a run; add --resume to continue it "
                          "or --overwrite to replace it")
    elif has_results:
        n = 2
        while (run_dir.parent / f"{run_dir.name}-{n}").exists():
            n += 1
        run_dir = run_dir.parent / f"{run_dir.name}-{n}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir
