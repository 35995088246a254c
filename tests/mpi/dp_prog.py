"""MPI program behind tests/mpi/test_data_parallel_mpi.py: run it under ``mpiexec -n 2``.

Both ranks train one member data-parallel (G=2, shards of a global batch); rank 0 then
trains the same member alone (G=1, comm None) with the same seed and data order while
rank 1 sleeps, and compares. Then the stop scenarios: rank 1 alone asks to stop (at an
epoch end, like the time limit, and mid-epoch, like TerminateOnNaN) and both ranks must
stop at the same step. Rank 0 prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mpi4py import MPI

from ensemble.runtime.mpi import polite_barrier

comm = MPI.COMM_WORLD
RANK = comm.Get_rank()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from datafeed.pipeline import make_dataset  # noqa: E402
from ensemble.runtime.data_parallel import broadcast_weights, make_data_parallel  # noqa: E402
from tests.ensemble.test_data_parallel import StopAt  # noqa: E402  (one rank asks to stop)

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.get_logger().setLevel("ERROR")

N, FEATURES, CLASSES, BATCH, EPOCHS = 203, 20, 4, 50, 4    # last global batch: 3 rows, shards 1 and 2
rng = np.random.default_rng(11)
X = rng.standard_normal((N, FEATURES)).astype(np.float32)
Y = (X[:, :CLASSES] + 0.5 * rng.standard_normal((N, CLASSES))).argmax(1).astype(np.int64)
VX = rng.standard_normal((60, FEATURES)).astype(np.float32)
VY = VX[:, :CLASSES].argmax(1).astype(np.int64)


def train(group, optimizer: str, extra=(), dropout_bn: bool = False, epochs: int = EPOCHS):
    """One member as member.py would train it; ``group`` None is G=1."""
    keras.utils.set_random_seed(5)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu")]
    if dropout_bn:
        layers += [keras.layers.BatchNormalization(), keras.layers.Dropout(0.2)]
    model = keras.Sequential([*layers, keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    opt = {"sgd": keras.optimizers.SGD(0.2, momentum=0.5), "adam": keras.optimizers.Adam(3e-3)}[optimizer]
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=False)
    broadcast_weights(model, group)
    dp = make_data_parallel(model, group)
    shard = (group.Get_rank(), group.Get_size()) if group is not None else None
    ds = make_dataset(X, Y, np.arange(N), BATCH, seed=9, shard=shard)
    val = make_dataset(VX, VY, np.arange(len(VY)), 32, 0, shuffle=False)
    callbacks = dp[:1] + [keras.callbacks.TerminateOnNaN(),
                          keras.callbacks.EarlyStopping(patience=50, restore_best_weights=True),
                          *extra] + dp[1:]
    hist = model.fit(ds, validation_data=val, epochs=epochs, verbose=0, callbacks=callbacks).history
    return model, hist, dp


def max_rel(a_list, b_list) -> float:
    """Largest |a - b| relative to the size of the tensor (max |b|), over all weights."""
    return max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12)) for a, b in zip(a_list, b_list))


def across_ranks(model) -> float:
    """Largest weight difference between the ranks (0.0: identical models)."""
    weights = comm.allgather(model.get_weights())
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights[0], weights[1]))


def main() -> None:
    out: dict = {"ranks": comm.Get_size()}
    for optimizer in ("sgd", "adam"):
        model, hist, dp = train(comm, optimizer)
        fused = dp[0].fused
        case = {"ranks_differ": across_ranks(model), "allreduce_calls": fused.calls,
                "buffer_floats": fused.nbytes // 4, "receive_buffers": len(fused._pool),
                "iterations": int(model.optimizer.iterations),
                "params": int(sum(np.prod(v.shape) for v in model.trainable_weights)),
                "padded_params": int(sum(-(-int(np.prod(v.shape)) // 16) * 16 for v in model.trainable_weights))}
        dp_weights = model.get_weights()
        polite_barrier(comm)                       # rank 1 sleeps while rank 0 trains alone
        if RANK == 0:
            single, h1, _ = train(None, optimizer)
            case["max_rel_diff"] = max_rel(dp_weights, single.get_weights())
            case["allclose_1e-5"] = all(np.allclose(a, b, rtol=1e-5, atol=1e-6)
                                        for a, b in zip(dp_weights, single.get_weights()))
            case["history_max_rel_diff"] = max(
                float(np.max(np.abs(np.subtract(hist[k], h1[k])) / np.abs(h1[k]))) for k in h1)
            case["single_iterations"] = int(single.optimizer.iterations)
        polite_barrier(comm)
        out[optimizer] = case

    # rank 1 alone hits its "time limit" at the end of epoch 1: both ranks stop there
    model, hist, dp = train(comm, "adam", extra=[StopAt(epoch=1)] if RANK == 1 else [], epochs=6)
    got = comm.gather({"epochs": len(hist["loss"]), "iterations": int(model.optimizer.iterations),
                       "requested": dp[1].requested, "stopped": dp[1].stopped})
    out["epoch_stop"] = got
    # rank 1 alone sees a "NaN" in its 7th step (epoch 1, batch 1): the request rides on step 8, all stop there
    model, hist, dp = train(comm, "adam", extra=[StopAt(batch=6)] if RANK == 1 else [], epochs=6)
    out["batch_stop"] = comm.gather({"epochs": len(hist["loss"]), "iterations": int(model.optimizer.iterations),
                                     "requested": dp[1].requested, "stopped": dp[1].stopped})
    # batch norm + dropout: per-rank masks and local statistics, yet one model at the end
    model, hist, dp = train(comm, "adam", dropout_bn=True)
    out["bn_dropout"] = {"ranks_differ": across_ranks(model), "loss": hist["loss"][-1],
                         "val_loss_equal": comm.allgather(hist["val_loss"])[0] == comm.allgather(hist["val_loss"])[1]}
    if RANK == 0:
        print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
