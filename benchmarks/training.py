"""Training throughput: target tokens/s and steps/s of the Keras train step.

    python benchmarks/training.py                       # tiny and small, multi30k, XLA off/on
    python benchmarks/training.py --presets tiny --batches 8 --repeats 3 --mixed-precision

What it measures, for each preset in `--presets` (default tiny and small):
the compiled train step that `train.py` runs under `model.fit` (the model's
`train_function`: forward, label-smoothed loss, gradients, Adam with the
paper's schedule), driven through `model.train_on_batch`, on token-budget
batches from `keras_transformer.data.make_batches` (the same bucketed batches
`train.py` feeds, with `train.py`'s default `--batch-tokens` per preset),
comparing within one run:

* `float32` (baseline): `model.compile(..., jit_compile=False)`;
* `float32 + XLA`: `jit_compile=True`;
* with `--mixed-precision`: `mixed_bfloat16` (what `train.py
  --mixed-precision` uses on a CPU), with and without XLA.

Data: multi30k `train.en`/`train.de` read at run time from
`../shared/data/multi30k` (never copied into the repository), or, if that
folder is absent (or with `--data embedded`), the package's embedded corpus.
A SentencePiece vocabulary of `--vocab-size` pieces is trained on the fly
into a temporary folder (or pass `--tokenizer` to reuse one).

Why: to know what a training step costs on this machine, and whether XLA or
bfloat16 should be switched on for CPU training.

Method: `--batches` batches are taken once from the shuffled stream and kept
in memory; every variant trains on exactly that list. Each variant (a model
built from the same seed) first runs one untimed pass over the list (traces
and, with XLA, compiles every bucket shape), and one more untimed round
follows once all are built (see `run_preset`). Then `--repeats` rounds; in each
round every variant trains one pass over the list, interleaved step by step
(each batch goes through every variant in turn, so background load hits all
variants alike); a variant's pass time is the sum of its steps. Reported:
the median and the minimum seconds per pass, steps/s and real (non-PAD)
target tokens/s from the median, and the ratio to the baseline as the median
over rounds of the per-round time ratio (< 1 means faster than the baseline).
The machine these figures come from is shared: compare ratios, not absolute
numbers across runs.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"
BASELINE = "float32"

from keras_transformer.config import BATCH_TOKENS  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,small",
                        help="comma-separated model presets (default tiny,small)")
    parser.add_argument("--data", default=str(DEFAULT_MULTI30K),
                        help="'embedded' or a directory of train.en/train.de (default ../shared/data/multi30k; "
                             "falls back to embedded with a message when absent)")
    parser.add_argument("--tokenizer", default=None,
                        help="an existing tokenizer.model to use instead of training one")
    parser.add_argument("--vocab-size", type=int, default=8000,
                        help="pieces of the SentencePiece vocabulary trained on the fly (default 8000)")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help="padded tokens per side per batch (default: train.py's, keras_transformer.config.BATCH_TOKENS)")
    parser.add_argument("--batches", type=int, default=6,
                        help="distinct batches per pass (default 6)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed passes per variant, interleaved (default 5: 30 timed steps)")
    parser.add_argument("--no-xla", action="store_true", help="skip the jit_compile=True variants")
    parser.add_argument("--mixed-precision", action="store_true",
                        help="also measure mixed_bfloat16 (with and without XLA)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    for name in ("vocab_size", "batches", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.batch_tokens is not None and args.batch_tokens < 1:
        parser.error("--batch-tokens must be >= 1")
    return args


def load_data(args):
    from keras_transformer.data import load_corpus

    if args.data != "embedded" and not pathlib.Path(args.data).is_dir():
        print(f"note: {args.data} not found (the shared data is not in a fresh checkout); "
              f"using the embedded corpus instead", file=sys.stderr)
        args.data = "embedded"
    return load_corpus(args.data, "en", "de", seed=args.seed)


def load_tokenizer(args, corpus, workdir):
    from keras_transformer.data import Tokenizer, train_tokenizer

    if args.tokenizer:
        return Tokenizer.load(args.tokenizer)
    start = time.perf_counter()
    path = train_tokenizer(corpus.texts("train"), pathlib.Path(workdir) / "tokenizer", args.vocab_size,
                           seed=args.seed)
    tokenizer = Tokenizer.load(path)
    print(f"# trained a {tokenizer.vocab_size}-piece tokenizer on {corpus.name} in "
          f"{time.perf_counter() - start:.0f} s (not part of any timing)")
    return tokenizer


def take_batches(corpus, tokenizer, config, batch_tokens, count, seed):
    """`count` training batches as in train.py (shuffled, repeated stream), kept in memory."""
    from keras_transformer.data import make_batches

    ds = make_batches(corpus.splits["train"], tokenizer, batch_tokens=batch_tokens,
                      max_length=config.max_length, shuffle=True, seed=seed, repeat=True)
    return [((s, ti), to) for (s, ti), to in ds.take(count)]


def build_variant(config, jit_compile, policy, seed):
    """A compiled model as train.py compiles it, built under dtype `policy`."""
    import keras

    from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy, build_transformer, make_optimizer

    keras.utils.set_random_seed(seed)
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = build_transformer(config)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.compile(optimizer=make_optimizer(config), loss=LabelSmoothedCrossEntropy(config.label_smoothing),
                  metrics=[MaskedAccuracy()], jit_compile=jit_compile)
    return model


def run_preset(preset, corpus, tokenizer, args) -> list[str]:
    from keras_transformer import TransformerConfig
    from keras_transformer.constants import PAD_ID

    config = TransformerConfig.from_preset(preset, vocab_size=tokenizer.vocab_size)
    batch_tokens = args.batch_tokens or BATCH_TOKENS[preset]
    batches = take_batches(corpus, tokenizer, config, batch_tokens, args.batches, args.seed)
    target_tokens = int(sum(np.count_nonzero(to.numpy() != PAD_ID) for _, to in batches))
    padded_tokens = int(sum(np.prod(to.shape) for _, to in batches))
    shapes = sorted({tuple(to.shape) for _, to in batches})

    specs = [(BASELINE, False, "float32")]
    if not args.no_xla:
        specs.append(("float32 + XLA", True, "float32"))
    if args.mixed_precision:
        specs.append(("mixed_bfloat16", False, "mixed_bfloat16"))
        if not args.no_xla:
            specs.append(("mixed_bfloat16 + XLA", True, "mixed_bfloat16"))

    notes, models, losses = [], {}, {}
    for name, jit, policy in specs:
        try:
            model = build_variant(config, jit, policy, args.seed)
            start = time.perf_counter()
            for inputs, targets in batches:  # warm-up: trace/compile every shape
                logs = model.train_on_batch(inputs, targets, return_dict=True)
            notes.append(f"{name}: warm-up pass (tracing{' + XLA compilation' if jit else ''}) "
                         f"{time.perf_counter() - start:.1f} s, loss after it {logs['loss']:.3f}")
            models[name] = model
        except Exception as error:  # noqa: BLE001 -- report any failure of a variant, do not hide it
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            notes.append(f"{name} FAILED: {type(error).__name__}: {first[:300]}")

    # Interleaved step by step: every batch goes through every variant in
    # turn, so a burst of background load hits all of them alike.
    # Round 0 is a second, untimed warm-up: a non-XLA model warmed up before
    # the other variants were built runs its first steps after that 3-7x
    # slower again (seen here; a TensorFlow runtime effect, not the model's).
    times = {name: [] for name in models}
    for round_index in range(args.repeats + 1):
        elapsed = dict.fromkeys(models, 0.0)
        for inputs, targets in batches:
            for name, model in models.items():
                start = time.perf_counter()
                logs = model.train_on_batch(inputs, targets, return_dict=True)  # host values: synced
                elapsed[name] += time.perf_counter() - start
                losses[name] = logs["loss"]
        for name in models:
            if round_index:
                times[name].append(elapsed[name])

    n = len(batches)
    lines = [(f"### {preset}: {config.num_layers} layers, d_model {config.d_model}, d_ff {config.d_ff}, "
              f"vocab {config.vocab_size}; {n} batches of <= {batch_tokens} padded tokens per side "
              f"({target_tokens} real / {padded_tokens} padded target tokens per pass; "
              f"{len(shapes)} shapes: {', '.join('x'.join(map(str, s)) for s in shapes)})"),
             "",
             f"| variant | median s/pass | min s/pass | steps/s | target tokens/s | time ratio vs {BASELINE} (median, min-max) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in models:
        median = statistics.median(times[name])
        ratio = ""
        if BASELINE in times:
            ratios = [t / b for t, b in zip(times[name], times[BASELINE])]
            ratio = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        lines.append(f"| {name} | {median:.3f} | {min(times[name]):.3f} | {n / median:.2f} | {target_tokens / median:.0f} | {ratio} |")
    lines.append("")
    lines.extend(f"- {note}" for note in notes)
    lines.extend(f"- {name}: s per timed pass {', '.join(f'{t:.3f}' for t in times[name])}; "
                 f"loss after the last one {losses[name]:.3f}" for name in models)
    lines.append("")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    import keras

    from keras_transformer import PRESETS

    unknown = [p for p in args.presets if p not in PRESETS]
    if unknown:
        print(f"unknown preset(s) {unknown}; expected some of {sorted(PRESETS)}", file=sys.stderr)
        return 2
    load = os.getloadavg()
    print(f"# training benchmark: {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
          f"{os.cpu_count()} CPU(s), load average {load[0]:.2f} at start; "
          f"TF {tf.__version__}, Keras {keras.__version__}")
    corpus = load_data(args)
    print(f"# data {corpus.name}; {args.batches} batches per pass, {args.repeats} interleaved timed passes "
          f"after one warm-up pass per variant and one untimed interleaved round\n")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench_tokenizer_") as workdir:
        tokenizer = load_tokenizer(args, corpus, workdir)
        for preset in args.presets:
            print("\n".join(run_preset(preset, corpus, tokenizer, args)), flush=True)
    print(f"# total {time.time() - started:.0f} s; load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
