"""Data-parallel training of one member across the ranks of its group (``group_size > 1``).

Every rank of a group builds the same Keras model, takes the leader's weights
(``broadcast_weights``) and trains on its shard of each global batch
(``make_dataset(..., shard=(rank, size))``). ``make_data_parallel`` changes the compiled
train step so that, between the gradient and the optimizer update, all gradients are
copied into one float32 buffer and summed with ONE ``comm.Allreduce`` per step (tensor
fusion, as Horovod does), called from inside the compiled step through
``tf.numpy_function``; TensorFlow takes the summed gradients as views of the receive
buffer, without a copy. Every rank then applies the same averaged gradient, so the
weights stay identical without ever being sent again.

Exactness: each rank's gradient is weighted by its shard size, ``sum_r n_r g_r / N``,
so G ranks holding the shards of a global batch of N rows apply the gradient of that
whole batch (the mean loss over N), also for uneven shards. The weighting costs no extra
pass over the gradients: the loss is scaled by ``n_r / N_ref`` before differentiation
(through ``optimizer.scale_loss``), where ``N_ref`` is the first step's global batch;
only a step whose global batch differs from ``N_ref`` (the last, partial one) pays one
rescaling pass. The rows of every rank are counted in the same buffer, two extra slots
at its end: the local batch size and this rank's stop request.

One decision for the group: ranks that disagree on when to stop would wait forever in
each other's allreduce. The two callbacks returned make the epoch logs (loss, metrics,
``val_*``) the sample-weighted group average before any other callback reads them, so
EarlyStopping and TerminateOnNaN see the same numbers on every rank; and they turn any
rank's stop (time limit, NaN, early stopping) into a stop of all ranks at the same step:
at epoch end by a tiny allreduce, within an epoch through the stop slot of the next
step's gradient buffer (that rank trains one more step, as do all the others).

Validation: every rank evaluates the full validation set (the weights are identical,
so the numbers agree up to batch-norm statistics); the averaged ``val_*`` logs are
weighted by the rows each rank evaluated, so a sharded validation set works as well.
Non-trainable float weights (batch-norm moving statistics, computed on local shards)
are averaged over the group at every epoch end, so every rank ends with the same model.
Dropout and other seeded layers get a per-rank seed, so shards do not share masks.

``comm`` is the group's mpi4py intracommunicator (or anything with ``Get_rank``,
``Get_size`` and a summing ``Allreduce(sendbuf, recvbuf)``); mpi4py is never imported
here. ``comm=None`` or a group of one changes nothing and communicates nothing.
"""

from __future__ import annotations

import contextlib
import sys
import time

import keras
import numpy as np
import tensorflow as tf

_ALIGN = 64                     # TensorFlow adopts (does not copy) numpy outputs aligned like this
_SEED_STRIDE = 1_000_003        # per-rank offset of seed-generator states


def group_size(comm) -> int:
    """Ranks in the group; 1 for ``comm=None``."""
    return 1 if comm is None else int(comm.Get_size())


def broadcast_weights(model: keras.Model, comm, root: int = 0) -> None:
    """Give every rank the weights of ``root``: one fused byte buffer, one ``Bcast``.

    Call after the model is built (it has weights) and before training. Exact for every
    dtype (bytes are sent). Does nothing for ``comm=None`` or a group of one.
    """
    if group_size(comm) == 1:
        return
    if not model.weights:
        raise ValueError("broadcast_weights: the model has no weights yet; build it first "
                         "(give it an Input or call it on a batch)")
    broadcast_variables(list(model.weights), comm, root)


def broadcast_variables(variables: list, comm, root: int = 0) -> None:
    """Give every rank ``root``'s values of ``variables`` (the same list, shapes and dtypes
    on every rank: weights, an optimizer's state): one fused byte buffer, one ``Bcast``."""
    if group_size(comm) == 1 or not variables:
        return
    arrays = [np.ascontiguousarray(v.numpy()) for v in variables]
    if comm.Get_rank() == root:
        buf = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays])
    else:
        buf = np.empty(sum(a.nbytes for a in arrays), np.uint8)
    comm.Bcast(buf, root=root)
    offset = 0
    for v, a in zip(variables, arrays):
        v.assign(buf[offset:offset + a.nbytes].view(a.dtype).reshape(tuple(v.shape)))   # a scalar stays one
        offset += a.nbytes


def rebind(callbacks: list, comm) -> None:
    """Point a data-parallel model (the callbacks ``make_data_parallel`` returned) at another
    communicator of the same rank order, the rank of each old member unchanged (a group that
    grew: ``runtime.tail``); its compiled step is kept, no retrace."""
    average, stop = callbacks
    average.comm = stop.comm = average.fused.comm = comm


def _aligned_empty(n: int) -> np.ndarray:
    """n float32 starting on an _ALIGN boundary (a view of a slightly larger array)."""
    raw = np.empty(n + _ALIGN // 4, np.float32)
    return _view(raw, n)


def _view(raw: np.ndarray, n: int) -> np.ndarray:
    start = (-raw.ctypes.data % _ALIGN) // 4
    return raw[start:start + n]


class FusedAllreduce:
    """Sums every gradient of a step in one float32 buffer with one ``comm.Allreduce``.

    ``reduce`` builds the graph side: one ``tf.numpy_function`` that takes the gradients
    and returns them summed. Its Python side (``_allreduce``) copies them into a
    persistent send buffer (each gradient at a 64-byte-aligned offset, then the two
    extra slots), calls ``comm.Allreduce`` into a reused receive buffer, and returns
    views of it, which TensorFlow adopts without copying. Per step that is one copy in,
    the allreduce and nothing else (plus one scaling pass on a partial batch).

    Statistics for benchmarks: ``calls``, ``nbytes`` (sent per call),
    ``allreduce_seconds`` (inside ``comm.Allreduce``), ``op_seconds`` (the whole Python
    side); set ``trace = []`` to record, per step, the perf_counter times
    ``(enter, allreduce start, allreduce end, leave)``.
    """

    def __init__(self, comm):
        self.comm = comm
        self.calls, self.nbytes = 0, 0
        self.allreduce_seconds = self.op_seconds = 0.0
        self.trace: list[tuple[float, float, float, float]] | None = None
        self._layout: tuple | None = None
        self._send: np.ndarray | None = None
        self._pool: list[np.ndarray] = []
        # Graph state, deliberately outside the model (never saved with it).
        self.ref_batch = tf.Variable(0.0, trainable=False, dtype=tf.float32, name="dp_ref_batch")
        self.stop_request = tf.Variable(0.0, trainable=False, dtype=tf.float32, name="dp_stop_request")
        self.group_stop = tf.Variable(0.0, trainable=False, dtype=tf.float32, name="dp_group_stop")

    def reduce(self, grads: list, n_local, ref, prescale=None) -> list:
        """Graph side: the group's weighted average of ``grads`` (None entries stay None).

        ``grads`` are already multiplied by ``n_local / ref`` (or by ``n_local`` while
        ``ref`` is 0) unless ``prescale`` is given, which is then applied here.
        """
        present = [i for i, g in enumerate(grads) if g is not None]
        dense = [tf.convert_to_tensor(grads[i]) for i in present]
        inputs = [tf.cast(g, tf.float32) for g in dense]
        if prescale is not None:
            inputs = [g * prescale for g in inputs]
        tail = tf.stack([n_local, self.stop_request.read_value()])
        outputs = tf.numpy_function(self._allreduce, [ref, tail, *inputs],
                                    [tf.float32] * (len(inputs) + 2), stateful=True,
                                    name="fused_allreduce")
        total, stop = outputs[-2], outputs[-1]
        total.set_shape([])
        stop.set_shape([])
        self.ref_batch.assign(tf.where(ref > 0, ref, total))
        self.group_stop.assign(tf.maximum(self.group_stop, stop))
        out = list(grads)
        for i, g, summed in zip(present, dense, outputs[:-2]):
            summed.set_shape(g.shape)
            out[i] = tf.cast(summed, g.dtype)
        return out

    def _prepare(self, grads: tuple[np.ndarray, ...]) -> tuple:
        """Offsets of each gradient in the buffer (multiples of 16 floats) and its length."""
        shapes = tuple(g.shape for g in grads)
        if self._layout is None or self._layout[0] != shapes:
            offsets, end = [], 0
            for g in grads:
                offsets.append(end)
                end += -(-g.size // (_ALIGN // 4)) * (_ALIGN // 4)
            self._layout = (shapes, offsets, end + 2)
            self._send = _aligned_empty(end + 2)
            self._send[:] = 0.0                     # the padding stays zero
            self._pool = []
        return self._layout

    def _buffer(self, n: int) -> np.ndarray:
        """A receive buffer that TensorFlow no longer holds (reused: no page faults, no copy)."""
        for raw in self._pool:
            # references: the pool, ``raw`` here and getrefcount's argument; more while
            # TensorFlow still holds views it adopted from an earlier step
            if sys.getrefcount(raw) == 3:
                return _view(raw, n)
        recv = _aligned_empty(n)
        if len(self._pool) < 3:
            self._pool.append(recv.base)
        return recv

    def _allreduce(self, ref, tail, *grads: np.ndarray) -> list:
        t0 = time.perf_counter()
        shapes, offsets, n = self._prepare(grads)
        send = self._send
        for g, o in zip(grads, offsets):
            send[o:o + g.size] = g.reshape(-1)
        send[n - 2:] = tail
        recv = self._buffer(n)
        t1 = time.perf_counter()
        self.comm.Allreduce(send, recv)
        t2 = time.perf_counter()
        total, stop, ref = float(recv[-2]), float(recv[-1]), float(ref)
        factor = ref / total if ref > 0 else 1.0 / total
        if factor != 1.0:
            np.multiply(recv, np.float32(factor), out=recv)
        out = [recv[o:o + g.size].reshape(g.shape) for g, o in zip(grads, offsets)]
        t3 = time.perf_counter()
        self.calls += 1
        self.nbytes = send.nbytes
        self.allreduce_seconds += t2 - t1
        self.op_seconds += t3 - t0
        if self.trace is not None:
            self.trace.append((t0, t1, t2, t3))
        return [*out, np.float32(total), np.float32(stop)]


@contextlib.contextmanager
def _reduce_before_apply(optimizer, fused: FusedAllreduce, n_local):
    """While a train step is traced, route the optimizer's update through ``fused``.

    ``scale_loss`` (called by Keras' train step before differentiating) also multiplies
    the loss by this rank's weight; a custom train step that skips it gets the weight
    applied to the gradients instead. Both hooks are instance attributes, removed after.
    """
    ref = fused.ref_batch.read_value()
    weight = tf.where(ref > 0, n_local / tf.maximum(ref, 1.0), n_local)
    scaled = []
    real_apply, real_scale = optimizer.apply, optimizer.scale_loss
    saved = {k: optimizer.__dict__[k] for k in ("apply", "scale_loss") if k in optimizer.__dict__}

    def scale_loss(loss):
        scaled.append(True)
        return real_scale(loss * tf.cast(weight, loss.dtype))

    def apply(grads, trainable_variables=None):
        grads = fused.reduce(list(grads), n_local, ref, prescale=None if scaled else weight)
        return real_apply(grads, trainable_variables)

    object.__setattr__(optimizer, "scale_loss", scale_loss)
    object.__setattr__(optimizer, "apply", apply)
    try:
        yield
    finally:
        for name in ("apply", "scale_loss"):
            if name in saved:
                object.__setattr__(optimizer, name, saved[name])
            else:
                object.__delattr__(optimizer, name)


def _batch_rows(data):
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    first = next(t for t in keras.tree.flatten(x) if t is not None)
    return tf.cast(tf.shape(first)[0], tf.float32)


class GroupAverage(keras.callbacks.Callback):
    """FIRST callback: epoch logs become group averages; batch-norm statistics are averaged.

    Train logs are weighted by the rows each rank trained on this epoch, ``val_*`` logs
    by the rows each rank evaluated. Runs before EarlyStopping stores its best weights.
    """

    def __init__(self, comm, fused: FusedAllreduce):
        super().__init__()
        self.comm, self.fused = comm, fused
        self.train_rows = tf.Variable(0.0, trainable=False, dtype=tf.float64, name="dp_train_rows")
        self.val_rows = tf.Variable(0.0, trainable=False, dtype=tf.float64, name="dp_val_rows")

    def on_epoch_begin(self, epoch, logs=None):
        self.train_rows.assign(0.0)
        self.val_rows.assign(0.0)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        keys = sorted(k for k, v in logs.items() if isinstance(v, (int, float, np.number)))
        n_train, n_val = float(self.train_rows.numpy()), float(self.val_rows.numpy())
        states = [v for v in self.model.non_trainable_weights if "float" in str(v.dtype)]
        arrays = [np.asarray(v.numpy(), np.float64).reshape(-1) for v in states]
        head = [float(logs[k]) * (n_val if k.startswith("val_") else n_train) for k in keys]
        send = np.concatenate([np.array(head + [n_train, n_val], np.float64), *arrays])
        recv = np.empty_like(send)
        self.comm.Allreduce(send, recv)
        tot_train, tot_val = recv[len(keys)], recv[len(keys) + 1]
        for i, k in enumerate(keys):
            tot = tot_val if k.startswith("val_") else tot_train
            logs[k] = float(recv[i] / tot) if tot > 0 else float(logs[k])
        offset, size = len(keys) + 2, group_size(self.comm)
        for v, a in zip(states, arrays):
            v.assign(keras.ops.cast((recv[offset:offset + a.size] / size).reshape(v.shape), v.dtype))
            offset += a.size


class GroupStop(keras.callbacks.Callback):
    """LAST callback: if any rank stops, every rank stops after the same step.

    After training, ``requested`` tells whether this rank asked to stop and ``stopped``
    whether the group stopped before its last epoch (asked by any rank).
    """

    def __init__(self, comm, fused: FusedAllreduce):
        super().__init__()
        self.comm, self.fused = comm, fused
        self.requested = self.stopped = False

    def on_train_begin(self, logs=None):
        self.requested = self.stopped = False
        self.fused.stop_request.assign(0.0)
        self.fused.group_stop.assign(0.0)

    def on_train_batch_end(self, batch, logs=None):
        if self.fused.group_stop.numpy() > 0:          # some rank asked during an earlier step
            self.model.stop_training = self.stopped = True
            self.fused.group_stop.assign(0.0)
            self.fused.stop_request.assign(0.0)
        elif self.model.stop_training:                  # asked here (e.g. TerminateOnNaN): tell
            self.model.stop_training = False            # the others with the next step's buffer
            self.requested = True
            self.fused.stop_request.assign(1.0)

    def on_epoch_end(self, epoch, logs=None):
        local = bool(self.model.stop_training or self.fused.stop_request.numpy() > 0)
        self.requested = self.requested or (local and not self.stopped)   # not the group's mid-epoch stop
        send, recv = np.array([float(local)]), np.zeros(1)
        self.comm.Allreduce(send, recv)
        if recv[0] > 0:
            self.model.stop_training = self.stopped = True
        self.fused.stop_request.assign(0.0)


def make_data_parallel(model: keras.Model, comm) -> list[keras.callbacks.Callback]:
    """Make ``model``'s compiled train step data-parallel over ``comm``; return its callbacks.

    Call after ``model.compile(...)`` and ``broadcast_weights``. Returns
    ``[GroupAverage, GroupStop]``, to be placed first and last around your callbacks::

        dp = make_data_parallel(model, comm)
        model.fit(..., callbacks=dp[:1] + my_callbacks + dp[1:])

    With ``comm=None`` or a group of one it returns ``[]`` and leaves the model untouched
    (no communication, the original train step).
    """
    if group_size(comm) == 1:
        return []
    if getattr(model, "optimizer", None) is None:
        raise ValueError("make_data_parallel: compile the model first (model.compile(optimizer=...))")
    if getattr(model.__dict__.get("train_step"), "data_parallel", None) is not None:
        raise ValueError("make_data_parallel: this model is already data-parallel")
    rank = comm.Get_rank()
    fused = FusedAllreduce(comm)
    average = GroupAverage(comm, fused)
    original_train, original_test = model.train_step, model.test_step

    def train_step(data):
        n_local = _batch_rows(data)
        average.train_rows.assign_add(tf.cast(n_local, tf.float64))
        with _reduce_before_apply(model.optimizer, fused, n_local):
            return original_train(data)

    def test_step(data):
        average.val_rows.assign_add(tf.cast(_batch_rows(data), tf.float64))
        return original_test(data)

    train_step.data_parallel = fused
    object.__setattr__(model, "train_step", train_step)
    object.__setattr__(model, "test_step", test_step)
    model.train_function = model.test_function = None          # retrace with the new steps
    if model.jit_compile:
        model.jit_compile = False                              # numpy_function cannot be XLA-compiled
    for v in model.variables:                                  # decorrelate dropout masks per rank
        if v.name == "seed_generator_state":
            v.assign(v.numpy() + np.array([rank * _SEED_STRIDE, 0], dtype=v.numpy().dtype))
    return [average, GroupStop(comm, fused)]


def undo_data_parallel(model: keras.Model) -> None:
    """The model's own train and test steps again (after ``make_data_parallel``), retraced at
    the next ``fit``: a rank left alone by its group (``runtime.tail``)."""
    for name in ("train_step", "test_step"):
        model.__dict__.pop(name, None)
    model.train_function = model.test_function = None

