"""Train one ensemble member and write its artifacts; the only module that runs Keras fit.

A member spec is a small plain dict (see ``ensemble.specs``). Training returns a result
dict for the journal; the model, predictions and history go to ``members/<id>/``,
written under temporary names and renamed, so a killed write never looks whole.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Mapping

import numpy as np

from datafeed.pipeline import make_dataset, member_indices
from ensemble import metrics as M


class MemberFailed(RuntimeError):
    """Training produced no usable member; ``kind`` says why (nan_loss, time_limit, ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def injected_failure(member_id: str) -> str | None:
    """Fault injection for resilience tests: ``ENSEMBLE_INJECT_FAILURE="id:kind,..."``.

    kind is ``raise`` (an exception in training), ``nan`` (a NaN loss) or ``exit`` (the
    rank dies as if killed). Off unless the variable is set.
    """
    for item in os.environ.get("ENSEMBLE_INJECT_FAILURE", "").split(","):
        name, _, kind = item.partition(":")
        if name == member_id:
            return kind or "raise"
    return None


def configure_tensorflow(threads: int) -> None:
    """One TensorFlow thread pool of ``threads`` per rank, deterministic ops; call once per process."""
    import tensorflow as tf
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass                        # already initialised in this process: keep what is set
    tf.config.experimental.enable_op_determinism()
    tf.get_logger().setLevel("ERROR")          # per-member retracing notices are expected here


def _optimizer(name: str, lr: float):
    import keras
    return {"adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW, "sgd": keras.optimizers.SGD,
            "rmsprop": keras.optimizers.RMSprop, "nadam": keras.optimizers.Nadam,
            "adagrad": keras.optimizers.Adagrad}[name](learning_rate=lr)


def _time_limit_callback(limit: float):
    import keras

    class TimeLimit(keras.callbacks.Callback):
        """Stop training at the first batch that ends past the member's time limit."""
        def __init__(self):
            super().__init__()
            self.start = time.monotonic()
            self.hit = False

        def on_train_batch_end(self, batch, logs=None):
            if not self.hit and time.monotonic() - self.start > limit:
                self.hit = True
                self.model.stop_training = True

        on_epoch_end = on_train_batch_end
    return TimeLimit()


def _poisoned(loss):
    """A loss that returns NaN, for ``ENSEMBLE_INJECT_FAILURE=<id>:nan``."""
    def nan_loss(y_true, y_pred):
        return loss(y_true, y_pred) * float("nan")
    return nan_loss


def _atomic_save(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".part" + path.suffix)
    write(tmp)
    os.replace(tmp, path)


VAR_FLOOR = 1e-6            # added to the softplus variance head, in the loss and at prediction


def predict(model, x: np.ndarray, task: str, y_shift: float = 0.0, y_scale: float = 1.0,
            gaussian: bool = False, batch_size: int = 512,
            squeeze: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """(prediction, variance or None): probabilities for classification; for regression the
    prediction (and a Gaussian member's variance) in the targets' own units, (n,) for one
    output unless ``squeeze`` is False."""
    # Direct calls in chunks: Keras' predict() would build a tf.data pipeline per member.
    chunks = [np.asarray(model(x[i:i + batch_size], training=False)) for i in range(0, len(x), batch_size)]
    out = np.concatenate(chunks).astype(np.float64) if chunks else np.zeros((0, model.output_shape[-1]))
    if task == "classification":
        return out, None
    var = None
    if gaussian:
        k = out.shape[-1] // 2
        out, raw = out[:, :k], out[:, k:]
        var = (np.logaddexp(0.0, raw) + VAR_FLOOR) * y_scale ** 2     # softplus, as in the loss
    out = out * y_scale + y_shift
    if squeeze and out.shape[-1] == 1:
        out = out[:, 0]
        var = var[:, 0] if var is not None else None
    return out, var


def gaussian_nll(y_true, y_pred):
    """Mean Gaussian negative log-likelihood of (mean, softplus variance) heads, up to a constant."""
    from keras import ops
    k = y_pred.shape[-1] // 2
    mean, var = y_pred[..., :k], ops.softplus(y_pred[..., k:]) + VAR_FLOOR
    y = ops.reshape(ops.cast(y_true, mean.dtype), ops.shape(mean))
    return ops.mean(0.5 * ops.log(var) + 0.5 * ops.square(y - mean) / var, axis=-1)


def evaluate(task: str, y: np.ndarray, pred: np.ndarray, var: np.ndarray | None = None) -> dict[str, float]:
    if task == "classification":
        return M.classification_metrics(y, pred)
    return M.regression_metrics(y, pred, var)


def train_member(spec: dict, data: Mapping[str, np.ndarray], meta: dict, run_dir: Path,
                 group=None) -> dict | None:
    """Train ``spec`` on the shared ``data`` views; return its journal record.

    With a member ``group`` (G > 1 ranks) every rank of the group calls this: each trains
    on its shard of every global batch with a fused gradient allreduce; only the leader
    predicts, writes files and returns the record (the others return None).
    """
    import keras
    from ensemble.architecture import build_model, count_params

    t0 = time.monotonic()
    task = meta["task"]
    gaussian = spec.get("loss") == "gaussian_nll"
    fault = injected_failure(spec["id"])
    if fault == "exit":
        os._exit(9)
    if fault == "raise":
        raise RuntimeError(f"injected failure in member {spec['id']} (ENSEMBLE_INJECT_FAILURE)")
    keras.utils.set_random_seed(spec["seed"])
    model = build_model(spec, tuple(meta["input_shape"]), meta["n_outputs"], task)
    if group is not None:
        from ensemble.data_parallel import broadcast_weights, make_data_parallel
        broadcast_weights(model, group)
    if task == "classification":
        loss, metrics, y_shift, y_scale, y_tf = "sparse_categorical_crossentropy", ["accuracy"], 0.0, 1.0, None
    else:
        y_tr = np.asarray(data["y_train"], dtype=np.float64)
        y_shift, y_scale = float(y_tr.mean()), float(y_tr.std() or 1.0)
        loss, metrics = (gaussian_nll, []) if gaussian else ("mse", ["mae"])
        y_tf = lambda y: (y - y_shift) / y_scale          # noqa: E731 - train on standardised targets
    if fault == "nan":                                  # the loss turns NaN from the first step
        loss = _poisoned(keras.losses.get(loss))
    model.compile(optimizer=_optimizer(spec["optimizer"], spec["learning_rate"]), loss=loss,
                  metrics=metrics, jit_compile=False)
    parallel = make_data_parallel(model, group) if group is not None else []
    idx = member_indices(len(data["y_train"]), spec["seed"], spec.get("bootstrap", False))
    train_ds = make_dataset(data["x_train"], data["y_train"], idx, spec["batch_size"], spec["seed"],
                            y_transform=y_tf,
                            shard=(group.Get_rank(), group.Get_size()) if group is not None else None)
    val_ds = make_dataset(data["x_val"], data["y_val"], np.arange(len(data["y_val"])), 512, 0,
                          shuffle=False, y_transform=y_tf)
    limit = _time_limit_callback(spec["member_time_limit"])
    callbacks = parallel[:1] + [keras.callbacks.TerminateOnNaN(), limit,
                                keras.callbacks.EarlyStopping(monitor="val_loss", patience=spec["patience"],
                                                              restore_best_weights=True)] + parallel[1:]
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
    if group is not None:
        limit.hit = bool(group.allreduce(int(limit.hit)))        # one verdict for the whole group
        if group.Get_rank() != 0:
            return None
    if limit.hit:
        raise MemberFailed("time_limit", f"training exceeded `member_time_limit` "
                           f"({spec['member_time_limit']:g} s) after {len(losses)} of {spec['epochs']} "
                           "epochs; raise the limit or shrink the model")

    out = Path(run_dir) / "members" / spec["id"]
    out.mkdir(parents=True, exist_ok=True)
    preds, variances, predict_seconds = {}, {}, 0.0
    for split in ("val", "test"):
        t_pred = time.perf_counter()
        preds[split], variances[split] = predict(model, np.asarray(data[f"x_{split}"]), task, y_shift,
                                                 y_scale, gaussian)
        if split == "val":                              # inference time, an NSGA-II objective
            predict_seconds = time.perf_counter() - t_pred
        if not np.isfinite(preds[split]).all():
            raise MemberFailed("nan_prediction", f"the trained model predicts NaN/inf on the {split} split")
        _atomic_save(out / f"{split}_pred.npy", lambda p, a=preds[split]: np.save(p, a))
        if gaussian:
            _atomic_save(out / f"{split}_var.npy", lambda p, a=variances[split]: np.save(p, a))
    history = {k: [float(v) for v in vals] for k, vals in hist.items()}
    _atomic_save(out / "history.json", lambda p: p.write_text(json.dumps(history)))
    _atomic_save(out / "scaling.json", lambda p: p.write_text(json.dumps(
        {"y_shift": y_shift, "y_scale": y_scale, "gaussian": gaussian})))
    _atomic_save(out / "model.keras", lambda p: model.save(p))      # last: its presence means whole
    return {
        "id": spec["id"], "status": "ok", "arch": spec.get("arch"), "seed": spec["seed"],
        "val": evaluate(task, np.asarray(data["y_val"]), preds["val"], variances["val"]),
        "test": evaluate(task, np.asarray(data["y_test"]), preds["test"], variances["test"]),
        "params": count_params(model), "epochs": len(losses),
        "stopped": "early_stopping" if len(losses) < spec["epochs"] else "epochs",
        "train_seconds": round(time.monotonic() - t0, 3), "path": str(out.relative_to(run_dir)),
        "predict_seconds_per_sample": predict_seconds / max(1, len(preds["val"])),
    }


def run_member(spec: dict, data: Mapping[str, np.ndarray], meta: dict, run_dir: Path, rank: int,
               group=None) -> dict | None:
    """``train_member`` that never raises: a failure becomes a journal record."""
    t0 = time.monotonic()
    try:
        result = train_member(spec, data, meta, run_dir, group)
        if result is None:                      # a group member that is not the leader
            return None
    except Exception as exc:          # noqa: BLE001 - any member failure is recorded, the run goes on
        if getattr(exc, "inside_group_fit", False):
            raise                         # cannot be recovered without a hang: abort the job
        result = {"id": spec["id"], "status": "failed", "arch": spec.get("arch"), "seed": spec["seed"],
                  "error": {"kind": getattr(exc, "kind", type(exc).__name__), "message": str(exc),
                            "traceback": traceback.format_exc(limit=8)},
                  "train_seconds": round(time.monotonic() - t0, 3)}
    result.update(rank=rank, host=socket.gethostname())
    result.update({k: spec[k] for k in ("genome", "summary") if k in spec})
    return result
