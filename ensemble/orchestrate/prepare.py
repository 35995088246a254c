"""Rank 0 before any training: read and check the data, the architectures and the search
space against it, and choose and create the run directory (or check the one resumed)."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from collections.abc import Collection
from pathlib import Path

import numpy as np

from ensemble.config import ConfigError, Problems, RunConfig, dump_toml, read_saved_config
from ensemble.config.schema import check_task_settings
from ensemble.results.lock import LOCK_NAME, RunLock, RunLocked
from ensemble.results.rundir import RunDirectory

log = logging.getLogger(__name__)


def prepare_run(cfg: RunConfig, args) -> tuple[dict, dict, RunDirectory, RunLock]:
    """Rank 0: read, check and prepare the data, check architectures, create the run
    directory and lock it (the caller releases the lock when the job ends). A resumed run
    keeps the split it was made with (its ``splits.npz``), whatever draws a split now."""
    lock = None
    try:
        given, then = None, None
        if args.resume:                         # locked first: the run's own split is read from it
            path, lock = choose_run_dir(cfg, args)
            check_same_run(cfg, RunDirectory(path))
            given = saved_split(RunDirectory(path))
            then = made_with(RunDirectory(path))
        from datafeed.prepare import with_run_task
        task_of_run = cfg.replace(data=with_run_task(cfg.data, then[0] if then else None))
        arrays, meta, rows = prepare_checked(task_of_run, given, RunDirectory(path) if args.resume else None)
        if then is not None:                    # the data its members were trained and scored on?
            from datafeed.prepare import as_run_made, data_changed
            from datafeed.readers import DataError
            why = data_changed(then[0], meta, then[1], (arrays["x_mean"], arrays["x_scale"]))
            if why:
                raise DataError(f"--resume: the data {cfg.data.source!r} is not what the run was trained on: "
                                f"{why}; resume with the data the run started with, or start a new run (its "
                                "finished members were scored on the other rows)")
            as_run_made(arrays, meta, then[0])  # a run before float64 targets goes on with its float32 ones
        if lock is None:                        # after every check: --overwrite deletes the old run
            path, lock = choose_run_dir(cfg, args)
        run_dir = RunDirectory(path)
        run_dir.write_text(run_dir.CONFIG, dump_toml(cfg))
        run_dir.write_json(run_dir.DATA, meta)
        run_dir.save_normalization(arrays["x_mean"], arrays["x_scale"])
        run_dir.write_npz(run_dir.SPLITS, **rows,    # row indices, so a baseline can use the same rows
                          split_from=np.array(meta["split_from"]))
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return arrays, meta, run_dir, lock


def run_notes(cfg: RunConfig, info: dict, arrays: dict, meta: dict) -> list[str]:
    """What ``check`` prints and the run logs of data that will train but may mislead: the data's
    own (``datafeed.prepare.data_notes``), a validation split too small to select on
    (``selection.few_rows_note``), targets whose scales make the metric about one of them
    (``metrics.scales_note``), a class too rare for accuracy to rank on (``metrics.rare_class_note``),
    the mode's own (``Mode.notes``: a search setting its genome does not read) and a layer list
    whose Dense reads one value at a time (``vocabulary.dense_on_values_note``)."""
    from datafeed.prepare import data_notes
    from ensemble.config.vocabulary import dense_on_values_note
    from ensemble.modes import mode_of
    from ensemble.results.selection import few_rows_note
    from ensemble.task import get_task
    from ensemble.task.metrics import rare_class_note, scales_note
    metric = get_task(meta["task"]).default_metric(cfg.ensemble.metric)
    mode = mode_of(cfg)
    notes = [*data_notes(info, arrays, meta), few_rows_note(meta["sizes"]["val"]),
             scales_note(metric, arrays["y_train"], meta.get("target_names", ())),
             rare_class_note(metric, arrays["y_train"], meta.get("class_names") or (), meta["sizes"]["test"]),
             *mode.notes(cfg, meta), unpacked_note(cfg),
             *(dense_on_values_note(arch.to_dict()["layers"], meta["input_shape"], f"architectures[{i}].layers")
               for i, arch in enumerate(cfg.architectures if mode.uses_architectures else ())
               if arch.layers)]
    return [n for n in notes if n]


def unpacked_note(cfg: RunConfig) -> str | None:
    """``runtime.members_per_rank`` > 1 where members do not pack (``Mode.packs``: another mode, or
    another precision): they train one at a time on each worker, which nothing said."""
    from ensemble.modes import mode_of
    k = cfg.runtime.members_per_rank
    if k <= 1 or mode_of(cfg).packs(cfg):
        return None
    return (f"`runtime.members_per_rank = {k}` packs no members here (mode {cfg.mode!r}, `runtime.precision = "
            f"\"{cfg.runtime.precision}\"`): members pack only in an ensemble of listed members in float32; each "
            "worker trains one at a time")


def made_with(run_dir: RunDirectory) -> tuple[dict, tuple[np.ndarray, np.ndarray]] | None:
    """A resumed run's ``data.json`` and normalisation, before they are written again; None for
    a run that holds neither (it stopped before its data was prepared)."""
    if not ((run_dir.path / run_dir.DATA).is_file() and (run_dir.path / run_dir.NORMALIZATION).is_file()):
        return None
    return json.loads((run_dir.path / run_dir.DATA).read_text()), run_dir.load_normalization()


def saved_split(run_dir: RunDirectory) -> tuple[dict[str, np.ndarray], bool] | None:
    """A run's own split (its ``splits.npz``) and whether its validation rows were drawn;
    None for a run written before splits were saved (it draws its split again)."""
    if not (run_dir.path / run_dir.SPLITS).is_file():
        return None
    drawn = True
    if (run_dir.path / run_dir.DATA).is_file():
        drawn = bool(json.loads((run_dir.path / run_dir.DATA).read_text()).get("val_drawn", True))
    return run_dir.load_splits(), drawn


def prepare_checked(cfg: RunConfig, given: tuple[dict[str, np.ndarray], bool] | None,
                    resumed: RunDirectory | None = None) -> tuple[dict, dict, dict]:
    """The data read, split (``given``: a resumed run's own, from ``saved_split``) and
    prepared, and every check that needs it: (arrays, meta, the split's rows). ``resumed``:
    the run ``--resume`` continues."""
    from datafeed.prepare import prepare_with_rows
    from datafeed.splits import read_data
    from datafeed.streaming import prepare_stream, read_whole_note, stream_plan
    from ensemble.config.vocabulary import check_input_rank
    from ensemble.modes import mode_of
    from ensemble.task.calibration import holdout_share
    plan = stream_plan(cfg.data)                # the files, when members stream them (issue 33)
    info: dict = {}                             # what the reader learnt of the columns (``data_notes``)
    if plan is not None:
        check_streaming(cfg)
        arrays, meta, rows = prepare_stream(plan, cfg.data, cfg.seed, given=given[0] if given else None)
    else:
        note = read_whole_note(cfg.data)
        if note:
            log.warning(note)
        got = read_data(cfg.data)               # the split too, where the data gives it
        arrays, meta, rows = prepare_with_rows(got.x, got.y, got.info, cfg.data, cfg.seed,
                                               given[0] if given else got.rows)
        info = {k: got.info.get(k) for k in ("id_like", "categories", "unseen_notes")}    # not its per-row
        # arrays: freed with `got`
        del got
        share = holdout_share(cfg.data.calibration_holdout, meta["task"])
        if share:                               # members stop early on the rest (calibration.holdout_rows)
            meta["calibration_holdout"] = share
    if given is not None:
        meta["val_drawn"] = given[1]
    leak = split_leak_note(cfg, rows)
    if leak:
        log.warning(leak)
    for note in run_notes(cfg, info, arrays, meta):
        log.warning(note)
    if cfg.data.task == "auto":                 # the task is known now: settings that depend on it
        check_task_settings(cfg, meta["task"], "the labels make this task")
    mode = mode_of(cfg)
    for i, arch in enumerate(cfg.architectures if mode.uses_architectures else ()):
        if arch.layers:
            msg = check_input_rank(arch.to_dict()["layers"], meta["input_shape"], f"architectures[{i}].layers")
            if msg:
                raise ConfigError(msg)
        else:
            from ensemble.train.architecture import ArchitectureError, load_builder
            try:
                load_builder(arch.model)
            except ArchitectureError as exc:
                raise ConfigError(f"`architectures[{i}].model`: {exc}") from None
    check_builds(cfg, arrays, meta)
    if cfg.runtime.trainer == "rehearsal" and cfg.rehearsal.replay:
        from ensemble.train.rehearsal import replay_durations
        try:
            replay_durations(cfg.rehearsal.replay)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    found = Problems()
    mode.preflight(cfg, meta, None, found, resumed)
    found.raise_any()
    return arrays, meta, rows


def split_leak_note(cfg: RunConfig, rows: dict[str, np.ndarray]) -> str | None:
    """When this run starts from an earlier one (``Mode.starts_from``) on the same data with
    another split: how many of this run's test rows the earlier run trained or selected on
    (its networks were chosen with them: this run's test score flatters them); None if none."""
    from ensemble.modes import mode_of
    start = mode_of(cfg).starts_from(cfg)
    if start is None:
        return None
    earlier = RunDirectory(Path(start[0]))
    try:
        theirs = earlier.load_splits()
        same_data = read_saved_config(earlier.path / earlier.CONFIG).data.source == cfg.data.source
    except (OSError, KeyError, ValueError, ConfigError):
        return None                               # not a run: the mode's own check says so
    seen = np.union1d(theirs["train"], theirs["val"])
    test = np.asarray(rows["test"])
    size = sum(len(np.asarray(rows[s])) for s in ("train", "val", "test"))
    if not same_data or size != len(seen) + len(theirs["test"]):      # other rows: nothing to compare
        return None
    shared = int(np.isin(test, seen).sum())
    if not shared:
        return None
    return (f"`{start[1]}` {start[0]!r} chose its networks on another split of the same data: {shared} of this run's "
            f"{len(test)} test rows were its training or validation rows, so this run's test scores flatter them; "
            "give both runs the same `seed` and split settings (or the data's own split)")


BUILD_CHECK_BATCH = 64          # samples the check runs each architecture on (at most one batch)


def check_streaming(cfg: RunConfig, problems: Problems | None = None) -> None:
    """Streamed data (``datafeed.streaming``) is read by the Keras trainer, one member at a time.
    Raises, or adds to ``problems`` (``ensemble check``: every problem at once)."""
    from ensemble.modes import mode_of
    found = Problems() if problems is None else problems
    if cfg.runtime.trainer not in ("keras", "rehearsal"):
        found.add(f"the data streams (`data.stream`), which the {cfg.runtime.trainer!r} trainer cannot read; set "
                  "`runtime.trainer = \"keras\"` or `data.stream = false`", "runtime.trainer")
    elif not mode_of(cfg).reads_streams or mode_of(cfg).packs(cfg):
        found.add("the data streams (`data.stream`), but packed members (`runtime.members_per_rank` > 1) and "
                  "mode \"pbt\" read it from memory; set `runtime.members_per_rank = 1` (not pbt) or "
                  "`data.stream = false`", "data.stream")
    if problems is None:
        found.raise_any()


def check_world(cfg: RunConfig, workers: int) -> None:
    """Every rank, before anything else: the job's size must suit the config (the worker
    ranks divide into groups; the mode's own needs, such as a population's groups)."""
    from ensemble.modes import mode_of
    g, found = cfg.runtime.group_size, Problems()
    if cfg.runtime.sub_masters not in (0, "auto"):      # a master hierarchy's sub-masters are not workers
        from ensemble.orchestrate.submasters import check_hierarchy
        workers -= check_hierarchy(cfg, workers, found)
    if g > 1 and workers == 0:
        found.add(f"`runtime.group_size` = {g}: the job has no worker ranks (mpirun -n P gives P-1 workers besides "
                  f"the master); start it with -n {1 + g} or more", "runtime.group_size")
    elif g > 1 and workers % g:
        found.add(f"`runtime.group_size` must divide the {workers} worker ranks (mpirun -n P gives P-1 workers "
                  f"besides the master), but got {g}; e.g. -n {1 + g * max(1, workers // g)}", "runtime.group_size")
    else:
        mode_of(cfg).preflight(cfg, None, max(1, workers // g), found)
    found.raise_any()


def check_builds(cfg: RunConfig, arrays: dict, meta: dict) -> None:
    """Build each user builder of ``[[architectures]]`` (``model = "pkg.mod:fn"``) once and run
    it on one batch of training data (``train.architecture.check_architecture``), so a
    builder that cannot work (no softmax, wrong shape, a bug) fails now, on rank 0, with
    its whole message, instead of in every member after training.

    Layer lists are not built: they get the task's own head, are checked without
    TensorFlow (``check_input_rank``), and importing TensorFlow on rank 0 delays the first
    member by about 2 s (digits at -n 3 on 2 cores, median of 7 paired runs). Nothing is
    built when the mode uses no architectures (a search's genomes are checked by
    ``evolve.decode``) or with another trainer than Keras (the rehearsal trains no networks)."""
    from ensemble.modes import mode_of
    if not mode_of(cfg).uses_architectures or cfg.runtime.trainer != "keras":
        return
    builders = [(i, arch) for i, arch in enumerate(cfg.architectures) if arch.model]
    if not builders:
        return
    from ensemble.config import member_train_settings
    from ensemble.runtime.env import configure_tensorflow
    from ensemble.runtime.watchdog import Watchdog, stuck_seconds
    from ensemble.train.architecture import ArchitectureError, check_architecture
    configure_tensorflow(cfg.runtime.threads)
    for i, arch in builders:
        spec = {"layers": None, "model": arch.model, "params": dict(arch.params),
                **member_train_settings(cfg, arch).to_dict()}
        x = arrays["x_train" if "x_train" in arrays else "x_head"][:min(spec["batch_size"], BUILD_CHECK_BATCH)]
        bound = stuck_seconds(spec.get("member_time_limit"))    # as a member's: a minute at least
        try:
            with Watchdog(bound, f"`architectures[{i}]` ({arch.name}): its builder {arch.model!r} did not return "
                                 f"within {bound or 0:g} s (past `train.member_time_limit`) while rank 0 built "
                                 "it on one batch before any member trains; the job ends: make the builder return"):
                check_architecture(spec, x, meta["n_outputs"], meta["task"])
        except ArchitectureError as exc:
            raise ConfigError(f"`architectures[{i}]` ({arch.name}): {exc}") from None


RESULT_SETTINGS = ("mode", "seed", "data", "train", "architectures", "evolve", "search", "pbt", "ensemble")


def config_differences(cfg: RunConfig, run_dir: RunDirectory | Path) -> str | None:
    """The settings of ``cfg`` that change a result and differ from the run's saved config.toml,
    each with both values (at most 8 shown); None when none differs or the run saved none."""
    run_dir = RunDirectory(run_dir) if not isinstance(run_dir, RunDirectory) else run_dir
    saved_path = run_dir / run_dir.CONFIG
    if not saved_path.exists():
        return None
    saved, given = read_saved_config(saved_path).to_dict(), cfg.to_dict()
    from ensemble.sources.earlier import started_from
    kept = set(started_from(run_dir))               # read from the run's copy: where it came from is no matter
    changed = [line for key in RESULT_SETTINGS
               for line in _differences(key, _comparable(key, saved[key], kept), _comparable(key, given[key], kept))]
    if not changed:
        return None
    return "; ".join(changed[:8]) + (f"; and {len(changed) - 8} more" if len(changed) > 8 else "")


def check_same_run(cfg: RunConfig, run_dir: RunDirectory | Path) -> None:
    """--resume must not mix members of two different configs in one run."""
    run_dir = RunDirectory(run_dir) if not isinstance(run_dir, RunDirectory) else run_dir
    shown = config_differences(cfg, run_dir)
    if shown:
        raise ConfigError(f"--resume: the config differs from the run's saved config.toml in {str(run_dir.path)!r}: "
                          f"{shown}. Resume with the config the run started with (only [runtime] settings may "
                          "change; its config.toml is a copy), or start a new run without --resume")


def _differences(key: str, then, now) -> list[str]:
    """Each setting under ``key`` whose value differs, as "`key`: then -> now" (leaves of tables;
    a list of tables, such as the architectures, compared table by table)."""
    if then == now:
        return []
    if isinstance(then, dict) and isinstance(now, dict):
        return [line for k in dict.fromkeys([*then, *now])
                for line in _differences(f"{key}.{k}", then.get(k, _ABSENT), now.get(k, _ABSENT))]
    if isinstance(then, list) and isinstance(now, list) and len(then) == len(now) \
            and all(isinstance(v, dict) for v in [*then, *now]):
        return [line for i, (a, b) in enumerate(zip(then, now)) for line in _differences(f"{key}[{i}]", a, b)]
    return [f"`{key}` {_shown(then)} in the run, {_shown(now)} now"]


_ABSENT = object()


def _shown(value) -> str:
    text = "(not set)" if value is _ABSENT else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: ``[data]`` settings that say where files are, not what they hold: a resume compares the data itself
#: (``datafeed.prepare.data_changed``: digests of the targets and features, sizes, classes, normalisation)
DATA_PATHS = ("source", "test_source", "val_source", "split_file")


def _comparable(key: str, value, kept: Collection[str] = ()):
    """A setting as --resume compares it: where a builder's module is imported from
    (``model_dir``, absolute, so it moves with the config file), where the data files are
    (``DATA_PATHS``, absolute: a project moved to another file system) and where an earlier run
    was whose starting points the run kept (``kept``: "evolve.start_from", "pbt.start";
    ``sources.earlier.kept``: it may since be moved or gone) are not part of the run."""
    if key == "data":
        return {k: v for k, v in value.items() if k not in DATA_PATHS}
    if isinstance(value, dict) and any(k.startswith(f"{key}.") for k in kept):
        return {k: v for k, v in value.items() if f"{key}.{k}" not in kept}
    if key != "architectures":
        return value
    return [{k: v for k, v in arch.items() if k != "model_dir"} for arch in value]


def choose_run_dir(cfg: RunConfig, args: argparse.Namespace) -> tuple[Path, RunLock]:
    """Where this run writes, locked for this job (``results.lock``); never silently mixes
    two runs in one directory, never runs two jobs on one, and ``--overwrite`` deletes only
    a run of this project."""
    run_dir = Path(args.run_dir) if args.run_dir else Path(cfg.output_dir) / cfg.name
    if args.resume:
        run_dir = resume_dir(cfg, args.run_dir)
        return run_dir, take_lock(run_dir)
    if args.overwrite and run_dir.exists():
        if not is_run_directory(run_dir):
            raise RunDirError(f"--overwrite: {str(run_dir)!r} is not a run directory of ensemble.run (no "
                              "config.toml with journal.jsonl or data.json in it), so it is not deleted; "
                              "choose another --run-dir or `name`, or remove the folder yourself")
        from ensemble.modes import mode_of
        start = mode_of(cfg).starts_from(cfg)
        if start and Path(start[0]).resolve() == run_dir.resolve():
            raise RunDirError(f"--overwrite would delete {str(run_dir)!r}, the run `{start[1]}` starts from; give this "
                              "run another `name` (or --run-dir), or leave out --overwrite: a new run then goes to "
                              f"{str(run_dir) + '-2'!r} and the earlier one stays")
        lock = take_lock(run_dir)                   # not while another job writes it
        for child in run_dir.iterdir():
            if child.name != LOCK_NAME:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        return run_dir, lock
    if not args.run_dir:                            # the first of <name>, <name>-2, ... no other run holds,
        base, n = run_dir, 2                        # nor another new job is starting in (a job array)
        while True:
            if not RunDirectory(run_dir).has_journal():
                run_dir.mkdir(parents=True, exist_ok=True)
                try:
                    lock = RunLock(run_dir)
                    lock.acquire()
                except RunLocked:
                    pass
                else:
                    if not RunDirectory(run_dir).has_journal():
                        return run_dir, lock
                    lock.release()
            run_dir, n = base.parent / f"{base.name}-{n}", n + 1
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = take_lock(run_dir)
    if RunDirectory(run_dir).has_journal():          # checked under the lock: a run another job began
        lock.release()
        raise RunDirError(f"{'--run-dir ' if args.run_dir else ''}{str(run_dir)!r} already holds a run; add "
                          "--resume to continue it or --overwrite to replace it")
    return run_dir, lock


def resume_dir(cfg: RunConfig, run_dir: str | None) -> Path:
    """The run ``--resume`` continues: ``run_dir`` (``--run-dir``), else this config's
    (``run_to_resume``); one without a journal is a ``RunDirError``."""
    path = Path(run_dir) if run_dir else run_to_resume(Path(cfg.output_dir) / cfg.name)
    if not RunDirectory(path).has_journal():
        raise RunDirError(f"--resume: {str(path)!r} holds no journal.jsonl to resume from; "
                          "start the run without --resume")
    return path


def run_to_resume(base: Path) -> Path:
    """``--resume`` without ``--run-dir``: the run of this config's name that is not done.
    A new run beside a finished one went to ``<name>-2`` (and on), so the killed run may be
    there, not in ``<name>``: the one unfinished run among them is resumed (said in the
    log); several unfinished ones are an error listing them; when all are done, the last."""
    from ensemble.results.heartbeat import read_heartbeat
    runs = [base] if RunDirectory(base).has_journal() else []
    n = 2
    while (base.parent / f"{base.name}-{n}").exists():
        if RunDirectory(base.parent / f"{base.name}-{n}").has_journal():
            runs.append(base.parent / f"{base.name}-{n}")
        n += 1
    unfinished = [r for r in runs if (read_heartbeat(r) or {}).get("state") != "done"
                  or not (r / RunDirectory.ENSEMBLE).is_file()]
    if len(unfinished) > 1:
        raise RunDirError(f"--resume: {len(unfinished)} runs of {base.name!r} are unfinished ("
                          + ", ".join(map(str, unfinished)) + "); say which with --run-dir")
    chosen = unfinished[0] if unfinished else runs[-1] if runs else base
    if chosen != base:
        log.warning(f"--resume: resuming {chosen}, the {'unfinished' if unfinished else 'latest'} run of "
                    f"{base.name!r} ({len(runs)} in {base.parent}); pass --run-dir to choose another")
    return chosen


def is_run_directory(path: Path) -> bool:
    """Whether ``path`` is (recognisably) a run directory of this project, or empty."""
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    return not names or names <= {LOCK_NAME} or (
        RunDirectory.CONFIG in names and bool({RunDirectory.JOURNAL, RunDirectory.DATA} & names))


class RunDirError(ConfigError):
    """The run directory will not do (in use by another job, holds another run, nothing to
    resume): not a mistake in the config, and said as such."""


def take_lock(run_dir: Path) -> RunLock:
    """This job's lock on ``run_dir``; another job's lock is a ``RunDirError`` naming it."""
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except RunLocked as exc:
        raise RunDirError(str(exc)) from None
    return lock
