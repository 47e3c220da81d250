"""Encoder and decoder blocks, built from the same residual connection."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.residual import ResidualConnection
from keras_transformer.layers.step_kernels import LAYER_KERNELS


class _BlockBase(keras.layers.Layer):
    """Arguments and sub-layer factories common to both blocks."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, attention_dropout=0.0,
                 norm_first=False, epsilon=1e-6, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.norm_first = norm_first
        self.epsilon = epsilon
        # Passed on as given; each Dense inside makes its own copy.
        self.kernel_initializer = kernel_initializer
        self.bias_initializer = bias_initializer

    def _attention(self, name, input_shape):
        layer = MultiHeadAttention(self.num_heads, self.d_model, dropout=self.attention_dropout,
                                   kernel_initializer=self.kernel_initializer,
                                   bias_initializer=self.bias_initializer,
                                   name=name, dtype=self.dtype_policy)
        layer.build(input_shape, input_shape)
        return layer

    def _residual(self, name, input_shape):
        layer = ResidualConnection(self.dropout, self.norm_first, self.epsilon, name=name,
                                   dtype=self.dtype_policy)
        layer.build(input_shape)
        return layer

    def _feed_forward(self, input_shape):
        layer = FeedForward(self.d_model, self.d_ff, kernel_initializer=self.kernel_initializer,
                            bias_initializer=self.bias_initializer, name="feed_forward",
                            dtype=self.dtype_policy)
        layer.build(input_shape)
        return layer

    def _apply(self, residual, sublayer, x, training):
        """Runs `sublayer` inside `residual`; returns the new `x` and whatever
        else the sub-layer returned (a cache)."""
        result = sublayer(residual.normalize_input(x))
        output, extra = result if isinstance(result, tuple) else (result, None)
        return residual(x, output, training=training), extra

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
                      dropout=self.dropout, attention_dropout=self.attention_dropout,
                      norm_first=self.norm_first, epsilon=self.epsilon,
                      kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
                      bias_initializer=keras.initializers.serialize(self.bias_initializer))
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderBlock(_BlockBase):
    """One encoder layer: self-attention, then a feed-forward network, each
    wrapped in the shared `ResidualConnection` (post-norm by default).

    Args:
        d_model, num_heads, d_ff: sizes (paper Table 3).
        dropout: P_drop on each sub-layer output.
        attention_dropout: dropout on attention weights (paper: 0).
        norm_first: pre-norm instead of the paper's post-norm.
        epsilon: LayerNorm epsilon.
        kernel_initializer, bias_initializer: of the attention projections and
            the feed-forward network (default Glorot uniform and zeros).

    Call arguments:
        inputs: `[batch, S, d_model]`.
        padding_mask: bool `[batch, S]`, True on real tokens.
        attention_bias: optional additive bias broadcastable to
            `[batch, heads, S, S]` (survey Eq. 53).
        attention_scale: optional multiplier of the scaled logits,
            broadcastable to `[batch, heads, S, S]` (survey Eq. 54).
        training: enables dropout.

    Returns:
        `[batch, S, d_model]`, in the compute dtype (bfloat16 under
        `dtype="mixed_bfloat16"`, with float32 weights).

    Example:
        >>> block = EncoderBlock(512, 8, 2048)
        >>> y = block(x, padding_mask=ids != 0)
    """

    def build(self, inputs_shape, padding_mask_shape=None, attention_bias_shape=None,
              attention_scale_shape=None):
        self.self_attention = self._attention("self_attention", inputs_shape)
        self.self_attention_residual = self._residual("self_attention_residual", inputs_shape)
        self.feed_forward = self._feed_forward(inputs_shape)
        self.feed_forward_residual = self._residual("feed_forward_residual", inputs_shape)

    def call(self, inputs, padding_mask=None, attention_bias=None, training=None, attention_scale=None):
        mask = None if padding_mask is None else ops.expand_dims(padding_mask, 1)  # [batch, 1, S]
        x, _ = self._apply(
            self.self_attention_residual,
            lambda h: self.self_attention(h, attention_mask=mask, attention_bias=attention_bias,
                                          attention_scale=attention_scale, training=training),
            inputs, training)
        x, _ = self._apply(self.feed_forward_residual, self.feed_forward, x, training)
        return x

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)  # [batch, S, d_model]


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderBlock(_BlockBase):
    """One decoder layer: masked self-attention, cross-attention over the
    encoder output, feed-forward; each in the shared `ResidualConnection`.

    Args: as `EncoderBlock`.

    Call arguments:
        inputs: `[batch, T, d_model]`.
        encoder_output: `[batch, S, d_model]`; may be None when
            `cross_attention_cache` is given.
        encoder_padding_mask: bool `[batch, S]`, True on real source tokens.
        self_attention_bias: optional additive bias for self-attention.
        self_attention_cache: `(key, value)` `[batch, heads, max_length,
            head_size]` for incremental decoding; the call writes its keys and
            values at `cache_index`.
        cache_index: int32 scalar, absolute position of `inputs[:, 0]`.
        cross_attention_cache: `(key, value)` of the encoder output, from
            `cross_attention.compute_key_value(encoder_output)` once per source
            (one row per sentence, shared by its beams: see `MultiHeadAttention`;
            `encoder_padding_mask` then has one row per sentence too).
        training: enables dropout.
        grow_cache: append this call's keys/values to `self_attention_cache`
            instead of writing them at `cache_index` (see `MultiHeadAttention`);
            both attentions then pick their kernels per call by size
            (`MultiHeadAttention`'s `small_kernels`).
        small_kernels: None (`grow_cache`'s choice above), or the
            attentions' `small_kernels` for this cached call (`"always"`).
        kernels: None, or the `StepKernels` of a cached step of one
            position per row (2-D inputs): the attentions' (`MultiHeadAttention`)
            and the feed-forward's `matmul` (`apply_per_token`).

    Returns:
        `[batch, T, d_model]`, and the updated self-attention cache when one
        was given. Without a cache, self-attention is causal over `T`.
        `compute_output_shape` gives the same: `inputs_shape`, or
        `(inputs_shape, self_attention_cache_shape)` with a cache.
    """

    def build(self, inputs_shape, encoder_output_shape=None, *args, **kwargs):
        self.self_attention = self._attention("self_attention", inputs_shape)
        self.self_attention_residual = self._residual("self_attention_residual", inputs_shape)
        self.cross_attention = self._attention("cross_attention", inputs_shape)
        self.cross_attention_residual = self._residual("cross_attention_residual", inputs_shape)
        self.feed_forward = self._feed_forward(inputs_shape)
        self.feed_forward_residual = self._residual("feed_forward_residual", inputs_shape)

    def call(self, inputs, encoder_output=None, encoder_padding_mask=None,
             self_attention_bias=None, self_attention_cache=None, cache_index=None,
             cross_attention_cache=None, training=None, grow_cache=False, small_kernels=None, kernels=None):
        small = grow_cache if small_kernels is None else small_kernels
        kernels = kernels or LAYER_KERNELS
        x, new_cache = self._self_attended(inputs, self_attention_bias, self_attention_cache, cache_index,
                                           training, grow_cache, small, kernels)
        cross_mask = None if encoder_padding_mask is None else ops.expand_dims(encoder_padding_mask, 1)
        x, _ = self._apply(
            self.cross_attention_residual,
            lambda h: self.cross_attention(h, encoder_output, attention_mask=cross_mask,
                                           cache=cross_attention_cache, training=training,
                                           small_kernels=small if cross_attention_cache is not None else False,
                                           kernels=kernels),
            x, training)
        x, _ = self._apply(self.feed_forward_residual, lambda h: self.feed_forward(h, matmul=kernels.matmul), x,
                           training)
        if self_attention_cache is None:
            return x
        return x, new_cache

    def _self_attended(self, inputs, self_attention_bias=None, self_attention_cache=None, cache_index=None,
                       training=None, grow_cache=False, small=False, kernels=LAYER_KERNELS):
        """The self-attention sub-layer with its residual: `(x, the updated cache or None)`;
        causal over whole sequences without a cache."""
        if self_attention_cache is None:
            length = ops.shape(inputs)[1]
            positions = ops.arange(length)
            causal = ops.expand_dims(ops.expand_dims(positions, 0) <= ops.expand_dims(positions, 1), 0)  # [1, T, T]

            def self_attend(h):
                return self.self_attention(h, attention_mask=causal,
                                           attention_bias=self_attention_bias, training=training)
        else:
            def self_attend(h):
                return self.self_attention(h, attention_bias=self_attention_bias,
                                           cache=self_attention_cache, cache_index=cache_index,
                                           grow_cache=grow_cache, small_kernels=small, kernels=kernels,
                                           training=training)
        return self._apply(self.self_attention_residual, self_attend, inputs, training)

    def cross_attention_weights(self, inputs, encoder_output, encoder_padding_mask=None):
        """This block's encoder-decoder attention weights for whole target sequences (no
        cache, inference): float32 `[batch, heads, T, S]`, what each target position
        attends to in the source (`keras_transformer.inference.alignment`)."""
        x, _ = self._self_attended(inputs)
        cross_mask = None if encoder_padding_mask is None else ops.expand_dims(encoder_padding_mask, 1)
        return self.cross_attention.attention_weights(self.cross_attention_residual.normalize_input(x),
                                                      encoder_output, cross_mask)

    def compute_output_shape(self, inputs_shape, encoder_output_shape=None,
                             self_attention_cache_shape=None):
        output_shape = tuple(inputs_shape)  # [batch, T, d_model]
        if self_attention_cache_shape is None:
            return output_shape
        # The updated cache has the given cache's shape.
        return output_shape, tuple(tuple(shape) for shape in self_attention_cache_shape)
