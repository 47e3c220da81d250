"""Tests of keras_transformer.data.corpora: every --data form gives the same pairs."""

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import time

import pytest
import tensorflow as tf

from keras_transformer.data.corpora import (CorpusError, count_lines, describe_fingerprint_change,
                                            load_corpus)

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


@pytest.fixture(autouse=True)
def _tfds_temporary_directories_kept_out_of_tmp(tmp_path_factory, monkeypatch):
    """This module's own `tfds.load` and `tfds.builder` calls (the references our loader is
    compared with) leave TFDS 4.9's empty `tmp*tfds` directories, which our loader no longer
    does (`test_a_tfds_corpus_leaves_no_temporary_directories`): they go to a directory of
    pytest's, not seven into /tmp at every suite run."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("tempfile")))


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


def test_a_byte_order_mark_and_crlf_line_ends_are_not_part_of_the_sentences(corpus_dir):
    """Files saved by Windows editors: a UTF-8 byte order mark before the first line stayed
    glued to the first sentence, a reference that sacreBLEU then scored against
    ('\\ufeffthe' is not 'the'). CR LF line ends were already removed."""
    for name in ("train.en", "test2016.de"):
        path = corpus_dir / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    corpus = load_corpus(str(corpus_dir), "en", "de")
    assert pairs_of(corpus.splits["train"]) == list(zip(english(7, "train"), german(7, "train")))
    assert pairs_of(corpus.splits["test"]) == list(zip(english(2, "test2016"), german(2, "test2016")))
    assert corpus.sizes["train"] == 7 and next(corpus.texts("train")) == "train sentence 0 in English ."


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


def test_unreadable_file(corpus_dir, monkeypatch):
    """A file the process may not read. CI runs as root, which reads any file whatever its
    mode (this test was always skipped there), so the refusal comes from `open` itself."""
    import builtins
    import errno

    from keras_transformer.data import corpora

    def refuse(path, *args, **kwargs):
        if os.fspath(path).endswith("train.de"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(corpora, "open", refuse, raising=False)
    with pytest.raises(CorpusError) as error:
        load_corpus(str(corpus_dir), "en", "de")
    assert "train.de" in one_line(error) and "cannot read file (Permission denied)" in one_line(error)


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


def test_tfds_finds_a_builders_code_as_its_download_does():
    """TFDS 4.9.10 downloads a dataset through `DatasetBuilder.code_path`, which imports the
    importlib_resources backport that it declares only for Python < 3.9
    (tensorflow/datasets#11212): on a fresh install every `--data NAME` download failed with
    "No module named 'importlib_resources'". pyproject.toml installs it; no network needed here."""
    tfds = pytest.importorskip("tensorflow_datasets")
    path = tfds.builder("ted_hrlr_translate/pt_to_en").code_path
    assert path.name == "ted_hrlr_translate_dataset_builder.py" and path.is_file()


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


# -- fingerprints ------------------------------------------------------------

needs_embedded = pytest.mark.skipif(importlib.util.find_spec("keras_transformer.data.embedded") is None,
                                    reason="embedded corpus module not present")


def test_directory_fingerprint_hashes_every_file_and_survives_a_move(corpus_dir, tmp_path_factory):
    fingerprint = load_corpus(str(corpus_dir), "en", "de").fingerprint()
    assert json.loads(json.dumps(fingerprint)) == fingerprint
    assert (fingerprint["kind"], fingerprint["source_lang"], fingerprint["target_lang"]) == \
        ("directory", "en", "de")
    assert str(corpus_dir) not in json.dumps(fingerprint)
    expected = {}
    for split, stem, pairs in (("train", "train", 7), ("valid", "valid", 3), ("test", "test2016", 2)):
        expected[split] = {"pairs": pairs}
        for side, lang in (("source", "en"), ("target", "de")):
            content = (corpus_dir / f"{stem}.{lang}").read_bytes()
            expected[split][side] = {"file": f"{stem}.{lang}", "bytes": len(content),
                                     "sha256": hashlib.sha256(content).hexdigest()}
    assert fingerprint["splits"] == expected
    moved = tmp_path_factory.mktemp("moved") / "corpus"
    shutil.copytree(corpus_dir, moved)
    again = load_corpus(str(moved), "en", "de").fingerprint()
    assert again == fingerprint
    assert describe_fingerprint_change(fingerprint, again) == ""


def test_directory_fingerprint_changes_with_one_byte_and_names_the_file(corpus_dir):
    before = load_corpus(str(corpus_dir), "en", "de").fingerprint()
    path = corpus_dir / "train.de"
    content = bytearray(path.read_bytes())
    content[0] = ord("X") if content[0] != ord("X") else ord("Y")  # same size, one byte different
    path.write_bytes(bytes(content))
    same_size = load_corpus(str(corpus_dir), "en", "de").fingerprint()
    assert same_size != before
    assert describe_fingerprint_change(before, same_size) == "train.de changed (same size, different SHA-256)"
    path.write_bytes(b"!" + bytes(content))  # one byte longer, still 7 lines
    longer = load_corpus(str(corpus_dir), "en", "de").fingerprint()
    n = len(content)
    assert describe_fingerprint_change(before, longer) == f"train.de changed (size {n} -> {n + 1} bytes)"


def test_describe_fingerprint_change_of_splits(corpus_dir):
    before = load_corpus(str(corpus_dir), "en", "de").fingerprint()
    sizes = {name: (corpus_dir / name).stat().st_size for name in ("train.en", "train.de")}
    (corpus_dir / "valid.en").rename(corpus_dir / "dev.en")
    (corpus_dir / "valid.de").rename(corpus_dir / "dev.de")
    write(corpus_dir, "train.en", english(8, "train"))
    write(corpus_dir, "train.de", german(8, "train"))
    after = load_corpus(str(corpus_dir), "en", "de").fingerprint()
    assert describe_fingerprint_change(before, after).split("; ") == [
        f"train.en changed (size {sizes['train.en']} -> {(corpus_dir / 'train.en').stat().st_size} bytes)",
        f"train.de changed (size {sizes['train.de']} -> {(corpus_dir / 'train.de').stat().st_size} bytes)",
        "split 'train' has 7 -> 8 pairs",
        "valid source file valid.en -> dev.en", "valid target file valid.de -> dev.de"]
    reverse = load_corpus(str(corpus_dir), "de", "en").fingerprint()
    assert describe_fingerprint_change(after, reverse) == "direction en->de -> de->en"
    (corpus_dir / "test2016.en").unlink()
    (corpus_dir / "test2016.de").unlink()
    fewer = load_corpus(str(corpus_dir), "en", "de").fingerprint()
    assert describe_fingerprint_change(after, fewer) == "split 'test' removed (test2016.en, test2016.de)"
    assert describe_fingerprint_change(fewer, after) == "split 'test' added (test2016.en, test2016.de)"


@needs_embedded
def test_embedded_fingerprint_is_stable_for_a_seed_and_hashes_the_pairs():
    from keras_transformer.data.embedded import embedded_corpus

    first = load_corpus("embedded", seed=0).fingerprint()
    assert json.loads(json.dumps(first)) == first
    assert load_corpus("embedded", seed=0).fingerprint() == first
    tsv = {split: "".join(f"{en}\t{de}\n" for en, de in pairs)
           for split, pairs in embedded_corpus(seed=0).items()}
    expected = {split: {"pairs": text.count("\n"), "sha256": hashlib.sha256(text.encode()).hexdigest()}
                for split, text in tsv.items()}
    assert first == {"format": 1, "kind": "embedded", "source_lang": "en", "target_lang": "de",
                     "seed": 0, "splits": expected}
    other = load_corpus("embedded", seed=1).fingerprint()
    assert other["splits"]["train"]["sha256"] != first["splits"]["train"]["sha256"]
    assert describe_fingerprint_change(first, other) == "embedded seed 0 -> 1"
    reverse = load_corpus("embedded", "de", "en", seed=0).fingerprint()
    assert describe_fingerprint_change(first, reverse) == "direction en->de -> de->en"
    # same seed, different generator output (as after a change of the generator code)
    changed = json.loads(json.dumps(first))
    changed["splits"]["valid"]["sha256"] = "0" * 64
    changed["splits"]["test"]["pairs"] = 499
    assert describe_fingerprint_change(first, changed) == (
        "embedded valid changed (same seed and size, different SHA-256); "
        "embedded test changed (500 -> 499 pairs with the same seed)")


def test_describe_fingerprint_change_between_kinds_and_formats(corpus_dir):
    directory = load_corpus(str(corpus_dir), "en", "de").fingerprint()
    tfds_fingerprint = {"format": 1, "kind": "tfds", "source_lang": "en", "target_lang": "de",
                        "name": "wmt14_translate", "config": "de-en", "version": "1.0.0"}
    assert describe_fingerprint_change(directory, tfds_fingerprint) == \
        "data changed from text directory to TFDS wmt14_translate/de-en 1.0.0"
    assert describe_fingerprint_change(tfds_fingerprint, {**tfds_fingerprint, "version": "1.1.0"}) == \
        "tfds version 1.0.0 -> 1.1.0"
    assert describe_fingerprint_change(directory, {**directory, "format": 2}) == \
        "fingerprint format 1 -> 2 (cannot compare)"
    assert describe_fingerprint_change(directory, {**directory, "extra": 1}) == "fingerprint differs in extra"


def test_tfds_fingerprint_from_builder_info():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=3):
        corpus = load_corpus("tfds:ted_hrlr_translate/pt_to_en")
        fingerprint = corpus.fingerprint()
    info = tfds.builder("ted_hrlr_translate/pt_to_en").info
    assert fingerprint == {"format": 1, "kind": "tfds", "source_lang": "pt", "target_lang": "en",
                           "name": "ted_hrlr_translate", "config": "pt_to_en", "version": str(info.version)}
    assert "/".join((fingerprint["name"], fingerprint["config"], fingerprint["version"])) == info.full_name
    assert json.loads(json.dumps(fingerprint)) == fingerprint


def test_a_tfds_corpus_leaves_no_temporary_directories(tmp_path, monkeypatch):
    """TFDS 4.9 leaked an empty `/tmp/tmp*tfds` directory per builder (four a corpus: the
    builder and three splits), at every run and every failed one."""
    import tempfile

    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with tfds.testing.mock_data(num_examples=3):
        corpus = load_corpus("tfds:ted_hrlr_translate/pt_to_en")
        with pytest.raises(CorpusError):
            load_corpus("tfds:ted_hrlr_translate/pt_to_en", "pt", "fr")
        left = [p.name for p in tmp_path.iterdir() if p.name.endswith("tfds")]
        raw = [(x["pt"].decode(), x["en"].decode())  # TFDS itself, which leaks (after the count)
               for x in tfds.load("ted_hrlr_translate/pt_to_en", split="validation").as_numpy_iterator()]
    assert tempfile.tempdir == str(tmp_path)
    assert left == []
    assert pairs_of(corpus.splits["valid"]) == raw  # the splits still read after their scratch is gone


# -- unknown names fail offline ----------------------------------------------

@pytest.fixture
def no_community_catalogue(monkeypatch):
    """Makes TFDS's community catalogue (fetched from GCS) fail loudly if anything asks for it."""
    tfds = pytest.importorskip("tensorflow_datasets")

    def community_register():
        raise AssertionError("the TFDS community catalogue (network) was asked for")

    monkeypatch.setattr(tfds.core.community, "community_register", community_register)
    return tfds


def test_unknown_name_fails_fast_without_the_community_catalogue(no_community_catalogue):
    for data in ("nosuch", "tfds:nosuch"):
        start = time.perf_counter()
        with pytest.raises(CorpusError) as error:
            load_corpus(data)
        assert time.perf_counter() - start < 2.0  # offline lookups take ~0.2 s; GCS took seconds
        assert "nosuch" in one_line(error)
    with pytest.raises(CorpusError) as error:
        load_corpus("wmt14_translat")
    assert one_line(error).endswith("did you mean wmt14_translate?")


def test_a_missing_relative_directory_names_where_it_was_looked_for_and_no_far_dataset(tmp_path, monkeypatch):
    """`--data data` run from another directory: the line says where the directory was looked
    for, and suggests no TFDS name (at difflib's default cutoff it said "did you mean dart?",
    a dataset of 0.75 similarity); a near miss still gets its name, an absolute path no place.
    (The registry here is a fixed list of TFDS names, so that another TFDS's list changes
    nothing.)"""
    from keras_transformer.data import corpora

    monkeypatch.setattr(corpora, "_local_tfds_builders", lambda: ["dart", "mnist", "opus", "multi30k"])
    monkeypatch.chdir(tmp_path)
    for data, far in (("data", "dart"), ("nonexist", "mnist"), ("corpus", "opus")):
        with pytest.raises(CorpusError) as error:
            load_corpus(data)
        line = one_line(error)
        assert line.endswith(f"; looked for the directory at {tmp_path / data}") and far not in line, line
    with pytest.raises(CorpusError) as error:
        load_corpus("multi3k")
    assert one_line(error).endswith("did you mean multi30k?")
    with pytest.raises(CorpusError) as error:
        load_corpus(str(tmp_path / "gone"))
    assert "looked for" not in one_line(error) and "did you mean" not in one_line(error)


@pytest.mark.parametrize("data, languages", [
    ("wmt14_translate/de-en", ("en", "de")),
    ("tfds:ted_hrlr_translate/pt_to_en", ("pt", "en")),
    ("wmt14_translate:1.0.0", ("cs", "en")),  # the builder's first config, cs-en
    ("tfds:wmt14_translate/de-en:1.0.0", ("en", "de")),
])
def test_tfds_names_are_recognised_without_the_community_catalogue(no_community_catalogue, data, languages):
    tfds = no_community_catalogue
    name = data.removeprefix("tfds:")
    with tfds.testing.mock_data(num_examples=4):
        raw = [(x[languages[0]].decode(), x[languages[1]].decode())
               for x in tfds.load(name, split="validation").as_numpy_iterator()]
        corpus = load_corpus(data)
        assert corpus.name == f"tfds:{name}"
        assert (corpus.source_lang, corpus.target_lang) == languages
        assert pairs_of(corpus.splits["valid"]) == raw
