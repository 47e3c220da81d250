"""Syntax-aware input: source tag factors combined with the word embedding."""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_transformer.layers.embedding import sinusoidal_encoding

COMBINATIONS = ("sum", "ffn")


@keras.saving.register_keras_serializable(package="keras_transformer")
class TagFactorEmbedding(keras.layers.Layer):
    """Adds a word's syntactic tags to its embedding, then the positions.

    Survey section 3 (Eqs. 50-52): each source word `x_j` carries `kappa` tags
    (part of speech, dependency label, ...), one embedding table per tag type.

    * `"sum"`: `e(x_j) + sum_k e(tag_j^k)` (+ PE);
    * `"ffn"`: `W [e(x_j); e(tag_j^1); ...; e(tag_j^kappa)] + b` (+ PE), a
      one-layer feed-forward combination.

    Like the word embedding (`PositionalEmbedding`), each table starts as
    `RandomNormal(stddev=d_model ** -0.5)` and its rows are scaled by
    `sqrt(d_model)`, so every summand has unit variance. Tag id 0 (padding)
    is a row like the others: padded positions are masked downstream.

    Args:
        tag_vocab_sizes: rows of each tag table (ids `0 .. size - 1`).
        d_model: width.
        combination: `"sum"` or `"ffn"`.
        max_wavelength: of the positional encoding (10000, as the paper).

    Call arguments:
        word_embeddings: `[batch, S, d_model]`, the scaled token embeddings
            without positions (`PositionalEmbedding(..., positions=False)`).
        tags: int `[batch, S, kappa]`.

    Returns:
        `[batch, S, d_model]` in the compute dtype.

    Example:
        >>> factors = TagFactorEmbedding((20, 40), 512)
        >>> x = factors(embedding(source_ids, positions=False), source_tags)
    """

    def __init__(self, tag_vocab_sizes, d_model, combination="sum", max_wavelength=10000.0, **kwargs):
        super().__init__(**kwargs)
        if combination not in COMBINATIONS:
            raise ValueError(f"combination={combination!r}, expected one of {COMBINATIONS}")
        if not tag_vocab_sizes or any(int(size) < 1 for size in tag_vocab_sizes):
            raise ValueError(f"tag_vocab_sizes={tag_vocab_sizes!r} must be one or more positive sizes")
        self.tag_vocab_sizes = tuple(int(size) for size in tag_vocab_sizes)
        self.d_model = d_model
        self.combination = combination
        self.max_wavelength = max_wavelength

    def build(self, word_embeddings_shape=None, tags_shape=None):
        self.tables = [
            self.add_weight(name=f"tags_{k}", shape=(size, self.d_model),
                            initializer=keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))
            for k, size in enumerate(self.tag_vocab_sizes)]
        if self.combination == "ffn":
            self.combine = keras.layers.Dense(self.d_model, name="combine", dtype=self.dtype_policy)
            self.combine.build((None, None, self.d_model * (1 + len(self.tables))))

    def tag_embeddings(self, tags):
        """One `[batch, S, d_model]` per tag factor, scaled by sqrt(d_model)."""
        tags = ops.cast(tags, "int32")
        return [ops.cast(ops.take(table, tags[:, :, k], axis=0), self.compute_dtype) * math.sqrt(self.d_model)
                for k, table in enumerate(self.tables)]

    def call(self, word_embeddings, tags):
        factors = self.tag_embeddings(tags)
        if self.combination == "sum":
            x = word_embeddings
            for factor in factors:
                x = x + factor
        else:
            x = self.combine(ops.concatenate([word_embeddings, *factors], axis=-1))  # [batch, S, d_model]
        length = ops.shape(word_embeddings)[1]
        encoding = sinusoidal_encoding(ops.arange(length, dtype="int32"), self.d_model,
                                       self.max_wavelength)  # [S, d_model]
        return x + ops.expand_dims(ops.cast(encoding, self.compute_dtype), 0)

    def compute_output_shape(self, word_embeddings_shape, tags_shape=None):
        return tuple(word_embeddings_shape)

    def get_config(self):
        config = super().get_config()
        config.update(tag_vocab_sizes=list(self.tag_vocab_sizes), d_model=self.d_model,
                      combination=self.combination, max_wavelength=self.max_wavelength)
        return config
