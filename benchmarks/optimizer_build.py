"""Adam's slot variables made eagerly against inside a trace (docs/lab-notebook, "The suite's fixed costs").

Keras without a distribution strategy makes the optimizer's slots inside the first
training step's trace; `train.py` (`training._compile_model`) and
`harness.compiled_model` make them eagerly after `compile`. Per preset, each in a
fresh model and optimizer, this times `make_optimizer(config).build(variables)`
eagerly and inside a `tf.function`, in turn for `--rounds` rounds.

    python -m benchmarks.optimizer_build --presets tiny,base --vocab-size 8000 --rounds 2

The last line is the first preset's in-trace over eager median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks import harness


def build_seconds(config, in_trace: bool) -> float:
    """Seconds to make Adam's slots for a fresh `build_transformer(config)`."""
    import tensorflow as tf

    from keras_transformer import build_transformer, make_optimizer

    model = build_transformer(config)
    optimizer = make_optimizer(config)
    started = time.perf_counter()
    if in_trace:
        tf.function(lambda: optimizer.build(model.trainable_variables) or tf.constant(0), autograph=False)()
    else:
        optimizer.build(model.trainable_variables)
    assert optimizer.built and len(optimizer.variables) > 2 * len(model.trainable_variables)
    return time.perf_counter() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,base")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    import keras
    import tensorflow as tf

    from keras_transformer import TransformerConfig, build_transformer

    print(harness.header("optimizer build", harness.versions(tf, keras), f"vocab {args.vocab_size}",
                         f"{args.rounds} rounds"))
    rows, ratios = [], []
    for preset in args.presets.split(","):
        config = TransformerConfig.from_preset(preset, vocab_size=args.vocab_size)
        variables = len(build_transformer(config).trainable_variables)
        seconds = harness.interleaved_rounds({"eager": lambda: build_seconds(config, False),
                                              "trace": lambda: build_seconds(config, True)}, args.rounds)
        ratio = statistics.median(seconds["trace"]) / statistics.median(seconds["eager"])
        ratios.append(ratio)
        rows.append([preset, variables, harness.spread(seconds["eager"], "{:.3f}"),
                     harness.spread(seconds["trace"], "{:.3f}"), f"{ratio:.2f}"])
    print(harness.table(["preset", "variables", "eager s", "inside a tf.function s", "trace / eager"], rows))
    print(harness.finish("trace_over_eager", f"{ratios[0]:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
