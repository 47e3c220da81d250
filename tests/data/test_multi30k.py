"""Tests of keras_transformer.data.multi30k: the TFDS builder on dummy files, offline.

The dummy files in tests/data/multi30k/ have the upstream names (``train.en.gz``,
``test_2016_flickr.de.gz``, ...) and a few made-up captions each; nothing is downloaded.
"""

import gzip
import pathlib
import re

import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from keras_transformer.data import load_corpus  # noqa: E402  (after the skip)
from keras_transformer.data.multi30k import Multi30k  # noqa: E402
from keras_transformer.data.multi30k.multi30k_dataset_builder import (  # noqa: E402
    LANGUAGES, SPLIT_STEMS, file_urls)

DUMMY = pathlib.Path(__file__).resolve().parent / "multi30k"
# Examples per split in the dummy files.
DUMMY_SIZES = {"train": 3, "validation": 2, "test2016": 2, "test2017_flickr": 2, "test2017_mscoco": 1,
               "test2018_flickr": 2}


def dummy_lines(stem, lang):
    with gzip.open(DUMMY / f"{stem}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


class Multi30kBuilderTest(tfds.testing.DatasetBuilderTestCase):
    """TFDS's own builder checks (registration, preparation, every split's example count,
    no example in two splits, every downloaded URL recorded in checksums.tsv) on the dummy files."""

    DATASET_CLASS = Multi30k
    SPLITS = DUMMY_SIZES
    EXAMPLE_DIR = str(DUMMY)
    DL_DOWNLOAD_RESULT = {key: url.rsplit("/", 1)[1] for key, url in file_urls().items()}


def test_checksums_cover_exactly_the_downloaded_files():
    rows = [line.split("\t") for line in Multi30k._checksums_path.read_text().splitlines()]
    assert sorted(url for url, *_ in rows) == sorted(file_urls().values())
    assert len(file_urls()) == len(SPLIT_STEMS) * len(LANGUAGES) == 12
    for url, size, sha256, name in rows:
        assert int(size) > 0 and re.fullmatch("[0-9a-f]{64}", sha256), url
        assert url.endswith("/" + name)


@pytest.fixture
def offline_download(monkeypatch):
    """`DownloadManager.download` gives the dummy file of each URL instead of fetching it."""
    def download(self, urls):
        return {key: tfds.core.Path(DUMMY / url.rsplit("/", 1)[1]) for key, url in urls.items()}

    monkeypatch.setattr(tfds.download.DownloadManager, "download", download)


def pairs_of(dataset):
    return [(s.decode(), t.decode()) for s, t in dataset.as_numpy_iterator()]


def test_load_corpus_reads_multi30k_through_tfds_as_the_same_text_in_a_directory(
        offline_download, tmp_path):
    """`--data multi30k` (TFDS: prepared into a data_dir) and `--data DIR` holding the same
    files uncompressed give the same splits, names and sentence pairs."""
    text_dir = tmp_path / "text"
    text_dir.mkdir()
    for stem in SPLIT_STEMS.values():
        name = stem.replace("_2016_flickr", "2016").replace("test_", "test")
        for lang in LANGUAGES:
            (text_dir / f"{name}.{lang}").write_text(
                "".join(line + "\n" for line in dummy_lines(stem, lang)), encoding="utf-8")
    directory = load_corpus(str(text_dir), "en", "de")
    corpus = load_corpus("multi30k", tfds_data_dir=str(tmp_path / "tfds"))

    expected_splits = {"train", "valid", "test2016", "test2017_flickr", "test2017_mscoco", "test2018_flickr"}
    assert set(corpus.splits) == set(directory.splits) == expected_splits
    assert (corpus.source_lang, corpus.target_lang) == ("en", "de")
    for split in expected_splits:
        assert pairs_of(corpus.splits[split]) == pairs_of(directory.splits[split]), split
        assert corpus.sizes[split] == directory.sizes[split]
    stem = SPLIT_STEMS["train"]
    assert pairs_of(corpus.splits["train"]) == list(zip(dummy_lines(stem, "en"), dummy_lines(stem, "de")))
    assert pairs_of(corpus.splits["train"])[1][1].endswith(" ")  # text as it is, trailing space kept
    assert corpus.fingerprint()["name"] == "multi30k"
    assert corpus.fingerprint()["version"] == str(Multi30k.VERSION)
    reverse = load_corpus("tfds:multi30k", "de", "en", tfds_data_dir=str(tmp_path / "tfds"))
    assert pairs_of(reverse.splits["test2016"]) == [(t, s) for s, t in pairs_of(corpus.splits["test2016"])]


def test_train_py_accepts_data_multi30k():
    import train  # noqa: PLC0415

    assert train.parse_args(["--data", "multi30k"]).run.data == "multi30k"
