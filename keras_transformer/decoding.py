"""Batched beam search (and greedy search) behind a step function.

The search is written with ``keras.ops`` only, so the same code runs eagerly,
inside a ``tf.function`` (with or without ``jit_compile``), in a SavedModel
graph, converts to LiteRT (TFLite) builtin ops without Flex, and runs on the
JAX backend.  Every buffer is preallocated with a fixed size
(``max_decode_length``) and the loop is a ``keras.ops.while_loop``; new
tokens are written into the sequence buffers with a one-hot ``where`` blend
at position ``step`` (no scatter / ``slice_update``), and beams are reordered
with ``take`` (GATHER).

The model is hidden behind a *step function*::

    step_fn(ids, cache, step) -> (logits, cache)

* ``ids``: int32 ``[batch * beam, 1]``, the token at position ``step`` of
  every hypothesis (``BOS_ID`` at step 0);
* ``cache``: a nested structure (dict / list / tuple) of tensors whose
  leaves all have leading dimension ``batch * beam`` (batch-major: row
  ``b * beam + k`` is beam ``k`` of sentence ``b``).  The returned cache
  must have the same structure, shapes and dtypes as the one passed in
  (a ``while_loop`` requirement: preallocate growing key/value caches);
* ``step``: int32 scalar, the position of ``ids``;
* ``logits``: float ``[batch * beam, vocab]`` for the token at position
  ``step + 1``.

Scoring follows "Attention Is All You Need" / GNMT: the score of a finished
hypothesis is the sum of the log-probabilities of its tokens (EOS included)
divided by ``length_penalty(len, alpha) = ((5 + len) / 6) ** alpha`` where
``len`` counts the generated tokens including EOS.  The search keeps
``beam_size`` alive and ``beam_size`` finished hypotheses per sentence with
the usual top-``2 * beam_size`` candidate scheme (tensor2tensor, Flax WMT
example, T5X), stops a sentence as soon as no alive hypothesis can beat the
worst of its ``beam_size`` finished ones, and stops the loop when every
sentence is done or the buffer is full.

Numerics: no ``-inf`` is ever used; impossible entries carry ``NEG_INF``
(finite) *and* an explicit validity flag, so no NaN can appear.  A token
whose log-probability is below ``NEG_INF / 2`` (e.g. its logit was masked
with ``NEG_INF``) is treated as impossible.
"""

import warnings

import keras
import numpy as np
from keras import ops

from keras_transformer.constants import BOS_ID, EOS_ID, NEG_INF, PAD_ID

__all__ = [
    "beam_search",
    "expand_to_beams",
    "flatten_beams",
    "gather_beams",
    "greedy_search",
    "length_penalty",
    "tile_beams",
    "unflatten_beams",
]


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
def length_penalty(length, alpha):
    """GNMT length penalty ``((5 + length) / 6) ** alpha``.

    Args:
        length: int or float tensor (any shape) or python number: the number
            of generated tokens, EOS included.
        alpha: python float or float scalar tensor; 0 disables the penalty.

    Returns:
        float32 tensor with the shape of ``length``.
    """
    length = ops.cast(length, "float32")
    alpha = ops.cast(alpha, "float32")
    return ops.power((5.0 + length) / 6.0, alpha)


def flatten_beams(x):
    """Merges the batch and beam dimensions.

    Args:
        x: tensor ``[batch, beam, ...]``.

    Returns:
        tensor ``[batch * beam, ...]``, row ``b * beam + k`` = ``x[b, k]``.
    """
    shape = ops.shape(x)
    return ops.reshape(x, (-1,) + tuple(shape[2:]))  # [batch * beam, ...]


def unflatten_beams(x, beam_size):
    """Splits the leading ``batch * beam`` dimension (inverse of `flatten_beams`).

    Args:
        x: tensor ``[batch * beam, ...]`` (batch-major).
        beam_size: python int, the number of beams.

    Returns:
        tensor ``[batch, beam, ...]``.
    """
    shape = ops.shape(x)
    return ops.reshape(x, (-1, beam_size) + tuple(shape[1:]))  # [batch, beam, ...]


def expand_to_beams(x, beam_size):
    """Repeats every row ``beam_size`` times: ``[batch, ...] -> [batch, beam, ...]``.

    Args:
        x: tensor ``[batch, ...]``.
        beam_size: python int.

    Returns:
        tensor ``[batch, beam, ...]`` with ``out[b, k] = x[b]``.
    """
    x = ops.expand_dims(x, 1)  # [batch, 1, ...]
    reps = [1, beam_size] + [1] * (len(x.shape) - 2)
    return ops.tile(x, reps)  # [batch, beam, ...]


def tile_beams(x, beam_size):
    """Tiles a batch-major tensor to ``[batch * beam, ...]`` (row ``b * beam + k`` = ``x[b]``).

    Args:
        x: tensor ``[batch, ...]``.
        beam_size: python int.

    Returns:
        tensor ``[batch * beam, ...]``.
    """
    return flatten_beams(expand_to_beams(x, beam_size))  # [batch * beam, ...]


def gather_beams(x, beam_indices):
    """Selects beams per sentence: ``out[b, j] = x[b, beam_indices[b, j]]``.

    Implemented as one ``take`` (GATHER) on the flattened tensor with
    batch offsets, which converts to a LiteRT builtin and XLA.

    Args:
        x: tensor ``[batch, beam, ...]``.
        beam_indices: int32 tensor ``[batch, new_beam]`` with values in
            ``[0, beam)``.

    Returns:
        tensor ``[batch, new_beam, ...]``.
    """
    beam_indices = ops.cast(beam_indices, "int32")
    num_beams = ops.shape(x)[1]
    batch = ops.shape(beam_indices)[0]
    offsets = ops.arange(batch, dtype="int32")[:, None] * num_beams  # [batch, 1]
    flat_x = flatten_beams(x)  # [batch * beam, ...]
    return ops.take(flat_x, beam_indices + offsets, axis=0)  # [batch, new_beam, ...]


def _gather_flat_beams(x, beam_indices, beam_size):
    """`gather_beams` for a ``[batch * beam, ...]`` cache leaf; returns ``[batch * new_beam, ...]``."""
    x = unflatten_beams(x, beam_size)  # [batch, beam, ...]
    return flatten_beams(gather_beams(x, beam_indices))  # [batch * new_beam, ...]


def _infer_max_decode_length(max_lengths):
    """``max(max_lengths)`` as a python int; only for concrete (eager/numpy) values."""
    try:
        if isinstance(max_lengths, (int, np.integer, list, tuple, np.ndarray)):
            values = np.asarray(max_lengths)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values = np.asarray(ops.convert_to_numpy(max_lengths))
    except Exception as error:  # symbolic tensor (tf.function graph / jit tracer)
        raise ValueError(
            "beam_search: `max_decode_length` (a static python int, the buffer "
            "size) must be given when `max_lengths` is not a concrete value "
            "(e.g. inside tf.function or jax.jit)."
        ) from error
    return max(int(values.max()) if values.size else 1, 1)


# --------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------
def beam_search(
    step_fn,
    initial_cache,
    batch_size,
    max_lengths,
    *,
    beam_size=4,
    alpha=0.6,
    max_decode_length=None,
    num_results=1,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
):
    """Batched beam search with GNMT length penalty and early termination.

    Args:
        step_fn: ``step_fn(ids, cache, step) -> (logits, cache)``, see the
            module docstring. ``ids`` int32 ``[batch * beam, 1]`` is the
            token at position ``step`` (BOS at step 0), ``logits``
            ``[batch * beam, vocab]`` (vocab >= 2) are for position
            ``step + 1``; the returned cache must keep the structure, shapes
            and dtypes of its input.
        initial_cache: nested structure of tensors with leading dimension
            ``batch``; tiled here to ``batch * beam`` (row ``b * beam + k``)
            and reordered along beams after every step. May be ``{}``/``()``.
        batch_size: python int (or int32 scalar tensor on the TensorFlow
            backend for a dynamic batch): the number of sentences.
        max_lengths: int ``[batch]``: the maximum number of generated tokens
            (EOS included) per sentence, e.g. ``source_length + 50``.  A
            hypothesis reaching its limit without EOS is finished as it is.
            Values are clipped to ``[1, max_decode_length]``.
        beam_size: static python int >= 1 (it fixes tensor shapes). With 1
            the search is exactly greedy decoding (argmax until EOS).
        alpha: length-penalty exponent, python float or float scalar tensor
            (may be a SavedModel signature input). 0 = plain log-prob. The
            early-termination bound is valid for any alpha (negative too).
        max_decode_length: static python int, the size of the sequence
            buffers and the hard bound on the number of loop iterations.  If
            None it is ``max(max_lengths)``, which requires ``max_lengths`` to
            be concrete (eager / numpy); inside a graph pass it explicitly
            (e.g. ``max_source_length + 50``).
        num_results: static python int in ``[1, beam_size]``: how many
            hypotheses to return per sentence.
        bos_id: the id fed at step 0.
        eos_id: the id that ends a hypothesis.

    Returns:
        ``(sequences, scores)``:
        sequences: int32 ``[batch, num_results, max_decode_length]``, best
            first, without BOS, with EOS when it was produced, ``PAD_ID``
            after the end;
        scores: float32 ``[batch, num_results]``: sum of token
            log-probabilities divided by ``length_penalty(len, alpha)``.
            A result slot with no hypothesis (only possible when fewer than
            ``num_results`` distinct hypotheses exist) has an all-PAD
            sequence and score ``NEG_INF``.
    """
    if not isinstance(beam_size, (int, np.integer)) or beam_size < 1:
        raise ValueError(f"beam_size must be a python int >= 1, got {beam_size!r}")
    if not isinstance(num_results, (int, np.integer)) or not 1 <= num_results <= beam_size:
        raise ValueError(
            f"num_results must be a python int in [1, beam_size={beam_size}], "
            f"got {num_results!r}"
        )
    beam_size = int(beam_size)
    num_results = int(num_results)
    if max_decode_length is None:
        max_decode_length = _infer_max_decode_length(max_lengths)
    max_decode_length = int(max_decode_length)
    if max_decode_length < 1:
        raise ValueError(f"max_decode_length must be >= 1, got {max_decode_length}")

    k = beam_size
    length = max_decode_length
    # With one beam only the single best candidate is kept, so the search is
    # exactly greedy; with k > 1 the standard 2k candidates (enough to refill
    # k alive beams even if k of them end with EOS).
    num_candidates = 2 * k if k > 1 else 1
    neg_inf = ops.convert_to_tensor(NEG_INF, "float32")

    max_lengths = ops.cast(ops.reshape(max_lengths, (-1,)), "int32")  # [batch]
    eff_max_lengths = ops.clip(max_lengths, 1, length)  # [batch]
    # Upper bound on the length penalty of any hypothesis of a sentence.
    lp_max = length_penalty(eff_max_lengths, alpha)  # [batch]

    # ---- initial state --------------------------------------------------
    alive_seqs = ops.full((batch_size, k, length), PAD_ID, dtype="int32")  # [batch, k, L]
    alive_last = ops.full((batch_size, k), bos_id, dtype="int32")  # [batch, k]
    # Only beam 0 is alive at the start (the other k-1 would be duplicates).
    first_beam = ops.arange(k, dtype="int32") == 0  # [k]
    alive_valid = ops.logical_and(
        ops.ones((batch_size, k), dtype="bool"), first_beam[None, :]
    )  # [batch, k]
    alive_logp = ops.where(alive_valid, 0.0, neg_inf)  # [batch, k]
    fin_seqs = ops.full((batch_size, k, length), PAD_ID, dtype="int32")  # [batch, k, L]
    fin_scores = ops.full((batch_size, k), NEG_INF, dtype="float32")  # [batch, k]
    fin_valid = ops.zeros((batch_size, k), dtype="bool")  # [batch, k]
    done = ops.zeros((batch_size,), dtype="bool")  # [batch]
    cache = keras.tree.map_structure(lambda x: tile_beams(x, k), initial_cache)
    step = ops.convert_to_tensor(0, "int32")
    positions = ops.arange(length, dtype="int32")  # [L]

    def cond(step, alive_seqs, alive_last, alive_logp, alive_valid,
             fin_seqs, fin_scores, fin_valid, done, cache):
        return ops.logical_and(
            step < length, ops.any(ops.logical_not(done))
        )

    def body(step, alive_seqs, alive_last, alive_logp, alive_valid,
             fin_seqs, fin_scores, fin_valid, done, cache):
        ids = ops.reshape(alive_last, (-1, 1))  # [batch * k, 1]
        logits, new_cache = step_fn(ids, cache, step)
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # [batch * k, V]
        vocab = ops.shape(log_probs)[-1]
        log_probs = ops.reshape(log_probs, (-1, k, vocab))  # [batch, k, V]

        # ---- candidates: every (alive beam, token) pair -------------------
        cand_valid = ops.logical_and(
            alive_valid[:, :, None], log_probs > NEG_INF / 2
        )  # [batch, k, V]
        cand_logp = ops.where(
            cand_valid, alive_logp[:, :, None] + log_probs, neg_inf
        )  # [batch, k, V]
        flat_logp = ops.reshape(cand_logp, (-1, k * vocab))  # [batch, k * V]
        flat_valid = ops.reshape(cand_valid, (-1, k * vocab))  # [batch, k * V]
        top_logp, top_idx = ops.top_k(flat_logp, num_candidates)  # [batch, C] x2
        top_idx = ops.cast(top_idx, "int32")
        top_valid = gather_beams(flat_valid[:, :, None], top_idx)[:, :, 0]  # [batch, C]
        top_beam = ops.floor_divide(top_idx, vocab)  # [batch, C]
        top_tok = top_idx - top_beam * vocab  # [batch, C]
        top_seqs = gather_beams(alive_seqs, top_beam)  # [batch, C, L]
        # Write the new token at position `step` (one-hot blend, no scatter).
        write = (positions == step)[None, None, :]  # [1, 1, L]
        top_seqs = ops.where(write, top_tok[:, :, None], top_seqs)  # [batch, C, L]

        gen_len = step + 1  # generated tokens of every candidate, EOS included
        at_limit = (gen_len >= eff_max_lengths)[:, None]  # [batch, 1]
        is_eos = top_tok == eos_id  # [batch, C]
        finishing = ops.logical_and(top_valid, ops.logical_or(is_eos, at_limit))  # [batch, C]
        continuing = ops.logical_and(
            top_valid, ops.logical_not(ops.logical_or(is_eos, at_limit))
        )  # [batch, C]

        # ---- new alive set: best k continuing candidates ----------------
        alive_key = ops.where(continuing, top_logp, neg_inf)  # [batch, C]
        _, alive_idx = ops.top_k(alive_key, k)  # [batch, k]
        alive_idx = ops.cast(alive_idx, "int32")
        new_alive_valid = gather_beams(continuing[:, :, None], alive_idx)[:, :, 0]  # [batch, k]
        new_alive_logp = gather_beams(alive_key[:, :, None], alive_idx)[:, :, 0]  # [batch, k]
        new_alive_logp = ops.where(new_alive_valid, new_alive_logp, neg_inf)  # [batch, k]
        new_alive_last = gather_beams(top_tok[:, :, None], alive_idx)[:, :, 0]  # [batch, k]
        new_alive_seqs = gather_beams(top_seqs, alive_idx)  # [batch, k, L]
        source_beam = gather_beams(top_beam[:, :, None], alive_idx)[:, :, 0]  # [batch, k]
        new_cache = keras.tree.map_structure(
            lambda x: _gather_flat_beams(x, source_beam, k), new_cache
        )  # leaves [batch * k, ...]

        # ---- new finished set: best k of (old finished + finishing) -----
        cand_scores = ops.where(
            finishing, top_logp / length_penalty(gen_len, alpha), neg_inf
        )  # [batch, C]
        # Old entries first: top_k is stable, so ties keep the old ones.
        all_scores = ops.concatenate(
            [ops.where(fin_valid, fin_scores, neg_inf), cand_scores], axis=1
        )  # [batch, k + C]
        all_valid = ops.concatenate([fin_valid, finishing], axis=1)  # [batch, k + C]
        all_seqs = ops.concatenate([fin_seqs, top_seqs], axis=1)  # [batch, k + C, L]
        _, fin_idx = ops.top_k(all_scores, k)  # [batch, k]
        fin_idx = ops.cast(fin_idx, "int32")
        new_fin_scores = gather_beams(all_scores[:, :, None], fin_idx)[:, :, 0]  # [batch, k]
        new_fin_valid = gather_beams(all_valid[:, :, None], fin_idx)[:, :, 0]  # [batch, k]
        new_fin_seqs = gather_beams(all_seqs, fin_idx)  # [batch, k, L]
        # Sentences already done are frozen (batching must not change them).
        new_fin_scores = ops.where(done[:, None], fin_scores, new_fin_scores)
        new_fin_valid = ops.where(done[:, None], fin_valid, new_fin_valid)
        new_fin_seqs = ops.where(done[:, None, None], fin_seqs, new_fin_seqs)

        # ---- per-sentence termination ------------------------------------
        any_alive = ops.any(new_alive_valid, axis=1)  # [batch]
        best_alive = ops.max(new_alive_logp, axis=1)  # [batch]
        # Any extension has log-prob <= best_alive and length in
        # [gen_len + 1, max_len]; lp is monotonic in len, so the best
        # possible score is at one of the two ends (the max_len end when
        # alpha >= 0).
        bound = ops.maximum(
            best_alive / length_penalty(gen_len + 1, alpha), best_alive / lp_max
        )  # [batch]
        all_finished = ops.logical_not(
            ops.any(ops.logical_not(new_fin_valid), axis=1)
        )  # [batch]
        worst_finished = ops.min(
            ops.where(new_fin_valid, new_fin_scores, neg_inf), axis=1
        )  # [batch]
        cannot_improve = ops.logical_and(all_finished, worst_finished >= bound)
        new_done = ops.logical_or(
            ops.logical_or(done, at_limit[:, 0]),
            ops.logical_or(ops.logical_not(any_alive), cannot_improve),
        )  # [batch]
        return (step + 1, new_alive_seqs, new_alive_last, new_alive_logp,
                new_alive_valid, new_fin_seqs, new_fin_scores, new_fin_valid,
                new_done, new_cache)

    state = (step, alive_seqs, alive_last, alive_logp, alive_valid,
             fin_seqs, fin_scores, fin_valid, done, cache)
    state = ops.while_loop(cond, body, state, maximum_iterations=length)
    fin_seqs, fin_scores, fin_valid = state[5], state[6], state[7]

    fin_valid = fin_valid[:, :num_results]  # [batch, n]
    sequences = ops.where(
        fin_valid[:, :, None], fin_seqs[:, :num_results], PAD_ID
    )  # [batch, n, L]
    scores = ops.where(fin_valid, fin_scores[:, :num_results], neg_inf)  # [batch, n]
    return ops.cast(sequences, "int32"), ops.cast(scores, "float32")


def greedy_search(
    step_fn,
    initial_cache,
    batch_size,
    max_lengths,
    *,
    alpha=0.6,
    max_decode_length=None,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
):
    """Greedy decoding: the argmax token every step until EOS or the length limit.

    Exactly ``beam_search(..., beam_size=1)`` with the result dimension removed.

    Args:
        step_fn, initial_cache, batch_size, max_lengths, max_decode_length,
        bos_id, eos_id: as in `beam_search`.
        alpha: only used for the returned score (greedy choices do not
            depend on it).

    Returns:
        ``(sequences, scores)``: int32 ``[batch, max_decode_length]`` (no BOS,
        EOS included when produced, PAD after the end) and float32
        ``[batch]`` (length-penalised log-probability).
    """
    sequences, scores = beam_search(
        step_fn,
        initial_cache,
        batch_size,
        max_lengths,
        beam_size=1,
        alpha=alpha,
        max_decode_length=max_decode_length,
        num_results=1,
        bos_id=bos_id,
        eos_id=eos_id,
    )
    return sequences[:, 0], scores[:, 0]  # [batch, L], [batch]
