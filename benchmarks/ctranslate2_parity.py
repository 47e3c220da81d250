"""Parity with CTranslate2: how closely the conversion scores, aligns and decodes as our model.

    python -m benchmarks.ctranslate2_parity                     # the tests' toy model, GOLDEN sentences
    python -m benchmarks.ctranslate2_parity --run-dir runs/multi30k --label "Multi30k run"

A model and its CTranslate2 conversion (`export.ctranslate2.convert`, float32), compared on
the same sentences as `tests/test_ctranslate2.py` compares them, but measured instead of
asserted. Each comparison gives the number of sentences whose pieces or ids are identical
on both sides, and the largest |difference| of the numbers both return (log-probabilities,
attention weights) over those sentences.

* The model: without `--run-dir`, the tests' toy model (`tests/helpers.py`,
  `train_toy_translator`: seed 0, 250 steps, trained here in a temporary folder, a minute
  or two) on its 20 GOLDEN sentences and their word-for-word references; with `--run-dir`,
  a `train.py` run's averaged weights on the first `--count` lines of `--sentences` and
  `--references` (default: Multi30k's validation split in ../shared/data).
* token log-probs: the Keras model's log-softmax under teacher forcing on the references
  against `score_batch` on the same pieces; `Translator.score` against `score_batch`
  (each piece's log-probability and the total).
* greedy: `Searcher.search` with `SearchOptions(beam_size=1)` on the whole batch against
  `translate_batch` with `translation_options(..., beam_size=1)`, one sentence per call
  (CTranslate2's length limit is one per call): the ids, EOS included, and where they are
  identical the translations' log-probabilities (each engine's score times its own length
  penalty). The same with `min_length` (`--min-length`), `no_repeat_ngram_size` 2 and
  `disallow_unk` (CTranslate2's `min_decoding_length`, `no_repeat_ngram_size`,
  `disable_unk`, given by `translation_options`), and `repetition_penalty`
  `REPETITION_PENALTY` (greedy and beam: CTranslate2's option of that name), and
  `suppress_sequences` of the first two pieces of each greedy translation (greedy);
  `disallow_unk` on a copy of the model that prefers the unknown token (its embedding row set to 1.5x that of the token the model
  most often outputs first, as the tests make it). Each note says how many greedy
  translations the option changed: an option that changes none compares nothing.
* target_prefix: in turn the reference's first word, "heute" (a start the model would not
  choose) and none (`tests/helpers.py`, `target_prefixes`), greedy and beam 4.
* `Translator.align` on CTranslate2's greedy translations against its `return_attention`
  (the last decoder layer, heads averaged): the target pieces, and each row's weights over
  the source pieces (CTranslate2 leaves out the source's EOS column, which ours keeps).
  `align` takes text: a translation whose pieces SentencePiece would segment otherwise is
  aligned as SentencePiece segments it, and counts as not identical (the note says how many).
* beam search with the config's beam against `translation_options` (patience 2); the note
  gives the agreement with CTranslate2's default patience 1.
* int8: the int8 conversion against the float32 one: greedy ids, and the `score_batch`
  log-probabilities of the references (the note gives their median difference).

CTranslate2 runs with one thread (`inter_threads=1, intra_threads=1`) and, unless the
environment sets it, `CT2_USE_MKL=1`, as the tests (docs/ctranslate2.md: int8 on AMD CPUs).

It prints the table, then writes its rows into `--results` (the page's result file),
replacing that file's rows of the same model (`--label`), with this command, the commit
(`git rev-parse --short HEAD`), the UTC date and the machine (from lscpu); run
`python -m benchmarks.report` after it. The last line is `max_float32_difference: X`, the
largest difference of the float32 comparisons.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import time

from benchmarks import harness
from keras_transformer.console import OneLineArgumentParser, PositiveInt

RESULTS = harness.REPO_ROOT / "benchmarks" / "results" / "ctranslate2_parity.json"
DEFAULT_SENTENCES = harness.SHARED_DATA / "multi30k" / "valid.en"
DEFAULT_REFERENCES = harness.SHARED_DATA / "multi30k" / "valid.de"
TOY_LABEL = "toy (the tests'), 20 GOLDEN sentences"
PROG = "benchmarks.ctranslate2_parity"
# The tests' `min_length` (tests/test_ctranslate2.py): longer than most toy translations.
DEFAULT_MIN_LENGTH = 9
NO_REPEAT_NGRAM_SIZE = 2
# A repetition penalty that changes translations (tests/test_ctranslate2.py compares 1.5, 3 and 0.7).
REPETITION_PENALTY = 3.0
# The unknown token's embedding row, as a multiple of the row of the model's most frequent
# first token: the model then puts it in its translations (tests/test_ctranslate2.py).
UNK_LOVE = 1.5

TITLE = "Parity with CTranslate2"
QUESTION = ("How closely does the CTranslate2 conversion of a model score, align and decode as the model "
            "itself, feature by feature?")
HOW = ("`benchmarks/ctranslate2_parity.py` converts the model (`export.ctranslate2`, float32) and makes "
       "the comparisons of `tests/test_ctranslate2.py` on the same sentences, measured instead of asserted: "
       "the sentences whose pieces or ids are identical on both sides, and the largest |difference| of "
       "the log-probabilities (per piece, or of the whole translation where the ids are identical) or "
       "attention weights. Searches use `export.ctranslate2.translation_options`, one sentence per "
       "CTranslate2 call, one CTranslate2 thread.")
COLUMNS = [{"key": "model", "label": "model"}, {"key": "ours", "label": "ours"},
           {"key": "theirs", "label": "CTranslate2"}, {"key": "identical", "label": "identical"},
           {"key": "difference", "label": "max |difference|"}, {"key": "note", "label": "note"}]


@dataclasses.dataclass
class Figure:
    """One comparison: what each side ran, how many sentences are identical on both, and the
    largest |difference| of their numbers (None: no numbers compared)."""

    ours: str
    theirs: str
    identical: int
    sentences: int
    difference: float | None
    note: str = ""
    float32: bool = True  # both sides float32 (the int8 row is not)


def format_difference(value: float | None) -> str:
    """`2.4e-06`; `0` for none; `-` when nothing was compared."""
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.1e}"


def row_values(label: str, figure: Figure) -> dict:
    """A result row's `values` for `figure` of the model `label`."""
    return {"model": label, "ours": figure.ours, "theirs": figure.theirs,
            "identical": f"{figure.identical}/{figure.sentences}",
            "difference": format_difference(figure.difference), "note": figure.note or "-"}


def merge_rows(old_rows: list, new_rows: list, label: str) -> list:
    """`old_rows` with their rows of the model `label` replaced by `new_rows`, where the first
    of them was (appended when there was none); the other models' rows kept in order."""
    kept = [row for row in old_rows if row["values"]["model"] != label]
    where = next((i for i, row in enumerate(old_rows) if row["values"]["model"] == label), None)
    if where is None:
        return kept + new_rows
    before = sum(1 for row in old_rows[:where] if row["values"]["model"] != label)
    return kept[:before] + new_rows + kept[before:]


def recorded_command(argv: list) -> str:
    """The command a row records: this module with `argv`, without `--results` (where the row
    was written, not what it measured)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--results":
            skip = True
        elif not arg.startswith("--results="):
            kept.append(arg)
    return shlex.join(["python", "-m", PROG, *kept])


# AMD family 0x19 models that are Zen 4 (Genoa, Raphael, Phoenix, Bergamo, Siena); the others Zen 3.
_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))


def machine_description(lscpu: str, cpus: int) -> str:
    """`2-vCPU AMD EPYC Zen 4 (AVX-512)`: the CPU count (vCPU under a hypervisor), the model
    name, the AMD Zen generation, and the widest vector extension, from `lscpu`'s output."""
    fields = dict(re.findall(r"^([^:\n]+):\s*(.*)$", lscpu, re.M))
    name = " ".join(fields.get("Model name", "unknown CPU").replace("Processor", "").split())
    flags = fields.get("Flags", "").split()
    generation = ""
    if fields.get("Vendor ID") == "AuthenticAMD":
        family, model = int(fields.get("CPU family", 0)), int(fields.get("Model", 0))
        generation = {23: "Zen 2" if model >= 0x30 else "Zen", 26: "Zen 5"}.get(family, "")
        if family == 25:
            generation = "Zen 4" if any(model in models for models in _ZEN4_MODELS) else "Zen 3"
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    unit = "vCPU" if "Hypervisor vendor" in fields else "CPU"
    text = " ".join(part for part in (f"{cpus}-{unit}", name, generation) if part)
    return f"{text} ({vectors})" if vectors else text


def _git(*args) -> str:
    """Git's output in the repository (not stripped: `status --porcelain` starts with a space)."""
    return subprocess.run(["git", *args], cwd=harness.REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout


def build_parser() -> argparse.ArgumentParser:
    """The command line: `main` parses with it, and the command reference is made from it."""
    parser = OneLineArgumentParser(prog=PROG, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default=None,
                        help="a model directory written by train.py (default: train the tests' toy model)")
    parser.add_argument("--sentences", default=str(DEFAULT_SENTENCES),
                        help="with --run-dir: source sentences, one per line (default: Multi30k's valid.en)")
    parser.add_argument("--references", default=str(DEFAULT_REFERENCES),
                        help="with --run-dir: their reference translations (default: Multi30k's valid.de)")
    parser.add_argument("--count", type=int, action=PositiveInt, default=200,
                        help="with --run-dir: the first N sentences (default 200)")
    parser.add_argument("--label", default=None,
                        help=f"the model's name in the table, whose rows a new run replaces (default: "
                             f"'{TOY_LABEL}', or the run directory's name and the sentence count)")
    parser.add_argument("--min-length", type=int, action=PositiveInt, default=DEFAULT_MIN_LENGTH,
                        help=f"the min_length compared (default {DEFAULT_MIN_LENGTH}, the tests')")
    parser.add_argument("--results", default=str(RESULTS),
                        help="the result file to write the rows into (default: benchmarks/results/"
                             "ctranslate2_parity.json)")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--machine", default=None, help="the machine as the row names it (default: from lscpu)")
    return parser


# ---------------------------------------------------------------------------
# The comparisons (tests/test_ctranslate2.py makes each of them)
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    """A model, its conversion and the sentences both sides get."""

    model: object
    config: object
    tokenizer: object
    texts: list
    references: list
    translator: object = None
    ct2: object = None
    pieces: object = None
    source_ids: object = None  # int32 [batch, S]: pieces, EOS, PAD (our Translator's)
    lengths: object = None  # int32 [batch]: pieces without EOS
    sources: list = None  # what CTranslate2 gets: the pieces without EOS (it appends EOS itself)


def toy_helpers():
    """`tests/helpers.py`: the tests' toy model, sentences and prefixes (imported as the root
    conftest.py imports it)."""
    if str(harness.REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(harness.REPO_ROOT))
    return importlib.import_module("tests.helpers")


def until_eos(row) -> list:
    """Generated ids up to and including the first EOS (all non-PAD ids without one)."""
    from keras_transformer.constants import EOS_ID, PAD_ID

    row = [int(i) for i in row]
    return row[:row.index(EOS_ID) + 1] if EOS_ID in row else [i for i in row if i != PAD_ID]


def prepare(case: Case, directory: pathlib.Path, name: str) -> Case:
    """`case` with its Translator, its float32 conversion under `directory / name` (one
    CTranslate2 thread) and the sources of both sides."""
    import ctranslate2
    import sentencepiece
    import tensorflow as tf

    from export.ctranslate2 import convert
    from keras_transformer.inference.translator import Translator

    case.translator = Translator(case.model, case.config, case.tokenizer.model_bytes)
    output = convert(case.model, case.config, case.tokenizer, directory / name)
    case.ct2 = ctranslate2.Translator(str(output), device="cpu", inter_threads=1, intra_threads=1)
    case.pieces = sentencepiece.SentencePieceProcessor(model_proto=case.tokenizer.model_bytes)
    texts = case.translator.clean_text(tf.constant(case.texts))
    case.source_ids, case.lengths = (t.numpy() for t in case.translator.encode_text(texts))
    case.sources = [[case.pieces.id_to_piece(int(i)) for i in row[:n]]
                    for row, n in zip(case.source_ids, case.lengths)]
    return case


def our_search(case: Case, options, prefixes=None):
    """Our search on the whole batch: ids (EOS included) and log-probabilities (the score
    times GNMT's penalty) of each sentence's best translation."""
    import tensorflow as tf

    from keras_transformer.decoding import length_penalty

    inputs = [tf.constant(case.source_ids), tf.constant(case.lengths)]
    if prefixes is not None:
        inputs += list(case.translator.encode_text(tf.constant(prefixes)))
    search = tf.function(lambda ids, lengths, *prefix: case.translator.searcher.search(
        ids, lengths, options, target_prefix=tuple(prefix) or None), autograph=False)
    ids, scores = search(*inputs)
    rows = [until_eos(row) for row in ids.numpy()[:, 0]]
    log_probs = [float(score) * float(length_penalty(len(row), options.alpha))
                 for row, score in zip(rows, scores.numpy()[:, 0])]
    return rows, log_probs


def their_search(case: Case, beam_size: int, ct2=None, prefixes=None, overrides=None, **constraints):
    """CTranslate2 on the sentences one per call: ids (EOS included) and log-probabilities
    (the score times its penalty `len ** length_penalty`)."""
    from export.ctranslate2 import translation_options

    rows, log_probs = [], []
    for i, source in enumerate(case.sources):
        options = {**translation_options(case.config, len(source), beam_size=beam_size, **constraints),
                   **(overrides or {})}
        if prefixes is not None:
            options["target_prefix"] = [case.pieces.encode(prefixes[i], out_type=str)]
        result = (ct2 or case.ct2).translate_batch([source], **options, return_scores=True,
                                                   return_end_token=True)[0]
        hypothesis = result.hypotheses[0]
        rows.append([case.pieces.piece_to_id(p) for p in hypothesis])
        log_probs.append(result.scores[0] * len(hypothesis) ** options["length_penalty"])
    return rows, log_probs


def compare_searches(ours, theirs) -> tuple[int, int, float | None]:
    """`(sentences with identical ids, sentences, the largest |difference| of their
    log-probabilities)` of two searches' `(ids, log-probabilities)`."""
    (our_rows, our_log_probs), (their_rows, their_log_probs) = ours, theirs
    same = [i for i, (a, b) in enumerate(zip(our_rows, their_rows)) if a == b]
    difference = max((abs(our_log_probs[i] - their_log_probs[i]) for i in same), default=None)
    return len(same), len(our_rows), difference


def scoring_figures(case: Case) -> list:
    """Teacher forcing and `Translator.score` against `score_batch` on the references."""
    from keras_transformer.constants import EOS_ID

    pieces = case.pieces
    targets = [pieces.encode(text) for text in case.references]
    theirs = case.ct2.score_batch(case.sources, [[pieces.id_to_piece(i) for i in t] for t in targets])
    forced = toy_helpers().teacher_forced_log_probs(case.model, case.source_ids, targets)
    same, difference = 0, 0.0
    for result, target, row in zip(theirs, targets, forced):
        if result.tokens == [pieces.id_to_piece(i) for i in target + [EOS_ID]]:
            same += 1
            difference = max(difference, *(abs(a - b) for a, b in zip(result.log_probs, row[:len(target) + 1])))
    figures = [Figure("teacher forcing (the Keras model)", "`score_batch`", same, len(targets), difference,
                      "per piece, EOS included")]
    scored = case.translator.score(case.texts, case.references)
    theirs = case.ct2.score_batch(case.sources, [pieces.encode(text, out_type=str) for text in case.references])
    same, difference = 0, 0.0
    for mine, result in zip(scored, theirs):
        if mine.tokens == result.tokens:
            same += 1
            difference = max(difference, abs(mine.score - sum(result.log_probs)),
                             *(abs(a - b) for a, b in zip(mine.token_scores, result.log_probs)))
    figures.append(Figure("`Translator.score`", "`score_batch`", same, len(scored), difference,
                          "per piece and the total"))
    return figures


def greedy_options(case: Case, **constraints):
    from keras_transformer.decoding import SearchOptions

    return SearchOptions(beam_size=1, alpha=case.config.length_penalty_alpha, num_results=1,
                         extra_length=case.config.decode_extra_length, **constraints)


def changed(rows, plain) -> str:
    """`changes N of M greedy translations`."""
    return f"changes {sum(a != b for a, b in zip(rows, plain))} of {len(plain)} greedy translations"


def unk_lover(case: Case, plain_rows, directory: pathlib.Path) -> Case:
    """A copy of the model whose unknown token's embedding row is `UNK_LOVE` times that of the
    token it most often outputs first, so that its greedy translations hold UNK; prepared."""
    import collections

    import keras

    from keras_transformer import build_transformer
    from keras_transformer.constants import UNK_ID

    first = collections.Counter(row[0] for row in plain_rows if row).most_common(1)[0][0]
    model = build_transformer(case.config)
    model.set_weights(case.model.get_weights())
    table = keras.ops.convert_to_numpy(model.embedding.embeddings).copy()
    table[UNK_ID] = UNK_LOVE * table[first]
    model.embedding.embeddings.assign(table)
    return prepare(Case(model, case.config, case.tokenizer, case.texts, case.references), directory, "unk")


def search_figures(case: Case, directory: pathlib.Path, min_length: int) -> list:
    """Greedy, its three constraints, target_prefix (greedy and beam) and beam search."""
    from keras_transformer.constants import EOS_ID, UNK_ID
    from keras_transformer.decoding import SearchOptions

    config, n = case.config, len(case.texts)
    plain = our_search(case, greedy_options(case))
    figures = [Figure("greedy search", "`translate_batch`, beam 1",
                      *compare_searches(plain, their_search(case, 1)),
                      f"{sum(not row or row[-1] != EOS_ID for row in plain[0])} of {n} stopped at the length limit")]
    for constraints, theirs in (({"min_length": min_length}, f"`min_decoding_length={min_length}`"),
                                ({"no_repeat_ngram_size": NO_REPEAT_NGRAM_SIZE},
                                 f"`no_repeat_ngram_size={NO_REPEAT_NGRAM_SIZE}`"),
                                ({"repetition_penalty": REPETITION_PENALTY},
                                 f"`repetition_penalty={REPETITION_PENALTY}`")):
        (name, value), = constraints.items()
        ours = our_search(case, greedy_options(case, **constraints))
        figures.append(Figure(f"greedy, `{name}={value}`", theirs,
                              *compare_searches(ours, their_search(case, 1, **constraints)),
                              changed(ours[0], plain[0])))
    # The first two pieces of each greedy translation of 3 or more (found here, so that each of
    # those translations must change), as pieces for CTranslate2 and ids for us.
    bigrams = sorted({tuple(row[:2]) for row in plain[0] if len(row) >= 3})
    ours = our_search(case, greedy_options(case, suppress_sequences=bigrams))
    figures.append(Figure("greedy, `suppress_sequences`", "`suppress_sequences`, the same pieces",
                          *compare_searches(ours, their_search(case, 1, suppress_sequences=[
                              [case.pieces.id_to_piece(int(i)) for i in bigram] for bigram in bigrams])),
                          f"{len(bigrams)} bigrams (the translations' first); {changed(ours[0], plain[0])}"))
    lover = unk_lover(case, plain[0], directory)
    loved = our_search(lover, greedy_options(lover))
    ours = our_search(lover, greedy_options(lover, disallow_unk=True))
    figures.append(Figure("greedy, `disallow_unk=True`", "`disable_unk=True`",
                          *compare_searches(ours, their_search(lover, 1, disallow_unk=True)),
                          f"on the model made to prefer UNK ({sum(row.count(UNK_ID) for row in loved[0])} UNKs "
                          f"in its greedy translations); {changed(ours[0], loved[0])}"))
    prefixes = toy_helpers().target_prefixes(case.references)
    for beam in (1, config.beam_size):
        options = SearchOptions(beam_size=beam, alpha=config.length_penalty_alpha, num_results=1,
                                extra_length=config.decode_extra_length)
        ours = our_search(case, options, prefixes)
        name = "greedy" if beam == 1 else f"beam {beam}"
        figures.append(Figure(f"{name}, `target_prefix`", f"`target_prefix`, beam {beam}",
                              *compare_searches(ours, their_search(case, beam, prefixes=prefixes)),
                              f"{sum(bool(p) for p in prefixes)} prefixes; "
                              + (changed(ours[0], plain[0]) if beam == 1 else "patience 2")))
    penalized = SearchOptions(beam_size=config.beam_size, alpha=config.length_penalty_alpha, num_results=1,
                              extra_length=config.decode_extra_length, repetition_penalty=REPETITION_PENALTY)
    figures.append(Figure(f"beam {config.beam_size}, `repetition_penalty={REPETITION_PENALTY}`",
                          f"`repetition_penalty={REPETITION_PENALTY}`, beam {config.beam_size}",
                          *compare_searches(our_search(case, penalized), their_search(
                              case, config.beam_size, repetition_penalty=REPETITION_PENALTY)),
                          "patience 2"))
    options = SearchOptions(beam_size=config.beam_size, alpha=config.length_penalty_alpha, num_results=1,
                            extra_length=config.decode_extra_length)
    ours = our_search(case, options)
    patient = compare_searches(ours, their_search(case, config.beam_size))
    impatient, _, _ = compare_searches(ours, their_search(case, config.beam_size, overrides={"patience": 1}))
    figures.append(Figure(f"beam {config.beam_size}", f"`translation_options`, beam {config.beam_size}", *patient,
                          f"patience 2 (with patience 1: {impatient} of {n})"))
    return figures


def alignment_figure(case: Case) -> Figure:
    """`Translator.align` on CTranslate2's greedy translations against `return_attention`."""
    import numpy as np

    from export.ctranslate2 import translation_options

    pieces, hypotheses, attentions = case.pieces, [], []
    for source in case.sources:
        options = translation_options(case.config, len(source), beam_size=1)
        result = case.ct2.translate_batch([source], **options, return_attention=True, return_end_token=True)[0]
        hypotheses.append(pieces.decode(pieces.encode(pieces.decode(
            [p for p in result.hypotheses[0] if p != "</s>"]), out_type=str)))
        attentions.append((result.hypotheses[0], np.array(result.attention[0])))
    same, difference = 0, 0.0
    for mine, (their_tokens, theirs) in zip(case.translator.align(case.texts, hypotheses), attentions):
        # (a translation stopped by the length limit has no EOS in CTranslate2's; ours scores one more row)
        if mine.target_tokens[:len(their_tokens)] == their_tokens:
            same += 1
            ours = np.array(mine.attention)[:len(their_tokens), :-1]  # [T, S]: without the source's EOS
            difference = max(difference, float(np.abs(ours - theirs).max()))
    # `align` reads text and encodes it: pieces the model chose that SentencePiece would segment
    # otherwise ("S t t" for "Stt") are aligned as SentencePiece's, so those rows compare nothing.
    resegmented = sum(pieces.encode(text, out_type=str) != [p for p in tokens if p != "</s>"]
                      for text, (tokens, _) in zip(hypotheses, attentions))
    note = "each attention weight; last layer, heads averaged"
    if resegmented:
        note += f"; {resegmented} translations' text encodes to other pieces than CTranslate2 returned"
    return Figure("`Translator.align`", "`return_attention`", same, len(case.texts), difference, note)


def int8_figure(case: Case, directory: pathlib.Path) -> Figure:
    """The int8 conversion against the float32 one."""
    import ctranslate2
    import numpy as np

    from export.ctranslate2 import convert

    output = convert(case.model, case.config, case.tokenizer, directory / "int8", quantization="int8")
    int8 = ctranslate2.Translator(str(output), device="cpu", inter_threads=1, intra_threads=1)
    targets = [case.pieces.encode(text, out_type=str) for text in case.references]
    got = [r.log_probs for r in int8.score_batch(case.sources, targets)]
    want = [r.log_probs for r in case.ct2.score_batch(case.sources, targets)]
    errors = np.concatenate([np.abs(np.subtract(g, w)) for g, w in zip(got, want)])
    same, _, _ = compare_searches(their_search(case, 1, int8), their_search(case, 1))
    return Figure("CTranslate2 float32", "CTranslate2 int8", same, len(case.texts), float(errors.max()),
                  f"greedy ids; `score_batch` per piece (median {np.median(errors):.4f})", float32=False)


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------
def load_case(args, directory: pathlib.Path) -> Case:
    """The model and sentences the arguments name: a run's, or the tests' toy model's."""
    if args.run_dir is None:
        helpers = toy_helpers()
        model, config, tokenizer, _ = helpers.train_toy_translator(directory / "toy")
        return Case(model, config, tokenizer, list(helpers.GOLDEN), [helpers.reference(t) for t in helpers.GOLDEN])
    from keras_transformer.run_dir import load_trained

    model, config, tokenizer = load_trained(args.run_dir)
    texts = harness.read_lines(args.sentences, args.count)
    references = harness.read_lines(args.references, args.count)
    if len(texts) != len(references):
        raise SystemExit(f"{PROG}: error: {len(texts)} sentences but {len(references)} references")
    return Case(model, config, tokenizer, texts, references)


def write_rows(path: pathlib.Path, label: str, figures: list, command: str, machine: str) -> None:
    """Replaces the result file's rows of `label` with `figures` (the file is made if absent)."""
    commit = _git("rev-parse", "--short", "HEAD").strip()
    rows = [{"values": row_values(label, figure), "command": command, "commit": commit,
             "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "machine": machine}
            for figure in figures]
    old = json.loads(path.read_text(encoding="utf-8"))["rows"] if path.exists() else []
    data = {"title": TITLE, "question": QUESTION, "how": HOW, "columns": COLUMNS,
            "rows": merge_rows(old, rows, label)}
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    started = time.time()
    os.environ.setdefault("CT2_USE_MKL", "1")  # before CTranslate2's import (docs/ctranslate2.md)
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import ctranslate2
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # each comparison traces a search of its own: no retracing warnings

    label = args.label or (TOY_LABEL if args.run_dir is None
                           else f"{pathlib.Path(args.run_dir).name}, {args.count} sentences")
    machine = args.machine or machine_description(
        subprocess.run(["lscpu"], capture_output=True, text=True).stdout, os.cpu_count())
    print(harness.header("CTranslate2 parity", harness.versions(tf, ctranslate2),
                         f"CT2_USE_MKL={os.environ['CT2_USE_MKL']}, one CTranslate2 thread", label))
    with tempfile.TemporaryDirectory() as work:
        directory = pathlib.Path(work)
        case = prepare(load_case(args, directory), directory, "float32")
        figures = [*scoring_figures(case), *search_figures(case, directory, args.min_length),
                   alignment_figure(case), int8_figure(case, directory)]
    print(harness.table([column["label"].replace("|", "\\|") for column in COLUMNS],
                        [list(row_values(label, figure).values()) for figure in figures]))
    if not args.no_write:
        dirty = [line for line in _git("status", "--porcelain", "--untracked-files=no").splitlines()
                 if not line[3:].startswith(("benchmarks/results/", "docs/"))]
        if dirty:
            print(f"# the working tree differs from HEAD ({len(dirty)} file(s)): the row's commit is not "
                  "exactly the code measured")
        write_rows(pathlib.Path(args.results), label, figures, recorded_command(argv), machine)
        print(f"# wrote {args.results}: run python -m benchmarks.report")
    worst = max(figure.difference or 0.0 for figure in figures if figure.float32)
    print(harness.finish("max_float32_difference", format_difference(worst), started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
