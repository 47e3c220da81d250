"""Translate lines from stdin with an exported SavedModel, one output line each.

    echo "Today the man sees the dog." | python -m export.translate --saved-model runs/default/export/1

Only TensorFlow and tensorflow-text are needed to run the export (the
project's own code is not imported by the model). With the export's
defaults it calls the `serving_default` signature, the plain TensorFlow
graph TF Serving runs; `--xla` calls `translate_xla` instead (the same
translations, the search XLA-compiled). A command of a few seconds' work
does not pay back XLA's compile of each (length, batch) bucket it meets: on
a Multi30k-shaped export, 1, 16, 200 and 1,000 lines took 1.1-1.3x, 2.3x,
4.7-5.2x and 2.1-2.2x the process time with `--xla` (docs/lab-notebook, "The
translate command without XLA"). The flags of `translate_options`' options
(`--beam-size`, `--alpha`, `--n-best`, `--patience`) use that signature; those of the
"decoding options" group (`--target-prefix` and each other option of the decoding
options table, docs/reference/options.md) use `translate_advanced`. A syntax-aware
export reads CoNLL-U from stdin instead (sentences separated by blank lines) and
prints one translation per sentence; a malformed sentence gets an empty
line, one line on stderr naming it and its problem, and exit status 1,
while the sentences around it are translated.

`--info` prints what the export records instead of translating (the keras-transformer and
TensorFlow versions that wrote it, its signatures, the model config's main fields, its
default patience), read from its `assets.extra/keras_transformer.json` without TensorFlow;
for an export older than a field of that record, one line names what is not recorded.

With `--xla`, `TF_XLA_FLAGS=--tf_xla_persistent_cache_directory=DIR` in the environment
keeps `translate_xla`'s compiled programs in DIR, so that a later run skips compiling
each (length, batch) bucket an earlier one compiled (TensorFlow reads the
variable once, when it first lists its devices, which the command's quiet
import does: set it before the process starts).
"""

import argparse
import os
import sys

from export.errors import missing_saved_model, newest_version
from export.signatures import ADVANCED_SIGNATURE, OPTIONS_SIGNATURE, SERVING_DEFAULT, XLA_SIGNATURE
from keras_transformer.config import TransformerConfig
from keras_transformer.console import (FiniteFloat, OneLineArgumentParser, PositiveInt, harmless_lines_dropped,
                                       input_lines, interrupted, sigterm_raises, stdout_failed)
from keras_transformer.constants import MAX_BEAM_SIZE
from keras_transformer.decoding import options as decoding_options

# TensorFlow's persistent XLA cache, asked for in the environment before the process starts
# (`TF_XLA_FLAGS=--tf_xla_persistent_cache_directory=DIR`; docs/export.md, "Translating from the shell").
XLA_CACHE_FLAG = "--tf_xla_persistent_cache_directory="

# Lines per request when stdin is not a terminal.
BATCH_SIZE = 64

# Exports made before `assets.extra/keras_transformer.json` recorded their config were all
# built with the paper's decoding options (beam 4, alpha 0.6, +50).
PAPER = TransformerConfig()

# `--info`: the recorded config's fields on its `model` and `decoding` lines (syntax-aware
# exports add a `syntax` line).
INFO_MODEL_FIELDS = ("vocab_size", "num_layers", "num_decoder_layers", "d_model", "d_ff", "num_heads",
                     "max_length", "norm_first")
INFO_DECODING_FIELDS = ("beam_size", "length_penalty_alpha", "decode_extra_length")
INFO_SYNTAX_FIELDS = ("source_tags", "syntax_attention")

# How the command parses the decoding options' flags (`decoding_options.add_flags`): a NaN or
# infinite float, or an --n-best below 1, is the parser's one-line error.
FLAG_TYPES = {"int": (int, None), "float": (float, FiniteFloat), "positive int": (int, PositiveInt)}


def build_parser() -> argparse.ArgumentParser:
    """The command line: `main` parses with it, and the command reference is made from it."""
    parser = OneLineArgumentParser(prog="export.translate", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saved-model", required=True,
                        help="an export version directory, e.g. EXPORT/1; or EXPORT, or the model "
                             "directory that holds it: its newest version, as TF Serving picks")
    # translate_options' flags (its options that have one: --beam-size, --alpha, --n-best, --patience), from their rows
    decoding_options.add_flags(parser, FLAG_TYPES, decoding_options.signature_options(OPTIONS_SIGNATURE), PAPER,
                               defaults=True)
    decoding = parser.add_argument_group(
        "decoding options", "any of them calls the translate_advanced signature (as CTranslate2's options of "
                            "those names)")
    decoding.add_argument("--target-prefix", default=None, metavar="TEXT",
                          help="every translation starts with TEXT (printed with it)")
    decoding_options.add_flags(decoding, FLAG_TYPES, decoding_options.ADVANCED)
    parser.add_argument("--batch-size", type=int, action=PositiveInt, default=None,
                        help=f"lines per request (default {BATCH_SIZE}; 1 when stdin is a terminal, so that a "
                             f"line typed is translated when Enter is pressed)")
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument("--xla", action="store_true",
                        help="call translate_xla, the search XLA-compiled (same translations; each (length, "
                             "batch) bucket of the requests compiles first: seconds each, docs/performance.md), instead of "
                             "serving_default")
    engine.add_argument("--no-xla", action="store_true",
                        help="call serving_default, plain TensorFlow as TF Serving runs it (the default since "
                             "2026-12-02; kept for the scripts that give it)")
    parser.add_argument("--info", action="store_true",
                        help="print what the export records and exit without translating: the keras-transformer "
                             "and TensorFlow versions that wrote it, its signatures, the model config's main "
                             "fields and its default patience (from its assets.extra/keras_transformer.json, "
                             "without TensorFlow; the other flags are ignored)")
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's own start-up lines and warnings")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.info:
        return _print_info(args.saved_model)
    _check_ranges(parser, args)
    advanced = _advanced_problem(parser, args)  # (a bad value: parser.error, before TensorFlow loads)

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)

    try:
        export = _open_export(args, advanced)
    except _Refused as refused:
        print(f"export.translate: error: {refused}", file=sys.stderr)
        return 2
    default, options, source, plain_request = export.default, export.options, export.source, export.plain_request

    if advanced and args.sampling_topk not in (None, 1) and args.beam_size is None:
        args.beam_size = 1  # (sampling draws one piece a step: one beam)
    option_inputs = _options_inputs(args, export.defaults, export.default_patience, export.option_names)
    if args.xla and plain_request:
        # Grappler would optimize translate_xla's graph before XLA compiles it: 2-3 s more per
        # bucket's first request on the multi30k preset's shape, for the same program speed and
        # translations (docs/lab-notebook, serving speed part 30). This process calls nothing else.
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

    failed = []  # (sentence number, problem) of the malformed CoNLL-U sentences

    def report(errors, first):
        """A syntax-aware export names a malformed sentence in its own row of `error(s)`."""
        for number, error in enumerate(errors.numpy() if errors is not None else [], start=first):
            if error:
                failed.append((number, error.decode("utf-8")))
                print(f"export.translate: error: sentence {number}: {error.decode('utf-8')} "
                      f"(an empty line printed for it)", file=sys.stderr)

    def flush(batch):
        if not batch:
            return
        text = tf.constant(batch)
        if plain_request:
            out = default(**{source: text})
            lines, errors = [line.decode("utf-8") for line in out["translation"].numpy()], out.get("error")
        else:
            out = options(**{source: text}, **option_inputs)
            lines = [row[0].decode("utf-8") if args.num_results == 1 else
                     "\t".join(f"{t.decode('utf-8')}\t{s:.4f}" for t, s in zip(row, scores))
                     for row, scores in zip(out["translations"].numpy(), out["scores"].numpy())]
            errors = out.get("errors")
        # A request's lines in one write, flushed: a stop (SIGTERM, Ctrl-C, kill -9) leaves whole
        # requests in a redirected file, where up to 8 KB of printed lines had waited in the buffer
        # (a line and its newline were two writes, so the file could end between them).
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
        report(errors, done + 1)

    # A terminal's lines one request each: with 64 a request, what a user typed was translated
    # only after 64 lines or Ctrl-D.
    batch_size = args.batch_size or (1 if sys.stdin.isatty() else BATCH_SIZE)
    batch, done = [], 0
    unit = "sentences" if source == "conllu" else "lines"
    lines = input_lines(sys.stdin.buffer)
    try:
        with sigterm_raises():  # SIGTERM, as Ctrl-C: the lines so far stay, and one line says how many
            for item in (_conllu_blocks(lines) if source == "conllu" else lines):
                batch.append(item)
                if len(batch) == batch_size:
                    flush(batch)
                    done, batch = done + len(batch), []
            flush(batch)
            done, batch = done + len(batch), []
    except tf.errors.InvalidArgumentError as error:  # a request that fails whole (an export without `error`)
        sys.stdout.flush()
        # A graph error's first line is "Graph execution error:"; the op's own message comes later.
        lines = [line.strip() for line in str(error.message or error).splitlines()
                 if line.strip() and not line.strip().startswith(("Graph execution error", "Detected at node",
                                                                  "File ", "[["))]
        message = (lines[-1] if lines else "invalid request").split(" [[")[0].split("[Op:")[0].strip()
        print(f"export.translate: error: the request of {unit} {done + 1}-{done + len(batch)} failed: {message}; "
              f"the {done} {unit} before it were translated", file=sys.stderr)
        return 1
    except OSError as error:  # standard output: a reader that stopped (`| head`) or a full disk
        return stdout_failed("export.translate", error, f"{done} {unit} had been translated")
    except KeyboardInterrupt as error:  # Ctrl-C or SIGTERM, once the running request returns (it was a
        # TensorFlow traceback, and SIGTERM ended the process with up to 8 KB of translations unwritten)
        return interrupted("export.translate", error, f"the first {done} {unit} were translated")
    if failed:
        print(f"export.translate: error: {len(failed)} of {done} sentences were malformed CoNLL-U "
              f"(named above); the others were translated", file=sys.stderr)
        return 1
    return 0


class _Refused(Exception):
    """What `_open_export` finds wrong with the export or the flags for it: printed as
    `export.translate: error: ...`, exit status 2."""


def _check_ranges(parser, args) -> None:
    """translate_options' flags out of their rows' ranges (what the signature would clip), and
    more results than the beam keeps: a `parser.error` instead."""
    # translate_options clips what it cannot run (a server must answer): here the user hears it.
    # (--beam-size 0 had translated with beam 1, --beam-size 20 with 8, --n-best 9 printed 4.)
    for option in decoding_options.signature_options(OPTIONS_SIGNATURE):
        problem = option.flag is not None and option.flag_problem(getattr(args, option.name))
        if problem:
            parser.error(problem)
    if args.beam_size is not None and args.num_results > args.beam_size:
        parser.error(f"--n-best {args.num_results} asks for more results than --beam-size {args.beam_size} keeps; "
                     f"give a larger beam or fewer results")


def _open_export(args, advanced):
    """Loads the export (`args.saved_model`, its newest version) and picks its signatures for
    the flags: a namespace of `default`, `options` (the signature a request with options goes
    to), `source` (`text` or `conllu`), `plain_request`, `defaults` (the recorded config),
    `default_patience` (the recorded patience) and `option_names` (the inputs of `options`);
    `_Refused` names what does not fit."""
    import types

    import tensorflow as tf

    args.saved_model = newest_version(args.saved_model) or args.saved_model
    missing = missing_saved_model(args.saved_model)
    if missing:
        raise _Refused(missing)
    from export.saved_model import left_out_reason, read_export_signatures

    loaded = tf.saved_model.load(args.saved_model)
    # An export that records its signatures (`export.saved_model --signatures`) is ours with any
    # of them; an older one, or a foreign SavedModel, must have both that every export had.
    chosen = read_export_signatures(args.saved_model)
    if not ({SERVING_DEFAULT} if chosen else {SERVING_DEFAULT, OPTIONS_SIGNATURE}) <= set(loaded.signatures):
        raise _Refused(f"{args.saved_model} is not an export of this project (its signatures "
                       f"are {sorted(loaded.signatures)}; export.saved_model writes serving_default and "
                       f"translate_options)")
    syntax_aware = "conllu" in loaded.signatures[SERVING_DEFAULT].structured_input_signature[1]

    def lacks(name):  # why the export has no `name` signature
        if syntax_aware and name == XLA_SIGNATURE:
            return "a syntax-aware export has none: its CoNLL-U sources are searched in the plain graph"
        return left_out_reason(args.saved_model, name)

    if args.xla and XLA_SIGNATURE not in loaded.signatures:
        raise _Refused(f"--xla: {args.saved_model} has no translate_xla signature ({lacks(XLA_SIGNATURE)}); "
                       f"translate without --xla")
    default = loaded.signatures[XLA_SIGNATURE if args.xla else SERVING_DEFAULT]
    xla_flags = os.environ.get("TF_XLA_FLAGS", "")
    problem = args.xla and _xla_cache_problem(xla_flags)
    if problem:  # (TensorFlow would fail the first request with a graph traceback)
        raise _Refused(problem)
    # Without options every request goes to `default`; with any, to translate_options.
    plain_request = not advanced and all(getattr(args, option.name) == option.default for option in
                                         decoding_options.signature_options(OPTIONS_SIGNATURE) if option.flag)
    if not plain_request and not advanced and OPTIONS_SIGNATURE not in loaded.signatures:
        raise _Refused(f"--beam-size, --n-best, --alpha and --patience call translate_options, "
                       f"which {args.saved_model} leaves out (export.saved_model --signatures); export it with "
                       f"translate_options")
    options = loaded.signatures.get(OPTIONS_SIGNATURE, default)
    if advanced and ADVANCED_SIGNATURE not in loaded.signatures:
        raise _Refused(f"{', '.join(advanced)}: {args.saved_model} has no translate_advanced "
                       f"signature ({lacks(ADVANCED_SIGNATURE)})")

    # A syntax-aware export takes CoNLL-U (`conllu`): stdin is then CoNLL-U,
    # sentences separated by blank lines, one translation printed per sentence.
    source = "conllu" if syntax_aware else "text"
    # The options translate_options takes (exports older than the patience input have none, and
    # only the exact search).
    option_names = set(options.structured_input_signature[1])
    has_patience = "patience" in option_names
    # Lines TensorFlow logs as errors that ask nothing of the user (console.HARMLESS_LINES): each
    # hit of the persistent XLA cache, and with oneDNN on (this command's default) on a CPU
    # without AVX-512, its fallback to TensorFlow's own kernels in the plain searches.
    default, options = _without_harmless_lines(default), _without_harmless_lines(options)
    if advanced:
        options = _advanced_call(_without_harmless_lines(loaded.signatures[ADVANCED_SIGNATURE]), args)
    if args.patience is not None and not has_patience:
        raise _Refused(f"{args.saved_model} predates --patience (its translate_options "
                       f"has no patience input); export the model again")
    from export.saved_model import read_export_config

    recorded = read_export_config(args.saved_model)
    defaults, default_patience = recorded or (PAPER, 0.0)
    if args.beam_size is None and args.num_results > defaults.beam_size:  # (<= MAX_BEAM_SIZE: checked above)
        raise _Refused(f"--n-best {args.num_results} asks for more results than the export's beam "
                       f"of {defaults.beam_size} keeps; give --beam-size {args.num_results} (at most {MAX_BEAM_SIZE}) "
                       f"or fewer results")
    return types.SimpleNamespace(default=default, options=options, source=source, plain_request=plain_request,
                                 defaults=defaults, default_patience=default_patience, option_names=option_names)


def _options_inputs(args, defaults, default_patience, names):
    """translate_options' option inputs that the export takes (`names`), as scalars: each flag's
    value, or where not given its row's default, the export's own (`defaults`, its recorded
    config, and `default_patience`) where the row has none."""
    import tensorflow as tf

    inputs = {}
    for option in decoding_options.signature_options(OPTIONS_SIGNATURE):
        value = getattr(args, option.name, None) if option.flag else None
        if option.name in names:
            value = option.given_default(defaults, default_patience) if value is None else value
            inputs[option.name] = tf.constant(value, decoding_options.DTYPES[option.kind])
    return inputs


def _print_info(path) -> int:
    """`--info`: what the export at `path` (or its newest version) records, one `name: value`
    line each, read from its JSON record alone (the SavedModel is not loaded); a last line
    `not recorded: ...` names the fields an older export lacks. 2 when `path` holds no export."""
    from export.saved_model import EXPORT_CONFIG_FILE, EXPORT_RECORD_FIELDS, read_export_record

    path = newest_version(path) or path
    missing = missing_saved_model(path)
    if missing:
        print(f"export.translate: error: {missing}", file=sys.stderr)
        return 2
    record = read_export_record(path)
    fields = record or {}
    lines = [f"export: {path}"]
    for name in ("keras_transformer_version", "tensorflow_version"):
        if name in fields:
            lines.append(f"{name}: {fields[name]}")
    if "signatures" in fields:
        lines.append(f"signatures: {', '.join(fields['signatures'])}")
    if "config" in fields:
        config = TransformerConfig.from_dict(fields["config"])
        groups = [("model", INFO_MODEL_FIELDS), ("decoding", INFO_DECODING_FIELDS)]
        for group, names in groups + ([("syntax", INFO_SYNTAX_FIELDS)] if config.syntax_aware else []):
            lines.append(f"{group}: " + ", ".join(f"{name}={_info_value(getattr(config, name))}" for name in names))
    if "patience" in fields:
        lines.append(f"patience: {fields['patience']}" + (" (the exact search)" if not fields["patience"] else ""))
    absent = [name for name in EXPORT_RECORD_FIELDS if name not in fields]
    if absent:
        why = (f"no assets.extra/{EXPORT_CONFIG_FILE}: an export older than that record, or not one of this project"
               if record is None else "an export older than these fields of its record")
        lines.append(f"not recorded: {', '.join(absent)} ({why}; export the model again to record them)")
    print("\n".join(lines))
    return 0


def _info_value(value) -> str:
    """A config value on an `--info` line: a tuple comma-separated ("none" when empty), else as Python prints it."""
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value) or "none"
    return str(value)


def _flag_value(args, option):
    """The parsed value of `option`'s flag (None: not given; `--disallow-unk` absent: None)."""
    value = getattr(args, option.name)
    return (value or None) if option.kind == "bool" else value


def _advanced_problem(parser, args):
    """The decoding flags given (`translate_advanced`'s), in the order of the help; a value
    out of range is a `parser.error` naming it (the options table's `flag_problem`)."""
    given = ["--target-prefix"] if args.target_prefix is not None else []
    given += [option.flag for option in decoding_options.ADVANCED if _flag_value(args, option) is not None]
    for option in decoding_options.ADVANCED:
        problem = option.flag_problem(_flag_value(args, option))
        if problem:
            parser.error(problem)
    samples = args.sampling_topk not in (None, 1)
    if samples and ((args.beam_size or 1) > 1 or args.num_results > 1):
        parser.error(f"--sampling-topk {args.sampling_topk} samples one translation with one beam; it takes no "
                     f"--beam-size above 1 or --n-best above 1")
    sampling_flags = [decoding_options.BY_NAME[name].flag for name in decoding_options.SAMPLING[1:]]
    sampling_only = [flag for flag in given if flag in sampling_flags]
    if sampling_only and not samples:
        parser.error(f"{', '.join(sampling_only)} {'is a sampling option' if len(sampling_only) == 1 else 'are sampling options'}; "
                     f"give --sampling-topk too (0: every piece)")
    return given


def _advanced_call(signature, args):
    """`translate_options`' call (the options it is given) made on `translate_advanced`, with
    the decoding flags (the table's defaults where not given), one value per sentence."""
    import tensorflow as tf

    values = {"target_prefix": (args.target_prefix or "", "string")}
    for option in decoding_options.ADVANCED:
        value = _flag_value(args, option)
        if option.kind == "sequences":  # (a flag a sequence, its pieces separated by spaces)
            value = decoding_options.served_sequences(pieces.split() for pieces in value or ())
        values[option.name] = (option.default if value is None else value, decoding_options.DTYPES[option.kind])

    def call(**inputs):
        batch = tf.shape(next(iter(inputs.values())))[0]
        per_sentence = {name: tf.fill([batch], tf.constant(value, dtype)) for name, (value, dtype) in values.items()}
        return signature(**inputs, **per_sentence)

    return call


def _without_harmless_lines(signature):
    """`signature`, called with file descriptor 2 filtered when the console is quiet
    (`console.harmless_lines_dropped`)."""
    def call(**inputs):
        with harmless_lines_dropped():
            return signature(**inputs)
    return call


def _xla_cache_dirs(flags):
    """The persistent XLA cache directories that `flags` (TF_XLA_FLAGS) names (an empty
    value names none)."""
    return [flag[len(XLA_CACHE_FLAG):] for flag in flags.split() if flag.startswith(XLA_CACHE_FLAG)
            and flag != XLA_CACHE_FLAG]


def _xla_cache_problem(flags):
    """What keeps the persistent XLA cache that `flags` (TF_XLA_FLAGS) names from being
    used, as a one-line error; None when it can be, or when none is named. A missing
    directory is created, as TensorFlow would."""
    read_only = any(flag.startswith("--tf_xla_persistent_cache_read_only") and not flag.endswith(("=false", "=0"))
                    for flag in flags.split())
    for path in _xla_cache_dirs(flags):
        named = f"TF_XLA_FLAGS names {path} as the persistent XLA cache ({XLA_CACHE_FLAG.rstrip('=')})"
        if os.path.exists(path) and not os.path.isdir(path):
            return f"{named}, which is not a directory"
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as error:
            return f"{named}, which cannot be created ({error.strerror})"
        if not read_only and not os.access(path, os.W_OK | os.X_OK):
            return f"{named}, which is not writable (or add --tf_xla_persistent_cache_read_only=true)"
    return None


def _conllu_blocks(lines):
    """CoNLL-U lines (bytes without line ends, `input_lines`) -> one bytes block per sentence
    (blank lines separate sentences)."""
    block = []
    for line in lines:
        if line.strip():
            block.append(line)
        elif block:
            yield b"\n".join(block)
            block = []
    if block:
        yield b"\n".join(block)


if __name__ == "__main__":
    sys.exit(main())
