"""Cached incremental decoding of a model built by `build_transformer`.

The encoder runs once per source; cross-attention keys/values are computed
once from its output; the decoder then runs one position at a time, writing
each position's self-attention keys/values into a preallocated cache
(survey, "decoding with a cache"). `make_step_fn` packages this as the step
function `(ids, cache, step) -> (logits, cache)` that beam search sees.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_transformer import model as model_lib
from keras_transformer.config import TransformerConfig
from keras_transformer.constants import PAD_ID


class IncrementalDecoder:
    """Encode-once, decode-step-by-step view of a built Transformer.

    It holds no weights of its own: it calls the layers of `model` by name, so
    the step function and `model(...)` always use the same weights.

    Args:
        model: a `keras.Model` from `build_transformer(config)`.
        config: the `TransformerConfig` it was built with.
    """

    def __init__(self, model: keras.Model, config: TransformerConfig):
        self.model = model
        self.config = config
        self.embedding = model.get_layer(model_lib.EMBEDDING)
        self.encoder_layers = [model.get_layer(model_lib.ENCODER_LAYER.format(i))
                               for i in range(config.num_layers)]
        self.decoder_layers = [model.get_layer(model_lib.DECODER_LAYER.format(i))
                               for i in range(config.num_layers)]
        self.encoder_norm = model.get_layer(model_lib.ENCODER_NORM) if config.norm_first else None
        self.decoder_norm = model.get_layer(model_lib.DECODER_NORM) if config.norm_first else None

    def encode(self, source_ids):
        """Returns the encoder output `[batch, S, d_model]` and the source padding mask `[batch, S]`."""
        source_mask = ops.not_equal(source_ids, PAD_ID)
        x = self.embedding(source_ids)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=source_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, source_mask

    def cross_attention_caches(self, encoder_output):
        """`(key, value)` per decoder layer, each `[batch, S, heads, head_size]`."""
        return [layer.cross_attention.compute_key_value(encoder_output)
                for layer in self.decoder_layers]

    def initial_self_attention_cache(self, batch_size, max_length):
        """Zeroed `(key, value)` buffers per decoder layer, `[batch, max_length, heads, head_size]`."""
        shape = (batch_size, max_length, self.config.num_heads, self.config.head_size)
        dtype = self.model.compute_dtype
        return [(ops.zeros(shape, dtype), ops.zeros(shape, dtype)) for _ in self.decoder_layers]

    def decode(self, target_ids, step, self_caches, cross_caches, source_mask):
        """Runs the decoder on `target_ids` `[batch, T]` at positions `step ..`.

        Returns logits `[batch, T, vocab]` and the updated self-attention caches.
        """
        y = self.embedding(target_ids, start_position=step)
        new_caches = []
        for layer, self_cache, cross_cache in zip(self.decoder_layers, self_caches, cross_caches):
            y, self_cache = layer(y, encoder_padding_mask=source_mask,
                                  self_attention_cache=self_cache, cache_index=step,
                                  cross_attention_cache=cross_cache)
            new_caches.append(self_cache)
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)
        logits = ops.cast(self.embedding(y, reverse=True), "float32")
        return logits, new_caches

    def make_step_fn(self, source_ids, beam_size):
        """Encodes `source_ids` and returns the step function for beam search.

        The encoder output's cross-attention keys/values and the source mask
        are repeated `beam_size` times (batch-major, row `b * beam + k`) and
        closed over: they never change during the search, so they are not
        part of the cache that beam search reorders every step.

        `step_fn(ids [batch*beam, 1], cache, step) -> (logits [batch*beam, vocab], cache)`,
        where `cache` is the self-attention caches; start from
        `initial_self_attention_cache(batch, max_length)`, which has leading
        dimension `batch` (beam search tiles it to `batch * beam`).
        """
        encoder_output, source_mask = self.encode(source_ids)
        cross_caches = [(ops.repeat(k, beam_size, axis=0), ops.repeat(v, beam_size, axis=0))
                        for k, v in self.cross_attention_caches(encoder_output)]
        source_mask = ops.repeat(source_mask, beam_size, axis=0)  # [batch * beam, S]

        def step_fn(ids, cache, step):
            logits, cache = self.decode(ids, step, cache, cross_caches, source_mask)
            return logits[:, 0, :], cache  # [batch * beam, vocab]

        return step_fn
