"""Several exports of one model, timed in one process: before/after a change to the search.

    python -m benchmarks.export_speed before=OLD_EXPORT/1 after=NEW_EXPORT/1
    python -m benchmarks.export_speed --signature translate_xla before=... after=...

Each `NAME=PATH` is a SavedModel written by `export.saved_model` (e.g. the
same run exported from two worktrees). All are loaded with
`tf.saved_model.load` in this one process and alternated round by round
(`harness.interleaved_rounds`), so background load on a shared machine hits
them alike; what differs between them is the graph. Per export: the median
(min-max) seconds to translate `--batch-one-count` sentences one by one and
`--count` sentences in batches of `--batch-size`, and how many translations
equal the first export's. The last line is the second export's batch-1 time
over the first's.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks import harness

DEFAULT_SENTENCES = harness.SHARED_DATA / "multi30k" / "test2016.en"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+", help="NAME=PATH of a SavedModel version directory")
    parser.add_argument("--signature", default="serving_default")
    parser.add_argument("--sentences", default=None, help=f"one per line (default {DEFAULT_SENTENCES})")
    parser.add_argument("--batch-one-count", type=int, default=16)
    parser.add_argument("--count", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2,
                        help="TensorFlow's intra- and inter-op threads (default 2; 0: as they are)")
    args = parser.parse_args(argv)
    if any("=" not in export for export in args.exports) or len(args.exports) < 2:
        parser.error("give two or more exports as NAME=PATH")
    args.exports = dict(export.split("=", 1) for export in args.exports)
    return args


def main(argv=None):
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the tokenizer ops)

    harness.set_threads(args.threads)
    lines = harness.read_lines(args.sentences or DEFAULT_SENTENCES, args.batch_one_count + args.count)
    passes = {"b1": [[s] for s in lines[:args.batch_one_count]],
              f"b{args.batch_size}": [lines[i:i + args.batch_size]
                                      for i in range(args.batch_one_count, len(lines), args.batch_size)]}
    functions = {name: tf.saved_model.load(path).signatures[args.signature] for name, path in args.exports.items()}

    def translate(function, batches):
        return [t.decode() for batch in batches for t in function(text=tf.constant(batch))["translation"].numpy()
                .reshape(-1)]

    outputs = {name: {key: translate(f, batches) for key, batches in passes.items()}  # untimed warm-up
               for name, f in functions.items()}
    print(harness.header("export speed", harness.versions(tf), f"signature {args.signature}, "
                         f"{args.threads} threads, {args.rounds} rounds"))
    def timed(function, batches):
        def call():  # returns None: the harness times it by the wall clock
            translate(function, batches)
        return call

    seconds = {key: harness.interleaved_rounds({name: timed(f, batches) for name, f in functions.items()}, args.rounds)
               for key, batches in passes.items()}
    first = next(iter(functions))
    rows = []
    for name in functions:
        same = [f"{sum(a == b for a, b in zip(outputs[name][key], outputs[first][key]))}/{len(outputs[first][key])}"
                for key in passes]
        rows.append([name, *(harness.spread(seconds[key][name], "{:.3f}") for key in passes), ", ".join(same)])
    print(harness.table(["export", *(f"{key} s" for key in passes), f"translations equal to {first}'s"], rows))
    second = list(functions)[1]
    ratio = statistics.median(harness.round_ratios(seconds["b1"][second], seconds["b1"][first]))
    print(harness.finish(f"{second}_over_{first}_batch1", f"{ratio:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
