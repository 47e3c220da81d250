"""Position-wise feed-forward network."""

from __future__ import annotations

import keras

from keras_transformer.layers.attention import sublayer_initializer
from keras_transformer.layers.per_token import apply_per_token


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2` (paper eq. 2), applied at every position.

    Args:
        d_model: input and output width.
        d_ff: inner width (2048 base, 4096 big).
        kernel_initializer: initializer of W1 and W2 (a name, a config or a
            `keras.initializers.Initializer`; each gets its own copy).
        bias_initializer: initializer of b1 and b2.

    Call arguments:
        inputs: `[batch, T, d_model]` (or `[rows, d_model]`, one position per row).
        matmul: None, or the product of 2-D inputs (`apply_per_token`).

    Returns:
        `[batch, T, d_model]`, in the compute dtype (bfloat16 under
        `dtype="mixed_bfloat16"`, with float32 weights).

    Example:
        >>> FeedForward(512, 2048)(x).shape  # x: [2, 7, 512]
        (2, 7, 512)
    """

    def __init__(self, d_model, d_ff, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.d_ff = d_ff
        # Resolved in `build`, one copy per Dense (see `sublayer_initializer`).
        self.kernel_initializer = kernel_initializer
        self.bias_initializer = bias_initializer

    def build(self, input_shape):
        def dense(units, name, activation=None):
            return keras.layers.Dense(units, activation=activation,
                                      kernel_initializer=sublayer_initializer(self.kernel_initializer),
                                      bias_initializer=sublayer_initializer(self.bias_initializer),
                                      name=name, dtype=self.dtype_policy)

        self.inner = dense(self.d_ff, "inner", activation="relu")
        self.outer = dense(self.d_model, "outer")
        self.inner.build(input_shape)
        self.outer.build(tuple(input_shape[:-1]) + (self.d_ff,))

    def call(self, inputs, matmul=None):
        return apply_per_token(self.outer, apply_per_token(self.inner, inputs, matmul), matmul)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.d_model,)  # [batch, T, d_model]

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, d_ff=self.d_ff,
                      kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
                      bias_initializer=keras.initializers.serialize(self.bias_initializer))
        return config
