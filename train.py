"""Train a Transformer, average its last checkpoints, report BLEU, export it.

    python train.py                                   # tiny model, embedded corpus, ~3 min on 2 cores (docs/quickstart.md)
    python train.py --data multi30k --config multi30k --model-dir runs/multi30k  # docs/training.md

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
import json
import logging
import sys

from keras_transformer import console
from keras_transformer.config import (
    MODEL_OVERRIDE_FIELDS, SYNTAX_FIELDS, ConfigError, TrainingConfig, command_line_options, model_settings)
from keras_transformer.console import OneLineArgumentParser

log = logging.getLogger("train")


def build_parser() -> argparse.ArgumentParser:
    """The flags, made from the config fields' option definitions
    (`keras_transformer.config.command_line_options`); `parse_args` parses with it."""
    parser = OneLineArgumentParser(
        prog="train.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options = command_line_options()
    syntax_group = parser.add_argument_group(
        "syntax-aware models (survey section 3; docs/syntax.md): the source side must be "
        "CoNLL-U (SPLIT.SRC.conllu in a --data directory, or the embedded corpus's gold trees)")
    for item in options:
        group = syntax_group if item.group == "syntax" else parser
        help_text = f"{item.help} (default: {item.default})"
        if item.kind is bool:
            group.add_argument(item.flag, action="store_true", help=help_text)
        else:
            group.add_argument(item.flag, type=str if item.is_tuple() else item.kind, default=None,
                               choices=None if item.is_tuple() else item.choices, help=help_text)
    parser.add_argument("--no-export", action="store_true",
                        help="skip the SavedModel export at the end")
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's and Keras's own log lines and warnings")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="set a model field on top of the preset, repeatable, e.g. --set dropout=0.3 "
                             f"--set num_layers=4; fields: {', '.join(MODEL_OVERRIDE_FIELDS)} "
                             "(keras_transformer.config.TransformerConfig documents each)")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """The flags (`build_parser`), as a `TrainingConfig` in `args.run`."""
    parser = build_parser()
    options = command_line_options()
    args = parser.parse_args(argv)
    try:
        syntax = _syntax_options(args, [item for item in options if item.group == "syntax"])
        model = model_settings(args.set)
    except ValueError as error:
        parser.error(str(error))
    values = {item.field: getattr(args, item.dest) for item in options if item.group == "run"}
    values = {name: value for name, value in values.items() if value is not None and value is not False}
    try:
        args.run = TrainingConfig.create(values.pop("preset", "tiny"), **values, syntax=syntax, model=model)
    except ConfigError as error:  # e.g. "steps must be a positive integer, got -1"
        parser.error(_flag_message(error, options, model))
    return args


def _flag_message(error: ConfigError, options, model) -> str:
    """`error` as the command line says it: naming the flag (or the option group) that set its field."""
    message = str(error)
    if error.field in SYNTAX_FIELDS:
        return f"syntax-aware options: {message}"
    if error.field == "model" or error.field in model:
        return f"--set: {message}"
    flag = next((item.flag for item in options if item.field == error.field), None)
    if flag is None and error.field in MODEL_OVERRIDE_FIELDS:  # e.g. num_heads, which --set d_model=130 broke
        return f"--set: {message}"
    flag = flag or "--" + error.field
    if message.startswith(error.field):  # "batch_tokens=32 cannot ..." -> "--batch-tokens=32 cannot ..."
        return flag + message[len(error.field):]
    return f"{flag}: {message}"


def _syntax_options(args, options) -> dict:
    """The syntax-aware flags that were given, as `TrainingConfig.syntax` (comma-separated
    lists as tuples)."""
    syntax = {}
    for item in options:
        text = getattr(args, item.dest)
        if text is None:
            continue
        if not item.is_tuple():
            syntax[item.field] = text
        elif item.field == "source_tags":
            syntax[item.field] = tuple(part.strip() for part in text.split(",") if part.strip())
        else:
            try:
                syntax[item.field] = tuple(int(part) for part in text.split(",") if part.strip())
            except ValueError:
                raise ValueError(f"{item.flag} {text!r}: expected comma-separated integers such as 0,1") from None
    return syntax


def main(argv=None) -> int:
    args = parse_args(argv)
    console.setup_logging(verbose=args.verbose)
    from keras_transformer.atomic_writes import write_failure
    from keras_transformer.data import CorpusError, TokenizerError
    from keras_transformer.run_dir import RunError, write_results
    from keras_transformer.training.callbacks import NonFiniteLossError
    from keras_transformer.training.checkpoints import CheckpointError
    from keras_transformer.training.run import train_and_evaluate

    try:
        trained = train_and_evaluate(args.run)
        if trained.interrupted or not trained.chief:
            return 0
        results = trained.results
        if not args.no_export:
            from export.errors import ExportWriteError
            from export.saved_model import export_model
            from keras_transformer.run_dir import EXPORT_DIR, FINAL_WEIGHTS, RESULTS_FILE

            try:
                results["export"] = str(export_model(trained.model, trained.config, trained.tokenizer,
                                                     trained.model_dir / EXPORT_DIR))
            except ExportWriteError as error:  # the run itself is complete: say how to export it later
                print(f"train.py: error: {error}. The run is complete ({trained.model_dir / FINAL_WEIGHTS}, "
                      f"{RESULTS_FILE}); free space and export it with: python -m export.saved_model "
                      f"--model-dir {trained.model_dir} --output {trained.model_dir / EXPORT_DIR}", file=sys.stderr)
                return 2
            print(f"exported SavedModel to {results['export']}", flush=True)
            write_results(trained.model_dir, results)
    except NonFiniteLossError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 1
    except (RunError, CorpusError, TokenizerError, CheckpointError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a file the run writes (tokenizer.model, hypotheses, curves.png): a full disk
        where = f"cannot write {error.filename}: " if error.filename else ""
        print(f"train.py: error: {where}{write_failure(error)}. Free space (or fix the permissions) and rerun the "
              f"same command: it resumes from the newest complete checkpoint", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # a second Ctrl-C/SIGTERM in training: quit at once, no new checkpoint;
        # or one while final.weights.h5 or the export was written: their temporary files removed
        return console.interrupted("train.py", error, "run the same command again to resume from the newest "
                                                      "complete checkpoint")
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
