"""Read and validate a run's TOML config; fill in every default.

Every rank calls :func:`load_config` on the same file, so a bad config fails
identically everywhere and no rank waits for another. The result is a plain nested
dict (the *resolved* config): what the run directory records as ``config.toml``.
"""

from __future__ import annotations

import copy
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ensemble.config.vocabulary import (CALIBRATIONS, LOSSES, METRICS, OPTIMIZERS, TASKS, calibration_problem,
                                        check_layer, gaussian_head, suggest)


class ConfigError(ValueError):
    """A setting is wrong; the message names the key, the value and what would be right."""


@dataclass
class Key:
    """One setting: accepted types, default, and an optional check returning an error text."""
    types: tuple
    default: Any = None
    check: Callable[[Any], str | None] | None = None
    required: bool = False
    nullable: bool = False


@dataclass
class Table:
    keys: dict[str, Any]
    array: bool = False           # an array of tables ([[architectures]])
    min_items: int = 0
    defaults: dict = field(default_factory=dict)


def _positive(v):
    return None if v > 0 else "must be > 0"


def _nonneg(v):
    return None if v >= 0 else "must be >= 0"


def _fraction(v):
    return None if 0.0 < v < 1.0 else "must be between 0 and 1 (exclusive)"


def _one_of(*options):
    def check(v):
        return None if v in options else (
            f"must be one of {', '.join(repr(o) for o in options)}{suggest(v, options)}")
    return check


def _layers(v):
    if not v:
        return "must list at least one layer"
    for i, layer in enumerate(v):
        msg = check_layer(layer, f"[{i}]")
        if msg:
            return msg            # starts with "`[i]...`": a message about a sub-key
    return None


def _model_ref(v):
    mod, sep, fn = v.partition(":")
    return None if sep and mod and fn else 'must look like "package.module:function"'


def _shape(v):
    return None if v and all(isinstance(d, int) and d > 0 for d in v) else (
        "must be a list of positive integers, e.g. [8, 8, 1]")


NUM = (int, float)

TRAIN_KEYS = {
    "epochs": Key((int,), 30, _positive),
    "batch_size": Key((int,), 64, _positive),
    "optimizer": Key((str,), "adam", _one_of(*OPTIMIZERS)),
    "learning_rate": Key(NUM, 1e-3, _positive),
    "patience": Key((int,), 5, _nonneg),
    "member_time_limit": Key(NUM, 600.0, _positive),
    "bootstrap": Key((bool,), False),
    "loss": Key((str,), "auto", _one_of(*LOSSES)),
}

SCHEMA = Table({
    "name": Key((str,), None, lambda v: None if v and "/" not in v else "must be a non-empty name without '/'"),
    "mode": Key((str,), "ensemble", _one_of("ensemble", "evolve")),
    "seed": Key((int,), 0, _nonneg),
    "output_dir": Key((str,), "runs"),
    "data": Table({
        "source": Key((str,), "digits"),
        "format": Key((str,), "auto", _one_of("auto", "builtin", "npz", "npy", "csv", "parquet", "hdf5")),
        "x": Key((str,), "x"),
        "y": Key((str,), "y"),
        "label": Key((str,), "label"),
        "features": Key((list,), []),
        "task": Key((str,), "auto", _one_of("auto", *TASKS)),
        "val_fraction": Key(NUM, 0.15, _fraction),
        "test_fraction": Key(NUM, 0.15, _fraction),
        "normalize": Key((str,), "standard", _one_of("standard", "minmax", "none")),
        "reshape": Key((list,), None, _shape, nullable=True),
    }),
    "train": Table(dict(TRAIN_KEYS)),
    "architectures": Table({
        "name": Key((str,), None),
        "members": Key((int,), 1, _positive),
        "layers": Key((list,), None, _layers, nullable=True),
        "model": Key((str,), None, _model_ref, nullable=True),
        # folder put first on sys.path to import `model`'s module; load_config fills in the
        # config file's folder when the module lies there (as data paths resolve against it)
        "model_dir": Key((str,), None, nullable=True),
        "params": Key((dict,), {}),
        **{k: Key(v.types, None, v.check, nullable=True) for k, v in TRAIN_KEYS.items()},
    }, array=True),
    "ensemble": Table({
        "k": Key((int,), 5, _positive),
        # auto: Caruana's greedy or its bagged variant, whichever scores better on held-out
        # validation folds; both on `selection_metric`; top_k: the k best by `metric`
        "method": Key((str,), "auto", _one_of("auto", "greedy", "bagged", "top_k")),
        "metric": Key((str,), "auto", _one_of("auto", *METRICS)),
        # the score selection minimises: auto = a proper scoring rule (log loss, Gaussian NLL)
        "selection_metric": Key((str,), "auto", _one_of("auto", *METRICS)),
        # auto = regression intervals recalibrated on validation, classification left as is
        "calibration": Key((str,), "auto", _one_of(*CALIBRATIONS)),
        # retention at scale: predictions kept for the best `candidates` (selection's pool),
        # models for the best `keep_models` (+ the selected, + a multi-objective search's front)
        "candidates": Key((int,), 500, _positive),
        "keep_models": Key((int,), 100, _nonneg),
    }),
    # strategy, budget, and the settings the chosen strategy declares (evolve.strategies)
    "evolve": Key((dict,), {}),
    "search": Key((dict,), {}),
    "runtime": Table({
        "threads": Key((int,), 1, _positive),
        "log_level": Key((str,), "info", _one_of("debug", "info", "warning", "error")),
        "debug_log": Key((bool,), False),
        "group_size": Key((int,), 1, _positive),
        "verify_broadcast": Key((bool,), False),
        "pretend_nodes": Key((int,), None, _positive, nullable=True),
        "time_limit": Key(NUM, None, _positive, nullable=True),
        "finish_reserve": Key(NUM, 30.0, _nonneg),
        "max_failed_share": Key(NUM, 0.5, lambda v: None if 0.0 < v <= 1.0 else "must be in (0, 1]"),
        "poll_max_sleep": Key(NUM, 0.05, _positive),
        # "keras" trains; "rehearsal" sleeps instead (no TensorFlow): sizes and tests the control plane
        "trainer": Key((str,), "keras", _one_of("keras", "rehearsal")),
        "specs_in_hand": Key((str, int), "auto", lambda v: None if v == "auto" or (
            isinstance(v, int) and v > 0) else 'must be "auto" or a positive integer'),
        "journal_sync_seconds": Key(NUM, 1.0, _nonneg),
        "progress_seconds": Key(NUM, 10.0, _positive),
        "progress_lines": Key((int,), 100, _nonneg),
    }),
    # runtime.trainer = "rehearsal": how long each member "trains" and what it returns
    "rehearsal": Table({
        "seconds": Key(NUM, 1.0, _nonneg),
        "spread": Key(NUM, 0.0, _nonneg),
        "replay": Key((str,), ""),
        "predictions": Key((bool,), True),
        "failure_rate": Key(NUM, 0.0, lambda v: None if 0.0 <= v < 1.0 else "must be in [0, 1)"),
        "accuracy": Key(NUM, 0.8, lambda v: None if 0.0 <= v <= 1.0 else "must be in [0, 1]"),
    }),
})


def _fail(path: str, msg: str) -> None:
    """Raise naming ``path``; a message that starts with a backquote names a sub-key of it."""
    raise ConfigError("`" + path + msg[1:] if msg.startswith("`") else f"`{path}` {msg}")


def _check_value(path: str, spec: Key, value: Any) -> Any:
    if value is None:
        if spec.nullable:
            return None
        _fail(path, "must be set")
    if float in spec.types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and bool not in spec.types or not isinstance(value, spec.types):
        names = " or ".join({int: "an integer", float: "a number", str: "a string", bool: "true/false",
                            list: "a list", dict: "a table"}[t] for t in spec.types)
        _fail(path, f"must be {names}, but got {value!r} ({type(value).__name__})")
    if isinstance(value, float) and not math.isfinite(value):
        _fail(path, f"must be finite, but got {value!r}")
    if spec.check:
        msg = spec.check(value)
        if msg:
            _fail(path, msg if msg.startswith("`") else f"{msg}, but got {value!r}")
    return value


def _resolve(path: str, table: Table, given: Any) -> Any:
    if table.array:
        items = given if given is not None else []
        if not isinstance(items, list) or not all(isinstance(t, dict) for t in items):
            _fail(path, "must be an array of tables ([[" + path + "]])")
        return [_resolve_table(f"{path}[{i}]", table, t) for i, t in enumerate(items)]
    if given is None:
        given = {}
    if not isinstance(given, dict):
        _fail(path, f"must be a table ([{path}]), but got {given!r}")
    return _resolve_table(path, table, given)


def _resolve_table(path: str, table: Table, given: dict) -> dict:
    out = {}
    for key in given:
        if key not in table.keys:
            where = f"{path}.{key}" if path else key
            raise ConfigError(f"unknown setting `{where}`{suggest(key, table.keys)}; "
                              f"allowed here: {', '.join(table.keys)}")
    for key, spec in table.keys.items():
        where = f"{path}.{key}" if path else key
        if isinstance(spec, Table):
            out[key] = _resolve(where, spec, given.get(key))
        elif key in given:
            out[key] = _check_value(where, spec, given[key])
        else:
            out[key] = copy.deepcopy(spec.default)
    return out


def resolve_config(raw: dict, *, source: str = "config", saved: bool = False) -> dict:
    """Validate a parsed config dict and return it with every default filled in.

    ``saved``: ``raw`` is a run directory's own config.toml; runs written before each
    strategy declared its settings recorded every strategy's settings in ``[evolve]``,
    and those of other strategies are dropped instead of refused.
    """
    cfg = _resolve("", SCHEMA, raw)
    if cfg["name"] is None:
        cfg["name"] = Path(source).stem or "run"
    data = cfg["data"]
    if data["val_fraction"] + data["test_fraction"] >= 0.9:
        raise ConfigError("`data.val_fraction` + `data.test_fraction` must leave at least 10% "
                          f"for training, but they sum to {data['val_fraction'] + data['test_fraction']}")
    if cfg["mode"] == "ensemble" and not cfg["architectures"]:
        raise ConfigError("mode \"ensemble\" needs at least one [[architectures]] table with "
                          "`layers` or `model`")
    names = set()
    for i, arch in enumerate(cfg["architectures"]):
        where = f"architectures[{i}]"
        if (arch["layers"] is None) == (arch["model"] is None):
            raise ConfigError(f"`{where}` needs exactly one of `layers` (a list of layer tables) "
                              f"or `model` (\"package.module:function\")")
        if arch["model_dir"] is not None and arch["model"] is None:
            raise ConfigError(f"`{where}.model_dir` is where a user builder's module is imported from, "
                              "but the architecture has no `model`; remove it")
        if arch["name"] is None:
            arch["name"] = f"arch{i}"
        if arch["name"] in names:
            raise ConfigError(f"`{where}.name` {arch['name']!r} is used twice; names must be unique")
        names.add(arch["name"])
    from evolve.space import SearchSpace
    for key in cfg["search"]:
        if key not in SearchSpace.KEYS:
            raise ConfigError(f"unknown setting `search.{key}`{suggest(key, SearchSpace.KEYS)}; "
                              f"allowed here: {', '.join(sorted(SearchSpace.KEYS))}")
    cfg["evolve"] = resolve_evolve(cfg["evolve"], saved)
    if cfg["mode"] == "evolve":
        ev = cfg["evolve"]
        if ev["evaluations"] is None and ev["time_limit"] is None:
            raise ConfigError("mode \"evolve\" needs a budget: set `evolve.evaluations` "
                              "and/or `evolve.time_limit` (seconds)")
    metric = cfg["ensemble"]["metric"]
    task = data["task"]
    losses = {a["name"]: a["loss"] or cfg["train"]["loss"] for a in cfg["architectures"]}
    gaussian = [a["name"] for a in cfg["architectures"]
                if gaussian_head(losses[a["name"]], "regression", bool(a["model"]))]
    all_gaussian = (gaussian_head(cfg["train"]["loss"], "regression") if cfg["mode"] == "evolve"
                    else len(gaussian) == len(cfg["architectures"]))
    for key in ("metric", "selection_metric"):
        if cfg["ensemble"][key] == "nll" and not all_gaussian:
            raise ConfigError(f"`ensemble.{key}` \"nll\" needs every member to predict a variance: leave "
                              "`train.loss` at \"auto\" (or \"gaussian_nll\"; a user builder needs "
                              "\"gaussian_nll\") and no architecture overriding it with \"mse\"")
    if task != "auto":
        check_task_settings(cfg, task, "`data.task` is")
    return cfg


def check_task_settings(cfg: dict, task: str, why: str) -> None:
    """The settings that depend on the task, once it is known (from `data.task`, or on
    rank 0 from the labels: ``why`` says which): a regression loss, the [ensemble] metrics
    and calibration."""
    if task == "classification" and {"gaussian_nll", "mse"} & {
            cfg["train"]["loss"], *(a["loss"] for a in cfg["architectures"])}:
        raise ConfigError(f"`train.loss` \"gaussian_nll\" / \"mse\" is for regression, but {why} "
                          "\"classification\"; remove it or set `data.task = \"regression\"`")
    for key in ("metric", "selection_metric"):
        metric = cfg["ensemble"][key]
        if metric != "auto" and METRICS[metric][0] != task:
            fits = [m for m, (t, _) in METRICS.items() if t == task]
            raise ConfigError(f"`ensemble.{key}` {metric!r} is a {METRICS[metric][0]} metric, but "
                              f"{why} \"{task}\"; use one of {', '.join(repr(m) for m in fits)}")
    problem = calibration_problem(cfg["ensemble"]["calibration"], task)
    if problem:
        raise ConfigError(f"{problem} ({why} \"{task}\")")


EVOLVE_KEYS = {
    "strategy": Key((str,), "regularized"),
    "evaluations": Key((int,), 40, _positive, nullable=True),
    "time_limit": Key(NUM, None, _positive, nullable=True),
}


def resolve_evolve(given: dict, saved: bool = False) -> dict:
    """The ``[evolve]`` table: strategy and budget, then the settings the chosen strategy
    declares (``evolve.strategies``), each checked and defaulted by that declaration."""
    from evolve.strategies import STRATEGIES
    strategy = given.get("strategy", EVOLVE_KEYS["strategy"].default)
    _check_value("evolve.strategy", Key((str,), None, _one_of(*STRATEGIES)), strategy)
    settings = STRATEGIES[strategy].SETTINGS
    for key in list(given):
        if key in EVOLVE_KEYS or key in settings:
            continue
        owners = [name for name, cls in STRATEGIES.items() if key in cls.SETTINGS]
        if saved and owners:
            given = {k: v for k, v in given.items() if k != key}
            continue
        where = (f"; it is a setting of strategy {', '.join(repr(o) for o in owners)}" if owners
                 else suggest(key, [*EVOLVE_KEYS, *settings]))
        raise ConfigError(f"unknown setting `evolve.{key}` for strategy {strategy!r}{where}; "
                          f"allowed here: {', '.join([*EVOLVE_KEYS, *settings])}")
    out = {k: _check_value(f"evolve.{k}", spec, given[k]) if k in given else spec.default
           for k, spec in EVOLVE_KEYS.items()}
    for key, setting in settings.items():
        value = given.get(key, setting.default)
        if isinstance(setting.default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        why = setting.problem(value)
        if why:
            _fail(f"evolve.{key}", f"{why}, but got {value!r}")
        out[key] = value
    if "sample_size" in out and out["sample_size"] > out["population_size"]:
        raise ConfigError(f"`evolve.sample_size` ({out['sample_size']}) must be <= "
                          f"`evolve.population_size` ({out['population_size']})")
    return out


def load_config(path: str | Path) -> dict:
    """Parse and validate the TOML file at ``path`` (relative data paths resolve against it)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    return locate(resolve_config(raw, source=str(path)), path.parent)


def locate(cfg: dict, base: Path) -> dict:
    """Resolve a config's relative paths (data source, builder folders, replay file) against
    ``base``: the config file's folder, or the working directory for a config given as a
    dict (``ensemble.run_config``)."""
    path = Path(base) / "config.toml"
    src = cfg["data"]["source"]
    if ("/" in src or "." in src) and not Path(src).is_absolute():
        near_config = path.parent / src
        if near_config.exists() or not Path(src).exists():
            cfg["data"]["source"] = str(near_config.resolve())
    for i, arch in enumerate(cfg["architectures"]):
        arch["model_dir"] = builder_folder(arch, path.parent, f"architectures[{i}].model_dir")
    replay = cfg["rehearsal"]["replay"]
    if replay and not Path(replay).is_absolute() and (path.parent / replay).exists():
        cfg["rehearsal"]["replay"] = str((path.parent / replay).resolve())
    return cfg


def builder_folder(arch: dict, base: Path, where: str) -> str | None:
    """The absolute folder a user builder's module is imported from: ``model_dir`` (relative
    to ``base``, the config file's folder), else ``base`` itself when the module
    (``pkg/`` or ``mod.py``) lies there, else None (the module comes from ``sys.path``)."""
    if not arch["model"]:
        return None
    if arch["model_dir"] is not None:
        folder = Path(arch["model_dir"])
        folder = folder if folder.is_absolute() else base / folder
        if not folder.is_dir():
            raise ConfigError(f"`{where}` {arch['model_dir']!r} is not a folder (looked for "
                              f"{str(folder)!r}, relative paths start at the config file's folder)")
        return str(folder.resolve())
    top = arch["model"].partition(":")[0].split(".")[0]
    if (base / top).is_dir() or (base / f"{top}.py").is_file():
        return str(base.resolve())
    return None


def member_train_settings(cfg: dict, arch: dict) -> dict:
    """The training settings of one architecture: its own where set, else the [train] ones."""
    return {k: (arch[k] if arch.get(k) is not None else cfg["train"][k]) for k in TRAIN_KEYS}


def dump_toml(cfg: dict) -> str:
    """Write a resolved config back as TOML (tables, arrays of tables, inline tables)."""
    lines: list[str] = []

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)          # a JSON string is a valid TOML basic string
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items() if x is not None) + "}"
        raise TypeError(f"cannot write {v!r} as TOML")

    def scalars(d: dict) -> None:
        lines.extend(f"{k} = {value(v)}" for k, v in d.items() if v is not None)

    tables = {k for k, spec in SCHEMA.keys.items() if isinstance(spec, Table)} | {"evolve"}
    scalars({k: v for k, v in cfg.items() if k not in tables})
    for k, spec in SCHEMA.keys.items():
        if k == "evolve":
            lines += ["", "[evolve]"]
            scalars(cfg.get(k, {}))
            continue
        if not isinstance(spec, Table):
            continue
        if spec.array:
            for item in cfg.get(k, []):
                lines += ["", f"[[{k}]]"]
                scalars(item)
        else:
            lines += ["", f"[{k}]"]
            scalars(cfg.get(k, {}))
    return "\n".join(lines) + "\n"
