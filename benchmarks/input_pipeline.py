"""Does the input pipeline starve the training step? (issue #9, "make training fast")

    python benchmarks/input_pipeline.py --preset multi30k --batch-tokens 4096

Measured in one run, on the training batches `train.py` makes
(`make_batches` on Multi30k train from `../shared/data`, or the embedded
corpus when absent: tokenize, bucket by length, pad, shuffle, repeat,
prefetch):

* `pipeline alone`: batches per second pulled from the dataset with no
  model (what the pipeline can deliver);
* `fit, live pipeline`: `model.fit` steps per second on that dataset, as
  training runs;
* `fit, cached batches`: the same number of steps on the same batches
  materialised in memory first (no tokenizing while training).

Rounds alternate the two `fit` variants. If `live` is as fast as `cached`
the pipeline never starves the step (prefetch hides it); their ratio is
what the pipeline costs training, including the CPU it takes from the step
on a small machine. The last line is `live_vs_cached: X`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared" / "data" / "multi30k"


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
    import keras
    import tensorflow as tf

    from keras_transformer import LabelSmoothedCrossEntropy, TransformerConfig, build_transformer, make_optimizer
    from keras_transformer.data import Tokenizer, load_corpus, make_batches, train_tokenizer

    data = args.data if pathlib.Path(args.data).is_dir() else "embedded"
    corpus = load_corpus(data, "en", "de")
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = Tokenizer.load(train_tokenizer(corpus.texts("train"), pathlib.Path(scratch) / "sp",
                                                   args.vocab_size, seed=args.seed))
    config = TransformerConfig.from_preset(args.preset, vocab_size=tokenizer.vocab_size)
    print(f"# input pipeline: {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, {os.cpu_count()} CPU(s), "
          f"load average {os.getloadavg()[0]:.2f} at start; TF {tf.__version__}, Keras {keras.__version__}")
    print(f"# preset {args.preset}: {config.num_layers} layers, d_model {config.d_model}, vocab {config.vocab_size}; "
          f"data {data}; batches of <= {args.batch_tokens} padded tokens per side; {args.steps} steps per fit")

    def batches():
        return make_batches(corpus.splits["train"], tokenizer, batch_tokens=args.batch_tokens,
                            max_length=config.max_length, shuffle=True, seed=args.seed, repeat=True)

    # The pipeline alone (after one warm-up pull, which fills the shuffle buffer).
    iterator = iter(batches())
    next(iterator)
    started = time.perf_counter()
    tokens = 0
    for _ in range(args.steps * 3):
        (_, _), target = next(iterator)
        tokens += int(tf.math.count_nonzero(target))
    alone = time.perf_counter() - started
    print(f"pipeline alone: {args.steps * 3 / alone:.1f} batches/s, {tokens / alone:,.0f} target tokens/s")

    keras.utils.set_random_seed(args.seed)
    model = build_transformer(config)
    model.compile(optimizer=make_optimizer(config), loss=LabelSmoothedCrossEntropy(config.label_smoothing))
    # Training keeps one iterator over the repeated dataset for all its rounds
    # (one `fit`, `steps_per_epoch` = a round), so the live variant reads on from
    # one persistent iterator too; both variants go through `from_generator`, so
    # they pay the same (small) Python cost per batch.
    spec = iterator.element_spec if hasattr(iterator, "element_spec") else batches().element_spec
    cached = [next(iterator) for _ in range(args.steps)]  # the next batches, materialised
    target_tokens = sum(int(tf.math.count_nonzero(t)) for _, t in cached)
    live_ds = tf.data.Dataset.from_generator(lambda: iterator, output_signature=spec)
    cached_ds = tf.data.Dataset.from_generator(lambda: iter(cached), output_signature=spec)

    def fit(dataset):
        started = time.perf_counter()
        model.fit(dataset, steps_per_epoch=args.steps, epochs=1, verbose=0)
        return time.perf_counter() - started

    fit(live_ds)  # warm-up: trace the bucket shapes
    fit(cached_ds)
    times = {"live": [], "cached": []}
    for round_ in range(args.rounds):
        for name in (("live", "cached") if round_ % 2 == 0 else ("cached", "live")):
            times[name].append(fit(live_ds if name == "live" else cached_ds))
    for name, values in times.items():
        rates = sorted(target_tokens / t for t in values)
        print(f"fit, {name} {'pipeline' if name == 'live' else 'batches'}: {args.steps / statistics.median(values):.2f} "
              f"steps/s, ~{statistics.median(rates):,.0f} target tokens/s ({rates[0]:,.0f}-{rates[-1]:,.0f})")
    ratios = [c / l for l, c in zip(times["live"], times["cached"])]
    print(f"# load average {os.getloadavg()[0]:.2f} at end; per-round live/cached speed: "
          + ", ".join(f"{r:.3f}" for r in ratios))
    print(f"live_vs_cached: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("KERAS_TRANSFORMER_QUIET", "1")
    sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
