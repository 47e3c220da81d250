"""Translation speed on real sentences: cached vs uncached greedy, beam 4, XLA.

    python -m benchmarks.decoding --model-dir /tmp/m30k
    python -m benchmarks.decoding --model-dir /tmp/m30k --sentences 16 --batch-sizes 1,16 --repeats 3

What it measures, on the first `--sentences` lines of newstest2014 (en) and
of multi30k test2016 (en), read at run time from `../shared/data` (never
copied into the repository; a set that is absent is skipped with a message),
for every batch size in `--batch-sizes`:

* `cached greedy`: the project's serving path, `Translator.translate_graph`
  (text -> tokenizer -> encoder once -> `beam_search` with beam 1 over the
  incremental decoder with key/value caches -> detokenizer) in one
  `tf.function`. This is the baseline (ratio 1.00) of every table.
* `uncached greedy`: a reference written here: the same tokenization, the
  same length rule (at most source length + 50 tokens, EOS included) and the
  same stop at EOS, but every step re-runs the whole model
  `model([source, prefix])` on the prefix generated so far (encoder included)
  and takes the argmax of the last position; a `tf.while_loop` in one
  `tf.function`. Its output must equal the cached one token for token: the
  script checks that and prints how many sentences differ.
* `cached beam 4`: `translate_graph` with beam 4 (alpha from the model's
  config), the cost of beam search over greedy.
* `search only, tf.function` vs `search only, XLA`: `Searcher.search` with
  beam 1 on pre-tokenized ids, in `tf.function` and in
  `tf.function(jit_compile=True)` (the string ops of the tokenizer cannot be
  compiled by XLA, hence "search only"). XLA compiles one program per input
  shape, so both search-only variants get their source ids padded with PAD
  to a multiple of `--pad-multiple` positions (masked: same output, checked);
  the first pass compiles, and its time is printed (XLA's cache persists in
  the process: a later table reuses programs of shapes already seen). If
  XLA fails, the error is printed.

Why: it tells whether the incremental decoder actually pays off on real
sentence lengths, what beam search costs, and whether XLA helps decoding.

Method: `--repeats` + 1 rounds (`harness.interleaved_rounds`), the first
untimed (it traces and compiles every shape). In each round every variant
translates all the sentences once, one pass each, the order rotating from
round to round (so background load hits all variants alike). Reported:
the median and the minimum seconds per pass over the timed rounds,
sentences/s and generated tokens/s from the median, and the
ratio to `cached greedy` as the median over rounds of the per-round time
ratio (> 1 means slower than cached greedy). Generated tokens = tokens of
the returned translation, EOS included (for beam 4: of the best hypothesis).
The machine these figures come from is shared: compare ratios, not absolute
numbers across runs. The last line is `LAST_vs_cached_greedy: X`, the
time ratio of the last variant of the last table.

Why it stays beside `translate_speed.py` (which times the served signatures
against CTranslate2): this one runs in process, on the `Translator` itself,
and holds the uncached reference that shows the decoding cache pays off.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

from benchmarks import harness

DEFAULT_DATA_ROOT = harness.SHARED_DATA
# (name, path relative to the data root) of the source sides.
DATASETS = {
    "newstest2014": "newstest2014/newstest2014.en-de.en",
    "multi30k": "multi30k/test2016.en",
}
BASELINE = "cached greedy"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True,
                        help="a model directory written by train.py (final.weights.h5, tokenizer.model)")
    parser.add_argument("--data-root", default=str(DEFAULT_DATA_ROOT),
                        help="folder holding newstest2014/ and multi30k/ (default: ../shared/data)")
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help="comma-separated subset of: " + ", ".join(DATASETS))
    parser.add_argument("--sentences", type=int, default=32,
                        help="first N lines of each set (default 32)")
    parser.add_argument("--batch-sizes", default="1,32",
                        help="comma-separated batch sizes (default 1,32)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed rounds per table, each variant once per round (default 3)")
    parser.add_argument("--beam-size", type=int, default=4, help="beam of the beam-search variant (default 4)")
    parser.add_argument("--pad-multiple", type=int, default=16,
                        help="search-only variants: pad source ids to a multiple of this (default 16)")
    parser.add_argument("--no-uncached", action="store_true", help="skip the uncached reference")
    parser.add_argument("--no-beam", action="store_true", help="skip the beam-search variant")
    parser.add_argument("--no-xla", action="store_true", help="skip the search-only tf.function/XLA pair")
    args = parser.parse_args(argv)
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    unknown = [d for d in args.datasets if d not in DATASETS]
    if unknown:
        parser.error(f"--datasets: unknown {unknown}, expected some of {list(DATASETS)}")
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}")
    for name in ("sentences", "repeats", "beam_size", "pad_multiple"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error("--batch-sizes must be positive")
    return args


# ---------------------------------------------------------------------------
# The uncached reference
# ---------------------------------------------------------------------------
def uncached_greedy(model, source_ids, max_lengths, max_decode_length):
    """Greedy decoding that re-runs `model([source, prefix])` every step.

    Args:
        model: the Keras model from `build_transformer`.
        source_ids: int32 `[batch, S]` (text tokens, EOS, PAD).
        max_lengths: int32 `[batch]`, most generated tokens (EOS included).
        max_decode_length: python int, the width of the output buffer.

    Returns:
        int32 `[batch, max_decode_length]`: generated ids, EOS when produced,
        then PAD (the layout `beam_search` returns).
    """
    import tensorflow as tf

    from keras_transformer.constants import BOS_ID, EOS_ID, PAD_ID

    length = max_decode_length
    batch = tf.shape(source_ids)[0]
    max_lengths = tf.clip_by_value(tf.cast(max_lengths, tf.int32), 1, length)
    # Decoder input buffer: BOS then the generated tokens.
    inputs = tf.concat([tf.fill([batch, 1], BOS_ID), tf.fill([batch, length], PAD_ID)], axis=1)  # [batch, L+1]
    outputs = tf.fill([batch, length], PAD_ID)  # [batch, L]
    done = tf.zeros([batch], tf.bool)
    out_positions = tf.range(length, dtype=tf.int32)[tf.newaxis, :]  # [1, L]
    in_positions = tf.range(length + 1, dtype=tf.int32)[tf.newaxis, :]  # [1, L+1]

    def cond(step, inputs, outputs, done):
        return tf.logical_and(step < length, tf.logical_not(tf.reduce_all(done)))

    def body(step, inputs, outputs, done):
        prefix = inputs[:, :step + 1]  # [batch, step+1]: the whole prefix, every step
        logits = model([source_ids, prefix], training=False)[:, -1, :]  # [batch, V]
        token = tf.argmax(logits, axis=-1, output_type=tf.int32)  # [batch]
        token = tf.where(done, PAD_ID, token)
        outputs = tf.where(tf.logical_and(out_positions == step, tf.logical_not(done)[:, tf.newaxis]),
                           token[:, tf.newaxis], outputs)
        inputs = tf.where(in_positions == step + 1, token[:, tf.newaxis], inputs)
        finished = tf.logical_or(token == EOS_ID, step + 1 >= max_lengths)
        return step + 1, inputs, outputs, tf.logical_or(done, finished)

    _, _, outputs, _ = tf.while_loop(
        cond, body, (tf.constant(0), inputs, outputs, done),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, length + 1]),
                          tf.TensorShape([None, length]), tf.TensorShape([None])),
        maximum_iterations=length)
    return outputs


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------
class Variants:
    """The functions compared; each maps one batch (list of str) to (strings, ids or None)."""

    def __init__(self, model, config, tokenizer, beam_size):
        import tensorflow as tf

        from keras_transformer.decoding import SearchOptions
        from keras_transformer.inference.searcher import STATIC_BUFFER
        from keras_transformer.inference.translator import Translator

        self.config = config
        self.translator = translator = Translator(model, config, tokenizer.model_bytes)
        extra = config.decode_extra_length
        alpha = config.length_penalty_alpha
        text_spec = [tf.TensorSpec([None], tf.string)]
        ids_spec = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)]

        # The project's path, exactly what `Translator.translate` runs.
        greedy = SearchOptions(beam_size=1, alpha=alpha, num_results=1, extra_length=extra)
        beam = SearchOptions(beam_size=beam_size, alpha=alpha, num_results=1, extra_length=extra)
        self.greedy = tf.function(lambda t: translator.translate_graph(t, greedy)[0][:, 0], input_signature=text_spec)
        self.beam = tf.function(lambda t: translator.translate_graph(t, beam)[0][:, 0], input_signature=text_spec)

        def tokenize(text):
            return translator.encode_text(translator.clean_text(text))

        self.tokenize = tf.function(tokenize, input_signature=text_spec)

        def uncached(text):
            source_ids, lengths = tokenize(text)
            ids = uncached_greedy(model, source_ids, lengths + extra, translator.searcher.max_decode_length)
            return translator.decode_ids(ids), ids

        self.uncached = tf.function(uncached, input_signature=text_spec)

        def search(source_ids, lengths, **buffer):
            ids, _ = translator.searcher.search(source_ids, lengths, greedy, **buffer)
            return ids[:, 0]  # [batch, L]

        # Untimed: the ids of the cached greedy path, for the equality check
        # and the token counts.
        self.greedy_ids = tf.function(lambda t: search(*tokenize(t)), input_signature=text_spec)
        self.beam_ids = tf.function(
            lambda t: translator.searcher.search(*tokenize(t), beam)[0][:, 0],
            input_signature=text_spec)
        self.search = tf.function(search, input_signature=ids_spec)
        # No input_signature: XLA needs static shapes, one program per shape.
        # XLA also needs the buffer's size static: max_length + 50 positions.
        self.search_xla = tf.function(lambda i, l: search(i, l, buffer=STATIC_BUFFER), jit_compile=True)


def differing_rows(a, b):
    """Rows in which two `[batch, L]` id arrays differ; the narrower one is
    padded with PAD first (a request-sized search buffer is narrower than
    the static `max_length + 50` one, and PAD fills both after EOS)."""
    import numpy as np

    from keras_transformer.constants import PAD_ID

    width = max(a.shape[1], b.shape[1])
    a, b = (np.pad(x, [(0, 0), (0, width - x.shape[1])], constant_values=PAD_ID) for x in (a, b))
    return int((a != b).any(axis=1).sum())


def pad_source(source_ids, lengths, multiple):
    """Pads `[batch, S]` source ids with PAD up to a multiple of `multiple` positions
    (padding is masked, so the translation is unchanged; XLA then compiles one
    program per padded width instead of one per source length)."""
    import tensorflow as tf

    from keras_transformer.constants import PAD_ID

    width = int(source_ids.shape[1])
    target = -(-width // multiple) * multiple
    return tf.pad(source_ids, [[0, 0], [0, target - width]], constant_values=PAD_ID), lengths


def generated_tokens(ids):
    """Tokens per row of `[batch, L]` result ids (EOS included, PAD excluded): a numpy array."""
    import numpy as np

    from keras_transformer.constants import PAD_ID

    return (np.asarray(ids) != PAD_ID).sum(axis=1)


def run_table(variants: Variants, name: str, sentences: list[str], batch_size: int, args) -> list[str]:
    """Warm-up, equality checks and interleaved timing for one set and batch size: the report
    lines and each variant's per-round time ratio to cached greedy."""
    import tensorflow as tf

    batches = [sentences[i:i + batch_size] for i in range(0, len(sentences), batch_size)]
    text_batches = [tf.constant(b, tf.string) for b in batches]
    notes = []

    # Reference outputs (untimed) and token counts.
    greedy_ids = [variants.greedy_ids(t).numpy() for t in text_batches]
    greedy_tokens = int(sum(generated_tokens(ids).sum() for ids in greedy_ids))
    loop_steps = sum(int(generated_tokens(ids).max()) for ids in greedy_ids)
    greedy_strings = [variants.greedy(t).numpy() for t in text_batches]
    source_tokens = sum(int(variants.tokenize(t)[1].numpy().sum()) for t in text_batches)
    limit_hits = sum(int((generated_tokens(ids) >= l + variants.config.decode_extra_length).sum())
                     for ids, l in zip(greedy_ids, (variants.tokenize(t)[1].numpy() for t in text_batches)))

    # name -> (callable on batch index, generated tokens per pass)
    timed = {BASELINE: (lambda i: variants.greedy(text_batches[i]), greedy_tokens)}

    if not args.no_uncached:
        differ_ids = differ_text = 0
        for t, ids, strings in zip(text_batches, greedy_ids, greedy_strings):
            u_strings, u_ids = variants.uncached(t)
            differ_ids += differing_rows(u_ids.numpy(), ids)
            differ_text += int((u_strings.numpy() != strings).sum())
        notes.append(f"uncached vs cached greedy: {differ_ids} of {len(sentences)} sentences differ in ids, "
                     f"{differ_text} in text")
        timed["uncached greedy"] = (lambda i: variants.uncached(text_batches[i]), greedy_tokens)

    if not args.no_beam:
        beam_tokens = int(sum(generated_tokens(variants.beam_ids(t).numpy()).sum() for t in text_batches))
        timed[f"cached beam {args.beam_size}"] = (lambda i: variants.beam(text_batches[i]), beam_tokens)

    if not args.no_xla:
        token_batches = [pad_source(*variants.tokenize(t), args.pad_multiple) for t in text_batches]
        timed["search only, tf.function"] = (lambda i: variants.search(*token_batches[i]), greedy_tokens)
        try:
            differ = 0
            shapes = {tuple(source_ids.shape) for source_ids, _ in token_batches}
            start = time.perf_counter()  # first calls: XLA compiles one program per shape
            for (source_ids, lengths), ids in zip(token_batches, greedy_ids):
                differ += differing_rows(variants.search_xla(source_ids, lengths).numpy(), ids)
            notes.append(f"XLA vs cached greedy: {differ} of {len(sentences)} sentences differ in ids; "
                         f"first pass (tracing + compiling {len(shapes)} shape(s)) "
                         f"{time.perf_counter() - start:.1f} s")
            timed["search only, XLA"] = (lambda i: variants.search_xla(*token_batches[i]), greedy_tokens)
        except Exception as error:  # noqa: BLE001 -- report any XLA failure, do not hide it
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            notes.append(f"XLA FAILED: {type(error).__name__}: {first[:300]}")

    def one_pass(fn):
        def run():
            for i in range(len(batches)):
                result = fn(i)
                # Force the result to host memory so the call really ended.
                (result[0] if isinstance(result, tuple) else result).numpy()
        return run

    # Round 0 is the untimed warm-up: it traces (and compiles) every shape, interleaved
    # like the timed rounds (a tf.function traced before others can be slow on its
    # first calls after them; seen when timing the training step).
    passes = {key: one_pass(fn) for key, (fn, _) in timed.items()}
    harness.interleaved_rounds(passes, 1)
    times = harness.interleaved_rounds(passes, args.repeats)

    n = len(sentences)
    lines = [(f"### {name}: {n} sentences, batch {batch_size} ({len(batches)} call(s) per pass), "
              f"{source_tokens} source tokens, {greedy_tokens} greedy output tokens "
              f"({loop_steps} decoder steps per pass, {limit_hits} sentence(s) stopped by the +50 limit)"), ""]
    rows, ratios = [], {}
    for key, (_, tokens) in timed.items():
        median = statistics.median(times[key])
        ratios[key] = harness.round_ratios(times[key], times[BASELINE])
        rows.append([key, f"{median:.3f}", f"{min(times[key]):.3f}", f"{n / median:.1f}", f"{tokens / median:.0f}",
                     harness.spread(ratios[key])])
    lines += [harness.table(["variant", "median s/pass", "min s/pass", "sentences/s", "tokens/s",
                             "time ratio vs cached greedy (median, min-max)"], rows), ""]
    lines.extend(f"- {note}" for note in notes)
    lines.extend(f"- {key}: s per timed pass {', '.join(f'{t:.3f}' for t in times[key])}" for key in timed)
    if not args.no_beam:
        lines.append(f"- beam {args.beam_size} output tokens per pass: {timed[f'cached beam {args.beam_size}'][1]}")
    lines.append("")
    return lines, ratios


def main(argv=None) -> int:
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import keras
    import tensorflow as tf

    from keras_transformer.run_dir import load_trained

    data_root = pathlib.Path(args.data_root)
    sets = {}
    for name in args.datasets:
        path = data_root / DATASETS[name]
        if not path.exists():
            print(f"skipping {name}: {path} not found (the shared data is not in a fresh checkout)",
                  file=sys.stderr)
            continue
        sets[name] = harness.read_lines(path, args.sentences)
    if not sets:
        print(f"no data set found under {data_root}; nothing to measure (skipped)", file=sys.stderr)
        return 0

    from keras_transformer.data import TokenizerError
    from keras_transformer.run_dir import RunError

    try:
        model, config, tokenizer = load_trained(args.model_dir)
    except (RunError, TokenizerError) as error:
        print(f"decoding.py: error: {error}", file=sys.stderr)
        return 2
    print(harness.header("decoding benchmark", harness.versions(tf, keras)))
    print(f"# model {args.model_dir}: {config.depth_text} layers, d_model {config.d_model}, "
          f"vocab {config.vocab_size}, search buffer: the request's longest source + "
          f"{config.decode_extra_length} (XLA: {config.max_length + config.decode_extra_length})")
    print(f"# {args.repeats} interleaved timed rounds after one untimed interleaved warm-up round\n")
    variants = Variants(model, config, tokenizer, args.beam_size)
    started = time.time()
    for name, sentences in sets.items():
        for batch_size in args.batch_sizes:
            lines, ratios = run_table(variants, name, sentences, min(batch_size, len(sentences)), args)
            print("\n".join(lines), flush=True)
    last = list(ratios)[-1]
    print(harness.finish(f"{last.replace(' ', '_').replace(',', '')}_vs_cached_greedy",
                         f"{statistics.median(ratios[last]):.2f}", started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
