"""Nodes run per step of the plain-graph search: a figure the machine's load does not move.

    python -m benchmarks.step_nodes --shape multi30k                   # random weights, batches 1 and 32
    python -m benchmarks.step_nodes --model-dir runs/multi30k          # a trained run, test2016 sources
    python -m benchmarks.step_nodes --shape multi30k --options-search  # translate_options' search

The plain graph (`serving_default`'s search, without XLA) is a TensorFlow
`while_loop`, and the executor pays for every node of its body on every step
(~1 us a node on the 2-core machine: most of a batch-1 step of the Multi30k
model; docs/lab-notebook, serving speed parts 7 and 9). Timings on a shared
machine move by tens of percent between runs; the nodes a step runs do not.

The script saves `Searcher.search` (source ids in, ids out; beam 4, the
config's alpha, +50) as a SavedModel, loads it in a TF1 session as TF Serving
loads a model (Grappler, control flow lowered to Switch/Merge; the small-request
loop too, which serving runs by TensorFlow's single-threaded executor
instead: `Searcher(single_threaded_loop=False)`), runs each
batch once untraced and once with `RunOptions.FULL_TRACE`, and divides the
nodes run inside the loop by its steps (the executions of its `LoopCond`,
less the last one). Per batch size it prints the steps and the nodes per
step, with the op types that run most (and again those that took longest)
and the microseconds their kernels took per step in the traced run
(`op_end_rel_micros`: tracing adds to each node, so these are shares of a
step, not its untraced time). (Threads do not change the count.)

With `--shape` the weights are random and the EOS embedding row is zero (as
`translate_speed --shape`): no hypothesis ends, so every sentence runs to its
limit (source + 50) at a constant batch. With `--model-dir` the sources are
the first sentences of `--sentences` (test2016) and the search ends them as
it does in serving, so the batch shrinks as sentences finish.

The last line is `nodes_per_step_batchB: N` for the first batch size.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile

from benchmarks import harness

DEFAULT_SENTENCES = harness.SHARED_DATA / "multi30k" / "test2016.en"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", help="a train.py run directory (final.weights.h5, tokenizer.model)")
    source.add_argument("--shape", help="a preset name (e.g. multi30k): random weights of that shape")
    parser.add_argument("--sentences", default=None, help=f"with --model-dir (default {DEFAULT_SENTENCES})")
    parser.add_argument("--source-tokens", type=int, default=13,
                        help="with --shape: source length in tokens before EOS (default 13)")
    parser.add_argument("--batch-sizes", default="1,32", help="comma-separated (default 1,32)")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--options-search", action="store_true",
                        help="translate_options' search (the beam size a run-time input, the stop exact for "
                             "one result) instead of serving_default's")
    parser.add_argument("--top", type=int, default=12, help="op types listed per batch size (default 12)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    return args


def sources(args, config, tokenizer):
    """int32 `[max(batch_sizes), S]` source ids (EOS last, PAD after) and their lengths."""
    import numpy as np

    from keras_transformer.constants import EOS_ID, PAD_ID

    count = max(args.batch_sizes)
    if tokenizer is None:  # random ids of one length: every sentence runs to the same limit
        rng = np.random.default_rng(args.seed)
        ids = rng.integers(EOS_ID + 1, config.vocab_size, size=(count, args.source_tokens + 1)).astype("int32")
        ids[:, -1] = EOS_ID
        return ids, np.full([count], args.source_tokens + 1, "int32")
    lines = harness.read_lines(args.sentences or DEFAULT_SENTENCES, count)
    pieces = [list(row[:config.max_length - 1]) + [EOS_ID] for row in tokenizer.tokenize(lines).to_list()]
    ids = np.full((len(pieces), max(map(len, pieces))), PAD_ID, "int32")
    for row, sentence in zip(ids, pieces):
        row[:len(sentence)] = sentence
    return ids, np.array([len(p) for p in pieces], "int32")


def model_and_tokenizer(args):
    """`(model, config, tokenizer or None, description)`."""
    from keras_transformer import TransformerConfig

    if args.model_dir:
        from keras_transformer.run_dir import load_trained

        model, config, tokenizer = load_trained(args.model_dir)
        return model, config, tokenizer, f"{args.model_dir} ({config.depth_text} layers, d_model {config.d_model})"
    config = TransformerConfig.from_preset(args.shape)
    model = harness.never_ending_model(config, args.seed)
    return model, config, None, (f"random {args.shape} shape ({config.depth_text} layers, d_model {config.d_model}, "
                                 f"vocab {config.vocab_size}), seed {args.seed}, EOS embedding row zeroed, "
                                 f"sources of {args.source_tokens} tokens")


def save_search(model, config, beam_size, path, options=False):
    """`Searcher.search` as a SavedModel's `serving_default`: `(ids, lengths) -> {"ids"}`.

    With `options`, `translate_options`' search instead: the beam size a run-time
    tensor (`max_beam_size=MAX_BEAM_SIZE`), `beam_size` result slots, the stop exact
    for one result (what a one-result request runs)."""
    import tensorflow as tf

    from keras_transformer.decoding import SearchOptions
    from keras_transformer.inference.searcher import Searcher

    # The small-request loop lowered into the graph as the other is (`single_threaded_loop=False`):
    # run by the single-threaded executor, as serving runs it, the session's step stats show
    # it as one `While` node. The same ops a step, up to Grappler's rewrites.
    searcher = Searcher(model, config, single_threaded_loop=False)
    module = tf.Module()
    # The tf.Variables themselves (a Keras model held by a tf.Module saves wrapper variables
    # that a TF1 session never restores; see export.saved_model.TranslationModule).
    module.model_variables = [v.value for v in model.variables]

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)])
    def search(ids, lengths):
        if options:
            from keras_transformer.constants import MAX_BEAM_SIZE

            beam = tf.constant(beam_size)
            search_options = SearchOptions(beam_size=beam, alpha=config.length_penalty_alpha, num_results=beam,
                                           extra_length=config.decode_extra_length, exact_results=tf.constant(1),
                                           max_beam_size=MAX_BEAM_SIZE)
        else:
            search_options = SearchOptions(beam_size=beam_size, alpha=config.length_penalty_alpha, num_results=1,
                                           extra_length=config.decode_extra_length)
        found, _ = searcher.search(ids, lengths, search_options)
        return {"ids": found}

    module.search = search
    tf.saved_model.save(module, path, signatures={"serving_default": search})


def op_type(label: str) -> str:
    """`Op` from a step-stats timeline label `name = Op(inputs)`."""
    return label.split(" = ", 1)[-1].split("(", 1)[0].strip()


def in_loop(name: str) -> bool:
    """Whether a node (by its name in the lowered graph) runs inside a `while_loop`."""
    return any(part == "while" or part.startswith("while_") for part in name.split("/"))


def count_nodes(path, ids, lengths):
    """`(steps, Counter of op type -> nodes run inside the loop)` of one traced run."""
    steps, ops, _ = trace_loop(path, ids, lengths)
    return steps, ops


def trace_loop(path, ids, lengths):
    """`(steps, nodes, micros)` of one traced run: Counters of op type -> nodes run inside
    the loop, and -> microseconds their kernels took (summed over the run)."""
    import tensorflow as tf

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)  # the TF1 loader's deprecation notice
    with tf.compat.v1.Session(graph=tf.Graph()) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
        signature = meta.signature_def["serving_default"]
        feed = {signature.inputs["ids"].name: ids, signature.inputs["lengths"].name: lengths}
        fetch = signature.outputs["ids"].name
        session.run(fetch, feed)  # Grappler and the kernels' first runs, untraced
        metadata = tf.compat.v1.RunMetadata()
        session.run(fetch, feed, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                    run_metadata=metadata)
    ops, micros = collections.Counter(), collections.Counter()
    conditions = 0
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            kind = op_type(node.timeline_label)
            conditions += kind == "LoopCond"
            if in_loop(node.node_name):
                ops[kind] += 1
                micros[kind] += node.op_end_rel_micros
    return max(conditions - 1, 1), ops, micros


def main(argv=None):
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import keras
    import tensorflow as tf

    model, config, tokenizer, described = model_and_tokenizer(args)
    ids, lengths = sources(args, config, tokenizer)
    print(harness.header("step nodes", harness.versions(tf, keras)))
    which = ("translate_options' search, beam size a run-time input" if args.options_search
             else "serving_default's search")
    print(f"# model: {described}; beam {args.beam_size}, plain graph ({which}), "
          f"TF1 session, RunOptions.FULL_TRACE\n")
    headline = None
    with tempfile.TemporaryDirectory() as work:
        save_search(model, config, args.beam_size, work, options=args.options_search)
        for batch_size in args.batch_sizes:
            steps, ops, micros = trace_loop(work, ids[:batch_size], lengths[:batch_size])
            per_step = sum(ops.values()) / steps
            headline = headline or (batch_size, per_step)
            total = sum(micros.values())
            print(f"#### batch {batch_size}: {steps} loop steps, {per_step:.1f} nodes run per step; "
                  f"kernels {total / steps:.0f} us per traced step")
            for title, order in (("op", ops), ("op (by kernel time)", micros)):
                print(harness.table([title, "nodes per step", "kernel us per traced step (share)"],
                                    [(kind, f"{ops[kind] / steps:.1f}",
                                      f"{micros[kind] / steps:.0f} ({micros[kind] / max(total, 1):.0%})")
                                     for kind, _ in order.most_common(args.top)]) + "\n")
    print(harness.finish(f"nodes_per_step_batch{headline[0]}", f"{headline[1]:.1f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
