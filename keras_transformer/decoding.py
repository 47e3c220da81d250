"""Batched beam search (and greedy search) behind a step function.

The search is written with ``keras.ops`` only, so the same code runs eagerly,
inside a ``tf.function`` (with or without ``jit_compile``), in a SavedModel
graph, converts to LiteRT (TFLite) builtin ops without Flex, and runs on the
JAX backend.  Every buffer is preallocated with a fixed size
(``max_decode_length``: a python int, or in a TensorFlow graph a scalar
tensor fixed for the call) and the loop is a ``keras.ops.while_loop``; new
tokens are written into the sequence buffers with a one-hot ``where`` blend
at position ``step`` (no scatter / ``slice_update``), and beams are reordered
with ``take`` (GATHER). (`DropFinished`, for TensorFlow graphs without
XLA and their LiteRT conversion, adds ``nonzero`` and ``scatter_update`` and
changes shapes in the loop; `Halvings`, for XLA, adds a ``switch`` and
``slice_update``.)

The model is hidden behind a *step function*::

    step_fn(ids, cache, step) -> (logits, cache)

* ``ids``: int32 ``[batch * beam, 1]``, the token at position ``step`` of
  every hypothesis (``BOS_ID`` at step 0);
* ``cache``: a nested structure (dict / list / tuple) of tensors whose
  leaves all have leading dimension ``batch * beam`` (batch-major: row
  ``b * beam + k`` is beam ``k`` of sentence ``b``).  The returned cache
  must have the same structure and dtypes as the one passed in, and the
  same shapes unless the loop allows them to change (`DropFinished`
  with a ``while_loop`` of relaxed shape invariants: caches may then grow
  by concatenation; with static shapes, preallocate them, or grow them
  between `CacheStages`);
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
the buffer is full.

Two frozen objects set a search: `SearchOptions` says what it finds (beam
size, alpha, results, the exact stop's count, CTranslate2's patience rule),
`SearchLoop` how its loop runs, with the same results: its `LoopOps` (the
ops it is written with: `KERAS_OPS`, or a TensorFlow graph's and XLA's in
`keras_transformer.searcher`), what happens to finished sentences
(`KeepAll`, `DropFinished`, `Halvings`) and `CacheStages`. `beam_search`
checks them, then runs the fixed-shape loop (`_fixed_shape_loop`, in
stages or not) or the shrinking one (`_shrinking_loop`).

One loop step (each a small helper below): the step function scores the
next token of every alive beam; the logits processors of the options that
are on (`make_logits_processors`: `MinLength`, `NoRepeatNgram`,
`DisallowUnk`, `TargetPrefix`; none, and no op, when all are off) disallow
tokens; the sampler (`make_sampler`: `BestSampler`, or `RandomSampler` when
sampling) draws each beam's candidates; `_grow_candidates` keeps the best
``2 * beam_size`` (beam, token) extensions; `_update_alive` keeps the best
``beam_size`` that continue (and reorders the cache); `_update_finished`
merges the ones that end into the finished set; `_update_done` applies the
early-termination bound (`_cannot_improve`, exact) and the patience rule
(`_patient`).  The loop state is a dict (`_initial_state`) whose
per-sentence entries are one sub-dict, ``sentences``: dropping, slicing or
moving sentences is one `gather_rows` (or ``map_structure``) of it.

Numerics: no ``-inf`` is ever used; impossible entries carry ``NEG_INF``
(finite) *and* an explicit validity flag, so no NaN can appear.  A token
whose log-probability is below ``NEG_INF / 2`` (e.g. its logit was masked
with ``NEG_INF``) is treated as impossible.
"""

import dataclasses
import typing
import warnings

import keras
import numpy as np
from keras import ops

from keras_transformer.constants import BOS_ID, EOS_ID, MAX_NO_REPEAT_NGRAM_SIZE, NEG_INF, PAD_ID, UNK_ID
from keras_transformer.decoding_options import BY_NAME as DECODING_OPTIONS

__all__ = [
    "KERAS_OPS",
    "BestSampler",
    "CacheStages",
    "DisallowUnk",
    "DropFinished",
    "Halvings",
    "KeepAll",
    "LoopOps",
    "MinLength",
    "NoRepeatNgram",
    "RandomSampler",
    "SearchLoop",
    "SearchOptions",
    "TargetPrefix",
    "beam_search",
    "expand_to_beams",
    "flatten_beams",
    "gather_beams",
    "gather_rows",
    "greedy_search",
    "halving_sizes",
    "keras_gather",
    "keras_nonzero",
    "length_penalty",
    "make_logits_processors",
    "make_sampler",
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


def _buffer_length(max_decode_length, max_lengths):
    """`beam_search`'s ``max_decode_length``, checked: a python int >= 1 (inferred from
    concrete `max_lengths` when None), or an int32 scalar tensor at least 1."""
    if max_decode_length is None:
        max_decode_length = _infer_max_decode_length(max_lengths)
    if _is_int(max_decode_length):
        if max_decode_length < 1:
            raise ValueError(f"max_decode_length must be >= 1, got {max_decode_length}")
        return int(max_decode_length)
    # a tensor: buffers sized per call (TensorFlow graphs without XLA)
    return ops.maximum(ops.cast(max_decode_length, "int32"), 1)


def _is_int(value):
    """Whether `value` is a python (or NumPy) integer, not a tensor."""
    return isinstance(value, (int, np.integer))


def _is_python(value):
    """Whether `value` is a python (or NumPy) value, not a tensor (a run-time option)."""
    return not ops.is_tensor(value)


# `SearchOptions`' fields whose own values the options table checks (`decoding_options`); beam
# size, results and their relations are checked together by `_checked_options`.
_TABLE_CHECKED = ("alpha", "patience", "extra_length", "min_length", "no_repeat_ngram_size", "disallow_unk",
                  "sampling_topk", "sampling_topp", "sampling_temperature", "seed")
# (alpha, patience and extra_length are stored as given: a python float or int, or a tensor)
_STORED_AS_GIVEN = ("alpha", "patience", "extra_length")
_AS_KIND = {"int": int, "float": float, "bool": bool}


# --------------------------------------------------------------------------
# Settings: what the search finds (SearchOptions) and how its loop runs (SearchLoop)
# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class SearchOptions:
    """What a beam search finds. The loop's settings (`SearchLoop`) never change it.

    Args:
        beam_size: python int >= 1 (it fixes tensor shapes), or, in a
            TensorFlow graph without XLA (not with `Halvings`), an int32
            scalar tensor in ``[1, max_beam_size]`` given at run time: one
            graph then searches with any beam size (the SavedModel's
            ``translate_options``), with the same results as the python int.
            With 1 the search is exactly greedy decoding (argmax until EOS).
        alpha: length-penalty exponent, python float or float scalar tensor
            (may be a SavedModel signature input). 0 = plain log-prob. The
            early-termination bound is valid for any alpha (negative too).
        num_results: python int in ``[1, beam_size]`` (with a tensor
            `beam_size`, a python int or an int32 scalar tensor in that
            range, e.g. `beam_size` itself): how many hypotheses to return
            per sentence. With 1 a sentence stops as soon as no alive
            hypothesis can beat its best finished one (exact for the best
            translation and its score); with ``n``, as soon as none can beat
            the ``n``-th best of its finished ones (exact for the whole
            n-best; with ``n = beam_size``, the worst of its ``beam_size``
            finished ones).
        exact_results: None (``num_results``), or a python int or int32
            scalar tensor in ``[1, num_results]``: the stop is exact for this
            many of the best results (the bound above with this ``n``); the
            result slots after it may then hold other hypotheses than the
            exhaustive n-best's. A tensor lets one graph return
            ``num_results`` slots and stop by a count given at run time
            (the SavedModel's ``translate_options``).
        patience: None (off), or a float (python or scalar tensor): a
            sentence also stops once ``round(beam_size * patience)``
            hypotheses have finished (CTranslate2's rule: faster, not exact;
            a value <= 0 turns it off).
        max_beam_size: with a tensor `beam_size`, the largest it may be
            (python int): the candidates' top-k sizes its blocks for it.
            Ignored (None) with a python int `beam_size`.
        extra_length: for `keras_transformer.searcher.Searcher` (which makes
            ``max_lengths = source_lengths + extra_length``, clipped to the
            buffers' ``decode_extra_length``): None (the config's), a python
            int or an int32 scalar tensor. `beam_search` takes `max_lengths`
            and does not read it.
        min_length: the fewest tokens a hypothesis holds before its EOS
            (CTranslate2's ``min_decoding_length``): EOS is disallowed at the
            steps before; a python int >= 0 (0: off) or an int32 scalar tensor.
            A sentence whose length limit comes first ends there without EOS.
        no_repeat_ngram_size: python int >= 0 (0: off): a token that would
            repeat an n-gram of this size already in the hypothesis is
            disallowed (CTranslate2's ``no_repeat_ngram_size``; 1: no token
            twice); or an int32 scalar tensor in ``[0, MAX_NO_REPEAT_NGRAM_SIZE]``.
        disallow_unk: python bool, or a bool scalar tensor: the unknown token
            (``UNK_ID``) is never generated (CTranslate2's ``disable_unk``).
        sampling_topk: 1 (the default: the best token, no sampling), or with
            ``beam_size`` 1 the number of best tokens each step samples among
            (0: the whole vocabulary): random sampling, e.g. for
            back-translation (CTranslate2's ``sampling_topk``). An int32
            scalar tensor (>= 0) always runs the sampling search, in which 1
            draws the best token: greedy decoding.
        sampling_topp: with sampling, the smallest set of best tokens whose
            probabilities (after the temperature) sum to at least this is
            sampled among (1.0: all of them; CTranslate2's ``sampling_topp``).
        sampling_temperature: with sampling, the log-probabilities are divided
            by it before sampling (CTranslate2's ``sampling_temperature``); the
            scores stay those of the model's own distribution.
        seed: with sampling, a python int: the same seed and inputs give the
            same samples (`LoopOps.uniform` draws the noise).

    The run-time forms (tensors: the SavedModel's ``translate_advanced``) are the
    caller's to keep in range, as a tensor ``beam_size`` is; the python forms are
    checked here.

    A disallowed token's logit is set to ``NEG_INF`` before the step's
    log-softmax (as CTranslate2 does), so the other tokens' log-probabilities
    are those of the distribution without it.

    Checked when made: a `ValueError` names the value received and the range
    expected. Python integers are stored as ``int``.

    Example:
        >>> options = SearchOptions(beam_size=4, alpha=0.6, num_results=2)
        >>> ids, scores = beam_search(step_fn, cache, batch, max_lengths, options)
    """

    beam_size: typing.Any = 4
    alpha: typing.Any = 0.6
    num_results: typing.Any = 1
    exact_results: typing.Any = None
    patience: typing.Any = None
    max_beam_size: typing.Optional[int] = None
    extra_length: typing.Any = None
    min_length: typing.Any = 0
    no_repeat_ngram_size: int = 0
    disallow_unk: bool = False
    sampling_topk: int = 1
    sampling_topp: float = 1.0
    sampling_temperature: float = 1.0
    seed: int = 0

    @property
    def samples(self) -> bool:
        """Whether the search samples its tokens (``sampling_topk`` other than 1, or a tensor)."""
        return not (_is_int(self.sampling_topk) and self.sampling_topk == 1)

    def __post_init__(self):
        for name, value in _checked_options(self).items():
            object.__setattr__(self, name, value)  # (a frozen dataclass stores its checked values so)


def _checked_options(options):
    """`SearchOptions`' beam size, result counts and largest beam size, checked and
    normalized (python ints as ``int``); `ValueError` naming a bad value."""
    beam_size, num_results, max_beam_size = options.beam_size, options.num_results, options.max_beam_size
    if _is_int(beam_size):
        if beam_size < 1:
            raise ValueError(f"beam_size must be a python int >= 1, got {beam_size!r}")
        if not _is_int(num_results) or not 1 <= num_results <= beam_size:
            raise ValueError(
                f"num_results must be a python int in [1, beam_size={beam_size}], got {num_results!r}")
        beam_size, num_results, max_beam_size = int(beam_size), int(num_results), None
    else:  # a run-time beam size: in [1, max_beam_size], which the caller ensures
        if not _is_int(max_beam_size) or max_beam_size < 1:
            raise ValueError("a tensor beam_size needs max_beam_size, a python int >= 1 (the largest "
                             f"beam size it may hold), got {max_beam_size!r}")
        max_beam_size = int(max_beam_size)
        if _is_int(num_results):
            if not 1 <= num_results <= max_beam_size:
                raise ValueError(f"num_results must be in [1, max_beam_size={max_beam_size}], got {num_results!r}")
            num_results = int(num_results)
    exact_results = options.exact_results
    if _is_int(exact_results):
        name, limit = ("num_results", num_results) if _is_int(num_results) else ("max_beam_size", max_beam_size)
        if not 1 <= exact_results <= limit:
            raise ValueError(f"exact_results must be in [1, {name}={limit}], got {exact_results!r}")
        exact_results = int(exact_results)
    checked = {}
    for name in _TABLE_CHECKED:  # each option's own values: `decoding_options.OPTIONS`' rows
        value = getattr(options, name)
        if not _is_python(value) or (value is None and name in ("patience", "extra_length")):
            checked[name] = value  # a run-time value: the caller's to keep in range
            continue
        problem = DECODING_OPTIONS[name].python_problem(value)
        if problem:
            raise ValueError(problem)
        checked[name] = _AS_KIND[DECODING_OPTIONS[name].kind](value) if name not in _STORED_AS_GIVEN else value
    topk = checked["sampling_topk"]
    samples = not (_is_int(topk) and topk == 1)
    if samples and beam_size != 1:
        raise ValueError(f"sampling (sampling_topk={topk}) draws one token a step: it needs beam_size 1 (a python "
                         f"int), got {beam_size!r}")
    return {**checked, "beam_size": beam_size, "num_results": num_results, "max_beam_size": max_beam_size,
            "exact_results": exact_results}


def keras_nonzero(mask):
    """The positions of the True entries of a bool ``[b]``, ascending (``keras.ops.nonzero``):
    `LoopOps`' default ``nonzero``."""
    return ops.nonzero(mask)[0]


def keras_uniform(shape, seed, step):
    """`LoopOps`' default noise: ``keras.random.uniform`` from the seed ``(seed, step)``
    (python ints: an eager or traced-per-step search; a loop's tensor step needs a
    backend's stateless generator, as `keras_transformer.searcher`'s presets give)."""
    if not _is_int(step):
        raise ValueError("sampling inside a compiled loop needs LoopOps.uniform of the backend's stateless "
                         "generator (keras_transformer.searcher's presets)")
    return keras.random.uniform(shape, minval=1e-7, maxval=1.0, seed=keras.random.SeedGenerator(seed * 100003 + step))


@dataclasses.dataclass(frozen=True)
class LoopOps:
    """The ops a search loop is written with. Any of them give the same results
    (`normalize_after_top_k`: up to float32 rounding); they differ in the nodes
    and kernels a step runs.

    Args:
        while_loop: ``(cond, body, loop_vars, maximum_iterations) -> loop_vars``
            (``keras.ops.while_loop``'s signature); for `DropFinished` in a
            TensorFlow graph one that relaxes the loop's shape invariants
            (`keras_transformer.searcher.relaxed_while_loop`), which LiteRT's
            WHILE runs too once converted.
        gather: `keras_gather`, or a function with its meaning, for the loop's
            gathers (beam reorders, the candidates' top-k, the dropped
            sentences): ``tf.gather`` in a TensorFlow graph, one node per
            gather instead of ~6-18.
        nonzero: with `DropFinished`, ``mask -> indices``: the positions of the
            True entries of a bool ``[b]`` as int32 ``[m]``, ascending
            (`keras_nonzero`, the default): on TensorFlow one ``tf.where``,
            which LiteRT converts, where ``keras.ops.nonzero`` unstacks int64
            indices, which LiteRT's builtins cannot.
        trace_once: None, or (not with `DropFinished`, whose loop has a body of
            its own) a function that wraps the loop's body (a step and the
            search's bookkeeping for it) so that it is traced once for every
            copy of it in the graph (each cache stage, each batch halving), e.g.
            ``tf.function(body, autograph=False, reduce_retracing=True)`` when
            the search itself is traced with unknown sizes.
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

        uniform: for sampling, ``(shape, seed, step) -> float32`` noise uniform in
            ``(0, 1)``, the same for the same arguments (`keras_uniform`, the
            default; a TensorFlow graph's: ``tf.random.stateless_uniform``).

    Presets: `KERAS_OPS` (every backend, LiteRT's builtins); the TensorFlow
    graph's and XLA's are `keras_transformer.searcher`'s.
    """

    while_loop: typing.Callable = ops.while_loop
    gather: typing.Callable = keras_gather
    nonzero: typing.Callable = keras_nonzero
    trace_once: typing.Optional[typing.Callable] = None
    normalize_after_top_k: bool = False
    uniform: typing.Callable = None

    def __post_init__(self):
        if self.uniform is None:
            object.__setattr__(self, "uniform", keras_uniform)
        for name in ("while_loop", "gather", "nonzero", "trace_once", "uniform"):
            value = getattr(self, name)
            if not callable(value) and not (name == "trace_once" and value is None):
                raise TypeError(f"LoopOps.{name} must be a function, got {value!r}")
        object.__setattr__(self, "normalize_after_top_k", bool(self.normalize_after_top_k))


# The loop written in keras.ops alone: every backend, and LiteRT's builtins once converted.
KERAS_OPS = LoopOps()


@dataclasses.dataclass(frozen=True)
class KeepAll:
    """`SearchLoop.finished`: every sentence stays in the loop, its state frozen once it
    is done, until the whole batch is done (static shapes: XLA, JAX, LiteRT's static
    buffer)."""


@dataclasses.dataclass(frozen=True)
class DropFinished:
    """`SearchLoop.finished`: finished sentences leave the loop (each writes its results
    when it finishes), so the step function runs on the sentences still searched only.

    The loop variables then change their leading dimension: for eager TensorFlow, or a
    TensorFlow graph whose `LoopOps.while_loop` relaxes the loop's shape invariants
    (LiteRT's WHILE runs it too once converted, with `LoopOps.nonzero`); not XLA or
    JAX, which need static shapes. Caches may then also grow by concatenation. Not
    with `CacheStages` or `LoopOps.trace_once` (its loop has one body, one stage).
    Same results as `KeepAll`."""


@dataclasses.dataclass(frozen=True)
class Halvings:
    """`SearchLoop.finished` for static shapes (XLA), where `DropFinished` cannot shrink
    the loop's tensors: the loop keeps the sentences not done first (a permutation of
    every per-sentence row on every step, folded into the caches' beam reorder, which
    is done at the start of the next step), and a step runs on the first
    ``ceil(batch / 2**h)`` sentences for the largest ``h <= count`` that still holds
    all those not done (one branch per size, a ``switch``; the others keep their
    rows). With `CacheStages` the first stage runs on the whole batch. Needs a python
    int beam size and ``slice_update`` (on TensorFlow an XLA op: for ``jit_compile``
    functions only). Same results as `KeepAll`.

    Args:
        count: python int >= 1, the most halvings (`halving_sizes`).
    """

    count: int

    def __post_init__(self):
        if not _is_int(self.count) or isinstance(self.count, bool) or self.count < 1:
            raise ValueError(f"Halvings.count must be a python int >= 1 (KeepAll for none), got {self.count!r}")
        object.__setattr__(self, "count", int(self.count))


@dataclasses.dataclass(frozen=True)
class CacheStages:
    """`SearchLoop.stages`: the loop runs in stages, the first until step ``ends[0]``,
    the next until ``ends[1]``, ..., the last until ``max_decode_length``, and before
    each stage the cache is resized by ``resize(cache, stage_end)`` (from the
    ``initial_cache`` as given: e.g. self-attention buffers of 0 positions, padded to
    the stage's end). With static shapes (XLA) a step then reads and reorders a buffer
    of its stage's size instead of the largest one. Same results.

    Args:
        ends: increasing python ints >= 1.
        resize: ``(cache, length) -> cache``.
        min_decode_length: python int >= 0, with a tensor ``max_decode_length``: a
            bound it never goes below (the XLA search's shortest buffer). A stage
            may be empty (the buffer ends before its given start) only after a
            given end ``>= min_decode_length``; only such stages are traced inside
            the ``cond`` that leaves an empty stage out of the compiled program (a
            ``cond`` around a stage cost ~1.5 s of tracing). 0: every stage after
            the first. Same results with any bound: an empty stage outside the
            ``cond`` runs no step.
    """

    ends: typing.Tuple[int, ...]
    resize: typing.Callable
    min_decode_length: int = 0

    def __post_init__(self):
        ends = tuple(self.ends)
        if not ends or not all(_is_int(end) and end >= 1 for end in ends) or list(ends) != sorted(set(ends)):
            raise ValueError(f"CacheStages.ends must be increasing python ints >= 1, got {self.ends!r}")
        if not callable(self.resize):
            raise TypeError(f"CacheStages.resize must be a function (cache, length) -> cache, got {self.resize!r}")
        if not _is_int(self.min_decode_length) or self.min_decode_length < 0:
            raise ValueError(f"CacheStages.min_decode_length must be a python int >= 0, got {self.min_decode_length!r}")
        object.__setattr__(self, "ends", tuple(int(end) for end in ends))
        object.__setattr__(self, "min_decode_length", int(self.min_decode_length))


@dataclasses.dataclass(frozen=True)
class SearchLoop:
    """How the search's loop runs (never what it finds: `SearchOptions`).

    Args:
        ops: `LoopOps`, the ops the loop is written with (`KERAS_OPS`).
        finished: what happens to the sentences that are done: `KeepAll()`
            (fixed shapes), `DropFinished()` (the loop shrinks) or
            `Halvings(count)` (fixed shapes, steps on a prefix of the batch).
        stages: None, or `CacheStages` (the fixed-shape loops: not with
            `DropFinished`).

    Example:
        >>> loop = SearchLoop(finished=Halvings(3), stages=CacheStages((16, 32, 64), resize))
    """

    ops: LoopOps = KERAS_OPS
    finished: typing.Union[KeepAll, DropFinished, Halvings] = KeepAll()
    stages: typing.Optional[CacheStages] = None

    def __post_init__(self):
        if not isinstance(self.ops, LoopOps):
            raise TypeError(f"SearchLoop.ops must be a LoopOps, got {self.ops!r}")
        if not isinstance(self.finished, (KeepAll, DropFinished, Halvings)):
            raise TypeError(f"SearchLoop.finished must be KeepAll(), DropFinished() or Halvings(n), "
                            f"got {self.finished!r}")
        if self.stages is not None and not isinstance(self.stages, CacheStages):
            raise TypeError(f"SearchLoop.stages must be None or a CacheStages, got {self.stages!r}")
        if isinstance(self.finished, DropFinished) and (self.stages is not None or self.ops.trace_once is not None):
            raise ValueError("DropFinished runs one loop with a body of its own: not with CacheStages "
                             f"(got {self.stages!r}) or LoopOps.trace_once (got {self.ops.trace_once!r})")


def _checked_settings(options, loop):
    """`beam_search`'s `SearchOptions` and `SearchLoop` (None: the defaults), checked:
    a `TypeError` naming what else was given, a `ValueError` for `Halvings` with a
    run-time beam size."""
    options = SearchOptions() if options is None else options
    loop = SearchLoop() if loop is None else loop
    if not isinstance(options, SearchOptions):
        raise TypeError(f"beam_search: options must be a SearchOptions, got {options!r}")
    if not isinstance(loop, SearchLoop):
        raise TypeError(f"beam_search: loop must be a SearchLoop, got {loop!r}")
    if isinstance(loop.finished, Halvings) and not isinstance(options.beam_size, int):
        raise ValueError("Halvings (batch_halvings) needs a python int beam_size (static shapes), got "
                         f"{options.beam_size!r}")
    return options, loop


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


def gather_rows(structure, rows, gather=keras_gather):
    """Rows of every leaf of a nested structure: ``out = x[rows]`` along the leading
    axis (one ``gather(x, rows, 0)`` per leaf). The search's one way to reorder a
    cache along beams, to keep some sentences of the state (``sentences``, the
    static cache), and to move them.

    Args:
        structure: nested structure of tensors, all with leading dimension ``n``
            (may be empty: ``{}``).
        rows: int32 ``[m]``, values in ``[0, n)``.
        gather: `keras_gather` or a function with its meaning (``tf.gather``).

    Returns:
        the structure with leaves ``[m, ...]``.
    """
    return keras.tree.map_structure(lambda x: gather(x, rows, 0), structure)


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


@dataclasses.dataclass(frozen=True)
class BestSampler:
    """Each alive beam's best ``P`` next tokens (``P = min(C, V)``; a beam never contributes
    more than ``C`` candidates): the beam search's own choice (CTranslate2's BestSampler)."""

    def __call__(self, logits, spec, step=None, sentence=None):
        """
        Args:
            logits: float32 ``[b * k, V]``. They become log-probabilities before
                each beam's top tokens are taken, or with
                ``spec.normalize_after_top_k`` only those tokens' are (the same
                order: ``log_softmax`` subtracts one value from a row).
            spec: the `_SearchSpec`.

        Returns:
            ``(beam_logp float32 [b, k, P], beam_tok int32 [b, k * P], P)``.
        """
        k, num_candidates = spec.beam_size, spec.num_candidates
        vocab = logits.shape[-1]
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
        return beam_logp, beam_tok, per_beam


@dataclasses.dataclass(frozen=True)
class RandomSampler:
    """One token per row drawn from the step's distribution as CTranslate2's RandomSampler
    draws it: among the ``topk`` most likely (0: all), log-probabilities divided by the
    temperature, then the smallest set whose probabilities reach ``topp``; sampled with the
    Gumbel-max trick from `LoopOps.uniform` noise. The noise is drawn for the whole batch
    and each row takes its sentence's, so a sentence gets the same samples in every loop
    (one that drops finished sentences, or halves the batch, or keeps it whole). One beam.

    Args:
        topk, topp, temperature, seed: `SearchOptions`' ``sampling_*`` and ``seed`` (python
            values or scalar tensors).
        uniform: `LoopOps.uniform`.
    """

    topk: object
    topp: object
    temperature: object
    seed: object
    uniform: typing.Callable

    def __call__(self, logits, spec, step=None, sentence=None):
        """
        Args:
            logits: float32 ``[rows, V]`` (one beam a sentence).
            sentence: None (row ``i`` is sentence ``i``), or int32 ``[rows]``, each row's
                sentence (the state's ``sentence`` entry of the loops that move rows).

        Returns:
            ``(logp float32 [rows, 1, 1], token int32 [rows, 1], 1)``: the token and its
            log-probability under the model's own distribution (CTranslate2's score).
        """
        topk, topp, temperature = self.topk, self.topp, self.temperature
        logp = ops.log_softmax(logits, axis=-1)  # [rows, V]
        scores = logp
        if _is_python(topk):
            if topk > 0:
                kth = ops.top_k(logp, topk)[0][:, -1:]  # [rows, 1]
                scores = ops.where(logp >= kth, scores, spec.neg_inf)
        else:  # given at run time (>= 0): the k-th best, or with 0 every token
            k = ops.clip(ops.cast(topk, "int32"), 1, ops.shape(logp)[-1])
            kth = ops.top_k(logp, k)[0][:, -1:]  # [rows, 1]
            scores = ops.where(ops.logical_or(logp >= kth, topk <= 0), scores, spec.neg_inf)
        scores = ops.log_softmax(scores / temperature, axis=-1)  # [rows, V]
        if not _is_python(topp) or topp < 1.0:
            ranked = ops.sort(ops.exp(scores), axis=-1)[:, ::-1]  # [rows, V], most likely first
            before = ops.cumsum(ranked, axis=-1) - ranked  # [rows, V]: the mass of the tokens ranked before
            smallest = ops.min(ops.where(before < topp, ranked, 2.0), axis=-1, keepdims=True)  # [rows, 1]
            nucleus = ops.exp(scores) >= smallest
            # (a run-time 1.0 keeps every token, as the python 1.0 does: no float sum decides it)
            scores = ops.where(nucleus if _is_python(topp) else ops.logical_or(nucleus, topp >= 1.0),
                               scores, spec.neg_inf)
        noise = self.uniform((spec.batch_size, ops.shape(logits)[-1]), self.seed, step)  # [batch, V] in (0, 1)
        noise = noise if sentence is None else spec.gather(noise, sentence, 0)  # [rows, V]
        token = ops.cast(ops.argmax(scores - ops.log(-ops.log(noise)), axis=-1), "int32")[:, None]  # [rows, 1]
        beam_logp = ops.take_along_axis(logp, token, axis=-1)  # [rows, 1]
        return ops.reshape(beam_logp, (-1, 1, 1)), token, 1


def make_sampler(options, loop_ops):
    """The sampler of a search (CTranslate2's ``make_sampler``): `RandomSampler` where
    `options` samples (`SearchOptions.samples`), else `BestSampler`."""
    if not options.samples:
        return BestSampler()
    return RandomSampler(options.sampling_topk, options.sampling_topp, options.sampling_temperature, options.seed,
                         loop_ops.uniform)


def _grow_candidates(sentences, step, logits, spec):
    """Extends every alive beam by every token and keeps the best candidates.

    The best ``C`` of the ``k * V`` (beam, token) pairs by summed log-prob,
    found as the best ``C`` of each beam's best ``C`` tokens (`BestSampler`;
    the same candidates, in the same order: ``top_k`` keeps the lower index
    first on ties within a beam, and the merge keeps the lower beam first);
    the chosen token is written into the copied sequence at position ``step``
    (a one-hot ``where`` blend, no scatter).

    Args:
        sentences: the state's per-sentence entries.
        step: int32 scalar, the state's step.
        logits: float32 ``[b * k, V]``, the scores of the token after
            ``alive_last`` for every alive beam (batch-major).
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
    beam_logp, beam_tok, per_beam = spec.sampler(logits, spec, step, sentences.get("sentence"))  # [b, k, P], [b, k*P]
    valid = ops.logical_and(
        sentences["alive_valid"][:, :, None], beam_logp > NEG_INF / 2
    )  # [b, k, P]
    logp = ops.where(
        valid, sentences["alive_logp"][:, :, None] + beam_logp, spec.neg_inf
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
    top_seqs = spec.gather(sentences["alive_seqs"], top_beam, 1)  # [b, C, L]
    write = (spec.positions == step)[None, None, :]  # [1, 1, L]
    top_seqs = ops.where(write, top_tok[:, :, None], top_seqs)  # [b, C, L]

    length = step + 1
    at_limit = (length >= sentences["max_lengths"])[:, None]  # [b, 1]
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


def _update_finished(sentences, candidates, spec):
    """The new finished set: the best ``k`` of (old finished + finishing candidates).

    Old entries come first in the merge: ``top_k`` is stable, so on a tie
    the older hypothesis is kept.  Sentences already done are frozen
    (batching must not change them); in `DropFinished`'s loop
    (``spec.keeps_done`` False) no sentence in the loop is done.

    Args:
        sentences: the state's per-sentence entries (the finished set and
            ``done``, if kept).
        candidates: the dict from `_grow_candidates`.
        spec: the `_SearchSpec`.

    Returns:
        dict with the state's ``finished_seqs``, ``finished_scores``,
        ``finished_valid`` and, with patience, ``finished_count``.
    """
    old_scores = sentences["finished_scores"]  # [b, k]
    old_valid = sentences["finished_valid"]  # [b, k]
    old_seqs = sentences["finished_seqs"]  # [b, k, L]
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
        finished["finished_count"] = sentences["finished_count"] + ops.sum(
            ops.cast(candidates["finishing"], "int32"), axis=1)  # [b]
    if spec.keeps_done:
        done = sentences["done"]  # [b]
        old = {"finished_seqs": old_seqs, "finished_scores": old_scores, "finished_valid": old_valid,
               "finished_count": sentences.get("finished_count")}
        finished = {name: ops.where(ops.reshape(done, (-1,) + (1,) * (len(x.shape) - 1)), old[name], x)
                    for name, x in finished.items()}
    return finished


def _cannot_improve(sentences, candidates, alive, finished, spec):
    """The exact stop: no alive hypothesis can beat the finished ones that the
    result needs, with ``r = spec.exact_results``: the ``r``-th best of them
    (exact for the ``r`` best hypotheses and their scores): the best one when
    one result is asked (tensor2tensor's stop), the worst of the ``k``
    finished ones for the whole n-best. Any extension of an alive hypothesis
    has log-prob <= the best alive one and a length in
    ``[length + 1, max_length]``; the length penalty is monotonic in the
    length, so the best possible score is at one of the two ends (the
    ``max_length`` end when alpha >= 0), which bounds it for any alpha.

    Args:
        sentences: the state's per-sentence entries before this step (``max_penalty``).
        candidates, alive, finished: the dicts of `_grow_candidates`,
            `_update_alive` and `_update_finished`.
        spec: the `_SearchSpec`.

    Returns:
        bool ``[b]``.
    """
    alive_logp = alive["alive_logp"]  # [b, k]
    fin_valid, fin_scores = finished["finished_valid"], finished["finished_scores"]  # [b, k] x2
    best_alive = ops.max(alive_logp, axis=1)  # [b]
    bound = ops.maximum(
        best_alive / length_penalty(candidates["length"] + 1, spec.alpha),
        best_alive / sentences["max_penalty"],
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
    return ops.logical_and(valid_at, score_at >= bound)  # [b]


def _patient(finished, spec):
    """CTranslate2's patience stop (not exact): ``round(k * patience)`` hypotheses
    of the sentence have finished, and that count is above 0. bool ``[b]``."""
    k = spec.beam_size if isinstance(spec.beam_size, int) else ops.cast(spec.beam_size, "float32")
    wanted = ops.cast(ops.round(k * ops.cast(spec.patience, "float32")), "int32")
    return ops.logical_and(wanted > 0, finished["finished_count"] >= wanted)  # [b]


def _update_done(sentences, candidates, alive, finished, spec):
    """Which sentences are done after this step (early termination): those done
    before (``spec.keeps_done``), and those that reached their length limit, have
    no alive hypothesis or cannot improve (`_cannot_improve`), or, with
    `spec.patience`, are patient (`_patient`). bool ``[b]``."""
    any_alive = ops.any(alive["alive_valid"], axis=1)  # [b]
    cannot_improve = _cannot_improve(sentences, candidates, alive, finished, spec)  # [b]
    at_limit = candidates["at_limit"][:, 0]  # [b]
    done = ops.logical_or(
        ops.logical_or(sentences["done"], at_limit) if spec.keeps_done else at_limit,
        ops.logical_or(ops.logical_not(any_alive), cannot_improve),
    )  # [b]
    if spec.patience is not None:
        done = ops.logical_or(done, _patient(finished, spec))
    return done


def _best_results(sentences, num_results, spec):
    """The ``num_results`` best finished hypotheses; unused slots are PAD / NEG_INF.

    Returns:
        ``(sequences, scores)``: int32 ``[b, n, L]`` and float32 ``[b, n]``.
    """
    valid = sentences["finished_valid"][:, :num_results]  # [b, n]
    sequences = ops.where(
        valid[:, :, None], sentences["finished_seqs"][:, :num_results], PAD_ID
    )  # [b, n, L]
    scores = ops.where(
        valid, sentences["finished_scores"][:, :num_results], spec.neg_inf
    )  # [b, n]
    return ops.cast(sequences, "int32"), ops.cast(scores, "float32")


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


def _on(value):
    """Whether an option may be on: a python value other than 0 / False, or a tensor (given
    at run time). No processor, so no op at all, for an option that is off."""
    return not _is_python(value) or bool(value)


def make_logits_processors(options, eos_id, has_prefix=False):
    """The logits processors of a search (CTranslate2's ``make_logits_processors``): one for
    each option of `options` that is on (a python value other than 0 / False, or a tensor),
    in order: `MinLength`, `NoRepeatNgram`, `DisallowUnk`, and `TargetPrefix` last (where the
    search takes a prefix). A tuple; empty when none is on (the step then adds no op)."""
    processors = []
    if _on(options.min_length):
        processors.append(MinLength(options.min_length, eos_id))
    if _on(options.no_repeat_ngram_size):
        processors.append(NoRepeatNgram(options.no_repeat_ngram_size))
    if _on(options.disallow_unk):
        processors.append(DisallowUnk(options.disallow_unk))
    if has_prefix:
        processors.append(TargetPrefix())
    return tuple(processors)


def _processed(logits, sentences, step, spec):
    """`logits` with every token the processors disallow set to NEG_INF, as CTranslate2
    applies its logits processors: before the step's log-softmax.

    Args:
        logits: float32 ``[b * k, V]``, batch-major.
        sentences: the state's per-sentence entries (``alive_seqs`` ``[b, k, L]``).
        step: int32 scalar, the position of the token the logits score.
    """
    vocab = ops.arange(ops.shape(logits)[-1], dtype="int32")[None, :]  # [1, V]
    banned = ops.zeros_like(vocab, dtype="bool")  # [1, V]
    for processor in spec.processors:
        banned = processor(banned, vocab, logits, sentences, step, spec)
    return ops.where(banned, spec.neg_inf, logits)


def _search_step(state, logits, cache, spec):
    """One step of the search after the step function: candidates, the new
    alive and finished sets, and which sentences are done.

    Returns:
        ``(state, source_beam, done)``: the new state (with ``cache`` still in
        the previous beams' order, and ``done`` among its sentences'
        entries when ``spec.keeps_done``), ``source_beam`` int32 ``[b, k]``
        (see `_update_alive`) and ``done`` bool ``[b]``.
    """
    sentences = state["sentences"]
    logits = ops.cast(logits, "float32")
    if spec.processors:  # (no ops at all in a search without constraints)
        logits = _processed(logits, sentences, state["step"], spec)
    candidates = _grow_candidates(sentences, state["step"], logits, spec)
    alive = _update_alive(candidates, spec)
    source_beam = alive.pop("source_beam")
    finished = _update_finished(sentences, candidates, spec)
    done = _update_done(sentences, candidates, alive, finished, spec)
    new_sentences = {**sentences, **alive, **finished}
    if spec.keeps_done:
        new_sentences["done"] = done
    return {**state, "sentences": new_sentences, "cache": cache, "step": state["step"] + 1}, source_beam, done


def _step_caller(step_fn, with_static):
    """``run_step(state, static) -> (logits, cache)``: the step function on the state's
    last tokens (``ids`` int32 ``[b * k, 1]``), cache and step, and `static` (the static
    cache's rows) when the search has one."""
    def run_step(state, static):
        ids = ops.reshape(state["sentences"]["alive_last"], (-1, 1))  # [b * k, 1]
        if not with_static:
            return step_fn(ids, state["cache"], state["step"])
        return step_fn(ids, state["cache"], state["step"], static)

    return run_step


# --------------------------------------------------------------------------
# The loops: fixed shapes (KeepAll, Halvings; in cache stages or not) and shrinking (DropFinished)
# --------------------------------------------------------------------------
def _fixed_shape_body(run_step, spec, deferred):
    """``search_body(state, static, not_done_first=False) -> state``: one step of the
    fixed-shape loop (the step function, the search's bookkeeping, the cache's beam
    reorder). `static`: the static cache's rows for the state's sentences.

    `deferred` (`Halvings`): the beam reorder of the step before is done here, where
    XLA fuses it with the step's write of its keys and values: two passes over each
    cache leaf a step instead of three (write, reorder, and the copy of the reordered
    buffer into the loop's; docs/lab-notebook, serving speed part 15); the state's
    ``cache_rows`` holds the rows to gather. `not_done_first` (`Halvings`): the
    sentences not done move first."""
    def search_body(state, static, not_done_first=False):
        if deferred:  # the cache's rows in the order of the state's hypotheses
            state = {**state, "cache": gather_rows(state["cache"], state["cache_rows"], spec.gather)}
        logits, cache = run_step(state, static)
        state, source_beam, done = _search_step(state, logits, cache, spec)
        order = None
        if not_done_first:
            order = ops.argsort(ops.cast(done, "int32"))  # [b]
            source_beam = spec.gather(source_beam, order, 0)
            state = {**state, "sentences": gather_rows(state["sentences"], order, spec.gather)}
        # One gather per cache leaf: the beam reorder (and the sentences' move), or
        # with `deferred` the rows it will gather at the start of the next step.
        rows = _beam_rows(source_beam, spec.beam_size, order)  # [b * k]
        if deferred:
            return {**state, "cache_rows": rows}
        return {**state, "cache": gather_rows(cache, rows, spec.gather)}

    return search_body


def _fixed_shape_loop(run_step, state, static_cache, spec, loop):
    """The loop of `KeepAll` and `Halvings`: every sentence stays in the loop until
    the whole batch is done, each frozen once it is; in `loop.stages` or in one
    ``while_loop``. Returns ``(sequences [batch, n, L], scores [batch, n])``."""
    halvings = loop.finished.count if isinstance(loop.finished, Halvings) else 0
    search_body = _fixed_shape_body(run_step, spec, deferred=halvings > 0)
    if loop.ops.trace_once is not None:
        search_body = loop.ops.trace_once(search_body)
    if halvings:
        sentence = ops.arange(spec.batch_size, dtype="int32")  # [batch]: each row's sentence
        # [batch * k]: the cache's row of each hypothesis (its beam reorder waits for the next step)
        state = {**state, "sentences": {**state["sentences"], "sentence": sentence},
                 "cache_rows": ops.arange(spec.batch_size * spec.beam_size, dtype="int32")}
        body = _halving_body(search_body, halvings, static_cache, spec)
        # The first cache stage runs on the whole batch: few sentences of a batch end
        # in its steps, and each halving is one more compiled copy of the step in each
        # stage (a batch-32 program traced in 11.9 instead of 13.7 s and compiled in
        # 13.1 instead of 16.8, same run time and results; docs/lab-notebook, serving
        # speed part 16).
        first_stage_body = _halving_body(search_body, 0, static_cache, spec)
    else:
        def body(state):
            return search_body(state, static_cache)

        first_stage_body = body

    def cond(state):
        return ops.logical_and(
            state["step"] < spec.max_decode_length, ops.any(ops.logical_not(state["sentences"]["done"]))
        )

    if loop.stages is None:
        state = loop.ops.while_loop(cond, body, state, maximum_iterations=spec.max_decode_length)
    else:
        state = _run_stages(state, cond, (first_stage_body, body), loop.stages, spec, loop.ops.while_loop)
    seqs, scores = _best_results(state["sentences"], spec.num_results, spec)
    if halvings:  # rows back in the sentences' order
        order = ops.argsort(state["sentences"]["sentence"])  # [batch]
        seqs, scores = ops.take(seqs, order, axis=0), ops.take(scores, order, axis=0)
    return seqs, scores


def _run_stages(state, cond, bodies, stages, spec, while_loop):
    """The fixed-shape loop in `CacheStages`: one ``while_loop`` per stage, the cache
    resized before each; `bodies`: the first stage's body and the others'."""
    previous_end = 0
    for index, stage_end in enumerate(_stage_ends(stages.ends, spec.max_decode_length)):
        state = {**state, "cache": stages.resize(state["cache"], stage_end)}

        def stage_cond(state, stage_end=stage_end):
            return ops.logical_and(cond(state), state["step"] < stage_end)

        stage_body = bodies[0] if index == 0 else bodies[1]

        def run_stage(state):
            return while_loop(stage_cond, stage_body, state, maximum_iterations=stage_end)

        # (a stage after a given end below min_decode_length is not empty; with python
        # ints, _stage_ends leaves the empty ones out)
        if index == 0 or isinstance(stage_end, int) or stages.ends[index - 1] < stages.min_decode_length:
            state = run_stage(state)
        else:
            # A stage that ends where the one before did (a buffer shorter than the given
            # end before it) runs no step. Under XLA the shapes make this condition a
            # constant, and the optimized program keeps no loop for the stage (one more
            # copy of the step per batch halving; docs/lab-notebook, serving speed part 31).
            # (`cond` traces both branches at once: no late binding of `state`.)
            state = ops.cond(stage_end > previous_end, lambda: run_stage(state), lambda: state)
        previous_end = stage_end
    return state


def halving_sizes(batch_size, halvings):
    """The batch sizes a step of `Halvings(halvings)` may run on:
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


def _halving_body(search_body, halvings, static_cache, spec):
    """The loop body of `Halvings`: `search_body` on the smallest prefix of sentences
    that holds every one not done, which also moves the sentences not done first
    (`search_body(..., not_done_first=True)`: the permutation folded into the cache's
    beam reorder, on every step).

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
    With a python batch size the sizes are python ints; with a scalar tensor
    (TensorFlow) XLA still sees each as a constant, since it compiles one program
    per batch size.
    """
    batch_size, beam_size = spec.batch_size, spec.beam_size
    sizes = halving_sizes(batch_size, halvings)
    static_cache = static_cache if static_cache is not None else {}

    def on_prefix(state, size):
        if size is batch_size:  # the whole batch: no slicing
            return search_body(state, gather_rows(static_cache, state["sentences"]["sentence"], spec.gather),
                               not_done_first=True)
        head = {"step": state["step"], "cache": state["cache"],  # (the cache: `search_body` gathers its rows)
                "cache_rows": state["cache_rows"][: size * beam_size],
                "sentences": keras.tree.map_structure(lambda leaf: leaf[:size], state["sentences"])}
        static = gather_rows(static_cache, head["sentences"]["sentence"], spec.gather)
        head = search_body(head, static, not_done_first=True)
        return {"step": head["step"], **{name: keras.tree.map_structure(
                    lambda full, part: ops.slice_update(full, [0] * len(full.shape), part), state[name], head[name])
                for name in ("cache", "cache_rows", "sentences")}}

    def body(state):
        alive = ops.sum(ops.cast(ops.logical_not(state["sentences"]["done"]), "int32"))
        # the smallest size that holds them (a size equal to the batch, as every size of a batch of
        # one is, takes the whole-batch branch, which slices nothing)
        index = sum(ops.cast(ops.logical_and(alive <= size, size < batch_size), "int32") for size in sizes[1:])
        return ops.switch(index, [lambda s, size=size: on_prefix(s, size) for size in sizes], state)

    return body


def _stage_ends(ends, max_decode_length):
    """The steps at which the stages of `CacheStages(ends)` end: the given ones
    below `max_decode_length` (all of them, capped, when it is a tensor), then it."""
    if isinstance(max_decode_length, int):
        return [end for end in ends if end < max_decode_length] + [max_decode_length]
    return [ops.minimum(end, max_decode_length) for end in ends] + [max_decode_length]


def _shrinking_body(run_step, spec, nonzero):
    """One step of `DropFinished`'s loop: the search's step, then the sentences that
    ended write their results and leave the state."""
    def body(state):
        logits, cache = run_step(state, state["static"])
        state, source_beam, done = _search_step(state, logits, cache, spec)
        sentences = state["sentences"]
        # Every step writes the results of the sentences that ended (on most steps
        # none: an empty scatter) and keeps the others, with no `cond` over the
        # state: such a cond cost more per step (a Switch, a Merge and two
        # function-boundary copies per tensor of the state, and the branch not
        # taken) than these small gathers, and a `while_loop` pays for every node
        # of its body on every step.
        seqs, scores = _best_results(sentences, spec.num_results, spec)  # [b, n, L], [b, n]
        ended = nonzero(done)  # [e]
        written = ops.expand_dims(spec.gather(sentences["sentence"], ended, 0), 1)  # [e, 1]
        out_seqs = ops.scatter_update(state["out_seqs"], written, spec.gather(seqs, ended, 0))
        out_scores = ops.scatter_update(state["out_scores"], written, spec.gather(scores, ended, 0))
        kept = nonzero(ops.logical_not(done))  # [b']
        # One gather per cache leaf: beam reorder and dropped sentences together.
        rows = _beam_rows(spec.gather(source_beam, kept, 0), spec.beam_size, kept)  # [b' * k]
        return {"step": state["step"], "cache": gather_rows(cache, rows, spec.gather),
                "sentences": gather_rows(sentences, kept, spec.gather), "out_seqs": out_seqs,
                "out_scores": out_scores, "static": _kept_static(state["static"], done, kept, spec.gather)}

    return body


def _kept_static(static, done, kept, gather):
    """The static cache's rows of the sentences `kept` (`DropFinished`): the encoder's
    keys and values, the largest per-sentence tensors, are copied only on a step where
    a sentence ended. ``{}`` without a static cache."""
    if not static:
        return static
    return ops.cond(ops.any(done), lambda: gather_rows(static, kept, gather), lambda: static)


def _shrinking_loop(run_step, state, static_cache, spec, loop_ops):
    """The loop of `DropFinished`: it carries only the sentences not done (their
    original row in ``sentence``), and each writes its results when done. No
    sentence in the loop is done (each leaves when it is): no ``done`` to carry.
    Returns ``(sequences [batch, n, L], scores [batch, n])``."""
    batch_size, num_results = spec.batch_size, spec.num_results
    sentences = {**state["sentences"], "sentence": ops.arange(batch_size, dtype="int32")}  # [b]
    state = {
        **state, "sentences": sentences, "static": static_cache if static_cache is not None else {},
        "out_seqs": ops.full((batch_size, num_results, spec.max_decode_length), PAD_ID, dtype="int32"),  # [batch, n, L]
        "out_scores": ops.full((batch_size, num_results), NEG_INF, dtype="float32"),  # [batch, n]
    }

    def cond(state):
        return ops.logical_and(state["step"] < spec.max_decode_length,
                               ops.shape(state["sentences"]["sentence"])[0] > 0)

    # `cond` bounds the steps: no iteration counter (a loop variable more).
    state = loop_ops.while_loop(cond, _shrinking_body(run_step, spec, loop_ops.nonzero), state,
                                maximum_iterations=None)
    return state["out_seqs"], state["out_scores"]


# --------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------
def beam_search(step_fn, initial_cache, batch_size, max_lengths, options=None, *, loop=None, static_cache=None,
                max_decode_length=None, bos_id=BOS_ID, eos_id=EOS_ID, target_prefix=None):
    """Batched beam search with GNMT length penalty and early termination.

    Args:
        step_fn: ``step_fn(ids, cache, step) -> (logits, cache)``, see the
            module docstring (``step_fn(ids, cache, step, static_cache)``
            when `static_cache` is given). ``ids`` int32 ``[batch * beam, 1]``
            is the token at position ``step`` (BOS at step 0), ``logits``
            ``[batch * beam, vocab]`` (vocab >= 2) are for position
            ``step + 1``; the returned cache must keep the structure and
            dtypes of its input, and its shapes unless `DropFinished`.
        initial_cache: nested structure of tensors with leading dimension
            ``batch``; tiled here to ``batch * beam`` (row ``b * beam + k``)
            and reordered along beams after every step. May be ``{}``/``()``.
        batch_size: python int (or int32 scalar tensor on the TensorFlow
            backend for a dynamic batch): the number of sentences.
        max_lengths: int ``[batch]``: the maximum number of generated tokens
            (EOS included) per sentence, e.g. ``source_length + 50``.  A
            hypothesis reaching its limit without EOS is finished as it is.
            Values are clipped to ``[1, max_decode_length]``.
        options: `SearchOptions` (beam size, alpha, results, patience): what
            the search finds. None: ``SearchOptions()`` (beam 4, alpha 0.6).
        loop: `SearchLoop` (its ops, what happens to finished sentences, cache
            stages): how the loop runs; the same results with any. None:
            ``SearchLoop()`` (keras.ops, `KeepAll`, one stage).
        static_cache: None, or a nested structure of tensors with leading
            dimension ``batch`` that the step function reads and never
            changes (e.g. cross-attention keys/values, one row per sentence
            shared by its beams): it is neither tiled nor reordered; with
            `DropFinished` it keeps the rows of the sentences searched.
        max_decode_length: the size of the sequence buffers and the hard
            bound on the number of loop iterations: a python int (static
            shapes: XLA, LiteRT, JAX), or, on the TensorFlow backend without
            XLA, an int32 scalar tensor, so that a graph sizes its buffers to
            each request (``max(max_lengths)``) instead of the largest one.
            If None it is ``max(max_lengths)``, which requires
            ``max_lengths`` to be concrete (eager / numpy); inside a graph
            pass it explicitly (e.g. ``max_source_length + 50``).
        bos_id: the id fed at step 0.
        eos_id: the id that ends a hypothesis.
        target_prefix: None, or ``(ids int [batch, P], lengths int [batch])``: each
            sentence's hypotheses start with its first ``lengths`` ids (CTranslate2's
            ``target_prefix``; 0: none). A prefix token is forced as the only allowed
            token of its step (so it adds 0 to the log-probability, as in
            CTranslate2), counts in the hypothesis's length and is returned with it.
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

    Example:
        >>> ids, scores = beam_search(step_fn, cache, 2, np.array([7, 9]), SearchOptions(beam_size=4))
    """
    options, loop = _checked_settings(options, loop)
    max_decode_length = _buffer_length(max_decode_length, max_lengths)
    spec = _make_spec(options, loop, batch_size, max_decode_length, eos_id, has_prefix=target_prefix is not None)
    state = _initial_state(initial_cache, max_lengths, bos_id, spec, target_prefix)
    run_step = _step_caller(step_fn, with_static=static_cache is not None)
    if isinstance(loop.finished, DropFinished):
        return _shrinking_loop(run_step, state, static_cache, spec, loop.ops)
    return _fixed_shape_loop(run_step, state, static_cache, spec, loop)


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

    Exactly ``beam_search(..., SearchOptions(beam_size=1))`` with the result
    dimension removed.

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
        SearchOptions(beam_size=1, alpha=alpha, num_results=1),
        max_decode_length=max_decode_length,
        bos_id=bos_id,
        eos_id=eos_id,
    )
    return sequences[:, 0], scores[:, 0]  # [batch, L], [batch]
