"""Profile of one decoder step of the served beam search (TensorFlow, no XLA).

    python benchmarks/profile_step.py                                  # base, vocab 32000
    python benchmarks/profile_step.py --preset tiny --vocab-size 8000

The search is the served one: `Translator.search` (request-sized buffer,
`static_buffer=False`) in a `tf.function` without `jit_compile`, with the
serving signature's dynamic shapes, on a model of the preset's shape with
random weights and a batch of random source ids (`--buffer - extra` text
tokens then EOS, so the buffer holds `--buffer` positions). EOS is made
impossible (the step function's EOS logit is set to NEG_INF, as in
tests/test_export.py), so every search runs exactly `--buffer` steps and
time per step = wall time / `--buffer`. The tokenizer plays no part in
`search`; the `Translator` is made without one.

What it prints:

1. ops in the while loop's body: the node count of the body FunctionDef of
   the traced graph (before Grappler), by op type;
2. seconds per step of the whole search (median over `--runs` runs);
3. a `tf.profiler.experimental` trace of one search (to `--logdir`), read
   back with the profiler's own `framework_op_stats` tool: self time per
   step by op type (loop body only), and by component. The components come
   from name scopes added for this run only (same ops): `write_cache`
   (the package's write into the self-attention caches), `reorder_cache`
   (`_gather_flat_beams` on every cache leaf), the decoder's layers (by
   their Keras name scopes), the EOS mask of this benchmark, and the
   search's bookkeeping (everything else in the loop). Self times of ops
   that run concurrently (2 inter-op threads) add up to more than the wall
   time, and contend for memory bandwidth: read the fractions, not the sum;
4. the same split measured without the profiler, each part timed alone in a
   `tf.while_loop` of `--steps` iterations: (a) the step function (decoder
   with cache, `write_cache` included), (b) the cache reorder, (c)
   `write_cache` for all layers, (d) the bookkeeping: `beam_search` with a
   step function returning fixed logits and no cache (whole searches of
   `--buffer` steps), (e) the decoder's matmuls alone for batch*beam rows
   (Q/K/V/O, cross-attention Q/O, FFN, logits): the FLOP lower bound;
5. alternatives, swapped in for this script only (never in the package)
   and timed in the whole search, interleaved with the baseline in every
   round (the order rotates between rounds): the one-hot placement einsum +
   `where` blend (write_cache as of issue #8; the package's own
   write_cache is the baseline, whatever it is), writing the cache with
   `tf.tensor_scatter_nd_update` (`keras.ops.scatter_update`), with a
   broadcast `where` (no one-hot einsum), with `concat` of slices, or with
   `keras.ops.slice_update` (XlaDynamicUpdateSlice on the TensorFlow
   backend); reordering all caches with one gather on a stacked
   `[layers * 2, ...]` tensor; and keeping the caches heads-first,
   `[batch, heads, L, head_size]`, so that the attention matmuls need no
   transpose of the cache (Keras' TensorFlow `einsum` for `bqhd,bkhd->bhqk`
   and `bhqk,bkhd->bqhd` transposes its operands, here the whole cache,
   every layer, every step), with the one-hot blend, the broadcast `where`
   or scatter_update. Each is checked to give the baseline's ids and
   scores; a micro-benchmark times write/reorder alone. Section 5 runs only
   with `--variants`: its alternatives patch the cache layout the package
   had until commit d1be566 (`[batch, L, heads, head_size]`), which made
   the heads-first layout they measured the package's own; on later
   commits they fail or measure the wrong thing (kept for the record of
   BENCHMARKS.md's figures).

The machine may be shared: compare ratios measured in the same run. The
last line is `NAME: seconds per step of the baseline search`.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import statistics
import time

os.environ.setdefault("KERAS_TRANSFORMER_QUIET", "1")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base", help="TransformerConfig preset (default: base)")
    parser.add_argument("--vocab-size", type=int, default=32000, help="vocabulary size (default: 32000)")
    parser.add_argument("--batch", type=int, default=32, help="sentences per request (default: 32)")
    parser.add_argument("--beam", type=int, default=4, help="beam size (default: 4)")
    parser.add_argument("--buffer", type=int, default=74,
                        help="search buffer = source tokens + extra (default: 74 = 24 + 50)")
    parser.add_argument("--extra", type=int, default=None,
                        help="extra length (default: the preset's decode_extra_length, 50)")
    parser.add_argument("--threads", type=int, default=2, help="TensorFlow intra/inter-op threads (default: 2)")
    parser.add_argument("--steps", type=int, default=20,
                        help="iterations of each micro-benchmark loop (default: 20, at most --buffer)")
    parser.add_argument("--runs", type=int, default=2,
                        help="timed whole searches per variant, interleaved (default: 2)")
    parser.add_argument("--variants", default="none",
                        help="comma-separated alternatives to time in the search, or 'all' or 'none' "
                             "(default; the alternatives assume the cache layout before commit d1be566)")
    parser.add_argument("--logdir", default="/tmp/profile_step/logdir", help="profiler trace directory")
    parser.add_argument("--top", type=int, default=15, help="rows of the op tables (default: 15)")
    args = parser.parse_args(argv)
    if min(args.batch, args.beam, args.buffer, args.threads, args.steps, args.runs) < 1:
        parser.error("--batch, --beam, --buffer, --threads, --steps and --runs must be >= 1")
    return args


@contextlib.contextmanager
def patched(owner, name, value):
    """Sets `owner.name = value` (`owner[name]` for an int `name`) for the block (the tracing of a graph)."""
    get, put = ((owner.__getitem__, owner.__setitem__) if isinstance(name, int)
                else (lambda n: getattr(owner, n), lambda n, v: setattr(owner, n, v)))
    saved = get(name)
    put(name, value)
    try:
        yield
    finally:
        put(name, saved)


@contextlib.contextmanager
def stderr_silenced():
    """File descriptor 2 to /dev/null (the profiler's C++ start-up lines)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def main(argv=None):
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras
    import numpy as np
    from keras import ops

    from keras_transformer import decoding
    from keras_transformer.config import TransformerConfig
    from keras_transformer.constants import EOS_ID, NEG_INF, PAD_ID
    from keras_transformer.incremental import IncrementalDecoder
    from keras_transformer.layers import attention
    from keras_transformer.model import build_transformer
    from keras_transformer.translator import Translator

    started = time.time()
    config = TransformerConfig.from_preset(args.preset, vocab_size=args.vocab_size)
    extra = config.decode_extra_length if args.extra is None else args.extra
    source_length = args.buffer - extra  # text tokens; EOS follows
    if source_length < 1 or source_length > config.max_length - 1:
        raise SystemExit(f"--buffer {args.buffer} - extra {extra} must be in [1, {config.max_length - 1}]")
    steps = min(args.steps, args.buffer)
    beam, batch, buffer = args.beam, args.batch, args.buffer
    rows = batch * beam
    keras.utils.set_random_seed(0)
    model = build_transformer(config)

    # `search` needs only the model side of a Translator: no tokenizer.
    translator = Translator.__new__(Translator)
    translator.model, translator.config = model, config
    translator.decoder = IncrementalDecoder(model, config)
    translator.max_decode_length = config.max_length + config.decode_extra_length
    translator._functions = {}

    rng = np.random.default_rng(0)
    tokens = rng.integers(EOS_ID + 1, config.vocab_size, size=(batch, source_length))
    source_ids = tf.constant(np.concatenate([tokens, np.full((batch, 1), EOS_ID)], 1), tf.int32)
    lengths = tf.fill([batch], source_length)
    alpha = tf.constant(config.length_penalty_alpha, tf.float32)
    extra_t = tf.constant(extra, tf.int32)
    # Warm-up request: 1 token, extra 0 -> a 1-step search (graph optimisation, allocators).
    warm = (tf.constant([[EOS_ID + 1, EOS_ID]], tf.int32), tf.constant([1], tf.int32), alpha,
            tf.constant(0, tf.int32))
    signature = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32),
                 tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)]

    original_make_step_fn = translator.decoder.make_step_fn

    def make_step_fn_without_eos(scoped):
        def make(source, beam_size):
            step_fn = original_make_step_fn(source, beam_size)

            def masked(ids, cache, step):
                with (tf.name_scope("step_fn") if scoped else contextlib.nullcontext()):
                    logits, cache = step_fn(ids, cache, step)
                with tf.name_scope("eos_mask"):
                    vocab = tf.shape(logits)[-1]
                    return tf.where(tf.range(vocab) == EOS_ID, NEG_INF, logits), cache
            return masked
        return make

    def search_function(eos=True, scoped=False, patches=()):
        """A traced `tf.function` of `translator.search` with `patches` applied while tracing."""
        function = tf.function(
            lambda s, n, a, e: translator.search(s, n, beam, a, e, 1), input_signature=signature)
        with contextlib.ExitStack() as stack:
            for module, name, value in patches:
                stack.enter_context(patched(module, name, value))
            if not eos:
                stack.enter_context(patched(translator.decoder, "make_step_fn",
                                            make_step_fn_without_eos(scoped)))
            concrete = function.get_concrete_function()
        return concrete

    def run_search(concrete, inputs=None):
        ids, scores = concrete(*(inputs or (source_ids, lengths, alpha, extra_t)))
        return ids.numpy(), scores.numpy()

    def timed(function):
        begin = time.perf_counter()
        result = function()
        return time.perf_counter() - begin, result

    load = os.getloadavg()
    print(f"# profile of one beam-search decoder step: {args.preset} (d_model {config.d_model}, "
          f"{config.num_layers}+{config.num_layers} layers, {config.num_heads} heads, d_ff {config.d_ff}), "
          f"vocab {config.vocab_size}, random weights")
    print(f"# batch {batch}, beam {beam} ({rows} rows), source {source_length} tokens + EOS, extra {extra}, "
          f"buffer {buffer}; TF {tf.__version__}, Keras {keras.__version__}, {args.threads} threads, "
          f"{os.cpu_count()} CPU(s), load average {load[0]:.2f}; no XLA\n")

    # -- 1. ops in the while body -------------------------------------------------
    concrete = search_function(eos=True)
    graph_def = concrete.graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}
    loops = [n for n in graph_def.node if n.op in ("While", "StatelessWhile")]
    print(f"## 1. ops in the while body (FunctionDef, before Grappler): {len(loops)} while op(s)")
    for loop in loops:
        body = library[loop.attr["body"].func.name]
        cond = library[loop.attr["cond"].func.name]
        counts = {}
        for node in body.node_def:
            counts[node.op] = counts.get(node.op, 0) + 1
        nested = [n.op for n in body.node_def if n.op in ("While", "StatelessWhile", "If", "StatelessIf",
                                                          "PartitionedCall", "StatefulPartitionedCall")]
        print(f"body {len(body.node_def)} nodes, {len(counts)} op types; cond {len(cond.node_def)} nodes; "
              f"nested calls/loops: {nested or 'none'}\n")
        print("| op type | count |")
        print("|---|---|")
        for op, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:args.top]:
            print(f"| {op} | {count} |")
        rest = sum(sorted(counts.values(), reverse=True)[args.top:])
        print(f"| (other {max(len(counts) - args.top, 0)} types) | {rest} |\n")

    # -- 2. seconds per step of the whole search ---------------------------------------
    # The variants (5.) and the baseline are timed together, interleaved.
    def write_one_hot(cache, update, index):
        """The one-hot placement einsum + `where` blend (write_cache as of issue #8)."""
        positions = ops.arange(ops.shape(cache)[1], dtype="int32")
        targets = ops.cast(index, "int32") + ops.arange(ops.shape(update)[1], dtype="int32")
        placement = ops.cast(ops.equal(ops.expand_dims(positions, 1), ops.expand_dims(targets, 0)),
                             cache.dtype)  # [L, T]
        placed = ops.einsum("st,bthd->bshd", placement, update)
        written = ops.reshape(ops.sum(placement, axis=1), (1, -1, 1, 1))
        return ops.where(written > 0, placed, cache)

    def write_scatter(cache, update, index):
        """`tensor_scatter_nd_update` at rows (b, index + t)."""
        batch_size, length = ops.shape(update)[0], ops.shape(update)[1]
        positions = ops.cast(index, "int32") + ops.arange(length, dtype="int32")  # [T]
        b = ops.broadcast_to(ops.expand_dims(ops.arange(batch_size, dtype="int32"), 1),
                             (batch_size, length))  # [batch, T]
        t = ops.broadcast_to(ops.expand_dims(positions, 0), (batch_size, length))  # [batch, T]
        return ops.scatter_update(cache, ops.stack([b, t], axis=-1), update)  # indices [batch, T, 2]

    def write_where(cache, update, index):
        """One `where` with the update broadcast over the buffer (T == 1 only)."""
        if update.shape[1] != 1:
            return attention_write_cache(cache, update, index)
        positions = ops.arange(ops.shape(cache)[1], dtype="int32")
        written = ops.reshape(positions == ops.cast(index, "int32"), (1, -1, 1, 1))  # [1, L, 1, 1]
        return ops.where(written, update, cache)

    def write_concat(cache, update, index):
        """`concat([cache[:, :index], update, cache[:, index + T:]])`."""
        index = tf.cast(index, tf.int32)
        written = tf.concat([cache[:, :index], update, cache[:, index + tf.shape(update)[1]:]], axis=1)
        return tf.ensure_shape(written, cache.shape)

    def write_slice_update(cache, update, index):
        """`keras.ops.slice_update` (XlaDynamicUpdateSlice on the TensorFlow backend)."""
        zero = ops.convert_to_tensor(0, "int32")
        return ops.slice_update(cache, [zero, ops.cast(index, "int32"), zero, zero], update)

    attention_write_cache = attention.write_cache

    def source_beams(candidates, spec):
        """`_update_alive`'s `source_beam`: the alive beam each new alive beam extends."""
        key = ops.where(candidates["continuing"], candidates["logp"], spec.neg_inf)
        _, idx = ops.top_k(key, spec.beam_size)
        return decoding._gather_per_beam(candidates["beam"], ops.cast(idx, "int32"))  # [batch, k]

    def stacked_gather(leaves, source_beam, k):
        """One gather (axis 1) on the leaves stacked to `[n, batch * k, ...]`."""
        stacked = tf.stack(leaves, axis=0)  # [n, batch * k, ...]
        batch_size = tf.shape(source_beam)[0]
        flat = tf.reshape(source_beam + tf.range(batch_size)[:, None] * k, [-1])  # [batch * k]
        return tf.unstack(tf.gather(stacked, flat, axis=1), num=len(leaves), axis=0)

    original_update_alive = decoding._update_alive

    def update_alive_stacked(candidates, cache, spec):
        alive = original_update_alive(candidates, {}, spec)
        leaves = keras.tree.flatten(cache)
        gathered = stacked_gather(leaves, source_beams(candidates, spec), spec.beam_size)
        return {**alive, "cache": keras.tree.pack_sequence_as(cache, gathered)}

    # A third hot spot the profile shows: the attention einsums over a
    # [batch, L, heads, head_size] cache transpose the whole cache (K and V,
    # every layer, every step; Keras' TensorFlow einsum is transpose +
    # matmul). Variant: caches kept heads-first, [batch, heads, L, head_size]
    # (cross-attention ones transposed once per search), written with
    # scatter_update.
    original_call = attention.MultiHeadAttention.call
    decoder = translator.decoder

    def heads_first(x):
        return ops.transpose(x, (0, 2, 1, 3))  # [batch, T, heads, d] <-> [batch, heads, T, d]

    def write_scatter_heads_first(cache, update, index):
        """scatter_update into `[batch, heads, L, d]` at (b, h, index + t)."""
        shape = ops.shape(update)  # [batch, heads, T, d]
        positions = ops.cast(index, "int32") + ops.arange(shape[2], dtype="int32")
        grid = [ops.broadcast_to(ops.reshape(ops.arange(shape[0], dtype="int32"), (-1, 1, 1)), shape[:3]),
                ops.broadcast_to(ops.reshape(ops.arange(shape[1], dtype="int32"), (1, -1, 1)), shape[:3]),
                ops.broadcast_to(ops.reshape(positions, (1, 1, -1)), shape[:3])]
        return ops.scatter_update(cache, ops.stack(grid, axis=-1), update)

    def write_blend_heads_first(cache, update, index):
        """The package's one-hot blend, on `[batch, heads, L, d]`."""
        positions = ops.arange(ops.shape(cache)[2], dtype="int32")
        targets = ops.cast(index, "int32") + ops.arange(ops.shape(update)[2], dtype="int32")
        placement = ops.cast(ops.expand_dims(positions, 1) == ops.expand_dims(targets, 0), cache.dtype)
        placed = ops.einsum("st,bhtd->bhsd", placement, update)
        written = ops.reshape(ops.sum(placement, axis=1), (1, 1, -1, 1))
        return ops.where(written > 0, placed, cache)

    def write_where_heads_first(cache, update, index):
        """One `where` with the update broadcast over the buffer, on `[batch, heads, L, d]` (T == 1)."""
        if update.shape[2] != 1:
            return write_blend_heads_first(cache, update, index)
        positions = ops.arange(ops.shape(cache)[2], dtype="int32")
        return ops.where(ops.reshape(positions == ops.cast(index, "int32"), (1, 1, -1, 1)), update, cache)

    heads_first_write = [write_scatter_heads_first]

    def call_heads_first(self, query, value=None, attention_mask=None, attention_bias=None,
                         cache=None, cache_index=None, training=None):
        if cache is None:
            return original_call(self, query, value, attention_mask, attention_bias, cache, cache_index,
                                 training)
        q = heads_first(self.split_heads(self.query_dense(query)))  # [batch, heads, T_q, d]
        if cache_index is None:
            k, v = cache  # [batch, heads, S, d]
        else:
            new_k, new_v = (heads_first(t) for t in self.compute_key_value(query if value is None else value))
            k = heads_first_write[0](cache[0], new_k, cache_index)  # [batch, heads, L, d]
            v = heads_first_write[0](cache[1], new_v, cache_index)
            slots = ops.arange(ops.shape(k)[2], dtype="int32")
            query_positions = ops.cast(cache_index, "int32") + ops.arange(ops.shape(q)[2], dtype="int32")
            causal = ops.expand_dims(ops.expand_dims(slots, 0) <= ops.expand_dims(query_positions, 1), 0)
            attention_mask = causal if attention_mask is None else ops.logical_and(attention_mask, causal)
        scores = ops.cast(ops.einsum("bhqd,bhkd->bhqk", q, k), "float32") / float(self.head_size) ** 0.5
        if attention_bias is not None:
            scores = scores + ops.cast(attention_bias, "float32")
        if attention_mask is not None:
            scores = ops.where(ops.expand_dims(ops.cast(attention_mask, "bool"), 1), scores, NEG_INF)
        weights = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        context = heads_first(ops.einsum("bhqk,bhkd->bhqd", weights, v))  # [batch, T_q, heads, d]
        context = ops.reshape(context, (ops.shape(context)[0], ops.shape(context)[1], self.d_model))
        return self.output_dense(context), (k, v)

    def initial_cache_heads_first(batch_size, max_length):
        shape = (batch_size, config.num_heads, max_length, config.head_size)
        return [(ops.zeros(shape), ops.zeros(shape)) for _ in range(config.num_layers)]

    original_cross_caches = decoder.cross_attention_caches
    heads_first_patches = [
        (attention.MultiHeadAttention, "call", call_heads_first),
        (decoder, "initial_self_attention_cache", initial_cache_heads_first),
        (decoder, "cross_attention_caches",
         lambda output: [(heads_first(k), heads_first(v)) for k, v in original_cross_caches(output)]),
    ]

    write_variants = {"one-hot blend": write_one_hot, "scatter": write_scatter, "where": write_where,
                      "concat": write_concat,
                      "slice_update": write_slice_update}
    stacked_patch = (decoding, "_update_alive", update_alive_stacked)
    all_variants = {
        "write: one-hot blend": [(attention, "write_cache", write_one_hot)],
        "write: scatter_update": [(attention, "write_cache", write_scatter)],
        "write: broadcast where": [(attention, "write_cache", write_where)],
        "write: concat of slices": [(attention, "write_cache", write_concat)],
        "write: ops.slice_update": [(attention, "write_cache", write_slice_update)],
        "reorder: one stacked gather": [stacked_patch],
        "caches [batch, heads, L, d], one-hot blend": heads_first_patches + [
            (heads_first_write, 0, write_blend_heads_first)],
        "caches [batch, heads, L, d] + broadcast where": heads_first_patches + [
            (heads_first_write, 0, write_where_heads_first)],
        "caches [batch, heads, L, d] + scatter_update": heads_first_patches,
    }
    if args.variants == "none":
        chosen = {}
    elif args.variants == "all":
        chosen = all_variants
    else:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        chosen = {name: p for name, p in all_variants.items() if any(w in name for w in wanted)}
    BASE = "baseline (package as it is: write_cache, gather per leaf)"
    searches = {BASE: search_function(eos=False)}
    failed = {}
    for name, patches in chosen.items():
        try:
            searches[name] = search_function(eos=False, patches=patches)
            run_search(searches[name], warm)
        except Exception as error:  # e.g. no CPU kernel outside XLA
            searches.pop(name, None)
            failed[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
    run_search(searches[BASE], warm)
    times = {name: [] for name in searches}
    outputs = {}
    names = list(searches)
    for round_index in range(args.runs):  # the order rotates from round to round
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            function = searches[name]
            seconds, outputs[name] = timed(lambda: run_search(function))
            times[name].append(seconds)
    base_ids, base_scores = outputs[BASE]
    generated = (base_ids != PAD_ID).sum(-1)
    assert (generated == buffer).all() and not (base_ids == EOS_ID).any(), "the search did not run `buffer` steps"
    step_seconds = statistics.median(times[BASE]) / buffer
    print(f"## 2. whole search, EOS impossible: {buffer} steps per search, {args.runs} runs")
    print(f"seconds per search {statistics.median(times[BASE]):.3f} (runs: "
          f"{', '.join(f'{t:.3f}' for t in times[BASE])}); seconds per step {step_seconds:.4f}\n")

    # -- 3. profiler: self time per op type and per component ---------------------------
    scoped_patches = [
        (attention, "write_cache", lambda c, u, i: _scoped("write_cache", attention_write_cache, c, u, i)),
        (decoding, "_gather_flat_beams",
         lambda x, b, k: _scoped("reorder_cache", original_gather_flat_beams, x, b, k)),
    ]
    original_gather_flat_beams = decoding._gather_flat_beams

    def _scoped(scope, function, *values):
        with tf.name_scope(scope):
            return function(*values)

    profiled = search_function(eos=False, scoped=True, patches=scoped_patches)
    run_search(profiled, warm)
    shutil.rmtree(args.logdir, ignore_errors=True)
    with stderr_silenced():
        tf.profiler.experimental.start(args.logdir)
    profiled_seconds, _ = timed(lambda: run_search(profiled))
    with stderr_silenced():
        tf.profiler.experimental.stop()
    print(f"## 3. profiler (tf.profiler.experimental, framework_op_stats), one search: "
          f"{profiled_seconds:.3f} s profiled = {profiled_seconds / buffer:.4f} s per step")
    table = framework_op_stats(args.logdir)
    if table is None:
        print("no framework_op_stats table could be read from the trace\n")
    else:
        print_profile(table, buffer, args.top)

    # -- 4. components timed alone (no profiler) --------------------------------------
    micro = Micro(tf, ops, keras, decoding, translator, config, source_ids, beam, buffer, steps, rows)
    components = {
        "(a) step function (decoder with cache, write_cache included)": micro.step_function(),
        "(b) cache reorder (_gather_flat_beams per leaf)": micro.reorder(stacked=False),
        "(c) write_cache (package), all layers, part of (a)": micro.write(attention_write_cache),
        "(d) search bookkeeping (beam_search with fixed logits, no cache)": micro.bookkeeping(alpha),
        "(e) decoder matmuls alone (FLOP lower bound), part of (a)": micro.matmuls(),
    }
    parts = sum(seconds for name, seconds in components.items() if "part of" not in name)
    print(f"## 4. components timed alone, {steps} iterations each ((d): whole searches), median of 3 "
          f"(whole step {step_seconds:.4f} s)\n")
    print("| component | s per step | fraction of the step |")
    print("|---|---|---|")
    for name, seconds in components.items():
        print(f"| {name} | {seconds:.4f} | {seconds / step_seconds:.2f} |")
    print(f"| (a) + (b) + (d) | {parts:.4f} | {parts / step_seconds:.2f} |")
    flops = micro.flops
    print(f"\n(e): {flops / 1e9:.2f} GFLOP per step, "
          f"{flops / components['(e) decoder matmuls alone (FLOP lower bound), part of (a)'] / 1e9:.1f} GFLOP/s; "
          f"self-attention cache: {2 * config.num_layers} tensors of "
          f"{rows * buffer * config.d_model * 4 / 2**20:.1f} MiB\n")

    # -- 5. alternatives -----------------------------------------------------------------
    if not chosen:
        print(f"\n# {time.time() - started:.0f} s in all; load average {os.getloadavg()[0]:.2f} at the end")
        print(f"{args.preset}_seconds_per_step: {step_seconds:.4f}")
        return
    print(f"## 5. alternatives: write and reorder alone ({steps} iterations, median of 3)\n")
    print("| variant | s per step | ratio to the package's write_cache / gather per leaf |")
    print("|---|---|---|")
    base_write = components["(c) write_cache (package), all layers, part of (a)"]
    print(f"| write: package write_cache | {base_write:.4f} | 1.00 |")
    for name, function in write_variants.items():
        try:
            seconds = micro.write(function)
            print(f"| write: {name} | {seconds:.4f} | {seconds / base_write:.2f} |")
        except Exception as error:
            print(f"| write: {name} | failed: {type(error).__name__} | |")
    base_reorder = components["(b) cache reorder (_gather_flat_beams per leaf)"]
    print(f"| reorder: gather per leaf (package) | {base_reorder:.4f} | 1.00 |")
    for label, mode in (("stack + one gather + unstack", "stacked"),
                        ("one gather on a pre-stacked tensor (upper bound)", "prestacked")):
        seconds = micro.reorder(stacked=mode, gather=stacked_gather)
        print(f"| reorder: {label} | {seconds:.4f} | {seconds / base_reorder:.2f} |")

    print(f"\n## 5. alternatives in the whole search ({args.runs} interleaved runs; ratio = median of "
          f"per-run ratios to the baseline; < 1 is faster)\n")
    print("| variant | s per step | ratio | same ids and scores as baseline |")
    print("|---|---|---|---|")
    for name in searches:
        ratio = statistics.median(t / b for t, b in zip(times[name], times[BASE]))
        ids, scores = outputs[name]
        same = np.array_equal(ids, base_ids) and np.allclose(scores, base_scores, atol=1e-4)
        print(f"| {name} | {statistics.median(times[name]) / buffer:.4f} | {ratio:.2f} | "
              f"{'yes' if same else 'NO'} |")
    for name, error in failed.items():
        print(f"| {name} | failed: {error} | | |")
    print(f"\n# {time.time() - started:.0f} s in all; load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{args.preset}_seconds_per_step: {step_seconds:.4f}")


def framework_op_stats(logdir):
    """The profiler's framework_op_stats table of the trace in `logdir`: a list of row dicts."""
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)[-1:]
    if not paths:
        return None
    data, ok = _pywrap_profiler_plugin.xspace_to_tools_data(paths, "framework_op_stats", {})
    if not ok:
        return None
    table = json.loads(data)[0]
    columns = [c["id"] for c in table["cols"]]
    return [dict(zip(columns, (cell["v"] for cell in row["c"]))) for row in table["rows"]]


def component_of(name):
    """The component of a loop op, from the name scopes of the profiled graph."""
    import re

    for scope, label in (("eos_mask", "EOS mask (this benchmark only)"), ("write_cache", "write_cache"),
                         ("reorder_cache", "cache reorder")):
        if f"/{scope}" in name or name.startswith(scope):
            return label
    if "/step_fn/" in name:
        for scope, label in (("self_attention", "decoder: self-attention (without write_cache)"),
                             ("cross_attention", "decoder: cross-attention"),
                             ("feed_forward", "decoder: feed-forward"),
                             ("embedding", "decoder: embedding and logits")):
            if re.search(rf"/{scope}(_\d+)?/", name):
                return label
        return "decoder: rest (layer norms, residuals)"
    return "search bookkeeping"


def print_profile(table, steps, top):
    import re

    in_loop = re.compile(r"(^|/)while/(body|cond)/")
    loop = [r for r in table if r["type"] != "IDLE" and in_loop.search(r["operation"])]
    outside = sum(r["total_self_time"] for r in table if r["type"] != "IDLE" and r not in loop)
    total = sum(r["total_self_time"] for r in loop)
    by_type, by_component = {}, {}
    for r in loop:
        kind = by_type.setdefault(r["type"], [0.0, 0])
        kind[0] += r["total_self_time"]
        kind[1] += r["occurrences"]
        label = component_of(r["operation"])
        by_component[label] = by_component.get(label, 0.0) + r["total_self_time"]
    print(f"loop ops' self time: {total / steps / 1e6:.4f} s per step ({len(loop)} distinct ops); "
          f"outside the loop (encoder, setup, results): {outside / 1e6:.3f} s per search\n")
    print("| component | s per step | fraction |")
    print("|---|---|---|")
    for label, us in sorted(by_component.items(), key=lambda item: -item[1]):
        print(f"| {label} | {us / steps / 1e6:.4f} | {us / total:.2f} |")
    print("\n| op type | ops per step | s per step | fraction |")
    print("|---|---|---|---|")
    for kind, (us, count) in sorted(by_type.items(), key=lambda item: -item[1][0])[:top]:
        print(f"| {kind} | {count / steps:.0f} | {us / steps / 1e6:.4f} | {us / total:.2f} |")
    print()


class Micro:
    """Parts of a step timed alone, each in a `tf.while_loop` of `steps` iterations."""

    def __init__(self, tf, ops, keras, decoding, translator, config, source_ids, beam, buffer, steps, rows):
        self.tf, self.ops, self.keras, self.decoding = tf, ops, keras, decoding
        self.translator, self.config, self.source_ids = translator, config, source_ids
        self.beam, self.buffer, self.steps, self.rows = beam, buffer, steps, rows
        self.batch = int(source_ids.shape[0])
        shape = (rows, config.num_heads, buffer, config.head_size)  # the package's cache layout
        self.leaves = [tf.random.normal(shape) for _ in range(2 * config.num_layers)]
        rng = tf.random.Generator.from_seed(1)
        self.source_beam = rng.uniform((self.batch, beam), 0, beam, dtype=tf.int32)
        d, f, v, n = config.d_model, config.d_ff, config.vocab_size, config.num_layers
        self.flops = 2 * rows * (n * (6 * d * d + 2 * d * f) + d * v)

    def _time(self, function):
        function()  # trace and warm up
        runs = []
        for _ in range(3):
            begin = time.perf_counter()
            self.tf.nest.map_structure(lambda t: t.numpy(), function())
            runs.append(time.perf_counter() - begin)
        return statistics.median(runs) / self.steps

    def _loop(self, body, state, count=None):
        tf = self.tf
        count = self.steps if count is None else count
        return tf.while_loop(lambda i, s: i < count, lambda i, s: (i + 1, body(i, s)),
                             (tf.constant(0), state))[1]

    def step_function(self):
        """The step function alone: `steps` iterations minus 0 (the encoder and setup run in both)."""
        tf, translator, beam = self.tf, self.translator, self.beam

        @tf.function
        def run(count):
            step_fn = translator.decoder.make_step_fn(self.source_ids, beam)
            cache = translator.decoder.initial_self_attention_cache(self.batch, self.buffer)
            cache = self.keras.tree.map_structure(lambda x: self.decoding.tile_beams(x, beam), cache)
            ids = tf.fill([self.rows, 1], 2)

            def body(i, state):
                total, cache = state
                logits, cache = step_fn(ids, cache, i)
                return total + logits[0, 0], cache
            return self._loop(body, (tf.constant(0.0), cache), count)[0]
        zero, count = tf.constant(0), tf.constant(self.steps)
        return self._time(lambda: run(count)) - self._time(lambda: run(zero))

    def bookkeeping(self, alpha):
        """`beam_search` alone: a step function that returns fixed logits (EOS impossible), no cache.

        Whole searches of `buffer` steps (the loop cannot be cut shorter), per step."""
        tf, config = self.tf, self.config
        vocab = config.vocab_size
        logits = tf.where(tf.range(vocab) == 3, -1e9, tf.random.normal((self.rows, vocab)))

        def step_fn(ids, cache, step):
            return logits + 1e-3 * tf.cast(ids, tf.float32), cache  # depends on ids: not hoisted

        @tf.function
        def run(buffer):
            return self.decoding.beam_search(step_fn, {}, self.batch, tf.fill([self.batch], buffer),
                                             beam_size=self.beam, alpha=alpha, max_decode_length=buffer)
        buffer = tf.constant(self.buffer)
        return self._time(lambda: run(buffer)) * self.steps / self.buffer

    def reorder(self, stacked=False, gather=None):
        tf, decoding, beam = self.tf, self.decoding, self.beam
        if stacked == "prestacked":
            source = tf.stack(self.leaves, axis=0)
            flat = tf.reshape(self.source_beam + tf.range(self.batch)[:, None] * beam, [-1])
            run = tf.function(lambda: self._loop(lambda i, s: tf.gather(s, flat, axis=1), source))
        elif stacked:
            run = tf.function(lambda: self._loop(lambda i, s: gather(s, self.source_beam, beam),
                                                 list(self.leaves)))
        else:
            run = tf.function(lambda: self._loop(
                lambda i, s: [decoding._gather_flat_beams(x, self.source_beam, beam) for x in s],
                list(self.leaves)))
        return self._time(run)

    def write(self, write_cache):
        tf, config = self.tf, self.config
        update = tf.random.normal((self.rows, config.num_heads, 1, config.head_size))
        run = tf.function(lambda: self._loop(lambda i, s: [write_cache(x, update, i) for x in s],
                                             list(self.leaves)))
        return self._time(run)

    def matmuls(self):
        tf, config = self.tf, self.config
        d, f, n = config.d_model, config.d_ff, config.num_layers
        weight = lambda rows, cols: tf.random.normal((rows, cols), stddev=rows ** -0.5)  # noqa: E731
        layers = [([weight(d, d) for _ in range(6)], weight(d, f), weight(f, d)) for _ in range(n)]
        embeddings = weight(config.vocab_size, d)
        x0 = tf.random.normal((self.rows, d))

        def body(i, state):
            total, x = state
            for square, up, down in layers:
                q, k, v = (tf.matmul(x, w) for w in square[:3])
                x = tf.matmul(q + k + v, square[3])  # self-attention Q, K, V, O
                x = tf.matmul(tf.matmul(x, square[4]), square[5])  # cross-attention Q, O
                x = tf.matmul(tf.nn.relu(tf.matmul(x, up)), down)  # FFN
            logits = tf.matmul(x, embeddings, transpose_b=True)  # [rows, vocab]
            return total + logits[0, 0], x * 0.5
        return self._time(tf.function(lambda: self._loop(body, (tf.constant(0.0), x0))[0]))


if __name__ == "__main__":
    main()
