"""The label-smoothed loss's forward and backward: the package's against the gather it replaced.

    python -m benchmarks.loss                                  # vocabularies 8000 and 37000
    python -m benchmarks.loss --vocab-sizes 8000 --tokens 85x24

`keras_transformer.LabelSmoothedCrossEntropy` computes, per token,
`logsumexp(x) - sum_v q_v x_v` (one weighted sum against the smoothed
one-hot `q`). Until issue #9's profile of the training step it picked
`log p_y` with `take_along_axis` from a log-softmax (`GatherLoss` below,
kept here as the reference): the same values, but the gradient of that
gather is an `UnsortedSegmentSum` scatter into a `[tokens, V]` zero tensor,
the largest single op of the `base` step's profile
(`benchmarks/profile_train_step.py`).

Both are timed as TensorFlow graphs (`tf.function`, no XLA) computing the
loss and its gradient with respect to random logits of shape
`--tokens` x V for each `--vocab-sizes` V, `--rounds` interleaved rounds of
`--repeats` calls each; the script first checks that the two agree (loss
and gradient). The last line is `speedup_at_V: X` for the last V (gather
time / package time, median of the rounds' ratios).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks import harness


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab-sizes", default="8000,37000", help="comma-separated (default: 8000,37000)")
    parser.add_argument("--tokens", default="85x24", help="sentences x length of the logits (default: 85x24, "
                        "one 2048-token batch of Multi30k)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="TensorFlow threads (default 2; 0: as they are)")
    args = parser.parse_args(argv)
    try:
        args.vocab_sizes = [int(v) for v in args.vocab_sizes.split(",")]
        args.shape = tuple(int(n) for n in args.tokens.lower().split("x"))
    except ValueError:
        parser.error("--vocab-sizes takes integers (8000,37000), --tokens SENTENCESxLENGTH (85x24)")
    if len(args.shape) != 2 or min(*args.shape, *args.vocab_sizes, args.rounds, args.repeats) < 1:
        parser.error("--tokens takes SENTENCESxLENGTH; sizes, --rounds and --repeats must be >= 1")
    return args


def gather_loss(label_smoothing):
    """The package's loss before issue #9: `log p_y` by `take_along_axis` (reference)."""
    import keras
    from keras import ops

    from keras_transformer.constants import PAD_ID

    class GatherLoss(keras.losses.Loss):
        def call(self, y_true, y_pred):
            y_true = ops.cast(y_true, "int32")
            log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)  # [batch, T, V]
            nll = -ops.take_along_axis(log_probs, y_true[..., None], axis=-1)[..., 0]  # [batch, T]
            smooth = -ops.mean(log_probs, axis=-1)  # [batch, T]
            per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth
            mask = ops.cast(ops.not_equal(y_true, PAD_ID), "float32")
            total = ops.cast(ops.size(mask), "float32")
            real = ops.maximum(ops.sum(mask), 1.0)
            return per_token * mask * (total / real)

    return GatherLoss(name="label_smoothed_cross_entropy")


def main(argv=None):
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import numpy as np
    import tensorflow as tf

    harness.set_threads(args.threads)
    from keras_transformer import LabelSmoothedCrossEntropy

    print(harness.header("loss benchmark", harness.versions(tf), f"{args.threads} threads",
                         f"logits {args.shape[0]}x{args.shape[1]}xV, label smoothing 0.1",
                         f"{args.rounds} interleaved rounds of {args.repeats} calls (loss and gradient)"))
    rows = []
    speedup = None
    for vocab in args.vocab_sizes:
        rng = np.random.default_rng(0)
        logits = tf.constant(rng.normal(size=(*args.shape, vocab)).astype("float32"))
        labels = rng.integers(4, vocab, args.shape).astype("int32")
        labels[0, args.shape[1] // 2:] = 0  # some padding
        labels = tf.constant(labels)

        def compiled(loss):
            @tf.function
            def run(x):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    value = loss(labels, x)
                return value, tape.gradient(value, x)
            return run

        functions = {"gather": compiled(gather_loss(0.1)), "package": compiled(LabelSmoothedCrossEntropy(0.1))}
        (want, want_grad), (got, got_grad) = (f(logits) for f in functions.values())
        np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
        difference = float(tf.reduce_max(tf.abs(got_grad - want_grad)))
        np.testing.assert_allclose(got_grad.numpy(), want_grad.numpy(), atol=1e-7)
        def repeated(function):
            def call():
                start = time.perf_counter()
                for _ in range(args.repeats):
                    function(logits)[1].numpy()
                return (time.perf_counter() - start) / args.repeats
            return call

        seconds = harness.interleaved_rounds({name: repeated(f) for name, f in functions.items()}, args.rounds)
        ratios = harness.round_ratios(seconds["gather"], seconds["package"])
        speedup = statistics.median(ratios)
        rows.append([vocab, f"{statistics.median(seconds['gather']) * 1e3:.1f}",
                     f"{statistics.median(seconds['package']) * 1e3:.1f}", harness.spread(ratios),
                     f"{difference:.1e}"])
    print(harness.table(["V", "gather (before) ms", "package ms", "speedup, median (min-max)",
                         "max abs gradient difference"], rows))
    print(harness.finish(f"speedup_at_{args.vocab_sizes[-1]}", f"{speedup:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
