"""Data-parallel training without MPI: fake group communicators and the sharded pipeline.

A ``FakePeerComm`` plays a group of two whose other rank holds exactly this rank's
shard: its Allreduce returns twice the local buffer (optionally with a stop request
from the peer), so a data-parallel member must train exactly like a plain one. The real
two-rank runs are in tests/mpi/test_data_parallel_mpi.py.
"""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from datafeed.pipeline import make_dataset, shard, steps_per_epoch  # noqa: E402
from ensemble.runtime.data_parallel import broadcast_weights, make_data_parallel  # noqa: E402


class RecordingComm:
    """A communicator that records every call; Allreduce multiplies by ``size`` (identical peers)."""

    def __init__(self, size: int = 1, rank: int = 0, peer_step_stop: int | None = None,
                 peer_epoch_stop: int | None = None, bcast_bytes: np.ndarray | None = None):
        self.size, self.rank = size, rank
        self.peer_step_stop, self.peer_epoch_stop = peer_step_stop, peer_epoch_stop
        self.bcast_bytes = bcast_bytes
        self.calls: list[tuple[str, str, int]] = []
        self.step_buffers: list[np.ndarray] = []
        self.epoch_stops = 0

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return self.rank

    def Allreduce(self, send, recv, op=None):
        send = np.asarray(send)
        self.calls.append(("Allreduce", str(send.dtype), send.size))
        recv[...] = send * self.size
        if send.dtype == np.float32:                         # a training step's fused buffer
            self.step_buffers.append(send.copy())
            if self.peer_step_stop == len(self.step_buffers) - 1:
                recv[-1] += 1
        elif send.size == 1:                                 # the epoch-end stop vote
            if self.peer_epoch_stop == self.epoch_stops:
                recv[0] += 1
            self.epoch_stops += 1

    def Bcast(self, buf, root=0):
        self.calls.append(("Bcast", str(np.asarray(buf).dtype), np.asarray(buf).size))
        if self.rank != root:
            buf[...] = self.bcast_bytes
        else:
            self.bcast_bytes = np.array(buf, copy=True)

    def __getattr__(self, name):                             # any other MPI call is a failure
        if name.startswith("__"):
            raise AttributeError(name)
        raise AssertionError(f"unexpected communicator call {name}")

    def __repr__(self):
        return f"RecordingComm(size={self.size})"


def data(n=96, features=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)).astype(np.float32)
    return x, rng.integers(0, classes, n).astype(np.int64)


def model_for(seed=3, optimizer="adam", batch_norm=False):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((6,)), keras.layers.Dense(16, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    model = keras.Sequential([*layers, keras.layers.Dense(3, activation="softmax")])
    opt = keras.optimizers.Adam(1e-2) if optimizer == "adam" else keras.optimizers.SGD(0.1)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=False)
    return model


def fit(model, callbacks=(), epochs=2, batch=16, shard_=None, dp=()):
    x, y = data()
    ds = make_dataset(x, y, np.arange(len(y)), batch, seed=5, shard=shard_)
    vx, vy = data(40, seed=1)
    val = make_dataset(vx, vy, np.arange(len(vy)), 32, 0, shuffle=False)
    cbs = list(dp[:1]) + list(callbacks) + list(dp[1:])
    return model.fit(ds, validation_data=val, epochs=epochs, verbose=0, callbacks=cbs).history


# ----------------------------------------------------------------------------- group of one

@pytest.mark.slow                  # TensorFlow training: make test, not make test-fast
@pytest.mark.parametrize("comm", [None, RecordingComm(size=1)])
def test_group_of_one_adds_no_communication_and_keeps_the_train_step(comm):
    model = model_for()
    broadcast_weights(model, comm)
    assert make_data_parallel(model, comm) == []
    assert "train_step" not in model.__dict__ and "test_step" not in model.__dict__
    fit(model, epochs=1)
    assert comm is None or comm.calls == []


# ----------------------------------------------------------------------------- fused allreduce

@pytest.mark.slow                 # make test, not test-fast (its minute)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_identical_peer_trains_exactly_like_one_rank_with_one_allreduce_per_step(optimizer):
    plain = model_for(optimizer=optimizer, batch_norm=True)
    h_plain = fit(plain)
    comm = RecordingComm(size=2)
    model = model_for(optimizer=optimizer, batch_norm=True)
    dp = make_data_parallel(model, comm)
    h_dp = fit(model, dp=dp)

    padded = sum(-(-int(np.prod(v.shape)) // 16) * 16 for v in model.trainable_weights)
    steps = [c for c in comm.calls if c[1] == "float32"]
    assert len(steps) == 2 * 6                                   # 96 rows / 16 = 6 steps, 2 epochs
    assert {c[2] for c in steps} == {padded + 2}                 # every gradient in one buffer
    assert [b[-2] for b in comm.step_buffers] == [16.0] * 12     # local rows travel in the buffer
    assert len(comm.calls) == len(steps) + 2 * 2                 # + logs and stop vote per epoch
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(h_dp[key], h_plain[key], rtol=1e-5)
    fused = dp[0].fused
    assert fused.calls == 12 and fused.nbytes == 4 * (padded + 2)


class OwnStep(keras.Model):
    """A user model with its own train step that never calls ``optimizer.scale_loss``."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


def own_step_model():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    model = OwnStep(inputs, keras.layers.Dense(3, activation="softmax")(keras.layers.Dense(8)(inputs)))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    return model


@pytest.mark.slow                 # make test, not test-fast (its minute)
def test_custom_train_step_without_scale_loss_is_weighted_too():
    plain, model = own_step_model(), own_step_model()
    fit(plain)
    comm = RecordingComm(size=2)
    fit(model, dp=make_data_parallel(model, comm))
    assert len([c for c in comm.calls if c[1] == "float32"]) == 12
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.slow                  # TensorFlow training: make test, not make test-fast
def test_model_stays_saveable_and_cannot_be_wrapped_twice(tmp_path):
    model = model_for()
    comm = RecordingComm(size=2)
    dp = make_data_parallel(model, comm)
    fit(model, epochs=1, dp=dp)
    model.save(tmp_path / "m.keras")
    again = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(again.get_weights()[0], model.get_weights()[0])
    with pytest.raises(ValueError, match="already data-parallel"):
        make_data_parallel(model, comm)


def test_uncompiled_model_is_refused():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="compile the model first"):
        make_data_parallel(model, RecordingComm(size=2))


# ----------------------------------------------------------------------------- one stop decision

class StopAt(keras.callbacks.Callback):
    """Asks to stop on this rank only, at a batch (like TerminateOnNaN) or an epoch end (time limit)."""

    def __init__(self, batch=None, epoch=None):
        super().__init__()
        self.batch, self.epoch, self.seen = batch, epoch, 0

    def on_train_batch_end(self, batch, logs=None):
        if self.seen == self.batch:
            self.model.stop_training = True
        self.seen += 1

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            self.model.stop_training = True


@pytest.mark.slow                  # TensorFlow training: make test, not make test-fast
def test_peer_stop_request_in_a_step_stops_this_rank_after_that_step():
    comm = RecordingComm(size=2, peer_step_stop=8)               # the peer asks during step 8
    model = model_for()
    dp = make_data_parallel(model, comm)
    h = fit(model, epochs=4, dp=dp)
    assert len(comm.step_buffers) == 9 and int(model.optimizer.iterations) == 9
    assert len(h["loss"]) == 2 and dp[1].stopped and not dp[1].requested


@pytest.mark.slow                  # TensorFlow training: make test, not make test-fast
def test_local_batch_stop_is_sent_with_the_next_step_and_everyone_stops_there():
    comm = RecordingComm(size=2)
    model = model_for()
    dp = make_data_parallel(model, comm)
    h = fit(model, epochs=4, dp=dp, callbacks=[StopAt(batch=2)])
    flags = [float(b[-1]) for b in comm.step_buffers]
    assert flags == [0, 0, 0, 1]                                 # request rides on step 3
    assert len(h["loss"]) == 1 and dp[1].stopped and dp[1].requested


@pytest.mark.slow                 # make test, not test-fast (its minute)
def test_epoch_end_stop_of_any_rank_is_collective():
    comm = RecordingComm(size=2, peer_epoch_stop=1)              # the peer's time limit at epoch 1
    model = model_for()
    dp = make_data_parallel(model, comm)
    h = fit(model, epochs=5, dp=dp)
    assert len(h["loss"]) == 2 and dp[1].stopped and not dp[1].requested
    comm = RecordingComm(size=2)
    model = model_for()
    dp = make_data_parallel(model, comm)
    h = fit(model, epochs=5, dp=dp, callbacks=[StopAt(epoch=0)])
    assert len(h["loss"]) == 1 and dp[1].requested


# ----------------------------------------------------------------------------- weights broadcast

def test_broadcast_weights_sends_one_buffer_and_copies_it_exactly():
    root_model, other = model_for(seed=1), model_for(seed=2)
    root = RecordingComm(size=2, rank=0)
    broadcast_weights(root_model, root)
    leaf = RecordingComm(size=2, rank=1, bcast_bytes=root.bcast_bytes)
    broadcast_weights(other, leaf)
    assert [c[0] for c in root.calls] == ["Bcast"] and [c[0] for c in leaf.calls] == ["Bcast"]
    for a, b in zip(root_model.get_weights(), other.get_weights()):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- sharded pipeline

def batches(ds):
    return [b[1].numpy() for b in ds]


@pytest.mark.parametrize("n, batch, size", [(103, 20, 2), (101, 20, 2), (100, 20, 3), (62, 20, 3)])
def test_shards_reassemble_the_single_rank_batches_with_equal_step_counts(n, batch, size):
    x = np.arange(n, dtype=np.float32)[:, None]
    y = np.arange(n, dtype=np.int64)
    whole = make_dataset(x, y, np.arange(n), batch, seed=4)
    parts = [make_dataset(x, y, np.arange(n), batch, seed=4, shard=(r, size)) for r in range(size)]
    for _ in range(2):                                           # reshuffled alike every epoch
        ref = batches(whole)
        got = [batches(p) for p in parts]
        steps = steps_per_epoch(n, batch, size)
        assert all(len(g) == steps for g in got)                 # no rank takes an extra step
        assert all(len(b) > 0 for g in got for b in g)           # no empty shard
        for i in range(steps):
            np.testing.assert_array_equal(np.concatenate([g[i] for g in got]), ref[i])
        dropped = len(ref) - steps
        assert dropped == (1 if 0 < n % batch < size else 0)


def test_shard_bounds_are_exact_and_checked():
    idx = np.arange(10)
    assert [len(shard(idx, r, 3)) for r in range(3)] == [3, 3, 4]
    assert np.concatenate([shard(idx, r, 3) for r in range(3)]).tolist() == idx.tolist()
    x, y = data(10)
    with pytest.raises(ValueError, match="`batch_size`"):
        make_dataset(x, y, np.arange(10), 2, 0, shard=(0, 3))
    with pytest.raises(ValueError, match="`shard`"):
        make_dataset(x, y, np.arange(10), 4, 0, shard=(3, 3))
    with pytest.raises(ValueError, match="fewer than the 3 ranks"):
        make_dataset(x, y, np.arange(2), 4, 0, shard=(0, 3))
