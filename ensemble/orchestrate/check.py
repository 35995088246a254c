"""``python -m ensemble.run CONFIG --check``: what a run would stop on, found before the job
is submitted, on one process with no MPI (a login node will do).

It parses and validates the config, reads and prepares the data as rank 0 would, builds
every architecture (for ``mode = "evolve"``, a seeded sample of the search space) on one
batch of training data, and estimates each member's memory. Every problem is gathered
(``ensemble.config.Problems``) instead of stopping at the first: a wrong setting falls
back to its default and the checks that read it are skipped, so each mistake is listed
once. The report goes to stdout, the problems numbered at its end; the exit status is 0
with none, else 2 (the run's own status for a config error).

Memory per member, about (float32, 4 bytes a value; on every rank of a member group):

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

from ensemble.config import ConfigError, Problems, load_config, member_train_settings
from ensemble.config.schema import check_task_settings
from ensemble.config.vocabulary import OPTIMIZER_SLOTS
from ensemble.orchestrate.prepare import BUILD_CHECK_BATCH
from ensemble.runtime.env import configure_tensorflow, set_thread_env

EXIT_PROBLEMS = 2               # ensemble.run.EXIT_CONFIG: the run would stop with a config error
SAMPLE_GENOMES = 5              # genomes of the search space built by the check
PREDICT_BATCH = 512             # the validation and prediction batch (forward only)
VALUE_BYTES = 4                 # float32
READ_SETTINGS = tuple(f"data.{k}" for k in ("source", "format", "x", "y", "label", "features"))
SHAPE_SETTINGS = ("data.reshape",)


def check_main(config_path: str) -> int:
    """Check ``config_path`` as a run would, report, and return the exit status (0 or 2)."""
    set_thread_env(1)                                   # one batch per model: a login node's share
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")  # and no GPU taken (or waited for)
    print(f"Checking {config_path}: nothing is trained, no MPI.")
    found = Problems()
    try:
        cfg = load_config(config_path, found)
    except ConfigError as exc:                          # no file or no TOML: nothing else to check
        return finish(exc.problems, config_path)
    describe_config(cfg, found)
    prepared = check_data(cfg, found)
    members: list[dict] = []
    if prepared is None:
        print("\nArchitectures: not built without the data (their input shape and outputs come from it).")
    elif cfg["runtime"]["trainer"] == "rehearsal":
        print("\nArchitectures: not built; `runtime.trainer = \"rehearsal\"` trains no networks.")
    elif not found.ok(*SHAPE_SETTINGS):
        print("\nArchitectures: not built until `data.reshape` is fixed (it sets their input shape).")
    else:
        configure_tensorflow(1)
        if cfg["mode"] == "pbt" and cfg["pbt"]["start"]:
            members = check_pbt_start(cfg, prepared[1], found)
        elif cfg["mode"] in ("ensemble", "pbt"):
            members = check_architectures(cfg, *prepared, found)
        else:
            members = check_search_sample(cfg, *prepared, found)
    if cfg["runtime"]["trainer"] == "rehearsal" and cfg["rehearsal"]["replay"]:
        from ensemble.train.rehearsal import replay_durations
        try:
            replay_durations(cfg["rehearsal"]["replay"])
        except ValueError as exc:
            found.add(str(exc), "rehearsal.replay")
    if prepared is not None:
        describe_memory(cfg, prepared[0], members)
    describe_runtime(cfg)
    return finish(found.messages, config_path)


def describe_config(cfg: dict, found: Problems) -> None:
    if cfg["mode"] == "pbt":
        pbt = cfg["pbt"]
        what = (f"population {pbt['population'] or 'one per worker group'}, {pbt['rounds']} rounds of "
                f"{pbt['round_epochs']} epochs, exploit {pbt['exploit']!r}, explore {pbt['explore']!r} "
                f"({', '.join(pbt['hyperparameters'])})")
    else:
        what = (f"{len(cfg['architectures'])} architecture(s), {sum(a['members'] for a in cfg['architectures'])} "
                "members" if cfg["mode"] == "ensemble" else _evolve_line(cfg["evolve"]))
    state = "valid" if not found else f"{len(found)} problem(s), listed at the end"
    print(f"\nConfig: {state}. Run {cfg['name']!r}, mode {cfg['mode']!r} ({what}), seed {cfg['seed']}, "
          f"run directory {os.path.join(cfg['output_dir'], cfg['name'])}")


def check_pbt_start(cfg: dict, meta: dict, found: Problems) -> list[dict]:
    """``pbt.start``: the evolve run whose best candidates start the population must be there."""
    from ensemble.sources.population import search_winners
    try:
        search_winners(cfg.pbt.start, 1, meta, cfg.train.to_dict())
        print(f"\nStarting population: the best candidates of {cfg['pbt']['start']}")
    except (ConfigError, ValueError) as exc:
        found.add(str(exc), "pbt.start")
    return []


def _evolve_line(ev: dict) -> str:
    budget = [f"{ev['evaluations']} evaluations"] if ev["evaluations"] else []
    budget += [f"{ev['time_limit']:g} s"] if ev["time_limit"] else []
    own = ", ".join(f"{k} {v}" for k, v in ev.items() if k not in ("strategy", "evaluations", "time_limit"))
    return f"strategy {ev['strategy']!r}, budget {' and '.join(budget) or 'none'}" + (f"; {own}" if own else "")


def check_data(cfg: dict, found: Problems) -> tuple[dict, dict] | None:
    """Read and prepare the data as rank 0 does; print shapes, task, classes and splits.
    Returns ``(arrays, meta)``, or None when it cannot be read (the problem is noted)."""
    data = cfg["data"]
    if not found.ok(*READ_SETTINGS):
        print("\nData: not read until the [data] settings above are fixed.")
        return None
    from datafeed.prepare import prepare
    from datafeed.readers import DataError, detect_format, read_dataset
    t0, fmt = time.monotonic(), data["format"]
    try:
        fmt = detect_format(data)
        x, y, info = read_dataset(data)
    except DataError as exc:
        found.add(str(exc), "data.source")
    except Exception as exc:            # noqa: BLE001 - a file that is not what its suffix says
        found.add(f"`data.source` {data['source']!r} cannot be read as {fmt}: {type(exc).__name__}: {exc}; "
                  "check the file or set `data.format`", "data.source")
    if not found.ok("data.source"):
        print(f"\nData: {data['source']} cannot be read (see the problems).")
        return None
    seconds = time.monotonic() - t0
    try:
        arrays, meta = prepare(x, y, info, data, cfg["seed"])
    except ValueError as exc:
        found.add(str(exc), "data")
        print(f"\nData: {data['source']} was read but cannot be used (see the problems).")
        return None
    if data["task"] == "auto" and found.ok("data.task"):
        check_task_settings(cfg, meta["task"], "the labels make this task", found)
    import numpy as np
    print(f"\nData: {data['source']} ({'built-in' if fmt == 'builtin' else fmt}), read in {seconds:.1f} s")
    print(f"  features {list(np.shape(x))} {np.asarray(x).dtype}, targets {list(np.shape(y))}: "
          f"{len(x)} samples; one sample as the networks see it: {meta['input_shape']}")
    task_from = "from `data.task`" if data["task"] != "auto" else "inferred from the labels"
    if meta["task"] == "classification":
        counts = np.bincount(np.concatenate([arrays[f"y_{s}"] for s in ("train", "val", "test")]),
                             minlength=meta["n_outputs"])
        print(f"  task: classification ({task_from}), {meta['n_outputs']} classes; samples per class: "
              + _class_counts(meta["class_names"], counts))
    else:
        print(f"  task: regression ({task_from}), {meta['n_outputs']} output(s)")
    sizes = meta["sizes"]
    print(f"  splits: train {sizes['train']}, validation {sizes['val']}, test {sizes['test']} "
          f"(seed {cfg['seed']}{', stratified' if meta['task'] == 'classification' else ''}); "
          f"normalisation {data['normalize']!r}, fitted on train")
    return arrays, meta


def _class_counts(names: list[str], counts) -> str:
    if len(names) <= 20:
        return ", ".join(f"{n}: {c}" for n, c in zip(names, counts))
    return f"fewest {counts.min()}, median {int(sorted(counts)[len(counts) // 2])}, most {counts.max()}"


def check_architectures(cfg: dict, arrays: dict, meta: dict, found: Problems) -> list[dict]:
    """Build each ``[[architectures]]`` entry on one batch, as the run's build check does,
    and print its parameter count. Returns what each built one needs for the memory estimate."""
    from ensemble.config.vocabulary import check_input_rank
    from ensemble.train.architecture import ArchitectureError, check_architecture, footprint, use_builder_folders
    print(f"\nArchitectures, each built and run on {min(BUILD_CHECK_BATCH, len(arrays['x_train']))} training "
          "samples (CPU):")
    built = []
    for i, arch in enumerate(cfg["architectures"]):
        where = f"architectures[{i}]"
        if not found.ok(*(f"{where}.{k}" for k in ("layers", "model", "model_dir", "params"))):
            print(f"  {arch['name']}: not built (see the problems)")
            continue
        spec = {"layers": arch["layers"], "model": arch["model"], "params": arch["params"],
                **member_train_settings(cfg, arch).to_dict()}
        if arch["layers"]:
            msg = check_input_rank(arch["layers"], meta["input_shape"], f"{where}.layers")
            if msg:
                found.add(msg, f"{where}.layers")
                print(f"  {arch['name']}: not built (see the problems)")
                continue
        use_builder_folders([arch])
        try:
            model = check_architecture(spec, arrays["x_train"][:BUILD_CHECK_BATCH], meta["n_outputs"],
                                       meta["task"])
        except ArchitectureError as exc:
            found.add(f"`{where}` ({arch['name']}): {exc}", where)
            print(f"  {arch['name']}: fails (see the problems)")
            continue
        size = {"name": arch["name"], **footprint(model), **{k: spec[k] for k in ("batch_size", "optimizer")}}
        built.append(size)
        what = " -> ".join(map(_layer_text, arch["layers"])) + " -> head" if arch["layers"] else arch["model"]
        print(f"  {arch['name']}: {arch['members']} member(s), {size['params']:,} parameters; {what}")
    return built


def _layer_text(layer: dict) -> str:
    """``Dense(96)``, ``Conv2D(16)``, ``Dropout(0.2)``: a layer's type and its size."""
    size = next((layer[k] for k in ("units", "filters", "rate", "target_shape", "pool_size") if k in layer), None)
    return layer["type"] if size is None else f"{layer['type']}({size})"


def check_search_sample(cfg: dict, arrays: dict, meta: dict, found: Problems) -> list[dict]:
    """``mode = "evolve"``: the search space for this data, and ``SAMPLE_GENOMES`` seeded
    genomes of it built on one batch, with their summaries and parameter counts."""
    import numpy as np
    from ensemble.sources.search import check_search, search_space
    from ensemble.train.architecture import ArchitectureError, check_architecture, footprint
    from evolve import decode, random_genome
    try:
        space = search_space(cfg, meta)
        check_search(cfg, meta)
    except ConfigError as exc:
        found.add(str(exc), "search")
        return []
    shape, n_out = tuple(meta["input_shape"]), meta["n_outputs"]
    print(f"\nSearch space for samples of shape {list(shape)}: layer types {', '.join(space.layer_types)}; "
          f"depth {space.min_depth}..{space.max_depth}; at most {space.max_params:,} parameters")
    print(f"  a seeded sample of {SAMPLE_GENOMES} genomes (not the search's own first candidates), each built "
          f"and run on {min(BUILD_CHECK_BATCH, len(arrays['x_train']))} training samples (CPU):")
    rng = np.random.default_rng(cfg["seed"])
    built = []
    for n in range(1, SAMPLE_GENOMES + 1):
        genome = random_genome(rng, space, shape, n_out)
        summary = genome.summary(shape)
        spec = {"layers": decode(genome, shape, space, n_out), "model": None, "params": {},
                "loss": cfg["train"]["loss"]}
        try:
            model = check_architecture(spec, arrays["x_train"][:BUILD_CHECK_BATCH], n_out, meta["task"])
        except ArchitectureError as exc:
            found.add(f"genome {n} of the search space, {summary}, cannot be built: {exc}", "search")
            continue
        size = {"name": f"genome {n}", **footprint(model), "batch_size": genome.batch_size,
                "optimizer": genome.optimizer}
        built.append(size)
        print(f"    {n}. {summary}   {size['params']:,} parameters")
    if built:
        counts = [b["params"] for b in built]
        print(f"  parameters in the sample: {min(counts):,} .. {max(counts):,}")
    slots = max(OPTIMIZER_SLOTS[o] for o in space.optimizers)
    print(f"  a genome of the space's largest, {space.max_params:,} parameters, needs "
          f"{_bytes(VALUE_BYTES * (2 + slots) * space.max_params)} for weights, gradients and optimizer state "
          "alone")
    return built


def member_memory(size: dict, group_size: int) -> dict[str, int | None]:
    """Bytes one rank of a member needs, by the formula in the module docstring."""
    slots = OPTIMIZER_SLOTS[size["optimizer"]]
    state = VALUE_BYTES * (size["params"] + size["trainable"] * (1 + slots))
    batch = max(2 * math.ceil(size["batch_size"] / group_size), PREDICT_BATCH)
    acts = None if size["activations"] is None else VALUE_BYTES * size["activations"] * batch
    return {"state": state, "activations": acts, "total": state + (acts or 0)}


def describe_memory(cfg: dict, arrays: dict, members: list[dict]) -> None:
    group = cfg["runtime"]["group_size"]
    data_bytes = sum(a.nbytes for a in arrays.values())
    print("\nMemory, about (float32; the formula is in ensemble/orchestrate/check.py):")
    largest = 0
    for size in members:
        mem = member_memory(size, group)
        largest = max(largest, mem["total"])
        acts = ("activations unknown (the model's layers do not give their shapes)" if mem["activations"] is None
                else f"activations {_bytes(mem['activations'])}")
        print(f"  {size['name']}: {_bytes(mem['total'])} per member rank = weights, gradients and {size['optimizer']} "
              f"state {_bytes(mem['state'])} + {acts} (training batch {size['batch_size']}"
              f"{f' over {group} ranks' if group > 1 else ''}, validation batch {PREDICT_BATCH})")
    print(f"  per node: the data once, {_bytes(data_bytes)} (every split, shared by the node's ranks)"
          + (f", plus up to {_bytes(largest)} per training rank" if largest else "")
          + ", plus the TensorFlow runtime (a few hundred MB a rank, not counted)")


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def describe_runtime(cfg: dict) -> None:
    g = cfg["runtime"]["group_size"]
    members = sum(a["members"] for a in cfg["architectures"]) if cfg["mode"] == "ensemble" else None
    line = (f"\nRanks: `mpirun -n P` gives rank 0 (the master) and P-1 workers, in groups of "
            f"`runtime.group_size` = {g}" + (f"; P-1 must be a multiple of {g}, e.g. -n {1 + g} or -n {1 + 4 * g}"
                                             if g > 1 else "; each trains one member at a time"))
    if members:
        line += f"; -n {1 + members * g} trains all {members} members at once"
    if cfg["mode"] == "pbt":
        n = cfg["pbt"]["population"]
        line += (f"; a population of {n} needs -n {1 + n * g} or more" if n else
                 "; the population has one member per group, so P sets its size")
    print(line + ".")


def finish(problems: list[str], config_path: str) -> int:
    """Print the problems, numbered, or the all-clear; the exit status."""
    if not problems:
        print(f"\nNo problems found. Submit it: mpirun -n P python -m ensemble.run {config_path}")
        return 0
    print(f"\n{len(problems)} problem(s) found:")
    for i, message in enumerate(problems, 1):
        print(f"  {i}. {message}")
    print(f"Fix them and check again: python -m ensemble.run {config_path} --check")
    return EXIT_PROBLEMS
