"""Position-wise feed-forward network."""

from __future__ import annotations

import keras


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2` (paper eq. 2), applied at every position.

    Args:
        d_model: input and output width.
        d_ff: inner width (2048 base, 4096 big).

    Call arguments:
        inputs: `[batch, T, d_model]`.

    Returns:
        `[batch, T, d_model]`.

    Example:
        >>> FeedForward(512, 2048)(x).shape  # x: [2, 7, 512]
        (2, 7, 512)
    """

    def __init__(self, d_model, d_ff, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.d_ff = d_ff

    def build(self, input_shape):
        self.inner = keras.layers.Dense(self.d_ff, activation="relu", name="inner",
                                        dtype=self.dtype_policy)
        self.outer = keras.layers.Dense(self.d_model, name="outer", dtype=self.dtype_policy)
        self.inner.build(input_shape)
        self.outer.build(tuple(input_shape[:-1]) + (self.d_ff,))

    def call(self, inputs):
        return self.outer(self.inner(inputs))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, d_ff=self.d_ff)
        return config
