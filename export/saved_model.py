"""SavedModel export for TF Serving: raw strings in, translations out.

    python -m export.saved_model --model-dir runs/default --output runs/default/export

writes `OUTPUT/<version>/` (the next integer version) holding one graph with
the SentencePiece tokenizer (its model is a constant inside the graph: no
asset file to lose), the averaged weights and the beam search:

* `serving_default`: `text` string `[None]` -> `translation` string
  `[None]`, `score` float32 `[None]` (beam 4, alpha 0.6, +50, as the paper);
* `translate_litert`: as `serving_default`, built from ops LiteRT has
  (`python -m export.tflite` converts it): no input hygiene, at most 64
  sentences per call;
* `translate_xla`: as `serving_default`, with the search XLA-compiled
  (`Searcher.search_xla`: inputs padded to a few batch and length buckets,
  same translations). Only for processes where XLA JIT runs: Python (what
  `export.translate` uses) or a TF Serving started with
  `--xla_cpu_compilation_enabled` (experimental); a default TF Serving fails
  on a request to it. `--xla-warmup` adds one warm-up request per bucket
  for it (only for such servers: TF Serving fails the load when a warm-up
  request fails);
* `score`: `text` string `[None]` and `target` string `[None]` -> `score` float32
  `[None]` (the target's log-probability under forced decoding), `tokens` string
  `[None, None]` (its pieces, then the EOS piece; "" after) and `token_scores` float32
  `[None, None]` (the log-probability of each; 0 after): `Translator.score_graph`;
* `align`: `text` string `[None]` and `target` string `[None]` -> `source_tokens` string
  `[None, None]`, `target_tokens` string `[None, None]` (each with its EOS piece; "" after)
  and `attention` float32 `[None, None, None]` (what each target piece attends to in the
  source: the last decoder layer's heads averaged): `Translator.align_graph`;
* `translate_options`: `text` string `[None]`, `beam_size` int32 (1..8),
  `alpha` float32, `extra_length` int32 (0..50), `num_results` int32
  (1..beam_size), `patience` float32, each option a scalar or one value per
  sentence (`[None]`, what TF Serving's `--enable_batching` needs: it
  concatenates the requests it merges along every input's first dimension;
  sentences with other options are searched apart, each as it would be
  alone) -> `translations` string `[None, None]`, `scores` float32
  `[None, None]`, best first, as many columns as the most results a sentence
  asked for (a sentence's columns beyond its own `num_results` are "" with
  score -1e9). Out-of-range options are clipped to those ranges rather than
  failing the request. `patience` <= 0 is the exact search; > 0 stops a
  sentence once `round(beam_size * patience)` hypotheses have finished
  (CTranslate2's rule: faster, not exact; `beam_search`). The exact search
  stops as soon as the `num_results` best are known: with one result, by the
  same bound as `serving_default` (the best finished hypothesis, not the
  worst of `beam_size`).
* `translate_advanced`: `translate_options` with CTranslate2's other decoding options, every
  input required (TF Serving requires each input of a signature in every request, so they
  could not be optional inputs of `translate_options`): `text`, `target_prefix` string (""
  for none; the translation starts with it), `translate_options`' five options, `min_length`
  int32, `no_repeat_ngram_size` int32 (0..`MAX_NO_REPEAT_NGRAM_SIZE`), `disallow_unk` bool,
  `sampling_topk` int32 (1: search; else sampling with one beam), `sampling_topp` float32,
  `sampling_temperature` float32, `seed` int32, each a scalar or one value per sentence ->
  `translations`, `scores` (as `translate_options`) and `errors` string `[None]`: "" or
  which option of that sentence is out of range (the sentence then gets "" with score 0;
  for a syntax-aware model, else the sentence's CoNLL-U problem, as `translate_options`').

`--signatures NAME,...` exports `serving_default` and the named signatures only (each left
out is neither traced nor saved: less export time, fewer megabytes, a faster load; a request
to it gets TF Serving's "no signature" error); the names are recorded in
`assets.extra/keras_transformer.json` beside the model config, the default patience and the
keras-transformer and TensorFlow versions that wrote the export (`export.translate --info`
prints them).

The search is exact by default (the best translation is the one a search
without early stop finds); `--patience P` makes CTranslate2's patience stop
the default of `serving_default`, `translate_xla` and `translate_litert`.

A syntax-aware model (`TransformerConfig.syntax_aware`) is exported with
`serving_default`, `translate_options`, `score`, `align` and `translate_advanced`, and their input is
`conllu` string `[None]`: one CoNLL-U sentence per string (what a parser of
the user's choice writes), parsed, tokenized per word and turned into tags
and tree distances inside the graph (`keras_transformer.data.annotated`, the
training pipeline's own ops). It has no LiteRT or XLA signature: those stay
plain-text only. Its signatures have one more output, `error` string
`[None]` (`serving_default`) or `errors` (`translate_options`, and `translate_advanced`
after a sentence's bad option): "" for a
well-formed sentence, else what is wrong with it (`annotated.sentence_errors`:
a word line without 10 tab-separated columns, a HEAD that is not a number,
names no word or does not lead to the root); such a sentence gets the
translation "" and score 0, and the other sentences of the request translate
as they would alone. (`score` and `align` have no such output: a malformed
sentence fails their request, naming its problem.)

The version directory is written under a hidden temporary name in `OUTPUT`
and renamed into place only when complete (TF Serving ignores non-numeric
names), so a crash never leaves a half-written version where a server would
load it. `assets.extra/tf_serving_warmup_requests` holds warm-up requests
for `serving_default` and `translate_options` (whose first call instantiates
its graph), so no request pays for building a graph; the latter gives its
options once per sentence, so that a TF Serving with `--enable_batching`
runs it too. `translate_options` is
one search whose beam size is a run-time input (`beam_search(max_beam_size=8)`),
not one copy per beam size.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import typing

from export.errors import ExportWriteError, output_problem
from export.signatures import (ADVANCED_SIGNATURE, ALL_SIGNATURES, OPTIONS_SIGNATURE, XLA_SIGNATURE,
                               chosen_signatures, signature_list)
from keras_transformer.atomic_writes import write_failure
from keras_transformer.config import TransformerConfig
from keras_transformer.console import (FiniteFloat, OneLineArgumentParser, PositiveInt, interrupted,
                                    names_on_first_use, sigterm_raises)
from keras_transformer.run_dir import AVERAGE_HELP

if typing.TYPE_CHECKING:
    from export.saved_model_graph import (TranslationModule, advanced_warmup_inputs, options_warmup_inputs,
                                          write_warmup_requests)

# The signatures' names, limits and warm-up texts are `export.signatures`' (a leaf module that
# the graph, `export.tflite` and `export.translate` import as well).

# The TensorFlow side of the export (`export.saved_model_graph`), imported on first use: the
# command's `--help` and flag errors answer without TensorFlow.
_GRAPH_NAMES = ("TranslationModule", "advanced_warmup_inputs", "options_warmup_inputs", "write_warmup_requests")


__getattr__ = names_on_first_use(__name__, dict.fromkeys(_GRAPH_NAMES, "export.saved_model_graph"))


def next_version(output: pathlib.Path) -> int:
    versions = [int(p.name) for p in output.iterdir() if p.is_dir() and p.name.isdigit()] if output.exists() else []
    return max(versions, default=0) + 1


def bucket_warmup_texts(tokenizer_model: bytes, config: TransformerConfig) -> list[tuple[int, str]]:
    """One sentence per source-length bucket of the XLA search: `(bucket, text)` with
    text that tokenizes to more tokens than the previous bucket holds and at most this
    one's (its EOS included), so that it is compiled for exactly that bucket."""
    import sentencepiece as spm

    from keras_transformer.inference.searcher import length_buckets

    processor = spm.SentencePieceProcessor(model_proto=tokenizer_model)
    texts, smaller = [], 0
    for bucket in length_buckets(config.max_length):
        words = ["the"]
        while len(processor.encode(" ".join(words))) + 1 < bucket:  # + 1: EOS
            words.append(("the", "warm", "up", "request")[len(words) % 4])
        while len(processor.encode(" ".join(words))) + 1 > bucket:
            words.pop()
        if len(processor.encode(" ".join(words))) + 1 > smaller:
            texts.append((bucket, " ".join(words)))
        smaller = bucket
    return texts


# What an export was built with, beside the warm-up requests (TF Serving ignores the rest of
# `assets.extra`): the package and TensorFlow versions that wrote it, its signature names, the
# model config and the serving defaults. `export.translate` reads its defaults from it, and
# `export.translate --info` prints it.
EXPORT_CONFIG_FILE = "keras_transformer.json"
# The record's fields, in the order written; an older export lacks the later additions
# (`config` and `patience` since issue #19, `signatures` since `--signatures`, the versions since 0.2.0).
EXPORT_RECORD_FIELDS = ("keras_transformer_version", "tensorflow_version", "signatures", "config", "patience")


def write_export_config(directory, config: TransformerConfig, patience: float,
                        signatures: typing.Sequence[str] = ()) -> pathlib.Path:
    import tensorflow as tf

    from keras_transformer import __version__

    path = pathlib.Path(directory) / "assets.extra" / EXPORT_CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"keras_transformer_version": __version__, "tensorflow_version": tf.__version__,
              "signatures": list(signatures), "config": config.to_dict(), "patience": patience}
    path.write_text(json.dumps(record, indent=1))
    return path


def read_export_record(directory) -> dict | None:
    """The JSON record an export was written with (`write_export_config`), as written; None for
    exports older than the file. Reads no TensorFlow."""
    path = pathlib.Path(directory) / "assets.extra" / EXPORT_CONFIG_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def read_export_config(directory) -> tuple[TransformerConfig, float] | None:
    """`(config, patience)` an export was built with; None for exports older than the file."""
    record = read_export_record(directory)
    if record is None:
        return None
    return TransformerConfig.from_dict(record["config"]), float(record.get("patience", 0.0))


def read_export_signatures(directory) -> tuple[str, ...] | None:
    """The signature names an export recorded (`--signatures`); None for exports older than
    that record (they hold all of their kind's signatures of the day)."""
    signatures = (read_export_record(directory) or {}).get("signatures")
    return None if signatures is None else tuple(signatures)


def left_out_reason(directory, name: str) -> str:
    """Why a plain-text export in `directory` has no `name` signature, from its record, for a
    command's error: left out by `--signatures` where the record names the others, else an
    export older than that signature."""
    chosen = read_export_signatures(directory)
    if chosen is not None and name not in chosen:
        return f"it was exported without it (export.saved_model --signatures); export it with {name}"
    return "an export older than that signature"


def export_model(model, config: TransformerConfig, tokenizer, output, version: int | None = None,
                 xla_warmup: bool = False, signatures=None, patience: float = 0.0) -> pathlib.Path:
    """Exports `model` to `output/<version>` atomically; returns that path.

    Args:
        model: trained `keras.Model`.
        config: its `TransformerConfig`.
        tokenizer: a `keras_transformer.data.Tokenizer` (or raw model bytes).
        output: the model base path TF Serving watches.
        version: integer version; default one more than the largest present.
        xla_warmup: also write warm-up requests for `translate_xla`, one per
            (length bucket, batch bucket); only for a TF Serving started with
            `--xla_cpu_compilation_enabled` (a default one fails the load).
        signatures: if given, export only these signature names (`serving_default`
            always; `chosen_signatures`). Each signature left out saves its
            tracing, megabytes and load time (docs/benchmarks.md, "Export and load
            time"); a client of a left-out signature gets TF Serving's "no signature"
            error. Default: all of the model's kind.
        patience: the default signatures' patience stop (0: the exact search;
            see the module docstring).
    """
    import tensorflow as tf

    from export.saved_model_graph import (TranslationModule, advanced_warmup_inputs, options_warmup_inputs,
                                          write_warmup_requests)

    output = pathlib.Path(output)
    if version is not None and int(version) < 0:  # (`--version -1` wrote export/-1, which TF Serving never loads)
        raise ValueError(f"version must be >= 0: TF Serving loads only versions named by a non-negative "
                         f"integer, got {version}")
    output.mkdir(parents=True, exist_ok=True)
    version = next_version(output) if version is None else int(version)
    final = output / str(version)
    if final.exists():
        raise FileExistsError(f"{final} already exists; TF Serving versions are immutable, pick another --version")
    tokenizer_model = tokenizer if isinstance(tokenizer, bytes) else tokenizer.model_bytes
    if patience < 0:
        raise ValueError(f"patience must be >= 0 (0: the exact search), got {patience}")
    names = chosen_signatures(config, signatures)  # (a bad name: before anything is traced or written)
    if xla_warmup and XLA_SIGNATURE not in names:
        raise ValueError("--xla-warmup: " + ("a syntax-aware model has no translate_xla signature"
                                             if config.syntax_aware else "the export leaves out translate_xla"))
    module = TranslationModule(model, config, tokenizer_model, patience=patience, signatures=names)
    staging = output / f".tmp-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with sigterm_raises():  # a SIGTERM while writing removes the staging directory, as Ctrl-C does
        try:
            functions = module.signatures()
            tf.saved_model.save(module, str(staging), signatures=functions)
            xla_texts = [text for _, text in bucket_warmup_texts(tokenizer_model, config)] if xla_warmup else None
            options = options_warmup_inputs(config, patience) if OPTIONS_SIGNATURE in names else None
            advanced = advanced_warmup_inputs(config, patience) if ADVANCED_SIGNATURE in names else None
            write_warmup_requests(staging, xla_texts=xla_texts, conllu=config.syntax_aware, options=options,
                                  advanced=advanced)
            write_export_config(staging, config, patience, names)
            os.rename(staging, final)  # atomic on one file system
        except (OSError, tf.errors.OpError) as error:  # a full disk, no permission: one line, not TF's traceback
            shutil.rmtree(staging, ignore_errors=True)
            raise ExportWriteError(f"cannot write the export {final}: {write_failure(error)}; nothing was left "
                                   f"in {output}") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return final


def build_parser() -> argparse.ArgumentParser:
    """The command line: `main` parses with it, and the command reference is made from it."""
    parser = OneLineArgumentParser(prog="export.saved_model", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True, help="a model directory written by train.py")
    parser.add_argument("--output", required=True, help="export base directory; the version goes below it")
    parser.add_argument("--version", type=int, default=None, help="version number (default: next free)")
    parser.add_argument("--xla-warmup", action="store_true",
                        help="also warm up translate_xla, one request per length and batch bucket; only for "
                             "a TF Serving started with --xla_cpu_compilation_enabled (a default one fails the "
                             "load on these requests)")
    parser.add_argument("--patience", type=float, action=FiniteFloat, default=0.0,
                        help="stop a sentence once round(beam * P) hypotheses have finished, as CTranslate2 "
                             "does, in serving_default, translate_xla and translate_litert (default 0: the exact "
                             "search; translate_options takes it per request)")
    parser.add_argument("--signatures", type=signature_list, default=None, metavar="NAME,...",
                        help="export only serving_default and these signatures (comma-separated; default: all "
                             f"of the model's: {', '.join(ALL_SIGNATURES[1:])}); each left out saves export "
                             "time, megabytes and load time")
    parser.add_argument("--average", type=int, action=PositiveInt, default=None, metavar="K", help=AVERAGE_HELP)
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's own start-up lines and warnings")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.patience < 0:
        parser.error(f"--patience must be >= 0 (0: the exact search), got {args.patience}")
    if args.xla_warmup and args.signatures is not None and XLA_SIGNATURE not in args.signatures:
        parser.error("--xla-warmup warms up translate_xla, which --signatures leaves out")
    if args.version is not None and args.version < 0:  # before loading and tracing
        parser.error(f"--version must be >= 0 (TF Serving loads only non-negative integer versions), "
                     f"got {args.version}")
    unwritable = output_problem(args.output, directory=True)  # before loading and tracing, not after
    if unwritable:
        print(f"export.saved_model: error: --output {unwritable}", file=sys.stderr)
        return 2
    from keras_transformer.data import TokenizerError
    from keras_transformer.run_dir import RunError, load_trained

    try:
        model, config, tokenizer = load_trained(args.model_dir, average=args.average,
                                                log=lambda line: print(f"export.saved_model: {line}",
                                                                       file=sys.stderr))
        path = export_model(model, config, tokenizer, args.output, args.version, xla_warmup=args.xla_warmup,
                            signatures=args.signatures, patience=args.patience)
    except (RunError, TokenizerError, OSError, ValueError) as error:  # OSError: FileExistsError, permissions
        print(f"export.saved_model: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM while it wrote (it was a traceback)
        return interrupted("export.saved_model", error, f"no version was added to {args.output}")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
