"""The dependency parser for real text (`keras_transformer.parsing`, the `parse` extra).

A parser is trained here for a few seconds on the embedded corpus's gold trees
(a small grammar it learns quickly), then parses held-out sentences, a plain
`--data` directory, and feeds a syntax-aware training run. Skipped without spaCy.
"""

import io

import numpy as np
import pytest
from helpers import closed_pipe, fixture_seed

spacy = pytest.importorskip("spacy")

from keras_transformer import parsing  # noqa: E402 (after the skip: the module needs spaCy)
from keras_transformer.data import syntax  # noqa: E402
from keras_transformer.data.embedded import embedded_annotations, embedded_corpus  # noqa: E402


def write_treebank(directory, train=400, dev=40, test=60):
    """The embedded corpus's gold CoNLL-U as a UD treebank directory (`emb-ud-SPLIT.conllu`)."""
    directory.mkdir(parents=True, exist_ok=True)
    annotations = embedded_annotations(seed=0, train_size=train)
    dev_and_test = annotations["valid"] + annotations["test"]
    splits = {"train": annotations["train"][:train], "dev": dev_and_test[:dev], "test": dev_and_test[dev:dev + test]}
    for name, sentences in splits.items():
        (directory / f"emb-ud-{name}.conllu").write_text("".join(syntax.to_conllu(s) + "\n\n" for s in sentences))
    return directory


@pytest.fixture(scope="module")
def embedded_parser(tmp_path_factory):
    root = tmp_path_factory.mktemp("parser")
    treebank = write_treebank(root / "treebank")
    # 150 updates (~10 s alone), not a wall-clock budget: a time budget got too few
    # updates on a loaded machine (UPOS 82 once beside a training run).
    model_dir = parsing.train_parser(treebank, root / "parser", max_minutes=10, eval_frequency=25,
                                     log=lambda line: None, verbose=False, max_steps=150)
    assert model_dir == root / "parser" / parsing.MODEL_DIR and not (root / "parser" / ".model.partial").exists()
    return parsing.load_parser(root / "parser"), treebank, root


def test_a_parser_trained_on_gold_trees_parses_held_out_sentences(embedded_parser):
    nlp, treebank, _ = embedded_parser
    gold = syntax.read_conllu(treebank / "emb-ud-test.conllu")
    parsed = parsing.parse_words(nlp, [s.words for s in gold])
    # The reference count, word by word, against what evaluate_parser reports.
    pairs = [(g, p, i) for g, p in zip(gold, parsed) for i in range(len(g.words))]
    expected_uas = 100.0 * np.mean([g.heads[i] == p.heads[i] for g, p, i in pairs])
    expected_las = 100.0 * np.mean([g.heads[i] == p.heads[i] and g.deprel[i] == p.deprel[i] for g, p, i in pairs])
    expected_upos = 100.0 * np.mean([g.upos[i] == p.upos[i] for g, p, i in pairs])
    scores = parsing.evaluate_parser(nlp, treebank / "emb-ud-test.conllu")
    assert scores["sentences"] == len(gold) and scores["words"] == len(pairs)
    assert scores["uas"] == pytest.approx(expected_uas) and scores["las"] == pytest.approx(expected_las)
    assert scores["upos"] == pytest.approx(expected_upos)
    # Learned, not guessed (here 100 / 100 / 99 after its 150 updates): a parser that read the
    # conversion wrong (heads shifted, labels lost) or a baseline (every word on its right
    # neighbour: 37% UAS on these sentences) stays far below.
    assert scores["upos"] > 95 and scores["uas"] > 90 and scores["las"] > 85, scores
    for g, p in zip(gold, parsed):  # one tree per sentence, on the given words
        assert p.words == g.words and sum(h < 0 for h in p.heads) == 1
        syntax.dependency_distances(p.heads)


def test_evaluation_counts_every_word_and_universal_labels(monkeypatch, tmp_path):
    gold = embedded_annotations(seed=0, train_size=20)["train"][:20]
    path = tmp_path / "gold.conllu"
    path.write_text("".join(syntax.to_conllu(s) + "\n\n" for s in gold))
    predicted = []
    for s in gold:  # word 0: wrong UPOS; word 1: the gold label with a subtype; the last word: a wrong head
        upos = ("X",) + s.upos[1:]
        deprel = s.deprel[:1] + (s.deprel[1] + ":sub",) + s.deprel[2:]
        heads = list(s.heads)
        last = len(heads) - 1
        heads[last] = last - 1 if s.heads[last] != last - 1 else (last - 2 if last > 1 else -1)
        predicted.append(syntax.AnnotatedSentence(s.words, upos, deprel, tuple(heads)))
    monkeypatch.setattr(parsing, "parse_words", lambda nlp, sentences, batch_size=256: predicted)
    scores = parsing.evaluate_parser(None, path)
    words = sum(len(s.words) for s in gold)
    wrong_upos = sum(s.upos[0] != "X" for s in gold)
    assert scores["words"] == words
    assert scores["upos"] == pytest.approx(100.0 * (words - wrong_upos) / words)
    assert scores["uas"] == pytest.approx(100.0 * (words - len(gold)) / words)
    assert scores["las"] == pytest.approx(scores["uas"])  # "nsubj:sub" counts as "nsubj"


def test_a_line_is_always_one_tree(embedded_parser):
    nlp, _, _ = embedded_parser
    lines = ["the dog sees the cat . the cat sleeps .", "A bird flies", "the dog barks"]
    parsed = parsing.parse_text(nlp, lines)
    assert len(parsed) == 3
    for line, sentence in zip(lines, parsed):
        assert list(sentence.words) == [t.text for t in nlp.tokenizer(line)]
        assert sum(h < 0 for h in sentence.heads) == 1 and sentence.deprel[sentence.heads.index(-1)] == "root"
        syntax.dependency_distances(sentence.heads)  # a tree: raises otherwise
        assert sentence.text == line
    with pytest.raises(parsing.ParserError, match="line 2 is empty"):
        parsing.parse_text(nlp, ["the dog barks", "   "])


def test_a_parsed_corpus_trains_a_syntax_aware_model(embedded_parser, tmp_path):
    from keras_transformer.config import TrainingConfig
    from keras_transformer.data import load_corpus
    from keras_transformer.training.run import train_and_evaluate

    nlp, _, _ = embedded_parser
    pairs = embedded_corpus(seed=0)
    data = tmp_path / "plain"
    data.mkdir()
    for split, limit in (("train", 200), ("valid", 8)):
        (data / f"{split}.en").write_text("".join(en + "\n" for en, _ in pairs[split][:limit]))
        (data / f"{split}.de").write_text("".join(de + "\n" for _, de in pairs[split][:limit]))
    counts = parsing.write_parsed_corpus(nlp, data, tmp_path / "parsed", log=lambda line: None)
    assert counts == {"train": 200, "valid": 8}
    assert sorted(p.name for p in (tmp_path / "parsed").iterdir()) == [
        "train.de", "train.en.conllu", "valid.de", "valid.en.conllu"]
    assert not (tmp_path / ".parsed.partial").exists()
    with pytest.raises(parsing.ParserError, match="exists"):
        parsing.write_parsed_corpus(nlp, data, tmp_path / "parsed")

    corpus = load_corpus(str(tmp_path / "parsed"), "en", "de")
    expected = parsing.parse_text(nlp, [en for en, _ in pairs["valid"][:8]])
    blocks = [b.decode() for b, _ in corpus.annotated("valid").as_numpy_iterator()]
    assert blocks == [syntax.to_conllu(s) for s in expected]
    plain = [s.decode() for s, _ in corpus.dataset("valid").as_numpy_iterator()]
    assert plain == [" ".join(s.words) for s in expected]  # the plain model reads the parser's words
    targets = [t.decode() for _, t in corpus.dataset("valid").as_numpy_iterator()]
    assert targets == [de for _, de in pairs["valid"][:8]]

    run = TrainingConfig.create("tiny", data=str(tmp_path / "parsed"), model_dir=str(tmp_path / "run"), steps=10,
                                checkpoint_every=10, vocab_size=150, bleu_every_sentences=0, seed=fixture_seed(),
                                syntax={"source_tags": ("upos", "deprel"), "syntax_attention": "hard",
                                        "syntax_max_distance": 2, "syntax_layers": (0,)})
    trained = train_and_evaluate(run)
    assert trained.results["steps"] == 10 and np.isfinite(trained.results["valid_bleu"])
    assert [i.name for i in trained.model.inputs][2:] == ["source_tags", "source_distances"]


def test_the_sentences_command_writes_conllu_the_loader_reads(embedded_parser, monkeypatch, capsys, tmp_path):
    nlp, _, root = embedded_parser
    lines = ["the dog sees the cat .", "a bird sings"]
    # a byte order mark first (a file saved on Windows) is no part of the first sentence's first word
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(("\ufeff" + "\n".join(lines) + "\n").encode())))
    assert parsing.main(["sentences", "--parser", str(root / "parser")]) == 0
    out = tmp_path / "out.conllu"
    out.write_text(capsys.readouterr().out)
    assert syntax.read_conllu(out) == parsing.parse_text(nlp, lines)
    # CR LF line ends are none of the words, and invalid UTF-8 is U+FFFD (it was a
    # UnicodeDecodeError traceback), as export.translate reads its stdin
    windows = b"\xef\xbb\xbf" + b"\r\n".join(line.encode() for line in lines) + b"\r\nthe \xff dog\r\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(windows)))
    assert parsing.main(["sentences", "--parser", str(root / "parser")]) == 0
    out.write_text(capsys.readouterr().out)
    assert syntax.read_conllu(out) == parsing.parse_text(nlp, lines + ["the \ufffd dog"])
    # read by a reader that stopped (`... | head -2`): a quiet exit 1; it was one error line,
    # "[Errno 32] Broken pipe", then Python's `Exception ignored ... BrokenPipeError` at exit
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(("\n".join(lines * 50) + "\n").encode())))
    with closed_pipe() as closed:
        monkeypatch.setattr("sys.stdout", closed)
        assert parsing.main(["sentences", "--parser", str(root / "parser")]) == 1
        assert capsys.readouterr().err == ""


def test_evaluate_on_a_bad_conllu_file_is_a_one_line_error(embedded_parser, tmp_path, capsys):
    # A missing file, a tree whose head points at no word, and a line conllu cannot parse
    # were tracebacks from `read_conllu`: only ParserError was caught.
    _, _, root = embedded_parser
    (tmp_path / "dangling.conllu").write_text("1\tHello\t_\tINTJ\t_\t_\t5\troot\t_\t_\n\n")
    (tmp_path / "garbled.conllu").write_text("1\tHello\t_\tINTJ\t_\t_\tnot-a-head\troot\t_\t_\n\n")
    expected = {"missing.conllu": "No such file or directory", "dangling.conllu": "has head 5, not a word",
                "garbled.conllu": "not-a-head"}
    for name, message in expected.items():
        argv = ["evaluate", "--parser", str(root / "parser"), "--conllu", str(tmp_path / name)]
        assert parsing.main(argv) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("keras_transformer.parsing: error: ") and message in err[0], (
            name, err)


def test_bad_input_gets_a_one_line_error(tmp_path, capsys):
    treebank = write_treebank(tmp_path / "treebank", train=5, dev=2, test=2)
    (treebank / "emb-ud-dev.conllu").unlink()
    with pytest.raises(parsing.ParserError, match="no \\*-ud-dev.conllu"):
        parsing.treebank_files(treebank)
    assert parsing.main(["train", "--treebank", str(tmp_path / "nowhere"), "--output", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err == (f"keras_transformer.parsing: error: {tmp_path / 'nowhere'}: not a directory "
                                       f"(a UD treebank with *-ud-train.conllu and *-ud-dev.conllu)\n")
    # a misused flag: one line naming the subcommand (argparse printed its usage block first)
    for argv, message in ((["train"], "the following arguments are required: --treebank, --output"),
                          (["bogus"], "argument command: invalid choice: 'bogus'"),
                          (["evaluate", "--parser", "p", "--conllu", "c", "--extra"], "unrecognized arguments: --extra")):
        with pytest.raises(SystemExit) as exit_info:
            parsing.main(argv)
        err = capsys.readouterr().err.splitlines()
        assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("keras_transformer.parsing") \
            and ": error: " in err[0] and message in err[0], (argv, err)
    with pytest.raises(parsing.ParserError, match="no trained parser here"):
        parsing.load_parser(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.en").write_text("the dog barks\n\n")
    (tmp_path / "data" / "train.de").write_text("der Hund bellt\nx\n")
    with pytest.raises(parsing.ParserError, match="no \\*.fr files"):
        parsing.write_parsed_corpus(None, tmp_path / "data", tmp_path / "out", source_lang="fr")


def test_the_cli_takes_a_budget_in_updates(tmp_path, capsys):
    """`train --max-steps N` reaches train_parser (spaCy's `max_steps`, which the fixture above
    also trains with): a budget in updates trains as long on a slow machine as on a fast one,
    where the default 25 minutes reached update 5,800 on one machine and ~3,000 on another."""
    import json

    treebank = write_treebank(tmp_path / "treebank", train=40, dev=5, test=5)
    argv = ["train", "--treebank", str(treebank), "--output", str(tmp_path / "p"), "--max-minutes", "10",
            "--max-steps", "4"]
    assert parsing.main(argv) == 0
    training = json.loads((tmp_path / "p" / "training.json").read_text())
    assert training["max_steps"] == 4 and training["max_minutes"] == 10
    with pytest.raises(SystemExit) as exit_info:
        parsing.main([*argv[:-1], "-3"])
    assert exit_info.value.code == 2
    assert "--max-steps must be >= 0 (0: no limit), got -3" in capsys.readouterr().err


def test_a_spent_budget_ends_training_at_the_next_epoch(tmp_path, monkeypatch, capsys):
    """Once `--max-minutes` had passed, every epoch was empty but spaCy's loop still shuffled the
    training examples for each of the up to 10,000 epochs left: ~67 s after a UD-EWT budget
    (12,544 sentences) on a 2-vCPU EPYC, where a 1-minute budget then took 2.4 minutes in all.
    Now the first epoch that starts after the deadline ends training. Here the budget is spent
    before the first update: one shuffle, then the one-line error that no evaluation ran."""
    import spacy.training.loop

    shuffles = []
    real_shuffle = spacy.training.loop.random.shuffle
    monkeypatch.setattr(spacy.training.loop.random, "shuffle", lambda x: shuffles.append(1) or real_shuffle(x))
    treebank = write_treebank(tmp_path / "treebank", train=40, dev=5, test=5)
    with pytest.raises(parsing.ParserError, match=r"training ended before its first evaluation \(max_minutes=1e-09"):
        parsing.train_parser(treebank, tmp_path / "p", max_minutes=1e-9, log=lambda line: None, verbose=False)
    assert len(shuffles) == 1
    # The command refuses a budget that is spent before it starts (-1 had shuffled for ~2 minutes, then failed).
    for minutes in ("0", "-1"):
        with pytest.raises(SystemExit) as exit_info:
            parsing.main(["train", "--treebank", str(treebank), "--output", str(tmp_path / "q"), "--max-minutes",
                          minutes])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == (f"keras_transformer.parsing: error: --max-minutes must be > 0, got "
                                           f"{float(minutes)} (see --help)\n")
