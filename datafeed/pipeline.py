"""The tf.data pipeline a member trains from: index arrays over shared, read-only views.

The training set is never copied per rank: the pipeline shuffles *indices* (seeded,
reshuffled each epoch), batches them, and gathers each batch from the shared arrays.
Bootstrap samples and data-parallel shards are index arrays too.

Data-parallel shards (``make_dataset(..., shard=(rank, size))``): every rank of a member
group shuffles the same indices with the same seed, batches them by the *global* batch
size, and keeps its contiguous slice of every global batch. The group therefore sees
exactly the batches a single rank would (same order, same contents), and every rank
takes the same number of steps per epoch, which the per-step allreduce needs.
"""

from __future__ import annotations

import numpy as np


def member_indices(n: int, seed: int, bootstrap: bool) -> np.ndarray:
    """The training rows of one member: all of them, or a seeded bootstrap resample."""
    if not bootstrap:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).integers(0, n, size=n, dtype=np.int64))


def shard(indices: np.ndarray, rank: int, size: int) -> np.ndarray:
    """This rank's share of a global batch (contiguous slices, sizes differing by at most one).

    Rank ``r`` gets ``[r*n//size, (r+1)*n//size)``: integer arithmetic, so the bounds are
    exact and identical to the in-graph slice ``make_dataset`` takes.
    """
    n = len(indices)
    return indices[rank * n // size:(rank + 1) * n // size]


def steps_per_epoch(n: int, batch_size: int, size: int = 1) -> int:
    """Global batches per epoch: the last, partial batch is dropped when it is smaller than ``size``.

    A partial batch of fewer rows than ranks would leave some rank an empty shard (no
    gradient, NaN batch statistics); dropping it costs at most ``size - 1`` rows per
    epoch, different rows each epoch because the order is reshuffled.
    """
    full, rest = divmod(n, batch_size)
    return full + (1 if rest >= size else 0)


def _check_shard(shard_: tuple[int, int], batch_size: int) -> tuple[int, int]:
    rank, size = (int(v) for v in shard_)
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"`shard` must be (rank, size) with 0 <= rank < size, but got {tuple(shard_)}")
    if batch_size < size:
        raise ValueError(f"`batch_size` (the global batch) must be at least the group size {size} so "
                         f"that every rank gets a sample of every batch, but got {batch_size}")
    return rank, size


def row_gather(x: np.ndarray, y: np.ndarray, y_transform=None, lead: int = 1):
    """A graph function: row indices (``lead`` leading axes: 1 for a batch, 2 for the
    [members, batch] of packed members) -> (x rows, y rows), gathered from the (shared)
    arrays in one numpy call, without copying the arrays into the graph; targets through
    ``y_transform`` as float32 when given."""
    import tensorflow as tf
    y_dtype = tf.as_dtype(np.float32 if y_transform is not None else y.dtype)

    def gather(idx: np.ndarray):
        batch_y = y[idx]
        if y_transform is not None:
            batch_y = y_transform(batch_y).astype(np.float32)
        return x[idx], batch_y

    def load(idx):
        bx, by = tf.numpy_function(gather, [idx], [tf.as_dtype(x.dtype), y_dtype], stateful=False)
        bx.set_shape((None,) * lead + tuple(x.shape[1:]))
        by.set_shape((None,) * lead + tuple(y.shape[1:]))
        return bx, by
    return load


def index_batches(indices: np.ndarray, batch_size: int, seed: int, shuffle: bool = True):
    """tf.data.Dataset of batches of row indices: ``indices`` shuffled with ``seed`` (anew each
    time it is iterated), ``batch_size`` at a time; what ``make_dataset`` gathers rows by, and
    what packed members gather their own rows by inside their graph (the same order)."""
    import tensorflow as tf
    ds = tf.data.Dataset.from_tensor_slices(np.asarray(indices, dtype=np.int64))
    if shuffle:
        ds = ds.shuffle(len(indices), seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size)


def make_dataset(x: np.ndarray, y: np.ndarray, indices: np.ndarray, batch_size: int, seed: int,
                 shuffle: bool = True, y_transform=None, shard: tuple[int, int] | None = None):
    """tf.data.Dataset of (x_batch, y_batch) gathered from ``x``/``y`` at ``indices``.

    Shuffling is over indices with the member's seed and changes every epoch; each batch
    is gathered on the fly, so memory holds one batch per rank, not the training set.

    ``shard=(rank, size)`` gives this rank's part of each global batch of ``batch_size``
    rows (see the module docstring); the last global batch is dropped when it has fewer
    than ``size`` rows (``steps_per_epoch``). Meant for training: evaluate the validation
    set whole on every rank. ``shard=None`` or a size of 1 is the plain single-rank pipeline.
    """
    import tensorflow as tf

    rank, size = _check_shard(shard, batch_size) if shard is not None else (0, 1)
    load = row_gather(x, y, y_transform)

    def local_slice(idx):
        n = tf.shape(idx, out_type=tf.int64)[0]
        return idx[rank * n // size:(rank + 1) * n // size]

    ds = index_batches(indices, batch_size, seed, shuffle)
    if size > 1:
        steps = steps_per_epoch(len(indices), batch_size, size)
        if steps == 0:
            raise ValueError(f"the training set has {len(indices)} rows, fewer than the {size} ranks of "
                             f"the group; lower `group_size` or use more data")
        ds = ds.take(steps).map(local_slice)
    ds = ds.map(load)                              # sequential: one thread per rank
    return ds.prefetch(2)
