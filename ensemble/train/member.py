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

import logging
import socket
import time
import traceback
from typing import Mapping

import numpy as np

from datafeed.pipeline import make_dataset, member_indices
from ensemble.config.vocabulary import gaussian_head
from ensemble.results.records import REUSED_TRACE, TIME_LIMIT_KIND, Status
from ensemble.results.retention import passes
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.env import TENSORFLOW
from ensemble.runtime.executor import Report
from ensemble.task import get_task
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
                 group=None, report: Report | None = None) -> dict | None:
    """Train ``spec`` on the shared ``data`` views; return its journal record.

    With a member ``group`` (G > 1 ranks) every rank of the group calls this: each trains
    on its shard of every global batch with a fused gradient allreduce; only the leader
    predicts, writes files and returns the record (the others return None).
    """
    import keras

    from ensemble.train.architecture import build_model, make_optimizer

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
    build_seconds = time.monotonic() - t0                 # model, optimizer and both datasets
    limit, clock = _time_limit_callback(spec["member_time_limit"]), _phase_clock()
    early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=spec["patience"], restore_best_weights=True)
    callbacks = parallel[:1] + [clock, keras.callbacks.TerminateOnNaN(), limit, early] + parallel[1:]
    reporter = None
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
    if limit.hit and spec.get("time_limit_fails"):
        raise MemberFailed(TIME_LIMIT_KIND, f"training exceeded `member_time_limit` "
                           f"({spec['member_time_limit']:g} s) after {limit.completed} of {spec['epochs']} "
                           "epochs (`train.time_limit_fails = true` drops such a member)")
    if limit.hit and limit.completed == 0:
        raise MemberFailed(TIME_LIMIT_KIND, f"training exceeded `member_time_limit` "
                           f"({spec['member_time_limit']:g} s) before its first epoch ended; raise the "
                           "limit or shrink the model")
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
    TRACED.keep(key, model)
    return result


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
        "scaling": {"y_shift": y_shift, "y_scale": y_scale, "gaussian": gaussian},
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
               group=None, report: Report | None = None) -> dict | None:
    """``train_member`` that never raises: a failure becomes a journal record."""
    return guarded(lambda: train_member(spec, data, meta, run_dir, group, report), spec, rank)


def failure_record(spec: dict, exc: BaseException, t0: float) -> dict:
    """The journal record of a member whose training raised ``exc`` (call inside ``except``):
    status "limit" when ``train.member_time_limit`` stopped it, else "failed"."""
    log.debug("%s failed: %s", spec["id"], exc)
    kind = getattr(exc, "kind", type(exc).__name__)
    status = Status.LIMIT if kind == TIME_LIMIT_KIND else Status.FAILED
    return {"id": spec["id"], "status": status.value, "arch": spec.get("arch"), "seed": spec["seed"],
            "error": {"kind": kind, "message": str(exc),
                      "traceback": traceback.format_exc(limit=-8)},   # the 8 innermost frames: where it broke
            "train_seconds": round(time.monotonic() - t0, 3), "host": HOST,
            **{k: spec[k] for k in ("genome", "summary") if k in spec}}


def guarded(train, spec: dict, rank: int) -> dict | None:
    """Run ``train()`` (one member, any trainer) and return its journal record: a failure
    becomes a failed (or time-limit) record; rank, host and the spec's genome are added either way."""
    t0 = time.monotonic()
    try:
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
