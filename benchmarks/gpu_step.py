"""Training-step throughput and MFU of a preset on any Keras backend (written for JAX on a GPU).

    KERAS_BACKEND=jax python -m benchmarks.gpu_step --preset base --batch-tokens 25000

Imports no TensorFlow: it builds the preset with `build_transformer`, compiles
it with the paper's optimizer and label-smoothed loss, and times
`train_on_batch` on synthetic token-budget batches (random ids, every
sentence `--length` tokens on both sides, `batch_tokens // length`
sentences, so no padding and an exact FLOP count), for float32 and
mixed_bfloat16 (`--precisions`).

FLOPs per step are counted from the shapes (matmuls only, multiply-add = 2
FLOPs, backward = 2x forward): per layer and sentence, the Q/K/V/O
projections, the attention scores and weighted sums, the feed-forward
network, and the output projection over the vocabulary. MFU = those FLOP/s
divided by the matmul peak measured in the same run (an 8192^3 product in
the step's precision, `keras.ops.matmul`), and by `--datasheet-tflops`
(H100 SXM dense bf16: 989) for reference. The last line is `name: value`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks import harness

if __name__ == "__main__":  # (not when a test imports it: the variable would reach its other subprocesses)
    os.environ.setdefault("KERAS_TRANSFORMER_QUIET", "0")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab-size", type=int, default=37000, help="the paper's ~37k shared vocabulary")
    parser.add_argument("--batch-tokens", type=int, default=25000, help="tokens per side per step (paper: 25000)")
    parser.add_argument("--length", type=int, default=32, help="tokens per sentence on each side (default 32)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round (default 20)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", default="float32,mixed_bfloat16")
    parser.add_argument("--peak-size", type=int, default=8192, help="matmul size of the peak measurement")
    parser.add_argument("--datasheet-tflops", type=float, default=989.0,
                        help="the GPU's dense bf16 peak from its datasheet (H100 SXM: 989)")
    return parser.parse_args(argv)


def matmul_flops(config, sentences, source_length, target_length):
    """Matmul FLOPs of one training step (forward x 3) on `sentences` pairs of the given lengths."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    s, t = source_length, target_length
    encoder = 4 * s * d * d + 2 * s * s * d + 2 * s * d * f  # projections, scores + weighted sums, FFN
    decoder = (4 * t * d * d + 2 * t * t * d  # self-attention
               + 2 * t * d * d + 2 * s * d * d + 2 * t * s * d  # cross-attention (Q, O on t; K, V on s)
               + 2 * t * d * f)
    return 3 * 2 * sentences * (config.num_layers * encoder + config.decoder_depth * decoder
                                + t * d * v)  # + output projection


def step_flops(config, sentences, length):
    """`matmul_flops` with `length` tokens on both sides."""
    return matmul_flops(config, sentences, length, length)


def matmul_peak(dtype="float32", size=8192, repeats=20):
    """FLOP/s of a `size`^3 matmul in `dtype` (`keras.ops`, the current backend)."""
    import keras
    from keras import ops

    a = ops.cast(keras.random.normal((size, size)), dtype)
    b = ops.cast(keras.random.normal((size, size)), dtype)
    ops.convert_to_numpy(ops.cast(ops.matmul(a, b)[0, 0], "float32"))  # compile / warm up
    start = time.perf_counter()
    for _ in range(repeats):
        c = ops.matmul(a, b)
    ops.convert_to_numpy(ops.cast(c[0, 0], "float32"))
    return 2 * size ** 3 * repeats / (time.perf_counter() - start)


def main(argv=None):
    args = parse_args(argv)
    import keras
    import numpy as np

    from keras_transformer import TransformerConfig

    devices = "?"
    if keras.backend.backend() == "jax":
        import jax

        devices = ", ".join(str(d.device_kind) for d in jax.devices())
    print(harness.header("gpu_step", f"backend {keras.backend.backend()}, devices {devices}",
                         harness.versions(keras)))
    config = TransformerConfig.from_preset(args.preset, vocab_size=args.vocab_size)
    sentences = args.batch_tokens // args.length
    flops = step_flops(config, sentences, args.length)
    print(f"# preset {args.preset}: {config.depth_text} layers, d_model {config.d_model}, d_ff {config.d_ff}, "
          f"vocab {config.vocab_size}; {sentences} sentences x {args.length} tokens per side "
          f"({sentences * args.length} target tokens) per step; {flops / 1e12:.2f} TFLOP per step (matmuls)")
    rng = np.random.default_rng(0)
    source = rng.integers(4, config.vocab_size, size=(sentences, args.length)).astype("int32")
    target_in = rng.integers(4, config.vocab_size, size=(sentences, args.length)).astype("int32")
    target_out = np.concatenate([target_in[:, 1:], np.full((sentences, 1), 3, "int32")], axis=1)
    headline = None
    print(harness.table(["precision", "target tokens/s, median (min-max)", "step ms", "TFLOP/s",
                         "matmul peak TFLOP/s (measured)", "MFU vs measured", "MFU vs datasheet"], []))
    for precision in [p.strip() for p in args.precisions.split(",") if p.strip()]:
        keras.mixed_precision.set_global_policy(precision)
        model = harness.compiled_model(config, seed=0, jit_compile=True)
        start = time.perf_counter()
        for _ in range(3):
            loss = model.train_on_batch([source, target_in], target_out)
        compile_seconds = time.perf_counter() - start
        rates = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = model.train_on_batch([source, target_in], target_out)
            seconds = (time.perf_counter() - start) / args.steps  # train_on_batch returns host floats: synced
            rates.append(sentences * args.length / seconds)
        step_seconds = sentences * args.length / statistics.median(rates)
        achieved = flops / step_seconds
        peak = matmul_peak("bfloat16" if "bfloat16" in precision else "float32", args.peak_size)
        mfu, datasheet = achieved / peak, achieved / (args.datasheet_tflops * 1e12)
        print(f"| {precision} | {harness.spread(rates, '{:,.0f}')} | {step_seconds * 1000:.1f} | "
              f"{achieved / 1e12:.2f} | {peak / 1e12:.2f} | {mfu:.0%} | {datasheet:.0%} |",
              flush=True)
        print(f"#   {precision}: first 3 steps (compilation) {compile_seconds:.1f} s; last loss {float(np.ravel(loss)[0]):.3f}")
        headline = (precision, statistics.median(rates))
        del model
    keras.mixed_precision.set_global_policy("float32")
    print(harness.finish(f"{headline[0]}_target_tokens_per_second", f"{headline[1]:.0f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
