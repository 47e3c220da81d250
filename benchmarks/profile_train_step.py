"""Profile of the training step (what `train.py` runs under `model.fit`), TensorFlow, no XLA.

    python -m benchmarks.profile_train_step                       # base, 2 batches of <= 2048 tokens
    python -m benchmarks.profile_train_step --preset tiny --data embedded --vocab-size 200

The model, batches and compile settings are `benchmarks/train_speed.py`'s
(`build_transformer`, the paper's Adam and schedule, label-smoothed loss,
`--variants` picks `ours`, `ours-unfused`, `ours-bf16`...; one variant per
run). After a warm-up pass (tracing), `--passes` passes over the batches are
timed without the profiler, then one pass is traced with
`tf.profiler.experimental` (to `--logdir`) and read back with the profiler's
own `framework_op_stats` tool (`framework_op_stats` below). Printed:

1. seconds per pass, and the matmul FLOPs' share of the measured matmul
   peak (float32, or bfloat16 for a `-bf16` variant; best of 3 measurements,
   as in train_speed.py);
2. self time by part of the model: the op's name scope (attention Q/K/V
   and output projections, attention scores and softmax, feed-forward,
   layer norms, embedding and the output projection, loss, the optimizer's
   update), split into forward and backward (gradient) ops;
3. self time by op type.

Self times of ops that run concurrently (2 inter-op threads) add up to more
than the wall time: read the fractions. The last line is
`seconds_per_pass: X` (without the profiler).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shutil
import statistics
import sys
import time

from benchmarks import harness
from benchmarks.gpu_step import matmul_peak
from benchmarks.train_speed import SET_VARIANTS, VARIANTS, add_step_arguments, build_variant, training_batches


@contextlib.contextmanager
def stderr_silenced():
    """File descriptor 2 to /dev/null (the profiler's C++ start-up lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def framework_op_stats(logdir):
    """The profiler's framework_op_stats table of the trace in `logdir`: a list of row dicts."""
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)[-1:]
    if not paths:
        return None
    data, ok = _pywrap_profiler_plugin.xspace_to_tools_data(paths, "framework_op_stats", {})
    if not ok:
        return None
    table = json.loads(data)[0]
    columns = [c["id"] for c in table["cols"]]
    return [dict(zip(columns, (cell["v"] for cell in row["c"]))) for row in table["rows"]]

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser, batches=2)
    parser.add_argument("--passes", type=int, default=3, help="timed passes without the profiler (default 3)")
    parser.add_argument("--variant", default="ours", help="a train_speed.py variant of ours (default: ours)")
    parser.add_argument("--logdir", default="runs/profile_train_step", help="profiler trace directory (replaced)")
    parser.add_argument("--top", type=int, default=15, help="rows of the op-type table (default: 15)")
    args = parser.parse_args(argv)
    if min(args.batches, args.passes, args.threads) < 1:
        parser.error("--batches, --passes and --threads must be >= 1")
    variants = [v for v in VARIANTS if v.startswith("ours") and v not in SET_VARIANTS]  # (they need --set)
    if args.variant not in variants:
        parser.error(f"--variant: expected one of {', '.join(variants)}, got {args.variant!r}")
    return args


# (regular expression on the op's name, part); the first match wins. Keras names
# the ops by layer, with a `_N` suffix per trace (`feed_forward_1/inner_1/...`).
PARTS = (
    (r"/(query|key|value|output)(_\d+)?/|_attention(_\d+)?/(MatMul|split|concat|add|BiasAdd)", "attention projections (Q/K/V/O)"),
    (r"_attention(_\d+)?/", "attention scores, softmax, context"),
    (r"/feed_forward(_\d+)?/", "feed-forward"),
    (r"/norm(_\d+)?/", "layer norms"),
    (r"residual|dropout", "residuals, dropout"),
    (r"/embedding(_\d+)?/|/logits", "embedding, output projection"),
    (r"loss|cross_entropy", "loss"),
    (r"adam|optimizer|assign|iteration|learning_rate", "optimizer update"),
)


def part_of(name):
    """`(phase, part)` of a profiled op from its name."""
    phase = "backward" if re.search(r"gradient|Grad", name) else "forward"
    for pattern, label in PARTS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return ("update" if label == "optimizer update" else phase), label
    return phase, "other"


def print_profile(table, passes, top):
    rows = [r for r in table if r["type"] != "IDLE"]
    total = sum(r["total_self_time"] for r in rows)
    by_part, by_type = {}, {}
    for r in rows:
        key = part_of(r["operation"])
        by_part[key] = by_part.get(key, 0.0) + r["total_self_time"]
        kind = by_type.setdefault(r["type"], [0.0, 0])
        kind[0] += r["total_self_time"]
        kind[1] += r["occurrences"]
    print(f"ops' self time: {total / passes / 1e6:.3f} s per pass ({len(rows)} distinct ops)\n")
    # fractions to 3 places: 16 rows sum to 1 within 0.008
    print(harness.table(["part", "phase", "s per pass", "fraction"], [
        [label, phase, f"{us / passes / 1e6:.3f}", f"{us / total:.3f}"]
        for (phase, label), us in sorted(by_part.items(), key=lambda item: -item[1])]))
    others = sorted((r for r in rows if part_of(r["operation"])[1] == "other"), key=lambda r: -r["total_self_time"])
    if others:
        print("\nlargest ops in `other`: " + "; ".join(
            f"{r['operation']} ({r['type']}, {r['total_self_time'] / passes / 1e6:.3f} s)" for r in others[:5]))
    print("\n" + harness.table(["op type", "ops per pass", "s per pass", "fraction"], [
        [kind, f"{count / passes:.0f}", f"{us / passes / 1e6:.3f}", f"{us / total:.2f}"]
        for kind, (us, count) in sorted(by_type.items(), key=lambda item: -item[1][0])[:top]]) + "\n")


def main(argv=None):
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import tensorflow as tf

    harness.set_threads(args.threads)
    corpus, config, batches, tokens, flops = training_batches(args)
    model = build_variant(args.variant, config, args.seed)
    print(harness.header("profile of the train step", harness.versions(tf), f"{args.threads} threads",
                         f"variant {args.variant}"))
    print(f"# preset {args.preset}: {config.depth_text} layers, d_model {config.d_model}, d_ff {config.d_ff}, "
          f"vocab {config.vocab_size}; data {corpus.name}; {len(batches)} batches of <= {args.batch_tokens} padded "
          f"tokens per side (shapes {', '.join(f'{s.shape[0]}x{s.shape[1]}->{ti.shape[1]}' for (s, ti), _ in batches)}"
          f"; {tokens} real target tokens, {flops / 1e12:.3f} TFLOP of matmuls per pass)")

    def run_pass():
        start = time.perf_counter()
        for inputs, targets in batches:
            model.train_on_batch(inputs, targets)
        return time.perf_counter() - start

    print(f"# warm-up pass (tracing): {run_pass():.1f} s")
    seconds = [run_pass() for _ in range(args.passes)]
    median = statistics.median(seconds)
    dtype = "bfloat16" if args.variant.endswith("-bf16") else "float32"
    peak = max(matmul_peak(dtype, args.peak_size, repeats=5) for _ in range(3))
    print(f"\n## 1. step time: {median:.3f} s per pass (median of {', '.join(f'{s:.3f}' for s in seconds)}); "
          f"{tokens / median:,.0f} target tokens/s; matmuls {flops / median / 1e9:.0f} GFLOP/s = "
          f"{flops / median / peak:.0%} of the measured {dtype} peak ({peak / 1e9:.0f} GFLOP/s, best of 3)\n")

    shutil.rmtree(args.logdir, ignore_errors=True)
    with stderr_silenced():
        tf.profiler.experimental.start(args.logdir)
        traced = run_pass()
        tf.profiler.experimental.stop()
    print(f"## 2-3. profiler (tf.profiler.experimental, framework_op_stats), one pass ({traced:.3f} s with "
          f"the profiler on)\n")
    table = framework_op_stats(args.logdir)
    if not table:
        print("no framework_op_stats table could be read from the trace\n")
    else:
        print_profile(table, 1, args.top)
    print(harness.finish("seconds_per_pass", f"{median:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
