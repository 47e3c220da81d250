"""Cached incremental decoding of a `Transformer` built by `build_transformer`.

The encoder runs once per source; cross-attention keys/values are computed
once from its output; the decoder then runs one position at a time, writing
each position's self-attention keys/values into a preallocated cache, or
appending them to a cache that grows (survey, "decoding with a cache").
`step` is the step function `(ids, cache, step, static_cache) -> (logits,
cache)` that beam search sees; `make_step_fn` closes it over one source.

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
        """Zeroed `(key, value)` buffers per decoder layer, `[batch, heads, max_length, head_size]`
        (`max_length=0` for caches that grow: `step(..., grow=True)`)."""
        shape = (batch_size, self.config.num_heads, max_length, self.config.head_size)
        dtype = self.model.compute_dtype
        return [(ops.zeros(shape, dtype), ops.zeros(shape, dtype)) for _ in range(self.config.decoder_depth)]

    def resize_self_attention_cache(self, caches, length):
        """Pads each `(key, value)` buffer `[rows, heads, n, head_size]` with zeros to
        `length` positions (`CacheStages.resize`, for `beam_search`'s cache stages)."""
        def pad(x):
            return ops.pad(x, [[0, 0], [0, 0], [0, length - ops.shape(x)[2]], [0, 0]])

        return [(pad(k), pad(v)) for k, v in caches]

    def output_kernel(self):
        """The output projection's matrix `[d_model, vocab]` (the transposed embeddings):
        computed once before a decoding loop and passed to `step`, so no step
        transposes the embeddings (under XLA a batch-1 step's projection took
        ~206 us with the transpose folded into it; docs/lab-notebook)."""
        return self.model.embedding.output_kernel()

    def decode(self, target_ids, step, self_caches, cross_caches, source_mask, grow=False, output_kernel=None,
               small_kernels=None, kernels=None):
        """Runs the decoder on `target_ids` `[batch, T]` at positions `step ..`.

        Returns logits `[batch, T, vocab]` and the updated self-attention caches
        (grown by `T` positions with `grow`). `output_kernel`: None or `output_kernel()`;
        `small_kernels`: None (`grow`'s choice) or the attentions' (`DecoderBlock`);
        `kernels`: None or the step's `StepKernels` (`Transformer.decode`).
        """
        return self.model.decode(target_ids, None, source_mask, start_position=step,
                                 self_attention_caches=self_caches,
                                 cross_attention_caches=cross_caches, grow_caches=grow,
                                 output_kernel=output_kernel, small_kernels=small_kernels, kernels=kernels)

    def static_cache(self, source_ids, source_features=None):
        """Encodes `source_ids` once: what every decoding step reads and never changes.

        Returns:
            `{"cross": [(key, value) per decoder layer, each [batch, heads, S, head_size]],
            "mask": bool [batch, S]}`, one row per sentence (its beams share it:
            the cross-attention takes the beams as query rows, see
            `MultiHeadAttention`), for `beam_search(..., static_cache=...)`.
        """
        encoder_output, source_mask = self.encode(source_ids, source_features)
        return {"cross": self.cross_attention_caches(encoder_output), "mask": source_mask}

    def step(self, ids, cache, step, static_cache, grow=False, output_kernel=None, small_kernels=None,
             kernels=None):
        """The beam-search step function with a static cache (`static_cache` above):
        `(ids [rows, 1], cache, step, static_cache) -> (logits [rows, vocab], cache)`,
        where the rows are `beam` consecutive rows per row of `static_cache`.
        `output_kernel`: None, or `output_kernel()` computed before the loop;
        `small_kernels`, `kernels`: as `decode`."""
        logits, cache = self.decode(ids, step, cache, static_cache["cross"], static_cache["mask"], grow=grow,
                                    output_kernel=output_kernel, small_kernels=small_kernels, kernels=kernels)
        return ops.squeeze(logits, 1), cache  # [rows, vocab]

    def make_step_fn(self, source_ids, beam_size, source_features=None):
        """Encodes `source_ids` (with the syntax-aware model's `source_features`)
        and returns the step function `(ids, cache, step) -> (logits, cache)`
        that closes over `static_cache(source_ids)`.

        `step_fn(ids [batch*beam, 1], cache, step) -> (logits [batch*beam, vocab], cache)`,
        where `cache` is the self-attention caches; start from
        `initial_self_attention_cache(batch, max_length)`, which has leading
        dimension `batch` (beam search tiles it to `batch * beam`). The rows
        are batch-major (`b * beam + k`); the beams per sentence follow from
        the shapes (`rows / batch`), so `beam_size` is not used: it stays in
        the signature for existing callers.
        """
        static = self.static_cache(source_ids, source_features)

        def step_fn(ids, cache, step):
            return self.step(ids, cache, step, static)

        return step_fn
