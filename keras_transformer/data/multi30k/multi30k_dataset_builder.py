"""Multi30k task 1 (English-German image captions) as a TFDS ``GeneratorBasedBuilder``.

The source is the official ``multi30k/dataset`` GitHub repository's
``data/task1/raw/`` files (cased, untokenized UTF-8, one caption per line,
aligned by line), pinned to one commit. ``checksums.tsv`` beside this file
records each file's size and SHA-256; TFDS refuses a download that differs.

Splits (examples): ``train`` (29,000), ``validation`` (1,014; ``val``
upstream), ``test2016`` (1,000; the standard "test2016 flickr" set), and the
later shared-task test sets ``test2017_flickr`` (1,000), ``test2017_mscoco``
(461) and ``test2018_flickr`` (1,071), all with German references.
Examples keep the upstream line order. ``load_corpus`` names the splits
``train``, ``valid`` and, keeping their names, ``test2016`` ...
``test2018_flickr``, as it does the same files in a directory.

Example:
    >>> import tensorflow_datasets as tfds

    >>> import keras_transformer.data.multi30k  # registers "multi30k"
    >>> ds = tfds.load("multi30k", split="test2016")  # doctest: +SKIP
    >>> next(iter(ds))["de"]  # doctest: +SKIP

Terms stated upstream: derived from Flickr30K, for non-commercial research and
educational use.
"""

from __future__ import annotations

import gzip

import tensorflow_datasets as tfds

from keras_transformer.constants import UTF8_BOM

# The multi30k/dataset commit whose files checksums.tsv records.
SOURCE_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
SOURCE_URL = f"https://raw.githubusercontent.com/multi30k/dataset/{SOURCE_COMMIT}/data/task1/raw"
LANGUAGES = ("en", "de")
# Our split name -> the upstream file stem.
SPLIT_STEMS = {
    "train": "train",
    "validation": "val",
    "test2016": "test_2016_flickr",
    "test2017_flickr": "test_2017_flickr",
    "test2017_mscoco": "test_2017_mscoco",
    "test2018_flickr": "test_2018_flickr",
}

_CITATION = """\
@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016},
  pages = {70--74},
}
"""


def file_urls() -> dict[str, str]:
    """``{"train.en": URL, ...}``: every file the builder downloads, one per split and language."""
    return {f"{split}.{lang}": f"{SOURCE_URL}/{stem}.{lang}.gz"
            for split, stem in SPLIT_STEMS.items() for lang in LANGUAGES}


def read_lines(path) -> list[str]:
    """The lines of a gzipped UTF-8 file, line ends (``\\r\\n`` too) and a leading byte order
    mark removed, as ``load_corpus`` reads a directory's plain files."""
    with path.open("rb") as raw, gzip.GzipFile(fileobj=raw) as f:
        lines = [line.rstrip(b"\n").removesuffix(b"\r").decode("utf-8") for line in f]
    if lines:
        lines[0] = lines[0].removeprefix(UTF8_BOM.decode())
    return lines


class Multi30k(tfds.core.GeneratorBasedBuilder):
    """Multi30k task 1, English-German: 31k image captions and their translations.

    Features: ``{"en": tf.string, "de": tf.string}`` (``tfds.features.Translation``);
    ``supervised_keys`` ``("en", "de")``. Splits: see the module docstring.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": f"Task-1 en/de files of multi30k/dataset at {SOURCE_COMMIT[:7]}."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=("Multi30k task 1: English image descriptions of Flickr30K with professional "
                         "German translations, cased and untokenized (Elliott et al., 2016)."),
            features=tfds.features.Translation(languages=LANGUAGES),
            supervised_keys=LANGUAGES,
            homepage="https://github.com/multi30k/dataset",
            citation=_CITATION,
            # Upstream line order (TFDS otherwise reorders by a hash of the key): a test set's
            # hypotheses line up with its official reference file, line for line.
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        paths = dl_manager.download(file_urls())
        return {split: self._generate_examples(paths[f"{split}.en"], paths[f"{split}.de"])
                for split in SPLIT_STEMS}

    def _generate_examples(self, source_path, target_path):
        sources, targets = read_lines(source_path), read_lines(target_path)
        if len(sources) != len(targets):
            raise ValueError(f"{source_path} has {len(sources)} lines but {target_path} has "
                             f"{len(targets)}: Multi30k's files must be aligned line by line")
        for index, (en, de) in enumerate(zip(sources, targets)):
            yield index, {"en": en, "de": de}
