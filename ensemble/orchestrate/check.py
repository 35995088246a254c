"""``python -m ensemble.run CONFIG --check``: what a run would stop on, found before the job
is submitted, on one process with no MPI (a login node will do).

It parses and validates the config, reads and prepares the data as rank 0 would, builds
every architecture (for ``mode = "evolve"``, a seeded sample of the search space) on one
batch of training data, and estimates each member's memory. Every problem is gathered
(``ensemble.config.Problems``) instead of stopping at the first: a wrong setting falls
back to its default and the checks that read it are skipped, so each mistake is listed
once. The report goes to stdout, the problems numbered at its end; the exit status is 0
with none, else 2 (the run's own status for a config error).

Memory per member, about (float32, 4 bytes a value; on every rank of a member group; with
``runtime.precision = "mixed_*"`` the activations take 2 bytes a value):

    weights      params x 4 B                     (moving statistics included)
    gradients    trainable params x 4 B
    optimizer    trainable params x 4 B x slots   (adam, adamw, nadam, adamax, adadelta 2;
                                                   rmsprop, adagrad, lion 1; sgd 0)
    activations  (input + every layer's output, per sample) x 4 B
                 x max(2 x batch_size / group_size, 512)

Activations: a training batch (a group's rank holds its shard of it) keeps the forward
values for the backward pass, about twice them; validation and prediction run forward
only, in batches of 512. Per node: the prepared data once (every split, shared by the
node's ranks), plus the largest member per training rank, plus the TensorFlow runtime
(a few hundred MB of host memory a rank, not counted). An estimate to size a job by, not
a measurement: the framework's buffers and the allocator's rounding come on top.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from ensemble.config import ConfigError, Problems, RunConfig, load_config
from ensemble.config.schema import check_task_settings
from ensemble.config.vocabulary import OPTIMIZER_SLOTS, VALUE_BYTES
from ensemble.modes import mode_of, unread_tables
from ensemble.orchestrate.prepare import BUILD_CHECK_BATCH
from ensemble.results.records import Counts
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.env import configure_tensorflow, set_thread_env
from ensemble.runtime.watchdog import Watchdog, stuck_seconds

EXIT_PROBLEMS = 2               # ensemble.run.EXIT_CONFIG: the run would stop with a config error
PREDICT_BATCH = 512             # the validation and prediction batch (forward only)
READ_SETTINGS = tuple(f"data.{k}" for k in ("source", "format", "x", "y", "label", "features", "test_source",
                                             "val_source", "split_column", "split_file"))
SHAPE_SETTINGS = ("data.reshape",)


def main(argv: list[str] | None = None) -> int:
    """``ensemble check CONFIG``: the check alone, with its own arguments (``python -m ensemble.run
    CONFIG --check`` does the same)."""
    import argparse
    p = argparse.ArgumentParser(prog="ensemble check",
                                description="Check a config, its data and every network without training: "
                                            "no MPI, no GPU, one process (a login node will do). Exit status "
                                            "0 when a run would start, 2 with the problems listed.")
    p.add_argument("config", help="TOML config file")
    p.add_argument("--resume", action="store_true",
                   help="also check that the run --resume would continue was made with these settings")
    p.add_argument("--run-dir", help="with --resume: the run to continue (default: as --resume finds it)")
    args = p.parse_args(argv)
    return check_main(args.config, resume=args.resume, run_dir=args.run_dir)


def check_main(config_path: str, resume: bool = False, run_dir: str | None = None) -> int:
    """Check ``config_path`` as a run would, report, and return the exit status (0 or 2);
    ``resume`` (``ensemble.run CONFIG --resume --check``): also that the run ``--resume`` would
    continue (``run_dir``, else this config's) was made with these settings."""
    set_thread_env(1)                                   # one batch per model: a login node's share
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")  # and no GPU taken (or waited for)
    print(f"Checking {config_path}: nothing is trained, no MPI.")
    found = Problems()
    try:
        cfg = load_config(config_path, found)
    except ConfigError as exc:                          # no file or no TOML: nothing else to check
        return finish(exc.problems, config_path)
    mode = mode_of(cfg)
    describe_config(cfg, found)
    from ensemble.orchestrate.submasters import suited
    suited(cfg, found)                                  # settings sub-masters cannot run with, at any -n
    resumed = check_resume(cfg, run_dir, found) if resume else None
    then = None                                         # the resumed run's data.json and normalisation
    if resumed is not None:                             # the data as the run reads it again: its own task
        from datafeed.prepare import with_run_task
        from ensemble.orchestrate.prepare import made_with
        then = made_with(RunDirectory(resumed))
        cfg = cfg.replace(data=with_run_task(cfg.data, then[0] if then else None))
    for note in unread_tables(cfg, config_path):
        print(f"  note: {note}")
    prepared = check_data(cfg, found)
    if prepared is not None or mode.writes_source:      # mode "online": its data comes once the run starts
        mode.preflight(cfg, prepared[1] if prepared is not None else None, None, found,
                       RunDirectory(resumed) if resumed is not None else None)
    if prepared is not None and resumed is not None and then is not None:
        resumed_data(cfg, resumed, then, *prepared, found)
    members: list[dict] = []
    if prepared is None:
        print("\nArchitectures: not built without the data (their input shape and outputs come from it).")
    elif cfg.runtime.trainer == "rehearsal":
        print("\nArchitectures: not built; `runtime.trainer = \"rehearsal\"` trains no networks.")
    elif not found.ok(*SHAPE_SETTINGS):
        print("\nArchitectures: not built until `data.reshape` is fixed (it sets their input shape).")
    else:
        configure_tensorflow(1)
        members = check_samples(cfg, *prepared, found)
    if cfg.runtime.trainer == "rehearsal" and cfg.rehearsal.replay:
        from ensemble.train.rehearsal import replay_durations
        try:
            replay_durations(cfg.rehearsal.replay)
        except ValueError as exc:
            found.add(str(exc), "rehearsal.replay")
    if prepared is not None:
        describe_memory(cfg, prepared[0], members, prepared[1].get("rank_bytes"))
    describe_runtime(cfg, resumed)
    again = config_path + (" --resume" if resume else "") + (f" --run-dir {run_dir}" if resume and run_dir else "")
    return finish(found.messages, again, mode.launch(again))


def check_resume(cfg: RunConfig, run_dir: str | None, found: Problems) -> Path | None:
    """What ``--resume`` would refuse before training: no run to continue, or one made with other
    settings (``prepare.check_same_run``). Returns the run it would continue, when there is one."""
    from ensemble.orchestrate.prepare import check_same_run, resume_dir
    try:
        path = resume_dir(cfg, run_dir)
        check_same_run(cfg, path)
        print(f"Resume: {str(path)!r}, made with these settings")
        return path
    except ConfigError as exc:
        for problem in exc.problems:
            found.add(problem)
    return None


def resumed_data(cfg: RunConfig, path: Path, then: tuple, arrays: dict, meta: dict, found: Problems) -> None:
    """``--resume``'s check of the data against the run's own (``then``: its data.json and
    normalisation, ``prepare.made_with``; ``datafeed.prepare.data_changed``)."""
    from datafeed.prepare import data_changed
    now = then[1] if meta.get("stream") or "x_mean" not in arrays else (arrays["x_mean"], arrays["x_scale"])
    why = data_changed(then[0], meta, then[1], now)     # streamed: check skips the pass that normalises
    if why:
        found.add(f"--resume: the data {cfg.data.source!r} is not what the run in {str(path)!r} was trained on: "
                  f"{why}; resume with the data the run started with, or start a new run", "data.source")


def describe_config(cfg: RunConfig, found: Problems) -> None:
    state = ("valid" if not found else f"{len(found)} problem(s) in its settings, listed at the end with any the "
             "data and networks add; those settings show their defaults here")
    print(f"\nConfig: {state}. Run {cfg.name!r}, mode {cfg.mode!r} ({mode_of(cfg).describe(cfg)}), seed {cfg.seed}, "
          f"run directory {os.path.join(cfg.output_dir, cfg.name)}")


def check_data(cfg: RunConfig, found: Problems) -> tuple[dict, dict] | None:
    """Read and prepare the data as rank 0 does; print shapes, task, classes and splits.
    Returns ``(arrays, meta)``, or None when it cannot be read (the problem is noted)."""
    data = cfg.data
    if not found.ok(*READ_SETTINGS):
        print("\nData: not read until the [data] settings above are fixed.")
        return None
    if mode_of(cfg).writes_source and data.source and not os.path.exists(data.source):
        print(f"\nData: {data.source} does not exist yet: the run writes it from the simulation's first "
              f"samples (mode {cfg.mode!r}); the data checks need a run's first samples (check again after "
              "a run has started, or put samples there).")
        return None
    from datafeed.prepare import prepare_with_rows
    from datafeed.readers import DataError, detect_format
    from datafeed.splits import describe_split, read_data
    from datafeed.streaming import memory_plan, prepare_stream, read_whole_note, stream_plan
    t0, fmt, plan, sizing = time.monotonic(), data.format, None, None
    try:
        fmt = detect_format(data)
        sizing = memory_plan(data)
        plan = stream_plan(data)
        if plan is not None:                    # streams: the targets and the split, not the features
            return check_streamed(cfg, plan, sizing, found, prepare_stream, describe_split)
        note = read_whole_note(data)
        if note:
            print(f"\nNote: {note}. Reading it now for the check.", flush=True)
        got = read_data(data)                   # and the split the data gives, checked
        x, y = got.x, got.y
    except DataError as exc:
        found.add(str(exc), "data.source")
    except Exception as exc:            # noqa: BLE001 - a file that is not what its suffix says
        found.add(f"`data.source` {data.source!r} cannot be read as {fmt}: {type(exc).__name__}: {exc}; "
                  "check the file or set `data.format`", "data.source")
    if not found.ok("data.source"):
        print(f"\nData: {data.source} cannot be read (see the problems).")
        return None
    seconds = time.monotonic() - t0
    try:
        arrays, meta, _ = prepare_with_rows(x, y, got.info, data, cfg.seed, got.rows)
    except ValueError as exc:
        found.add(str(exc), "data")
        print(f"\nData: {data.source} was read but cannot be used (see the problems).")
        return None
    if data.task == "auto" and found.ok("data.task"):
        check_task_settings(cfg, meta["task"], "the labels make this task", found)
    import numpy as np
    files = "".join(f" + {key} {path}" for key, path in (("val_source", data.val_source),
                                                          ("test_source", data.test_source)) if path)
    print(f"\nData: {data.source}{files} ({'built-in' if fmt == 'builtin' else fmt}), read in {seconds:.1f} s")
    print(f"  features {list(np.shape(x))} {np.asarray(x).dtype}, targets {list(np.shape(y))}: "
          f"{len(x)} samples; one sample as the networks see it: {meta['input_shape']}")
    names = got.info.get("feature_names") or []
    if names:
        shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
        print(f"  feature columns: {shown}")
    task_from = "from `data.task`" if data.task != "auto" else "inferred from the labels"
    if data.task == "auto" and meta["task"] == "classification" and np.asarray(y).dtype.kind in "iuf" \
            and meta["n_outputs"] > 10:
        task_from += (f": whole numbers with {meta['n_outputs']} values; if they are quantities (counts), "
                      "set `data.task = \"regression\"`")
    print(task_line(meta, arrays, task_from))
    from ensemble.orchestrate.prepare import run_notes
    for note in run_notes(cfg, got.info, arrays, meta):
        print(f"  note: {note}")
    sizes = meta["sizes"]
    print(f"  splits: train {sizes['train']}, validation {sizes['val']}, test {sizes['test']}, "
          f"{describe_split(meta, data, cfg.seed)}; normalisation {data.normalize!r}, fitted on train")
    describe_size(sizing, sum(a.nbytes for k, a in arrays.items() if k.startswith("x_")), data)
    return arrays, meta


def describe_size(sizing: dict | None, nbytes: int, data) -> None:
    """The data's size, and whether it streams (``data.stream``, ``datafeed.streaming``)."""
    if sizing is None:
        print(f"  size: {_bytes(nbytes)} as float32; read whole (a built-in dataset or a table format), "
              "not streamed")
        return
    share = f"{sizing['share']:g} of a node's {_bytes(sizing['node_memory'])}"
    how = ("streams: members read it from the files" if sizing["streams"]
           else "held in memory, one shared copy per node")
    print(f"  size: {sizing['rows']} samples in {sizing['files']} file(s), {_bytes(sizing['bytes'])} as float32, "
          f"{_bytes(sizing['file_bytes'])} on disk; `data.memory_share` {share}: {how} "
          f"(`data.stream` = {str(data.stream).lower() if isinstance(data.stream, bool) else repr(data.stream)})")


#: ``ensemble check`` reads streamed features whole (the run's first pass: NaN/inf) up to this size
CHECK_READS_BYTES = 2 << 30


def check_streamed(cfg: RunConfig, plan, sizing: dict, found: Problems, prepare_stream, describe_split):
    """``check_data`` for data that streams: the targets, the split and the files, checked as
    rank 0 does, without the pass over the features that fits the normalisation at the run's start."""
    from ensemble.orchestrate.prepare import check_streaming
    data = cfg.data
    check_streaming(cfg, found)                    # what the run refuses to stream
    whole = sizing is not None and sizing["bytes"] <= CHECK_READS_BYTES
    arrays, meta, _ = prepare_stream(plan, data, cfg.seed, normalise=whole)
    if data.task == "auto" and found.ok("data.task"):
        check_task_settings(cfg, meta["task"], "the labels make this task", found)
    print(f"\nData: {data.source} ({plan.fmt}, {len(plan.shards)} file(s)); one sample {list(plan.sample_shape)} "
          f"{plan.shards[0].x_dtype}, as the networks see it: {meta['input_shape']}")
    print(task_line(meta, arrays))
    sizes = meta["sizes"]
    print(f"  splits: train {sizes['train']}, validation {sizes['val']}, test {sizes['test']}, "
          f"{describe_split(meta, data, cfg.seed)}; normalisation {data.normalize!r}, fitted at the run's start "
          "in one streaming pass over the files, which also looks for NaN/inf features"
          + (" (done here: none found)" if whole else
             f" (not done here: more than {_bytes(CHECK_READS_BYTES)} of features)"))
    describe_size(sizing, 0, data)
    if data.stage_dir:
        print(f"  staged: each node copies the files once to {data.stage_dir!r} before its first member")
    meta["rank_bytes"] = sizing["rank_bytes"]
    return arrays, meta


def task_line(meta: dict, arrays: dict, how: str = "") -> str:
    """``check``'s line of the task (``how``: where it came from): a classification's samples per
    class, from the targets of every split (read whole or streamed alike)."""
    how = f" ({how})" if how else ""
    if meta["task"] == "classification" and all(f"y_{s}" in arrays for s in ("train", "val", "test")):
        import numpy as np
        counts = np.bincount(np.concatenate([arrays[f"y_{s}"] for s in ("train", "val", "test")]),
                             minlength=meta["n_outputs"])
        return (f"  task: classification{how}, {meta['n_outputs']} classes; samples per class: "
                + _class_counts(meta["class_names"], counts))
    return f"  task: {meta['task']}{how}, {meta['n_outputs']} output(s)"


def _class_counts(names: list[str], counts) -> str:
    if len(names) <= 20:
        return ", ".join(f"{n}: {c}" for n, c in zip(names, counts))
    return f"fewest {counts.min()}, median {int(sorted(counts)[len(counts) // 2])}, most {counts.max()}"


def check_samples(cfg: RunConfig, arrays: dict, meta: dict, found: Problems) -> list[dict]:
    """Build each network the mode samples (``Mode.sample``: each ``[[architectures]]`` entry,
    or a seeded sample of the search space) on one batch, as the run's build check does, and
    print its parameter count. Returns what each built one needs for the memory estimate."""
    from ensemble.config.vocabulary import check_input_rank
    from ensemble.train.architecture import ArchitectureError, check_architecture, footprint, use_builder_folders
    heading, samples = mode_of(cfg).sample(cfg, meta, found)
    for line in heading:
        print(("\n" if line is heading[0] else "") + line)
    if not samples:
        return []
    x_head = arrays["x_train" if "x_train" in arrays else "x_head"]       # streamed: the first train rows
    batch = min(BUILD_CHECK_BATCH, len(x_head))
    print(f"\nNetworks, each built and run on {batch} training samples (CPU):")
    built = []
    for s in samples:
        if s.spec is None:
            print(f"  {s.name}: not built (see the problems)")
            continue
        if s.spec["layers"]:
            msg = check_input_rank(s.spec["layers"], meta["input_shape"], f"{s.where}.layers")
            if msg:
                found.add(msg, f"{s.where}.layers")
                print(f"  {s.name}: not built (see the problems)")
                continue
        try:
            if s.arch is not None:
                use_builder_folders([s.arch])
            bound = stuck_seconds(s.spec.get("member_time_limit"))    # as a member's: a minute at least
            with Watchdog(bound, f"`{s.where}` ({s.name}): building it and running it on one batch took more "
                                 f"than {bound or 0:g} s (past `train.member_time_limit`): a builder that never "
                                 "returns? "
                                 f"The check ends here (exit status {EXIT_PROBLEMS})",
                          exit=lambda _: os._exit(EXIT_PROBLEMS)):
                model = check_architecture(s.spec, x_head[:BUILD_CHECK_BATCH], meta["n_outputs"],
                                           meta["task"])
        except ArchitectureError as exc:
            what = s.name if s.arch is not None else f"{s.name}: {s.count}"
            found.add(f"`{s.where}` ({what}): {exc}", s.where)
            print(f"  {s.name}: fails (see the problems)")
            continue
        size = {"name": s.name, **footprint(model), **{k: s.spec[k] for k in ("batch_size", "optimizer")}}
        built.append(size)
        print(f"  {s.name}: {s.count}, {size['params']:,} parameters" + (f"; {s.text}" if s.text else ""))
    if len(built) > 1:
        counts = [b["params"] for b in built]
        print(f"  parameters: {min(counts):,} .. {max(counts):,}")
    return built


def member_memory(size: dict, group_size: int, precision: str = "float32") -> dict[str, int | None]:
    """Bytes one rank of a member needs, by the formula in the module docstring (``precision``
    "mixed_*": activations in 2 bytes a value; weights, gradients and optimizer state stay float32)."""
    slots = OPTIMIZER_SLOTS[size["optimizer"]]
    state = VALUE_BYTES * (size["params"] + size["trainable"] * (1 + slots))
    batch = max(2 * math.ceil(size["batch_size"] / group_size), PREDICT_BATCH)
    value = VALUE_BYTES // 2 if precision.startswith("mixed") else VALUE_BYTES
    acts = None if size["activations"] is None else value * size["activations"] * batch
    return {"state": state, "activations": acts, "total": state + (acts or 0)}


def describe_memory(cfg: RunConfig, arrays: dict, members: list[dict], stream_bytes: int | None = None) -> None:
    """Each member's memory per rank, and the data's: once per node, or per rank when it streams."""
    group = cfg.runtime.group_size
    data_bytes = sum(a.nbytes for a in arrays.values())
    precision = cfg.runtime.precision
    kind = ("float32" if precision == "float32" else
            f"{precision}: activations 2 bytes a value, weights and optimizer state float32")
    print(f"\nMemory, about ({kind}; the formula is in ensemble/orchestrate/check.py):")
    largest = 0
    for size in members:
        mem = member_memory(size, group, precision)
        largest = max(largest, mem["total"])
        acts = ("activations unknown (the model's layers do not give their shapes)" if mem["activations"] is None
                else f"activations {_bytes(mem['activations'])}")
        print(f"  {size['name']}: {_bytes(mem['total'])} per member rank = weights, gradients and {size['optimizer']} "
              f"state {_bytes(mem['state'])} + {acts} (training batch {size['batch_size']}"
              f"{f' over {group} ranks' if group > 1 else ''}, validation batch {PREDICT_BATCH})")
    if stream_bytes is not None:
        print(f"  per rank, the data streamed: about {_bytes(stream_bytes)} (`data.shuffle_buffer` rows, the chunks "
              f"being read, two batches), plus {_bytes(data_bytes)} per node of targets and row indices"
              + (f", plus up to {_bytes(largest)} per training rank" if largest else "")
              + ", plus the TensorFlow runtime (a few hundred MB a rank, not counted)")
        return
    print(f"  per node: the data once, {_bytes(data_bytes)} (every split, shared by the node's ranks)"
          + (f", plus up to {_bytes(largest)} per training rank" if largest else "")
          + ", plus the TensorFlow runtime (a few hundred MB a rank, not counted)")


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}" if n / size < 1000 else f"{n / size:,.0f} {unit}"    # not 1e+03
    return f"{int(n)} B"


def describe_runtime(cfg: RunConfig, resumed: Path | None = None) -> None:
    """The ranks line; ``resumed``: the run ``--resume`` would continue, whose finished members it
    trains no more (a fresh run's "-n 12 trains all 11 members at once" was said of it)."""
    mode, g = mode_of(cfg), cfg.runtime.group_size
    line = (f"\nRanks: `mpirun -n P` gives rank 0 (the master) and P-1 workers, in groups of "
            f"`runtime.group_size` = {g}" + (f"; P-1 must be a multiple of {g}, e.g. -n {1 + g} or -n {1 + 4 * g}"
                                             if g > 1 else "; each trains one member at a time"))
    hint, n = mode.ranks_hint(cfg), mode.expected_members(cfg)
    if resumed is not None and hint and n and mode.members_end_apart:
        records, _ = RunDirectory(resumed).records()
        finished = Counts.of_records(records).ok
        left = mode.resume_trains(cfg, records, n) or 0            # as `ensemble status` counts them
        hint = (f"; the run to resume has {finished} of {n} members finished: "
                + (f"-n {1 + left * g} trains the {left} left at once" if left else
                   "--resume trains none, it selects and writes the ensemble again"))
    print(line + hint + ".")


def finish(problems: list[str], config_path: str, launch: str = "") -> int:
    """Print the problems, numbered, or the all-clear with the command that runs it
    (``Mode.launch``); the exit status."""
    if not problems:
        print(f"\nNo problems found. Submit it: {launch or 'mpirun -n P python -m ensemble.run ' + config_path}")
        return 0
    print(f"\n{len(problems)} problem(s) found:")
    for i, message in enumerate(problems, 1):
        print(f"  {i}. {message}")
    print(f"Fix them and check again: ensemble check {config_path}")
    return EXIT_PROBLEMS


if __name__ == "__main__":
    raise SystemExit(main())
