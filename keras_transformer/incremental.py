"""Cached incremental decoding of a `Transformer` built by `build_transformer`.

The encoder runs once per source; cross-attention keys/values are computed
once from its output; the decoder then runs one position at a time, writing
each position's self-attention keys/values into a preallocated cache
(survey, "decoding with a cache"). `make_step_fn` packages this as the step
function `(ids, cache, step) -> (logits, cache)` that beam search sees.

All the wiring is the model's own: this module calls `Transformer.encode`
and `Transformer.decode`, the methods the functional graph was traced from.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_transformer.config import TransformerConfig


class IncrementalDecoder:
    """Encode-once, decode-step-by-step view of a built `Transformer`.

    It holds no weights and no wiring of its own: it calls the model's
    `encode` and `decode`, so the step function and `model(...)` always use
    the same layers, weights and connections.

    Args:
        model: a `Transformer` from `build_transformer(config)`.
        config: the `TransformerConfig` it was built with.
    """

    def __init__(self, model: keras.Model, config: TransformerConfig):
        if not (hasattr(model, "encode") and hasattr(model, "decode")):
            raise TypeError(f"IncrementalDecoder needs a Transformer from build_transformer(config), "
                            f"got {type(model).__name__}")
        self.model = model
        self.config = config

    def encode(self, source_ids, source_features=None):
        """Returns the encoder output `[batch, S, d_model]` and the source padding mask `[batch, S]`.

        `source_features`: the syntax-aware model's extra encoder inputs by
        name (`source_tags`, `source_distances`; see `Transformer.encode`)."""
        return self.model.encode(source_ids, **(source_features or {}))

    def cross_attention_caches(self, encoder_output):
        """`(key, value)` per decoder layer, each `[batch, heads, S, head_size]`."""
        return self.model.cross_attention_caches(encoder_output)

    def initial_self_attention_cache(self, batch_size, max_length):
        """Zeroed `(key, value)` buffers per decoder layer, `[batch, heads, max_length, head_size]`."""
        shape = (batch_size, self.config.num_heads, max_length, self.config.head_size)
        dtype = self.model.compute_dtype
        return [(ops.zeros(shape, dtype), ops.zeros(shape, dtype)) for _ in range(self.config.num_layers)]

    def decode(self, target_ids, step, self_caches, cross_caches, source_mask):
        """Runs the decoder on `target_ids` `[batch, T]` at positions `step ..`.

        Returns logits `[batch, T, vocab]` and the updated self-attention caches.
        """
        return self.model.decode(target_ids, None, source_mask, start_position=step,
                                 self_attention_caches=self_caches,
                                 cross_attention_caches=cross_caches)

    def make_step_fn(self, source_ids, beam_size, source_features=None):
        """Encodes `source_ids` (with the syntax-aware model's `source_features`)
        and returns the step function for beam search.

        The encoder output's cross-attention keys/values and the source mask
        are repeated `beam_size` times (batch-major, row `b * beam + k`) and
        closed over: they never change during the search, so they are not
        part of the cache that beam search reorders every step.

        `step_fn(ids [batch*beam, 1], cache, step) -> (logits [batch*beam, vocab], cache)`,
        where `cache` is the self-attention caches; start from
        `initial_self_attention_cache(batch, max_length)`, which has leading
        dimension `batch` (beam search tiles it to `batch * beam`).
        """
        encoder_output, source_mask = self.encode(source_ids, source_features)
        cross_caches = [(ops.repeat(k, beam_size, axis=0), ops.repeat(v, beam_size, axis=0))
                        for k, v in self.cross_attention_caches(encoder_output)]
        source_mask = ops.repeat(source_mask, beam_size, axis=0)  # [batch * beam, S]

        def step_fn(ids, cache, step):
            logits, cache = self.decode(ids, step, cache, cross_caches, source_mask)
            return logits[:, 0, :], cache  # [batch * beam, vocab]

        return step_fn
