"""Packed members (``runtime.members_per_rank = K``): K members of one architecture trained at
once in one process, as one graph.

Small networks leave a core (or a GPU) mostly idle: each training step of a 10,000-parameter
MLP is a hundred tiny kernels whose launch costs more than their arithmetic. Packed, the K
members' weights are stacked along a new first axis and every Dense layer becomes one
batched matmul (``einsum("kbi,kio->kbo")``) for all of them: one step costs about as many
kernel launches as one member's.

Each member stays itself, so that its result equals what it gets trained alone (bit for bit
here, on CPU: ``tests/ensemble/test_packed.py``):

- its own initial weights (its Keras model is built with its own seed, as alone, and its
  weights copied into its slice), its own data order and bootstrap (its own ``make_dataset``,
  iterated as Keras ``fit`` iterates one: a second iterator per epoch, unused), its own
  dropout masks (each member's own Dropout layer draws them from its own seed stream);
- its own loss: the packed loss is the sum of the members' mean losses, so the gradient of
  each slice is its own member's gradient; its own optimizer state: every Keras optimizer
  here is elementwise, so one optimizer over stacked variables is K independent ones;
- its own early stopping (Keras ``EarlyStopping``'s rule on its own validation loss, best
  weights kept), NaN check and epoch count; a member that stops keeps its best weights while
  the others go on.

What packs: layer lists of Dense and Dropout layers on flat samples (the task's head
included), float32, no in-training reports (early discarding needs them), members with
equal training settings. Anything else trains alone, one by one (``pack_key`` says None).
The time limit is checked once per epoch for the whole pack.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Mapping

import numpy as np

log = logging.getLogger(__name__)

#: layer type -> the settings a packed layer honours (anything else: the member trains alone)
PACKABLE = {"Dense": {"type", "units", "activation", "use_bias", "kernel_initializer", "bias_initializer"},
            "Dropout": {"type", "rate", "seed"}}
#: the spec's settings that must be equal across a pack
SHARED = ("layers", "epochs", "batch_size", "optimizer", "learning_rate", "patience", "loss")


def pack_key(spec: dict) -> str | None:
    """What a spec shares with those it may be packed with, or None when it must train alone."""
    if spec.get("model") or spec.get("report_every") or spec.get("inherit") or spec.get("pbt"):
        return None
    layers = spec.get("layers") or []
    for layer in layers:
        allowed = PACKABLE.get(layer.get("type"))
        if allowed is None or set(layer) - allowed:
            return None
    return json.dumps({k: spec.get(k) for k in SHARED}, sort_keys=True)


def _dense_layers(model) -> list:
    import keras
    return [layer for layer in model.layers if isinstance(layer, (keras.layers.Dense, keras.layers.Dropout))]


class Pack:
    """K members' models, stacked: the packed forward pass, step and validation loss."""

    def __init__(self, models: list, optimizer, loss):
        import keras
        import tensorflow as tf
        self.models, self.k = models, len(models)
        self.layers = list(zip(*[_dense_layers(m) for m in models]))   # per position: each member's layer
        self.kernels, self.biases, self.plan = [], [], []
        for position in self.layers:
            first = position[0]
            if isinstance(first, keras.layers.Dense):
                kernel = tf.Variable(np.stack([layer.kernel.numpy() for layer in position]), name="packed_kernel")
                bias = (tf.Variable(np.stack([layer.bias.numpy() for layer in position]), name="packed_bias")
                        if first.use_bias else None)
                self.kernels.append(kernel)
                self.biases.append(bias)
                self.plan.append(("dense", kernel, bias, first.activation))
            else:
                self.plan.append(("dropout", position))
        self.variables = self.kernels + [b for b in self.biases if b is not None]
        self.optimizer, self.loss = optimizer, loss
        self.rows = None                             # [K, B] row indices -> (x, y) batches, see ``train_packed``
        optimizer.build(self.variables)
        self.step = tf.function(self._step)
        self.val_loss = tf.function(self._val_loss)

    def forward(self, x, training: bool):
        import tensorflow as tf
        h = x
        for item in self.plan:
            if item[0] == "dense":
                _, kernel, bias, activation = item
                h = tf.einsum("kbi,kio->kbo", h, kernel)
                if bias is not None:
                    h = h + bias[:, None, :]
                h = activation(h)
            elif training:                      # each member's own Dropout layer: its own mask stream
                h = tf.stack([layer(h[i], training=True) for i, layer in enumerate(item[1])])
        return h

    def _losses(self, y, pred):
        import tensorflow as tf
        return tf.reduce_mean(self.loss(y, pred), axis=1)

    def _step(self, index_batches):
        import tensorflow as tf
        x, y = self.rows(tf.stack(index_batches))                  # each member's own rows, one call for all
        with tf.GradientTape() as tape:
            losses = self._losses(y, self.forward(x, True))
            total = tf.reduce_sum(losses)
        self.optimizer.apply(tape.gradient(total, self.variables), self.variables)
        return losses

    def _val_loss(self, x, y):
        import tensorflow as tf
        shape = tf.shape(x)
        xs = tf.broadcast_to(x[None], tf.concat([[self.k], shape], 0))
        ys = tf.broadcast_to(y[None], tf.concat([[self.k], tf.shape(y)], 0))
        return self._losses(ys, self.forward(xs, False))

    def member_weights(self, i: int) -> list[np.ndarray]:
        return [v.numpy()[i].copy() for v in self.variables]

    def give_back(self, i: int, weights: list[np.ndarray]) -> None:
        """Member ``i``'s (best) weights into its own Keras model."""
        values = dict(zip([id(v) for v in self.variables], weights))
        for item, position in zip(self.plan, self.layers):
            if item[0] != "dense":
                continue
            layer, kernel, bias = position[i], item[1], item[2]
            layer.kernel.assign(values[id(kernel)])
            if bias is not None:
                layer.bias.assign(values[id(bias)])


def train_packed(specs: list[dict], data: Mapping[str, np.ndarray], meta: dict, run_dir, rank: int) -> list[dict]:
    """Train ``specs`` (equal ``pack_key``) together; return one journal record per spec, in
    order (a failure is a "failed" record, as ``member.guarded`` makes)."""
    import keras
    import tensorflow as tf

    from datafeed.pipeline import index_batches, member_indices, row_gather
    from ensemble.config.vocabulary import gaussian_head
    from ensemble.task import get_task
    from ensemble.train.architecture import build_model, make_optimizer
    from ensemble.train.member import HOST, MemberFailed, check_weights, failure_record, member_record, stopping_rows

    t0 = time.monotonic()
    first = specs[0]
    task = get_task(meta["task"])
    gaussian = gaussian_head(first.get("loss"), task.name, False)
    y_shift, y_scale = task.target_scaling(data["y_train"])
    y_tf = task.target_transform(y_shift, y_scale)
    models, datasets = [], []
    for spec in specs:                     # as train_member does, member by member: same seeds, same order
        keras.utils.set_random_seed(spec["seed"])
        model = build_model(spec, tuple(meta["input_shape"]), meta["n_outputs"], task.name)
        models.append(model)
        idx = member_indices(len(data["y_train"]), spec["seed"], spec.get("bootstrap", False))
        datasets.append(index_batches(idx, spec["batch_size"], spec["seed"]))   # as make_dataset shuffles
    loss_name, _ = task.loss(gaussian)
    loss = keras.losses.get(loss_name) if isinstance(loss_name, str) else loss_name   # per-sample values
    pack = Pack(models, make_optimizer(first["optimizer"], first["learning_rate"]), loss)
    pack.rows = row_gather(data["x_train"], data["y_train"], y_tf, lead=2)   # one numpy call a step
    zipped = tf.data.Dataset.zip(tuple(datasets)).prefetch(2)
    stop_on = stopping_rows(data, meta)
    x_val = tf.constant(np.asarray(data["x_val"])[stop_on])
    y_val = np.asarray(data["y_val"])[stop_on]
    y_val = tf.constant(y_tf(y_val).astype(np.float32) if y_tf is not None else y_val)
    build_seconds = time.monotonic() - t0
    k = len(specs)
    active = set(range(k))
    best = [np.inf] * k
    best_weights: list[list[np.ndarray] | None] = [None] * k
    wait, trained = [0] * k, [0] * k
    history = [{"loss": [], "val_loss": []} for _ in range(k)]
    failed: dict[int, Exception] = {}
    limit = min(s["member_time_limit"] for s in specs)
    for epoch in range(first["epochs"]):
        sums, rows = np.zeros(k), 0
        for batches in iter(zipped):
            n = int(batches[0].shape[0])
            sums += pack.step(batches).numpy() * n
            rows += n
        iter(zipped)                        # Keras fit makes a second iterator per epoch: the same data order
        train_loss = sums / max(rows, 1)
        val_loss = _chunked_val(pack, x_val, y_val)
        for i in sorted(active):
            history[i]["loss"].append(float(train_loss[i]))
            history[i]["val_loss"].append(float(val_loss[i]))
            trained[i] = epoch + 1
            if not np.isfinite(train_loss[i]):
                failed[i] = MemberFailed("nan_loss", f"training loss became NaN/inf at epoch {epoch + 1}; "
                                         f"lower `learning_rate` (now {specs[i]['learning_rate']}) or check the data")
                active.discard(i)
                continue
            if best_weights[i] is None:      # Keras EarlyStopping's rule, restore_best_weights=True
                best_weights[i] = pack.member_weights(i)
            wait[i] += 1
            if val_loss[i] < best[i]:
                best[i], best_weights[i], wait[i] = val_loss[i], pack.member_weights(i), 0
                continue
            if wait[i] >= specs[i]["patience"] and epoch > 0:
                active.discard(i)
        if time.monotonic() - t0 > limit:
            for i in active:
                failed[i] = MemberFailed("time_limit", f"the pack of {k} members exceeded `member_time_limit` "
                                                       f"({limit:g} s) after {epoch + 1} epochs")
            active.clear()
        if not active:
            break
    train_seconds = time.monotonic() - t0
    records = []
    for i, spec in enumerate(specs):
        t_member = time.monotonic()
        try:
            if i in failed:
                raise failed[i]
            pack.give_back(i, best_weights[i])
            check_weights(models[i], spec)
            record = member_record(spec, models[i], data, run_dir, task, gaussian, y_shift, y_scale,
                                   history[i], trained[i], t0, build_seconds / k,
                                   "early_stopping" if trained[i] < spec["epochs"] else "epochs")
            record["train_seconds"] = round(train_seconds / k + time.monotonic() - t_member, 3)
            record["costs"].update(build=round(build_seconds / k, 4),       # a pack's share, each
                                   epochs=round((train_seconds - build_seconds) / k, 4))
            record["costs"]["other"] = round(max(0.0, record["train_seconds"] - sum(record["costs"].values())), 4)
            record["packed"] = {"members": k, "with": [s["id"] for s in specs], "seconds": round(train_seconds, 3)}
        except Exception as exc:           # noqa: BLE001 - one member's failure is its own record
            record = failure_record(spec, exc, t0)
        record.update(rank=rank, host=HOST)
        records.append(record)
    return records


def _chunked_val(pack: Pack, x_val, y_val, chunk: int = 512) -> np.ndarray:
    """Each member's mean validation loss, over chunks of 512 rows (as Keras evaluates),
    weighted by their sizes."""
    n = int(x_val.shape[0])
    total = np.zeros(pack.k)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        total += pack.val_loss(x_val[start:stop], y_val[start:stop]).numpy() * (stop - start)
    return total / max(n, 1)
