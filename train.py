"""Train a Transformer, average its last checkpoints, report BLEU, export it.

    python train.py                                   # tiny model, embedded corpus, ~4 min on 2 cores
    python train.py --data ../shared/data/multi30k --config small --steps 20000 --model-dir runs/m30k

Flow: flags -> corpus -> shared SentencePiece tokenizer (trained once, kept in
the model directory) -> token-budget batches -> `model.fit` under
`tf.distribute.MirroredStrategy` (all visible GPUs; the default strategy on
one device) with checkpoints every `--checkpoint-every` steps -> average of
the last K checkpoints (paper: 5 for base) -> sacreBLEU on the validation set
with beam search -> SavedModel export.

Re-running the same command resumes from the newest complete checkpoint
(after Ctrl-C, SIGTERM or kill -9 alike): weights, Adam moments and the step
counter that drives the learning-rate schedule continue where they were.
SIGTERM or Ctrl-C writes a checkpoint and exits 0; a NaN loss stops the run
(exit 1) without checkpointing bad weights.

This file is only the command line: the run is `keras_transformer.training`,
its defaults are `keras_transformer.config`, the export is `export.saved_model`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

if __name__ == "__main__":
    # Quiet console unless --verbose: asked before keras_transformer imports TensorFlow.
    os.environ.setdefault("KERAS_TRANSFORMER_QUIET", "0" if "--verbose" in sys.argv[1:] else "1")

from keras_transformer import console  # noqa: E402  (imports TensorFlow quietly when asked)
from keras_transformer.config import (  # noqa: E402
    BATCH_TOKENS, MODEL_OVERRIDE_FIELDS, PRESETS, SYNTAX_FIELDS, TrainingConfig, TransformerConfig)

log = logging.getLogger("train")


from keras_transformer.console import OneLineArgumentParser  # noqa: E402

def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    batch_tokens = ", ".join(f"{name} {value}" for name, value in BATCH_TOKENS.items())
    parser.add_argument("--config", default="tiny", choices=sorted(PRESETS), metavar="PRESET",
                        help="model preset: tiny (default, CPU minutes), small, base or big (paper Table 3), or "
                             "multi30k (the Multi30k recipe for a 60-minute CPU budget)")
    parser.add_argument("--data", default="embedded",
                        help="'embedded' (default: generated En->De corpus shipped with the package), "
                             "a directory of train.SRC/train.TGT, valid.*, test*.* text files, "
                             "or a TFDS name such as wmt14_translate/de-en or tfds:NAME")
    parser.add_argument("--source-lang", default=None, help="source language code (default en)")
    parser.add_argument("--target-lang", default=None, help="target language code (default de)")
    parser.add_argument("--model-dir", default="runs/default",
                        help="where the tokenizer, checkpoints, logs, curves and export go; "
                             "an existing run there is resumed")
    parser.add_argument("--steps", type=int, default=None,
                        help="total optimizer steps (default: the preset's train_steps: 600 for tiny, "
                             "100000 for base)")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help=f"padded tokens per side in one global batch (paper: 25000; default "
                             f"per preset: {batch_tokens})")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="SentencePiece vocabulary size when a tokenizer is trained "
                             "(default: the preset's, 37000 for base/big as in the paper)")
    parser.add_argument("--max-length", type=int, default=None,
                        help="longest source/target in tokens; longer pairs are dropped and counted "
                             "(default: the preset's max_length)")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help="steps between checkpoints (default: steps/10, at least 1)")
    parser.add_argument("--keep-checkpoints", type=int, default=None,
                        help="checkpoints kept on disk (default: the number averaged; one more is "
                             "kept for a checkpoint written at a stop signal)")
    parser.add_argument("--average", type=int, default=None,
                        help="average the last K checkpoints into the final weights "
                             "(default: 5 for base/tiny/small, 20 for big, as in the paper)")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="wall-clock budget for training, in minutes: at a checkpoint, stop if the next "
                             "round would end past it, then average, evaluate and export as usual "
                             "(default: none; 60 for --config multi30k)")
    parser.add_argument("--beam-size", type=int, default=None, help="beam for BLEU (default 4)")
    parser.add_argument("--bleu-every-sentences", type=int, default=None,
                        help="validation sentences translated greedily at every checkpoint for the "
                             "BLEU curve (default 100; 0 disables)")
    parser.add_argument("--jit-compile", action="store_true",
                        help="compile the train step with XLA")
    parser.add_argument("--mixed-precision", action="store_true",
                        help="mixed_float16 on GPUs (with loss scaling), mixed_bfloat16 on CPU")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of weights, dropout, shuffling and data: two runs from scratch with "
                             "the same seed on one device give identical losses and weights")
    parser.add_argument("--allow-data-change", action="store_true",
                        help="resume a run although its training data changed (run.json records a "
                             "fingerprint: file sizes and hashes, or TFDS name and version)")
    parser.add_argument("--no-export", action="store_true",
                        help="skip the SavedModel export at the end")
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's and Keras's own log lines and warnings")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="set a model field on top of the preset, repeatable, e.g. --set dropout=0.3 "
                             f"--set num_layers=4; fields: {', '.join(MODEL_OVERRIDE_FIELDS)} "
                             "(keras_transformer.config.TransformerConfig documents each)")
    syntax = parser.add_argument_group(
        "syntax-aware models (survey section 3; README 'Syntax-aware models'): the source side must be "
        "CoNLL-U (SPLIT.SRC.conllu in a --data directory, or the embedded corpus's gold trees)")
    syntax.add_argument("--source-tags", default=None, metavar="upos,deprel",
                        help="tag factors added to each source word's embedding (comma-separated)")
    syntax.add_argument("--tag-combination", default=None, choices=("sum", "ffn"),
                        help="sum of the embeddings (default) or one feed-forward layer over them")
    syntax.add_argument("--syntax-attention", default=None, choices=("none", "hard", "soft"),
                        help="tree-distance masking of encoder self-attention: hard (omega <= "
                             "--syntax-max-distance) or soft (DNorm of omega)")
    syntax.add_argument("--syntax-form", default=None, choices=("additive", "multiplicative"),
                        help="how the mask enters the scores (default additive)")
    syntax.add_argument("--syntax-max-distance", type=int, default=None, help="omega_max of hard masking (1)")
    syntax.add_argument("--syntax-dnorm", default=None, choices=("zscore", "inverse"),
                        help="soft masking's normalisation (default zscore)")
    syntax.add_argument("--syntax-layers", default=None, metavar="0,1",
                        help="encoder layers (0 = lowest) with syntax attention (default all)")
    syntax.add_argument("--syntax-heads", default=None, metavar="0,1",
                        help="heads with syntax attention in those layers (default all)")
    args = parser.parse_args(argv)
    try:
        options = _syntax_options(args)
        model = _model_options(args.set)
    except ValueError as error:
        parser.error(str(error))
    try:
        args.run = TrainingConfig.create(
            args.config, data=args.data, source_lang=args.source_lang, target_lang=args.target_lang,
            model_dir=args.model_dir, steps=args.steps, batch_tokens=args.batch_tokens,
            vocab_size=args.vocab_size, max_length=args.max_length,
            checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints,
            average=args.average, beam_size=args.beam_size,
            bleu_every_sentences=args.bleu_every_sentences, jit_compile=args.jit_compile,
            mixed_precision=args.mixed_precision, seed=args.seed,
            allow_data_change=args.allow_data_change, max_minutes=args.max_minutes, syntax=options,
            model=model)
    except ValueError as error:  # e.g. "steps must be a positive integer, got -1"
        if options and any(name in str(error) for name in SYNTAX_FIELDS):
            parser.error(f"syntax-aware options: {error}")
        if model and (str(error).startswith("model:") or any(name in str(error) for name in model)):
            parser.error(f"--set: {error}")
        field, _, rest = str(error).partition(" ")
        parser.error(f"--{field.replace('_', '-')} {rest}")
    return args


def _model_options(settings: list[str]) -> dict:
    """`--set FIELD=VALUE` flags as `TrainingConfig.model`, each value read as its
    field's type (`TransformerConfig`'s default tells it)."""
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    model = {}
    for setting in settings:
        name, equals, text = setting.partition("=")
        name = name.strip().replace("-", "_")
        if not equals or name not in MODEL_OVERRIDE_FIELDS:
            raise ValueError(f"--set {setting!r}: expected FIELD=VALUE with FIELD one of "
                             f"{', '.join(MODEL_OVERRIDE_FIELDS)}")
        kind = type(defaults[name])
        try:
            if kind is bool:
                if text.strip().lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                model[name] = text.strip().lower() in ("true", "1")
            else:
                model[name] = kind(text)
        except ValueError:
            raise ValueError(f"--set {setting!r}: {name} takes a {kind.__name__}") from None
    return model


def _syntax_options(args) -> dict:
    """The syntax-aware flags that were given, as `TrainingConfig.syntax`."""
    def integers(flag, text):
        try:
            return tuple(int(item) for item in text.split(",") if item.strip())
        except ValueError:
            raise ValueError(f"--{flag} {text!r}: expected comma-separated integers such as 0,1") from None

    options = {}
    if args.source_tags is not None:
        options["source_tags"] = tuple(item.strip() for item in args.source_tags.split(",") if item.strip())
    for name in ("tag_combination", "syntax_attention", "syntax_form", "syntax_max_distance", "syntax_dnorm"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    for name in ("syntax_layers", "syntax_heads"):
        if getattr(args, name) is not None:
            options[name] = integers(name.replace("_", "-"), getattr(args, name))
    return options


def main(argv=None) -> int:
    args = parse_args(argv)
    console.setup_logging(verbose=args.verbose)
    from keras_transformer.checkpoints import CheckpointError
    from keras_transformer.data import CorpusError, TokenizerError
    from keras_transformer.run_dir import RunError, write_results
    from keras_transformer.training import NonFiniteLossError, train_and_evaluate

    try:
        trained = train_and_evaluate(args.run)
        if trained.interrupted or not trained.chief:
            return 0
        results = trained.results
        if not args.no_export:
            from export.saved_model import export_model
            from keras_transformer.run_dir import EXPORT_DIR

            results["export"] = str(export_model(trained.model, trained.config, trained.tokenizer,
                                                 trained.model_dir / EXPORT_DIR))
            print(f"exported SavedModel to {results['export']}", flush=True)
            write_results(trained.model_dir, results)
    except NonFiniteLossError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 1
    except (RunError, CorpusError, TokenizerError, CheckpointError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C/SIGTERM: quit at once, no new checkpoint
        print("train.py: interrupted; run the same command again to resume from the newest complete "
              "checkpoint", file=sys.stderr)
        return 130
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
