"""Does the input pipeline starve the training step? (issue #9, "make training fast")

    python -m benchmarks.input_pipeline --preset multi30k --batch-tokens 4096

Measured in one run, on the training batches `train.py` makes
(`make_batches` on Multi30k train from `../shared/data`, or the embedded
corpus when absent: tokenize, bucket by length, pad, shuffle, repeat,
prefetch):

* `pipeline alone`: batches per second pulled from the dataset with no
  model (what the pipeline can deliver);
* `fit`: `model.fit` steps per second on that dataset, as training runs
  (one persistent iterator), `--rounds` times.

The last line is `pipeline_vs_step: X`, the pipeline's target tokens/s over
the median `fit`'s: above 1 the pipeline can keep ahead of the step
(`make_batches` prefetches, so it works while the step runs). A variant
that fitted on the same batches materialised in memory was dropped: its
`from_generator` over a Python list stalled for a fixed ~16 s in some
fits (40.96 s twice where 24.9 s was the norm), which measured that
stall, not the pipeline.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

from benchmarks import harness

SHARED = harness.SHARED_DATA / "multi30k"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="multi30k")
    parser.add_argument("--data", default=str(SHARED), help="text-directory corpus (default: shared Multi30k)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per side per batch")
    parser.add_argument("--steps", type=int, default=100, help="steps per timed fit (default 100)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import keras
    import tensorflow as tf

    from keras_transformer import TransformerConfig

    data = args.data if pathlib.Path(args.data).is_dir() else "embedded"
    corpus, tokenizer = harness.tokenized_corpus(data, args.vocab_size, args.seed)
    config = TransformerConfig.from_preset(args.preset, vocab_size=tokenizer.vocab_size)
    print(harness.header("input pipeline", harness.versions(tf, keras)))
    print(f"# preset {args.preset}: {config.depth_text} layers, d_model {config.d_model}, vocab {config.vocab_size}; "
          f"data {data}; batches of <= {args.batch_tokens} padded tokens per side; {args.steps} steps per fit")

    def batches():
        return harness.training_batches(corpus, tokenizer, config, args.batch_tokens, args.seed)

    # The pipeline alone (after one warm-up pull, which fills the shuffle buffer).
    iterator = iter(batches())
    next(iterator)
    started = time.perf_counter()
    tokens = 0
    for _ in range(args.steps * 3):
        (_, _), target = next(iterator)
        tokens += int(tf.math.count_nonzero(target))
    alone = time.perf_counter() - started
    pipeline_rate = tokens / alone
    print(f"pipeline alone: {args.steps * 3 / alone:.1f} batches/s, {pipeline_rate:,.0f} target tokens/s")

    model = harness.compiled_model(config, args.seed)
    # Training keeps one iterator over the repeated dataset for all its rounds
    # (one `fit`, `steps_per_epoch` = a round), so the fits read on from one
    # persistent iterator too; target tokens are counted as batches are handed
    # over (a batch or two that `fit` prefetches at the end of a fit count there).
    counted = {"tokens": 0}

    def handed_over():
        for inputs, target in iterator:
            counted["tokens"] += int(tf.math.count_nonzero(target))
            yield inputs, target

    live_ds = tf.data.Dataset.from_generator(handed_over, output_signature=batches().element_spec)

    def fit():
        counted["tokens"] = 0
        started = time.perf_counter()
        model.fit(live_ds, steps_per_epoch=args.steps, epochs=1, verbose=0)
        return time.perf_counter() - started, counted["tokens"]

    fit()  # warm-up: trace the bucket shapes
    rates = [tokens / seconds for seconds, tokens in (fit() for _ in range(args.rounds))]
    step_rate = statistics.median(rates)
    print(f"fit: ~{step_rate:,.0f} target tokens/s ({min(rates):,.0f}-{max(rates):,.0f}), {args.rounds} fits of "
          f"{args.steps} steps")
    print(harness.finish("pipeline_vs_step", f"{pipeline_rate / step_rate:.1f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
