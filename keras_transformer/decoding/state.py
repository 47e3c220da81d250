"""The search's fixed settings (`_SearchSpec`, with its logits processors and sampler) and
the state its while loop carries (`_initial_state`)."""

import typing

import keras
import numpy as np
from keras import ops

from keras_transformer.constants import NEG_INF, PAD_ID
from keras_transformer.decoding.processors import make_logits_processors
from keras_transformer.decoding.samplers import make_sampler
from keras_transformer.decoding.settings import DropFinished
from keras_transformer.decoding.tensors import length_penalty, tile_beams


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
    batch_size: object  # python int, or an int32 scalar tensor (TensorFlow)
    max_decode_length: object  # L: python int, or an int32 scalar tensor (TensorFlow without XLA)
    positions: object  # int32 [L], arange(L): where to write the token of `step`
    neg_inf: object  # NEG_INF as a NumPy float32 scalar
    gather: object  # `keras_gather`, or a function with its meaning (tf.gather)
    normalize_after_top_k: bool  # each beam's top tokens by their logits, then only those normalized
    keeps_done: bool  # the state holds the sentences that are done (all but `DropFinished`'s loop)
    # The logits processors of the options that are on (`make_logits_processors`), applied in
    # order before the step's log-softmax; () adds no op.
    processors: tuple = ()
    # the state holds each sentence's target prefix (`beam_search(target_prefix=...)`)
    has_prefix: bool = False
    # how each beam's candidates are drawn from its logits (`make_sampler`): `BestSampler()`
    # (the best tokens) or a `RandomSampler` (one token drawn, one beam)
    sampler: object = None


def _candidates(beam_size):
    """C for k beams: with one beam only the single best candidate is kept, so the
    search is exactly greedy; with k > 1 the standard 2k candidates (enough to
    refill k alive beams even if k of them end with EOS). A python int, or for a
    tensor k a tensor."""
    if isinstance(beam_size, int):
        return 2 * beam_size if beam_size > 1 else 1
    return ops.where(beam_size > 1, 2 * beam_size, 1)


def _make_spec(options, loop, batch_size, max_decode_length, eos_id, has_prefix=False):
    """Builds the `_SearchSpec` of a search (before the loop) from its (checked)
    `SearchOptions` and `SearchLoop`; the rest as in `beam_search`."""
    beam_size = options.beam_size if isinstance(options.beam_size, int) else ops.cast(options.beam_size, "int32")
    return _SearchSpec(
        beam_size=beam_size,
        num_candidates=_candidates(beam_size),
        max_candidates=_candidates(beam_size if options.max_beam_size is None else options.max_beam_size),
        num_results=options.num_results,
        exact_results=options.num_results if options.exact_results is None else options.exact_results,
        eos_id=eos_id,
        alpha=options.alpha,
        patience=options.patience,
        batch_size=batch_size,
        max_decode_length=max_decode_length,
        positions=ops.arange(0, max_decode_length, dtype="int32"),  # [L]
        # A constant wherever it is used: a tensor made before the loop would be
        # one more variable of a TensorFlow while_loop (~4 nodes every step).
        neg_inf=np.float32(NEG_INF),
        gather=loop.ops.gather,
        normalize_after_top_k=loop.ops.normalize_after_top_k,
        keeps_done=not isinstance(loop.finished, DropFinished),
        processors=make_logits_processors(options, eos_id, has_prefix),
        has_prefix=has_prefix,
        sampler=make_sampler(options, loop.ops),
    )


def _initial_state(initial_cache, max_lengths, bos_id, spec, target_prefix=None):
    """The search state before step 0 (the ``while_loop`` variables).

    The state is a dict (a structure that ``keras.ops.while_loop`` and
    ``keras.tree`` carry as it is on every backend); ``b`` is the number of
    sentences still searched (the batch, or fewer with `DropFinished`)::

        step             int32 scalar, the position fed to the step function
        cache            step-function cache, leaves [b * k, ...]
        sentences        the per-sentence entries, leading dimension b (what
                         `DropFinished` drops, `Halvings` slices and reorders:
                         one ``map_structure`` each, `gather_rows`):
          alive_seqs       int32 [b, k, L]  tokens generated so far, PAD after
          alive_last       int32 [b, k]     token at position `step` (BOS at 0)
          alive_logp       float32 [b, k]   sum of token log-probs (NEG_INF if invalid)
          alive_valid      bool [b, k]      whether the alive slot holds a hypothesis
          finished_seqs    int32 [b, k, L]  best finished hypotheses, best first
          finished_scores  float32 [b, k]   their length-penalised scores
          finished_valid   bool [b, k]      whether the finished slot is used
          finished_count   int32 [b]        hypotheses finished so far (only with patience)
          done             bool [b]         sentence finished: state frozen (`spec.keeps_done`)
          max_lengths      int32 [b]        length limit, clipped to [1, L]
          max_penalty      float32 [b]      length_penalty(max_lengths, alpha)
          prefix_ids       int32 [b, P]     the target prefix (`spec.has_prefix`), PAD after
          prefix_lengths   int32 [b]        its tokens

    The loops add their own entries: ``sentence`` int32 [b] (each row's
    sentence; `DropFinished`, `Halvings`), ``cache_rows`` int32 [b * k]
    (`Halvings`), ``static``, ``out_seqs`` and ``out_scores`` (`DropFinished`).

    Only beam 0 of every sentence is alive at the start (the other ``k - 1``
    would be duplicates); nothing is finished.
    """
    k, length, batch_size = spec.beam_size, spec.max_decode_length, spec.batch_size
    max_lengths = ops.cast(ops.reshape(max_lengths, (-1,)), "int32")  # [batch]
    max_lengths = ops.clip(max_lengths, 1, length)  # [batch]
    first_beam = ops.arange(k, dtype="int32") == 0  # [k]
    alive_valid = ops.logical_and(
        ops.ones((batch_size, k), dtype="bool"), first_beam[None, :]
    )  # [batch, k]
    sentences = {
        "alive_seqs": ops.full((batch_size, k, length), PAD_ID, dtype="int32"),
        "alive_last": ops.full((batch_size, k), bos_id, dtype="int32"),
        "alive_logp": ops.where(alive_valid, 0.0, spec.neg_inf),  # [batch, k]
        "alive_valid": alive_valid,
        "finished_seqs": ops.full((batch_size, k, length), PAD_ID, dtype="int32"),
        "finished_scores": ops.full((batch_size, k), NEG_INF, dtype="float32"),
        "finished_valid": ops.zeros((batch_size, k), dtype="bool"),
        "max_lengths": max_lengths,
        # Upper bound on the length penalty of any hypothesis of a sentence.
        "max_penalty": length_penalty(max_lengths, spec.alpha),  # [batch]
    }
    if spec.keeps_done:
        sentences["done"] = ops.zeros((batch_size,), dtype="bool")
    if spec.patience is not None:  # counted only for the patience stop (ops saved every step otherwise)
        sentences["finished_count"] = ops.zeros((batch_size,), dtype="int32")
    if spec.has_prefix:
        prefix_ids, prefix_lengths = target_prefix
        sentences["prefix_ids"] = ops.cast(prefix_ids, "int32")  # [batch, P]
        sentences["prefix_lengths"] = ops.cast(ops.reshape(prefix_lengths, (-1,)), "int32")  # [batch]
    return {
        "step": ops.convert_to_tensor(0, "int32"),
        "cache": keras.tree.map_structure(lambda x: tile_beams(x, k), initial_cache),
        "sentences": sentences,
    }
