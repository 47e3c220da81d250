"""Shared token embedding with the paper's sinusoidal positional encoding."""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_transformer.layers.per_token import leading_shape


def sinusoidal_encoding(positions, d_model, max_wavelength=10000.0):
    """The paper's positional encoding (section 3.5).

    `PE(pos, 2i) = sin(pos / 10000^(2i/d_model))` on even dimensions and
    `PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))` on odd ones.

    Args:
        positions: int or float `[T]`.
        d_model: width.

    Returns:
        float32 `[T, d_model]`.
    """
    positions = ops.expand_dims(ops.cast(positions, "float32"), 1)  # [T, 1]
    dims = ops.arange(d_model)  # [d_model]
    even_dims = ops.cast((dims // 2) * 2, "float32")  # 2i for both 2i and 2i+1
    inverse_frequency = ops.exp(-math.log(max_wavelength) * even_dims / d_model)  # [d_model]
    angles = positions * ops.expand_dims(inverse_frequency, 0)  # [T, d_model]
    return ops.where(ops.expand_dims(ops.equal(dims % 2, 0), 0), ops.sin(angles), ops.cos(angles))


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEmbedding(keras.layers.Layer):
    """Token embedding x sqrt(d_model) plus sinusoidal positions; also the
    pre-softmax projection that shares the same matrix (paper section 3.4).

    One instance is called on the source ids, on the target ids and, with
    `reverse=True`, on the decoder output: the source embedding, the target
    embedding and the output projection share one `[vocab, d_model]` matrix.

    Args:
        vocab_size: number of tokens.
        d_model: width.
        max_wavelength: 10000 in the paper.
        embeddings_initializer: initializer of the `[vocab, d_model]` matrix (a
            name, a config or a `keras.initializers.Initializer`). None (the
            default) means `RandomNormal(stddev=d_model ** -0.5)`, as
            tensor2tensor: after the sqrt(d_model) scaling the embeddings have
            unit variance, and as the output projection the logits start small.

    Call arguments:
        inputs: int `[batch, T]` token ids, or with `reverse=True` float
            `[batch, T, d_model]` (or `[tokens, d_model]`) decoder states.
        start_position: int32 scalar, position of the first token (incremental
            decoding feeds one token at a time at increasing positions).
        reverse: project states to vocabulary logits with the transposed
            embedding matrix instead.
        output_kernel: with `reverse`, None or `output_kernel()` computed
            once outside a decoding loop (the transposed matrix, so the loop
            body multiplies by it instead of transposing every step).
        matmul: with `reverse` and `[tokens, d_model]` states, None or the
            product to take (`apply_per_token`).
        positions: False returns the scaled token embeddings without the
            positional encoding (a `TagFactorEmbedding` combines them with
            tag embeddings first, then adds the positions itself).

    Returns:
        `[batch, T, d_model]` embeddings, or `[batch, T, vocab_size]` logits
        with `reverse=True`; in the compute dtype (bfloat16 under
        `dtype="mixed_bfloat16"`, with a float32 matrix).
        `compute_output_shape(inputs_shape, reverse=False)` gives the same.

    Example:
        >>> embed = PositionalEmbedding(37000, 512)
        >>> x = embed(source_ids)             # [batch, S, 512]
        >>> logits = embed(h, reverse=True)   # [batch, T, 37000]
    """

    def __init__(self, vocab_size, d_model, max_wavelength=10000.0, embeddings_initializer=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.max_wavelength = max_wavelength
        # Resolved in `build`: making a random initializer draws a seed from
        # the global RNG, which must happen when the weight is made.
        self.embeddings_initializer = embeddings_initializer

    def build(self, input_shape=None):
        if self.embeddings_initializer is None:
            initializer = keras.initializers.RandomNormal(stddev=self.d_model ** -0.5)
        else:
            initializer = keras.initializers.get(self.embeddings_initializer)
        self.embeddings = self.add_weight(name="embeddings", shape=(self.vocab_size, self.d_model),
                                          initializer=initializer)

    def output_kernel(self):
        """The output projection's matrix `[d_model, vocab]`: the transposed embeddings,
        in the compute dtype."""
        return ops.transpose(ops.cast(self.embeddings, self.compute_dtype))

    def call(self, inputs, start_position=0, reverse=False, positions=True, output_kernel=None, matmul=None):
        if reverse:
            kernel = self.output_kernel() if output_kernel is None else output_kernel  # [d_model, vocab]
            if len(inputs.shape) == 2:  # [tokens, d_model] already
                return (matmul or ops.matmul)(inputs, kernel)  # [tokens, vocab]
            flat = ops.reshape(inputs, (-1, self.d_model))  # [tokens, d_model]: a 2-D matmul (see apply_per_token)
            logits = ops.matmul(flat, kernel)  # [tokens, vocab]
            return ops.reshape(logits, leading_shape(inputs) + (self.vocab_size,))  # [batch, T, vocab]
        x = ops.take(self.embeddings, ops.cast(inputs, "int32"), axis=0)  # [batch, T, d_model]
        x = ops.cast(x, self.compute_dtype) * math.sqrt(self.d_model)
        if not positions:
            return x
        length = ops.shape(inputs)[1]
        position_ids = ops.cast(start_position, "int32") + ops.arange(length, dtype="int32")
        encoding = sinusoidal_encoding(position_ids, self.d_model, self.max_wavelength)  # [T, d_model]
        return x + ops.expand_dims(ops.cast(encoding, self.compute_dtype), 0)

    def compute_output_shape(self, inputs_shape, reverse=False):
        if reverse:
            return tuple(inputs_shape[:-1]) + (self.vocab_size,)  # [batch, T, vocab]
        return tuple(inputs_shape) + (self.d_model,)  # [batch, T, d_model]

    def compute_output_spec(self, inputs, start_position=0, reverse=False, positions=True, output_kernel=None,
                            matmul=None):
        # `reverse` is not a tensor, so Keras would not pass it to
        # `compute_output_shape` on its own.
        return keras.KerasTensor(self.compute_output_shape(inputs.shape, reverse=reverse),
                                 dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, d_model=self.d_model,
                      max_wavelength=self.max_wavelength,
                      embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer))
        return config
