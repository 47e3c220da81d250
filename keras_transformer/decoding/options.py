"""The decoding options, each defined once: one row per option of the search.

A row says what the option is (name, type, default), what values it takes from Python
(`SearchOptions`, `Translator.translate`: a bad one raises) and from a served request
(the SavedModel's signatures: clipped, or the sentence's error row), its name in
CTranslate2's `translate_batch`, and its flag and help in `export.translate` (a bad value
is a `parser.error`). Each surface is made from these rows:

* `SearchOptions` validation (`keras_transformer.decoding`): `python_problem`;
* the signatures' input specs, warm-up defaults and per-sentence checks
  (`export.saved_model_graph`): `signature_options`, `served_defaults`, `tensor_problems`;
* `export.translate`'s decoding flags and their checks: `add_flags`, `flag_problem`;
* the CTranslate2 option mapping (`export.ctranslate2.translation_options`): `ctranslate2_options`;
* the table in docs/reference (`python -m tools.reference`): `markdown_table`.

This module imports neither TensorFlow nor Keras (importing `keras` loads TensorFlow), so
that a command answers `--help` and its flag errors before TensorFlow loads.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing

from keras_transformer.constants import (ADVANCED_SIGNATURE, MAX_BEAM_SIZE, MAX_NO_REPEAT_NGRAM_SIZE, MAX_PATIENCE,
                                         OPTIONS_SIGNATURE)


# `DecodingOption.python_default` when `SearchOptions`' default is the row's `default`.
_ROW_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class Range:
    """A numeric range: `low` and `high` (None: unbounded), each closed unless `*_open`, and
    finite values only when `finite`."""

    low: typing.Optional[float] = None
    high: typing.Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    finite: bool = False

    def holds(self, value) -> bool:
        """Whether the python number `value` is in the range (NaN never is, where bounded)."""
        return bool(self._inside(value, math.isfinite))

    def outside(self, value, is_finite, integral=False):
        """The bool mask of the tensor `value`'s entries outside the range (NaN included, where
        bounded), with the tensors' own operators and `is_finite` (the graph's op). An
        `integral` value (no NaN) is outside where it breaks a bound (`v < low | v > high`);
        a float one where it is not inside (`~(v > low & v <= high & finite)`)."""
        if not integral:
            return ~self._inside(value, is_finite)
        masks = []
        if self.low is not None:
            masks.append(value <= self.low if self.low_open else value < self.low)
        if self.high is not None:
            masks.append(value >= self.high if self.high_open else value > self.high)
        outside = masks[0]
        for mask in masks[1:]:
            outside = outside | mask
        return outside

    def _inside(self, value, is_finite):
        conditions = []
        if self.low is not None:
            conditions.append(value > self.low if self.low_open else value >= self.low)
        if self.high is not None:
            conditions.append(value < self.high if self.high_open else value <= self.high)
        if self.finite:
            conditions.append(is_finite(value))
        inside = conditions[0] if conditions else True
        for condition in conditions[1:]:
            inside = inside & condition
        return inside


@dataclasses.dataclass(frozen=True)
class Clip:
    """How the signatures bring a served value into range instead of refusing it (a server
    answers every request; `export.saved_model_graph` applies it, in the table's order): to
    `[low, high]` (None: unbounded; a str: the clipped value of that option, which comes
    earlier in the table), a NaN replaced by `nan` (None: kept), and with `non_finite` a NaN or
    infinite value replaced by the export's own (`DecodingOption.given_default`)."""

    low: object = None
    high: object = None
    nan: typing.Optional[float] = None
    non_finite: bool = False


@dataclasses.dataclass(frozen=True)
class DecodingOption:
    """One decoding option.

    Args:
        name: its name (`SearchOptions`' field, the signatures' input, the keyword of
            `Translator.translate`).
        kind: "int", "float" or "bool" (the signatures' int32, float32, bool), or "sequences"
            (sequences of target ids; served as a string of pieces, `SEQUENCE_SEPARATOR` between
            sequences and `PIECE_SEPARATOR` between pieces: "" for none).
        default: its value when not given; None: the export's own (`config_field` of the
            `TransformerConfig`, or the export's patience).
        python: the values Python takes (`SearchOptions`), None: any of its kind.
        python_text: those values in words, for `SearchOptions`' error
            (`"{name} must be {python_text} or {tensor_text}, got ..."`) and
            `Translator.translate`'s (`"{name} must be {python_text}, got ..."`).
        tensor_text: what a run-time (tensor) value must be, in that error.
        served: the values a served request takes per sentence (`translate_advanced`'s
            error row), None: no check there (the signature clips it, `served_clip`).
        served_message: the error row's words (`"{signature}: {served_message}"`).
        served_clip: how the signatures clip a value (words for the docs), or None.
        clip: the signatures' clip of a served value (`Clip`), or None (as given, or clipped
            by the search itself, as `extra_length`).
        ctranslate2: its name in CTranslate2's `translate_batch` (None: no such option).
        flag, help: `export.translate`'s flag and help (None: no flag of its own); in the help,
            `{default}` is the export's own default of an older export (`flag_help`).
        flag_range, flag_text: the values the flag takes and the words of its error
            (`"{flag} must be {flag_text}, got ..."`), None: any of its kind.
        flag_type: how the command parses the flag (a key of `add_flags`' `kinds`; None: the
            option's `kind`).
        signatures: the signatures that take it as an input.
        config_field: with a None default, the `TransformerConfig` field that gives it.
        integral: an "int" option's python value must be an integer (False: any number
            in `python`, as `extra_length`, which the searcher casts).
        python_default: `SearchOptions`' default, where it is not `default` (a python search
            has no export: the paper's beam size and alpha, no patience, the config's extra
            length as None).
        as_given: `SearchOptions` stores a python value as given (a python float or int, as
            `alpha`), not as its kind (`int(...)`, `float(...)`).
        doc: what the option does in a search, in `SearchOptions`' words (its docstring's
            Args and docs/reference/options.md are made from it).
        processor: the name of its logits processor, a class of `keras_transformer.decoding.processors`
            made from the option's value (and the search's `eos_id`, if it has that field), which
            joins the search's step when the option is on (a value other than `default`, or a
            tensor); None: it has none.
        xla: with a `processor`, the XLA search compiles it (a python value) into its program;
            False: it runs in the plain graph only (the XLA search refuses it).
    """

    name: str
    kind: str
    default: object
    python: typing.Optional[Range]
    python_text: str
    tensor_text: str
    served: typing.Optional[Range] = None
    served_message: str = ""
    served_clip: typing.Optional[str] = None
    clip: typing.Optional[Clip] = None
    ctranslate2: typing.Optional[str] = None
    flag: typing.Optional[str] = None
    help: str = ""
    flag_range: typing.Optional[Range] = None
    flag_text: str = ""
    flag_type: typing.Optional[str] = None
    signatures: typing.Tuple[str, ...] = (ADVANCED_SIGNATURE,)
    config_field: typing.Optional[str] = None
    integral: bool = True
    python_default: object = _ROW_DEFAULT
    as_given: bool = False
    doc: str = ""
    processor: typing.Optional[str] = None
    xla: bool = False

    @property
    def search_default(self):
        """`SearchOptions`' default: `python_default`, else `default`."""
        return self.default if self.python_default is _ROW_DEFAULT else self.python_default

    def python_problem(self, value, tensors: bool = True) -> typing.Optional[str]:
        """`SearchOptions`' error for the python `value` (None: it is good); without `tensors`
        (`Translator.translate`, which takes python values only) it names no tensor form."""
        if self.kind == "sequences":  # (ids: non-negative python ints, a sequence of them per sequence)
            good = _is_sequence(value) and all(
                _is_sequence(sequence) and all(isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0
                                               for i in sequence) for sequence in value)
        elif self.kind == "bool":
            good = isinstance(value, bool) or (type(value).__module__ == "numpy"  # (NumPy's bool)
                                               and type(value).__name__ in ("bool", "bool_"))
        elif isinstance(value, bool) or not isinstance(value, numbers.Real):
            good = False
        elif self.kind == "int":
            good = ((isinstance(value, numbers.Integral) or not self.integral)
                    and (self.python is None or self.python.holds(value)))
        else:
            good = self.python is None or self.python.holds(value)
        if good:
            return None
        forms = f"{self.python_text} or {self.tensor_text}" if tensors else self.python_text
        return f"{self.name} must be {forms}, got {value!r}"

    def flag_problem(self, value) -> typing.Optional[str]:
        """`export.translate`'s error for the flag's parsed `value` (None: good or not given)."""
        if value is None or self.flag_range is None or self.flag_range.holds(value):
            return None
        return f"{self.flag} must be {self.flag_text}, got {value}"

    def flag_help(self, config=None) -> str:
        """The flag's help, `{default}` the default of `config` (an export that records none)."""
        return self.help if config is None else self.help.replace("{default}", str(self.given_default(config)))

    def given_default(self, config=None, patience: float = 0.0):
        """The default: the row's, or the export's own (`config`, the export's `patience`)."""
        if self.default is not None:
            return self.default
        if self.config_field is None:
            return patience
        return getattr(config, self.config_field)


def _is_sequence(value) -> bool:
    """Whether `value` is a python sequence (a list, a tuple, ...) and not a string."""
    return isinstance(value, typing.Sequence) and not isinstance(value, (str, bytes))


OPTIONS = (
    DecodingOption(
        "beam_size", "int", None, Range(1), "a positive int", "an int32 scalar tensor",
        served_clip=f"clipped to [1, {MAX_BEAM_SIZE}]", ctranslate2="beam_size", flag="--beam-size",
        help=f"1..{MAX_BEAM_SIZE} (default: the export's own, recorded in its assets.extra/keras_transformer.json; "
             "{default} for exports older than that file)",
        flag_range=Range(1, MAX_BEAM_SIZE),
        flag_text=f"1..{MAX_BEAM_SIZE} (the beams the export's translate_options runs)",
        signatures=(OPTIONS_SIGNATURE, ADVANCED_SIGNATURE), config_field="beam_size", python_default=4,
        clip=Clip(1, MAX_BEAM_SIZE),
        doc="python int >= 1 (it fixes tensor shapes), or, in a TensorFlow graph without XLA (not with "
            "`Halvings`), an int32 scalar tensor in ``[1, max_beam_size]`` given at run time: one graph then "
            "searches with any beam size (the SavedModel's ``translate_options``), with the same results as the "
            "python int. With 1 the search is exactly greedy decoding (argmax until EOS)."),
    DecodingOption(
        "alpha", "float", None, Range(finite=True), "a finite number", "a scalar tensor",
        served_clip="NaN or infinite: the export's own", ctranslate2="length_penalty", flag="--alpha",
        help="length penalty exponent (default: the export's own; {default} for older exports)",
        signatures=(OPTIONS_SIGNATURE, ADVANCED_SIGNATURE), config_field="length_penalty_alpha",
        python_default=0.6, as_given=True, clip=Clip(non_finite=True),
        doc="length-penalty exponent, python float or float scalar tensor (may be a SavedModel signature "
            "input). 0 = plain log-prob. The early-termination bound is valid for any alpha (negative too)."),
    DecodingOption(
        "extra_length", "int", None, Range(finite=True), "a finite number", "a scalar tensor",
        served_clip="clipped to [0, decode_extra_length]", ctranslate2="max_decoding_length",
        signatures=(OPTIONS_SIGNATURE, ADVANCED_SIGNATURE), config_field="decode_extra_length", integral=False,
        python_default=None, as_given=True,
        doc="for `keras_transformer.inference.searcher.Searcher` (which makes ``max_lengths = source_lengths + "
            "extra_length``, clipped to the buffers' ``decode_extra_length``): None (the config's), a python int "
            "or an int32 scalar tensor. `beam_search` takes `max_lengths` and does not read it."),
    DecodingOption(
        "num_results", "int", 1, Range(1), "a positive int", "an int32 scalar tensor",
        served_clip="clipped to [1, beam_size]", ctranslate2="num_hypotheses", flag="--n-best",
        help="print the n best, tab-separated with scores (at most the beam size)", flag_type="positive int",
        flag_range=Range(1, MAX_BEAM_SIZE), flag_text=f"1..{MAX_BEAM_SIZE} (the results of the export's largest beam)",
        signatures=(OPTIONS_SIGNATURE, ADVANCED_SIGNATURE), clip=Clip(1, "beam_size"),
        doc="python int in ``[1, beam_size]`` (with a tensor `beam_size`, a python int or an int32 scalar tensor "
            "in that range, e.g. `beam_size` itself): how many hypotheses to return per sentence. With 1 a "
            "sentence stops as soon as no alive hypothesis can beat its best finished one (exact for the best "
            "translation and its score); with ``n``, as soon as none can beat the ``n``-th best of its finished "
            "ones (exact for the whole n-best; with ``n = beam_size``, the worst of its ``beam_size`` finished "
            "ones)."),
    DecodingOption(
        "patience", "float", None, Range(finite=True), "a finite number", "a scalar tensor",
        served_clip="NaN: 0 (off); above MAX_PATIENCE: that bound", ctranslate2="patience", flag="--patience",
        help="stop a sentence once round(beam * P) hypotheses have finished, as CTranslate2 does (faster, not "
             "exact; default: the export's own, the exact search unless it was exported with --patience)",
        signatures=(OPTIONS_SIGNATURE, ADVANCED_SIGNATURE), as_given=True, clip=Clip(high=MAX_PATIENCE, nan=0.0),
        doc="None (off), or a float (python or scalar tensor): a sentence also stops once "
            "``round(beam_size * patience)`` hypotheses have finished (CTranslate2's rule: faster, not exact; a "
            "value <= 0 turns it off)."),
    DecodingOption(
        "min_length", "int", 0, Range(0), "an int >= 0 (0: off)", "a scalar tensor",
        served=Range(0), served_message="min_length must be >= 0", ctranslate2="min_decoding_length",
        flag="--min-length", help="the fewest target pieces before the end of a translation (default 0)",
        flag_range=Range(0), flag_text=">= 0",
        doc="the fewest tokens a hypothesis holds before its EOS (CTranslate2's ``min_decoding_length``): EOS is "
            "disallowed at the steps before; a python int >= 0 (0: off) or an int32 scalar tensor. A sentence "
            "whose length limit comes first ends there without EOS.",
        processor="MinLength", xla=True),
    DecodingOption(
        "no_repeat_ngram_size", "int", 0, Range(0), "an int >= 0 (0: off)", "an int32 scalar tensor",
        served=Range(0, MAX_NO_REPEAT_NGRAM_SIZE),
        served_message=f"no_repeat_ngram_size must be in [0, {MAX_NO_REPEAT_NGRAM_SIZE}]",
        ctranslate2="no_repeat_ngram_size", flag="--no-repeat-ngram-size",
        help=f"no n-gram of this many pieces twice in a translation, 1..{MAX_NO_REPEAT_NGRAM_SIZE} (default 0: off)",
        flag_range=Range(0, MAX_NO_REPEAT_NGRAM_SIZE),
        flag_text=f"0..{MAX_NO_REPEAT_NGRAM_SIZE} (the export's largest)",
        doc="python int >= 0 (0: off): a token that would repeat an n-gram of this size already in the "
            "hypothesis is disallowed (CTranslate2's ``no_repeat_ngram_size``; 1: no token twice); or an int32 "
            "scalar tensor in ``[0, MAX_NO_REPEAT_NGRAM_SIZE]``.",
        processor="NoRepeatNgram", xla=True),
    DecodingOption(
        "disallow_unk", "bool", False, None, "a bool", "a bool scalar tensor", ctranslate2="disable_unk",
        flag="--disallow-unk", help="never generate the unknown piece",
        doc="python bool, or a bool scalar tensor: the unknown token (``UNK_ID``) is never generated "
            "(CTranslate2's ``disable_unk``).",
        processor="DisallowUnk", xla=True),
    DecodingOption(
        "repetition_penalty", "float", 1.0, Range(0, low_open=True, finite=True), "a finite number > 0 (1: off)",
        "a float scalar tensor", served=Range(0, low_open=True, finite=True),
        served_message="repetition_penalty must be a finite number > 0 (1: off)", ctranslate2="repetition_penalty",
        flag="--repetition-penalty",
        help="divide the positive logits of the pieces already in a translation by P > 0 and multiply the "
             "negative ones by it, as CTranslate2 does (above 1: fewer repeats; default 1: off)",
        flag_range=Range(0, low_open=True), flag_text="> 0",
        doc="python float > 0 (1.0: off), or a float scalar tensor: the logits of the tokens already in the "
            "hypothesis (each once) are divided by it where >= 0 and multiplied by it where < 0, before the "
            "constraints' masks and the log-softmax (CTranslate2's ``repetition_penalty``; `RepetitionPenalty`).",
        processor="RepetitionPenalty"),
    DecodingOption(
        "suppress_sequences", "sequences", (), None,
        "a list of lists of target ids >= 0 (`SearchOptions`; of pieces for `Translator.translate`)",
        "(ids [S, M], lengths [S]) int32 tensors", served_message="suppress_sequences holds a piece that is not "
        "in the target vocabulary", served_clip="a string: each line a sequence of pieces separated by spaces "
        "(\"\": none)", ctranslate2="suppress_sequences", flag="--suppress-sequence",
        help="never generate this sequence of target pieces, separated by spaces (a single piece: never; "
             "longer: not its last piece after the others), as CTranslate2's suppress_sequences; repeat the flag "
             "for more",
        doc="sequences of target ids never generated (CTranslate2's ``suppress_sequences``; `SuppressSequences`): "
            "one id is disallowed at every step, a longer sequence's last id where the hypothesis ends with the "
            "ids before it. Python ids (stored as a tuple of tuples of ints, empty ones dropped), or at run time "
            "``(ids, lengths)``: int32 tensors ``[S, M]`` and ``[S]`` (>= 1).",
        processor="SuppressSequences"),
    DecodingOption(
        "sampling_topk", "int", 1, Range(0), "an int >= 0 (1: no sampling, 0: the whole vocabulary)",
        "an int32 scalar tensor", served=Range(0),
        served_message="sampling_topk must be >= 0 (1: no sampling, 0: the whole vocabulary)",
        ctranslate2="sampling_topk", flag="--sampling-topk",
        help="sample each piece among the K most likely (0: all) instead of searching; with one beam "
             "(default 1: no sampling)",
        flag_range=Range(0), flag_text=">= 0 (1: no sampling, 0: every piece)",
        doc="1 (the default: the best token, no sampling), or with ``beam_size`` 1 the number of best tokens each "
            "step samples among (0: the whole vocabulary): random sampling, e.g. for back-translation "
            "(CTranslate2's ``sampling_topk``). An int32 scalar tensor (>= 0) always runs the sampling search, in "
            "which 1 draws the best token: greedy decoding."),
    DecodingOption(
        "sampling_topp", "float", 1.0, Range(0, 1, low_open=True, finite=True), "a finite number in (0, 1]",
        "a float scalar tensor", served=Range(0, 1, low_open=True), served_message="sampling_topp must be in (0, 1]",
        ctranslate2="sampling_topp", flag="--sampling-topp",
        help="with sampling, among the fewest most likely pieces whose probabilities reach P, in (0, 1] (default 1)",
        flag_range=Range(0, 1, low_open=True), flag_text="in (0, 1]",
        doc="with sampling, the smallest set of best tokens whose probabilities (after the temperature) sum to "
            "at least this is sampled among (1.0: all of them; CTranslate2's ``sampling_topp``)."),
    DecodingOption(
        "sampling_temperature", "float", 1.0, Range(0, low_open=True, finite=True), "a finite number in > 0",
        "a float scalar tensor", served=Range(0, low_open=True, finite=True),
        served_message="sampling_temperature must be a finite number > 0", ctranslate2="sampling_temperature",
        flag="--sampling-temperature", help="with sampling, divide the log-probabilities by T > 0 first (default 1)",
        flag_range=Range(0, low_open=True), flag_text="> 0",
        doc="with sampling, the log-probabilities are divided by it before sampling (CTranslate2's "
            "``sampling_temperature``); the scores stay those of the model's own distribution."),
    DecodingOption(
        "seed", "int", 0, Range(0, 2 ** 31, high_open=True), "an int in [0, 2**31)", "an int scalar tensor",
        served=Range(0), served_message="seed must be >= 0", flag="--seed",
        help="with sampling, >= 0: the same seed and input lines give the same samples (default 0)",
        flag_range=Range(0, 2 ** 31, high_open=True), flag_text="in [0, 2**31)",
        doc="with sampling, a python int: the same seed and inputs give the same samples (`LoopOps.uniform` "
            "draws the noise)."),
)
BY_NAME = {option.name: option for option in OPTIONS}
# The options of `Translator.translate` and the flags of `export.translate` that call
# `translate_advanced` (those the plain search of `translate_options` lacks).
ADVANCED = tuple(option for option in OPTIONS if OPTIONS_SIGNATURE not in option.signatures)
# The signatures' input dtype of each kind of option (TensorFlow's names: `export.saved_model_graph`'s
# input specs, `export.translate`'s requests).
DTYPES = {"int": "int32", "float": "float32", "bool": "bool", "sequences": "string"}
# A served `suppress_sequences`: one string, each line a sequence, its pieces separated by spaces
# (SentencePiece pieces hold no whitespace).
SEQUENCE_SEPARATOR, PIECE_SEPARATOR = "\n", " "
SAMPLING = ("sampling_topk", "sampling_topp", "sampling_temperature", "seed")
# The options of the logits processors (`keras_transformer.decoding.processors`), in the table's order.
CONSTRAINTS = tuple(option.name for option in OPTIONS if option.processor)


def signature_options(signature: str) -> tuple:
    """The rows of the options `signature` takes, in its inputs' order."""
    return tuple(option for option in OPTIONS if signature in option.signatures)


def served_defaults(signature: str, config, patience: float = 0.0) -> dict:
    """`{name: default}` of `signature`'s options: the values that translate as `serving_default`
    does (the export's beam size, alpha, extra length and patience, one result, no constraint,
    no sampling)."""
    return {option.name: "" if option.kind == "sequences" else option.given_default(config, patience)
            for option in signature_options(signature)}


def tensor_problems(columns: dict, is_finite) -> list:
    """The per-sentence checks of the served options in `columns` (`{name: [batch] tensor}`),
    in their order: `[(bad mask, message)]` (the options with a `served` range)."""
    return [(BY_NAME[name].served.outside(value, is_finite, integral=BY_NAME[name].kind == "int"),
             BY_NAME[name].served_message)
            for name, value in columns.items() if BY_NAME[name].served is not None]


def add_flags(group, kinds: dict, rows=ADVANCED, config=None, defaults: bool = False) -> None:
    """`export.translate`'s flags of the options `rows` (those with a flag, in their order) on the
    argparse `group`: each stored under the option's name, with its help (`flag_help(config)`);
    `kinds`: `{flag type: (type, action)}` of the command's parsers (bool: `store_true`).
    `defaults`: a flag's default is its row's (shown in `--help`), else None (not given)."""
    for option in rows:
        if option.flag is None:
            continue
        help = option.flag_help(config)
        if option.kind == "bool":
            group.add_argument(option.flag, action="store_true", dest=option.name, help=help)
            continue
        if option.kind == "sequences":  # (one flag a sequence)
            group.add_argument(option.flag, action="append", default=None, dest=option.name, metavar="PIECES",
                               help=help)
            continue
        parse, action = kinds[option.flag_type or option.kind]
        group.add_argument(option.flag, type=parse, default=option.default if defaults else None, dest=option.name,
                           metavar=option.flag.lstrip("-").replace("-", "_").upper(), help=help,
                           **({"action": action} if action is not None else {}))


def served_sequences(sequences) -> str:
    """`suppress_sequences` (lists of pieces) as a served string (`SEQUENCE_SEPARATOR`,
    `PIECE_SEPARATOR`)."""
    return SEQUENCE_SEPARATOR.join(PIECE_SEPARATOR.join(sequence) for sequence in sequences)


def ctranslate2_options(**values) -> dict:
    """CTranslate2's `translate_batch` keywords of the decoding options `values` (by our names;
    those with a CTranslate2 name of the same meaning)."""
    unknown = sorted(name for name in values if name not in BY_NAME or BY_NAME[name].ctranslate2 is None)
    if unknown:
        raise TypeError(f"no CTranslate2 option for: {', '.join(unknown)}")
    return {BY_NAME[name].ctranslate2: value for name, value in values.items()}


def markdown_details() -> str:
    """Each option's `doc` under its own heading, in the table's order (docs/reference/options.md)."""
    return "\n".join(f"### `{option.name}`\n\n{option.doc}\n" for option in OPTIONS)


def markdown_table() -> str:
    """The options as a Markdown table (docs/reference/options.md)."""
    lines = ["| option | type | default | Python values | served values | CTranslate2 | `export.translate` | "
             "signatures |", "|---|---|---|---|---|---|---|---|"]
    for option in OPTIONS:
        default = "the export's own" if option.default is None else f"`{option.default!r}`"
        served = option.served_message.split(" must be ", 1)[-1] if option.served else (option.served_clip or "any")
        flag = f"`{option.flag}`" if option.flag else ""
        ct2 = f"`{option.ctranslate2}`" if option.ctranslate2 else ""
        lines.append(f"| `{option.name}` | {option.kind} | {default} | {option.python_text} | {served} | {ct2} | "
                     f"{flag} | {', '.join(option.signatures)} |")
    return "\n".join(lines) + "\n"
