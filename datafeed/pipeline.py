"""The tf.data pipeline a member trains from: index arrays over shared, read-only views.

The training set is never copied per rank: the pipeline shuffles *indices* (seeded,
reshuffled each epoch), batches them, and gathers each batch from the shared arrays.
Bootstrap samples and data-parallel shards are index arrays too.
"""

from __future__ import annotations

import numpy as np


def member_indices(n: int, seed: int, bootstrap: bool) -> np.ndarray:
    """The training rows of one member: all of them, or a seeded bootstrap resample."""
    if not bootstrap:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).integers(0, n, size=n, dtype=np.int64))


def shard(indices: np.ndarray, rank: int, size: int) -> np.ndarray:
    """This rank's share of a global batch (contiguous slices, sizes differing by at most one)."""
    bounds = np.linspace(0, len(indices), size + 1).astype(np.int64)
    return indices[bounds[rank]:bounds[rank + 1]]


def make_dataset(x: np.ndarray, y: np.ndarray, indices: np.ndarray, batch_size: int, seed: int,
                 shuffle: bool = True, y_transform=None):
    """tf.data.Dataset of (x_batch, y_batch) gathered from ``x``/``y`` at ``indices``.

    Shuffling is over indices with the member's seed and changes every epoch; each batch
    is gathered on the fly, so memory holds one batch per rank, not the training set.
    """
    import tensorflow as tf

    x_spec = tf.TensorSpec((None, *x.shape[1:]), tf.as_dtype(x.dtype))
    y_dtype = np.float32 if y_transform is not None else y.dtype
    y_spec = tf.TensorSpec((None, *y.shape[1:]), tf.as_dtype(y_dtype))

    def gather(idx: np.ndarray):
        batch_y = y[idx]
        if y_transform is not None:
            batch_y = y_transform(batch_y).astype(np.float32)
        return x[idx], batch_y

    def load(idx):
        bx, by = tf.numpy_function(gather, [idx], [x_spec.dtype, y_spec.dtype], stateful=False)
        bx.set_shape(x_spec.shape)
        by.set_shape(y_spec.shape)
        return bx, by

    ds = tf.data.Dataset.from_tensor_slices(np.asarray(indices, dtype=np.int64))
    if shuffle:
        ds = ds.shuffle(len(indices), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size).map(load)            # sequential: one thread per rank
    return ds.prefetch(2)
