"""The residual sub-layer connection shared by encoder and decoder blocks."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class ResidualConnection(keras.layers.Layer):
    """Dropout, residual add and LayerNorm around one sub-layer.

    Post-norm (paper, section 5.4): `LayerNorm(x + Dropout(Sublayer(x)))`.
    Pre-norm (survey): `x + Dropout(Sublayer(LayerNorm(x)))`; the stack then
    ends with a final LayerNorm.

    A block uses it in two calls around its sub-layer:

        h = residual.normalize_input(x)   # LayerNorm(x) in pre-norm, else x
        y = sublayer(h)
        x = residual(x, y)                # add (+ LayerNorm in post-norm)

    Args:
        dropout: P_drop on the sub-layer output.
        norm_first: pre-norm if True, post-norm (paper) if False.
        epsilon: LayerNorm epsilon.

    Call arguments:
        residual: the sub-layer input `x`, `[batch, T, d_model]`.
        sublayer_output: `Sublayer(...)`, same shape.
        training: enables dropout.

    Returns:
        `[batch, T, d_model]`, in the compute dtype (bfloat16 under
        `dtype="mixed_bfloat16"`, with float32 LayerNorm weights).
    """

    def __init__(self, dropout=0.1, norm_first=False, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.norm_first = norm_first
        self.epsilon = epsilon

    def build(self, residual_shape, sublayer_output_shape=None):
        self.norm = keras.layers.LayerNormalization(epsilon=self.epsilon, name="norm",
                                                    dtype=self.dtype_policy)
        self.norm.build(residual_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def normalize_input(self, x):
        return self.layer_norm(x) if self.norm_first else x

    def call(self, residual, sublayer_output, training=None):
        x = residual + self.dropout_layer(sublayer_output, training=training)
        return x if self.norm_first else self.layer_norm(x)

    def layer_norm(self, x):
        """`self.norm(x)`: the same function on the same weights, without reshaping them.

        `keras.layers.LayerNormalization` keeps its axis as `[-1]`, which
        `ops.layer_normalization` compares with `ndims - 1`, so every call
        reshapes gamma and beta to `[1, ..., d_model]` (two Reshape nodes per
        LayerNorm in each decoding step of a TensorFlow graph). With the
        positive last axis they broadcast as they are: the same numbers.
        """
        outputs = ops.layer_normalization(x, self.norm.gamma, self.norm.beta, axis=len(x.shape) - 1,
                                          epsilon=self.norm.epsilon)
        return ops.cast(outputs, self.norm.compute_dtype)

    def compute_output_shape(self, residual_shape, sublayer_output_shape=None):
        return residual_shape

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout, norm_first=self.norm_first, epsilon=self.epsilon)
        return config
