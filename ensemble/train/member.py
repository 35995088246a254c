"""Train one ensemble member and write its artifacts; the only module that runs Keras fit.

A member spec is a small plain dict (see ``ensemble.sources.members``). Training returns
a result dict for the journal. What is kept follows the bars the spec carries
(``spec["retain"]``, ``results.retention``): the model goes to the run directory (written
atomically, so a killed write never looks whole) only when the member can be among the
kept models, and the predictions (with the history) ride in the result (``payload``) only
when it can be a selection candidate; the master packs them.
A spec with ``report_every = N`` reports its epoch logs to the master every N epochs and
obeys the decision (go on, stop, new learning rate).
"""

from __future__ import annotations

import functools
import logging
import re
import socket
import time
import traceback
from typing import Mapping

import numpy as np

from datafeed.pipeline import make_dataset, member_indices
from ensemble.config.vocabulary import gaussian_head
from ensemble.results.records import DATA_UNREADABLE_KIND, REUSED_TRACE, STORAGE_FULL_KIND, TIME_LIMIT_KIND, Status
from ensemble.results.retention import passes
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.env import TENSORFLOW
from ensemble.runtime.executor import Report
from ensemble.runtime.storage import full_message, storage_full
from ensemble.runtime.tail import MIN_STEP_SECONDS, PAYS
from ensemble.runtime.watchdog import Watchdog, stuck_seconds
from ensemble.task import get_task
from ensemble.task.tasks import scaling_json
from ensemble.train.traced import BUILD_LOCK, PRETRACE, TRACED, adopt, trace_key

log = logging.getLogger(__name__)
HOST = socket.gethostname()


class MemberFailed(RuntimeError):
    """Training produced no usable member; ``kind`` says why (nan_loss, time_limit, ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


#: the clock ``member_time_limit`` is measured on (a test may replace it)
_clock = time.monotonic


def stop_on_nan():
    """Keras' TerminateOnNaN without its line on the worker's stdout ("Batch 4: Invalid loss,
    terminating training"): the member's record says it (kind ``nan_loss``)."""
    import keras

    class QuietTerminateOnNaN(keras.callbacks.TerminateOnNaN):
        def on_batch_end(self, batch, logs=None):
            loss = (logs or {}).get("loss")
            if loss is not None and not np.isfinite(float(loss)):
                self.model.stop_training = True

    return QuietTerminateOnNaN()


def _time_limit_callback(limit: float):
    import keras

    class TimeLimit(keras.callbacks.Callback):
        """Stop training at the first batch that ends past the member's time limit;
        ``completed`` counts the epochs that ended before it."""
        def __init__(self):
            super().__init__()
            self.start = _clock()
            self.hit = False
            self.completed = 0

        def on_train_batch_end(self, batch, logs=None):
            if not self.hit and _clock() - self.start > limit:
                self.hit = True
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            if not self.hit:
                self.completed += 1
            self.on_train_batch_end(0)
    return TimeLimit()


def _report_callback(report: Report, every: int):
    """Every ``every`` epochs: send the epoch's logs to the master, act on its decision.

    Every rank of a group calls ``report`` at the same epoch (the executor broadcasts the
    leader's decision), so a stop or an update happens at the same step everywhere.
    """
    import keras

    class ReportToMaster(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.stopped_by_master = False
            self.decisions: list[dict] = []

        def on_epoch_end(self, epoch, logs=None):
            if (epoch + 1) % every:
                return
            decision = report({"epoch": epoch + 1, "logs": {k: float(v) for k, v in (logs or {}).items()}})
            self.decisions.append(decision)
            if decision["action"] == "stop":
                self.stopped_by_master = True
                self.model.stop_training = True
            elif decision["action"] == "update":
                settings = decision["settings"]
                if "learning_rate" in settings:
                    self.model.optimizer.learning_rate.assign(float(settings["learning_rate"]))
    return ReportToMaster()


def _phase_clock():
    """A Keras callback that times the phases of ``fit``: the first epoch (tracing included),
    the later ones, and the validation passes inside them."""
    import keras

    class PhaseClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.fit_start = self.first_end = self.fit_end = None
            self.validation, self._val_start = 0.0, None

        def on_train_begin(self, logs=None):
            if self.fit_start is None:              # a member that grew (``runtime.tail``) fits again
                self.fit_start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if self.first_end is None:
                self.first_end = time.perf_counter()

        def on_test_begin(self, logs=None):
            self._val_start = time.perf_counter()

        def on_test_end(self, logs=None):
            if self._val_start is not None:
                self.validation += time.perf_counter() - self._val_start

        def on_train_end(self, logs=None):
            self.fit_end = time.perf_counter()

        def costs(self) -> dict:
            """Seconds: ``first_epoch`` (tracing included), ``epochs`` (the later ones), and
            ``validation`` (every epoch's validation pass, also counted in those two)."""
            if self.fit_start is None:
                return {}
            end = self.fit_end or time.perf_counter()
            first = (self.first_end or end) - self.fit_start
            return {"first_epoch": round(first, 4), "epochs": round(end - self.fit_start - first, 4),
                    "validation": round(self.validation, 4)}
    return PhaseClock()


def train_member(spec: dict, data: Mapping[str, np.ndarray], meta: dict, run_dir: RunDirectory,
                 group=None, report: Report | None = None, tail=None) -> dict | None:
    """Train ``spec`` on the shared ``data`` views; return its journal record.

    With a member ``group`` (G > 1 ranks) every rank of the group calls this: each trains
    on its shard of every global batch with a fused gradient allreduce; only the leader
    predicts, writes files and returns the record (the others return None). With ``tail``
    (a ``runtime.tail.WorkerTail``, a worker of one rank) the member takes the helpers the
    master sends at the end of the run, at its epoch ends (``grow_and_fit``).
    """
    import keras

    from ensemble.train.architecture import build_model, build_training_state, make_optimizer

    t0 = time.monotonic()
    task = get_task(meta["task"])
    gaussian = gaussian_head(spec.get("loss"), task.name, bool(spec.get("model")))
    with BUILD_LOCK:                                    # a pretrace thread builds nothing meanwhile
        keras.utils.set_random_seed(spec["seed"])
        model = build_model(spec, tuple(meta["input_shape"]), meta["n_outputs"], task.name)
    inherited = None
    if spec.get("inherit"):                             # evolve.inherit: start from the parent's weights
        from ensemble.train.inherit import inherit_weights
        inherited = {"from": spec["inherit"]["from"], **inherit_weights(model, spec["inherit"]["path"])}
    if group is not None:
        from ensemble.runtime.data_parallel import broadcast_weights, make_data_parallel
        broadcast_weights(model, group)
    loss, metrics = task.loss(gaussian)
    y_shift, y_scale = task.target_scaling(data["y_train"])
    y_tf = task.target_transform(y_shift, y_scale)        # members train on standardised targets
    TRACED.size = TENSORFLOW["traced_models"]
    key = trace_key(spec, meta, TENSORFLOW, group)
    PRETRACE.wait(key)                                    # traced ahead: let that end
    kept = TRACED.take(key)
    if kept is not None and adopt(kept, model, make_optimizer(spec["optimizer"], spec["learning_rate"])):
        model, reused = kept, True                            # its traced steps, this member's state
    else:
        model.compile(optimizer=make_optimizer(spec["optimizer"], spec["learning_rate"]), loss=loss,
                      metrics=metrics, jit_compile=TENSORFLOW["jit_compile"])
        reused = False
    parallel = make_data_parallel(model, group) if group is not None else []
    train_ds, val_ds = member_datasets(spec, data, meta, y_tf, group)
    if not reused:
        build_training_state(model, train_ds)              # its training step traced once, not twice
    build_seconds = time.monotonic() - t0                 # model, optimizer and both datasets
    limit, clock = _time_limit_callback(spec["member_time_limit"]), _phase_clock()
    early = _early_stopping(spec)
    reporter = None
    if tail is not None and group is None:             # the end of the run may send helpers
        crew = Crew(tail, [tail.rank], leader=True)
        if report is not None and spec.get("report_every"):
            reporter = _report_callback(crew.report(report), int(spec["report_every"]))
        hist = grow_and_fit(model, crew, spec, data, meta, y_tf, (train_ds, val_ds),
                            [clock, stop_on_nan(), limit, early]
                            + ([reporter] if reporter is not None else []), early, limit, 0)
        helped = crew.helped()
        if helped:
            key = None                                 # its steps are data-parallel now: not kept
    else:
        helped = {}
        callbacks = parallel[:1] + [clock, stop_on_nan(), limit, early] + parallel[1:]
        if report is not None and spec.get("report_every"):
            reporter = _report_callback(report, int(spec["report_every"]))
            callbacks.append(reporter)
        try:
            hist = model.fit(train_ds, validation_data=val_ds, epochs=spec["epochs"], verbose=0, shuffle=False,
                             callbacks=callbacks).history
        except Exception as exc:
            exc.inside_group_fit = group is not None   # the other ranks may wait in an allreduce forever
            raise
    losses = np.asarray(hist.get("loss", []), dtype=np.float64)
    if not len(losses) or not np.isfinite(losses).all():
        raise MemberFailed("nan_loss", f"training loss became NaN/inf at epoch {len(losses)}; lower "
                           f"`learning_rate` (now {spec['learning_rate']}) or check the data")
    check_weights(model, spec)
    if group is not None:
        limit.hit = bool(group.allreduce(int(limit.hit)))        # one verdict for the whole group
        limit.completed = min(group.allgather(limit.completed))
        if group.Get_rank() != 0:                                # the leader alone records the member
            return None
    if limit.hit:
        check_time_limit(spec, limit.completed)
    if limit.hit and early.best_weights is not None:             # the limit, not patience, stopped it:
        model.set_weights(early.best_weights)                    # keep its best validated weights

    log.debug("%s: trained %d epochs in %.2f s", spec["id"], len(losses), time.monotonic() - t0)
    stopped = ("time_limit" if limit.hit else "early_stopping" if len(losses) < spec["epochs"] else "epochs")
    result = member_record(spec, model, data, run_dir, task, gaussian, y_shift, y_scale,
                           {k: [float(v) for v in vals] for k, vals in hist.items()}, len(losses), t0,
                           build_seconds, "master" if reporter is not None and reporter.stopped_by_master else stopped,
                           meta)
    result["costs"] = {"build": round(build_seconds, 4), **clock.costs(), **result["costs"]}
    result["costs"]["other"] = round(max(0.0, result["train_seconds"] - sum(
        v for k, v in result["costs"].items() if k != "validation")), 4)
    if inherited is not None:
        result["inherited"] = inherited
    if reporter is not None:
        result["decisions"] = [d["action"] for d in reporter.decisions]
    if reused:                                        # trained on a kept model: no tracing (``train.traced``)
        result[REUSED_TRACE] = True
    result.update(helped)
    TRACED.keep(key, model)
    return result


def _early_stopping(spec: dict):
    """The member's early stopping on the validation loss (its counters survive a pause)."""
    return _resumable()(monitor="val_loss", patience=spec["patience"], restore_best_weights=True)


@functools.cache
def _resumable():
    import keras

    class Resumable(keras.callbacks.EarlyStopping):
        """EarlyStopping whose counters (and best weights) live on when ``fit`` is left to
        grow the member's group and entered again (``grow_and_fit``); ``pausing`` says the
        ``fit`` that ends now is such a pause (the best weights are not restored)."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.begun = self.pausing = False

        def on_train_begin(self, logs=None):
            if not self.begun:
                super().on_train_begin(logs)
                self.begun = True

        def on_train_end(self, logs=None):
            if not self.pausing:
                super().on_train_end(logs)

        def state(self) -> dict:
            return {"wait": self.wait, "best": self.best, "best_epoch": self.best_epoch,
                    "stopped_epoch": self.stopped_epoch}

        def load(self, state: dict) -> None:
            self.begun = True
            for name, value in state.items():
                setattr(self, name, value)
    return Resumable


class Crew:
    """The ranks training one member at the end of the run (``runtime.tail``): the member's
    worker (the leader, first) and its helpers; their communicator (None alone) and the
    data-parallel callbacks once there is more than one."""

    def __init__(self, tail, ranks: list[int], leader: bool):
        self.tail, self.ranks, self.leader = tail, list(ranks), leader
        self.group = None
        self.parallel: list = []
        self.joined: dict[int, float] = {}              # helper rank -> when it joined (the leader's clock)
        self.spent, self.most = 0.0, 0                  # helpers' seconds in a crew that parted; most helpers

    def grow(self, ranks: list[int]) -> None:
        """Every rank of the grown group (old ranks first, in their order): the new communicator."""
        now = time.monotonic()
        self.joined.update({r: now for r in ranks if r not in self.ranks})
        old, self.ranks = self.group, list(ranks)
        self.most = max(self.most, len(self.ranks) - 1)
        self.group = self.tail.form(self.ranks)
        if old is not None:
            old.Free()

    def part(self, model) -> None:
        """The crew parts before the member ends (its helpers did not speed it up): the
        leader trains on alone, with its model's own steps."""
        from ensemble.runtime.data_parallel import undo_data_parallel
        now = time.monotonic()
        self.spent += sum(now - t for t in self.joined.values())
        self.joined.clear()
        if self.group is not None:
            self.group.Free()
        self.group, self.ranks = None, self.ranks[:1]
        if self.leader:
            undo_data_parallel(model)
            self.parallel = []

    def helped(self) -> dict:
        """The leader's record fields: the most helpers it had and their seconds in the crew
        (``records.helped_fields``)."""
        from ensemble.results.records import helped_fields
        now = time.monotonic()
        return helped_fields(self.most, self.spent + sum(now - t for t in self.joined.values()))

    def data_parallel(self, model) -> None:
        from ensemble.runtime.data_parallel import make_data_parallel, rebind
        if self.parallel:
            rebind(self.parallel, self.group)
        else:
            self.parallel = make_data_parallel(model, self.group)

    def report(self, report: Report | None) -> Report:
        """The leader's report to the master, its decision then given to every rank of the crew
        (a helper passes ``None``: it only receives the decision)."""
        from ensemble.runtime.mpi import polite_bcast

        def crew_report(payload: dict) -> dict:
            decision = report(payload) if self.leader else None
            return decision if self.group is None else polite_bcast(self.group, decision)
        return crew_report


def _help_check(crew: Crew, spec: dict, early):
    """The leader's last callback before the group's stop: at an epoch end, helpers that have
    arrived (up to the global batch: a rank needs a row) pause ``fit`` to grow the group,
    unless the member ends now anyway."""
    import keras

    class HelpCheck(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.pending: list[int] = []
            self.pausing = self.parting = self.declined = False
            self.step = float("inf")                  # the shortest seconds per training step alone
            self.crew_steps: list[float] = []         # seconds per step in the crew since it last grew
            self._fit_epochs = 0
            self._begin = self._last = 0.0
            self._steps = 0

        def on_train_begin(self, logs=None):
            self.pausing = self.parting = early.pausing = False
            self._fit_epochs = 0

        def on_epoch_begin(self, epoch, logs=None):
            self._begin, self._steps = time.perf_counter(), 0

        def on_train_batch_end(self, batch, logs=None):
            self._steps += 1
            self._last = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if not crew.leader:
                return
            if self._steps and self._fit_epochs:            # not the first epoch of a fit: it traces
                seconds = (self._last - self._begin) / self._steps
                if len(crew.ranks) == 1:
                    self.step = min(self.step, seconds)
                else:
                    self.crew_steps.append(seconds)
            self._fit_epochs += 1
            ending = self.model.stop_training or epoch + 1 >= spec["epochs"]
            if (len(crew.ranks) > 1 and len(self.crew_steps) >= 2 and not ending
                    and self.step / min(self.crew_steps) < PAYS):
                self.parting = self.pausing = early.pausing = self.declined = True   # the crew does not pay
                self.model.stop_training = True
                return
            arrived = crew.tail.arrived(spec["id"])
            if arrived and (self.declined or (len(crew.ranks) == 1 and self.step < MIN_STEP_SECONDS)):
                if self.declined:
                    crew.tail.release(arrived)
                else:                                 # steps too short to share: no helpers, and no more
                    self.declined = True
                    crew.tail.decline(spec["id"], arrived)
                return
            room = max(0, int(spec["batch_size"]) - len(crew.ranks) - len(self.pending))
            self.pending += arrived[:room]
            crew.tail.release(arrived[room:])
            if self.pending and not ending and self.step < float("inf"):     # its step measured alone first
                self.model.stop_training = self.pausing = early.pausing = True

        def take(self) -> dict | None:
            """After ``fit``: the crew's next ranks (a pause: grown by the helpers waiting, or the
            leader alone when the crew did not pay), or None: the member ended."""
            pending, self.pending = self.pending, []
            if self.parting:
                crew.tail.decline(spec["id"], pending)      # the master frees the crew, sends no more
                return {"ranks": crew.ranks[:1]}
            if self.pausing and pending:
                self.crew_steps = []
                crew.tail.invite(crew.ranks + pending, pending)
                return {"ranks": crew.ranks + pending}
            crew.tail.release(pending)
            return None
    return HelpCheck()


def grow_and_fit(model, crew: Crew, spec: dict, data, meta: dict, y_tf, datasets, callbacks: list, early, limit,
                 epoch: int) -> dict:
    """Train from ``epoch`` on, the crew growing at epoch ends as helpers arrive; every rank of
    the crew runs this (the helpers from ``help_member``). Returns the history of the epochs
    trained here. At each pause the leader tells the crew the new ranks (none: the end), the
    new ranks are invited, the group is formed, the leader's state (weights, optimizer,
    epoch, early-stopping counters, elapsed time) goes to every rank, and ``fit`` goes on on
    the new shards. At the end the crew agrees on the time limit's verdict and parts."""
    from ensemble.runtime.mpi import polite_bcast
    check = _help_check(crew, spec, early)
    train_ds, val_ds = datasets
    history: dict[str, list] = {}
    while True:
        cbs = crew.parallel[:1] + callbacks + [check] + crew.parallel[1:]
        try:
            hist = model.fit(train_ds, validation_data=val_ds, initial_epoch=epoch, epochs=spec["epochs"],
                             verbose=0, shuffle=False, callbacks=cbs).history
        except Exception as exc:
            exc.inside_group_fit = crew.group is not None
            if crew.leader and crew.group is None:
                crew.tail.release(check.pending)              # no helper waits for a member that failed
            raise
        for k, v in hist.items():
            history.setdefault(k, []).extend(v)
        epoch += len(hist.get("loss", []))
        plan = check.take() if crew.leader else None
        if crew.group is not None:
            plan = polite_bcast(crew.group, plan)         # the crew hears: its next ranks, or the end
        if plan is None:
            break
        if len(plan["ranks"]) == 1:                       # the crew parts: the leader goes on alone
            crew.part(model)
            if not crew.leader:
                return history
            train_ds, val_ds = member_datasets(spec, data, meta, y_tf, None)
            continue
        crew.grow(plan["ranks"])
        state = {"epoch": epoch, "elapsed": _clock() - limit.start, "completed": limit.completed,
                 "early": early.state()} if crew.leader else None
        epoch = _share(model, crew, state, early, limit)
        crew.data_parallel(model)
        train_ds, val_ds = member_datasets(spec, data, meta, y_tf, crew.group)
    if crew.group is not None:
        limit.hit = bool(crew.group.allreduce(int(limit.hit)))       # one verdict for the whole crew
        limit.completed = min(crew.group.allgather(limit.completed))
        crew.group.Free()
        crew.group = None
    return history


def _share(model, crew: Crew, state: dict | None, early, limit) -> int:
    """The leader's state to every rank of the crew (its weights, its optimizer's variables,
    and ``state``: epoch, elapsed seconds, epochs within the time limit, early-stopping
    counters); returns the epoch to go on from."""
    from ensemble.runtime.data_parallel import broadcast_variables, broadcast_weights
    from ensemble.runtime.mpi import polite_bcast
    optimizer = model.optimizer
    if not optimizer.built:                            # a helper's: its variables to receive into
        optimizer.build(model.trainable_variables)
    broadcast_weights(model, crew.group)
    broadcast_variables(list(optimizer.variables), crew.group)
    state = polite_bcast(crew.group, state)
    if not crew.leader:
        limit.start = _clock() - state["elapsed"]
        limit.completed = state["completed"]
        early.load(state["early"])
    return int(state["epoch"])


def help_member(spec: dict, data: Mapping[str, np.ndarray], meta: dict, leader: int, tail) -> None:
    """A helper at the end of the run: build ``spec``'s model as its worker did, wait for the
    worker (``leader``) to take it into its crew, then train with the crew until the member
    ends (``grow_and_fit``). The leader records the member; a helper returns nothing, also
    when the member ended before it was taken in."""
    import keras

    from ensemble.train.architecture import build_model, build_training_state, make_optimizer
    task = get_task(meta["task"])
    gaussian = gaussian_head(spec.get("loss"), task.name, bool(spec.get("model")))
    with BUILD_LOCK:
        keras.utils.set_random_seed(spec["seed"])
        model = build_model(spec, tuple(meta["input_shape"]), meta["n_outputs"], task.name)
    loss, metrics = task.loss(gaussian)
    model.compile(optimizer=make_optimizer(spec["optimizer"], spec["learning_rate"]), loss=loss, metrics=metrics,
                  jit_compile=TENSORFLOW["jit_compile"])
    y_shift, y_scale = task.target_scaling(data["y_train"])
    y_tf = task.target_transform(y_shift, y_scale)
    ranks = tail.answer(leader)
    if ranks is None:                                   # the member ended first
        return
    crew = Crew(tail, [], leader=False)
    crew.grow(ranks)
    datasets = member_datasets(spec, data, meta, y_tf, crew.group)
    build_training_state(model, datasets[0])            # the leader's optimizer state is loaded into it
    limit, early = _time_limit_callback(spec["member_time_limit"]), _early_stopping(spec)
    epoch = _share(model, crew, None, early, limit)
    crew.data_parallel(model)
    callbacks = [stop_on_nan(), limit, early]
    if spec.get("report_every"):
        callbacks.append(_report_callback(crew.report(None), int(spec["report_every"])))
    grow_and_fit(model, crew, spec, data, meta, y_tf, datasets,
                 callbacks, early, limit, epoch)


def check_weights(model, spec: dict) -> None:
    """Raise ``nan_loss`` when training left a weight NaN/inf: the loss can stay finite over
    NaN weights (a CPU's max(NaN, 0) in ReLU may give 0), and every prediction would be NaN."""
    if not all(np.isfinite(w).all() for w in model.get_weights()):
        raise MemberFailed("nan_loss", "training made weights NaN/inf (the loss stayed finite, a ReLU hid "
                           f"them); lower `learning_rate` (now {spec['learning_rate']}) or check the data")


def member_datasets(spec: dict, data: Mapping[str, np.ndarray], meta: dict, y_tf, group=None):
    """The member's (training, validation) tf.data datasets: gathered from the shared arrays,
    or read from the files when the data streams (``meta["stream"]``, ``datafeed.streaming``)."""
    shard = (group.Get_rank(), group.Get_size()) if group is not None else None
    if meta.get("stream"):
        feed = streamed(meta, data)
        return (feed.train_dataset(spec["batch_size"], spec["seed"], spec.get("bootstrap", False), y_tf, shard),
                feed.eval_dataset("val", y_tf))
    idx = member_indices(len(data["y_train"]), spec["seed"], spec.get("bootstrap", False))
    train_ds = make_dataset(data["x_train"], data["y_train"], idx, spec["batch_size"], spec["seed"],
                            y_transform=y_tf, shard=shard)
    val_ds = make_dataset(data["x_val"], data["y_val"], stopping_rows(data, meta), 512, 0,
                          shuffle=False, y_transform=y_tf)
    return train_ds, val_ds


def stopping_rows(data: Mapping[str, np.ndarray], meta: dict) -> np.ndarray:
    """The validation rows a member stops early on: all of them, less those
    ``data.calibration_holdout`` keeps for the recalibration."""
    from ensemble.task.calibration import holdout_rows
    return holdout_rows(len(data["y_val"]), meta.get("calibration_holdout", 0.0))[0]


_STREAMED: dict = {}


def streamed(meta: dict, data: Mapping[str, np.ndarray]):
    """This process's ``datafeed.streaming.Streamed`` for the run's data (made once: staging
    the files node-locally, when ``data.stage_dir`` is set, happens before the first member)."""
    from datafeed.streaming import Streamed
    key = (id(data), meta["stream"]["source"])
    if key not in _STREAMED:
        _STREAMED.clear()
        _STREAMED[key] = Streamed(meta, data)
    return _STREAMED[key]


def split_predictions(task, model, data: Mapping[str, np.ndarray], meta: dict, split: str, y_shift: float,
                      y_scale: float, gaussian: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """A member's (prediction, variance) on a split: from the shared array, or a chunk at a
    time from the files when the data streams."""
    if not meta.get("stream"):
        return task.predict(model, np.asarray(data[f"x_{split}"]), y_shift, y_scale, gaussian)
    parts = [task.predict(model, x, y_shift, y_scale, gaussian) for x in streamed(meta, data).chunks(split)]
    pred = np.concatenate([p for p, _ in parts])
    return pred, (None if parts[0][1] is None else np.concatenate([v for _, v in parts]))


def member_record(spec: dict, model, data: Mapping[str, np.ndarray], run_dir: RunDirectory, task, gaussian: bool,
                  y_shift: float, y_scale: float, history: dict, epochs: int, t0: float, build_seconds: float,
                  stopped: str, meta: dict | None = None) -> dict:
    """A trained member's journal record: its predictions on the validation and test splits
    scored, its model written when it can still matter, its predictions in ``payload`` when
    it can be a selection candidate (alone or packed, a member ends here)."""
    from ensemble.train.architecture import count_params
    member = spec["id"]
    preds, variances, predict_seconds = {}, {}, 0.0
    t_predict = time.perf_counter()
    for split in ("val", "test"):
        t_pred = time.perf_counter()
        preds[split], variances[split] = split_predictions(task, model, data, meta or {}, split, y_shift,
                                                           y_scale, gaussian)
        if split == "val":                              # inference time, an NSGA-II objective
            predict_seconds = time.perf_counter() - t_pred
        if not np.isfinite(preds[split]).all():
            raise MemberFailed("nan_prediction", f"the trained model predicts NaN/inf on the {split} split")
    predict_all = time.perf_counter() - t_predict
    val = task.metrics(np.asarray(data["y_val"]), preds["val"], variances["val"])
    keep_model = passes(spec.get("retain"), "models", val, member)
    t_write = time.perf_counter()
    model_file = run_dir.save_model(member, model) if keep_model else None   # only one that can still matter
    write_seconds = time.perf_counter() - t_write
    result = {
        "id": member, "status": Status.OK.value, "arch": spec.get("arch"), "seed": spec["seed"],
        "val": val, "test": task.metrics(np.asarray(data["y_test"]), preds["test"], variances["test"]),
        "params": count_params(model), "epochs": epochs, "stopped": stopped,
        "train_seconds": round(time.monotonic() - t0, 3), "build_seconds": round(build_seconds, 3),
        "model": keep_model, "path": run_dir.model_ref(member) if keep_model else None, "model_file": model_file,
        "scaling": {"y_shift": scaling_json(y_shift), "y_scale": scaling_json(y_scale), "gaussian": gaussian},
        "predict_seconds_per_sample": predict_seconds / max(1, len(preds["val"])),
        "costs": {"predict": round(predict_all, 4), "write": round(write_seconds, 4)},
    }
    result.update(candidate_payload(spec, val, preds, variances, history))
    return result


def candidate_payload(spec: dict, val: dict, preds: dict, variances: dict, history: dict | None = None) -> dict:
    """``{"payload": ...}`` with the member's predictions when it can enter the candidate set
    (the master stores them, packed), else ``{}``: the predictions of a member that cannot
    be selected go nowhere."""
    if not passes(spec.get("retain"), "predictions", val, spec["id"]):
        return {}
    arrays = {f"{split}_pred": preds[split] for split in ("val", "test")}
    arrays.update({f"{split}_var": variances[split] for split in ("val", "test") if variances[split] is not None})
    return {"payload": {"arrays": arrays, "meta": {"history": history} if history else {}}}


def run_member(spec: dict, data: Mapping[str, np.ndarray], meta: dict, run_dir: RunDirectory, rank: int,
               group=None, report: Report | None = None, tail=None) -> dict | None:
    """``train_member`` that never raises: a failure becomes a journal record."""
    return guarded(lambda: train_member(spec, data, meta, run_dir, group, report, tail), spec, rank)


#: exceptions raised where data is read (a Python generator under tf.data: TensorFlow reports
#: them as an UnknownError whose text holds the original line) that mean the data is gone
UNREADABLE = ("FileNotFoundError", "PermissionError", "IsADirectoryError")


def root_cause(exc: BaseException) -> tuple[str, str]:
    """A failed member's error kind and message: the exception's own, or, for TensorFlow's wrapper
    of an error raised in a Python function it called (tf.data reading a file), the original
    error's line first (it was buried in 50 lines of TensorFlow's trace); a data file that cannot be
    read any more is ``DATA_UNREADABLE_KIND``."""
    kind, text = getattr(exc, "kind", type(exc).__name__), str(exc)
    full = storage_full(exc)
    if full is not None:                        # a full disk: not this member's fault, and every one would fail
        return STORAGE_FULL_KIND, full_message(full)
    if not (type(exc).__module__.startswith("tensorflow") or "Graph execution error" in text):
        return kind, text                       # not TensorFlow's wrapper: the error is its own
    inner = re.findall(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", text, re.MULTILINE)
    inner = [(k, m) for k, m in inner if k != kind and "Graph execution error" not in m]
    if inner:
        first, line = inner[-1]
        if first in UNREADABLE:
            return DATA_UNREADABLE_KIND, (f"the data could not be read: {first}: {line.strip()} (a file deleted, "
                                          "moved or made unreadable while the run reads it)")
        return kind, f"{first}: {line.strip()} (raised inside TensorFlow; its trace follows)\n{text}"
    return kind, text


def check_time_limit(spec: dict, completed: int) -> None:
    """A member its ``member_time_limit`` stopped after ``completed`` epochs: ``MemberFailed`` (status
    "limit") when none completed or ``train.time_limit_fails`` drops it; else it keeps its best
    epochs. Every trainer (Keras, rehearsal) decides it here."""
    if spec.get("time_limit_fails"):
        raise MemberFailed(TIME_LIMIT_KIND, f"training exceeded `member_time_limit` "
                           f"({spec['member_time_limit']:g} s) after {completed} of {spec['epochs']} "
                           "epochs (`train.time_limit_fails = true` drops such a member)")
    if completed == 0:
        raise MemberFailed(TIME_LIMIT_KIND, f"training exceeded `member_time_limit` "
                           f"({spec['member_time_limit']:g} s) before its first epoch ended; raise the "
                           "limit or shrink the model")


def failure_record(spec: dict, exc: BaseException, t0: float) -> dict:
    """The journal record of a member whose training raised ``exc`` (call inside ``except``):
    status "limit" when ``train.member_time_limit`` stopped it, else "failed"."""
    log.debug("%s failed: %s", spec["id"], exc)
    kind, message = root_cause(exc)
    status = Status.LIMIT if kind == TIME_LIMIT_KIND else Status.FAILED
    return {"id": spec["id"], "status": status.value, "arch": spec.get("arch"), "seed": spec["seed"],
            "error": {"kind": kind, "message": message,
                      "traceback": traceback.format_exc(limit=-8)},   # the 8 innermost frames: where it broke
            "train_seconds": round(time.monotonic() - t0, 3), "host": HOST,
            **{k: spec[k] for k in ("genome", "summary") if k in spec}}


def guarded(train, spec: dict, rank: int, watched: bool = True) -> dict | None:
    """Run ``train()`` (one member, any trainer) and return its journal record: a failure
    becomes a failed (or time-limit) record; rank, host and the spec's genome are added either way.
    ``watched``: the rank ends itself when the member is stuck (``runtime.watchdog``); not a
    population's member, which trains for the whole run."""
    t0 = time.monotonic()
    limit = spec.get("member_time_limit")
    bound = stuck_seconds(limit) if watched else None
    stuck = (f"{spec['id']} is still running {bound:g} s after it started, well past its "
             f"`train.member_time_limit` ({limit:g} s): it is stuck (a builder that never "
             "returns, a hung file system or collective); this rank ends, and with it the job: `--resume` hands "
             "it out again among the members in flight when a job was lost, and gives it up if it is lost with "
             "the job again" if bound is not None else "")
    try:
        with Watchdog(bound, stuck):
            result = train()
        if result is None:                      # a group member that is not the leader
            return None
    except Exception as exc:
        if getattr(exc, "inside_group_fit", False):
            raise                         # cannot be recovered without a hang: abort the job
        result = failure_record(spec, exc, t0)
    result.update(rank=rank, host=HOST)
    result.update({k: spec[k] for k in ("genome", "summary") if k in spec})
    return result
