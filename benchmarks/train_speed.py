"""Training-step throughput: our model against the same architecture assembled from keras-hub.

    python -m pip install -e ".[bench]"          # keras-hub (not a runtime dependency)
    python -m benchmarks.train_speed --preset base --batch-tokens 2048

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
  (`train.py --mixed-precision` on a CPU); `ours-xla-bf16`: both;
* `ours-set`: our model with `--set FIELD=VALUE` (repeatable, the fields and
  syntax of `train.py --set`) on top of the preset, e.g. another depth: what
  one step of a recipe candidate costs against the preset's, on the same
  batches in the same process (the ratio a step-matched recipe search needs,
  docs/lab-notebook, Multi30k recipe search); `ours-set-xla`: the same,
  compiled with XLA (a candidate trained with `--jit-compile`);
* `ours-keras-adam`: with Keras's own `keras.optimizers.Adam` (same settings
  and schedule), what `make_optimizer` returned before `FusedAdam` (one
  TensorFlow kernel per variable instead of ~15 small ops): the step's update
  and the warm-up pass, which traces the step, against `ours`;

`ours` is always measured; `keras-hub` needs the `bench` extra. Without it
(`--variants ours,ours-xla,ours-bf16,ours-xla-bf16`) the script is what
`benchmarks/training.py` was (whether XLA or bfloat16 pay for CPU
training), with `ours` as the baseline.

Each variant is warmed up (traced for every batch shape), then all run one
untimed pass in turn, before timing; then `--rounds` rounds
(`harness.interleaved_rounds`: every variant over all batches once per
round, the order rotating). Reported: real (non-PAD) target tokens/s,
median (min-max), and per round the ratio of the baseline's step time
(keras-hub float32, or `ours` without keras-hub) to the variant's (> 1:
the variant is faster than the baseline).

MFU: the step's matmul FLOPs (`gpu_step.matmul_flops`, on each batch's
padded shape) per second (median pass) against a matmul peak (`--peak-size`
square matmul, the same threads) measured in every round after its passes,
the peak being the best of the rounds' measurements (one short measurement
can land on a busy moment of a shared machine: in one run they ranged over
275-439 GFLOP/s); the float32 peak, and for the bf16 variants also the
bfloat16 peak. The last line is `ours_vs_keras_hub: X` (both float32), or
without keras-hub `LAST_vs_ours: X` for the last variant of `--variants`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

from benchmarks import harness
from benchmarks.gpu_step import matmul_flops, matmul_peak
from benchmarks.loss import gather_loss
from keras_transformer.config import TransformerConfig, model_settings

VARIANTS = ("ours", "keras-hub", "ours-fused", "ours-gather-loss", "ours-xla", "ours-bf16", "ours-xla-bf16",
            "keras-hub-bf16", "ours-set", "ours-set-xla", "ours-keras-adam")
SET_VARIANTS = ("ours-set", "ours-set-xla")  # the variants that take --set's fields
SHARED = harness.SHARED_DATA / "multi30k"


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
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="the ours-set variant's model fields on top of the preset (as train.py --set)")
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or "ours" not in args.variants:
        parser.error(f"--variants: must include ours, from {', '.join(VARIANTS)}"
                     + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    if any(v in SET_VARIANTS for v in args.variants) != bool(args.set):
        parser.error("--set and the ours-set variant go together")
    try:  # checked against the preset now, not after the corpus is read
        args.overrides = model_settings(args.set)
        TransformerConfig.from_preset(args.preset, **args.overrides)
    except ValueError as error:  # (ConfigError is one)
        parser.error(f"--set: {error}" if not str(error).startswith("--set") else str(error))
    args.baseline = "keras-hub" if "keras-hub" in args.variants else "ours"
    return args


def training_batches(args):
    """`(corpus, config, batches, real target tokens, matmul FLOPs)` of `--batches`
    token-budget batches of `--data` (or the embedded corpus) for `--preset`."""
    import numpy as np

    from keras_transformer import TransformerConfig
    from keras_transformer.constants import PAD_ID

    corpus, tokenizer = harness.tokenized_corpus(args.data, args.vocab_size, args.seed)
    config = TransformerConfig.from_preset(args.preset, vocab_size=tokenizer.vocab_size)
    ds = harness.training_batches(corpus, tokenizer, config, args.batch_tokens, args.seed)
    batches = [((s, ti), to) for (s, ti), to in ds.take(args.batches)]
    tokens = int(sum(np.count_nonzero(to.numpy() != PAD_ID) for _, to in batches))
    flops = sum(matmul_flops(config, s.shape[0], s.shape[1], ti.shape[1]) for (s, ti), _ in batches)
    return corpus, config, batches, tokens, flops


def build_variant(name, config, seed):
    """The compiled model of variant `name` (see the module docstring)."""
    import keras

    from keras_transformer import LabelSmoothedCrossEntropy, build_transformer

    base = "keras-hub" if name.startswith("keras-hub") else "ours"
    options = name[len(base):].split("-")[1:]  # e.g. ["xla", "bf16"], ["gather", "loss"]

    def build(config):
        model = (build_transformer if base == "ours" else keras_hub_transformer)(config)
        if "fused" in options:
            for attention in model.attention_layers():
                attention.fuse_projections = True
        return model

    keras.mixed_precision.set_global_policy("mixed_bfloat16" if "bf16" in options else "float32")
    try:
        loss = (gather_loss if "gather" in options else LabelSmoothedCrossEntropy)(config.label_smoothing)
        optimizer = None
        if "adam" in options:  # Keras's Adam with make_optimizer's settings and schedule
            from keras_transformer import make_optimizer

            optimizer = keras.optimizers.Adam.from_config(make_optimizer(config).get_config())
        return harness.compiled_model(config, seed, jit_compile="xla" in options, loss=loss, build=build,
                                      optimizer=optimizer)
    finally:
        keras.mixed_precision.set_global_policy("float32")


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
    for _ in range(config.decoder_depth):
        y = keras_hub.layers.TransformerDecoder(config.d_ff, config.num_heads, dropout=config.dropout,
                                                layer_norm_epsilon=config.layer_norm_epsilon)(
            y, x, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask)
    logits = embedding(y, reverse=True)
    return keras.Model([source, target], logits, name="keras_hub_transformer")


def main(argv=None):
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import tensorflow as tf

    harness.set_threads(args.threads)
    import keras

    modules = [tf, keras]
    if any(name.startswith("keras-hub") for name in args.variants):
        import keras_hub

        modules.append(keras_hub)
    corpus, config, batches, tokens, flops = training_batches(args)
    configs = {name: dataclasses.replace(config, **args.overrides) if name in SET_VARIANTS else config
               for name in args.variants}
    variant_flops = {name: sum(matmul_flops(configs[name], s.shape[0], s.shape[1], ti.shape[1])
                               for (s, ti), _ in batches) for name in args.variants}
    models = {name: build_variant(name, configs[name], args.seed) for name in args.variants}
    print(harness.header("train speed", harness.versions(*modules), f"{args.threads} threads"))
    print(f"# preset {args.preset}: {config.depth_text} layers, d_model {config.d_model}, d_ff {config.d_ff}, "
          f"vocab {config.vocab_size}; data {corpus.name}; {len(batches)} batches of <= {args.batch_tokens} "
          f"padded tokens per side ({tokens} real target tokens, {flops / 1e12:.3f} TFLOP of matmuls per pass)")
    if args.overrides:
        print("# ours-set: " + ", ".join(f"{k}={v}" for k, v in args.overrides.items()))
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
        run_pass(models[name])  # built can run its next steps slower again (docs/lab-notebook, training)
    names = list(models)
    dtypes = ["float32"] + (["bfloat16"] if any(name.endswith("-bf16") for name in names) else [])
    peaks = {dtype: [] for dtype in dtypes}

    def measure_peaks():
        for dtype in dtypes:
            peaks[dtype].append(matmul_peak(dtype, args.peak_size, repeats=5))

    seconds = harness.interleaved_rounds({name: (lambda m=model: run_pass(m)) for name, model in models.items()},
                                         args.rounds, after_round=measure_peaks)
    baseline = args.baseline
    rows = []
    for name in names:
        rates = [tokens / s for s in seconds[name]]
        ratios = harness.round_ratios(seconds[baseline], seconds[name])
        achieved = variant_flops[name] / statistics.median(seconds[name])
        mfu = {dtype: f"{achieved / max(values):.0%}" for dtype, values in peaks.items()}
        rows.append([name, harness.spread(rates, "{:,.0f}"), harness.spread(ratios) if name != baseline else "",
                     f"{achieved / 1e12:.3f}", mfu["float32"], mfu["bfloat16"] if name.endswith("-bf16") else ""])
    print(harness.table(["model", "target tokens/s, median (min-max)",
                         f"time ratio {baseline} / model per round, median (min-max)", "matmul TFLOP/s",
                         "MFU vs float32 peak", "MFU vs bfloat16 peak"], rows))
    print("# matmul peak, best of the rounds (median, min-max): " + ", ".join(
        f"{dtype} {max(values) / 1e9:.0f} ({harness.spread([p / 1e9 for p in values], '{:.0f}')}) GFLOP/s"
        for dtype, values in peaks.items()) + f" ({args.peak_size}^3, {args.threads} threads)")
    last = names[-1] if baseline == "ours" else "ours"
    ratios = harness.round_ratios(seconds[baseline], seconds[last])
    name = "ours_vs_keras_hub" if baseline == "keras-hub" else f"{last.replace('-', '_')}_vs_ours"
    print(harness.finish(name, f"{statistics.median(ratios):.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
