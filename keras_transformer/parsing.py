"""Dependency parsing of source text for the syntax-aware models, with spaCy.

The syntax-aware models (`--source-tags`, `--syntax-*`) read their source side
as CoNLL-U (`keras_transformer.data.syntax`). Real corpora come as plain
text, so this module gives them trees, from a parser trained here on a
Universal Dependencies treebank (UD English-EWT; docs/syntax.md says where to get it):

    python -m keras_transformer.parsing train --treebank DATA/ud-ewt --output runs/parser-ewt
    python -m keras_transformer.parsing evaluate --parser runs/parser-ewt --conllu DATA/ud-ewt/en_ewt-ud-test.conllu
    python -m keras_transformer.parsing corpus --parser runs/parser-ewt --data DATA/multi30k --output runs/multi30k-parsed
    python -m keras_transformer.parsing sentences --parser runs/parser-ewt < my_sentences.en > my_sentences.en.conllu

spaCy is an optional extra (`pip install -e ".[parse]"`; the `dev` extra
has it too): nothing else in the project imports this module.

* `train_parser`: spaCy's own recipe for a UD treebank (`spacy init config
  -p morphologizer,parser -o efficiency`: a CNN `tok2vec`, the morphologizer
  for UPOS and features, the transition-based parser; the treebank converted
  one sentence per document by spaCy's CoNLL-U converter), trained for a
  wall-clock budget (`--max-minutes`); the best checkpoint on the dev file
  is kept. spaCy has no time limit of its own: the batcher here is spaCy's
  `batch_by_words` that stops yielding at the deadline.
* `parse_words` / `parse_text`: one sentence per input, always (the
  sentence boundaries are fixed before the parser runs, so a line is never
  split into two trees); `parse_text` tokenizes with the pipeline's English
  tokenizer (spaCy's rules, close to UD's: "don't" -> "do", "n't").
* `evaluate_parser`: UPOS accuracy, UAS and LAS on a CoNLL-U file, on its
  gold words and sentences (the CoNLL 2018 shared task's definitions on gold
  tokenization: every word counts, punctuation included; LAS compares the
  universal part of the label, `nmod:poss` as `nmod`).
* `write_parsed_corpus`: a `--data` directory (``SPLIT.SRC`` and
  ``SPLIT.TGT`` files) -> a new one with ``SPLIT.SRC.conllu`` and a copy of
  ``SPLIT.TGT``, and no plain ``SPLIT.SRC``: the loader then reads the plain
  source as the parser's words joined by spaces, so a plain model trained
  on it sees the same tokens as a syntax-aware one. Written under a
  temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import shutil
import sys
import time

from keras_transformer.console import OneLineArgumentParser, input_lines, stops_quietly_for_a_closed_pipe
from keras_transformer.data.syntax import AnnotatedSentence, AnnotationError, read_conllu, to_conllu

# spaCy's recipe for a UD treebank: its components and the config preset.
PIPELINE = ("morphologizer", "parser")
OPTIMIZE = "efficiency"
# The training budget `python -m keras_transformer.parsing train` uses by default (minutes).
DEFAULT_MAX_MINUTES = 25.0
# The dev-set evaluation interval (updates) and the stop after no improvement (updates).
EVAL_FREQUENCY = 200
PATIENCE = 1600
# Where `train_parser` puts the pipeline inside its output directory.
MODEL_DIR = "model"
INSTALL_HINT = 'the parser needs spaCy, an optional extra: python -m pip install -e ".[parse]"'


class ParserError(ValueError):
    """Bad input to the parser commands (a missing file, an empty line, no spaCy)."""


def _spacy():
    """The `spacy` module, or a `ParserError` saying how to install it."""
    try:
        import spacy  # noqa: PLC0415 (optional extra)
    except ImportError as error:
        raise ParserError(INSTALL_HINT) from error
    return spacy


class _BudgetSpent(BaseException):
    """Raised by `_timed_batcher` when an epoch starts after the deadline, to end spaCy's
    training loop there (`train_parser` catches it; the best dev checkpoint is on disk).
    An empty epoch had ended at once, but spaCy's loop then shuffled the training examples
    for each of the up to `max_epochs` empty epochs that followed: 12,544 UD-EWT sentences
    at 6.7 ms a shuffle, ~67 s after every budget on a 2-vCPU EPYC. A BaseException: an
    Exception would make spaCy print "Aborting and saving the final best model" (it saves
    `model-last` in a `finally` either way)."""


def _timed_batcher(size, tolerance, discard_oversize, max_minutes, get_length=None):
    """spaCy's `batch_by_words` that yields nothing once `max_minutes` have passed
    since it was made (when training starts): the epoch under way ends, and the next
    one raises `_BudgetSpent`, which ends training, keeping the best dev checkpoint."""
    spacy = _spacy()
    inner = spacy.registry.batchers.get("spacy.batch_by_words.v1")(
        size=size, tolerance=tolerance, discard_oversize=discard_oversize, get_length=get_length)
    deadline = time.monotonic() + 60.0 * max_minutes

    def batcher(items):
        if time.monotonic() >= deadline:
            raise _BudgetSpent
        for batch in inner(items):
            if time.monotonic() >= deadline:
                return
            yield batch

    return batcher


def _register_batcher():
    spacy = _spacy()
    name = "keras_transformer.timed_batch_by_words.v1"
    if name not in spacy.registry.batchers.get_all():
        spacy.registry.batchers.register(name, func=_timed_batcher)
    return name


def treebank_files(treebank: str | os.PathLike) -> dict[str, pathlib.Path]:
    """The `train`, `dev` and `test` CoNLL-U files of a UD treebank directory
    (`*-ud-train.conllu`, ...); `test` may be missing."""
    directory = pathlib.Path(treebank)
    if not directory.is_dir():
        raise ParserError(f"{directory}: not a directory (a UD treebank with *-ud-train.conllu and *-ud-dev.conllu)")
    files = {}
    for split in ("train", "dev", "test"):
        found = sorted(directory.glob(f"*-ud-{split}.conllu"))
        if len(found) > 1:
            raise ParserError(f"{directory}: more than one *-ud-{split}.conllu: {[p.name for p in found]}")
        if found:
            files[split] = found[0]
    for split in ("train", "dev"):
        if split not in files:
            raise ParserError(f"{directory}: no *-ud-{split}.conllu file (found "
                              f"{sorted(p.name for p in directory.glob('*.conllu'))})")
    return files


def convert_treebank(conllu_path: str | os.PathLike, output_path: str | os.PathLike) -> int:
    """A CoNLL-U file -> spaCy's training format (`.spacy`), one sentence per
    document, by spaCy's own converter; returns the number of sentences."""
    _spacy()  # a one-line error without the extra
    from spacy.tokens import DocBin  # noqa: PLC0415
    from spacy.training.converters import conllu_to_docs  # noqa: PLC0415

    text = pathlib.Path(conllu_path).read_text(encoding="utf-8")
    docs = list(conllu_to_docs(text, n_sents=1, no_print=True))
    if not docs:
        raise ParserError(f"{conllu_path}: no sentences")
    DocBin(docs=docs, store_user_data=False).to_disk(output_path)
    return len(docs)


def parser_config(max_minutes: float = DEFAULT_MAX_MINUTES, seed: int = 0, eval_frequency: int = EVAL_FREQUENCY,
                  max_steps: int = 0):
    """spaCy's config for `PIPELINE` (`init config -o efficiency`, English, CPU),
    trained until `max_minutes` pass (or no dev improvement in `PATIENCE` updates,
    or `max_steps` updates when > 0: a budget that does not depend on the
    machine's load), evaluated on the dev file every `eval_frequency` updates."""
    _spacy()  # a one-line error without the extra
    from spacy.cli.init_config import init_config  # noqa: PLC0415

    config = init_config(lang="en", pipeline=list(PIPELINE), optimize=OPTIMIZE, gpu=False)
    batcher = dict(config["training"]["batcher"])
    batcher["@batchers"] = _register_batcher()
    batcher["max_minutes"] = float(max_minutes)
    config["training"]["batcher"] = batcher
    config["training"]["max_steps"] = int(max_steps)  # 0: the deadline ends training
    config["training"]["max_epochs"] = 10_000  # the first epoch after the deadline ends training (_BudgetSpent)
    config["training"]["patience"] = PATIENCE
    config["training"]["eval_frequency"] = eval_frequency
    config["system"]["seed"] = seed
    config["training"]["logger"] = {"@loggers": "spacy.ConsoleLogger.v1", "progress_bar": False}
    return config


def train_parser(treebank: str | os.PathLike, output: str | os.PathLike, max_minutes: float = DEFAULT_MAX_MINUTES,
                 seed: int = 0, eval_frequency: int = EVAL_FREQUENCY, log=print, verbose: bool = True,
                 max_steps: int = 0) -> pathlib.Path:
    """Trains the parser on a UD treebank directory; returns the pipeline's directory.

    `output` gets `corpus/` (the converted treebank), `training/` (spaCy's
    `model-best` and `model-last`), `model/` (the best dev checkpoint, what
    `load_parser(output)` loads) and `training.json` (sizes, minutes, seed).
    `verbose=False` hides spaCy's training table. `max_steps` > 0 also ends
    training after that many updates, whichever of it and `max_minutes` comes first.
    """
    spacy = _spacy()
    from spacy.training.initialize import init_nlp  # noqa: PLC0415
    from spacy.training.loop import train  # noqa: PLC0415

    files = treebank_files(treebank)
    output = pathlib.Path(output)
    corpus = output / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for split in ("train", "dev"):
        sizes[split] = convert_treebank(files[split], corpus / f"{split}.spacy")
    log(f"converted {files['train'].name} ({sizes['train']} sentences) and {files['dev'].name} "
        f"({sizes['dev']}) to {corpus}")
    config = parser_config(max_minutes, seed, eval_frequency, max_steps)
    config["paths"]["train"] = str(corpus / "train.spacy")
    config["paths"]["dev"] = str(corpus / "dev.spacy")
    start = time.monotonic()
    nlp = init_nlp(config)
    training = output / "training"
    training.mkdir(exist_ok=True)
    stream = sys.stdout if verbose else io.StringIO()
    try:
        train(nlp, training, stdout=stream, stderr=sys.stderr if verbose else stream)
    except _BudgetSpent:  # the budget's end (spaCy's patience or --max-steps end the loop by themselves)
        pass
    minutes = (time.monotonic() - start) / 60.0
    best = training / "model-best"
    if not best.is_dir():
        raise ParserError(f"spaCy wrote no {best}: training ended before its first evaluation "
                          f"(max_minutes={max_minutes} is too short)")
    partial = output / f".{MODEL_DIR}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(best, partial)
    if (output / MODEL_DIR).exists():
        shutil.rmtree(output / MODEL_DIR)
    partial.rename(output / MODEL_DIR)
    meta = json.loads((best / "meta.json").read_text(encoding="utf-8"))
    (output / "training.json").write_text(json.dumps({
        "treebank": str(pathlib.Path(treebank)), "sentences": sizes, "max_minutes": max_minutes,
        "max_steps": max_steps, "minutes": round(minutes, 2), "seed": seed, "spacy": spacy.__version__,
        "dev_scores": {name: value for name, value in meta.get("performance", {}).items()
                       if isinstance(value, float) and not name.endswith("_loss")}}, indent=2) + "\n",
        encoding="utf-8")
    log(f"trained in {minutes:.1f} min; best dev checkpoint in {output / MODEL_DIR}")
    return output / MODEL_DIR


def load_parser(path: str | os.PathLike):
    """The spaCy pipeline of a `train_parser` output directory (or a pipeline directory)."""
    spacy = _spacy()
    path = pathlib.Path(path)
    if (path / MODEL_DIR / "meta.json").is_file():
        path = path / MODEL_DIR
    if not (path / "meta.json").is_file():
        raise ParserError(f"{path}: no trained parser here (run: python -m keras_transformer.parsing train "
                          f"--treebank TREEBANK --output {path})")
    nlp = spacy.load(path)
    missing = [name for name in PIPELINE if name not in nlp.pipe_names]
    if missing:
        raise ParserError(f"{path}: the pipeline has no {missing} (it has {nlp.pipe_names})")
    return nlp


def _sentence(doc) -> AnnotatedSentence:
    """A parsed one-sentence spaCy `Doc` as an `AnnotatedSentence` (UD labels: `root`, not `ROOT`)."""
    heads, deprel = [], []
    for token in doc:
        if token.head.i == token.i:
            heads.append(-1)
            deprel.append("root")
        else:
            heads.append(token.head.i)
            deprel.append(token.dep_ or "dep")
    roots = [i for i, head in enumerate(heads) if head < 0]
    for extra in roots[1:]:  # never seen with preset boundaries; kept a tree all the same
        heads[extra], deprel[extra] = roots[0], "parataxis"
    return AnnotatedSentence(words=tuple(t.text for t in doc), upos=tuple(t.pos_ or "X" for t in doc),
                             deprel=tuple(deprel), heads=tuple(heads), text=doc.text)


def parse_words(nlp, sentences, batch_size: int = 256) -> list[AnnotatedSentence]:
    """Parses pre-tokenized sentences (lists of words), one tree per sentence."""
    from spacy.tokens import Doc  # noqa: PLC0415

    docs = []
    for number, words in enumerate(sentences, 1):
        words = list(words)
        if not words or any(not word or any(c.isspace() for c in word) for word in words):
            raise ParserError(f"sentence {number}: words must be non-empty and without spaces, got {words!r}")
        docs.append(Doc(nlp.vocab, words=words, sent_starts=[True] + [False] * (len(words) - 1)))
    return [_sentence(doc) for doc in nlp.pipe(docs, batch_size=batch_size)]


def parse_text(nlp, lines, batch_size: int = 256) -> list[AnnotatedSentence]:
    """Tokenizes each line with the pipeline's tokenizer and parses it as one sentence."""
    words = []
    for number, line in enumerate(lines, 1):
        tokens = [token.text for token in nlp.tokenizer(line.strip()) if not token.is_space]
        if not tokens:
            raise ParserError(f"line {number} is empty: every line must hold a sentence")
        words.append(tokens)
    parsed = parse_words(nlp, words, batch_size)
    return [AnnotatedSentence(s.words, s.upos, s.deprel, s.heads, text=line.strip())
            for s, line in zip(parsed, lines)]


def evaluate_parser(nlp, conllu_path: str | os.PathLike) -> dict:
    """UPOS accuracy, UAS and LAS (percent) of the parser on a CoNLL-U file's gold words
    and sentences, every word counted (punctuation too), LAS on universal labels."""
    gold = read_conllu(conllu_path)
    start = time.monotonic()
    parsed = parse_words(nlp, [sentence.words for sentence in gold])
    seconds = time.monotonic() - start
    words = upos = uas = las = 0
    for g, p in zip(gold, parsed):
        for i in range(len(g.words)):
            words += 1
            upos += g.upos[i] == p.upos[i]
            if g.heads[i] == p.heads[i]:
                uas += 1
                las += g.deprel[i].split(":")[0] == p.deprel[i].split(":")[0]
    return {"sentences": len(gold), "words": words, "upos": 100.0 * upos / words, "uas": 100.0 * uas / words,
            "las": 100.0 * las / words, "words_per_second": words / seconds if seconds else float("inf")}


def write_parsed_corpus(nlp, data: str | os.PathLike, output: str | os.PathLike, source_lang: str = "en",
                        target_lang: str = "de", log=print) -> dict[str, int]:
    """Parses every ``SPLIT.SOURCE_LANG`` of a `--data` directory into
    ``OUTPUT/SPLIT.SOURCE_LANG.conllu`` and copies ``SPLIT.TARGET_LANG`` beside it
    (no plain source: see the module docstring). Returns sentences per split."""
    data, output = pathlib.Path(data), pathlib.Path(output)
    sources = sorted(data.glob(f"*.{source_lang}"))
    if not sources:
        raise ParserError(f"{data}: no *.{source_lang} files to parse")
    if output.exists():
        raise ParserError(f"{output} exists: give a new directory")
    partial = output.parent / f".{output.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    counts = {}
    for source in sources:
        stem = source.name[: -len(source_lang) - 1]
        target = data / f"{stem}.{target_lang}"
        if not target.is_file():
            raise ParserError(f"{target}: file does not exist (its counterpart {source.name} does)")
        lines = source.read_text(encoding="utf-8").splitlines()
        start = time.monotonic()
        try:
            sentences = parse_text(nlp, lines)
        except ParserError as error:
            raise ParserError(f"{source}: {error}") from None
        blocks = [to_conllu(sentence) for sentence in sentences]
        (partial / f"{stem}.{source_lang}.conllu").write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
        shutil.copyfile(target, partial / target.name)
        counts[stem] = len(sentences)
        log(f"{source.name}: {len(sentences)} sentences parsed in {time.monotonic() - start:.1f} s")
    partial.rename(output)
    return counts


def build_parser() -> argparse.ArgumentParser:
    """The command line: `main` parses with it, and the command reference is made from it."""
    # One line per error, named by the command, as the other commands do (argparse printed its
    # usage block first; `python -m keras_transformer.parsing train` without flags: 6 lines).
    parser = OneLineArgumentParser(prog="keras_transformer.parsing", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train the parser on a UD treebank directory")
    train.add_argument("--treebank", required=True, help="directory with *-ud-train.conllu and *-ud-dev.conllu")
    train.add_argument("--output", required=True, help="directory for the parser (model/ inside)")
    train.add_argument("--max-minutes", type=float, default=DEFAULT_MAX_MINUTES,
                       help=f"training budget in minutes (default {DEFAULT_MAX_MINUTES:g})")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--max-steps", type=int, default=0,
                       help="also stop after this many updates (default 0: the minutes and spaCy's patience "
                            "decide); with a --max-minutes the machine cannot reach, as many updates on a "
                            "slow machine as on a fast one")
    evaluate = commands.add_parser("evaluate", help="UPOS, UAS, LAS on a CoNLL-U file's gold words")
    evaluate.add_argument("--parser", required=True)
    evaluate.add_argument("--conllu", required=True)
    corpus = commands.add_parser("corpus", help="parse a --data directory's source side into a new one")
    corpus.add_argument("--parser", required=True)
    corpus.add_argument("--data", required=True, help="directory with SPLIT.SRC and SPLIT.TGT files")
    corpus.add_argument("--output", required=True, help="new directory: SPLIT.SRC.conllu and SPLIT.TGT")
    corpus.add_argument("--source-lang", default="en")
    corpus.add_argument("--target-lang", default="de")
    sentences = commands.add_parser("sentences", help="parse stdin (one sentence per line) to CoNLL-U on stdout")
    sentences.add_argument("--parser", required=True)
    return parser


@stops_quietly_for_a_closed_pipe
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "train" and args.max_steps < 0:
        parser.error(f"--max-steps must be >= 0 (0: no limit), got {args.max_steps}")
    if args.command == "train" and not args.max_minutes > 0:  # (-1 shuffled the data for ~2 minutes, then failed)
        parser.error(f"--max-minutes must be > 0, got {args.max_minutes}")
    from conllu import exceptions as conllu_exceptions

    try:
        if args.command == "train":
            train_parser(args.treebank, args.output, args.max_minutes, args.seed, max_steps=args.max_steps)
            test = treebank_files(args.treebank).get("test")
            if test is not None:
                scores = evaluate_parser(load_parser(args.output), test)
                print(json.dumps({"test": scores}))
        elif args.command == "evaluate":
            print(json.dumps(evaluate_parser(load_parser(args.parser), args.conllu)))
        elif args.command == "corpus":
            counts = write_parsed_corpus(load_parser(args.parser), args.data, args.output, args.source_lang,
                                         args.target_lang, log=lambda line: print(line, file=sys.stderr))
            print(json.dumps(counts))
        else:
            # As export.translate reads stdin (`input_lines`): a byte order mark and CR LF are no part
            # of a sentence, and invalid UTF-8 becomes U+FFFD (it was a UnicodeDecodeError traceback).
            lines = [line.decode("utf-8", "replace") for line in input_lines(sys.stdin.buffer)]
            for sentence in parse_text(load_parser(args.parser), lines):
                sys.stdout.write(to_conllu(sentence) + "\n\n")
    except BrokenPipeError:  # a reader that stopped (`... | head`): the decorator's quiet exit
        raise
    except (ParserError, AnnotationError, conllu_exceptions.ParseException, OSError) as error:  # bad trees, unreadable files
        print(f"keras_transformer.parsing: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
