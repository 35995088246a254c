"""A user's own Keras model builder, named in a test config as ``model = "tests.mpi.user_models:small_mlp"``."""


def small_mlp(input_shape, n_outputs, units=16):
    import keras
    inputs = keras.Input(shape=input_shape)
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(n_outputs, activation="softmax")(hidden))


def logits_mlp(input_shape, n_outputs, units=16):
    """A builder that forgets the softmax: its outputs are logits, not probabilities."""
    import keras
    inputs = keras.Input(shape=input_shape)
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(n_outputs)(hidden))


def per_step(input_shape, n_outputs):
    """Softmax over the last axis of a (batch, steps, classes) output: one row per step, not per sample."""
    import keras
    inputs = keras.Input(shape=input_shape)
    steps = keras.layers.Reshape((input_shape[0] // 8, 8))(inputs)
    return keras.Model(inputs, keras.layers.Dense(n_outputs, activation="softmax")(steps))


def broken(input_shape, n_outputs, width=8):
    """A builder with a bug of its own, whose message is long."""
    raise TypeError(f"width {width} does not fit: " + "this builder explains at length. " * 12 + "(end)")


def stuck_on_workers(input_shape, n_outputs):
    """A builder that never returns on a worker (rank 0's check of it, before any member trains,
    gets a model): a deadlock in a user's code, a read from a hung file system."""
    import os
    import time
    if os.environ.get("PMI_RANK", "0") != "0":
        while True:
            time.sleep(1)
    return small_mlp(input_shape, n_outputs)


def stuck_everywhere(input_shape, n_outputs):
    """A builder that never returns, on any rank."""
    import time
    while True:
        time.sleep(1)


def returns_nothing(input_shape, n_outputs):
    """A builder that forgot its return."""
    small_mlp(input_shape, n_outputs)
