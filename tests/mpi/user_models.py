"""A user's own Keras model builder, named in a test config as ``model = "tests.mpi.user_models:small_mlp"``."""


def small_mlp(input_shape, n_outputs, units=16):
    import keras
    inputs = keras.Input(shape=input_shape)
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(n_outputs, activation="softmax")(hidden))
