"""Source ids in, translation ids out: the beam search over the cached decoder.

`Searcher(model, config)` runs `keras_transformer.decoding.beam_search` over
the model's `IncrementalDecoder`, in one of two ways (same translations):

* plain TensorFlow graph (`search`): what TF Serving runs by default (it
  disables XLA JIT unless started with `--xla_cpu_compilation_enabled`);
  the buffers are sized to each request, the self-attention caches grow by
  one position per step and finished sentences leave the loop.
* XLA-compiled (`search_xla`): the search (encoder, decoder steps, beam
  bookkeeping) is one `jit_compile=True` function. XLA compiles one program
  per input shape, so the source ids are padded to a few *buckets*: the
  batch to a power of two (`XLA_BATCH_BUCKETS`, then multiples of the
  largest), the source width to `length_buckets(max_length)`; the buffer
  holds `width - 1 + decode_extra_length` positions. Padding is masked
  (source columns) or finished at the first step (batch rows), so the
  translations do not change; what they cost is computing the padded rows,
  at most twice the batch.

The LiteRT signature's search (`search_litert`) is the plain graph's for a batch
and the static buffer's (`search(buffer=STATIC_BUFFER)`: cache stages, no dropped
sentences) for one sentence; both convert to LiteRT builtins.

Strings (tokenizer, detokenizer, CoNLL-U) are `keras_transformer.inference.translator`'s
concern: `Translator` wraps one `Searcher`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from keras_transformer.config import TransformerConfig
from keras_transformer.constants import EOS_ID, PAD_ID
from keras_transformer.decoding import (CacheStages, DropFinished, Halvings, KeepAll, LoopOps, SearchLoop,
                                         SearchOptions, beam_search)
from keras_transformer.decoding.options import BY_NAME, OPTIONS
from keras_transformer.decoding.processors import option_on
from keras_transformer.inference.incremental import IncrementalDecoder
from keras_transformer.layers.attention import SMALL_ATTENTION
from keras_transformer.layers.step_kernels import StepKernels

# Batch sizes the XLA-compiled search is compiled for: a request is padded
# to the next one; larger requests to the next multiple of the last one.
XLA_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# The searches of static shapes (XLA-compiled, and the static buffer that LiteRT runs for a
# single sentence) run in stages whose self-attention buffers hold this many positions (then
# the whole buffer): a step reads, writes and reorders a buffer of its stage's size, not
# `source + 50` (`CacheStages`). In LiteRT a single sentence translated in
# 0.84-0.92x the time, a batch of 32 in 0.49-0.51x, before a batch ran another loop
# (`search_litert`; docs/lab-notebook, serving speed part 38).
CACHE_STAGES = (16, 32, 64)
# ... and each step after the first stage runs on the smallest of batch, batch / 2, batch / 4,
# batch / 8 (rounded up) that holds the sentences not yet done (`Halvings`):
# XLA's static shapes cannot drop finished sentences one by one as the plain
# graph does, so a few fixed sizes, one compiled branch each. Three halvings
# rather than two: batch 32 ran 70 rows a step instead of 75 and 8-10% faster,
# for ~2.3 s more compiling per batch bucket (7.3 -> 9.6 s; docs/lab-notebook, part 8).
XLA_BATCH_HALVINGS = 3
# The batch-1 program of the XLA search (beam rows a step) multiplies by the embeddings
# `[vocab, d_model]` as stored, the transpose folded into the dot, when their matrix holds at
# least this many bytes (`base`: 63 MB), instead of by the transposed copy made before the
# loop: read from memory for 4 rows, the stored layout ran 1.4-1.8x faster; while the matrix
# fits in the cache the copy runs 2x faster (the Multi30k model's 4 MB, and 8 MB, on a CPU
# with 32 MB of L3), and at 128 rows the two run alike (docs/lab-notebook, serving speed part 17).
XLA_FOLDED_PROJECTION_BYTES = 16 * 2**20
# Smallest source-width bucket (tokens, EOS included); the others double up to max_length.
XLA_MIN_LENGTH_BUCKET = 16


def length_buckets(max_length: int) -> tuple[int, ...]:
    """Source widths (tokens including EOS) the XLA-compiled search is compiled for.

    Powers of two from `XLA_MIN_LENGTH_BUCKET` below `max_length`, then
    `max_length` itself: `length_buckets(256) == (16, 32, 64, 128, 256)`,
    `length_buckets(100) == (16, 32, 64, 100)`.
    """
    buckets, width = [], XLA_MIN_LENGTH_BUCKET
    while width < max_length:
        buckets.append(width)
        width *= 2
    return (*buckets, max_length)


def _bucket(value, buckets, multiple_of_last=False):
    """The smallest bucket >= `value` (int32 scalar); beyond the last one, the last one
    (or, with `multiple_of_last`, the next multiple of it)."""
    table = tf.constant(buckets, tf.int32)
    index = tf.reduce_sum(tf.cast(table < value, tf.int32))
    last = buckets[-1]
    beyond = (value + last - 1) // last * last if multiple_of_last else tf.constant(last, tf.int32)
    return tf.where(index < len(buckets), tf.gather(table, tf.minimum(index, len(buckets) - 1)), beyond)


def bucketed_shape(batch, width, widths):
    """The `(batch, width)` a request of that size is padded to for the compiled search
    (int32 scalars): the batch to `XLA_BATCH_BUCKETS` (beyond the last, its next multiple),
    the width to the smallest of `widths` (`length_buckets`) that holds it."""
    return (_bucket(batch, XLA_BATCH_BUCKETS, multiple_of_last=True), _bucket(width, widths))


def tf_gather(x, indices, batch_dims=0):
    """`keras_gather`'s meaning as one `tf.gather` node, for the plain graph's
    loop (`LoopOps.gather`: `TF_GRAPH_OPS`, `XLA_OPS`): `ops.take` adds a negative-index fix
    (~5 nodes) and `gather_beams` its offsets (~12) to every gather, and a
    `while_loop` runs every node of its body on every step."""
    return tf.gather(x, indices, axis=batch_dims, batch_dims=batch_dims)


def tf_nonzero(mask):
    """`LoopOps.nonzero` (`TF_GRAPH_OPS`) as one `tf.where`: the positions of a bool `[b]`'s True
    entries, int32 `[m]`, ascending. `keras.ops.nonzero` unstacks them from int64 `[m, 1]`,
    and LiteRT's builtins have no Unpack of int64 (its conversion left a custom op)."""
    return tf.cast(tf.reshape(tf.where(mask), [-1]), tf.int32)


def eigen_matmul(x, y, transpose_y=False):
    """`x @ y` (`x @ y^T` with `transpose_y`) as one `BatchMatMulV3` node: `x [rows, d] @ kernel
    [d, units]` for the projections of the plain graph's small-request loop
    (`apply_per_token(matmul=...)`), and rank-4 products over their two leading axes for the
    attentions of its other loop (`StepKernels.batch_matmul`). On CPUs where TensorFlow
    runs oneDNN (it turns it on by itself on AVX-512 VNNI/BF16 or AMX CPUs) its graph pass
    rewrites `MatMul` and the `MatMul` + bias that Keras's `Dense` traces into oneDNN kernels,
    which on a few rows cost twice Eigen's (9.9 against 4.6 us a call for `[4, 128] x [128, d]`);
    it leaves `BatchMatMulV3` to Eigen. A batch-1 `serving_default` of the `multi30k` preset
    ran 1.15x faster with oneDNN on, and as fast with it off (docs/lab-notebook, serving speed
    part 20). Its Einsum, BatchMatMul and Softmax kernels likewise cost 1.3-2.7x Eigen's on the
    attention products of a batch-32 step (traced), where its projections are the faster; a
    batch-32 search of the preset took 0.97x the time with its attentions' products as
    `BatchMatMulV3` and their softmax written out, 0.91x with `eigen_transpose`'s transposes
    too (in one process; part 21). Same products, so the same numbers up to float rounding."""
    return tf.raw_ops.BatchMatMulV3(x=x, y=y, adj_y=transpose_y, Tout=x.dtype)


# Integer types of the float types' sizes: `eigen_transpose` moves their bits.
_SAME_SIZE_INTEGER = {2: tf.int16, 4: tf.int32, 8: tf.int64}


def eigen_transpose(x, axes):
    """`tf.transpose(x, axes)` of a float tensor as a transpose of its bits read as integers of
    the same size (`tf.bitcast` there and back: no copy), for the attentions of the plain graph's
    loop (`StepKernels.transpose`). TensorFlow's oneDNN pass rewrites a float `Transpose` into its
    own kernel, ~30 us a call slower than Eigen's on a step's `[32, 4, 4, 32]` (34 against 4.5 us
    in a `while_loop`; 3.4 with oneDNN off), and leaves integer ones to Eigen. The same values,
    bit for bit."""
    integer = _SAME_SIZE_INTEGER[x.dtype.size]
    return tf.bitcast(tf.transpose(tf.bitcast(x, integer), axes), x.dtype)


# The kernels of the plain graph's loops (`Searcher.search`): the small-request loop's
# projections as `BatchMatMulV3`; the other loop keeps `Dense`'s projections, whose oneDNN
# kernels are the faster on many rows, and takes its attentions' large products (its small
# ones are broadcast products) and transposes out of oneDNN.
SMALL_REQUEST_KERNELS = StepKernels(matmul=eigen_matmul)
LARGE_REQUEST_KERNELS = StepKernels(batch_matmul=eigen_matmul, transpose=eigen_transpose)


def broadcast_products_suffice(rows, d_model, keys):
    """Whether every attention product of a search is small enough for the broadcast
    products (`MultiHeadAttention(small_kernels=...)`), bool scalar: with `rows`
    query rows (batch x beam) and at most `keys` keys, the largest product has
    `rows x heads x keys x head_size = rows x d_model x keys` entries; compared
    with `SMALL_ATTENTION` as each call compares its own."""
    return tf.cast(rows, tf.int64) * d_model * tf.cast(keys, tf.int64) <= SMALL_ATTENTION


# TensorFlow's executor of a graph's functions that runs their nodes one after the other on
# the calling thread, with no scheduling across threads (`executor_type`, as TensorFlow names it).
SINGLE_THREADED_EXECUTOR = "SINGLE_THREADED_EXECUTOR"


def relaxed_while_loop(cond, body, loop_vars, maximum_iterations=None, single_threaded=False):
    """`tf.while_loop` whose loop variables may change shape from one iteration
    to the next (every dimension is relaxed): what `DropFinished` (`TF_GRAPH_OPS`) and
    caches that grow by concatenation need in a TensorFlow graph (not XLA, which needs
    static shapes).

    `single_threaded`: the loop's body and condition run as functions of their own,
    each call by TensorFlow's `SINGLE_THREADED_EXECUTOR`, instead of being lowered
    into the caller's graph (Switch/Merge frames), whose executor schedules every
    node of every step across its inter-op threads. For a loop of many small nodes
    (a step on a few rows: its cost is its ~480 nodes) that scheduling is a large part
    of a step's cost: a batch-1 search of the `multi30k` preset's model took 0.76x the time;
    a batch-32 one, whose independent nodes the default executor runs side by side,
    1.19x (docs/lab-notebook, serving speed part 34). The body must hold no branch or
    loop that TensorFlow lowers (that executor runs no control-flow frames). The
    attributes are the graph's (`_lower_using_switch_merge` on the `While` node,
    `_executor` on its functions), so a SavedModel keeps them for TF Serving."""
    def relax(tensor):
        rank = tensor.shape.rank
        return tensor.shape if not rank else tf.TensorShape([None] * rank)

    # One loop variable (the search's state dict) as a 1-tuple, as keras.ops.while_loop does.
    loop_vars = (loop_vars,)
    invariants = tf.nest.map_structure(relax, loop_vars)
    (state,) = tf.while_loop(cond, lambda s: (body(s),), loop_vars, shape_invariants=invariants,
                             maximum_iterations=maximum_iterations)
    if single_threaded and not tf.executing_eagerly():  # (eagerly the loop is python's)
        _run_single_threaded(tf.nest.flatten(state)[0].op)
    return state


def _run_single_threaded(loop):
    """Marks the `While` node `loop` (not yet run) to stay a `While` node whose functions run
    by `SINGLE_THREADED_EXECUTOR` (`relaxed_while_loop`). TensorFlow's own while_v2 sets
    `_lower_using_switch_merge` the same way (`op._set_attr`, leaving a loop unlowered under XLA
    or when an eager context runs functions by that executor); there is no public API for it."""
    if loop.type not in ("While", "StatelessWhile"):
        raise TypeError(f"expected the outputs of a While node, got a {loop.type} node ({loop.name})")
    loop._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))
    for name in ("body", "cond"):
        function = loop.get_attr(name)  # NameAttrList: the function and the attributes of its calls
        function.attr["_executor"].s = SINGLE_THREADED_EXECUTOR.encode()
        loop._set_attr(name, attr_value_pb2.AttrValue(func=function))


# The search graph is plain python around explicit loops and branches (`while_loop`,
# `cond`, `switch`): its python `if`s and `for`s test python values only, so autograph,
# which rewrites each function a `tf.function` traces and wraps every call in
# `converted_call`, changes nothing in it but the time the trace takes. Our
# `tf.function`s trace it with `autograph=False`, and the graph entry points below
# (`Searcher.search`, `search_xla`, `Translator.translate_graph`, ...) are marked
# `not_converted`, so that a caller's own `tf.function` (autograph on by default) runs
# them unconverted too: the same graph, op for op, traced faster (a `multi30k`-shape
# export in 16.3-19.0 s instead of 28.4-28.5; docs/lab-notebook, "Tracing without autograph").
not_converted = tf.autograph.experimental.do_not_convert


# The loop ops of the plain TensorFlow graph (`Searcher.search`): one `tf.gather` and one
# `tf.where` node for each of the search's gathers and nonzeros, and a `while_loop` whose
# shapes may change (`DropFinished`, self-attention caches grown per step).
def tf_uniform(shape, seed, step):
    """`LoopOps.uniform` in a TensorFlow graph: stateless noise in (0, 1) from ``(seed, step)``."""
    return tf.random.stateless_uniform(shape, seed=tf.stack([tf.cast(seed, tf.int32), tf.cast(step, tf.int32)]),
                                       minval=1e-7, maxval=1.0)


TF_GRAPH_OPS = LoopOps(while_loop=relaxed_while_loop, gather=tf_gather, nonzero=tf_nonzero, uniform=tf_uniform)
# The static buffer's loop (LiteRT's single sentence): keras.ops' own, with TensorFlow's noise for sampling.
STATIC_BUFFER_OPS = LoopOps(uniform=tf_uniform)
# ... and the same with the loop's body run by TensorFlow's single-threaded executor.
SINGLE_THREADED_GRAPH_OPS = dataclasses.replace(
    TF_GRAPH_OPS, while_loop=functools.partial(relaxed_while_loop, single_threaded=True))
# The loop ops of the XLA-compiled search (`Searcher.compiled_search`): its body traced once
# for all its copies (`LoopOps.trace_once`), and each beam's best tokens taken from the logits
# before only those are normalized (`LoopOps.normalize_after_top_k`).
XLA_OPS = LoopOps(gather=tf_gather, trace_once=functools.partial(tf.function, autograph=False, reduce_retracing=True),
                  normalize_after_top_k=True, uniform=tf_uniform)


@dataclasses.dataclass(frozen=True)
class RequestLoop:
    """One loop of the plain graph's search on buffers sized to the request
    (`RequestSized`): the kernels its step runs and what happens to its finished
    sentences.

    Args:
        small_kernels: the attentions' products (`DecoderBlock`): "always" (the
            broadcast products alone, no choice in a step), True (each attention
            picks oneDNN's batched matmuls or the broadcast products by the size of
            its product: a `cond` per attention per step) or False (the layers' own).
        kernels: None, or the step's `StepKernels` (`Transformer.decode`).
        finished: `KeepAll()` or `DropFinished()` (`SearchLoop.finished`).
        single_threaded: the loop's body runs by TensorFlow's single-threaded executor
            (`relaxed_while_loop(single_threaded=True)`, where the `Searcher`'s
            `single_threaded_loop` allows it), which runs no control flow: only for a
            body with no `cond` (`small_kernels` "always", `KeepAll`).
    """

    small_kernels: typing.Union[bool, str]
    kernels: typing.Optional[StepKernels]
    finished: typing.Union[KeepAll, DropFinished]
    single_threaded: bool = False

    def __post_init__(self):
        if self.small_kernels not in ("always", True, False):
            raise ValueError(f"RequestLoop.small_kernels must be 'always', True or False, got {self.small_kernels!r}")
        if not isinstance(self.finished, (KeepAll, DropFinished)):
            raise TypeError(f"RequestLoop.finished must be KeepAll() or DropFinished(), got {self.finished!r}")
        if self.single_threaded and (self.small_kernels != "always" or not isinstance(self.finished, KeepAll)):
            raise ValueError("a single-threaded loop runs no cond: it needs small_kernels='always' and KeepAll(), "
                             f"got {self.small_kernels!r} and {self.finished!r}")


# The small-request loop: the broadcast products alone (the projections as `BatchMatMulV3`:
# `SMALL_REQUEST_KERNELS`), and every sentence kept to the end: its rows are few and a step's
# cost is its nodes, which the drop's bookkeeping adds to (`benchmarks/step_nodes.py`: 521.6 ->
# 477.4 nodes a batch-1 step), and its body, with no branch in it, runs by the single-threaded
# executor (`Searcher(single_threaded_loop=...)`).
SMALL_REQUEST_LOOP = RequestLoop("always", SMALL_REQUEST_KERNELS, KeepAll(), single_threaded=True)
# The other loop: the kernels chosen per attention, finished sentences dropped, TensorFlow's
# default executor, which runs a step's independent nodes side by side (a batch-32 search took
# 1.19x the time with the single-threaded one; docs/lab-notebook, serving speed part 34).
LARGE_REQUEST_LOOP = RequestLoop(True, LARGE_REQUEST_KERNELS, DropFinished())
# LiteRT's loop for a batch: the layers' own kernels, finished sentences dropped (`LITERT_BATCH`).
LITERT_BATCH_LOOP = RequestLoop(False, None, DropFinished())


@dataclasses.dataclass(frozen=True)
class RequestSized:
    """`Searcher.search(buffer=...)`: the plain TensorFlow graph's buffers, sized to each
    request (`max(max_lengths)` positions; self-attention caches grown by one position a
    step).

    Args:
        large: the `RequestLoop` a request runs.
        small: None, or the `RequestLoop` a request runs instead when every attention
            product it can reach is small (`broadcast_products_suffice`): the graph then
            holds both loops, and a `cond` runs one.
    """

    large: RequestLoop = LARGE_REQUEST_LOOP
    small: typing.Optional[RequestLoop] = SMALL_REQUEST_LOOP


@dataclasses.dataclass(frozen=True)
class StaticBuffer:
    """`Searcher.search(buffer=...)`: static shapes, as LiteRT needs: buffers of
    `max_decode_length` positions, self-attention caches grown between cache `stages`
    (`CacheStages`), every sentence kept to the end (`KeepAll`), `KERAS_OPS`."""

    stages: typing.Tuple[int, ...] = CACHE_STAGES


REQUEST_SIZED = RequestSized()  # serving_default's and translate_options' search
LITERT_BATCH = RequestSized(large=LITERT_BATCH_LOOP, small=None)  # translate_litert's for a batch
STATIC_BUFFER = StaticBuffer()  # translate_litert's for one sentence


def _check_options(options, where):
    """A `TypeError` naming what `where` got where it takes a `SearchOptions`."""
    if not isinstance(options, SearchOptions):
        raise TypeError(f"{where} takes a SearchOptions, got {options!r}")


def _xla_constraints(options):
    """The constraints of `options` that `Searcher.compiled_search` compiles into its
    program: `{name: python value}` of the options table's processors marked `xla`; a
    `ValueError` for what the XLA search does not take (sampling, run-time constraints, a
    processor of the plain graph only that is on, `exact_results`, a run-time beam size)."""
    _check_options(options, "the XLA search")
    if options.samples:
        raise ValueError("sampling runs in the plain graph (xla=False)")
    compiled = {option.name: getattr(options, option.name) for option in OPTIONS
                if option.processor is not None and option.xla}
    if not all(isinstance(value, (int, bool)) for value in compiled.values()):
        names = list(compiled)
        raise ValueError(f"the XLA search takes {', '.join(names[:-1])} and {names[-1]} as python values; run-time "
                         "ones are for the plain graph (translate_advanced)")
    for option in OPTIONS:
        if option.processor is not None and not option.xla and option_on(option, getattr(options, option.name)):
            raise ValueError(f"{option.name} runs in the plain graph (xla=False)")
    if options.exact_results is not None or options.max_beam_size is not None:
        raise ValueError("exact_results and a run-time beam size are for the plain graph's search "
                         "(translate_options); the XLA search's are python ints")
    return compiled


class Searcher:
    """The model's beam search from source ids to translation ids (plain graph or XLA).

    Args:
        model: a `keras.Model` from `build_transformer(config)`.
        config: its `TransformerConfig` (max_length, the +50 rule).
        logits_filter: None, or a function `logits [rows, vocab] -> logits`
            applied to the decoder's output at every step before the search
            scores it (e.g. `NEG_INF` on tokens that must never be produced,
            or a probe that counts the rows each step runs). It is traced without
            autograph (`not_converted`): a branch on a tensor must be a tensor op.
        output_kernel: None, or a stored `[d_model, vocab]` copy of the output
            projection's matrix (a `tf.Variable` holding `decoder.output_kernel()`,
            which the export makes once: `TranslationModule`), read by every search
            instead of the embeddings' transpose that each call otherwise makes
            before its loop (a single sentence through the export's `translate_xla`
            took 0.87-0.89x the time on the 10,000-piece preset: docs/lab-notebook,
            serving speed part 25).
            Only for weights that no longer change: a copy does not follow training.
        single_threaded_loop: the plain graph's small-request loop (`search`) runs by
            TensorFlow's single-threaded executor (`relaxed_while_loop(single_threaded=True)`:
            a batch-1 search of the `multi30k` preset's model in 0.76x the time). False
            lowers it into the caller's graph as the other loop is, where a TF1 session's
            step stats show each of its nodes (`benchmarks/step_nodes.py`); the same
            ids, and the same scores up to float32 rounding (Grappler folds constants
            into a lowered loop's nodes, not into a function's).

    Example:
        >>> searcher = Searcher(model, config)
        >>> options = SearchOptions(beam_size=4, alpha=0.6, num_results=1, extra_length=50)
        >>> ids, scores = searcher.search(source_ids, source_lengths, options)
    """

    def __init__(self, model, config: TransformerConfig, logits_filter=None, output_kernel=None,
                 single_threaded_loop=True):
        self.config = config
        self.single_threaded_loop = single_threaded_loop
        self.decoder = IncrementalDecoder(model, config)
        self.logits_filter = logits_filter
        self.output_kernel = output_kernel
        # Largest buffer of the search: the longest source plus the paper's +50.
        self.max_decode_length = config.max_length + config.decode_extra_length
        self.length_buckets = length_buckets(config.max_length)
        self._compiled = {}

    @not_converted
    def search(self, source_ids, source_lengths, options, *, buffer=REQUEST_SIZED, source_features=None,
               static_cache=None, target_prefix=None):
        """Beam search over the decoder, `max_lengths = source_lengths + options.extra_length`.

        Args:
            options: the `SearchOptions` (`extra_length` None: the config's
                `decode_extra_length`; any is clipped to `[0, decode_extra_length]`,
                the most the buffers were made for). Its `beam_size` and
                `num_results` may be int32 scalar tensors with `max_beam_size`: one
                graph for every beam size up to it (the SavedModel's
                `translate_options`).
            buffer: `REQUEST_SIZED` (graphs run by TensorFlow without XLA: the
                SavedModel's `serving_default`, `translate_options`): the search
                does only the work each sentence needs. The self-attention caches
                grow by one position per step (concatenation: a step costs in
                proportion to its position, not to the buffer), finished sentences
                leave the loop (`DropFinished`: the step runs on the sentences
                still searched), and the sequence buffers hold `max(max_lengths)`
                positions, the most this request can generate; a request whose
                every attention product is small (`broadcast_products_suffice`,
                e.g. one sentence on the Multi30k model) runs `SMALL_REQUEST_LOOP`
                instead (see `_request_sized_search`).
                `LITERT_BATCH` (`search_litert`'s for a batch): the loop that drops
                finished sentences alone (`LITERT_BATCH_LOOP`), with the layers' own
                kernels (`Dense`'s projections, the attentions' einsums) and no
                choice per call: no small-request loop, no `cond` in a step. In
                LiteRT a batch of 32 took 0.90x (0.84-1.16) the time of the search
                with both loops and their kernels (docs/lab-notebook, serving speed
                part 38).
                `STATIC_BUFFER`: static shapes, as LiteRT needs: the sequence
                buffers hold `max_decode_length` positions, the self-attention
                caches grow in `CACHE_STAGES` (16, 32, 64, then `max_decode_length`
                positions: one loop per stage, each on buffers of its size), and
                every sentence stays in the loop until the whole batch is done.
                All give the same translations.
            source_features: the syntax-aware model's extra encoder inputs.
            static_cache: None, or `decoder.static_cache(source_ids, source_features)`
                computed by the caller (`search_litert`: one encoder for its two
                searches).
            target_prefix: None, or `(ids [batch, P], lengths [batch])`: the tokens each
                translation starts with (`beam_search`'s `target_prefix`).
        Returns:
            ids int32 `[batch, num_results, L]` (EOS, then PAD), with `L`
            the buffer size above, and scores float32 `[batch, num_results]`.
        """
        _check_options(options, "Searcher.search")
        max_lengths = source_lengths + self._clip_extra_length(options.extra_length)  # [batch]
        static = self.decoder.static_cache(source_ids, source_features) if static_cache is None else static_cache
        if isinstance(buffer, StaticBuffer):
            batch = tf.shape(source_ids)[0]
            cache = self.decoder.initial_self_attention_cache(batch, 0)
            loop = SearchLoop(STATIC_BUFFER_OPS, stages=CacheStages(buffer.stages, self.decoder.resize_self_attention_cache))
            return beam_search(self._step_fn(grow=False), cache, batch, max_lengths, options, loop=loop,
                               static_cache=static, max_decode_length=self.max_decode_length,
                               target_prefix=target_prefix)
        return self._request_sized_search(source_ids, max_lengths, static, options, buffer, target_prefix)

    def _request_sized_search(self, source_ids, max_lengths, static, options, buffer, target_prefix=None):
        """`search(buffer=...)` on buffers sized to the request (a `RequestSized`)."""
        batch = tf.shape(source_ids)[0]
        buffer_length = tf.clip_by_value(tf.reduce_max(tf.concat([max_lengths, [1]], axis=0)),
                                         1, self.max_decode_length)  # int32 scalar
        cache = self.decoder.initial_self_attention_cache(batch, 0)

        def search(request_loop):
            step_fn = self._step_fn(grow=True, small_kernels=request_loop.small_kernels, kernels=request_loop.kernels)
            single_threaded = request_loop.single_threaded and self.single_threaded_loop
            loop = SearchLoop(SINGLE_THREADED_GRAPH_OPS if single_threaded else TF_GRAPH_OPS, request_loop.finished)
            return beam_search(step_fn, cache, batch, max_lengths, options, loop=loop, static_cache=static,
                               max_decode_length=buffer_length, target_prefix=target_prefix)

        # Each attention of a step picks oneDNN's batched matmuls or broadcast products
        # by the size of its product (`MultiHeadAttention(small_kernels=True)`), a `cond`
        # per attention per step. The largest product this request can reach is
        # rows x d_model x keys (rows = batch x beam; keys: at most `buffer_length`
        # cached positions, or the source width): when even that is within
        # `SMALL_ATTENTION`, every call would pick the broadcast products, and a loop
        # traced with them alone (`SMALL_REQUEST_LOOP`) runs the same kernels with no cond
        # (e.g. batch 1 on the Multi30k model). The graph holds both loops; one runs.
        if buffer.small is None:
            return search(buffer.large)
        keys = tf.maximum(buffer_length, tf.shape(source_ids)[1])
        return tf.cond(broadcast_products_suffice(batch * options.beam_size, self.config.d_model, keys),
                       lambda: search(buffer.small), lambda: search(buffer.large))

    @not_converted
    def search_litert(self, source_ids, source_lengths, options):
        """The search of the LiteRT signature: `search`'s ids and scores (`options`: a
        `SearchOptions`), the ids padded to `max_decode_length` positions
        (`[batch, num_results, max_decode_length]`, the static width LiteRT's
        detokenizing needs).

        Both searches convert to LiteRT builtins, and each is the faster there where it
        is used: more than one sentence runs the loop that drops finished sentences
        (`search(buffer=LITERT_BATCH)`: caches grown per step; LiteRT's WHILE takes loop
        variables whose shapes change), a batch of 32 in 0.37x the time of the static
        buffer's (0.33-0.40); a single sentence runs the static buffer's
        (`buffer=STATIC_BUFFER`: shapes fixed within each cache stage), where the other
        took 1.15x its time (0.91-1.32; docs/lab-notebook, serving speed part 38). The
        encoder runs once, before the choice. Same translations.
        """
        encoded = self.decoder.static_cache(source_ids)  # the encoder, outside the cond

        def request_sized():
            ids, scores = self.search(source_ids, source_lengths, options, buffer=LITERT_BATCH, static_cache=encoded)
            return tf.pad(ids, [[0, 0], [0, 0], [0, self.max_decode_length - tf.shape(ids)[2]]],
                          constant_values=PAD_ID), scores  # [batch, n, width] -> [batch, n, L]

        def static():
            return self.search(source_ids, source_lengths, options, buffer=STATIC_BUFFER, static_cache=encoded)

        ids, scores = tf.cond(tf.shape(source_ids)[0] > 1, request_sized, static)
        # The shapes again after the cond: without these reshapes, the converted model's
        # `score` output for a single sentence had shape () instead of [1] (ai-edge-litert).
        return (tf.reshape(ids, [-1, options.num_results, self.max_decode_length]),  # [batch, n, L]
                tf.reshape(scores, [-1, options.num_results]))  # [batch, n]

    def _step_fn(self, grow, small_kernels=None, fold_projection=False, kernels=None):
        """The decoder's step function for `beam_search(static_cache=...)`, with `logits_filter`
        (`small_kernels`: None, `grow`'s choice, or the attentions', see `DecoderBlock`;
        `kernels`: None or the step's `StepKernels`, see `Transformer.decode`).

        The output projection's matrix is the stored copy (`output_kernel`) or is
        transposed here, once, before the loop (the step function closes over it; a
        loop-invariant input of the loop). With `fold_projection` (XLA only) the step
        multiplies by the embeddings as stored instead: XLA folds the transpose into
        the dot (`XLA_FOLDED_PROJECTION_BYTES`)."""
        if fold_projection:
            output_kernel = None
        elif self.output_kernel is not None:
            output_kernel = tf.convert_to_tensor(self.output_kernel)  # [d_model, vocab]: one read, no copy
        else:
            output_kernel = self.decoder.output_kernel()  # [d_model, vocab]

        def step_fn(ids, cache, step, static_cache):
            logits, cache = self.decoder.step(ids, cache, step, static_cache, grow=grow,
                                              output_kernel=output_kernel, small_kernels=small_kernels,
                                              kernels=kernels)
            return (logits if self.logits_filter is None else self.logits_filter(logits)), cache

        return step_fn

    def _clip_extra_length(self, extra_length):
        """int32 scalar in `[0, decode_extra_length]`, the most the buffers were made for
        (None: `decode_extra_length`)."""
        extra_length = self.config.decode_extra_length if extra_length is None else extra_length
        return tf.clip_by_value(tf.cast(extra_length, tf.int32), 0, self.config.decode_extra_length)

    def compiled_search(self, options, batch_halvings=XLA_BATCH_HALVINGS, fold_projection=False):
        """The XLA-compiled search: `(source_ids [b, S], max_lengths [b], alpha, patience) -> (ids, scores)`.

        `options`: a `SearchOptions` whose `beam_size`, `num_results` and constraints
        (the processors' options the options table marks `xla`) are python values, compiled
        into the program (its `alpha`, `patience` and `extra_length` are the function's
        inputs, `search_xla`'s). One `tf.function(jit_compile=True)` per `(beam_size,
        num_results, batch_halvings, fold_projection, constraints)` (`fold_projection`: see
        `_step_fn`);
        XLA compiles one program per `(b, S)`. The buffer holds
        `S - 1 + decode_extra_length` positions (a constant for XLA, which
        sees the shape of `source_ids`): the longest source `S` can hold
        (`S - 1` tokens, then EOS) plus the most extra length a request may ask.

        The loop's body (the decoder step and the search's bookkeeping for it) is a
        `tf.function` of its own, traced once and called by every copy of it in the
        program (each cache stage, each batch halving: 13 with 3 halvings), whose
        shapes differ only in sizes unknown when tracing; so is the step inside it.
        XLA inlines the calls and compiles each copy at its own sizes, as before
        (the same optimized program, results and run time); the graph holds one body
        instead of 13 (docs/lab-notebook, serving speed parts 32 and 33).
        """
        constraints = _xla_constraints(options)
        beam_size, num_results = options.beam_size, options.num_results
        key = (beam_size, num_results, batch_halvings, fold_projection) + (
            (tuple(constraints.values()),) if any(option_on(BY_NAME[name], value) for name, value in
                                                  constraints.items()) else ())  # (none on: the key as before)
        if key not in self._compiled:
            extra = self.config.decode_extra_length
            stages = CacheStages(CACHE_STAGES, self.decoder.resize_self_attention_cache,
                                 min_decode_length=self.length_buckets[0] - 1 + extra)
            loop = SearchLoop(XLA_OPS, Halvings(batch_halvings) if batch_halvings else KeepAll(), stages)

            def search(source_ids, max_lengths, alpha, patience):
                batch = tf.shape(source_ids)[0]
                buffer_length = tf.shape(source_ids)[1] - 1 + extra
                static = self.decoder.static_cache(source_ids)
                cache = self.decoder.initial_self_attention_cache(batch, 0)
                step_fn = XLA_OPS.trace_once(self._step_fn(grow=False, fold_projection=fold_projection))
                options = SearchOptions(beam_size=beam_size, alpha=alpha, num_results=num_results, patience=patience,
                                        **constraints)
                return beam_search(step_fn, cache, batch, max_lengths, options, loop=loop, static_cache=static,
                                   max_decode_length=buffer_length)

            self._compiled[key] = tf.function(search, jit_compile=True, autograph=False, input_signature=[
                tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32),
                tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32)])
        return self._compiled[key]

    def folds_projection_at_batch_one(self):
        """Whether the XLA search's batch-1 program multiplies by the embeddings as stored
        (their matrix holds at least `XLA_FOLDED_PROJECTION_BYTES`; see `_step_fn`)."""
        itemsize = tf.as_dtype(self.decoder.model.compute_dtype).size
        return self.config.vocab_size * self.config.d_model * itemsize >= XLA_FOLDED_PROJECTION_BYTES

    def bucketed_shape(self, batch, width):
        """`bucketed_shape(batch, width, self.length_buckets)`."""
        return bucketed_shape(batch, width, self.length_buckets)

    @not_converted
    def search_xla(self, source_ids, source_lengths, options, batch_halvings=XLA_BATCH_HALVINGS):
        """`search` through the XLA-compiled function, on inputs padded to a bucket.

        `options`: a `SearchOptions` as `compiled_search` takes it (`alpha`, `patience`
        and `extra_length` python values or scalar tensors). Padded source columns are
        PAD (masked by the encoder and cross-attention); padded rows are an empty source
        (EOS) with a limit of one token, so they finish at the first step. Same results
        as `search`; the ids have `bucket_width - 1 + decode_extra_length` positions.
        """
        _xla_constraints(options)  # (a ValueError before any tracing)
        extra_length = self._clip_extra_length(options.extra_length)
        batch, width = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
        padded_batch, padded_width = self.bucketed_shape(batch, width)
        source = tf.pad(source_ids, [[0, padded_batch - batch], [0, padded_width - width]],
                        constant_values=PAD_ID)  # [padded_batch, padded_width]
        padding_rows = tf.range(padded_batch) >= batch  # [padded_batch]
        first_column = tf.range(padded_width) == 0  # [padded_width]
        source = tf.where(tf.logical_and(padding_rows[:, None], first_column[None, :]), EOS_ID, source)
        max_lengths = tf.concat([source_lengths + extra_length,
                                 tf.ones([padded_batch - batch], tf.int32)], axis=0)  # [padded_batch]
        patience = tf.constant(0.0) if options.patience is None else tf.cast(options.patience, tf.float32)
        alpha = tf.cast(options.alpha, tf.float32)

        def run(halvings, fold_projection=False):
            search = self.compiled_search(options, halvings, fold_projection)
            return search(source, max_lengths, alpha, patience)

        fold = self.folds_projection_at_batch_one()
        if batch_halvings or fold:
            # A batch bucket of one sentence cannot shrink: its program is compiled without
            # the halvings, which there are identical copies of the step (a batch-1 program
            # compiled in 5.3 instead of 9.6 s; docs/lab-notebook, serving speed part 16); and
            # a large output matrix is read as stored there (`XLA_FOLDED_PROJECTION_BYTES`).
            ids, scores = tf.cond(padded_batch > 1, lambda: run(batch_halvings), lambda: run(0, fold))
        else:
            ids, scores = run(0)
        return ids[:batch], scores[:batch]
