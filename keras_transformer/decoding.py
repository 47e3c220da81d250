"""Batched beam search (and greedy search) behind a step function.

The search is written with ``keras.ops`` only, so the same code runs eagerly,
inside a ``tf.function`` (with or without ``jit_compile``), in a SavedModel
graph, converts to LiteRT (TFLite) builtin ops without Flex, and runs on the
JAX backend.  Every buffer is preallocated with a fixed size
(``max_decode_length``: a python int, or in a TensorFlow graph a scalar
tensor fixed for the call) and the loop is a ``keras.ops.while_loop``; new
tokens are written into the sequence buffers with a one-hot ``where`` blend
at position ``step`` (no scatter / ``slice_update``), and beams are reordered
with ``take`` (GATHER). (``drop_finished``, for TensorFlow graphs without
XLA and their LiteRT conversion, adds ``nonzero`` and ``scatter_update`` and
changes shapes in the loop;
``batch_halvings``, for XLA, adds a ``switch`` and ``slice_update``.)

The model is hidden behind a *step function*::

    step_fn(ids, cache, step) -> (logits, cache)

* ``ids``: int32 ``[batch * beam, 1]``, the token at position ``step`` of
  every hypothesis (``BOS_ID`` at step 0);
* ``cache``: a nested structure (dict / list / tuple) of tensors whose
  leaves all have leading dimension ``batch * beam`` (batch-major: row
  ``b * beam + k`` is beam ``k`` of sentence ``b``).  The returned cache
  must have the same structure and dtypes as the one passed in, and the
  same shapes unless the loop allows them to change (``drop_finished``
  with a ``while_loop`` of relaxed shape invariants: caches may then grow
  by concatenation; with static shapes, preallocate them, or grow them
  between ``cache_stages``);
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
best of its finished ones (the ``n``-th best when ``n`` results are asked),
and stops the loop when every sentence is done or
the buffer is full. Optionally it drops finished sentences from the loop,
runs the loop in cache stages, and stops by CTranslate2's patience rule
(`beam_search`'s arguments).

One loop step (each a small helper below): the step function scores the
next token of every alive beam; `_grow_candidates` keeps the best
``2 * beam_size`` (beam, token) extensions; `_update_alive` keeps the best
``beam_size`` that continue (and reorders the cache); `_update_finished`
merges the ones that end into the finished set; `_update_done` applies the
early-termination bound.  The loop state is a dict (`_initial_state`).

Numerics: no ``-inf`` is ever used; impossible entries carry ``NEG_INF``
(finite) *and* an explicit validity flag, so no NaN can appear.  A token
whose log-probability is below ``NEG_INF / 2`` (e.g. its logit was masked
with ``NEG_INF``) is treated as impossible.
"""

import typing
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
    "halving_sizes",
    "keras_gather",
    "length_penalty",
    "tile_beams",
    "top_k_blockwise",
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


def keras_gather(x, indices, batch_dims=0):
    """The search's gathers in ``keras.ops``, with ``tf.gather(x, indices,
    axis=batch_dims, batch_dims=batch_dims)``'s meaning (what `beam_search`
    takes as ``gather``):

    * ``batch_dims=0``: rows of ``x`` ``[n, ...]`` by ``indices`` (any shape);
    * ``batch_dims=1``: ``out[b, j] = x[b, indices[b, j]]``: `gather_beams`.

    Runs on every backend and converts to LiteRT's GATHER; a TensorFlow graph
    may pass ``tf.gather`` instead (one node per call, where ``ops.take``
    adds its negative-index fix and `gather_beams` its offsets: a while
    loop pays for every node on every step).
    """
    if batch_dims == 0:
        return ops.take(x, indices, axis=0)
    if batch_dims == 1:
        return gather_beams(x, indices)
    raise ValueError(f"keras_gather takes batch_dims 0 or 1, got {batch_dims!r}")


# Smallest and largest block of `top_k_blockwise`, and how many blocks per wanted entry
# it needs before it beats one `top_k` over the whole row.
_MIN_BLOCK, _MAX_BLOCK, _MIN_BLOCKS_PER_ENTRY = 16, 256, 2


def _block_size(vocab, bound):
    """`top_k_blockwise`'s block for a row of `vocab` entries and up to `bound` wanted:
    a power of two near ``sqrt(vocab / bound)``, within [16, 256]; where that does not
    divide the row, the divisor of `vocab` in [16, 256] nearest to it, within a factor
    of two, so that the row is cut into blocks without a padded copy of it (10,000
    pieces: 40, not 32 and 16 padding entries; the padded copy of a batch-32 step's
    ``[rows, 10,000]`` log-probabilities was 7% of its traced kernel time). Any block
    gives the same values and indices."""
    power = 2 ** int(round(np.log2(max(np.sqrt(vocab / bound), 1.0))))
    power = min(max(power, _MIN_BLOCK), _MAX_BLOCK)
    if vocab % power == 0:
        return power
    divisors = [d for d in range(max(_MIN_BLOCK, power // 2), min(_MAX_BLOCK, 2 * power) + 1) if vocab % d == 0]
    if not divisors:
        return power
    return min(divisors, key=lambda d: (abs(np.log(d / power)), -d))


def top_k_blockwise(x, k, block_size=None, gather=keras_gather, max_k=None):
    """``ops.top_k(x, k)`` over the last axis of a float ``[rows, V]``, exactly (same
    values, same indices, ties to the lower index), in two small passes instead of
    one ``top_k`` over ``V``.

    The row is cut into blocks of ``block_size`` entries; the ``k`` blocks with
    the largest maxima hold the row's ``k`` largest entries (any entry outside
    them is beaten by those ``k`` maxima, and on a tie a block of lower index
    wins, as does its entry), so ``top_k`` over those ``k * block_size``
    candidates, in their original order, is the row's ``top_k``. One pass of
    ``max`` over the row replaces the per-entry comparisons of ``top_k`` with a
    heap: on ``[128, 8000]``, k 8, 3.3 -> 0.8 ms in a TensorFlow graph and
    1.6 -> 0.6 ms under XLA on this 2-core CPU (docs/lab-notebook). Plain
    ``top_k`` where the row is too short for blocks to help.

    Args:
        x: float ``[rows, V]``, ``V`` static.
        k: python int, ``1 <= k <= V``, or (TensorFlow) an int32 scalar tensor
            with `max_k`.
        block_size: None (a power of two near ``sqrt(V / k)``, within
            [16, 256], or the divisor of ``V`` nearest to it: `_block_size`) or a
            python int.
        gather: `keras_gather` or a function with its meaning (``tf.gather``).
        max_k: with a tensor `k`, the largest it may be (python int): the
            blocks are sized and counted for it, which is exact for any
            smaller ``k`` (the ``k`` best blocks still hold the ``k`` best).

    Returns:
        ``(values [rows, k], indices int32 [rows, k])``, as ``ops.top_k``.
    """
    vocab = x.shape[-1]
    bound = k if max_k is None else max_k  # python int
    if block_size is None and vocab is not None:
        block_size = _block_size(vocab, bound)
    if vocab is None or -(-vocab // block_size) < _MIN_BLOCKS_PER_ENTRY * bound:
        values, indices = ops.top_k(x, k)
        return values, ops.cast(indices, "int32")
    num_blocks = -(-vocab // block_size)
    padding = num_blocks * block_size - vocab
    if padding:  # the last block filled with the lowest float: never above a real entry
        x = ops.pad(x, [[0, 0], [0, padding]], constant_values=float(np.finfo(np.float32).min))
    blocks = ops.reshape(x, (-1, num_blocks, block_size))  # [rows, blocks, block]
    _, best = ops.top_k(ops.max(blocks, axis=2), k)  # [rows, k]
    best = ops.sort(ops.cast(best, "int32"), axis=-1)  # [rows, k]: candidates in index order
    candidates = gather(blocks, best, 1)  # [rows, k, block]
    values, position = ops.top_k(ops.reshape(candidates, (-1, k * block_size)), k)  # [rows, k] x2
    position = ops.cast(position, "int32")
    block = gather(best, position // block_size, 1)  # [rows, k]
    return values, block * block_size + position % block_size


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
# Beam search: the state carried by the while loop and one step's helpers
# --------------------------------------------------------------------------
class _SearchSpec(typing.NamedTuple):
    """What stays fixed during one search (never a loop variable).

    Static python values that fix shapes, and loop-invariant tensors built
    once before the loop (the loop body captures them instead of rebuilding
    them every step; in a TensorFlow graph each captured tensor is carried
    as a loop variable, ~4 nodes a step, so constants stay NumPy values).
    """

    # k: a python int (static shapes), or an int32 scalar tensor in [1, max_beam_size]
    # (one TensorFlow graph for every beam size: `translate_options`)
    beam_size: object
    num_candidates: object  # C: 2k, or 1 when k == 1 (exactly greedy); a tensor with a tensor k
    max_candidates: int  # the largest C (python int): sizes `top_k_blockwise`'s blocks
    num_results: object  # n: the result slots returned (python int, or a tensor with a tensor k)
    # r: python int or int32 scalar tensor in [1, n]; the stop is exact for the r best
    # hypotheses (1: the bound of the best one; k: the worst of the k finished ones)
    exact_results: object
    eos_id: int
    alpha: object  # python float or float scalar tensor
    patience: object  # None, or float scalar: stop after round(k * patience) finished hypotheses
    positions: object  # int32 [L], arange(L): where to write the token of `step`
    neg_inf: object  # NEG_INF as a NumPy float32 scalar
    gather: object  # `keras_gather`, or a function with its meaning (tf.gather)
    normalize_after_top_k: bool  # each beam's top tokens by their logits, then only those normalized


def _candidates(beam_size):
    """C for k beams: with one beam only the single best candidate is kept, so the
    search is exactly greedy; with k > 1 the standard 2k candidates (enough to
    refill k alive beams even if k of them end with EOS). A python int, or for a
    tensor k a tensor."""
    if isinstance(beam_size, int):
        return 2 * beam_size if beam_size > 1 else 1
    return ops.where(beam_size > 1, 2 * beam_size, 1)


def _make_spec(beam_size, num_results, alpha, patience, max_decode_length, eos_id, gather,
               exact_results=None, max_beam_size=None, normalize_after_top_k=False):
    """Builds the `_SearchSpec` of a search (before the loop); arguments as in
    `beam_search` (already validated)."""
    return _SearchSpec(
        beam_size=beam_size,
        num_candidates=_candidates(beam_size),
        max_candidates=_candidates(beam_size if max_beam_size is None else max_beam_size),
        num_results=num_results,
        exact_results=num_results if exact_results is None else exact_results,
        eos_id=eos_id,
        alpha=alpha,
        patience=patience,
        positions=ops.arange(0, max_decode_length, dtype="int32"),  # [L]
        # A constant wherever it is used: a tensor made before the loop would be
        # one more variable of a TensorFlow while_loop (~4 nodes every step).
        neg_inf=np.float32(NEG_INF),
        gather=gather,
        normalize_after_top_k=bool(normalize_after_top_k),
    )


def _initial_state(initial_cache, batch_size, max_lengths, max_decode_length, bos_id, spec):
    """The search state before step 0 (the ``while_loop`` variables).

    The state is a dict (a structure that ``keras.ops.while_loop`` and
    ``keras.tree`` carry as it is on every backend); ``b`` is the number of
    sentences still searched (the batch, or fewer with ``drop_finished``)::

        step             int32 scalar, the position fed to the step function
        alive_seqs       int32 [b, k, L]  tokens generated so far, PAD after
        alive_last       int32 [b, k]     token at position `step` (BOS at 0)
        alive_logp       float32 [b, k]   sum of token log-probs (NEG_INF if invalid)
        alive_valid      bool [b, k]      whether the alive slot holds a hypothesis
        finished_seqs    int32 [b, k, L]  best finished hypotheses, best first
        finished_scores  float32 [b, k]   their length-penalised scores
        finished_valid   bool [b, k]      whether the finished slot is used
        finished_count   int32 [b]        hypotheses finished so far (only with patience)
        done             bool [b]         sentence finished: state frozen
        max_lengths      int32 [b]        length limit, clipped to [1, L]
        max_penalty      float32 [b]      length_penalty(max_lengths, alpha)
        cache            step-function cache, leaves [b * k, ...]

    Only beam 0 of every sentence is alive at the start (the other ``k - 1``
    would be duplicates); nothing is finished.
    """
    k, length = spec.beam_size, max_decode_length
    max_lengths = ops.cast(ops.reshape(max_lengths, (-1,)), "int32")  # [batch]
    max_lengths = ops.clip(max_lengths, 1, max_decode_length)  # [batch]
    first_beam = ops.arange(k, dtype="int32") == 0  # [k]
    alive_valid = ops.logical_and(
        ops.ones((batch_size, k), dtype="bool"), first_beam[None, :]
    )  # [batch, k]
    state = {
        "step": ops.convert_to_tensor(0, "int32"),
        "alive_seqs": ops.full((batch_size, k, length), PAD_ID, dtype="int32"),
        "alive_last": ops.full((batch_size, k), bos_id, dtype="int32"),
        "alive_logp": ops.where(alive_valid, 0.0, spec.neg_inf),  # [batch, k]
        "alive_valid": alive_valid,
        "finished_seqs": ops.full((batch_size, k, length), PAD_ID, dtype="int32"),
        "finished_scores": ops.full((batch_size, k), NEG_INF, dtype="float32"),
        "finished_valid": ops.zeros((batch_size, k), dtype="bool"),
        "done": ops.zeros((batch_size,), dtype="bool"),
        "max_lengths": max_lengths,
        # Upper bound on the length penalty of any hypothesis of a sentence.
        "max_penalty": length_penalty(max_lengths, spec.alpha),  # [batch]
        "cache": keras.tree.map_structure(lambda x: tile_beams(x, k), initial_cache),
    }
    if spec.patience is not None:  # counted only for the patience stop (ops saved every step otherwise)
        state["finished_count"] = ops.zeros((batch_size,), dtype="int32")
    return state


def _beam_rows(beam_indices, beam_size, sentences=None):
    """Flat ``[b * beam]`` row indices into a ``[batch * beam, ...]`` cache.

    Row ``i * new_beam + j`` of the result is ``s_i * beam_size + beam_indices[i, j]``
    with ``s_i = sentences[i]`` (or ``i``): the one gather that reorders a
    cache along beams, and with `sentences` also keeps only those sentences.

    Args:
        beam_indices: int32 ``[b, new_beam]``, values in ``[0, beam_size)``.
        beam_size: python int.
        sentences: None or int32 ``[b]``, the sentence of each row.
    """
    if sentences is None:
        sentences = ops.arange(ops.shape(beam_indices)[0], dtype="int32")  # [b]
    rows = sentences[:, None] * beam_size + ops.cast(beam_indices, "int32")  # [b, new_beam]
    return ops.reshape(rows, (-1,))  # [b * new_beam]


def _grow_candidates(state, logits, spec):
    """Extends every alive beam by every token and keeps the best candidates.

    The best ``C`` of the ``k * V`` (beam, token) pairs by summed log-prob,
    found as the best ``C`` of each beam's best ``C`` tokens (the same
    candidates, in the same order: ``top_k`` keeps the lower index first on
    ties within a beam, and the merge keeps the lower beam first); the
    chosen token is written into the copied sequence at position ``step``
    (a one-hot ``where`` blend, no scatter).

    Args:
        state: the search state.
        logits: float32 ``[b * k, V]``, the scores of the token after
            ``alive_last`` for every alive beam (batch-major). They become
            log-probabilities before each beam's top tokens are taken, or with
            ``spec.normalize_after_top_k`` only those tokens' are (the same
            order: ``log_softmax`` subtracts one value from a row).
        spec: the `_SearchSpec`.

    Returns:
        dict of candidates, best first:
        seqs int32 ``[b, C, L]`` (the new token at ``step``),
        logp float32 ``[b, C]`` (sum of token log-probs),
        tok int32 ``[b, C]`` (the new token),
        beam int32 ``[b, C]`` (the alive beam it extends),
        length int32 scalar (generated tokens, EOS included: ``step + 1``),
        at_limit bool ``[b, 1]`` (``length`` reached the sentence's limit),
        finishing bool ``[b, C]`` (valid and EOS or at the limit),
        continuing bool ``[b, C]`` (valid and neither).
    """
    k, num_candidates = spec.beam_size, spec.num_candidates
    step = state["step"]
    vocab = logits.shape[-1]
    # Each beam's best tokens (a beam never contributes more than C candidates).
    if vocab is None:
        per_beam = num_candidates
    elif isinstance(num_candidates, int):
        per_beam = min(num_candidates, vocab)
    else:  # a run-time beam size
        per_beam = ops.minimum(num_candidates, vocab)
    bound = spec.max_candidates if vocab is None else min(spec.max_candidates, vocab)  # the largest P
    ranked = logits if spec.normalize_after_top_k else ops.log_softmax(logits, axis=-1)  # [b * k, V]
    beam_logp, beam_tok = top_k_blockwise(ranked, per_beam, gather=spec.gather, max_k=bound)  # [b * k, P] x2
    if spec.normalize_after_top_k:  # only the chosen entries become log-probabilities
        beam_logp = beam_logp - ops.logsumexp(logits, axis=-1, keepdims=True)  # [b * k, P]
    beam_logp = ops.reshape(beam_logp, (-1, k, per_beam))  # [b, k, P]
    beam_tok = ops.reshape(ops.cast(beam_tok, "int32"), (-1, k * per_beam))  # [b, k * P]
    valid = ops.logical_and(
        state["alive_valid"][:, :, None], beam_logp > NEG_INF / 2
    )  # [b, k, P]
    logp = ops.where(
        valid, state["alive_logp"][:, :, None] + beam_logp, spec.neg_inf
    )  # [b, k, P]
    flat_logp = ops.reshape(logp, (-1, k * per_beam))  # [b, k * P]
    flat_valid = ops.reshape(valid, (-1, k * per_beam))  # [b, k * P]
    if isinstance(k, int) and k * per_beam == num_candidates:  # greedy: the one candidate is the beam's best
        top_logp = flat_logp
        top_idx = ops.zeros_like(beam_tok)
    else:
        top_logp, top_idx = ops.top_k(flat_logp, num_candidates)  # [b, C] x2
        top_idx = ops.cast(top_idx, "int32")
    top_valid = spec.gather(flat_valid, top_idx, 1)  # [b, C]
    top_beam = ops.floor_divide(top_idx, per_beam)  # [b, C]
    top_tok = spec.gather(beam_tok, top_idx, 1)  # [b, C]
    top_seqs = spec.gather(state["alive_seqs"], top_beam, 1)  # [b, C, L]
    write = (spec.positions == step)[None, None, :]  # [1, 1, L]
    top_seqs = ops.where(write, top_tok[:, :, None], top_seqs)  # [b, C, L]

    length = step + 1
    at_limit = (length >= state["max_lengths"])[:, None]  # [b, 1]
    is_eos = top_tok == spec.eos_id  # [b, C]
    finishing = ops.logical_and(top_valid, ops.logical_or(is_eos, at_limit))  # [b, C]
    continuing = ops.logical_and(
        top_valid, ops.logical_not(ops.logical_or(is_eos, at_limit))
    )  # [b, C]
    return {
        "seqs": top_seqs,
        "logp": top_logp,
        "tok": top_tok,
        "beam": top_beam,
        "length": length,
        "at_limit": at_limit,
        "finishing": finishing,
        "continuing": continuing,
    }


def _update_alive(candidates, spec):
    """The new alive set: the best ``k`` continuing candidates.

    Args:
        candidates: the dict from `_grow_candidates`.
        spec: the `_SearchSpec`.

    Returns:
        dict with the state's ``alive_seqs``, ``alive_last``, ``alive_logp``
        and ``alive_valid``, and ``source_beam`` int32 ``[b, k]``: the
        previous alive beam each new one extends (how to reorder the cache).
    """
    k = spec.beam_size
    key = ops.where(candidates["continuing"], candidates["logp"], spec.neg_inf)  # [b, C]
    # top_k's values are key's entries at idx, NEG_INF wherever the slot is not valid
    # (the key masks them): no gather or where for them.
    logp, idx = ops.top_k(key, k)  # [b, k] x2
    idx = ops.cast(idx, "int32")
    valid = spec.gather(candidates["continuing"], idx, 1)  # [b, k]
    return {
        "alive_seqs": spec.gather(candidates["seqs"], idx, 1),  # [b, k, L]
        "alive_last": spec.gather(candidates["tok"], idx, 1),  # [b, k]
        "alive_logp": logp,
        "alive_valid": valid,
        "source_beam": spec.gather(candidates["beam"], idx, 1),  # [b, k]
    }


def _update_finished(state, candidates, spec):
    """The new finished set: the best ``k`` of (old finished + finishing candidates).

    Old entries come first in the merge: ``top_k`` is stable, so on a tie
    the older hypothesis is kept.  Sentences already done are frozen
    (batching must not change them); a state without ``done`` (the
    drop-finished loop, where no sentence in the loop is done) has none.

    Args:
        state: the search state (its finished set and ``done``, if any).
        candidates: the dict from `_grow_candidates`.
        spec: the `_SearchSpec`.

    Returns:
        dict with the state's ``finished_seqs``, ``finished_scores``,
        ``finished_valid`` and, with patience, ``finished_count``.
    """
    old_scores = state["finished_scores"]  # [b, k]
    old_valid = state["finished_valid"]  # [b, k]
    old_seqs = state["finished_seqs"]  # [b, k, L]
    new_scores = ops.where(
        candidates["finishing"],
        candidates["logp"] / length_penalty(candidates["length"], spec.alpha),
        spec.neg_inf,
    )  # [b, C]
    all_scores = ops.concatenate(
        [ops.where(old_valid, old_scores, spec.neg_inf), new_scores], axis=1
    )  # [b, k + C]
    all_valid = ops.concatenate([old_valid, candidates["finishing"]], axis=1)  # [b, k + C]
    all_seqs = ops.concatenate([old_seqs, candidates["seqs"]], axis=1)  # [b, k + C, L]
    scores, idx = ops.top_k(all_scores, spec.beam_size)  # [b, k] x2 (the values: all_scores at idx)
    idx = ops.cast(idx, "int32")
    valid = spec.gather(all_valid, idx, 1)  # [b, k]
    seqs = spec.gather(all_seqs, idx, 1)  # [b, k, L]
    finished = {"finished_seqs": seqs, "finished_scores": scores, "finished_valid": valid}
    if spec.patience is not None:
        finished["finished_count"] = state["finished_count"] + ops.sum(
            ops.cast(candidates["finishing"], "int32"), axis=1)  # [b]
    if "done" in state:
        done = state["done"]  # [b]
        old = {"finished_seqs": old_seqs, "finished_scores": old_scores, "finished_valid": old_valid,
               "finished_count": state.get("finished_count")}
        finished = {name: ops.where(ops.reshape(done, (-1,) + (1,) * (len(x.shape) - 1)), old[name], x)
                    for name, x in finished.items()}
    return finished


def _update_done(state, candidates, alive, finished, spec):
    """Which sentences are done after this step (early termination).

    A sentence is done when it reached its length limit, has no alive
    hypothesis, or no alive hypothesis can beat the finished ones that the
    result needs: with ``r = spec.exact_results``, the ``r``-th best of them
    (exact for the ``r`` best hypotheses and their scores): the best one when
    one result is asked (tensor2tensor's stop), the worst of the ``k``
    finished ones for the whole n-best. Any extension of an alive
    hypothesis has log-prob <= the best alive one and a length in
    ``[length + 1, max_length]``; the length penalty is monotonic in the
    length, so the best possible score is at one of the two ends (the
    ``max_length`` end when alpha >= 0), which bounds it for any alpha.
    With `spec.patience` a sentence is also done once
    ``round(k * patience)`` hypotheses have finished (CTranslate2's rule;
    not exact).

    Args:
        state: the search state before this step (``done``, ``max_penalty``).
        candidates: the dict from `_grow_candidates`.
        alive: the dict from `_update_alive`.
        finished: the dict from `_update_finished`.
        spec: the `_SearchSpec`.

    Returns:
        bool ``[b]``.
    """
    alive_valid, alive_logp = alive["alive_valid"], alive["alive_logp"]  # [b, k] x2
    fin_valid, fin_scores = finished["finished_valid"], finished["finished_scores"]  # [b, k] x2
    any_alive = ops.any(alive_valid, axis=1)  # [b]
    best_alive = ops.max(alive_logp, axis=1)  # [b]
    bound = ops.maximum(
        best_alive / length_penalty(candidates["length"] + 1, spec.alpha),
        best_alive / state["max_penalty"],
    )  # [b]
    rank = spec.exact_results
    # Finished hypotheses are sorted best first, the used slots before the unused ones
    # (a used slot scores above NEG_INF, an unused one is NEG_INF): the r-th best is
    # slot r - 1, and with r = k it is valid only when all k are (the n-best's bound).
    if isinstance(rank, int):
        valid_at, score_at = fin_valid[:, rank - 1], fin_scores[:, rank - 1]  # [b] x2
    else:  # a tensor (`translate_options`' num_results)
        slot = ops.cast(rank, "int32") - 1
        valid_at, score_at = ops.take(fin_valid, slot, axis=1), ops.take(fin_scores, slot, axis=1)  # [b] x2
    cannot_improve = ops.logical_and(valid_at, score_at >= bound)  # [b]
    done = ops.logical_or(
        candidates["at_limit"][:, 0] if "done" not in state else ops.logical_or(
            state["done"], candidates["at_limit"][:, 0]),
        ops.logical_or(ops.logical_not(any_alive), cannot_improve),
    )  # [b]
    if spec.patience is not None:
        k = spec.beam_size if isinstance(spec.beam_size, int) else ops.cast(spec.beam_size, "float32")
        wanted = ops.cast(ops.round(k * ops.cast(spec.patience, "float32")), "int32")
        patient = ops.logical_and(wanted > 0, finished["finished_count"] >= wanted)  # [b]
        done = ops.logical_or(done, patient)
    return done


def _best_results(finished, num_results, spec):
    """The ``num_results`` best finished hypotheses; unused slots are PAD / NEG_INF.

    Returns:
        ``(sequences, scores)``: int32 ``[b, n, L]`` and float32 ``[b, n]``.
    """
    valid = finished["finished_valid"][:, :num_results]  # [b, n]
    sequences = ops.where(
        valid[:, :, None], finished["finished_seqs"][:, :num_results], PAD_ID
    )  # [b, n, L]
    scores = ops.where(
        valid, finished["finished_scores"][:, :num_results], spec.neg_inf
    )  # [b, n]
    return ops.cast(sequences, "int32"), ops.cast(scores, "float32")


def _search_step(state, logits, cache, spec):
    """One step of the search after the step function: candidates, the new
    alive and finished sets, and which sentences are done.

    Returns:
        the new state (with ``cache`` still in the previous beams' order)
        and ``source_beam`` int32 ``[b, k]`` (see `_update_alive`).
    """
    candidates = _grow_candidates(state, ops.cast(logits, "float32"), spec)
    alive = _update_alive(candidates, spec)
    source_beam = alive.pop("source_beam")
    finished = _update_finished(state, candidates, spec)
    done = _update_done(state, candidates, alive, finished, spec)
    new_state = {**state, **alive, **finished, "done": done, "cache": cache, "step": state["step"] + 1}
    return new_state, source_beam


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
    exact_results=None,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    static_cache=None,
    patience=None,
    drop_finished=False,
    while_loop=None,
    cache_stages=None,
    resize_cache=None,
    min_decode_length=0,
    batch_halvings=0,
    gather=None,
    max_beam_size=None,
    normalize_after_top_k=False,
    trace_once=None,
    nonzero=None,
):
    """Batched beam search with GNMT length penalty and early termination.

    Args:
        step_fn: ``step_fn(ids, cache, step) -> (logits, cache)``, see the
            module docstring (``step_fn(ids, cache, step, static_cache)``
            when `static_cache` is given). ``ids`` int32 ``[batch * beam, 1]``
            is the token at position ``step`` (BOS at step 0), ``logits``
            ``[batch * beam, vocab]`` (vocab >= 2) are for position
            ``step + 1``; the returned cache must keep the structure and
            dtypes of its input, and its shapes unless `drop_finished`.
        initial_cache: nested structure of tensors with leading dimension
            ``batch``; tiled here to ``batch * beam`` (row ``b * beam + k``)
            and reordered along beams after every step. May be ``{}``/``()``.
        batch_size: python int (or int32 scalar tensor on the TensorFlow
            backend for a dynamic batch): the number of sentences.
        max_lengths: int ``[batch]``: the maximum number of generated tokens
            (EOS included) per sentence, e.g. ``source_length + 50``.  A
            hypothesis reaching its limit without EOS is finished as it is.
            Values are clipped to ``[1, max_decode_length]``.
        beam_size: python int >= 1 (it fixes tensor shapes), or, in a
            TensorFlow graph without XLA (not with `batch_halvings`), an int32
            scalar tensor in ``[1, max_beam_size]`` given at run time: one
            graph then searches with any beam size (the SavedModel's
            ``translate_options``), with the same results as the python int.
            With 1 the search is exactly greedy decoding (argmax until EOS).
        alpha: length-penalty exponent, python float or float scalar tensor
            (may be a SavedModel signature input). 0 = plain log-prob. The
            early-termination bound is valid for any alpha (negative too).
        max_decode_length: the size of the sequence buffers and the hard
            bound on the number of loop iterations: a python int (static
            shapes: XLA, LiteRT, JAX), or, on the TensorFlow backend without
            XLA, an int32 scalar tensor, so that a graph sizes its buffers to
            each request (``max(max_lengths)``) instead of the largest one.
            If None it is ``max(max_lengths)``, which requires
            ``max_lengths`` to be concrete (eager / numpy); inside a graph
            pass it explicitly (e.g. ``max_source_length + 50``).
        num_results: python int in ``[1, beam_size]`` (with a tensor
            `beam_size`, a python int or an int32 scalar tensor in that
            range, e.g. `beam_size` itself): how many
            hypotheses to return per sentence. With 1 a sentence stops as
            soon as no alive hypothesis can beat its best finished one
            (exact for the best translation and its score); with ``n``, as
            soon as none can beat the ``n``-th best of its finished ones
            (exact for the whole n-best; with ``n = beam_size``, the worst
            of its ``beam_size`` finished ones).
        exact_results: None (``num_results``), or a python int or int32
            scalar tensor in ``[1, num_results]``: the stop is exact for this
            many of the best results (the bound above with this ``n``); the
            result slots after it may then hold other hypotheses than the
            exhaustive n-best's. A tensor lets one graph return
            ``num_results`` slots and stop by a count given at run time
            (the SavedModel's ``translate_options``).
        bos_id: the id fed at step 0.
        eos_id: the id that ends a hypothesis.
        static_cache: None, or a nested structure of tensors with leading
            dimension ``batch`` that the step function reads and never
            changes (e.g. cross-attention keys/values, one row per sentence
            shared by its beams): it is neither tiled nor reordered; with
            `drop_finished` it keeps the rows of the sentences searched.
        patience: None (off), or a float (python or scalar tensor): a
            sentence also stops once ``round(beam_size * patience)``
            hypotheses have finished (CTranslate2's rule: faster, not exact;
            a value <= 0 turns it off).
        drop_finished: remove finished sentences from the loop (their
            results are written to the outputs when they finish), so the
            step function runs on the sentences still searched only. The
            loop variables then change their leading dimension, so this is
            for eager TensorFlow, or a TensorFlow graph with a `while_loop`
            that relaxes the loop's shape invariants, which LiteRT's WHILE
            runs too once converted (with `nonzero`); not XLA or JAX, which
            need static shapes. Same results.
        while_loop: None (``keras.ops.while_loop``) or a function with its
            signature ``(cond, body, loop_vars, maximum_iterations)``.
        cache_stages: None, or increasing python ints: the loop runs in
            stages, the first until step ``cache_stages[0]``, the next until
            ``cache_stages[1]``, ..., the last until `max_decode_length`, and
            before each stage the cache is resized by
            ``resize_cache(cache, stage_end)`` (from the `initial_cache` as
            given: e.g. self-attention buffers of 0 positions, padded to the
            stage's end). With static shapes (XLA) a step then reads and
            reorders a buffer of its stage's size instead of the largest
            one. Same results.
        resize_cache: ``(cache, length) -> cache``, with `cache_stages`.
        min_decode_length: python int, with `cache_stages` and a tensor
            `max_decode_length`: a bound it never goes below (the XLA search's
            shortest buffer). A stage may be empty (the buffer ends before its
            given start) only after a given end ``>= min_decode_length``; only
            such stages are traced inside the `cond` that leaves an empty stage
            out of the compiled program (a `cond` around a stage cost ~1.5 s of
            tracing). 0: every stage after the first. Same results with any
            bound: an empty stage outside the `cond` runs no step.
        batch_halvings: python int >= 0, for static shapes (XLA) where
            `drop_finished` cannot shrink the loop's tensors: the loop keeps
            the sentences not done first (a permutation of every per-sentence
            row on every step, folded into the caches' beam reorder, which is
            done at the start of the next step), and a step
            runs on the first ``ceil(batch / 2**h)`` sentences for the
            largest ``h <= batch_halvings`` that still holds all those not
            done (one branch per size, a ``switch``; the others keep their
            rows). 0: every step runs on the whole batch. With
            `cache_stages` the first stage runs on the whole batch. Same results;
            needs ``slice_update`` (on TensorFlow an XLA op: for
            ``jit_compile`` functions only).
        gather: None (`keras_gather`) or a function with its meaning, for
            the loop's gathers (beam reorders, the candidates' top-k, the
            dropped sentences): ``tf.gather`` in a TensorFlow graph, one
            node per gather instead of ~6-18. Same results.
        max_beam_size: with a tensor `beam_size`, the largest it may be
            (python int): the candidates' top-k sizes its blocks for it.
        normalize_after_top_k: False: a step's logits become log-probabilities
            (``log_softmax`` over ``[rows, V]``), then each beam's best tokens
            are taken; True: the best tokens are taken from the logits and only
            those are normalized (minus the row's ``logsumexp``). The same
            tokens (``log_softmax`` subtracts one value from a row; only a tie
            that its rounding makes can break otherwise) and scores equal to
            float32 rounding. Under XLA it saves writing and reading the
            ``[rows, V]`` log-probabilities (the whole search 0.94-0.96x the
            time, docs/lab-notebook serving speed part 29); in a TensorFlow graph
            ``logsumexp``'s nodes cost more than they save (1.01-1.07x), so
            only the XLA search sets it.
        trace_once: None, or a function that wraps the loop's body (a step and
            the search's bookkeeping for it) so that it is traced once for every
            copy of it in the graph (each cache stage, each batch halving), e.g.
            ``tf.function(body, autograph=False, reduce_retracing=True)`` when
            the search itself is traced with unknown sizes. Same results. Not
            with `drop_finished`, whose loop has a body of its own.
        nonzero: None, or with `drop_finished` a function ``mask -> indices``: the
            positions of the True entries of a bool ``[b]`` as int32 ``[m]``,
            ascending (``keras.ops.nonzero(mask)[0]``, the default): on
            TensorFlow one ``tf.where``, which LiteRT converts, where
            ``keras.ops.nonzero`` unstacks int64 indices, which LiteRT's
            builtins cannot. Same results.

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
    if isinstance(beam_size, (int, np.integer)):
        if beam_size < 1:
            raise ValueError(f"beam_size must be a python int >= 1, got {beam_size!r}")
        if not isinstance(num_results, (int, np.integer)) or not 1 <= num_results <= beam_size:
            raise ValueError(
                f"num_results must be a python int in [1, beam_size={beam_size}], "
                f"got {num_results!r}"
            )
        beam_size = int(beam_size)
        num_results = int(num_results)
        max_beam_size = None
    else:  # a run-time beam size: in [1, max_beam_size], which the caller ensures
        if not isinstance(max_beam_size, (int, np.integer)) or max_beam_size < 1:
            raise ValueError("a tensor beam_size needs max_beam_size, a python int >= 1 (the largest "
                             f"beam size it may hold), got {max_beam_size!r}")
        if batch_halvings:
            raise ValueError("batch_halvings needs a python int beam_size (static shapes)")
        if isinstance(num_results, (int, np.integer)):
            if not 1 <= num_results <= max_beam_size:
                raise ValueError(f"num_results must be in [1, max_beam_size={max_beam_size}], got {num_results!r}")
            num_results = int(num_results)
        beam_size = ops.cast(beam_size, "int32")
        max_beam_size = int(max_beam_size)
    if isinstance(exact_results, (int, np.integer)):
        name, limit = ("num_results", num_results) if isinstance(num_results, int) else (
            "max_beam_size", max_beam_size)
        if not 1 <= exact_results <= limit:
            raise ValueError(f"exact_results must be in [1, {name}={limit}], got {exact_results!r}")
        exact_results = int(exact_results)
    if max_decode_length is None:
        max_decode_length = _infer_max_decode_length(max_lengths)
    if isinstance(max_decode_length, (int, np.integer)):
        max_decode_length = int(max_decode_length)
        if max_decode_length < 1:
            raise ValueError(f"max_decode_length must be >= 1, got {max_decode_length}")
    else:  # a tensor: buffers sized per call (TensorFlow graphs without XLA)
        max_decode_length = ops.maximum(ops.cast(max_decode_length, "int32"), 1)
    while_loop = while_loop or ops.while_loop

    spec = _make_spec(beam_size, num_results, alpha, patience, max_decode_length, eos_id,
                      gather or keras_gather, exact_results, max_beam_size, normalize_after_top_k)
    state = _initial_state(initial_cache, batch_size, max_lengths, max_decode_length, bos_id, spec)

    def call_step(state, static):
        ids = ops.reshape(state["alive_last"], (-1, 1))  # [b * k, 1]
        if static_cache is None:
            return step_fn(ids, state["cache"], state["step"])
        return step_fn(ids, state["cache"], state["step"], static)

    if not drop_finished:
        def cond(state):
            return ops.logical_and(
                state["step"] < max_decode_length, ops.any(ops.logical_not(state["done"]))
            )

        def search_body(state, static, not_done_first=False):
            # (batch_halvings) The beam reorder of the step before is done here, where
            # XLA fuses it with the step's write of its keys and values: two passes over
            # each cache leaf a step instead of three (write, reorder, and the copy of the
            # reordered buffer into the loop's; docs/lab-notebook, serving speed part 15).
            deferred = "cache_rows" in state
            if deferred:  # the cache's rows in the order of the state's hypotheses
                state = {**state, "cache": keras.tree.map_structure(
                    lambda x: spec.gather(x, state["cache_rows"], 0), state["cache"])}
            logits, cache = call_step(state, static)
            state, source_beam = _search_step(state, logits, cache, spec)
            order = None
            if not_done_first:  # (batch_halvings) the sentences not done move first
                order = ops.argsort(ops.cast(state["done"], "int32"))  # [b]
                source_beam = spec.gather(source_beam, order, 0)
                state = {name: x if name in ("step", "cache", "cache_rows") else spec.gather(x, order, 0)
                         for name, x in state.items()}
            # One gather per cache leaf: the beam reorder (and the sentences' move), or
            # with `deferred` the rows it will gather at the start of the next step.
            rows = _beam_rows(source_beam, beam_size, order)  # [b * k]
            if deferred:
                state["cache_rows"] = rows
            else:
                state["cache"] = keras.tree.map_structure(lambda x: spec.gather(x, rows, 0), cache)
            return state

        if trace_once is not None:
            search_body = trace_once(search_body)

        first_stage_body = None
        if batch_halvings:
            state["sentence"] = ops.arange(batch_size, dtype="int32")  # [batch]: each row's sentence
            # [batch * k]: the cache's row of each hypothesis (its beam reorder waits for the next step)
            state["cache_rows"] = ops.arange(batch_size * beam_size, dtype="int32")
            body = _halving_body(search_body, batch_size, beam_size, int(batch_halvings), static_cache,
                                 spec.gather)
            # The first cache stage runs on the whole batch: few sentences of a batch end
            # in its steps, and each halving is one more compiled copy of the step in each
            # stage (a batch-32 program traced in 11.9 instead of 13.7 s and compiled in
            # 13.1 instead of 16.8, same run time and results; docs/lab-notebook, serving
            # speed part 16).
            first_stage_body = _halving_body(search_body, batch_size, beam_size, 0, static_cache, spec.gather)
        else:
            def body(state):
                return search_body(state, static_cache)

        if cache_stages is None:
            state = while_loop(cond, body, state, maximum_iterations=max_decode_length)
        else:
            previous_end = 0
            for index, stage_end in enumerate(_stage_ends(cache_stages, max_decode_length)):
                state["cache"] = resize_cache(state["cache"], stage_end)

                def stage_cond(state, stage_end=stage_end):
                    return ops.logical_and(cond(state), state["step"] < stage_end)

                stage_body = first_stage_body if index == 0 and first_stage_body is not None else body

                def run_stage(state):
                    return while_loop(stage_cond, stage_body, state, maximum_iterations=stage_end)

                # (a stage after a given end below min_decode_length is not empty; with python
                # ints, _stage_ends leaves the empty ones out)
                if index == 0 or isinstance(stage_end, int) or cache_stages[index - 1] < min_decode_length:
                    state = run_stage(state)
                else:
                    # A stage that ends where the one before did (a buffer shorter than the given
                    # end before it) runs no step. Under XLA the shapes make this condition a
                    # constant, and the optimized program keeps no loop for the stage (one more
                    # copy of the step per batch halving; docs/lab-notebook, serving speed part 31).
                    # (`cond` traces both branches at once: no late binding of `state`.)
                    state = ops.cond(stage_end > previous_end, lambda: run_stage(state), lambda: state)
                previous_end = stage_end
        seqs, scores = _best_results(state, num_results, spec)
        if batch_halvings:  # rows back in the sentences' order
            order = ops.argsort(state["sentence"])  # [batch]
            seqs, scores = ops.take(seqs, order, axis=0), ops.take(scores, order, axis=0)
        return seqs, scores

    nonzero = nonzero or (lambda mask: ops.nonzero(mask)[0])
    # drop_finished: the loop carries only the sentences not done (their
    # original row in `sentence`), and each writes its results when done.
    # No sentence in the loop is done (each leaves when it is): no `done` to carry.
    state["sentence"] = ops.arange(ops.shape(state.pop("done"))[0], dtype="int32")  # [b]
    state["static"] = static_cache if static_cache is not None else {}
    state["out_seqs"] = ops.full((batch_size, num_results, max_decode_length), PAD_ID,
                                 dtype="int32")  # [batch, n, L]
    state["out_scores"] = ops.full((batch_size, num_results), NEG_INF, dtype="float32")  # [batch, n]

    def cond(state):
        return ops.logical_and(state["step"] < max_decode_length, ops.shape(state["sentence"])[0] > 0)

    def body(state):
        logits, cache = call_step(state, state["static"])
        state, source_beam = _search_step(state, logits, cache, spec)
        done = state.pop("done")  # [b]
        # Every step writes the results of the sentences that ended (on most steps
        # none: an empty scatter) and keeps the others, with no `cond` over the
        # state: such a cond cost more per step (a Switch, a Merge and two
        # function-boundary copies per tensor of the state, and the branch not
        # taken) than these small gathers, and a `while_loop` pays for every node
        # of its body on every step.
        kept_state = dict(state)
        seqs, scores = _best_results(state, num_results, spec)  # [b, n, L], [b, n]
        ended = nonzero(done)  # [e]
        written = ops.expand_dims(spec.gather(state["sentence"], ended, 0), 1)  # [e, 1]
        kept_state["out_seqs"] = ops.scatter_update(state["out_seqs"], written, spec.gather(seqs, ended, 0))
        kept_state["out_scores"] = ops.scatter_update(state["out_scores"], written, spec.gather(scores, ended, 0))
        kept = nonzero(ops.logical_not(done))  # [b']
        # One gather per cache leaf: beam reorder and dropped sentences together.
        rows = _beam_rows(spec.gather(source_beam, kept, 0), beam_size, kept)  # [b' * k]
        kept_state["cache"] = keras.tree.map_structure(lambda x: spec.gather(x, rows, 0), cache)
        for name in _PER_SENTENCE:
            if name in state:  # finished_count only with patience
                kept_state[name] = spec.gather(state[name], kept, 0)
        # The encoder's keys and values, the largest per-sentence tensors, are
        # copied only on a step where a sentence ended.
        if state["static"]:  # ({} without a static cache)
            kept_state["static"] = ops.cond(
                ops.any(done), lambda: keras.tree.map_structure(lambda x: spec.gather(x, kept, 0), state["static"]),
                lambda: state["static"])
        return kept_state

    # `cond` bounds the steps: no iteration counter (a loop variable more).
    state = while_loop(cond, body, state, maximum_iterations=None)
    return state["out_seqs"], state["out_scores"]


def halving_sizes(batch_size, halvings):
    """The batch sizes a `beam_search(batch_halvings=halvings)` step may run on:
    ``batch, ceil(batch / 2), ..., ceil(batch / 2**halvings)`` (python ints
    without repeats, or scalar tensors). A step runs on the smallest that holds
    the sentences not yet done."""
    sizes = [batch_size]
    for h in range(1, halvings + 1):
        size = (batch_size + 2 ** h - 1) // 2 ** h  # ceil(batch / 2**h)
        if isinstance(size, int) and size == sizes[-1]:
            break
        sizes.append(size)
    return sizes


def _halving_body(search_body, batch_size, beam_size, halvings, static_cache, gather):
    """The loop body of `beam_search(batch_halvings=...)`: `search_body` on the
    smallest prefix of sentences that holds every one not done, which also moves
    the sentences not done first (`search_body(..., not_done_first=True)`: the
    permutation folded into the cache's beam reorder, on every step).

    The state carries ``sentence`` (each row's sentence) and ``cache_rows`` (the
    cache's row of each hypothesis: `search_body` reorders the cache at the start
    of the next step, so a step gathers its prefix's rows from the whole cache,
    where the step before may have left them beyond the prefix; part 15). The
    static cache stays out of the state, in the sentences' order: each step
    gathers the rows of its prefix. (It was a loop variable permuted with the
    rows, and XLA copied it, and every cache, out of the branches of the
    `switch` and of a `cond` that moved the sentences only on the steps where
    one ended: 17% of a batch-32 step; without them the step took 7.5 ms
    instead of 11.3, docs/lab-notebook serving speed part 14. The prefix branches
    still copy the state they `slice_update`; one loop per size, with no
    `switch`, copied less but was no faster and compiled slower, part 14.)
    With a python `batch_size` the sizes are python ints; with a scalar tensor
    (TensorFlow) XLA still sees each as a constant, since it compiles one program
    per batch size. `gather`: the search's (`keras_gather` or one with its meaning).
    """
    sizes = halving_sizes(batch_size, halvings)
    static_cache = static_cache if static_cache is not None else {}

    def on_prefix(state, size):
        whole = size is batch_size  # the whole batch: no slicing
        head = {}
        for name, x in state.items():
            if whole or name in ("step", "cache"):  # (the cache: `search_body` gathers its rows)
                head[name] = x
            elif name == "cache_rows":
                head[name] = x[: size * beam_size]
            else:  # the per-sentence entries
                head[name] = keras.tree.map_structure(lambda leaf: leaf[:size], x)
        static = keras.tree.map_structure(lambda x: gather(x, head["sentence"], 0), static_cache)
        head = search_body(head, static, not_done_first=True)
        if whole:
            return head
        return {name: x if name == "step" else keras.tree.map_structure(
                    lambda full, part: ops.slice_update(full, [0] * len(full.shape), part), state[name], x)
                for name, x in head.items()}

    def body(state):
        alive = ops.sum(ops.cast(ops.logical_not(state["done"]), "int32"))
        # the smallest size that holds them (a size equal to the batch, as every size of a batch of
        # one is, takes the whole-batch branch, which slices nothing)
        index = sum(ops.cast(ops.logical_and(alive <= size, size < batch_size), "int32") for size in sizes[1:])
        return ops.switch(index, [lambda s, size=size: on_prefix(s, size) for size in sizes], state)

    return body


def _stage_ends(cache_stages, max_decode_length):
    """The steps at which the stages of `beam_search(cache_stages=...)` end: the given
    ones below `max_decode_length` (all of them, capped, when it is a tensor), then it."""
    if isinstance(max_decode_length, int):
        return [end for end in cache_stages if end < max_decode_length] + [max_decode_length]
    return [ops.minimum(end, max_decode_length) for end in cache_stages] + [max_decode_length]


# The state's per-sentence entries (leading dimension b), which `drop_finished` gathers.
_PER_SENTENCE = ("alive_seqs", "alive_last", "alive_logp", "alive_valid", "finished_seqs",
                 "finished_scores", "finished_valid", "finished_count", "max_lengths",
                 "max_penalty", "sentence")


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
