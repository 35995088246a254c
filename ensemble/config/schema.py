"""Read and validate a run's TOML config; fill in every default.

Every rank calls :func:`load_config` on the same file, so a bad config fails
identically everywhere and no rank waits for another. ``resolve_dict`` checks a raw TOML
dict and fills in every default (the *resolved* config, what the run directory records
as ``config.toml``); ``resolve_config``/``load_config`` return it typed, as a frozen
``RunConfig`` (``ensemble.config.typed``, generated from this schema), which is how every
other module reads a setting.

Every problem is found in one pass: a wrong setting is noted and falls back to its
default, so the rest is still checked, and the checks that read a wrong setting are
skipped (one mistake, one message). The run raises one ``ConfigError`` listing them all;
``python -m ensemble.run CONFIG --check`` passes a ``Problems`` to gather them and goes on
to the data and the architectures.

Each setting's ``doc`` is its one-line meaning: ``docs/config.md`` is rendered from this
module (``ensemble.config.reference``), so the reference and the code cannot drift apart.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ensemble.config.typed import ArchitectureConfig, RunConfig, TrainConfig
from ensemble.config.vocabulary import (
    CALIBRATIONS,
    LOSSES,
    METRICS,
    MODES,
    OPTIMIZERS,
    SELECTION_METHODS,
    TASKS,
    calibration_problem,
    check_layer,
    gaussian_head,
    path_component_problem,
    suggest,
)


class ConfigError(ValueError):
    """Settings are wrong; each message names the key, the value and what would be right.

    ``problems`` holds the messages one by one; ``str()`` gives them one per line."""

    def __init__(self, *problems: str):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class Problems:
    """Every problem found in a config, gathered instead of raised at the first one.

    ``bad`` holds the settings found wrong, as dotted paths (``train.epochs``,
    ``architectures[0].layers``): a check that reads one of them is skipped, so a mistake
    is reported once and not again through its consequences."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.bad: set[str] = set()

    def __len__(self) -> int:
        return len(self.messages)

    def add(self, message: str, *settings: str) -> None:
        self.messages.append(message)
        self.bad.update(settings)

    def ok(self, *settings: str) -> bool:
        """Whether none of ``settings``, nor a table that holds one, was found wrong."""
        return not any(s == b or s.startswith((b + ".", b + "[")) for s in settings for b in self.bad)

    @contextmanager
    def catch(self, *settings: str) -> Iterator[None]:
        """Note a ``ConfigError`` raised inside instead of letting it out; ``settings`` are wrong."""
        try:
            yield
        except ConfigError as exc:
            self.messages.extend(exc.problems)
            self.bad.update(settings)

    def raise_any(self) -> None:
        if self.messages:
            raise ConfigError(*self.messages)


@dataclass
class Key:
    """One setting: accepted types, default, an optional check returning an error text, and
    ``doc``, its meaning in one line (docs/config.md)."""
    types: tuple
    default: Any = None
    check: Callable[[Any], str | None] | None = None
    required: bool = False
    nullable: bool = False
    doc: str = ""


@dataclass
class Table:
    keys: dict[str, Any]
    array: bool = False           # an array of tables ([[architectures]])
    defaults: dict = field(default_factory=dict)
    doc: str = ""


def _positive(v):
    return None if v > 0 else "must be > 0"


def _labels(v):
    """`data.label`: a column name, or a list of them (several regression targets)."""
    if isinstance(v, str):
        return None
    if not v or not all(isinstance(c, str) and c for c in v) or len(set(v)) != len(v):
        return "must be a column name, or a list of distinct column names (one per regression target)"
    return None


def _nonneg(v):
    return None if v >= 0 else "must be >= 0"


def _auto_or_whole(what: str):
    """\"auto\", or a whole number >= 0 (not a bool); else ``must be "auto" or WHAT``."""
    def check(v):
        ok = v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        return None if ok else f'must be "auto" or {what}'
    return check


def _arch_seconds(v):
    bad = [k for k, x in v.items() if isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0]
    return None if not bad else (f"must map architecture names to seconds >= 0; {bad[0]!r} is given "
                                 f"{v[bad[0]]!r}")


def _fraction(v):
    return None if 0.0 < v < 1.0 else "must be between 0 and 1 (exclusive)"


def _one_of(*options):
    def check(v):
        return None if v in options else (
            f"must be one of {', '.join(repr(o) for o in options)}{suggest(v, options)}")
    check.options = options       # type: ignore[attr-defined]  # the allowed values, for docs/config.md
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

#: mode = "pbt": what may evolve, and the rules (``ensemble.sources.population``)
PBT_HYPERPARAMETERS = ("learning_rate", "batch_size", "dropout", "weight_decay", "momentum")
PBT_EXPLOIT = ("truncation", "tournament", "none")
PBT_EXPLORE = ("perturb", "resample")
#: what a population member is beyond its hyperparameters: a copy takes it with the weights
PBT_WHAT = ("arch", "layers", "model", "params", "model_dir", "optimizer", "loss")

TRAIN_KEYS = {
    "epochs": Key((int,), 30, _positive, doc="most epochs a member trains (early stopping may end it sooner)"),
    "batch_size": Key((int,), 64, _positive,
                      doc="samples per gradient step (the global batch: a member group splits it over its ranks)"),
    "optimizer": Key((str,), "adam", _one_of(*OPTIMIZERS), doc="the Keras optimizer, by name"),
    "learning_rate": Key(NUM, 1e-3, _positive, doc="the optimizer's learning rate"),
    "patience": Key((int,), 5, _nonneg,
                    doc="early stopping: epochs without a better validation loss before training stops; "
                        "the best epoch's weights are kept"),
    "member_time_limit": Key(NUM, 600.0, _positive,
                             doc="seconds one member may train; past it training stops at the next batch and the "
                                 "member keeps its best validated weights (`stopped = \"time_limit\"`, ranked like "
                                 "any other); one stopped before its first epoch ended fails (kind `time_limit`); "
                                 "shortened to end before the run's own deadline"),
    "time_limit_fails": Key((bool,), False,
                            doc="true: a member that reaches `member_time_limit` fails and its work is dropped "
                                "(the behaviour before the limit kept the best weights)"),
    "bootstrap": Key((bool,), False, doc="train each member on a seeded bootstrap resample of the training split"),
    "loss": Key((str,), "auto", _one_of(*LOSSES),
                doc="\"auto\": cross-entropy for classification, Gaussian NLL (a mean and a variance head) for "
                    "regression (a user builder keeps MSE unless it says \"gaussian_nll\"); \"mse\": a mean head "
                    "only"),
}

SCHEMA = Table({
    "name": Key((str,), None, path_component_problem,
                doc="the run's name: its directory is `output_dir/name` (suffixed -2, -3 if that holds a run); "
                    "unset: the config file's name"),
    "mode": Key((str,), "ensemble", _one_of(*MODES),
                doc="\"ensemble\": train the `[[architectures]]` listed; \"evolve\": search architectures "
                    "(`[evolve]`, `[search]`); \"pbt\": a population that trains round by round and copies "
                    "its best members' weights into its worst (`[pbt]`); \"online\": members train on samples a "
                    "running simulation streams, and each few make a new published ensemble (`[online]`)"),
    "seed": Key((int,), 0, _nonneg,
                doc="seeds the data split, every member's initialisation and bootstrap, and the search"),
    "output_dir": Key((str,), "runs", doc="folder the run directory is made in"),
    "data": Table({
        "source": Key((str,), "digits",
                      doc="a built-in dataset (digits, iris, wine, breast_cancer, diabetes, "
                          "california_housing_small), a .npz/.npy/.csv/.parquet/.h5 file, or a folder or glob of "
                          ".npz/.npy/.h5/.nc/.parquet files read as one dataset (relative to the config)"),
        "format": Key((str,), "auto", _one_of("auto", "builtin", "npz", "npy", "csv", "parquet", "hdf5"),
                      doc="how to read `source`; \"auto\": a built-in name, else by the file's suffix"),
        "x": Key((str,), "x", doc="the features: array name in an .npz, dataset path in an HDF5 file"),
        "y": Key((str,), "y",
                 doc="the targets: array name in an .npz, dataset path in an HDF5 file, or the targets .npy "
                     "file beside an .npy `source`"),
        "label": Key((str, list), "label", _labels,
                     doc="CSV/Parquet: the target column, or a list of columns (a regression with one output "
                         "per column)"),
        "features": Key((list,), [], doc="CSV/Parquet: the feature columns; empty: every column but `label`"),
        "exclude": Key((list,), [], doc="CSV/Parquet: columns left out of the features (an ID, a saved index, a "
                                        "leak), with `features` empty"),
        "task": Key((str,), "auto", _one_of("auto", *TASKS),
                    doc="\"auto\": classification for integer, string or bool labels (or few distinct whole "
                        "numbers), else regression"),
        "val_fraction": Key(NUM, 0.15, _fraction,
                            doc="share of the samples held out for validation (early stopping, ranking, "
                                "ensemble selection, calibration); when the data gives its split without "
                                "validation rows: share of the training rows"),
        "calibration_holdout": Key((str, int, float), "auto", lambda v: None if v == "auto" or (
            not isinstance(v, (str, bool)) and 0.0 <= v <= 0.8) else 'must be "auto" or a share in [0, 0.8]',
            doc="share of the validation rows that members' early stopping never sees, kept for "
                "recalibrating the ensemble's uncertainty (split conformal's guarantee needs rows the members "
                "were not fitted to); selection still reads every validation row; \"auto\": half of them for "
                "regression, none for classification (whose temperature promises no coverage, and whose "
                "early stopping gains from every row); 0: recalibrate on every validation row; used when both "
                "parts have at least 20 rows, and not for streamed data"),
        "test_fraction": Key(NUM, 0.15, _fraction,
                             doc="share of the samples held out for the final test scores, used for nothing else; "
                                 "not with a split the data gives"),
        "test_source": Key((str,), "",
                           doc="your own split by files: the test rows, a file, folder or glob of the same format "
                               "and columns as `source` (whose rows are then the training rows; a streamed run "
                               "streams them too); \"\": none"),
        "val_source": Key((str,), "",
                          doc="with `test_source`: the validation rows, a file, folder or glob like `source`; \"\": "
                              "validation is drawn from the training rows (`val_fraction` of them)"),
        "split_column": Key((str,), "",
                            doc="your own split by a column (CSV/Parquet): its values \"train\", \"val\" (or "
                                "\"valid\", \"validation\") and \"test\" say each row's split; not a feature; no "
                                "\"val\" rows: validation is drawn from the train rows; \"\": none"),
        "split_file": Key((str,), "",
                          doc="your own split by row indices: an .npz with integer arrays `train`, `test` and "
                              "optionally `val` into the rows of `source` (relative to the config); \"\": none"),
        "normalize": Key((str,), "standard", _one_of("standard", "minmax", "none"),
                         doc="per-feature scaling fitted on the training split only: \"standard\" (mean 0, "
                             "std 1), \"minmax\" (0 to 1) or \"none\""),
        "impute": Key((str,), "none", _one_of("none", "median"),
                      doc="features missing in some rows (NaN, an empty cell): \"none\" refuses them, naming the "
                          "columns; \"median\" fills each with its feature's median over the training rows, and "
                          "`predict` fills new rows the same (said); data read whole only"),
        "reshape": Key((list,), None, _shape, nullable=True,
                       doc="the shape of one sample, e.g. [8, 8, 1] for Conv2D layers on 64 pixels; "
                           "unset: as read"),
        # many files, streaming, staging (datafeed.shards, datafeed.streaming, datafeed.staging)
        "sample_per_file": Key((str, bool), "auto", lambda v: None if v in ("auto", True, False) else
                               'must be "auto", true or false',
                               doc="with many files (`source` a folder or a glob): each file holds one sample "
                                   "(a volume) rather than samples along its first axis; \"auto\": when a file's "
                                   "target is a scalar"),
        "stream": Key((str, bool), "auto", lambda v: None if v in ("auto", True, False) else
                      'must be "auto", true or false',
                      doc="members read batches from the files instead of holding the data in memory; "
                          "\"auto\": when the features (as float32) exceed `memory_share` of a node's memory"),
        "memory_share": Key(NUM, 0.25, _fraction,
                            doc="`stream = \"auto\"` streams data larger than this share of a node's memory"),
        "node_memory_gb": Key(NUM, 0, _nonneg,
                              doc="a node's memory for `stream = \"auto\"` and `--check`, in GB; 0: this "
                                  "node's total memory"),
        "shuffle_buffer": Key((int,), 10000, _positive,
                              doc="streaming: rows shuffled together; an epoch reads the member's chunks in a seeded "
                                  "order, a window of this many rows at a time (read ahead in the background; at "
                                  "most two windows in memory), and serves them in random order"),
        "stage_dir": Key((str,), "",
                         doc="streaming: copy the files once per node to this node-local folder before training "
                             "and read them there (\"$TMPDIR\" expands); \"\": read them where they are"),
    }, doc="What to train on: rank 0 reads it once, splits it (seeded, stratified for classification) or "
           "takes the split the data gives (`test_source`, `split_column` or `split_file`), "
           "normalises it and broadcasts it to one shared copy per node."),
    "train": Table(dict(TRAIN_KEYS), doc="How every member trains; each `[[architectures]]` may override any of "
                                         "these for its own members."),
    "architectures": Table({
        "name": Key((str,), None, path_component_problem,
                    doc="the architecture's name in the leaderboard (unique; its members' files are named after "
                        "it); unset: arch0, arch1, ..."),
        "members": Key((int,), 1, _positive, doc="how many members (differently seeded) of this architecture"),
        "layers": Key((list,), None, _layers, nullable=True,
                      doc="the hidden layers, as layer tables (see Layers below); the output head is added"),
        "model": Key((str,), None, _model_ref, nullable=True,
                     doc="instead of `layers`: your builder \"package.module:function\", called as "
                         "`function(input_shape, n_outputs, **params)`, returning the whole Keras model "
                         "(softmax probabilities for classification)"),
        # folder put first on sys.path to import `model`'s module; load_config fills in the
        # config file's folder when the module lies there (as data paths resolve against it)
        "model_dir": Key((str,), None, nullable=True,
                         doc="folder `model`'s module is imported from (relative to the config); unset: the "
                             "config's folder when the module lies there, else PYTHONPATH"),
        "params": Key((dict,), {}, doc="keyword arguments for `model`'s builder"),
        **{k: Key(v.types, None, v.check, nullable=True, doc=f"this architecture's own `train.{k}`; unset: [train]'s")
           for k, v in TRAIN_KEYS.items()},
    }, array=True, doc="In mode \"ensemble\": one table per architecture, each with exactly one of `layers` "
                       "or `model`."),
    "ensemble": Table({
        "k": Key((int,), 5, _positive, doc="ensemble size for `method = \"top_k\"` (and for \"auto\" when the "
                                            "validation split has too few rows to cross-validate)"),
        "method": Key((str,), "auto", _one_of(*SELECTION_METHODS),
                      doc="\"auto\": \"shrunk\" unless another selection (the uniform average of the k best "
                          "for every k, greedy, bagged) beats it clearly on held-out validation folds (both on "
                          "`selection_metric`; one member only when it is significantly better); \"shrunk\": "
                          "bagged selection with its weights moved a quarter of the way toward the uniform "
                          "average of the members not clearly worse than the best on validation (by 3 standard "
                          "errors: a search's poor candidates are left out); \"greedy\": Caruana's forward "
                          "selection; \"bagged\": greedy on random halves of the candidates, averaged; "
                          "\"top_k\": the `k` best by `metric`, equal "
                          "weights"),
        "metric": Key((str,), "auto", _one_of("auto", *METRICS),
                      doc="what members are ranked by and the ensemble reports; \"auto\": accuracy "
                          "(classification), mse (regression)"),
        "selection_metric": Key((str,), "auto", _one_of("auto", *METRICS),
                                doc="the validation score selection optimises; \"auto\": a proper scoring rule "
                                    "(log loss; Gaussian NLL, or mse for mean-only regression members)"),
        "calibration": Key((str,), "auto", _one_of(*CALIBRATIONS),
                           doc="recalibration on the validation split: \"auto\" recalibrates regression "
                               "intervals (variance scaling or conformal, whichever covers held-out validation "
                               "folds closer to nominal; only widened when no rows were kept from early stopping, "
                               "`data.calibration_holdout`) and temperature-scales class probabilities when that "
                               "lowers the log loss of held-out validation folds (only softened, T >= 1, when no "
                               "rows were kept from early stopping, as classification keeps none by default)"),
        "candidates": Key((int,), 500, _positive,
                          doc="predictions are kept for the best this many members: the pool selection "
                              "chooses from"),
        "keep_models": Key((int,), 100, _nonneg,
                           doc="model files kept for the best this many members (plus the selected ones and a "
                               "multi-objective search's Pareto front)"),
    }, doc="How the ensemble is chosen from the trained members and what is kept of the rest."),
    "pbt": Table({
        "population": Key((int,), 0, _nonneg,
                          doc="members trained together, each held by one worker group for the whole run; 0: one "
                              "per worker group (at most that many: every member trains every round)"),
        "round_epochs": Key((int,), 2, _positive, doc="epochs each member trains between two exploit/explore steps"),
        "rounds": Key((int,), 10, _positive, doc="rounds in all: every member trains `rounds * round_epochs` epochs"),
        "time_limit": Key(NUM, None, _positive, nullable=True,
                          doc="seconds after which no new round starts (the run's own `runtime.time_limit` "
                              "counts too); unset: `rounds` alone"),
        "exploit": Key((str,), "truncation", _one_of(*PBT_EXPLOIT),
                       doc="\"truncation\" (PBT): the worst `fraction` copy a member of the best `fraction` that "
                           "scored better; "
                           "\"tournament\" (LTFB): random pairs, the loser copies the winner; \"none\": members "
                           "train independently (the control a benchmark compares with); a member whose loss "
                           "turned NaN copies a good one under every rule"),
        "fraction": Key(NUM, 0.25, lambda v: None if 0.0 < v <= 0.5 else "must be in (0, 0.5]",
                        doc="truncation: the share of the population that copies, and the share it copies from"),
        "explore": Key((str,), "perturb", _one_of(*PBT_EXPLORE),
                       doc="what a copying member does to the hyperparameters it copied: \"perturb\" multiplies "
                           "each by one of `factors`; \"resample\" draws each anew from its range with "
                           "probability `resample_probability`, else perturbs it"),
        "factors": Key((list,), [0.8, 1.25], lambda v: None if len(v) >= 1 and all(
            isinstance(f, (int, float)) and f > 0 for f in v) else "must list positive numbers, e.g. [0.8, 1.25]",
            doc="the factors a perturbed hyperparameter is multiplied by (one chosen at random)"),
        "resample_probability": Key(NUM, 0.25, lambda v: None if 0.0 <= v <= 1.0 else "must be in [0, 1]",
                                    doc="explore = \"resample\": the chance each hyperparameter is drawn anew"),
        "hyperparameters": Key((list,), ["learning_rate", "batch_size", "dropout"], lambda v: next(
            (f"has {h!r}, which is not one of {', '.join(PBT_HYPERPARAMETERS)}{suggest(h, PBT_HYPERPARAMETERS)}"
             for h in v if h not in PBT_HYPERPARAMETERS), None),
            doc="the hyperparameters that evolve, of " + ", ".join(f"\"{h}\"" for h in PBT_HYPERPARAMETERS)
                + " (dropout: every Dropout layer's rate; momentum: optimizers that have one); each member "
                  "evolves those its optimizer and layers expose"),
        "ranges": Key((dict,), {}, doc="per hyperparameter, [low, high]: the initial population draws it from "
                                       "there (log-uniform for learning_rate, batch_size, weight_decay), and "
                                       "explore keeps it inside; unset: it starts at its `[train]` / "
                                       "`[[architectures]]` value and stays within a wide default range"),
        "metric": Key((str,), "auto", _one_of("auto", *METRICS),
                      doc="the validation metric members are compared on; \"auto\": `ensemble.metric`"),
        "start": Key((str,), "",
                     doc="\"\": the population is dealt round-robin from `[[architectures]]` (their `members` "
                         "is not used); or a finished mode \"evolve\" run directory (relative to the config): "
                         "its best candidates, architecture and hyperparameters, start the population"),
    }, doc="mode \"pbt\": population-based training. Every round each member trains `round_epochs` "
           "epochs; then the weak copy the strong members' weights and optimizer state (sent from worker to "
           "worker) and perturb their hyperparameters. A copy takes the architecture with it, so a "
           "population may start from several architectures."),
    "online": Table({
        "buffer": Key((int,), 4096, _positive,
                      doc="samples the replay buffer holds; each new member trains on a snapshot of it"),
        "policy": Key((str,), "reservoir", _one_of("reservoir", "fifo"),
                      doc="which samples the full buffer keeps: \"reservoir\" a uniform sample of all received so "
                          "far; \"fifo\" the newest"),
        "when_behind": Key((str,), "replace", _one_of("replace", "drop"),
                           doc="when the simulation outpaces training (more than `max_unseen` samples arrived "
                               "since the last member started): \"replace\" still takes them (the policy decides "
                               "what leaves); \"drop\" drops and counts them until the next member starts"),
        "max_unseen": Key((int,), 0, _nonneg,
                          doc="samples that may arrive between two members' starts before training counts as "
                              "behind; 0: `buffer`"),
        "warmup": Key((int,), 512, _positive,
                      doc="samples received before the first member starts; they are written to "
                          "`data.source` (an .npz that does not exist yet), whose split gives the run's "
                          "normalisation and its fixed validation and test rows"),
        "publish_every": Key((int,), 2, _positive,
                             doc="members that finish (ok) between two published ensembles"),
        "window": Key((int,), 8, _nonneg,
                      doc="a published ensemble is selected among the newest this many members that finished "
                          "ok (the validation rows are the warm-up's, on which the oldest members, trained "
                          "on them, would always win); 0: among all"),
        "in_flight": Key((int,), 4, _positive,
                         doc="the simulation side's default: sample messages per rank sent and not yet "
                             "acknowledged; a batch sent beyond it is dropped and counted, never waited for"),
    }, doc="mode \"online\": members train while a simulation streams samples to them "
           "(`mpirun -n S sim.py : -n E python -m ensemble.run config.toml`; docs/insitu.md)."),
    # strategy, budget, and the settings the chosen strategy declares (evolve.strategies)
    "evolve": Key((dict,), {}, doc="mode \"evolve\": the search strategy, its budget and its own settings"),
    "search": Key((dict,), {}, doc="mode \"evolve\": the search space"),
    "runtime": Table({
        "threads": Key((int,), 1, _positive, doc="threads per rank for numpy and TensorFlow"),
        "log_level": Key((str,), "info", _one_of("debug", "info", "warning", "error"), doc="console log level"),
        "debug_log": Key((bool,), False,
                         doc="every rank also logs everything to `<run dir>/logs/rank-<rank>.log`"),
        "precision": Key((str,), "float32", _one_of("float32", "mixed_float16", "mixed_bfloat16"),
                         doc="Keras dtype policy for members: \"mixed_float16\" (NVIDIA/AMD tensor cores) or "
                             "\"mixed_bfloat16\" (A100/H100, MI200+, Intel GPUs, recent CPUs) compute in half "
                             "precision with float32 weights; the output head stays float32 (a user builder "
                             "should give its last layer dtype=\"float32\")"),
        "deterministic": Key((bool,), True,
                             doc="TensorFlow's op determinism: true, a member trained again with the same seed, "
                                 "data, software, hardware and `group_size` ends with the same weights, bit for "
                                 "bit (what resume and the tests rely on); false, GPU kernels may use atomics "
                                 "(faster, and some ops have no deterministic kernel at all) and the same member "
                                 "differs in the last bits from run to run; seeds are the same either way"),
        "jit_compile": Key((bool,), False,
                           doc="compile each member's train step with XLA: faster on GPUs for many models, a "
                               "compilation per member first"),
        "traced_models": Key((int,), 2, _nonneg,
                             doc="compiled models a worker keeps for the next member of the same architecture, "
                                 "which then trains without tracing its steps again (1-2 s a member for small "
                                 "networks) and ends bit for bit as on a new model; 0: off. A model whose variables "
                                 "and optimizer state take more than 256 MiB is not kept"),
        "pretrace": Key((bool,), False,
                        doc="while a worker trains a member, trace the steps of the next one it holds "
                            "(`specs_in_hand` of 2 or more) in a background thread; the same members either "
                            "way. It pays most where the node has a core to spare beside each worker (1.11x "
                            "evaluations/s in a search at -n 2 on 2 cores, 1.05x at -n 3); off unless set, as it "
                            "was not measured on GPUs, where the background model takes device memory while "
                            "it is traced"),
        "master_trains": Key((str, bool), "auto", lambda v: None if v in ("auto", True, False) else
                             'must be "auto", true or false',
                             doc="rank 0 also trains members, in a thread beside its scheduling loop, so its GPU "
                                 "is not idle; \"auto\": when rank 0 has a GPU (and `group_size` is 1), not on "
                                 "CPU-only nodes where it would take a core from the workers"),
        "ranks_per_gpu": Key((int,), 1, _positive,
                             doc="ranks sharing one GPU of a node (small members): rank r of a node uses GPU "
                                 "r // ranks_per_gpu, and TensorFlow grows its GPU memory as needed instead of "
                                 "taking the whole device"),
        "members_per_rank": Key((int,), 1, _positive,
                                doc="members a worker trains at once, packed into one graph (stacked weights, "
                                    "one batched matmul per layer for all): for small Dense/Dropout networks, "
                                    "which leave a core or a GPU mostly idle; each packed member's result equals "
                                    "what it gets alone. Mode \"ensemble\" only, float32; members that cannot "
                                    "be packed (other layers, a user builder) train one by one"),
        "group_size": Key((int,), 1, _positive,
                          doc="ranks per member: more than 1 trains each member data-parallel (gradients "
                              "allreduced); must divide the P-1 worker ranks"),
        "verify_broadcast": Key((bool,), False,
                                doc="compare the data every rank received with rank 0's (a checksum) before "
                                    "training"),
        "pretend_nodes": Key((int,), None, _positive, nullable=True,
                             doc="split the ranks into this many pretend nodes for the shared-memory data "
                                 "broadcast: tests many nodes on one machine"),
        "time_limit": Key(NUM, None, _positive, nullable=True,
                          doc="seconds the run may take: no member starts that would end after it, less "
                              "`finish_reserve` (the job's end counts as well: `ENSEMBLE_JOB_END_TIME`, set by the "
                              "`ensemble.jobscript` scripts, or Slurm's `SLURM_JOB_END_TIME`)"),
        "finish_reserve": Key(NUM, 30.0, _nonneg,
                              doc="seconds kept before the deadline for selection and writing the outputs"),
        "max_failed_share": Key(NUM, 0.5, lambda v: None if 0.0 < v <= 1.0 else "must be in (0, 1]",
                                doc="stop handing out members once more than this share has failed (judged "
                                    "from 3 failures on)"),
        "poll_max_sleep": Key(NUM, 0.05, _positive,
                              doc="longest nap, in seconds, between polls of a waiting rank (MPI waits probe "
                                  "and sleep instead of spinning a core)"),
        # "keras" trains; "rehearsal" sleeps instead (no TensorFlow): sizes and tests the control plane
        "trainer": Key((str,), "keras", lambda v: None if v in ("keras", "rehearsal") or _model_ref(v) is None
                       else 'must be "keras", "rehearsal" or a trainer factory "package.module:function"',
                       doc="\"keras\" trains; \"rehearsal\" sleeps instead (no TensorFlow, see `[rehearsal]`): "
                           "sizes and tests the control plane; or your own trainer, \"package.module:function\", "
                           "called as `function(cfg, meta, data, run_dir, rank, group)` on every worker and "
                           "returning `train(spec, report) -> record` (docs/architecture.md, the Trainer seam)"),
        "specs_in_hand": Key((str, int), "auto", lambda v: None if v == "auto" or (
            isinstance(v, int) and v > 0) else 'must be "auto" or a positive integer',
            doc="member specs a worker holds ahead, so it starts the next one without a round trip to the "
                "master; \"auto\": by how long members take"),
        "sub_masters": Key((str, int), "auto", _auto_or_whole("a whole number of sub-masters (0: one master)"),
            doc="a master hierarchy for short members at the largest scale: ranks 1..N are sub-masters, each "
                "serving its own share of the member groups (mode ensemble: each runs its own share of the "
                "members with its own journal, and the master only coordinates; mode evolve: each hands out the "
                "specs the master deals it and forwards the results); 0: one master serves every group; "
                "\"auto\": as many as "
                "keep each under half busy by the recorded master cost and the member time measured so far "
                "(mode ensemble; none before any is measured, and none below 64 groups a sub-master; "
                "docs/scale.md)"),
        "order": Key((str,), "cost", lambda v: None if v in ("cost", "list") else 'must be "cost" or "list"',
                     doc="mode \"ensemble\": the order members go out in; \"cost\": the longest predicted "
                         "first (each architecture's measured mean seconds; before any is measured, its epochs and "
                         "layer widths), so short members fill the end of the run; \"list\": as listed"),
        "tail_helpers": Key((int, str), "auto",
                            lambda v: None if v == "auto" or (isinstance(v, int) and not isinstance(v, bool)
                                                              and 0 <= v <= 63)
                            else 'must be "auto" or a whole number from 0 to 63',
                            doc="the end of the run: once nothing more is to be handed out, each idle worker joins "
                                "the member that has trained longest as a data-parallel helper (at its next epoch "
                                "end), up to this many helpers a member; 0: off. \"auto\": 7 from 32 workers on, "
                                "else off (a helped member is a valid member of its spec, not the bit-for-bit twin "
                                "of the unhelped one, and which members get help depends on timing). Ensemble and "
                                "evolve modes, Keras and rehearsal trainers, `group_size` 1, no packing"),
        "stop_quantile": Key(NUM, 0.5, lambda v: None if 0.0 < v <= 1.0 else "must be in (0, 1]",
                             nullable=True,
                             doc="a time-limited run stops handing out members once this quantile of the "
                                 "members' seconds so far would not end before the deadline (null: the slowest "
                                 "member seen); a member still training at the deadline is cut there, which "
                                 "costs no more than the idle worker would have (docs/scale.md measures it)"),
        "journal_sync_seconds": Key(NUM, 1.0, _nonneg,
                                    doc="journal lines are fsynced together at most this often (0: every "
                                        "line); a crash loses at most this many seconds of results"),
        "progress_seconds": Key(NUM, 10.0, _positive,
                                doc="seconds between progress summary lines (when there are too many members "
                                    "for a line each)"),
        "heartbeat_seconds": Key(NUM, 5.0, _positive,
                                 doc="seconds between rewrites of status.json, the heartbeat `ensemble status` "
                                     "reads; a job silent for three of them is reported dead"),
        "progress_lines": Key((int,), 100, _nonneg,
                              doc="up to this many members, a progress line per result; more: summary lines"),
    }, doc="Where and how the run executes; unlike the settings that shape the results, these (and "
           "`[rehearsal]`) may change on `--resume`."),
    # runtime.trainer = "rehearsal": how long each member "trains" and what it returns
    "rehearsal": Table({
        "seconds": Key(NUM, 1.0, _nonneg, doc="median seconds a member sleeps"),
        "spread": Key(NUM, 0.0, _nonneg,
                      doc="sigma of the log of the sleep (log-normal); 0: every member sleeps the median"),
        "replay": Key((str,), "",
                      doc="a journal.jsonl (or a run directory) whose members' times are slept again, by id"),
        "arch_seconds": Key((dict,), {}, _arch_seconds,
                            doc="median seconds per architecture name, for the architectures named (the others "
                                "sleep `seconds`): a rehearsal of an ensemble whose architectures differ in cost, "
                                "e.g. {small = 6, large = 60}"),
        "predictions": Key((bool,), True,
                           doc="return made-up validation and test predictions, so selection runs as after "
                               "training"),
        "failure_rate": Key(NUM, 0.0, lambda v: None if 0.0 <= v < 1.0 else "must be in [0, 1)",
                            doc="probability that a member fails"),
        "accuracy": Key(NUM, 0.8, lambda v: None if 0.0 <= v <= 1.0 else "must be in [0, 1]",
                        doc="about how good the made-up predictions are"),
    }, doc="`runtime.trainer = \"rehearsal\"`: how long each member \"trains\" and what it returns."),
    # where science teams already look: written by the master only (ensemble.results.tracking)
    "tracking": Table({
        "tensorboard": Key((bool,), False,
                           doc="write TensorBoard event files under the run directory (`tensorboard/`): each "
                               "member's per-epoch scalars and final metrics, the HParams dashboard, the "
                               "ensemble's metrics (extra `mpi-ensemble[tracking]`)"),
        "mlflow": Key((str,), "",
                      doc="an MLflow tracking URI (\"http://host:5000\", \"sqlite:///mlflow.db\"): one parent "
                          "run per job, one nested run per member, the ensemble's metrics, report.html and "
                          "ensemble.json; \"\": off (extra `mpi-ensemble[tracking]`)"),
        "mlflow_experiment": Key((str,), "mpi-ensemble", doc="the MLflow experiment the runs go in"),
        "queue_size": Key((int,), 100000, _positive,
                          doc="writes waiting for a slow tracking server; more are dropped (and counted)"),
        "batch_seconds": Key(NUM, 1.0, _positive,
                             doc="MLflow writes are gathered this long and sent together (log_batch)"),
        "give_up_seconds": Key(NUM, 60.0, _positive,
                               doc="a tracking server that refuses or fails this long is given up: what is "
                                   "queued and what comes later is dropped, with one warning"),
        "finish_seconds": Key(NUM, 15.0, _nonneg,
                              doc="at the run's end, the longest wait for queued tracking writes; the rest "
                                  "is dropped, and the console says how much"),
        "cpu_share": Key(NUM, 0.1, lambda v: None if 0.0 < v <= 1.0 else "must be in (0, 1]",
                         doc="while the run goes on, each destination's writer thread uses at most this share "
                             "of one core (after a write it rests in proportion to the CPU time the write "
                             "took): a writer busy beside ranks that wake thousands of times a second slows "
                             "them whatever its priority; 1: no limit, for a rank-0 node with cores to spare. "
                             "At the run's end it writes flat out for up to `finish_seconds`"),
    }, doc="TensorBoard and MLflow tracking. Only the master writes, from background threads: a slow or "
           "absent tracking server never fails or holds up the run. May change on `--resume`."),
})

#: ``[search]``: the meaning of each key ``evolve.space.SearchSpace`` takes (its defaults are
#: read from the class; docs/search.md says more); a test keeps the two key sets equal
SEARCH_DOCS = {
    "space": "the genome: \"auto\" is \"structured\" for sequences, images and volumes and \"free\" for "
             "tables; \"free\", a list of layer genes; or \"structured\", stages of conv blocks "
             "(normalisation, activation, optional residual) with downsampling and widening between them, then "
             "a reduction and dense layers, and for flat tables dense blocks (docs/search.md)",
    "layer_types": "choice: the kind of each layer gene, from conv, maxpool, avgpool, dense, dropout, batchnorm "
                   "(conv and pooling need samples with spatial axes: set `data.reshape`); structured: which "
                   "downsampling (maxpool, avgpool), normalisation, dropout and dense layers blocks may use",
    "min_depth": "free: fewest layer genes",
    "max_depth": "free: most layer genes",
    "stages": "structured, spatial input: count [min, max] of stages (each after the first may downsample)",
    "blocks": "structured: count [min, max] of conv blocks per stage, or of dense blocks for flat tables",
    "dense_layers": "structured, spatial input: count [min, max] of dense layers after the reduction",
    "units": "range [min, max]: dense widths, the powers of two in it",
    "filters": "range [min, max]: conv filters, the powers of two in it",
    "kernel_sizes": "choice: conv kernel sizes",
    "strides": "choice: conv strides (structured: those > 1 downsample at a stage's start)",
    "pool_sizes": "choice: pooling windows (>= 2; stride = window)",
    "activations": "choice: activations of conv and dense layers",
    "dropout": "range [min, max]: dropout rates, uniform in steps of 0.05",
    "skip_connections": "whether conv and dense genes may be residual",
    "learning_rate": "range [min, max]: learning rates, log-uniform",
    "batch_size": "choice: batch sizes",
    "optimizers": "choice: optimizers",
    "reductions": "choice: how spatial maps become a vector before dense layers (global_average, global_max, flatten)",
    "max_params": "a genome with more parameters (output layer included) is repaired or rejected",
}


def _message(path: str, msg: str) -> str:
    """``msg`` about ``path``; a message that starts with a backquote names a sub-key of it (each of
    several, "; `[1]...": a list's item, ``check_layer``)."""
    if not msg.startswith("`"):
        return f"`{path}` {msg}"
    return "; ".join("`" + path + part[1:] for part in msg.replace("; `[", "\0`[").split("\0"))


def _fail(path: str, msg: str) -> None:
    raise ConfigError(_message(path, msg))


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
        if hasattr(value, "shape") and hasattr(value, "dtype"):       # an array given for a file
            _fail(path, f"must be {names}, but got an array of shape {list(value.shape)}"
                  + ("; a file's path: save arrays with np.savez(path, x=x, y=y) and give the path"
                     if path == "data.source" else ""))
        shown = repr(value)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        _fail(path, f"must be {names}, but got {shown} ({type(value).__name__})")
    if isinstance(value, float) and not math.isfinite(value):
        _fail(path, f"must be finite, but got {value!r}")
    if spec.check:
        msg = spec.check(value)
        if msg:
            _fail(path, msg if msg.startswith("`") else f"{msg}, but got {value!r}")
    return value


def _resolve(path: str, table: Table, given: Any, found: Problems) -> Any:
    if table.array:
        items = given if given is not None else []
        if not isinstance(items, list) or not all(isinstance(t, dict) for t in items):
            found.add(_message(path, "must be an array of tables ([[" + path + "]])"), path)
            return []
        return [_resolve_table(f"{path}[{i}]", table, t, found) for i, t in enumerate(items)]
    if given is None:
        given = {}
    if not isinstance(given, dict):
        found.add(_message(path, f"must be a table ([{path}]), but got {given!r}"), path)
        given = {}
    return _resolve_table(path, table, given, found)


def _resolve_table(path: str, table: Table, given: dict, found: Problems) -> dict:
    """Every key of ``table``: as given if valid, else (noted in ``found``) its default."""
    for key in given:
        if key not in table.keys:
            where = f"{path}.{key}" if path else key
            found.add(f"unknown setting `{where}`{suggest(key, table.keys)}; "
                      f"allowed here: {', '.join(table.keys)}", where)
    out = {}
    for key, spec in table.keys.items():
        where = f"{path}.{key}" if path else key
        if isinstance(spec, Table):
            out[key] = _resolve(where, spec, given.get(key), found)
            continue
        out[key] = copy.deepcopy(spec.default)
        if key in given:
            with found.catch(where):
                out[key] = _check_value(where, spec, given[key])
    return out


def resolve_config(raw: dict, *, source: str = "config", saved: bool = False,
                   problems: Problems | None = None) -> RunConfig:
    """Validate a parsed config dict: the typed ``RunConfig`` with every default filled in
    (``resolve_dict`` says more)."""
    return RunConfig.from_dict(resolve_dict(raw, source=source, saved=saved, problems=problems))


def resolve_dict(raw: dict, *, source: str = "config", saved: bool = False,
                 problems: Problems | None = None) -> dict:
    """Validate a parsed config dict and return it with every default filled in.

    ``saved``: ``raw`` is a run directory's own config.toml; runs written before each
    strategy declared its settings recorded every strategy's settings in ``[evolve]``,
    and those of other strategies are dropped instead of refused.

    Raises one ``ConfigError`` naming every problem found; with ``problems`` given, they
    are gathered there instead and the config comes back with a default for each wrong
    setting (and without unknown ones).
    """
    found = Problems() if problems is None else problems
    cfg = _resolve("", SCHEMA, raw, found)
    if cfg["name"] is None:
        cfg["name"] = Path(source).stem or "run"
    data = cfg["data"]
    random_split = not any(data[k] for k in GIVEN_SPLIT)
    if (random_split and found.ok("data.val_fraction", "data.test_fraction")
            and data["val_fraction"] + data["test_fraction"] >= 0.9):
        found.add("`data.val_fraction` + `data.test_fraction` must leave at least 10% "
                  f"for training, but they sum to {data['val_fraction'] + data['test_fraction']}",
                  "data.val_fraction", "data.test_fraction")
    given = raw.get("data")
    check_given_split(data, set(given) if isinstance(given, dict) and not saved else set(), found)
    if data["features"] and data["exclude"] and found.ok("data.features", "data.exclude"):
        found.add("`data.features` lists the feature columns and `data.exclude` the columns left out of them: "
                  "give one of the two", "data.exclude")
    rt = cfg["runtime"]
    if rt["master_trains"] is True and rt["group_size"] > 1 and found.ok("runtime.master_trains",
                                                                         "runtime.group_size"):
        found.add("`runtime.master_trains = true` needs `runtime.group_size = 1`: the master trains alone, and a "
                  f"member trained by one rank would not match one trained by a group of {rt['group_size']}; "
                  "set master_trains = \"auto\" or false", "runtime.master_trains")
    if rt["members_per_rank"] > 1 and rt["group_size"] > 1 and found.ok("runtime.members_per_rank",
                                                                       "runtime.group_size"):
        found.add(f"`runtime.members_per_rank = {rt['members_per_rank']}` packs members on one rank, but "
                  f"`runtime.group_size = {rt['group_size']}` spreads each member over several: use one or the "
                  "other", "runtime.members_per_rank")
    if cfg["mode"] in ("ensemble", "online") and not cfg["architectures"] and found.ok("mode", "architectures"):
        found.add(f"mode \"{cfg['mode']}\" needs at least one [[architectures]] table with `layers` or `model`",
                  "architectures")
    if cfg["mode"] == "pbt":
        check_pbt(cfg, found)
    if not saved:
        check_tracking(cfg["tracking"], found)
    names = set()
    for i, arch in enumerate(cfg["architectures"]):
        where = f"architectures[{i}]"
        if found.ok(f"{where}.layers", f"{where}.model") and (arch["layers"] is None) == (arch["model"] is None):
            found.add(f"`{where}` needs exactly one of `layers` (a list of layer tables) "
                      f"or `model` (\"package.module:function\")", f"{where}.layers", f"{where}.model")
        if arch["model_dir"] is not None and arch["model"] is None and found.ok(f"{where}.model"):
            found.add(f"`{where}.model_dir` is where a user builder's module is imported from, "
                      "but the architecture has no `model`; remove it", f"{where}.model_dir")
        if arch["name"] is None:
            arch["name"] = f"arch{i}"
        if arch["name"] in names:
            found.add(f"`{where}.name` {arch['name']!r} is used twice; names must be unique", f"{where}.name")
        names.add(arch["name"])
    unknown = sorted(set(cfg["rehearsal"]["arch_seconds"]) - names)
    if unknown and cfg["mode"] == "ensemble" and found.ok("rehearsal.arch_seconds"):
        found.add(f"`rehearsal.arch_seconds` names {', '.join(map(repr, unknown))}, which no [[architectures]] "
                  f"table is called (they are {', '.join(map(repr, sorted(names))) or 'none'}); use their `name`s",
                  "rehearsal.arch_seconds")
    from evolve.space import SearchSpace
    for key in cfg["search"]:
        if key not in SearchSpace.KEYS:
            found.add(f"unknown setting `search.{key}`{suggest(key, SearchSpace.KEYS)}; "
                      f"allowed here: {', '.join(sorted(SearchSpace.KEYS))}", f"search.{key}")
    cfg["search"] = {k: v for k, v in cfg["search"].items() if k in SearchSpace.KEYS}
    if cfg["mode"] == "evolve" or not found.ok("mode"):     # the values too, before the data is read (its rank: later)
        for problem in SearchSpace.problems(cfg["search"]):
            found.add(problem, "search")
    if cfg["mode"] == "evolve" and "space" not in cfg["search"]:
        # written into the run's config, so a resume searches the genome its journal holds:
        # runs written before `search.space` defaulted to "auto" searched the free genome
        cfg["search"]["space"] = "free" if saved else SearchSpace.space
    cfg["evolve"] = resolve_evolve(cfg["evolve"], saved, found)
    if cfg["mode"] == "evolve" and found.ok("mode", "evolve.evaluations", "evolve.time_limit"):
        ev = cfg["evolve"]
        if ev["evaluations"] is None and ev["time_limit"] is None:
            found.add("mode \"evolve\" needs a budget: set `evolve.evaluations` "
                      "and/or `evolve.time_limit` (seconds)", "evolve.evaluations", "evolve.time_limit")
    rt = cfg["runtime"]
    if rt["time_limit"] is not None and found.ok("runtime.time_limit", "runtime.finish_reserve") \
            and rt["time_limit"] <= rt["finish_reserve"]:
        found.add(f"`runtime.time_limit` = {rt['time_limit']:g} s is not more than `runtime.finish_reserve` = "
                  f"{rt['finish_reserve']:g} s, the time kept at the end for selection and the outputs: no member "
                  "could start; raise `runtime.time_limit` or lower `runtime.finish_reserve`",
                  "runtime.time_limit", "runtime.finish_reserve")
    losses = {a["name"]: a["loss"] or cfg["train"]["loss"] for a in cfg["architectures"]}
    gaussian = [a["name"] for a in cfg["architectures"]
                if gaussian_head(losses[a["name"]], "regression", bool(a["model"]))]
    all_gaussian = (gaussian_head(cfg["train"]["loss"], "regression") if cfg["mode"] == "evolve"
                    else len(gaussian) == len(cfg["architectures"]))
    for key in ("metric", "selection_metric"):
        if cfg["ensemble"][key] == "nll" and not all_gaussian:
            found.add(f"`ensemble.{key}` \"nll\" needs every member to predict a variance: leave "
                      "`train.loss` at \"auto\" (or \"gaussian_nll\"; a user builder needs "
                      "\"gaussian_nll\") and no architecture overriding it with \"mse\"", f"ensemble.{key}")
    if data["task"] != "auto":
        check_task_settings(cfg, data["task"], "`data.task` is", found)
    if problems is None:
        found.raise_any()
    return cfg


#: the settings by which the data gives its own split, and how each names it
GIVEN_SPLIT = {"test_source": "separate files", "val_source": "separate files", "split_column": "a column",
               "split_file": "index arrays"}


def check_given_split(data: dict, given: set[str], found: Problems) -> None:
    """A split the data gives (``datafeed.splits``): one way at a time, and no random fraction
    for a split it gives. ``given``: the `[data]` keys the config sets (a saved config sets
    them all, so its fractions are not judged)."""
    used = [k for k in GIVEN_SPLIT if data[k] and found.ok(f"data.{k}")]
    ways: dict[str, str] = {}
    for key in used:
        ways.setdefault(GIVEN_SPLIT[key], key)
    if len(ways) > 1:
        first, *others = ways.values()
        for other in others:
            found.add(f"`data.{first}` and `data.{other}` both give the split ({GIVEN_SPLIT[first]} and "
                      f"{GIVEN_SPLIT[other]}); keep one of them", f"data.{other}")
        return
    if not used:
        return
    if used == ["val_source"]:
        found.add("`data.val_source` needs `data.test_source`: separate files give the test rows too "
                  "(`data.source` holds the training rows)", "data.val_source")
        return
    if "test_fraction" in given:
        found.add(f"`data.test_fraction` draws a random test split, but `data.{used[0]}` gives the test rows; "
                  "remove `data.test_fraction`", "data.test_fraction")
    if "val_fraction" in given and data["val_source"]:
        found.add("`data.val_fraction` draws validation rows from the training rows, but `data.val_source` "
                  "gives them; remove one of the two", "data.val_fraction")
    column = data["split_column"]
    if column and found.ok("data.label", "data.features"):
        if column in ([data["label"]] if isinstance(data["label"], str) else data["label"]):
            found.add(f"`data.split_column` {column!r} is the target column `data.label`; name the column that "
                      "says train/val/test", "data.split_column")
        elif column in data["features"]:
            found.add(f"`data.split_column` {column!r} is listed in `data.features`, but the split column is "
                      "not a feature; remove it from `data.features`", "data.features")


def check_tracking(tracking: dict, found: Problems) -> None:
    """`[tracking]` asks only for what is installed (the optional extra `mpi-ensemble[tracking]`)."""
    import importlib.util
    for key, package in (("tensorboard", "tensorboard"), ("mlflow", "mlflow")):
        if tracking[key] and importlib.util.find_spec(package) is None and found.ok(f"tracking.{key}"):
            found.add(f"`tracking.{key}` = {tracking[key]!r} needs the Python package {package!r}, which is not "
                      'installed: pip install "mpi-ensemble[tracking]" (or leave it unset)', f"tracking.{key}")
    uri = str(tracking["mlflow"])
    file_store = uri.startswith("file:") or (uri and "://" not in uri and not uri.startswith("databricks"))
    if file_store and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true") \
            and found.ok("tracking.mlflow"):
        found.add(f"`tracking.mlflow` = {uri!r} is a file store, which MLflow 3 refuses (every write would be "
                  "retried, then dropped); use a database, \"sqlite:////abs/path/mlflow.db\", or a server, "
                  "\"http://host:5000\" (or set MLFLOW_ALLOW_FILE_STORE=true where your MLflow still takes one)",
                  "tracking.mlflow")


def check_pbt(cfg: dict, found: Problems) -> None:
    """The `[pbt]` settings that depend on each other and on the rest of the config."""
    pbt = cfg["pbt"]
    if not pbt["start"] and not cfg["architectures"] and found.ok("mode", "architectures", "pbt.start"):
        found.add("mode \"pbt\" needs a starting population: at least one [[architectures]] table, or "
                  "`pbt.start` naming a finished mode \"evolve\" run directory", "architectures", "pbt.start")
    if cfg["runtime"]["master_trains"] is True and found.ok("runtime.master_trains"):
        found.add("`runtime.master_trains = true` does not work with mode \"pbt\": members send their weights "
                  "to each other over MPI, which the master's training thread may not call; set it to "
                  "\"auto\" or false", "runtime.master_trains")
    if cfg["runtime"]["trainer"] == "rehearsal" and found.ok("runtime.trainer"):
        found.add("mode \"pbt\" trains with Keras only: the rehearsal trainer has no weights to exchange; "
                  "set `runtime.trainer = \"keras\"`", "runtime.trainer")
    for name, bounds in pbt["ranges"].items():
        where = f"pbt.ranges.{name}"
        if name not in PBT_HYPERPARAMETERS:
            found.add(f"unknown hyperparameter `{where}`{suggest(name, PBT_HYPERPARAMETERS)}; allowed: "
                      f"{', '.join(PBT_HYPERPARAMETERS)}", where)
            continue
        if not (isinstance(bounds, list) and len(bounds) == 2 and all(
                isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds) and bounds[0] <= bounds[1]):
            found.add(f"`{where}` must be [low, high] with low <= high, but got {bounds!r}", where)
            continue
        low = bounds[0]
        if name in ("learning_rate", "batch_size", "weight_decay") and low <= 0:
            found.add(f"`{where}` is drawn log-uniformly, so it needs low > 0, but got {bounds!r}", where)
        elif name in ("dropout", "momentum") and not (0 <= low and bounds[1] < 1):
            found.add(f"`{where}` must lie in [0, 1), but got {bounds!r}", where)
        if name == "batch_size" and low < 1:
            found.add(f"`{where}` is a number of samples, at least 1, but got {bounds!r} (it trained at batch size "
                      "1); give whole numbers such as [16, 256]", where)


def check_task_settings(config: dict | RunConfig, task: str, why: str, problems: Problems | None = None) -> None:
    """The settings that depend on the task, once it is known (from `data.task`, or on
    rank 0 from the labels: ``why`` says which): a regression loss, the [ensemble] metrics
    and calibration. Raises a ``ConfigError`` naming each, or gathers them in ``problems``.
    ``config``: the resolved dict (while resolving) or the typed config."""
    cfg = config.to_dict() if isinstance(config, RunConfig) else config
    found = Problems() if problems is None else problems
    if task == "classification" and {"gaussian_nll", "mse"} & {
            cfg["train"]["loss"], *(a["loss"] for a in cfg["architectures"])}:
        found.add(f"`train.loss` \"gaussian_nll\" / \"mse\" is for regression, but {why} "
                  "\"classification\"; remove it or set `data.task = \"regression\"`", "train.loss")
    for table, key in (("ensemble", "metric"), ("ensemble", "selection_metric"), ("pbt", "metric")):
        metric = cfg[table][key]
        if metric != "auto" and METRICS[metric][0] != task:
            fits = [m for m, (t, _) in METRICS.items() if t == task]
            found.add(f"`{table}.{key}` {metric!r} is a {METRICS[metric][0]} metric, but "
                      f"{why} \"{task}\"; use one of {', '.join(repr(m) for m in fits)}", f"{table}.{key}")
    problem = calibration_problem(cfg["ensemble"]["calibration"], task)
    if problem:
        found.add(f"{problem} ({why} \"{task}\")", "ensemble.calibration")
    if problems is None:
        found.raise_any()


EVOLVE_KEYS = {
    "strategy": Key((str,), "regularized", doc="the search strategy; its own settings follow in the table below"),
    "evaluations": Key((int,), 40, _positive, nullable=True, doc="how many candidates the search trains"),
    "time_limit": Key(NUM, None, _positive, nullable=True,
                      doc="seconds after which the search breeds no more candidates; unset: no limit"),
    "discard": Key((str,), "off", _one_of("off", "asha", "median"),
                   doc="early discarding: \"asha\" stops a candidate at a rung (`discard_epochs` x "
                       "`discard_factor`^k epochs) unless it is among the best 1/`discard_factor` of those "
                       "that reached the rung; \"median\" stops one worse than the median of the others at "
                       "the same epoch; a stopped candidate counts as a low-fidelity evaluation and never "
                       "enters the ensemble"),
    "discard_epochs": Key((int,), 2, _positive,
                          doc="the first rung (epochs), and how often candidates report to the master"),
    "discard_factor": Key((int,), 3, lambda v: None if v >= 2 else "must be >= 2",
                          doc="asha's reduction factor: rungs this many times apart, the best 1/this go on"),
    "discard_grace": Key((int,), 5, _positive,
                         doc="nobody is stopped at an epoch until this many candidates have reported there"),
    "inherit": Key((bool,), False,
                   doc="weight inheritance: a child bred by mutation starts from its parent's trained weights in "
                       "every layer whose shape is unchanged (when the parent's model file is kept); the "
                       "journal says which layers"),
    "templates": Key((bool,), True,
                     doc="the first population holds small known-good networks for the input's kind, best first (for "
                         "sequences a one-convolution detector with global max pooling, a fully convolutional network "
                         "and a small CNN; for images and volumes the detector, a small CNN and a deeper pooled CNN; a "
                         "regression leaves the detector out; two MLPs for tables) next to the random ones"),
    "compact_start": Key((bool,), False,
                         doc="true: the first population's random genomes of a structured space are drawn small "
                             "(the fewest stages or one more, one block each, the fewest dense layers or one more; "
                             "the other genes from the whole space), to be grown by mutation; false: drawn from "
                             "the whole space (on `signals` the two searched alike: docs/search-benchmark.md)"),
    "start_from": Key((str,), "",
                      doc="\"\": none; or an earlier mode \"evolve\" run directory (relative to the config) on "
                          "samples of the same shape: its best candidates (up to half the first population) "
                          "are trained again as the first ones"),
    "surrogate": Key((str,), "off", _one_of("off", "forest"),
                     doc="\"forest\": a random forest of fitness over genome features screens bred children: "
                         "each child sent to train is the most promising (expected improvement) of "
                         "`surrogate_candidates` bred, none trained before; refitted in batches "
                         "(evolve.surrogate, docs/search-benchmark.md)"),
    "surrogate_candidates": Key((int,), 12, _positive,
                                doc="children bred and screened per child sent to train (`surrogate = \"forest\"`)"),
    "surrogate_min_results": Key((int,), 16, lambda v: None if v >= 2 else "must be >= 2",
                                 doc="results before the surrogate's first fit; children bred earlier are not "
                                     "screened"),
    "surrogate_ahead": Key((str, int), "auto", _auto_or_whole("an integer >= 0"),
                           doc="children kept bred and screened ahead by a helper process beside the master, "
                               "off its dispatch loop (`surrogate = \"forest\"`); 0: screened in the loop at each "
                               "ask, and the search is reproducible from its seed; \"auto\": in the loop below a "
                               "few hundred workers, ahead from there (evolve/screening.py)"),
    "surrogate_helpers": Key((int,), 1, _positive,
                             doc="helper processes that screen ahead (`surrogate_ahead`), each on a core of the "
                                 "master's node: one keeps up with about as many asks a second as the master "
                                 "could screen in its loop (docs/search-benchmark.md)"),
}


def resolve_evolve(given: dict, saved: bool = False, problems: Problems | None = None) -> dict:
    """The ``[evolve]`` table: strategy and budget, then the settings the chosen strategy
    declares (``evolve.strategies``), each checked and defaulted by that declaration.
    Problems are raised, or gathered in ``problems`` (a wrong strategy: the default one,
    whose settings are then not judged)."""
    from evolve.strategies import STRATEGIES
    found = Problems() if problems is None else problems
    strategy = given.get("strategy", EVOLVE_KEYS["strategy"].default)
    with found.catch("evolve.strategy"):
        _check_value("evolve.strategy", Key((str,), None, _one_of(*STRATEGIES)), strategy)
    if not found.ok("evolve.strategy"):
        strategy = EVOLVE_KEYS["strategy"].default
        given = {k: v for k, v in given.items() if k in EVOLVE_KEYS and k != "strategy"}
    settings = STRATEGIES[strategy].SETTINGS
    for key in list(given):
        if key in EVOLVE_KEYS or key in settings:
            continue
        given = {k: v for k, v in given.items() if k != key}
        owners = [name for name, cls in STRATEGIES.items() if key in cls.SETTINGS]
        if saved and owners:
            continue
        where = (f"; it is a setting of strategy {', '.join(repr(o) for o in owners)}" if owners
                 else suggest(key, [*EVOLVE_KEYS, *settings]))
        found.add(f"unknown setting `evolve.{key}` for strategy {strategy!r}{where}; "
                  f"allowed here: {', '.join([*EVOLVE_KEYS, *settings])}", f"evolve.{key}")
    out = {"strategy": strategy}
    for key, spec in EVOLVE_KEYS.items():
        if key != "strategy":
            out[key] = spec.default
            if key in given:
                with found.catch(f"evolve.{key}"):
                    out[key] = _check_value(f"evolve.{key}", spec, given[key])
    for key, setting in settings.items():
        value = given.get(key, setting.default)
        if isinstance(setting.default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        why = setting.problem(value)
        if why:
            found.add(_message(f"evolve.{key}", f"{why}, but got {value!r}"), f"evolve.{key}")
            value = setting.default
        out[key] = value
    if ("sample_size" in out and found.ok("evolve.sample_size", "evolve.population_size")
            and out["sample_size"] > out["population_size"]):
        found.add(f"`evolve.sample_size` ({out['sample_size']}) must be <= "
                  f"`evolve.population_size` ({out['population_size']})", "evolve.sample_size")
    if problems is None:
        found.raise_any()
    return out


def load_config(path: str | Path, problems: Problems | None = None) -> RunConfig:
    """Parse and validate the TOML file at ``path`` (relative data paths resolve against it).

    With ``problems`` the settings' problems are gathered there, as ``resolve_config`` does;
    a missing file or invalid TOML raises either way: nothing else can be checked then."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{str(path)!r} is a folder; give the config file (a .toml) in it")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text (byte {exc.start}); TOML files are "
                          "UTF-8: save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror}") from None
    found = Problems() if problems is None else problems
    cfg = _locate(resolve_dict(raw, source=str(path), problems=found), path.parent, found)
    if problems is None:
        found.raise_any()
    return RunConfig.from_dict(cfg)


def read_saved_config(path: str | Path) -> RunConfig:
    """A run directory's own ``config.toml`` (a resolved config, perhaps written by an older
    version: defaults of settings added since come back in). The one reader of that file."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"the run's config {str(path)!r} cannot be read: {exc}") from None
    return resolve_config(raw, source=str(path), saved=True)


def locate(cfg: RunConfig, base: Path, problems: Problems | None = None) -> RunConfig:
    """``cfg`` with its relative paths resolved against ``base`` (``_locate``)."""
    return RunConfig.from_dict(_locate(cfg.to_dict(), base, problems))


def _locate(cfg: dict, base: Path, problems: Problems | None = None) -> dict:
    """Resolve a config's relative paths (data source, builder folders, replay file) against
    ``base``: the config file's folder, or the working directory for a config given as a
    dict (``ensemble.run_config``). A builder folder that does not exist raises, or is
    noted in ``problems``."""
    path = Path(base) / "config.toml"
    for key in ("source", "test_source", "val_source", "split_file"):
        src = cfg["data"][key]
        if src and ("$" in src or src.startswith("~")):      # $SCRATCH/data.h5, ~/data.h5: as a shell would
            src = cfg["data"][key] = os.path.expanduser(os.path.expandvars(src))
        if src and ("/" in src or "." in src or key != "source" or (path.parent / src).is_dir()) \
                and not Path(src).is_absolute():               # a folder of shards may have a plain name
            near_config = path.parent / src
            # beside the config; else from the working directory when only there (made absolute, so a
            # resume or a job started elsewhere reads the same file)
            cfg["data"][key] = str((near_config if near_config.exists() or not Path(src).exists()
                                    else Path(src)).resolve())
    found = Problems() if problems is None else problems
    same_files(cfg["data"], found)
    for i, arch in enumerate(cfg["architectures"]):
        where = f"architectures[{i}].model_dir"
        with found.catch(where):
            arch["model_dir"] = builder_folder(arch, path.parent, where)
    replay = cfg["rehearsal"]["replay"]
    if replay and not Path(replay).is_absolute() and (path.parent / replay).exists():
        cfg["rehearsal"]["replay"] = str((path.parent / replay).resolve())
    start = cfg["pbt"]["start"]
    if start and not Path(start).is_absolute() and (path.parent / start).exists():
        cfg["pbt"]["start"] = str((path.parent / start).resolve())
    start = cfg["evolve"].get("start_from")
    if start and not Path(start).is_absolute() and (path.parent / start).exists():
        cfg["evolve"]["start_from"] = str((path.parent / start).resolve())
    if problems is None:
        found.raise_any()
    return cfg


def same_files(data: dict, found: Problems) -> None:
    """The test (or validation) rows' file must not be the training file (or the other): its
    scores would flatter the networks. Compared as the files are (paths resolved, links
    followed), so `d.csv`, `./d.csv` and `/abs/d.csv` are one file."""
    files = {k: os.path.realpath(data[k]) for k in ("source", "val_source", "test_source") if data[k]}
    for key, other in (("test_source", "source"), ("val_source", "source"), ("test_source", "val_source")):
        if key in files and files.get(other) == files[key] and found.ok(f"data.{key}"):
            found.add(f"`data.{key}` is `data.{other}` itself ({data[key]!r}): its rows would be "
                      f"{'training' if other == 'source' else 'validation'} rows too, and the scores on them "
                      f"flatter the networks; give `data.{key}` a file of other rows (or leave it out: a random "
                      "split is drawn)", f"data.{key}")


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


def member_train_settings(cfg: RunConfig, arch: ArchitectureConfig) -> TrainConfig:
    """The training settings of one architecture: its own where set, else the [train] ones."""
    return cfg.train.replace(**{k: getattr(arch, k) for k in TRAIN_KEYS if getattr(arch, k) is not None})


def dump_toml(config: RunConfig | dict) -> str:
    """Write a resolved config back as TOML (tables, arrays of tables, inline tables)."""
    cfg = config.to_dict() if isinstance(config, RunConfig) else config
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
