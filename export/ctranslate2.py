"""CTranslate2 conversion of a trained model directory.

    python -m export.ctranslate2 --model-dir runs/default --output runs/default/ctranslate2 \\
        [--quantization int8] [--force]

writes a CTranslate2 model directory (`model.bin`, `config.json`,
`shared_vocabulary.json`, plus the run's `tokenizer.model`) for
`ctranslate2.Translator`. Tokenize with SentencePiece and pass the pieces
without EOS: the model appends EOS to the source itself, as our batching does.

    import ctranslate2, sentencepiece
    from export.ctranslate2 import translation_options
    from keras_transformer.run_dir import load_config

    config = load_config("runs/default")
    sp = sentencepiece.SentencePieceProcessor(model_file="OUTPUT/tokenizer.model")
    translator = ctranslate2.Translator("OUTPUT")
    source = sp.encode("Today the man sees the dog.", out_type=str)
    result = translator.translate_batch([source], **translation_options(config, len(source)))
    sp.decode(result[0].hypotheses[0])

The mapping (`TransformerSpec`, revision 7):

* post-norm (the paper) or pre-norm, as `config.norm_first`; LayerNorm
  epsilon from the config (1e-6);
* Keras `Dense` kernels are `[in, out]`, CTranslate2 weights `[out, in]`:
  every kernel is transposed. Self-attention `linear[0]` is Q, K and V fused
  along the output axis and `linear[1]` the output projection;
  cross-attention `linear[0]` is Q, `linear[1]` K and V fused, `linear[2]`
  the output projection. Heads are the same contiguous `head_size` slices;
  CTranslate2 scales queries by `1/sqrt(head_size)` as we scale the scores;
* one embedding matrix serves as source embedding, target embedding and
  output projection (no bias), scaled by sqrt(d_model) on input
  (`scale_embeddings`); CTranslate2 stores it once (it aliases equal weights);
* positions: our table (`sinusoidal_encoding`: interleaved sin/cos, position
  0 first) is written as `position_encodings.encodings`; CTranslate2's
  built-in one is OpenNMT-tf's `[sin | cos]` from position 1 and would not
  match. The table has `max(max_length + decode_extra_length, 1024)` rows,
  enough for CTranslate2's default `max_input_length` (1024) and
  `max_decoding_length` (256); a longer request fails with "No position
  encodings are defined for positions >= N";
* vocabulary: the SentencePiece pieces in id order, shared by source and
  target; `unk_token`, `bos_token` (= `decoder_start_token`) and `eos_token`
  are the pieces at `UNK_ID`, `BOS_ID`, `EOS_ID`, and `add_source_eos` is
  set. PAD is an ordinary token to CTranslate2, which masks by length.

Decoding differences (`translation_options` gives the closest options):

* Length limit: we stop a sentence at `source_tokens + decode_extra_length`
  generated tokens (EOS included, sources cut at `max_length - 1` tokens);
  CTranslate2's `max_decoding_length` counts the same way but is one value
  per `translate_batch` call, so translate sentences of one source length
  together (or one by one) to get the same limit. `min_decoding_length`
  must be 0 (its default 1 forbids an empty translation, which we allow).
* Length penalty: ours is GNMT's `((5 + len) / 6) ** alpha`, CTranslate2's
  is `len ** length_penalty` (`translate_batch(length_penalty=...)`, the
  score divided by it when a hypothesis finishes). In both `len` counts EOS
  and the score is the sum of the token log-probabilities, EOS included:
  CTranslate2 keeps EOS in the hypothesis while scoring and only strips it
  from the returned tokens (unless `return_end_token=True`). No
  `length_penalty` equals GNMT's for every length: between hypotheses of
  lengths `L` and `L + 1` GNMT's penalty grows like `len ** (alpha * L / (5 + L))`,
  so `translation_options` uses `alpha * L / (5 + L)` at the length `L`
  expected for the source (its token count): 0.4 at 10 tokens, 0.5 at 25.
  Greedy decoding (beam 1) is unaffected.
* Beam search: both extend the best `2 * beam` candidates of `beam`
  alive hypotheses, and the alive sets are the same (the best `beam`
  candidates that do not end). We finish every EOS candidate among the
  `2 * beam`, keep the best `beam` finished ones and stop a sentence when no
  alive hypothesis can beat the best of them (the worst, when several
  results are asked); CTranslate2 finishes only the
  EOS candidates among the first `beam` and stops once it has
  `beam * patience` finished hypotheses, then picks the best. Given the same
  length limit, ours therefore never returns a hypothesis that scores worse,
  under our penalty, than CTranslate2's; CTranslate2 can return a worse one
  when it stops early. (Our export can stop by CTranslate2's rule too:
  `export.saved_model --patience`, or `translate_options`' `patience`.)
  With its default `patience=1` that happened on 1-3 of the tests' 20
  sentences (toy models, five seeds), with `patience=2` on 0-1:
  `translation_options` uses 2. On 200 validation sentences of the `tiny`
  run, 199 beam-4 translations agree with either patience (197-198 with
  `length_penalty=0.6` instead of the exponent above); greedy: all 200.

The output directory is built under a hidden temporary name beside it and
renamed into place when complete, so a crash never leaves a half-written
model; `--force` replaces an existing CTranslate2 model directory.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pathlib
import shutil
import sys
import typing

from export.errors import ConversionError, ExportWriteError
from keras_transformer.atomic_writes import write_failure
from keras_transformer.config import TransformerConfig
from keras_transformer.console import (OneLineArgumentParser, PositiveInt, interrupted, names_on_first_use,
                                    sigterm_raises)
from keras_transformer.decoding import options as decoding_options
from keras_transformer.run_dir import AVERAGE_HELP

if typing.TYPE_CHECKING:
    from export.ctranslate2_spec import KerasTransformerConverter, build_spec, position_table

# Written beside the model: CTranslate2 takes pieces, so users need it.
TOKENIZER_FILE = "tokenizer.model"
# A directory holding this file is a CTranslate2 model `--force` may replace.
MODEL_FILE = "model.bin"
# CTranslate2's `ACCEPTED_MODEL_TYPES` (`ctranslate2.specs.model_spec`, 4.x), written out so
# that `--help` and a flag error answer without importing CTranslate2 (tests/test_command_help.py
# checks that the two agree).
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
# CTranslate2's converter casts to bfloat16 with PyTorch (NumPy has no bfloat16).
NEEDS_TORCH = ("bfloat16", "int8_bfloat16")

# The conversion itself (`export.ctranslate2_spec`: Keras, NumPy and CTranslate2), imported on
# first use: the command's `--help` and flag errors answer without them.
_SPEC_NAMES = ("KerasTransformerConverter", "build_spec", "position_table")


__getattr__ = names_on_first_use(__name__, dict.fromkeys(_SPEC_NAMES, "export.ctranslate2_spec"))


def _is_replaceable(path: pathlib.Path) -> bool:
    """Whether `--force` may replace `path`: a CTranslate2 model or an empty directory."""
    return path.is_dir() and ((path / MODEL_FILE).is_file() or not any(path.iterdir()))


def convert(model, config: TransformerConfig, tokenizer, output_dir, quantization: str | None = None,
            force: bool = False) -> pathlib.Path:
    """Converts `model` to a CTranslate2 model directory, written atomically.

    Args:
        model: a trained `Transformer` from `build_transformer(config)`.
        config: its `TransformerConfig`.
        tokenizer: its `keras_transformer.data.Tokenizer` (copied beside the model).
        output_dir: the CTranslate2 model directory to write.
        quantization: None (float32 weights) or one of `QUANTIZATIONS`
            (`int8`, `int8_float32`, `float16`, ...).
        force: replace an existing CTranslate2 model directory at `output_dir`.

    Returns:
        `output_dir` as a path.

    Raises:
        FileExistsError: `output_dir` exists and `force` is not set, or it is
            not a CTranslate2 model directory.
        ConversionError: an unknown `quantization`, or one that needs PyTorch
            when it is not installed.
        ValueError: tokenizer, model and config disagree on the vocabulary size.

    Example:
        >>> convert(model, config, tokenizer, "runs/default/ctranslate2", quantization="int8")
    """
    from export.ctranslate2_spec import KerasTransformerConverter

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConversionError(f"quantization={quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    if quantization in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        raise ConversionError(f"quantization={quantization} needs PyTorch (CTranslate2 converts to bfloat16 "
                              f"with it); pip install torch, or use float16 / int8_float16")
    output = pathlib.Path(output_dir)
    if output.exists() and not force:
        raise FileExistsError(f"{output} already exists; pass --force to replace it")
    if output.exists() and not _is_replaceable(output):
        raise FileExistsError(f"{output} exists and is not a CTranslate2 model directory; not replacing it")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.parent / f".{output.name}.tmp-{os.getpid()}"
    retired = output.parent / f".{output.name}.old-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with sigterm_raises():  # a SIGTERM while converting removes the staging directory, as Ctrl-C does
        try:
            KerasTransformerConverter(model, config, tokenizer).convert(str(staging), quantization=quantization)
            (staging / TOKENIZER_FILE).write_bytes(tokenizer.model_bytes)
            if output.exists():
                # Two renames: the old model stays whole until the new one is in place.
                os.rename(output, retired)
            os.rename(staging, output)  # atomic on one file system
        except BaseException as error:
            shutil.rmtree(staging, ignore_errors=True)
            if retired.exists() and not output.exists():
                os.rename(retired, output)
            if isinstance(error, OSError):  # a full disk said only "[Errno 28] No space left on device"
                unchanged = " (the model that was there is unchanged)" if output.exists() else ""
                raise ExportWriteError(f"cannot write {output}: {write_failure(error)}; nothing was left "
                                       f"there{unchanged}") from None
            raise
    shutil.rmtree(retired, ignore_errors=True)
    return output


def length_penalty_exponent(alpha: float, length: int) -> float:
    """CTranslate2's `length_penalty` closest to GNMT's `alpha` at `length` tokens.

    GNMT divides by `((5 + len) / 6) ** alpha`, CTranslate2 by `len ** p`.
    Hypotheses that compete differ by a few tokens around the expected
    length `L`; the two penalties change by the same factor there when their
    log-derivatives agree: `alpha / (5 + L) = p / L`.
    """
    length = max(int(length), 1)
    return alpha * length / (5.0 + length)


def translation_options(config: TransformerConfig, source_length: int, beam_size: int | None = None,
                        patience: float = 2.0, **options) -> dict:
    """`ctranslate2.Translator.translate_batch` options closest to our `Translator`.

    Same beam, length limit, source truncation and decoding options; the
    length penalty and the stopping rule can only be approximated (see the
    module docstring).

    Args:
        config: the model's `TransformerConfig` (beam, alpha, max_length, +50).
        source_length: source pieces without EOS (the longest in the call:
            CTranslate2 has one length limit per call).
        beam_size: None for the config's.
        patience: CTranslate2 stops at `beam * patience` finished
            hypotheses; 2 comes closer to our search than its default 1,
            which is faster.
        **options: our decoding options of `translate_advanced` (`decoding_options.ADVANCED`),
            each as CTranslate2's option of the same meaning (the rows' `ctranslate2`
            names; the same tokens disallowed, before the same log-softmax); the logits
            processors' options (`decoding_options.CONSTRAINTS`) at the table's defaults
            where not given.

    Returns:
        keyword arguments for `translate_batch`.
    """
    unknown = sorted(set(options) - {option.name for option in decoding_options.ADVANCED})
    if unknown:
        raise TypeError(f"translation_options: unknown decoding option(s) {', '.join(unknown)}")
    # (each processor's option explicit, its default where not given; a sequences option only when given)
    given = {**{name: decoding_options.BY_NAME[name].default for name in decoding_options.CONSTRAINTS
                if decoding_options.BY_NAME[name].kind != "sequences"}, **options}
    source_length = min(int(source_length), config.max_length - 1)  # our cut, EOS excluded
    return dict(
        **decoding_options.ctranslate2_options(beam_size=beam_size or config.beam_size, patience=patience, **given),
        length_penalty=length_penalty_exponent(config.length_penalty_alpha, source_length),
        max_input_length=config.max_length,  # EOS included, kept last: as Translator.encode_text
        max_decoding_length=source_length + config.decode_extra_length,  # EOS included
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line: `main` parses with it, and the command reference is made from it."""
    parser = OneLineArgumentParser(prog="export.ctranslate2", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True, help="a model directory written by train.py")
    parser.add_argument("--output", required=True, help="the CTranslate2 model directory to write")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                        help="weight type (default: float32, as trained); int8 suits CPUs, "
                             "float16 and int8_float16 GPUs")
    parser.add_argument("--force", action="store_true", help="replace an existing CTranslate2 model at --output")
    parser.add_argument("--average", type=int, action=PositiveInt, default=None, metavar="K", help=AVERAGE_HELP)
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's own start-up lines and warnings")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if importlib.util.find_spec("ctranslate2") is None:  # an optional dependency: say how to install it
        print("export.ctranslate2: error: ctranslate2 is not installed; "
              "pip install 'keras-transformer[ctranslate2]'", file=sys.stderr)
        return 2
    from keras_transformer.data import TokenizerError
    from keras_transformer.run_dir import RunError, load_trained

    try:
        model, config, tokenizer = load_trained(args.model_dir, average=args.average,
                                                log=lambda line: print(f"export.ctranslate2: {line}",
                                                                       file=sys.stderr))
        path = convert(model, config, tokenizer, args.output, args.quantization, args.force)
    except (RunError, TokenizerError, OSError, ConversionError) as error:  # OSError: FileExistsError, permissions
        print(f"export.ctranslate2: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM while it wrote (it was a traceback)
        return interrupted("export.ctranslate2", error, f"{args.output} was left as it was")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
