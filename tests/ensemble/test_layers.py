"""The TensorFlow-free input-rank check that rank 0 runs before any worker builds a model."""

from ensemble.config.vocabulary import check_input_rank


def test_conv2d_on_flat_vectors_is_caught_with_the_fix():
    msg = check_input_rank([{"type": "Conv2D", "filters": 4, "kernel_size": 3}], [64], "architectures[0].layers")
    assert "`architectures[0].layers[0]` (Conv2D) needs 3 axes" in msg and "data.reshape" in msg


def test_reshape_then_conv_flatten_then_dense_is_fine():
    layers = [{"type": "Reshape", "target_shape": [8, 8, 1]},
              {"type": "Conv2D", "filters": 4, "kernel_size": 3}, {"type": "MaxPooling2D"},
              {"type": "Flatten"}, {"type": "Dense", "units": 4}]
    assert check_input_rank(layers, [64], "l") is None


def test_conv_after_flatten_is_caught():
    layers = [{"type": "Flatten"}, {"type": "Conv1D", "filters": 4, "kernel_size": 3}]
    assert "(Conv1D) needs 2 axes" in check_input_rank(layers, [10, 3], "l")
