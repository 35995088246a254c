"""The run's config as typed, frozen objects: GENERATED from ``ensemble.config.schema`` by
``python -m ensemble.config.codegen --write``; do not edit.

``load_config`` / ``resolve_config`` return a ``RunConfig``; every setting's type, default and
meaning live in the schema (and docs/config.md, rendered from it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ensemble.config.section import Section


@dataclass(frozen=True)
class DataConfig(Section):
    """What to train on: rank 0 reads it once, splits it (seeded, stratified for classification) or takes the split the data gives (`test_source`, `split_column` or `split_file`), normalises it and broadcasts it to one shared copy per node."""

    #: a built-in dataset (digits, iris, wine, breast_cancer, diabetes, california_housing_small), a
    #: .npz/.npy/.csv/.parquet/.h5 file, or a folder or glob of .npz/.npy/.h5/.nc/.parquet files read as one
    #: dataset (relative to the config)
    source: str
    #: how to read `source`; "auto": a built-in name, else by the file's suffix
    format: str
    #: the features: array name in an .npz, dataset path in an HDF5 file
    x: str
    #: the targets: array name in an .npz, dataset path in an HDF5 file, or the targets .npy file beside an
    #: .npy `source`
    y: str
    #: CSV/Parquet: the target column, or a list of columns (a regression with one output per column)
    label: str | tuple[Any, ...]
    #: CSV/Parquet: the feature columns; empty: every column but `label`
    features: tuple[Any, ...]
    #: CSV/Parquet: columns left out of the features (an ID, a saved index, a leak), with `features` empty
    exclude: tuple[Any, ...]
    #: "auto": classification for integer, string or bool labels (or few distinct whole numbers), else
    #: regression
    task: str
    #: share of the samples held out for validation (early stopping, ranking, ensemble selection,
    #: calibration); when the data gives its split without validation rows: share of the training rows
    val_fraction: float
    #: share of the validation rows that members' early stopping never sees, kept for recalibrating the
    #: ensemble's uncertainty (split conformal's guarantee needs rows the members were not fitted to);
    #: selection still reads every validation row; "auto": half of them for regression, none for
    #: classification (whose temperature promises no coverage, and whose early stopping gains from every
    #: row); 0: recalibrate on every validation row; used when both parts have at least 20 rows, and not for
    #: streamed data
    calibration_holdout: str | int | float
    #: share of the samples held out for the final test scores, used for nothing else; not with a split the
    #: data gives
    test_fraction: float
    #: your own split by files: the test rows, a file, folder or glob of the same format and columns as
    #: `source` (whose rows are then the training rows; a streamed run streams them too); "": none
    test_source: str
    #: with `test_source`: the validation rows, a file, folder or glob like `source`; "": validation is drawn
    #: from the training rows (`val_fraction` of them)
    val_source: str
    #: your own split by a column (CSV/Parquet): its values "train", "val" (or "valid", "validation") and
    #: "test" say each row's split; not a feature; no "val" rows: validation is drawn from the train rows;
    #: "": none
    split_column: str
    #: your own split by row indices: an .npz with integer arrays `train`, `test` and optionally `val` into
    #: the rows of `source` (relative to the config); "": none
    split_file: str
    #: per-feature scaling fitted on the training split only: "standard" (mean 0, std 1), "minmax" (0 to 1)
    #: or "none"
    normalize: str
    #: features missing in some rows (NaN, an empty cell): "none" refuses them, naming the columns; "median"
    #: fills each with its feature's median over the training rows, and `predict` fills new rows the same
    #: (said); data read whole only
    impute: str
    #: the shape of one sample, e.g. [8, 8, 1] for Conv2D layers on 64 pixels; unset: as read
    reshape: tuple[Any, ...] | None
    #: with many files (`source` a folder or a glob): each file holds one sample (a volume) rather than
    #: samples along its first axis; "auto": when a file's target is a scalar
    sample_per_file: str | bool
    #: members read batches from the files instead of holding the data in memory; "auto": when the features
    #: (as float32) exceed `memory_share` of a node's memory
    stream: str | bool
    #: `stream = "auto"` streams data larger than this share of a node's memory
    memory_share: float
    #: a node's memory for `stream = "auto"` and `--check`, in GB; 0: this node's total memory
    node_memory_gb: float
    #: streaming: rows shuffled together; an epoch reads the member's chunks in a seeded order, a window of
    #: this many rows at a time (read ahead in the background; at most two windows in memory), and serves
    #: them in random order
    shuffle_buffer: int
    #: streaming: copy the files once per node to this node-local folder before training and read them there
    #: ("$TMPDIR" expands); "": read them where they are
    stage_dir: str


@dataclass(frozen=True)
class TrainConfig(Section):
    """How every member trains; each `[[architectures]]` may override any of these for its own members."""

    #: most epochs a member trains (early stopping may end it sooner)
    epochs: int
    #: samples per gradient step (the global batch: a member group splits it over its ranks)
    batch_size: int
    #: the Keras optimizer, by name
    optimizer: str
    #: the optimizer's learning rate
    learning_rate: float
    #: early stopping: epochs without a better validation loss before training stops; the best epoch's
    #: weights are kept
    patience: int
    #: seconds one member may train; past it training stops at the next batch and the member keeps its best
    #: validated weights (`stopped = "time_limit"`, ranked like any other); one stopped before its first
    #: epoch ended fails (kind `time_limit`); shortened to end before the run's own deadline
    member_time_limit: float
    #: true: a member that reaches `member_time_limit` fails and its work is dropped (the behaviour before
    #: the limit kept the best weights)
    time_limit_fails: bool
    #: train each member on a seeded bootstrap resample of the training split
    bootstrap: bool
    #: "auto": cross-entropy for classification, Gaussian NLL (a mean and a variance head) for regression (a
    #: user builder keeps MSE unless it says "gaussian_nll"); "mse": a mean head only
    loss: str


@dataclass(frozen=True)
class ArchitectureConfig(Section):
    """In mode "ensemble": one table per architecture, each with exactly one of `layers` or `model`."""

    #: the architecture's name in the leaderboard (unique; its members' files are named after it); unset:
    #: arch0, arch1, ...
    name: str
    #: how many members (differently seeded) of this architecture
    members: int
    #: the hidden layers, as layer tables (see Layers below); the output head is added
    layers: tuple[Any, ...] | None
    #: instead of `layers`: your builder "package.module:function", called as `function(input_shape,
    #: n_outputs, **params)`, returning the whole Keras model (softmax probabilities for classification)
    model: str | None
    #: folder `model`'s module is imported from (relative to the config); unset: the config's folder when the
    #: module lies there, else PYTHONPATH
    model_dir: str | None
    #: keyword arguments for `model`'s builder
    params: Mapping[str, Any]
    #: this architecture's own `train.epochs`; unset: [train]'s
    epochs: int | None
    #: this architecture's own `train.batch_size`; unset: [train]'s
    batch_size: int | None
    #: this architecture's own `train.optimizer`; unset: [train]'s
    optimizer: str | None
    #: this architecture's own `train.learning_rate`; unset: [train]'s
    learning_rate: float | None
    #: this architecture's own `train.patience`; unset: [train]'s
    patience: int | None
    #: this architecture's own `train.member_time_limit`; unset: [train]'s
    member_time_limit: float | None
    #: this architecture's own `train.time_limit_fails`; unset: [train]'s
    time_limit_fails: bool | None
    #: this architecture's own `train.bootstrap`; unset: [train]'s
    bootstrap: bool | None
    #: this architecture's own `train.loss`; unset: [train]'s
    loss: str | None


@dataclass(frozen=True)
class EnsembleConfig(Section):
    """How the ensemble is chosen from the trained members and what is kept of the rest."""

    #: ensemble size for `method = "top_k"` (and for "auto" when the validation split has too few rows to
    #: cross-validate)
    k: int
    #: "auto": "shrunk" unless another selection (the uniform average of the k best for every k, greedy,
    #: bagged) beats it clearly on held-out validation folds (both on `selection_metric`; one member only
    #: when it is significantly better); "shrunk": bagged selection with its weights moved a quarter of the
    #: way toward the uniform average of the members not clearly worse than the best on validation (by 3
    #: standard errors: a search's poor candidates are left out); "greedy": Caruana's forward selection;
    #: "bagged": greedy on random halves of the candidates, averaged; "top_k": the `k` best by `metric`,
    #: equal weights
    method: str
    #: what members are ranked by and the ensemble reports; "auto": accuracy (classification), mse
    #: (regression)
    metric: str
    #: the validation score selection optimises; "auto": a proper scoring rule (log loss; Gaussian NLL, or
    #: mse for mean-only regression members)
    selection_metric: str
    #: recalibration on the validation split: "auto" recalibrates regression intervals (variance scaling or
    #: conformal, whichever covers held-out validation folds closer to nominal; only widened when no rows
    #: were kept from early stopping, `data.calibration_holdout`) and temperature-scales class probabilities
    #: when that lowers the log loss of held-out validation folds (only softened, T >= 1, when no rows were
    #: kept from early stopping, as classification keeps none by default)
    calibration: str
    #: predictions are kept for the best this many members: the pool selection chooses from
    candidates: int
    #: model files kept for the best this many members (plus the selected ones and a multi-objective search's
    #: Pareto front)
    keep_models: int


@dataclass(frozen=True)
class PbtConfig(Section):
    """mode "pbt": population-based training."""

    #: members trained together, each held by one worker group for the whole run; 0: one per worker group (at
    #: most that many: every member trains every round)
    population: int
    #: epochs each member trains between two exploit/explore steps
    round_epochs: int
    #: rounds in all: every member trains `rounds * round_epochs` epochs
    rounds: int
    #: seconds after which no new round starts (the run's own `runtime.time_limit` counts too); unset:
    #: `rounds` alone
    time_limit: float | None
    #: "truncation" (PBT): the worst `fraction` copy a member of the best `fraction` that scored better;
    #: "tournament" (LTFB): random pairs, the loser copies the winner; "none": members train independently
    #: (the control a benchmark compares with); a member whose loss turned NaN copies a good one under every
    #: rule
    exploit: str
    #: truncation: the share of the population that copies, and the share it copies from
    fraction: float
    #: what a copying member does to the hyperparameters it copied: "perturb" multiplies each by one of
    #: `factors`; "resample" draws each anew from its range with probability `resample_probability`, else
    #: perturbs it
    explore: str
    #: the factors a perturbed hyperparameter is multiplied by (one chosen at random)
    factors: tuple[Any, ...]
    #: explore = "resample": the chance each hyperparameter is drawn anew
    resample_probability: float
    #: the hyperparameters that evolve, of "learning_rate", "batch_size", "dropout", "weight_decay",
    #: "momentum" (dropout: every Dropout layer's rate; momentum: optimizers that have one); each member
    #: evolves those its optimizer and layers expose
    hyperparameters: tuple[Any, ...]
    #: per hyperparameter, [low, high]: the initial population draws it from there (log-uniform for
    #: learning_rate, batch_size, weight_decay), and explore keeps it inside; unset: it starts at its
    #: `[train]` / `[[architectures]]` value and stays within a wide default range
    ranges: Mapping[str, Any]
    #: the validation metric members are compared on; "auto": `ensemble.metric`
    metric: str
    #: "": the population is dealt round-robin from `[[architectures]]` (their `members` is not used); or a
    #: finished mode "evolve" run directory (relative to the config): its best candidates, architecture and
    #: hyperparameters, start the population
    start: str


@dataclass(frozen=True)
class OnlineConfig(Section):
    """mode "online": members train while a simulation streams samples to them (`mpirun -n S sim.py : -n E python -m ensemble.run config.toml`; docs/insitu.md)."""

    #: samples the replay buffer holds; each new member trains on a snapshot of it
    buffer: int
    #: which samples the full buffer keeps: "reservoir" a uniform sample of all received so far; "fifo" the
    #: newest
    policy: str
    #: when the simulation outpaces training (more than `max_unseen` samples arrived since the last member
    #: started): "replace" still takes them (the policy decides what leaves); "drop" drops and counts them
    #: until the next member starts
    when_behind: str
    #: samples that may arrive between two members' starts before training counts as behind; 0: `buffer`
    max_unseen: int
    #: samples received before the first member starts; they are written to `data.source` (an .npz that does
    #: not exist yet), whose split gives the run's normalisation and its fixed validation and test rows
    warmup: int
    #: members that finish (ok) between two published ensembles
    publish_every: int
    #: a published ensemble is selected among the newest this many members that finished ok (the validation
    #: rows are the warm-up's, on which the oldest members, trained on them, would always win); 0: among all
    window: int
    #: the simulation side's default: sample messages per rank sent and not yet acknowledged; a batch sent
    #: beyond it is dropped and counted, never waited for
    in_flight: int


@dataclass(frozen=True)
class EvolveConfig(Section):
    """mode "evolve": the search strategy and its budget; the strategy's own settings in ``settings``."""

    EXTRA: ClassVar[str | None] = 'settings'

    #: the search strategy; its own settings follow in the table below
    strategy: str
    #: how many candidates the search trains
    evaluations: int | None
    #: seconds after which the search breeds no more candidates; unset: no limit
    time_limit: float | None
    #: early discarding: "asha" stops a candidate at a rung (`discard_epochs` x `discard_factor`^k epochs)
    #: unless it is among the best 1/`discard_factor` of those that reached the rung; "median" stops one
    #: worse than the median of the others at the same epoch; a stopped candidate counts as a low-fidelity
    #: evaluation and never enters the ensemble
    discard: str
    #: the first rung (epochs), and how often candidates report to the master
    discard_epochs: int
    #: asha's reduction factor: rungs this many times apart, the best 1/this go on
    discard_factor: int
    #: nobody is stopped at an epoch until this many candidates have reported there
    discard_grace: int
    #: weight inheritance: a child bred by mutation starts from its parent's trained weights in every layer
    #: whose shape is unchanged (when the parent's model file is kept); the journal says which layers
    inherit: bool
    #: the first population holds small known-good networks for the input's kind, best first (for sequences a
    #: one-convolution detector with global max pooling, a fully convolutional network and a small CNN; for
    #: images and volumes the detector, a small CNN and a deeper pooled CNN; a regression leaves the detector
    #: out; two MLPs for tables) next to the random ones
    templates: bool
    #: true: the first population's random genomes of a structured space are drawn small (the fewest stages
    #: or one more, one block each, the fewest dense layers or one more; the other genes from the whole
    #: space), to be grown by mutation; false: drawn from the whole space (on `signals` the two searched
    #: alike: docs/search-benchmark.md)
    compact_start: bool
    #: "": none; or an earlier mode "evolve" run directory (relative to the config) on samples of the same
    #: shape: its best candidates (up to half the first population) are trained again as the first ones
    start_from: str
    #: "forest": a random forest of fitness over genome features screens bred children: each child sent to
    #: train is the most promising (expected improvement) of `surrogate_candidates` bred, none trained
    #: before; refitted in batches (evolve.surrogate, docs/search-benchmark.md)
    surrogate: str
    #: children bred and screened per child sent to train (`surrogate = "forest"`)
    surrogate_candidates: int
    #: results before the surrogate's first fit; children bred earlier are not screened
    surrogate_min_results: int
    #: children kept bred and screened ahead by a helper process beside the master, off its dispatch loop
    #: (`surrogate = "forest"`); 0: screened in the loop at each ask, and the search is reproducible from its
    #: seed; "auto": in the loop below a few hundred workers, ahead from there (evolve/screening.py)
    surrogate_ahead: str | int
    #: helper processes that screen ahead (`surrogate_ahead`), each on a core of the master's node: one keeps
    #: up with about as many asks a second as the master could screen in its loop (docs/search-benchmark.md)
    surrogate_helpers: int
    #: the chosen strategy's own settings (evolve.strategies), by name
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class RuntimeConfig(Section):
    """Where and how the run executes; unlike the settings that shape the results, these (and `[rehearsal]`) may change on `--resume`."""

    #: threads per rank for numpy and TensorFlow
    threads: int
    #: console log level
    log_level: str
    #: every rank also logs everything to `<run dir>/logs/rank-<rank>.log`
    debug_log: bool
    #: Keras dtype policy for members: "mixed_float16" (NVIDIA/AMD tensor cores) or "mixed_bfloat16"
    #: (A100/H100, MI200+, Intel GPUs, recent CPUs) compute in half precision with float32 weights; the
    #: output head stays float32 (a user builder should give its last layer dtype="float32")
    precision: str
    #: TensorFlow's op determinism: true, a member trained again with the same seed, data, software, hardware
    #: and `group_size` ends with the same weights, bit for bit (what resume and the tests rely on); false,
    #: GPU kernels may use atomics (faster, and some ops have no deterministic kernel at all) and the same
    #: member differs in the last bits from run to run; seeds are the same either way
    deterministic: bool
    #: compile each member's train step with XLA: faster on GPUs for many models, a compilation per member
    #: first
    jit_compile: bool
    #: compiled models a worker keeps for the next member of the same architecture, which then trains without
    #: tracing its steps again (1-2 s a member for small networks) and ends bit for bit as on a new model; 0:
    #: off. A model whose variables and optimizer state take more than 256 MiB is not kept
    traced_models: int
    #: while a worker trains a member, trace the steps of the next one it holds (`specs_in_hand` of 2 or
    #: more) in a background thread; the same members either way. It pays most where the node has a core to
    #: spare beside each worker (1.11x evaluations/s in a search at -n 2 on 2 cores, 1.05x at -n 3); off
    #: unless set, as it was not measured on GPUs, where the background model takes device memory while it is
    #: traced
    pretrace: bool
    #: rank 0 also trains members, in a thread beside its scheduling loop, so its GPU is not idle; "auto":
    #: when rank 0 has a GPU (and `group_size` is 1), not on CPU-only nodes where it would take a core from
    #: the workers
    master_trains: str | bool
    #: ranks sharing one GPU of a node (small members): rank r of a node uses GPU r // ranks_per_gpu, and
    #: TensorFlow grows its GPU memory as needed instead of taking the whole device
    ranks_per_gpu: int
    #: members a worker trains at once, packed into one graph (stacked weights, one batched matmul per layer
    #: for all): for small Dense/Dropout networks, which leave a core or a GPU mostly idle; each packed
    #: member's result equals what it gets alone. Mode "ensemble" only, float32; members that cannot be
    #: packed (other layers, a user builder) train one by one
    members_per_rank: int
    #: ranks per member: more than 1 trains each member data-parallel (gradients allreduced); must divide the
    #: P-1 worker ranks
    group_size: int
    #: compare the data every rank received with rank 0's (a checksum) before training
    verify_broadcast: bool
    #: split the ranks into this many pretend nodes for the shared-memory data broadcast: tests many nodes on
    #: one machine
    pretend_nodes: int | None
    #: seconds the run may take: no member starts that would end after it, less `finish_reserve` (the job's
    #: end counts as well: `ENSEMBLE_JOB_END_TIME`, set by the `ensemble.jobscript` scripts, or Slurm's
    #: `SLURM_JOB_END_TIME`)
    time_limit: float | None
    #: seconds kept before the deadline for selection and writing the outputs
    finish_reserve: float
    #: stop handing out members once more than this share has failed (judged from 3 failures on)
    max_failed_share: float
    #: longest nap, in seconds, between polls of a waiting rank (MPI waits probe and sleep instead of
    #: spinning a core)
    poll_max_sleep: float
    #: "keras" trains; "rehearsal" sleeps instead (no TensorFlow, see `[rehearsal]`): sizes and tests the
    #: control plane; or your own trainer, "package.module:function", called as `function(cfg, meta, data,
    #: run_dir, rank, group)` on every worker and returning `train(spec, report) -> record`
    #: (docs/architecture.md, the Trainer seam)
    trainer: str
    #: member specs a worker holds ahead, so it starts the next one without a round trip to the master;
    #: "auto": by how long members take
    specs_in_hand: str | int
    #: a master hierarchy for short members at the largest scale: ranks 1..N are sub-masters, each serving
    #: its own share of the member groups (mode ensemble: each runs its own share of the members with its own
    #: journal, and the master only coordinates; mode evolve: each hands out the specs the master deals it
    #: and forwards the results); 0: one master serves every group; "auto": as many as keep each under half
    #: busy by the recorded master cost and the member time measured so far (mode ensemble; none before any
    #: is measured, and none below 64 groups a sub-master; docs/scale.md)
    sub_masters: str | int
    #: mode "ensemble": the order members go out in; "cost": the longest predicted first (each architecture's
    #: measured mean seconds; before any is measured, its epochs and layer widths), so short members fill the
    #: end of the run; "list": as listed
    order: str
    #: the end of the run: once nothing more is to be handed out, each idle worker joins the member that has
    #: trained longest as a data-parallel helper (at its next epoch end), up to this many helpers a member;
    #: 0: off. "auto": 7 from 32 workers on, else off (a helped member is a valid member of its spec, not the
    #: bit-for-bit twin of the unhelped one, and which members get help depends on timing). Ensemble and
    #: evolve modes, Keras and rehearsal trainers, `group_size` 1, no packing
    tail_helpers: int | str
    #: a time-limited run stops handing out members once this quantile of the members' seconds so far would
    #: not end before the deadline (null: the slowest member seen); a member still training at the deadline
    #: is cut there, which costs no more than the idle worker would have (docs/scale.md measures it)
    stop_quantile: float | None
    #: journal lines are fsynced together at most this often (0: every line); a crash loses at most this many
    #: seconds of results
    journal_sync_seconds: float
    #: seconds between progress summary lines (when there are too many members for a line each)
    progress_seconds: float
    #: seconds between rewrites of status.json, the heartbeat `ensemble status` reads; a job silent for three
    #: of them is reported dead
    heartbeat_seconds: float
    #: up to this many members, a progress line per result; more: summary lines
    progress_lines: int


@dataclass(frozen=True)
class RehearsalConfig(Section):
    """`runtime.trainer = "rehearsal"`: how long each member "trains" and what it returns."""

    #: median seconds a member sleeps
    seconds: float
    #: sigma of the log of the sleep (log-normal); 0: every member sleeps the median
    spread: float
    #: a journal.jsonl (or a run directory) whose members' times are slept again, by id
    replay: str
    #: median seconds per architecture name, for the architectures named (the others sleep `seconds`): a
    #: rehearsal of an ensemble whose architectures differ in cost, e.g. {small = 6, large = 60}
    arch_seconds: Mapping[str, Any]
    #: return made-up validation and test predictions, so selection runs as after training
    predictions: bool
    #: probability that a member fails
    failure_rate: float
    #: about how good the made-up predictions are
    accuracy: float


@dataclass(frozen=True)
class TrackingConfig(Section):
    """TensorBoard and MLflow tracking."""

    #: write TensorBoard event files under the run directory (`tensorboard/`): each member's per-epoch
    #: scalars and final metrics, the HParams dashboard, the ensemble's metrics (extra
    #: `mpi-ensemble[tracking]`)
    tensorboard: bool
    #: an MLflow tracking URI ("http://host:5000", "sqlite:///mlflow.db"): one parent run per job, one nested
    #: run per member, the ensemble's metrics, report.html and ensemble.json; "": off (extra
    #: `mpi-ensemble[tracking]`)
    mlflow: str
    #: the MLflow experiment the runs go in
    mlflow_experiment: str
    #: writes waiting for a slow tracking server; more are dropped (and counted)
    queue_size: int
    #: MLflow writes are gathered this long and sent together (log_batch)
    batch_seconds: float
    #: a tracking server that refuses or fails this long is given up: what is queued and what comes later is
    #: dropped, with one warning
    give_up_seconds: float
    #: at the run's end, the longest wait for queued tracking writes; the rest is dropped, and the console
    #: says how much
    finish_seconds: float
    #: while the run goes on, each destination's writer thread uses at most this share of one core (after a
    #: write it rests in proportion to the CPU time the write took): a writer busy beside ranks that wake
    #: thousands of times a second slows them whatever its priority; 1: no limit, for a rank-0 node with
    #: cores to spare. At the run's end it writes flat out for up to `finish_seconds`
    cpu_share: float


@dataclass(frozen=True)
class RunConfig(Section):
    """A whole run's settings, resolved: every default filled in."""

    SECTIONS: ClassVar[dict[str, type[Section]]] = {'data': DataConfig, 'train': TrainConfig, 'architectures': ArchitectureConfig, 'ensemble': EnsembleConfig, 'pbt': PbtConfig, 'online': OnlineConfig, 'runtime': RuntimeConfig, 'rehearsal': RehearsalConfig, 'tracking': TrackingConfig, 'evolve': EvolveConfig}
    ARRAYS: ClassVar[tuple[str, ...]] = ('architectures',)

    #: the run's name: its directory is `output_dir/name` (suffixed -2, -3 if that holds a run); unset: the
    #: config file's name
    name: str
    #: "ensemble": train the `[[architectures]]` listed; "evolve": search architectures (`[evolve]`,
    #: `[search]`); "pbt": a population that trains round by round and copies its best members' weights into
    #: its worst (`[pbt]`); "online": members train on samples a running simulation streams, and each few
    #: make a new published ensemble (`[online]`)
    mode: str
    #: seeds the data split, every member's initialisation and bootstrap, and the search
    seed: int
    #: folder the run directory is made in
    output_dir: str
    #: What to train on: rank 0 reads it once, splits it (seeded, stratified for classification) or takes the
    #: split the data gives (`test_source`, `split_column` or `split_file`), normalises it and broadcasts it
    #: to one shared copy per node.
    data: DataConfig
    #: How every member trains; each `[[architectures]]` may override any of these for its own members.
    train: TrainConfig
    #: In mode "ensemble": one table per architecture, each with exactly one of `layers` or `model`.
    architectures: tuple[ArchitectureConfig, ...]
    #: How the ensemble is chosen from the trained members and what is kept of the rest.
    ensemble: EnsembleConfig
    #: mode "pbt": population-based training. Every round each member trains `round_epochs` epochs; then the
    #: weak copy the strong members' weights and optimizer state (sent from worker to worker) and perturb
    #: their hyperparameters. A copy takes the architecture with it, so a population may start from several
    #: architectures.
    pbt: PbtConfig
    #: mode "online": members train while a simulation streams samples to them (`mpirun -n S sim.py : -n E
    #: python -m ensemble.run config.toml`; docs/insitu.md).
    online: OnlineConfig
    #: mode "evolve": the search strategy, its budget and its own settings
    evolve: EvolveConfig
    #: mode "evolve": the search space
    search: Mapping[str, Any]
    #: Where and how the run executes; unlike the settings that shape the results, these (and `[rehearsal]`)
    #: may change on `--resume`.
    runtime: RuntimeConfig
    #: `runtime.trainer = "rehearsal"`: how long each member "trains" and what it returns.
    rehearsal: RehearsalConfig
    #: TensorBoard and MLflow tracking. Only the master writes, from background threads: a slow or absent
    #: tracking server never fails or holds up the run. May change on `--resume`.
    tracking: TrackingConfig
