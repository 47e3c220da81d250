"""Forced decoding: the log-probability the model gives a given translation.

`score_tokens(model, source_ids, target_ids, target_lengths)` runs the model once over the
whole target (teacher forcing, as in training: the decoder reads BOS and the target's
tokens and predicts the tokens and then EOS) and returns the log-probability of each
predicted token. Their sum is the target's log-probability, what CTranslate2's
`Translator.score_batch` and fairseq's `--score-reference` report; divided by the GNMT
length penalty it is the score the beam search gives that translation
(`decoding.length_penalty`).

Written in `keras.ops` (any backend); `keras_transformer.inference.translator.Translator.score_graph`
puts the tokenizer around it, and the SavedModel's `score` signature serves it.
"""

from __future__ import annotations

from keras import ops

from keras_transformer.constants import BOS_ID, EOS_ID, PAD_ID


def forced_decoding_ids(target_ids, target_lengths):
    """The decoder's input and the tokens it must predict for a target.

    Args:
        target_ids: int `[batch, T]`, the target's tokens (no BOS, no EOS), padded with PAD_ID.
        target_lengths: int `[batch]`, the number of tokens of each row.

    Returns:
        `(decoder_input, predicted)`, int32 `[batch, T + 1]` each: BOS then the tokens,
        and the tokens then EOS (PAD after both).
    """
    target_ids = ops.cast(target_ids, "int32")
    lengths = ops.cast(target_lengths, "int32")
    batch = ops.shape(target_ids)[0]
    bos = ops.full((batch, 1), BOS_ID, dtype="int32")  # [batch, 1]
    pad = ops.full((batch, 1), PAD_ID, dtype="int32")  # [batch, 1]
    positions = ops.arange(ops.shape(target_ids)[1] + 1, dtype="int32")  # [T + 1]
    at_end = ops.expand_dims(positions, 0) == ops.expand_dims(lengths, 1)  # [batch, T + 1]
    decoder_input = ops.where(ops.expand_dims(positions, 0) <= ops.expand_dims(lengths, 1),
                              ops.concatenate([bos, target_ids], axis=1), PAD_ID)  # [batch, T + 1]
    predicted = ops.where(at_end, EOS_ID, ops.concatenate([target_ids, pad], axis=1))  # [batch, T + 1]
    return decoder_input, predicted


def score_tokens(model, source_ids, target_ids, target_lengths, source_features=None):
    """log p(token | source, the tokens before it) of each target token and of the final EOS.

    Args:
        model: a `Transformer` (`build_transformer`).
        source_ids: int `[batch, S]`, each source's tokens then EOS, padded with PAD_ID (what
            `Translator.encode_text` makes).
        target_ids: int `[batch, T]`, the targets' tokens without BOS or EOS, PAD after.
        target_lengths: int `[batch]`, the tokens of each target.
        source_features: a syntax-aware model's extra encoder inputs (`source_tags`,
            `source_distances`), as `Translator.encode_conllu` gives them.

    Returns:
        float32 `[batch, T + 1]`: position `t < length` holds the log-probability of token
        `t`, position `length` that of EOS, later positions 0. The row's sum is the
        target's log-probability.

    Example:
        >>> token_scores = score_tokens(model, source_ids, target_ids, target_lengths)
        >>> total = ops.sum(token_scores, axis=1)  # [batch]
    """
    decoder_input, predicted = forced_decoding_ids(target_ids, target_lengths)
    encoded, source_mask = model.encode(source_ids, **(source_features or {}))
    logits, _ = model.decode(decoder_input, encoded, source_mask)  # [batch, T + 1, vocab]
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # [batch, T + 1, vocab]
    chosen = ops.take_along_axis(log_probs, ops.expand_dims(predicted, -1), axis=-1)[..., 0]  # [batch, T + 1]
    positions = ops.arange(ops.shape(predicted)[1], dtype="int32")  # [T + 1]
    scored = ops.expand_dims(positions, 0) <= ops.expand_dims(ops.cast(target_lengths, "int32"), 1)
    return ops.where(scored, chosen, 0.0)
