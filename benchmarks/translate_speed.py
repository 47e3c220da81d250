"""Serving speed: the exported SavedModel against CTranslate2 on the same weights.

    python -m benchmarks.translate_speed --model-dir runs/multi30k           # (a) a trained run, test2016
    python -m benchmarks.translate_speed --shape base                         # (b) the base shape, random weights

What it measures, in one process, on the same weights and the same sentences:

* `serving_default`: the SavedModel exported by `export.saved_model`, loaded
  from disk as a user (or TF Serving) loads it:
  `tf.saved_model.load(path).signatures["serving_default"](text=...)`,
  strings in, strings out (tokenizer, encoder, beam `--beam-size` (4) with
  the config's alpha and the +50 rule, detokenizer all inside the graph; no
  XLA); the export is traced with `--beam-size`, whatever beam the run
  serves with, so that every side searches the same beam;
* `translate_xla`: the same export's XLA signature (the search compiled, on
  inputs padded to batch and length buckets; what `export.translate` and
  training's BLEU run); its untimed warm-up pass compiles the programs;
* `litert float32`: the same export's `translate_litert` signature converted
  by `export.tflite` (float32, no quantization) and run by `ai_edge_litert`
  (its interpreter's threads: each of `--threads`) (`--no-litert` skips it): what a user serving
  LiteRT gets, search and tokenizer inside;
* `ctranslate2 float32` / `ctranslate2 int8`: the same weights converted by
  `export.ctranslate2` and run by `ctranslate2.Translator` (CPU,
  `intra_threads` each of `--threads`, one translator thread), strings in, strings out
  as well: SentencePiece encoding and decoding in Python are part of its
  timing, with the options closest to ours
  (`export.ctranslate2.translation_options`: beam 4, the length penalty
  exponent matched to GNMT's at the batch's longest source, patience 2,
  `max_decoding_length` = that source + 50: CTranslate2 has one limit per
  call where ours is per sentence).

Two options change our side: `--export-patience P` exports the signatures
with CTranslate2's patience stop (`P` 2 with `--patience 2`: the same
stopping rule on both sides; our default, the exact search, runs more steps
with a large alpha), and `--onednn` adds `serving_default onednn` (and
`translate_xla onednn`): the same signatures in workers started with
`TF_ENABLE_ONEDNN_OPTS=1`, the plain ones then with `=0` (TensorFlow turns
its oneDNN kernels on by itself only on CPUs with AVX-512 VNNI/BF16 or AMX).

Each variant runs in its own worker process (the main process only
exports, converts and coordinates): in one process CTranslate2 ran 3-9x
slower once TensorFlow had run, and a CTranslate2 measured that way would
flatter us. Every engine is measured at each of `--threads` thread counts
(default 1,2), one worker per variant and thread count (TensorFlow: intra-op
and inter-op pools of that size; LiteRT: its interpreter's threads;
CTranslate2: `intra_threads`, one translator), and compared at its best:
CTranslate2's OpenMP threads collapse at 2 threads on some 2-vCPU VMs (1
thread 2-6x faster) where TensorFlow's do not, so one thread count for
every side flattered whichever side it suited. Batches of `--batch-sizes`
sentences in input order; the worker times its whole pass over the batches.

Target tokens/s counts, on both sides by the same rule, the SentencePiece
pieces of each returned translation (re-encoded: the signature returns only
strings) plus one for EOS. Equal outputs make the
comparison fair (a longer translation costs more per token, since every step
attends over all previous ones): the script prints how many translations are
identical on both sides (and across thread counts), and with `--shape` it
makes the output lengths equal by construction (see below).

Method: one untimed warm-up pass per worker, then `--rounds` rounds; in each
round every worker (variant x thread count) translates every batch once, in
an order that rotates from round to round, so background load hits all
alike. Per batch size, two tables:

* per thread count: each variant's median tokens/s over rounds with the
  min-max, and the median (min-max) of the per-round ratio to CTranslate2
  float32 at the same thread count;
* each engine's best: the thread count whose median tokens/s is highest,
  that median (min-max), and the best-to-best ratio: the median (min-max)
  over rounds of the per-round ratio of the variant's tokens/s at its best
  thread count to CTranslate2 float32's at its own best.

The last line is `name: value`, the best-to-best headline:
`serving_default_best_vs_ctranslate2_float32_best_batchB`, `serving_default`
at its best thread count over CTranslate2 float32 at its own, at the first
batch size B (the median of the per-round ratios).

Per batch size a third table describes our search: loop steps per batch,
rows per step (sentences x beam the step function runs on, mean over
steps) and milliseconds per step (the variant's median pass time at its
best thread count divided by the steps). The steps and rows are counted in the main process on the
same search (`SearchProfile`: a `Translator` whose `logits_filter`
counts); every variant of ours runs the same steps (same search, same
stopping rule). `serving_default` drops finished sentences, so its rows
shrink as sentences end; `translate_xla` runs its whole padded batch
bucket in the first cache stage (16 steps), then the smallest of the bucket,
half, a quarter or an eighth of it that holds the sentences not done
(`XLA_BATCH_HALVINGS`), and LiteRT the rows `serving_default` runs (a batch
drops its finished sentences as `serving_default` does, a single sentence
runs its beam until it is done: `Searcher.search_litert`).

Two model sources:

* `--model-dir`: a `train.py` run (averaged weights and its tokenizer), on
  the real sentences of `--sentences` (default: multi30k test2016.en from
  `../shared/data`, read at run time, never copied into the repository).
* `--shape PRESET`: a model of that preset's shape with random weights
  (`--seed`), and a SentencePiece vocabulary of up to `--vocab-size` pieces
  trained on the shared data's English and German text. Equal output
  lengths by construction: (1) the embedding row of EOS is set to zero, so
  its logit is exactly 0 whereas the best of ~32k random logits is far
  above 0 every step, and no hypothesis ever ends with EOS; (2) only source
  sentences of exactly `--source-tokens` pieces are used, so every
  hypothesis on both sides runs to the same limit, source tokens + 50.
  The script checks this: it prints the output lengths it got.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks import harness

SHARED_DATA = harness.SHARED_DATA
DEFAULT_SENTENCES = SHARED_DATA / "multi30k" / "test2016.en"
# Text the `--shape` tokenizer is trained on (both languages; read at run time).
SHAPE_TOKENIZER_TEXT = [SHARED_DATA / "multi30k" / f"train.{lang}" for lang in ("en", "de")] + [
    SHARED_DATA / "newstest2014" / f"newstest2014.en-de.{lang}" for lang in ("en", "de")]
SHAPE_SENTENCES = SHARED_DATA / "newstest2014" / "newstest2014.en-de.en"
BASELINE = "ctranslate2 float32"
OURS = "serving_default"
XLA = "translate_xla"
LITERT = "litert float32"
ONEDNN = " onednn"  # suffix of a variant run with TensorFlow's oneDNN kernels (`--onednn`)
ONEDNN_FLAG = "TF_ENABLE_ONEDNN_OPTS"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", help="a train.py run directory (final.weights.h5, tokenizer.model)")
    source.add_argument("--shape", help="a preset name (e.g. base): random weights of that shape")
    parser.add_argument("--sentences", default=None,
                        help="source sentences, one per line (default: multi30k test2016.en with --model-dir, "
                             "newstest2014 en with --shape)")
    parser.add_argument("--count", type=int, default=128, help="sentences used (default 128)")
    parser.add_argument("--batch-sizes", default="32,1", help="comma-separated (default 32,1)")
    parser.add_argument("--batch-one-count", type=int, default=16,
                        help="sentences timed at batch size 1 (default 16: one at a time is slow)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--threads", default="1,2",
                        help="comma-separated thread counts, each engine timed at each in a worker of its own "
                             "and compared at its best (default 1,2)")
    parser.add_argument("--beam-size", type=int, default=4,
                        help="beam of every side (default 4, the paper's): the export is traced with it, "
                             "whatever beam the run's config serves with (the multi30k preset's is 5)")
    parser.add_argument("--patience", type=float, default=2.0,
                        help="CTranslate2's beam patience (default 2: closest to our stopping rule; "
                             "its own default 1 stops earlier, see export/ctranslate2.py)")
    parser.add_argument("--export-patience", type=float, default=0.0,
                        help="our signatures' stopping rule: 0 (default) the exact search, > 0 CTranslate2's "
                             "patience stop (`export.saved_model --patience`; e.g. 2 with --patience 2: the "
                             "same rule on both sides)")
    parser.add_argument("--quantizations", default="float32,int8",
                        help="CTranslate2 compute types to compare (default float32,int8)")
    parser.add_argument("--no-xla", action="store_true", help="skip the translate_xla variant")
    parser.add_argument("--onednn", action="store_true",
                        help="also time our signatures with TensorFlow's oneDNN kernels switched on "
                             f"(`{ONEDNN_FLAG}=1` in their workers; the plain variants get `=0`): TensorFlow "
                             "turns them on by itself only on CPUs with AVX-512 VNNI/BF16 or AMX")
    parser.add_argument("--no-litert", action="store_true",
                        help="skip the LiteRT variant (the export's translate_litert signature converted by "
                             "export.tflite, float32, run by ai_edge_litert at each of --threads)")
    parser.add_argument("--pause", type=float, default=1.0,
                        help="seconds of idle time before each variant's timed pass (default 1)")
    parser.add_argument("--vocab-size", type=int, default=32000,
                        help="--shape: upper bound of the vocabulary trained on the fly (default 32000)")
    parser.add_argument("--source-tokens", type=int, default=None,
                        help="--shape: source length in pieces of every sentence used (default: the most "
                             "common length among the sentences)")
    parser.add_argument("--tokenizer-text", default=None,
                        help="--shape: comma-separated text files for the tokenizer (default: the shared data)")
    parser.add_argument("--work-dir", default=None,
                        help="where exports go (default: a temporary folder); an earlier run's export, "
                             "model.tflite and ctranslate2-* there are replaced")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    try:
        args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--threads must be comma-separated positive integers, got {args.threads!r}")
    if not args.threads or min(args.threads) < 1 or len(set(args.threads)) < len(args.threads):
        parser.error(f"--threads must be distinct positive integers, got {','.join(map(str, args.threads))}")
    args.quantizations = [q.strip() for q in args.quantizations.split(",") if q.strip()]
    if "float32" not in args.quantizations:
        parser.error("--quantizations must include float32 (the baseline of every ratio)")
    if args.export_patience < 0:
        parser.error("--export-patience must be >= 0 (0: the exact search)")
    for name in ("count", "rounds", "beam_size", "source_tokens", "batch_one_count"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error("--batch-sizes must be positive integers")
    return args


def read_lines(path):
    path = pathlib.Path(path)
    if not path.exists():
        sys.exit(f"translate_speed: {path} not found (the shared data is beside the repository; "
                 f"pass --sentences FILE)")
    return [line.rstrip("\n") for line in path.open(encoding="utf-8") if line.strip()]


def trained_model(args):
    from keras_transformer.run_dir import load_trained

    model, config, tokenizer = load_trained(args.model_dir)
    sentences = read_lines(args.sentences or DEFAULT_SENTENCES)[:args.count]
    return model, config, tokenizer, sentences, f"{args.model_dir} ({config.depth_text} layers, " \
        f"d_model {config.d_model}, vocab {config.vocab_size})"


def shaped_model(args, work):
    """A random model of preset `args.shape` whose outputs never end with EOS, and sentences
    of exactly `args.source_tokens` pieces (so that every output has that length + 50)."""
    import sentencepiece as spm

    from keras_transformer import TransformerConfig
    from keras_transformer.data import Tokenizer, train_tokenizer

    files = args.tokenizer_text.split(",") if args.tokenizer_text else SHAPE_TOKENIZER_TEXT
    texts = [line for path in files for line in read_lines(path)]
    tokenizer = Tokenizer.load(train_tokenizer(texts, work / "tokenizer", args.vocab_size, seed=args.seed))
    config = TransformerConfig.from_preset(args.shape, vocab_size=tokenizer.vocab_size)
    model = harness.never_ending_model(config, args.seed)
    candidates = read_lines(args.sentences or SHAPE_SENTENCES)
    processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_bytes)
    lengths = [min(len(processor.encode(s)), config.max_length - 1) for s in candidates]
    wanted = args.source_tokens or collections.Counter(lengths).most_common(1)[0][0]
    sentences = [s for s, n in zip(candidates, lengths) if n == wanted][:args.count]
    if len(sentences) < args.count:
        sys.exit(f"translate_speed: only {len(sentences)} sentences of exactly {wanted} pieces; "
                 f"lower --count or change --source-tokens")
    return model, config, tokenizer, sentences, f"random {args.shape} shape ({config.depth_text} layers, " \
        f"d_model {config.d_model}, vocab {config.vocab_size}), seed {args.seed}, " \
        f"sources of exactly {wanted} pieces, EOS embedding row zeroed"


def _serve_worker(connection, kind, path, threads, options, eos_id, environment=None):
    """One variant in its own process: receives lists of batches, times them, sends back
    `(seconds, translations, generated)`, `generated` the ids generated per sentence (EOS
    included when produced; CTranslate2 only, None for the SavedModel). A separate process per variant keeps the runtimes apart:
    in one process, CTranslate2 ran 3-9x slower after TensorFlow had run (both bring
    their own thread pools; measured with this script before it used workers).
    `environment`: variables set before TensorFlow is imported (`--onednn`)."""
    import sentencepiece as spm

    os.environ.update(environment or {})

    if kind == "litert":
        import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
        import tensorflow as tf

        from export.tflite import load_interpreter, translate_lines

        harness.set_threads(threads)
        interpreter = load_interpreter(path, num_threads=threads)
        first_call = [True]  # emptied by the first call

        def translate(texts):
            if not first_call:
                return translate_lines(interpreter, texts)[0], None
            first_call.clear()
            # LiteRT's runtime announces its XNNPACK delegate on stderr at the first
            # call; keep the benchmark's stderr for real problems.
            saved_stderr = os.dup(2)
            try:
                with open(os.devnull, "w") as devnull:
                    os.dup2(devnull.fileno(), 2)
                    return translate_lines(interpreter, texts)[0], None
            finally:
                os.dup2(saved_stderr, 2)
                os.close(saved_stderr)
    elif kind.startswith("saved_model:"):
        import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (the tokenizer ops, as a user loads the export)

        harness.set_threads(threads)
        signature = tf.saved_model.load(path).signatures[kind.split(":", 1)[1]]

        def translate(texts):
            out = signature(text=tf.constant(texts, tf.string))["translation"].numpy()
            return [t.decode("utf-8") for t in out], None
    else:
        import ctranslate2  # (no keras_transformer import here: it would load Keras and TensorFlow)

        translator = ctranslate2.Translator(path, device="cpu", compute_type=kind, inter_threads=1,
                                            intra_threads=threads)
        processor = spm.SentencePieceProcessor(model_file=str(pathlib.Path(path) / "tokenizer.model"))
        eos = processor.id_to_piece(eos_id)

        def translate(texts):
            # Pieces without EOS: the converted model adds it (add_source_eos).
            sources = [processor.encode(t, out_type=str) for t in texts]
            longest = max(len(s) for s in sources)
            results = translator.translate_batch(sources, max_batch_size=len(texts), return_scores=False,
                                                 return_end_token=True, **options(longest))
            hypotheses = [r.hypotheses[0] for r in results]  # EOS last when it was produced
            return ([processor.decode_pieces(h[:-1] if h and h[-1] == eos else h) for h in hypotheses],
                    [len(h) for h in hypotheses])

    connection.send("ready")
    while (batches := connection.recv()) is not None:
        start = time.perf_counter()
        results = [translate(batch) for batch in batches]
        seconds = time.perf_counter() - start
        translations = [t for texts, _ in results for t in texts]
        generated = None if results[0][1] is None else [n for _, lengths in results for n in lengths]
        connection.send((seconds, translations, generated))


class _Options:
    """Picklable `source_length -> translate_batch options`
    (`export.ctranslate2.translation_options`), computed in the main process for
    every source length, so that the CTranslate2 worker imports neither Keras
    nor TensorFlow."""

    def __init__(self, config, patience):
        from export.ctranslate2 import translation_options

        self.table = {length: translation_options(config, length, patience=patience)
                      for length in range(0, config.max_length + 1)}

    def __call__(self, source_length):
        return self.table[min(source_length, max(self.table))]


class Variants:
    """(variant name, threads) -> a worker process translating lists of batches, all on the
    same weights: every variant at each of `args.threads` thread counts."""

    def __init__(self, model, config, tokenizer, work, args):
        import multiprocessing

        import sentencepiece as spm

        from export.ctranslate2 import convert
        from export.saved_model import export_model
        from keras_transformer.constants import EOS_ID

        self.processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_bytes)
        options = _Options(config, args.patience)
        # Only the signatures timed here (serving_default, translate_xla): the same
        # graphs as a full export's, without tracing the options and LiteRT ones.
        from export.signatures import LITERT_SIGNATURE
        from export.tflite import convert as convert_litert

        signatures = (() if args.no_xla else (XLA,)) + (() if args.no_litert else (LITERT_SIGNATURE,))
        export = str(export_model(model, config, tokenizer, work / "export", signatures=signatures,
                                  patience=args.export_patience))
        paths = {OURS: (f"saved_model:{OURS}", export)}
        if not args.no_xla:
            paths[XLA] = (f"saved_model:{XLA}", export)
        environments = {}
        if args.onednn:
            for name in list(paths):
                paths[name + ONEDNN] = paths[name]
                environments[name] = {ONEDNN_FLAG: "0"}
                environments[name + ONEDNN] = {ONEDNN_FLAG: "1"}
        if not args.no_litert:
            paths[LITERT] = ("litert", str(convert_litert(export, work / "model.tflite")))
        for quantization in args.quantizations:
            # force: a CTranslate2 model an earlier run left in --work-dir is replaced
            # (`convert` refuses a directory that is not one)
            path = convert(model, config, tokenizer, work / f"ctranslate2-{quantization}",
                           quantization=None if quantization == "float32" else quantization, force=True)
            paths[f"ctranslate2 {quantization}"] = (quantization, str(path))
        self.names = list(paths)
        self.threads = list(args.threads)
        context = multiprocessing.get_context("spawn")
        self.workers = {}
        for name, (kind, path) in paths.items():
            for threads in self.threads:
                parent, child = context.Pipe()
                process = context.Process(target=_serve_worker, args=(child, kind, path, threads, options, EOS_ID,
                                                                      environments.get(name)), daemon=True)
                process.start()
                self.workers[name, threads] = (parent, process)
        for key, (connection, _) in self.workers.items():
            if connection.recv() != "ready":
                raise RuntimeError(f"worker {key} did not start")
        self.calls = list(self.workers)  # (name, threads), every variant's thread counts together

    def run(self, key, batches):
        """Translates `batches` (lists of str) in the process of `key`, a (variant name,
        threads) pair: `(seconds, translations, generated)`, see `_serve_worker`."""
        connection, _ = self.workers[key]
        connection.send(batches)
        return connection.recv()

    def close(self):
        for connection, process in self.workers.values():
            connection.send(None)
            process.join(timeout=30)

    def tokens(self, translations):
        """Target tokens by one rule for every variant: pieces of the translation + EOS."""
        return sum(len(self.processor.encode(t)) + 1 for t in translations)


# The largest batch whose steps `SearchProfile` counts by sentences not done.
MAX_PROFILED_BATCH = 4096


class SearchProfile:
    """Loop steps and rows of the search per batch, counted in this process by the
    `Translator` the export is made from (the same search as `serving_default`),
    through a `logits_filter` that counts the step function's calls and rows."""

    def __init__(self, model, config, tokenizer, patience=0.0):
        import tensorflow as tf

        from keras_transformer.decoding import SearchOptions
        from keras_transformer.inference.searcher import CACHE_STAGES
        from keras_transformer.inference.translator import Translator

        beam_size = config.beam_size
        # steps by stage (row 0: `translate_xla`'s first cache stage, which runs on the whole
        # batch; row 1: the later ones) and by the number of sentences not done (the rows of
        # `serving_default`'s step / beam)
        self.steps_by_alive = tf.Variable(tf.zeros([2, MAX_PROFILED_BATCH + 1], tf.int64))
        self.step = tf.Variable(0, dtype=tf.int32)  # the step of the batch being searched

        def count(logits):
            alive = tf.minimum(tf.shape(logits)[0] // beam_size, MAX_PROFILED_BATCH)
            later = tf.cast(self.step >= CACHE_STAGES[0], tf.int32)
            self.steps_by_alive.assign_add(tf.scatter_nd([[later, alive]], tf.ones([1], tf.int64),
                                                         [2, MAX_PROFILED_BATCH + 1]))
            self.step.assign_add(1)
            return logits

        translator = Translator(model, config, tokenizer.model_bytes, logits_filter=count)
        self.beam_size = beam_size
        self.translator = translator

        def search(text):
            return translator.translate_graph(text, SearchOptions(
                beam_size=beam_size, alpha=config.length_penalty_alpha, num_results=1,
                extra_length=config.decode_extra_length,
                patience=tf.constant(patience) if patience > 0 else None))[0]

        self.search = tf.function(search, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)

    def xla_batch(self, sentences):
        """The batch bucket `translate_xla` pads `sentences` sentences to."""
        return int(self.translator.searcher.bucketed_shape(sentences, 1)[0])

    def xla_rows(self, alive, padded, first_stage=False):
        """The rows `translate_xla` runs a step on with `alive` sentences not done in a
        batch padded to `padded`: in its first cache stage the whole batch, later the
        smallest of its halving sizes that holds them."""
        from keras_transformer.decoding import halving_sizes
        from keras_transformer.inference.searcher import XLA_BATCH_HALVINGS

        sizes = [padded] if first_stage else halving_sizes(padded, XLA_BATCH_HALVINGS)
        return min(size for size in sizes if size >= alive) * self.beam_size

    def __call__(self, batches):
        """`(steps, rows, xla_rows)`: loop steps, rows `serving_default` runs (it drops
        finished sentences) and rows `translate_xla` runs, summed over `batches`."""
        import numpy as np
        import tensorflow as tf

        total = [0, 0, 0]
        for batch in batches:
            self.steps_by_alive.assign(tf.zeros_like(self.steps_by_alive))
            self.step.assign(0)
            self.search(tf.constant(batch))
            counts = self.steps_by_alive.numpy()  # [2, alive]
            padded = self.xla_batch(len(batch))
            total[0] += int(counts.sum())
            total[1] += int((counts.sum(axis=0) * np.arange(counts.shape[1])).sum()) * self.beam_size
            total[2] += sum(int(n) * self.xla_rows(alive, padded, first_stage=stage == 0)
                            for stage in range(2) for alive, n in enumerate(counts[stage]) if n)
        return total


def best_threads(rate, names, threads):
    """name -> the thread count at which the variant's median tokens/s is highest (the
    first of `threads` on a tie); `rate[name, threads]` is its tokens/s round by round."""
    return {name: max(threads, key=lambda t: statistics.median(rate[name, t])) for name in names}


def run_batch_size(variants, sentences, batch_size, rounds, pause, profile=None):
    """Times every worker on `sentences` in batches of `batch_size`: the report's lines and
    each variant's best-to-best ratio (median over rounds) to CTranslate2 float32's best."""
    batches = [sentences[i:i + batch_size] for i in range(0, len(sentences), batch_size)]
    names, threads, keys = variants.names, variants.threads, variants.calls
    warm_up = {key: variants.run(key, batches) for key in keys}
    outputs = {key: result[1] for key, result in warm_up.items()}
    tokens = {key: variants.tokens(outputs[key]) for key in keys}
    first = threads[0]  # the thread count whose translations are compared between engines
    lines = []
    for name in [n for n in names if n.startswith("ctranslate2")]:
        same = sum(a == b for a, b in zip(outputs[OURS, first], outputs[name, first]))
        lines.append(f"# {OURS} vs {name}: {same} of {len(sentences)} translations identical; "
                     f"target tokens {tokens[OURS, first]} vs {tokens[name, first]}")
    for name in (XLA, LITERT, OURS + ONEDNN, XLA + ONEDNN):
        if name in names:
            same = sum(a == b for a, b in zip(outputs[OURS, first], outputs[name, first]))
            lines.append(f"# {OURS} vs {name}: {same} of {len(sentences)} translations identical")
    if len(threads) > 1:
        alike = [f"{name} {sum(len({outputs[name, t][i] for t in threads}) == 1 for i in range(len(sentences)))}"
                 for name in names]
        lines.append(f"# translations identical at {', '.join(map(str, threads))} threads, of {len(sentences)}: "
                     f"{', '.join(alike)}")
    lengths = sorted(warm_up[BASELINE, first][2])
    lines.append(f"# generated tokens per sentence (CTranslate2 float32's ids, EOS included if produced): "
                 f"{lengths[0]}..{lengths[-1]}")
    # Each worker reports the seconds it measured; the pause lets the previous worker's
    # threads go idle first (CTranslate2's OpenMP threads spin for a while after a call).
    seconds = harness.interleaved_rounds({key: (lambda k=key: variants.run(k, batches)[0]) for key in keys},
                                         rounds, pause=pause)
    rate = {key: [tokens[key] / s for s in seconds[key]] for key in keys}
    rows = [[name, t, harness.spread(rate[name, t], "{:.0f}"),
             harness.spread(harness.round_ratios(rate[name, t], rate[BASELINE, t]))]
            for name in names for t in threads]
    lines.append(harness.table([f"batch {batch_size}", "threads", "target tokens/s, median (min-max)",
                                f"ratio to {BASELINE} at the same threads, median (min-max)"], rows))
    best = best_threads(rate, names, threads)
    baseline = rate[BASELINE, best[BASELINE]]
    ratios, rows = {}, []
    for name in names:
        per_round = harness.round_ratios(rate[name, best[name]], baseline)
        ratios[name] = statistics.median(per_round)
        rows.append([name, best[name], harness.spread(rate[name, best[name]], "{:.0f}"), harness.spread(per_round)])
    lines.append("\n" + harness.table([f"batch {batch_size}: best", "threads", "target tokens/s, median (min-max)",
                                       f"ratio to {BASELINE}'s best, median (min-max)"], rows))
    if profile is not None:
        lines += search_lines(profile, batches, {name: seconds[name, best[name]] for name in names}, best,
                              batch_size)
    return lines, ratios


def search_lines(profile, batches, seconds, best, batch_size):
    """The search's loop steps per batch, rows per step and time per step of our variants
    (`seconds`: each one's pass times at its best thread count, `best`).
    Every variant of ours runs the same steps (the same search and stopping rule);
    `serving_default` runs only the sentences not yet done, `translate_xla` (after its
    first cache stage) the smallest of its halving sizes that holds them, LiteRT the rows
    of `serving_default` (`Searcher.search_litert`)."""
    steps, rows, xla_rows = profile(batches)
    not_done = rows / steps  # the rows of the sentences not yet done: serving_default's and LiteRT's
    computed = {OURS: not_done, XLA: xla_rows / steps, LITERT: not_done}
    computed.update({name + ONEDNN: computed[name] for name in (OURS, XLA)})
    rows = [[f"{name} (search)", f"{steps / len(batches):.1f}", f"{computed[name]:.1f}",
             f"{statistics.median(seconds[name]) / steps * 1000:.2f}", best[name]]
            for name in computed if name in seconds]
    return ["\n" + harness.table([f"batch {batch_size}: search", "loop steps per batch",
                                  "rows per step, mean (sentences x beam)", "ms per step", "threads"], rows)]


def clear_earlier_run(work):
    """Removes the SavedModel versions an earlier run left in `work`/export (each run
    exports a new version there; `convert` replaces CTranslate2's models, `export.tflite`
    model.tflite): a line naming what an earlier run had left, or None."""
    export = work / "export"
    versions = [path for path in sorted(export.iterdir()) if path.name.isdigit()
                and (path / "saved_model.pb").is_file()] if export.is_dir() else []
    for path in versions:
        shutil.rmtree(path)
    left = ([f"export/{path.name}" for path in versions]
            + [path.name for path in [work / "model.tflite", *sorted(work.glob("ctranslate2-*"))] if path.exists()])
    return f"# --work-dir {work}: replacing an earlier run's {', '.join(left)}" if left else None


def main(argv=None):
    args = parse_args(argv)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import tensorflow as tf

    harness.set_threads(max(args.threads))  # this process only exports and counts steps (untimed)
    import ctranslate2
    import keras

    started = time.time()
    with tempfile.TemporaryDirectory() as temporary:
        work = pathlib.Path(args.work_dir or temporary)
        work.mkdir(parents=True, exist_ok=True)
        earlier = clear_earlier_run(work)
        if args.model_dir:
            model, config, tokenizer, sentences, described = trained_model(args)
        else:
            model, config, tokenizer, sentences, described = shaped_model(args, work)
        # The config is every side's one source of the beam (the export's signatures,
        # CTranslate2's options, the step counts): --beam-size, not the run's own (the
        # multi30k preset serves with beam 5; its export against CTranslate2's beam 4
        # timed a quarter more rows on our side).
        config = dataclasses.replace(config, beam_size=args.beam_size)
        try:
            variants = Variants(model, config, tokenizer, work, args)
        except FileExistsError as error:  # e.g. --work-dir/ctranslate2-float32 is not a CTranslate2 model
            sys.exit(f"translate_speed: {error}")
        profile = SearchProfile(model, config, tokenizer, args.export_patience)
        print(harness.header("translate speed", harness.versions(tf, keras, ctranslate2)))
        print(f"# model: {described}")
        if earlier:
            print(earlier)
        ours = f"patience {args.export_patience:g}" if args.export_patience > 0 else "exact search"
        print(f"# {len(sentences)} sentences, beam {args.beam_size}, alpha {config.length_penalty_alpha}, "
              f"+{config.decode_extra_length}, {', '.join(map(str, args.threads))} threads (every engine at each, "
              f"compared at its best), {args.rounds} timed rounds; "
              f"stopping: ours {ours}, CTranslate2 patience {args.patience:g}\n")
        headline = None
        try:
            for batch_size in args.batch_sizes:
                subset = sentences if batch_size > 1 else sentences[:args.batch_one_count]
                lines, ratios = run_batch_size(variants, subset, batch_size, args.rounds, args.pause, profile)
                print("\n".join(lines) + "\n", flush=True)
                headline = headline or (batch_size, ratios[OURS])
        finally:
            variants.close()
    print(harness.finish(f"serving_default_best_vs_ctranslate2_float32_best_batch{headline[0]}",
                         f"{headline[1]:.2f}", started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
