"""Tests of keras_transformer.data.corpora: every --data form gives the same pairs."""

import importlib.util
import os
import pathlib

import pytest
import tensorflow as tf

from keras_transformer.data.corpora import CorpusError, count_lines, load_corpus

MULTI30K = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"


def write(directory, name, lines):
    path = directory / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def pairs_of(dataset):
    return [(s.decode(), t.decode()) for s, t in dataset.as_numpy_iterator()]


def english(n, tag):
    return [f"{tag} sentence {i} in English ." for i in range(n)]


def german(n, tag):
    return [f"{tag} Satz {i} auf Deutsch – groß ." for i in range(n)]


@pytest.fixture
def corpus_dir(tmp_path):
    for stem, n in (("train", 7), ("valid", 3), ("test2016", 2)):
        write(tmp_path, f"{stem}.en", english(n, stem))
        write(tmp_path, f"{stem}.de", german(n, stem))
    return tmp_path


def one_line(error):
    message = str(error.value)
    assert "\n" not in message
    return message


def test_directory_splits_and_pairs(corpus_dir):
    corpus = load_corpus(str(corpus_dir), "en", "de")
    assert (corpus.source_lang, corpus.target_lang) == ("en", "de")
    assert corpus.sizes == {"train": 7, "valid": 3, "test": 2}
    assert corpus.files["test"] == (str(corpus_dir / "test2016.en"), str(corpus_dir / "test2016.de"))
    for split, stem in (("train", "train"), ("valid", "valid"), ("test", "test2016")):
        n = corpus.sizes[split]
        assert pairs_of(corpus.splits[split]) == list(zip(english(n, stem), german(n, stem)))
        assert int(corpus.splits[split].cardinality()) == n
    assert corpus.splits["train"].element_spec == (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string))


def test_directory_defaults_to_en_de_and_can_reverse(corpus_dir):
    default = load_corpus(str(corpus_dir))
    assert (default.source_lang, default.target_lang) == ("en", "de")
    assert pairs_of(default.splits["test"]) == list(zip(english(2, "test2016"), german(2, "test2016")))
    reverse = load_corpus(str(corpus_dir), "de", "en")
    assert pairs_of(reverse.splits["train"]) == list(zip(german(7, "train"), english(7, "train")))


def test_dev_file_is_valid_split_and_several_test_sets_keep_stems(tmp_path):
    for stem, n in (("train", 4), ("dev", 2), ("test2016", 1), ("test2017", 3)):
        write(tmp_path, f"{stem}.en", english(n, stem))
        write(tmp_path, f"{stem}.de", german(n, stem))
    corpus = load_corpus(str(tmp_path), "en", "de")
    assert corpus.sizes == {"train": 4, "valid": 2, "test2016": 1, "test2017": 3}
    assert pairs_of(corpus.splits["valid"]) == list(zip(english(2, "dev"), german(2, "dev")))


def test_texts_yield_both_sides_interleaved(corpus_dir):
    corpus = load_corpus(str(corpus_dir), "en", "de")
    assert list(corpus.texts("valid")) == [x for p in zip(english(3, "valid"), german(3, "valid")) for x in p]
    assert len(list(corpus.texts("train", limit=2))) == 4
    with pytest.raises(CorpusError, match="no split 'nope'"):
        list(corpus.texts("nope"))


@pytest.mark.parametrize("content", [b"", b"a", b"a\n", b"a\nb", b"a\r\nb\r\n", b"\n\n", b"a\n\nb\n"])
def test_count_lines_agrees_with_text_line_dataset(tmp_path, content):
    path = tmp_path / "f.txt"
    path.write_bytes(content)
    assert count_lines(path) == len(list(tf.data.TextLineDataset(str(path))))


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    write(tmp_path, "train.en", english(5, "train"))
    write(tmp_path, "train.de", german(4, "train"))
    with pytest.raises(CorpusError) as error:
        load_corpus(str(tmp_path), "en", "de")
    message = one_line(error)
    assert "train.en has 5 lines" in message and "train.de has 4 lines" in message


def test_invalid_utf8_names_file_and_line(corpus_dir):
    (corpus_dir / "valid.de").write_bytes(b"gut\nauch gut\nkaputt \xff\xfe\n")
    with pytest.raises(CorpusError) as error:
        load_corpus(str(corpus_dir), "en", "de")
    message = one_line(error)
    assert "valid.de" in message and "invalid UTF-8 on line 3" in message


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(corpus_dir):
    (corpus_dir / "train.de").chmod(0)
    try:
        with pytest.raises(CorpusError) as error:
            load_corpus(str(corpus_dir), "en", "de")
        assert "train.de" in one_line(error) and "cannot read" in one_line(error)
    finally:
        (corpus_dir / "train.de").chmod(0o644)


def test_missing_train_files_list_what_was_found(tmp_path):
    write(tmp_path, "train.en", ["a"])
    write(tmp_path, "train.fr", ["b"])
    with pytest.raises(CorpusError) as error:
        load_corpus(str(tmp_path), "en", "de")
    message = one_line(error)
    assert "train.de" in message and "train.fr" in message


def test_missing_counterpart_of_optional_split(corpus_dir):
    (corpus_dir / "valid.de").unlink()
    with pytest.raises(CorpusError) as error:
        load_corpus(str(corpus_dir), "en", "de")
    assert "valid.de" in one_line(error) and "does not exist" in one_line(error)


def test_empty_corpus(tmp_path):
    write(tmp_path, "train.en", [])
    write(tmp_path, "train.de", [])
    with pytest.raises(CorpusError, match="empty"):
        load_corpus(str(tmp_path), "en", "de")


def test_unknown_data_value(tmp_path):
    with pytest.raises(CorpusError) as error:
        load_corpus(str(tmp_path / "no_such_dir"))
    assert "no_such_dir" in one_line(error)


def test_tfds_wmt14_from_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):
        raw = [(x["en"].decode(), x["de"].decode())
               for x in tfds.load("wmt14_translate/de-en", split="validation").as_numpy_iterator()]
        corpus = load_corpus("wmt14_translate/de-en")  # no languages given: the paper's en -> de
        assert corpus.name == "tfds:wmt14_translate/de-en"
        assert (corpus.source_lang, corpus.target_lang) == ("en", "de")
        assert set(corpus.splits) == {"train", "valid", "test"}
        assert pairs_of(corpus.splits["valid"]) == raw
        reverse = load_corpus("tfds:wmt14_translate/de-en", "de", "en")
        assert pairs_of(reverse.splits["valid"]) == [(t, s) for s, t in raw]
        assert load_corpus("wmt14_translate/de-en", "de").target_lang == "en"  # the other language
        with pytest.raises(CorpusError) as error:
            load_corpus("wmt14_translate/de-en", "en", "fr")
        assert "target_lang='fr'" in one_line(error) and "['de', 'en']" in one_line(error)


@pytest.mark.skipif(importlib.util.find_spec("keras_transformer.data.embedded") is None,
                    reason="embedded corpus module not present")
def test_embedded_corpus_both_directions():
    from keras_transformer.data.embedded import SOURCE_LANG, TARGET_LANG, embedded_corpus

    expected = embedded_corpus(seed=0)
    corpus = load_corpus("embedded")
    assert (corpus.source_lang, corpus.target_lang) == (SOURCE_LANG, TARGET_LANG)
    assert corpus.sizes == {split: len(pairs) for split, pairs in expected.items()}
    assert pairs_of(corpus.splits["valid"]) == list(expected["valid"])
    reverse = load_corpus("embedded", TARGET_LANG, SOURCE_LANG)
    assert pairs_of(reverse.splits["test"].take(3)) == [(t, s) for s, t in expected["test"][:3]]


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="../shared/data/multi30k not present")
def test_multi30k_directory():
    corpus = load_corpus(str(MULTI30K), "en", "de")
    assert corpus.sizes == {"train": 29000, "valid": 1014, "test": 1000}
    first_en = (MULTI30K / "test2016.en").read_text(encoding="utf-8").splitlines()[0]
    first_de = (MULTI30K / "test2016.de").read_text(encoding="utf-8").splitlines()[0]
    assert pairs_of(corpus.splits["test"].take(1)) == [(first_en, first_de)]
