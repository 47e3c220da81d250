"""The logits processors (CTranslate2's ``make_logits_processors``): each disallows tokens (or
rescales the logits) before the step's log-softmax, and joins the step only when its option is
on. An option's row in the options table names its processor (`DecodingOption.processor`): a
new constraint is a row and a class here."""

import dataclasses

import numpy as np
from keras import ops

from keras_transformer.constants import MAX_NO_REPEAT_NGRAM_SIZE, PAD_ID, UNK_ID
from keras_transformer.decoding.options import OPTIONS
from keras_transformer.decoding.tensors import _is_python, tile_beams


def _repeated_ngram_ends(seqs, step, n):
    """For each row, which tokens would end an n-gram already in it (`no_repeat_ngram_size`).

    Args:
        seqs: int32 ``[rows, L]``, the tokens generated so far (positions ``< step``).
        step: int32 scalar, the position of the next token.
        n: python int >= 1.

    Returns:
        ``(tokens, repeated)``: int32 ``[rows, L - n + 1]``, the last token of the n-gram
        starting at each position, and bool ``[rows, L - n + 1]``, whether that n-gram
        lies before ``step`` and its first ``n - 1`` tokens are the row's last ``n - 1``.
    """
    rows, length = ops.shape(seqs)[0], ops.shape(seqs)[1]
    width = ops.maximum(length - n + 1, 0)  # the n-grams a buffer of L positions holds
    starts = ops.arange(width, dtype="int32")  # [W]
    repeated = ops.expand_dims(starts + n <= step, 0)  # [1, W]
    for j in range(n - 1):  # the n-gram's j-th token equals the row's (n - 1 - j)-th last one
        last = ops.take(seqs, ops.maximum(step - n + 1 + j, 0), axis=1)  # [rows]
        window = ops.slice(seqs, (0, j), (rows, width))  # [rows, W]
        repeated = ops.logical_and(repeated, window == ops.expand_dims(last, 1))
    tokens = ops.slice(seqs, (0, n - 1), (rows, width))  # [rows, W]
    return tokens, ops.logical_and(repeated, ops.ones_like(tokens, dtype="bool"))  # [rows, W] (n = 1: no loop)


def _repeated_ngram_ends_at_run_time(seqs, step, n):
    """`_repeated_ngram_ends` for a size `n` given at run time (an int32 scalar in
    ``[0, MAX_NO_REPEAT_NGRAM_SIZE]``; 0: nothing repeated): the n-gram starting at every
    position of the buffer, its tokens compared in `MAX_NO_REPEAT_NGRAM_SIZE - 1` unrolled
    steps, each masked off beyond the size asked. The same n-grams as the python size's.

    Returns:
        ``(tokens, repeated)``: int32 ``[rows, L]`` and bool ``[rows, L]``.
    """
    rows, length = ops.shape(seqs)[0], ops.shape(seqs)[1]
    n = ops.cast(n, "int32")
    padded = ops.pad(seqs, [[0, 0], [0, MAX_NO_REPEAT_NGRAM_SIZE]], constant_values=PAD_ID)  # [rows, L + M]
    starts = ops.arange(length, dtype="int32")  # [L]
    repeated = ops.expand_dims(ops.logical_and(starts + n <= step, n > 0), 0)  # [1, L]
    for j in range(MAX_NO_REPEAT_NGRAM_SIZE - 1):
        last = ops.take(seqs, ops.clip(step - n + 1 + j, 0, length - 1), axis=1)  # [rows]
        window = ops.slice(padded, (0, j), (rows, length))  # [rows, L]
        same = ops.logical_or(window == ops.expand_dims(last, 1), j >= n - 1)  # (beyond the size: any token)
        repeated = ops.logical_and(repeated, same)
    tokens = ops.take(padded, ops.maximum(starts + n - 1, 0), axis=1)  # [rows, L]
    return tokens, ops.logical_and(repeated, ops.ones_like(tokens, dtype="bool"))


# --------------------------------------------------------------------------
# Logits processors: each disallows tokens (CTranslate2's ``make_logits_processors``)
# --------------------------------------------------------------------------
# A processor is ``processor(banned, vocab, logits, sentences, step, spec) -> banned``: ``banned``
# bool ``[1 or b * k, V]`` (the tokens disallowed so far), ``vocab`` int32 ``[1, V]`` (each
# column's id), ``logits`` float32 ``[b * k, V]``, the state's per-sentence entries, the step
# (int32 scalar, the position of the token the logits score) and the `_SearchSpec`.
@dataclasses.dataclass(frozen=True)
class RepetitionPenalty:
    """The logits of the tokens already in the hypothesis (its generated tokens, a forced
    prefix's included, not BOS), each distinct token once, divided by ``penalty`` where
    >= 0 and multiplied by it where < 0 (CTranslate2's ``repetition_penalty``, CTRL's
    penalty, arXiv 1909.05858): a python float > 0 other than 1, or a float scalar tensor
    (1: no change). It changes the logits instead of disallowing tokens: `_processed`
    applies it before every processor's mask, as CTranslate2 does."""

    penalty: object
    rescales = True  # (a class attribute, not a field: `_processed` calls `rescaled`)

    def rescaled(self, logits, sentences, step, spec):
        length = ops.shape(sentences["alive_seqs"])[-1]
        seqs = ops.reshape(sentences["alive_seqs"], (-1, length))  # [b * k, L]
        rows = ops.broadcast_to(ops.arange(ops.shape(seqs)[0], dtype="int32")[:, None], ops.shape(seqs))
        generated = ops.broadcast_to(ops.arange(length, dtype="int32")[None, :] < step, ops.shape(seqs))  # [b * k, L]
        hits = ops.scatter(ops.reshape(ops.stack([rows, seqs], axis=-1), (-1, 2)),
                           ops.reshape(ops.cast(generated, "float32"), (-1,)),
                           ops.shape(logits))  # [b * k, V]: how often each token was generated
        penalty = ops.cast(self.penalty, logits.dtype)
        penalized = ops.where(logits < 0, logits * penalty, logits / penalty)  # [b * k, V]
        return ops.where(hits > 0, penalized, logits)


@dataclasses.dataclass(frozen=True)
class MinLength:
    """EOS disallowed at the steps before ``length`` tokens (CTranslate2's
    ``min_decoding_length``): a python int >= 1 or a scalar tensor."""

    length: object
    eos_id: int

    def __call__(self, banned, vocab, logits, sentences, step, spec):
        return ops.logical_or(banned, ops.logical_and(vocab == self.eos_id, step < self.length))


@dataclasses.dataclass(frozen=True)
class NoRepeatNgram:
    """A token that would repeat an n-gram of ``size`` tokens already in the hypothesis is
    disallowed (CTranslate2's ``no_repeat_ngram_size``): a python int >= 1, or an int32
    scalar tensor in ``[0, MAX_NO_REPEAT_NGRAM_SIZE]``."""

    size: object

    def __call__(self, banned, vocab, logits, sentences, step, spec):
        length = ops.shape(sentences["alive_seqs"])[-1]
        seqs = ops.reshape(sentences["alive_seqs"], (-1, length))  # [b * k, L]
        ngrams = _repeated_ngram_ends if _is_python(self.size) else _repeated_ngram_ends_at_run_time
        tokens, repeated = ngrams(seqs, step, self.size)  # [b * k, W] x2
        rows = ops.broadcast_to(ops.arange(ops.shape(seqs)[0], dtype="int32")[:, None], ops.shape(tokens))
        hits = ops.scatter(ops.reshape(ops.stack([rows, tokens], axis=-1), (-1, 2)),
                           ops.reshape(ops.cast(repeated, "float32"), (-1,)),
                           ops.shape(logits))  # [b * k, V]: how often each token ends a repeat
        return ops.logical_or(banned, hits > 0)


@dataclasses.dataclass(frozen=True)
class DisallowUnk:
    """The unknown token (``UNK_ID``) is never generated (CTranslate2's ``disable_unk``):
    ``on`` is True or a bool scalar tensor."""

    on: object

    def __call__(self, banned, vocab, logits, sentences, step, spec):
        return ops.logical_or(banned, ops.logical_and(vocab == UNK_ID, self.on))


@dataclasses.dataclass(frozen=True)
class SuppressSequences:
    """Sequences of tokens never generated (CTranslate2's ``suppress_sequences``): a sequence
    of one token disallows it at every step; one of ``n >= 2`` tokens disallows its last token
    where the hypothesis' last ``n - 1`` tokens (a forced prefix's included, never BOS) are
    its first ``n - 1``. ``sequences``: a tuple of non-empty tuples of python int ids, or,
    given at run time, ``(ids, lengths)``: int32 ``[S, M]`` tensors, each sequence's ids
    (any id after its length) and its length ``[S]`` (>= 1; ``S`` may be 0: none)."""

    sequences: tuple

    def __call__(self, banned, vocab, logits, sentences, step, spec):
        ids, lengths = _padded_sequences(self.sequences)  # [S, M], [S]
        width = ops.shape(ids)[1] - 1  # M - 1: the longest sequence's first tokens
        slots = ops.arange(ops.maximum(width, 0), dtype="int32")  # [M - 1]
        # Each sequence's first n - 1 tokens right-aligned in M - 1 slots (slot j: its token
        # j - (M - 1) + (n - 1)); a slot before its first token matches any token.
        index = slots[None, :] - width + ops.expand_dims(lengths, 1) - 1  # [S, M - 1]
        flat = ops.reshape(ids, (-1,))  # [S * M] (gathered by flat index: S may be 0 at run time)
        starts = ops.expand_dims(ops.arange(ops.shape(lengths)[0], dtype="int32") * ops.shape(ids)[1], 1)  # [S, 1]
        heads = ops.take(flat, starts + ops.maximum(index, 0))  # [S, M - 1]
        length = ops.shape(sentences["alive_seqs"])[-1]
        seqs = ops.reshape(sentences["alive_seqs"], (-1, length))  # [b * k, L]
        # the hypothesis' last M - 1 tokens (position step - (M - 1) + j; before 0: matched by no head)
        history = ops.take(seqs, ops.clip(step - width + slots, 0, length - 1), axis=1)  # [b * k, M - 1]
        same = ops.logical_or(history[:, None, :] == heads[None, :, :], (index < 0)[None, :, :])  # [b * k, S, M - 1]
        matched = ops.logical_and(ops.all(same, axis=-1), step >= lengths[None, :] - 1)  # [b * k, S]
        lasts = ops.take(flat, starts + ops.expand_dims(lengths - 1, 1))  # [S, 1]
        hits = ops.matmul(ops.cast(matched, "float32"), ops.cast(lasts == vocab, "float32"))  # [b * k, V]
        return ops.logical_or(banned, hits > 0)


def _padded_sequences(sequences):
    """`SuppressSequences`' sequences as ``(ids [S, M], lengths [S])``: python ones padded
    (NumPy constants), run-time ones as given."""
    if not _is_python(sequences[0]):
        return ops.cast(sequences[0], "int32"), ops.cast(sequences[1], "int32")
    width = max(len(sequence) for sequence in sequences)
    ids = np.zeros((len(sequences), width), np.int32)
    for row, sequence in enumerate(sequences):
        ids[row, :len(sequence)] = sequence
    return ids, np.array([len(sequence) for sequence in sequences], np.int32)


@dataclasses.dataclass(frozen=True)
class TargetPrefix:
    """Within its prefix (the state's ``prefix_ids``, ``prefix_lengths``) a sentence's next
    token is the prefix's, whatever the other processors allow: the last processor
    (CTranslate2's ``target_prefix``)."""

    def __call__(self, banned, vocab, logits, sentences, step, spec):
        prefix_ids = sentences["prefix_ids"]  # [b, P]
        position = ops.minimum(step, ops.shape(prefix_ids)[1] - 1)
        forced = tile_beams(ops.take(prefix_ids, ops.maximum(position, 0), axis=1), spec.beam_size)  # [b * k]
        forcing = tile_beams(step < sentences["prefix_lengths"], spec.beam_size)  # [b * k]
        return ops.where(ops.expand_dims(forcing, 1), vocab != ops.expand_dims(forced, 1), banned)  # [b * k, V]


def option_on(option, value) -> bool:
    """Whether the table's `option` (a `DecodingOption`) may be on at `value`: a python value
    other than its default (its processor's off: 0 / False; 1 for a penalty), or a tensor
    (given at run time). No processor, so no op at all, for an option that is off."""
    return not _is_python(value) or value != option.default


def make_logits_processors(options, eos_id, has_prefix=False):
    """The logits processors of a search (CTranslate2's ``make_logits_processors``): one for
    each option of the options table with a `processor` that is on in `options`
    (`option_on`), made from its value (and `eos_id` where the processor has that field), in
    CTranslate2's order: those that rescale the logits first (`RepetitionPenalty`), then the
    masks in the table's order (`MinLength`, `NoRepeatNgram`, `DisallowUnk`,
    `SuppressSequences`), and `TargetPrefix` last (where the search takes a prefix). A tuple;
    empty when none is on (the step then adds no op)."""
    made = [_made(option, getattr(options, option.name), eos_id) for option in OPTIONS
            if option.processor is not None and option_on(option, getattr(options, option.name))]
    processors = sorted(made, key=lambda processor: not getattr(processor, "rescales", False))  # (stable)
    if has_prefix:
        processors.append(TargetPrefix())
    return tuple(processors)


def _made(option, value, eos_id):
    """`option`'s processor (the class of this module its row names) for its `value`."""
    made = globals()[option.processor]
    fields = {field.name for field in dataclasses.fields(made)}
    return made(value, **({"eos_id": eos_id} if "eos_id" in fields else {}))


def _processed(logits, sentences, step, spec):
    """`logits` penalized (`RepetitionPenalty`) and with every token the processors disallow
    set to NEG_INF, as CTranslate2 applies its logits processors: before the step's log-softmax.

    Args:
        logits: float32 ``[b * k, V]``, batch-major.
        sentences: the state's per-sentence entries (``alive_seqs`` ``[b, k, L]``).
        step: int32 scalar, the position of the token the logits score.
    """
    vocab = ops.arange(ops.shape(logits)[-1], dtype="int32")[None, :]  # [1, V]
    banned = ops.zeros_like(vocab, dtype="bool")  # [1, V]
    for processor in spec.processors:  # (a penalty first: no penalty lifts a masked token)
        if getattr(processor, "rescales", False):
            logits = processor.rescaled(logits, sentences, step, spec)
        else:
            banned = processor(banned, vocab, logits, sentences, step, spec)
    return ops.where(banned, spec.neg_inf, logits)
