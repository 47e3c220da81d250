"""LiteRT (TFLite) conversion of an exported SavedModel.

    python -m export.tflite --saved-model EXPORT/1 --output model.tflite [--quantize float16|dynamic_int8]

Converts the SavedModel's `translate_litert` signature (tokenizer, model,
beam search, detokenizer) with TFLite builtins plus the TF Text custom ops
only: no SELECT_TF_OPS / Flex. Run it with

    from ai_edge_litert.interpreter import InterpreterWithCustomOps
    import tensorflow_text
    interpreter = InterpreterWithCustomOps(
        custom_op_registerers=tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS,
        model_path="model.tflite")
    runner = interpreter.get_signature_runner("translate_litert")
    runner(text=np.array([b"A sentence."], dtype=object))["translation"]

or with `translate_lines` below. The converter writes every op without a
builtin as a custom op and fails only at run time, so `convert` audits the
result and refuses a model with an op outside the builtins and TF Text's
LiteRT kernels. Differences from the SavedModel: invalid UTF-8 is not
replaced by U+FFFD first (the tokenizer maps it to unknown tokens), and at
most `LITERT_MAX_BATCH` sentences go into one call.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from export.errors import ConversionError, ExportWriteError, missing_saved_model, newest_version, output_problem
from export.op_audit import audit_tflite
from export.signatures import LITERT_MAX_BATCH, LITERT_SIGNATURE, SERVING_DEFAULT
from keras_transformer.atomic_writes import write_bytes_atomically
from keras_transformer.console import (OneLineArgumentParser, harmless_lines_dropped, input_lines, interrupted,
                                       sigterm_raises, stdout_failed)

# --quantize choices: weights as trained; float16 weights (dequantized to
# float32 when the model loads); int8 weights with dynamic-range
# quantization (LiteRT's hybrid kernels quantize activations on the fly in
# the matmuls; everything else stays float32). Neither needs calibration data.
QUANTIZATIONS = ("none", "float16", "dynamic_int8")


def convert(saved_model_dir, output, quantize: str = "none") -> pathlib.Path:
    """Converts `saved_model_dir`'s LiteRT signature to `output` (written atomically).

    Args:
        quantize: one of `QUANTIZATIONS`.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the TF Text ops the SavedModel uses)

    if quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {QUANTIZATIONS}, got {quantize!r}")
    from tensorflow.python.saved_model import loader_impl

    signatures = loader_impl.parse_saved_model(str(saved_model_dir)).meta_graphs[0].signature_def
    if LITERT_SIGNATURE not in signatures:
        from export.saved_model import left_out_reason

        if SERVING_DEFAULT in signatures and "conllu" in signatures[SERVING_DEFAULT].inputs:  # syntax-aware
            why = "a syntax-aware model takes CoNLL-U and is served as a SavedModel only: LiteRT stays plain-text"
        else:
            why = left_out_reason(saved_model_dir, LITERT_SIGNATURE)
        raise ConversionError(f"{saved_model_dir} has no {LITERT_SIGNATURE} signature (signatures: "
                              f"{sorted(signatures)}); {why}")
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model_dir), signature_keys=[LITERT_SIGNATURE])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.allow_custom_ops = True  # the TF Text ops; anything else is caught by the audit
    if quantize != "none":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    flatbuffer = converter.convert()
    report = audit_tflite(flatbuffer)
    if report["unsupported"]:
        raise ConversionError(f"the converted model needs ops LiteRT cannot run: {report['unsupported']}")
    return write_model(flatbuffer, output)


def write_model(flatbuffer: bytes, output) -> pathlib.Path:
    """Writes `flatbuffer` as `output` (`atomic_writes.write_bytes_atomically`); a write that
    fails (a full disk) raises `ExportWriteError` in one line."""
    output = pathlib.Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        return write_bytes_atomically(output, flatbuffer)
    except OSError as error:
        raise ExportWriteError(f"cannot write {output}: {error.strerror}; nothing was left there") from None


def load_interpreter(model_path, num_threads=None):
    """An `ai_edge_litert` interpreter with TF Text's kernels registered
    (`num_threads`: LiteRT's CPU threads; None is its default)."""
    import tensorflow_text
    from ai_edge_litert.interpreter import InterpreterWithCustomOps

    return InterpreterWithCustomOps(custom_op_registerers=tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS,
                                    model_path=str(model_path), num_threads=num_threads)


def translate_lines(interpreter, lines):
    """Translates a list of str with a LiteRT interpreter; returns (translations, scores)."""
    import numpy as np

    runner = interpreter.get_signature_runner(LITERT_SIGNATURE)
    translations, scores = [], []
    for start in range(0, len(lines), LITERT_MAX_BATCH):  # an empty batch is not a valid call
        chunk = [line.encode("utf-8") if isinstance(line, str) else line
                 for line in lines[start:start + LITERT_MAX_BATCH]]
        out = runner(text=np.array(chunk, dtype=object))
        translations.extend(t.decode("utf-8", errors="replace") for t in out["translation"])
        scores.extend(float(s) for s in out["score"])
    return translations, scores


def build_parser() -> argparse.ArgumentParser:
    """The command line: `main` parses with it, and the command reference is made from it."""
    parser = OneLineArgumentParser(prog="export.tflite", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saved-model", required=True,
                        help="an export version directory, e.g. EXPORT/1; or EXPORT, or the model "
                             "directory that holds it: its newest version, as TF Serving picks")
    parser.add_argument("--output", required=True, help="the .tflite file to write")
    parser.add_argument("--quantize", choices=QUANTIZATIONS, default="none",
                        help="weight quantization (default none; float16 halves the file, dynamic_int8 "
                             "stores int8 weights; BLEU and speed changes are in docs/lab-notebook)")
    parser.add_argument("--translate", action="store_true",
                        help="after converting, translate stdin lines with the LiteRT model")
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's own start-up lines and warnings")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.saved_model = newest_version(args.saved_model) or args.saved_model
    missing = missing_saved_model(args.saved_model)
    if missing:
        print(f"export.tflite: error: {missing}", file=sys.stderr)
        return 2
    if os.path.isdir(args.output):  # checked before the conversion's minutes, not after
        print(f"export.tflite: error: --output {args.output} is a directory; give the .tflite file to write",
              file=sys.stderr)
        return 2
    unwritable = output_problem(args.output, directory=False)
    if unwritable:
        print(f"export.tflite: error: --output {unwritable}", file=sys.stderr)
        return 2
    try:
        path = convert(args.saved_model, args.output, args.quantize)
    except (ConversionError, OSError) as error:  # OSError: the output cannot be written
        print(f"export.tflite: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # Ctrl-C in the conversion's minutes (it was a traceback)
        return interrupted("export.tflite", error, f"{args.output} was left as it was")
    print(path, file=sys.stderr)
    return _translate_stdin(path) if args.translate else 0


def _translate_stdin(path) -> int:
    """`--translate`: stdin's lines (`input_lines`: bytes, so invalid UTF-8 is translated, not a
    traceback; CR LF and a byte order mark are no part of them) in requests of the model's
    batch (one line from a terminal, as `export.translate`), each answer printed as it comes.
    All of stdin used to be read first, and an empty stdin printed an empty line."""
    batch_size = 1 if sys.stdin.isatty() else LITERT_MAX_BATCH
    interpreter, batch, done = None, [], 0

    def flush():
        nonlocal interpreter
        if not batch:
            return
        # LiteRT's own "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." off a quiet console
        with harmless_lines_dropped():
            interpreter = interpreter or load_interpreter(path)
            translations, _ = translate_lines(interpreter, batch)
        sys.stdout.write("".join(line + "\n" for line in translations))  # one write a request, flushed
        sys.stdout.flush()

    try:
        with sigterm_raises():  # SIGTERM, as Ctrl-C: the lines so far stay, and one line says how many
            for line in input_lines(sys.stdin.buffer):
                batch.append(line)
                if len(batch) == batch_size:
                    flush()
                    done, batch = done + len(batch), []
            flush()
    except OSError as error:  # a reader that stopped (`| head`), a full disk
        return stdout_failed("export.tflite", error, f"the model {path} was written; {done} lines had been "
                                                     "translated")
    except KeyboardInterrupt as error:  # Ctrl-C or SIGTERM while translating (the model is complete)
        return interrupted("export.tflite", error, f"the model {path} was written; the first {done} lines "
                                                   "were translated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
