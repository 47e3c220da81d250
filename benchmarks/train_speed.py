"""Training-step throughput: our model against the same architecture assembled from keras-hub.

    python -m pip install -e ".[bench]"          # keras-hub (not a runtime dependency)
    python benchmarks/train_speed.py --preset base --batch-tokens 2048

Two models of the same preset, compiled the same way (the paper's Adam and
schedule, label-smoothed loss, `train.py`'s `jit_compile` default off), on
the same token-budget batches (`keras_transformer.data.make_batches` on
Multi30k train from `../shared/data`, or the embedded corpus when absent):

* `ours`: `build_transformer(config)`;
* `keras-hub`: `keras_hub.layers.ReversibleEmbedding` (embedding shared with
  the output projection, scaled by sqrt(d_model) as the paper), plus
  `keras_hub.layers.SinePositionEncoding`, dropout, `num_layers`
  `keras_hub.layers.TransformerEncoder` / `TransformerDecoder` (post-norm,
  ReLU, the preset's sizes, dropout and LayerNorm epsilon) with padding masks.

Same parameter count up to the biases keras-hub adds; the script prints both.

`--variants` (comma-separated; default `ours,keras-hub`) adds the ways of
making our step faster that issue #9 asks to measure, each the same model
and batches:

* `ours-fused`: Q/K/V (and cross-attention K/V) as one matmul each, the
  layers' `fuse_projections = True` (off by default, see
  `keras_transformer.layers.attention.MultiHeadAttention`);
* `ours-gather-loss`: with the loss this package had before issue #9's
  profile (`log p_y` by `take_along_axis`, `benchmarks/loss.py`);
* `ours-xla`: compiled with `jit_compile=True` (`train.py --jit-compile`);
* `ours-bf16`, `keras-hub-bf16`: built under the `mixed_bfloat16` policy
  (`train.py --mixed-precision` on a CPU).

Each variant is warmed up (traced for every batch shape), then all run one
untimed pass in turn, before timing; then `--rounds` rounds, each timing
every variant over all batches, in an order that alternates between rounds.
Reported: real (non-PAD) target tokens/s, median (min-max), and per round
the ratio of keras-hub's float32 step time to the variant's (> 1: the
variant is faster than keras-hub in float32).

MFU: the step's matmul FLOPs (`gpu_step.matmul_flops`, on each batch's
padded shape) per second (median pass) against a matmul peak (`--peak-size`
square matmul, the same threads) measured in every round after its passes,
the peak being the best of the rounds' measurements (one short measurement
can land on a busy moment of a shared machine: in one run they ranged over
275-439 GFLOP/s); the float32 peak, and for the bf16 variants also the
bfloat16 peak. The last line is
`ours_vs_keras_hub: X` (both float32).
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

os.environ.setdefault("KERAS_TRANSFORMER_QUIET", "1")

VARIANTS = ("ours", "keras-hub", "ours-fused", "ours-gather-loss", "ours-xla", "ours-bf16", "keras-hub-bf16")
SHARED = pathlib.Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "multi30k"


def add_step_arguments(parser, batches):
    """The options `training_batches` and the timing read (also profile_train_step.py's)."""
    parser.add_argument("--preset", default="base")
    parser.add_argument("--data", default=str(SHARED), help="text-directory corpus (default: shared Multi30k)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per side per batch")
    parser.add_argument("--batches", type=int, default=batches, help=f"batches per pass (default {batches})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peak-size", type=int, default=2048, help="size of the peak matmul (default 2048)")
    parser.add_argument("--seed", type=int, default=0)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser, batches=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default="ours,keras-hub",
                        help=f"comma-separated, from {', '.join(VARIANTS)} (default: ours,keras-hub)")
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not {"ours", "keras-hub"} <= set(args.variants):
        parser.error(f"--variants: must include ours and keras-hub, from {', '.join(VARIANTS)}"
                     + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    return args


def training_batches(args):
    """`(corpus, config, batches, real target tokens, matmul FLOPs)` of `--batches`
    token-budget batches of `--data` (or the embedded corpus) for `--preset`."""
    import numpy as np

    from keras_transformer import TransformerConfig
    from keras_transformer.constants import PAD_ID
    from keras_transformer.data import Tokenizer, load_corpus, make_batches, train_tokenizer
    from gpu_step import matmul_flops  # (beside this script: the same FLOP count)

    data = args.data if pathlib.Path(args.data).is_dir() else "embedded"
    corpus = load_corpus(data, "en", "de", seed=args.seed)
    with tempfile.TemporaryDirectory() as work:
        tokenizer = Tokenizer.load(train_tokenizer(corpus.texts("train"), pathlib.Path(work) / "sp",
                                                   args.vocab_size, seed=args.seed))
    config = TransformerConfig.from_preset(args.preset, vocab_size=tokenizer.vocab_size)
    ds = make_batches(corpus.splits["train"], tokenizer, batch_tokens=args.batch_tokens,
                      max_length=config.max_length, shuffle=True, seed=args.seed, repeat=True)
    batches = [((s, ti), to) for (s, ti), to in ds.take(args.batches)]
    tokens = int(sum(np.count_nonzero(to.numpy() != PAD_ID) for _, to in batches))
    flops = sum(matmul_flops(config, s.shape[0], s.shape[1], ti.shape[1]) for (s, ti), _ in batches)
    return corpus, config, batches, tokens, flops


def build_variant(name, config, seed):
    """The compiled model of variant `name` (see the module docstring)."""
    import keras

    from keras_transformer import LabelSmoothedCrossEntropy, build_transformer, make_optimizer
    from keras_transformer.layers.attention import MultiHeadAttention

    from loss import gather_loss  # (beside this script)

    base = name.split("-bf16")[0].split("-xla")[0].split("-fused")[0].split("-gather-loss")[0]
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if name.endswith("-bf16") else "float32")
    try:
        keras.utils.set_random_seed(seed)
        model = (build_transformer if base == "ours" else keras_hub_transformer)(config)
        if name.endswith("-fused"):
            for layer in model._flatten_layers():
                if isinstance(layer, MultiHeadAttention):
                    layer.fuse_projections = True
        loss = (gather_loss if name.endswith("-gather-loss") else LabelSmoothedCrossEntropy)(config.label_smoothing)
        model.compile(optimizer=make_optimizer(config), loss=loss, jit_compile=name.endswith("-xla"))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


def keras_hub_transformer(config):
    """The preset's architecture from keras-hub layers; inputs `[source, target_in]`, logits out."""
    import keras
    import keras_hub
    from keras import ops

    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target_in")
    embedding = keras_hub.layers.ReversibleEmbedding(config.vocab_size, config.d_model, tie_weights=True,
                                                     embeddings_initializer=keras.initializers.RandomNormal(
                                                         stddev=config.d_model ** -0.5))
    positions = keras_hub.layers.SinePositionEncoding()
    scale = config.d_model ** 0.5

    def embed(ids):
        x = embedding(ids) * scale
        return keras.layers.Dropout(config.dropout)(x + positions(x))

    source_mask, target_mask = ops.not_equal(source, 0), ops.not_equal(target, 0)
    x = embed(source)
    for _ in range(config.num_layers):
        x = keras_hub.layers.TransformerEncoder(config.d_ff, config.num_heads, dropout=config.dropout,
                                                layer_norm_epsilon=config.layer_norm_epsilon)(
            x, padding_mask=source_mask)
    y = embed(target)
    for _ in range(config.num_layers):
        y = keras_hub.layers.TransformerDecoder(config.d_ff, config.num_heads, dropout=config.dropout,
                                                layer_norm_epsilon=config.layer_norm_epsilon)(
            y, x, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask)
    logits = embedding(y, reverse=True)
    return keras.Model([source, target], logits, name="keras_hub_transformer")


def main(argv=None):
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras
    import keras_hub

    from gpu_step import matmul_peak  # (beside this script)

    corpus, config, batches, tokens, flops = training_batches(args)
    models = {name: build_variant(name, config, args.seed) for name in args.variants}
    print(f"# train speed: {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, {os.cpu_count()} CPU(s), "
          f"load average {os.getloadavg()[0]:.2f} at start; TF {tf.__version__}, Keras {keras.__version__}, "
          f"keras-hub {keras_hub.__version__}; {args.threads} threads")
    print(f"# preset {args.preset}: {config.num_layers} layers, d_model {config.d_model}, d_ff {config.d_ff}, "
          f"vocab {config.vocab_size}; data {corpus.name}; {len(batches)} batches of <= {args.batch_tokens} "
          f"padded tokens per side ({tokens} real target tokens, {flops / 1e12:.3f} TFLOP of matmuls per pass)")
    print("# parameters: " + ", ".join(f"{n} {m.count_params():,}" for n, m in models.items()))

    def run_pass(model):
        start = time.perf_counter()
        for inputs, targets in batches:
            model.train_on_batch(inputs, targets)
        return time.perf_counter() - start

    for name, model in models.items():  # warm-up: trace every batch shape
        start = time.perf_counter()
        run_pass(model)
        print(f"# {name}: warm-up pass {time.perf_counter() - start:.1f} s")
    for name in models:  # one untimed interleaved pass: a model traced before the others were
        run_pass(models[name])  # built can run its next steps slower again (BENCHMARKS.md, training)
    seconds = {name: [] for name in models}
    names = list(models)
    dtypes = ["float32"] + (["bfloat16"] if any(name.endswith("-bf16") for name in names) else [])
    peaks = {dtype: [] for dtype in dtypes}
    for round_index in range(args.rounds):
        for name in (names if round_index % 2 == 0 else names[::-1]):
            seconds[name].append(run_pass(models[name]))
        for dtype in dtypes:
            peaks[dtype].append(matmul_peak(dtype, args.peak_size, repeats=5))

    def spread(values, form):
        return f"{form(statistics.median(values))} ({form(min(values))}-{form(max(values))})"

    print("| model | target tokens/s, median (min-max) | time ratio keras-hub / model per round, median (min-max) "
          "| matmul TFLOP/s | MFU vs float32 peak | MFU vs bfloat16 peak |")
    print("|---|---|---|---|---|---|")
    for name in names:
        rates = [tokens / s for s in seconds[name]]
        ratios = [h / o for o, h in zip(seconds[name], seconds["keras-hub"])]
        achieved = flops / statistics.median(seconds[name])
        mfu = {dtype: f"{achieved / max(values):.0%}" for dtype, values in peaks.items()}
        print(f"| {name} | {spread(rates, lambda v: f'{v:,.0f}')} | "
              f"{spread(ratios, lambda v: f'{v:.2f}') if name != 'keras-hub' else ''} | "
              f"{achieved / 1e12:.3f} | {mfu['float32']} | {mfu['bfloat16'] if name.endswith('-bf16') else ''} |")
    print("# matmul peak, best of the rounds (median, min-max): " + ", ".join(
        f"{dtype} {max(values) / 1e9:.0f} ({spread([p / 1e9 for p in values], lambda v: f'{v:.0f}')}) GFLOP/s"
        for dtype, values in peaks.items())
          + f" ({args.peak_size}^3, {args.threads} threads); load average {os.getloadavg()[0]:.2f} at end")
    ratios = [h / o for o, h in zip(seconds["ours"], seconds["keras-hub"])]
    print(f"ours_vs_keras_hub: {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
