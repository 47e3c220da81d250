"""Parallel corpora behind one ``--data`` value, all returned in one form.

``load_corpus(data, source_lang, target_lang)`` accepts

* ``"embedded"``: the generated English->German corpus shipped with the
  package (``keras_transformer.data.embedded``), splits train/valid/test;
* a directory of plain-text, line-aligned UTF-8 files ``train.SRC`` /
  ``train.TGT`` (required), ``valid.*`` or ``dev.*`` or ``val.*`` (optional,
  split name ``valid``) and ``test*.SRC`` / ``test*.TGT`` (optional; a single
  set such as multi30k's ``test2016.*`` is split ``test``, several sets keep
  their stems as split names);
* ``tfds:NAME`` or a TensorFlow Datasets name such as
  ``wmt14_translate/de-en`` or ``ted_hrlr_translate/pt_to_en`` (TFDS splits
  train/validation/test become train/valid/test).

Direction: the language codes are the ``source_lang``/``target_lang``
arguments.  When they are not given the paper's English->German is used
(for every kind of ``data``); a TFDS dataset without both ``en`` and ``de``
falls back to its own ``supervised_keys`` direction, and for a two-language
TFDS dataset one given code implies the other.  The direction is never
guessed from file names (``train.en``/``train.de`` say nothing about which
side is the source).

Every split is a ``tf.data.Dataset`` of ``(source, target)`` scalar
``tf.string`` pairs.  Problems found up front (missing files, invalid UTF-8,
unreadable files, files of different line counts, empty splits) raise a
one-line ``CorpusError`` naming the file and the problem, instead of failing
later inside tf.data.
"""

from __future__ import annotations

import codecs
import dataclasses
import importlib.util
import os
import pathlib
from collections.abc import Iterator

import tensorflow as tf

EMBEDDED = "embedded"
DEFAULT_SOURCE_LANG = "en"
DEFAULT_TARGET_LANG = "de"
# Accepted file stems of the validation split, in order of preference.
VALID_STEMS = ("valid", "dev", "val")
# TFDS split name for each of ours.
TFDS_SPLITS = {"train": "train", "valid": "validation", "test": "test"}


class CorpusError(ValueError):
    """A corpus is missing, unreadable, misaligned or empty.

    The message is one line naming the file (or dataset) and the problem.
    """


@dataclasses.dataclass(frozen=True)
class ParallelCorpus:
    """Sentence pairs of one language direction, by split.

    Args:
        name: where the data came from (``"embedded"``, a directory, a TFDS
            name).
        source_lang: source language code, e.g. ``"en"``.
        target_lang: target language code, e.g. ``"de"``.
        splits: split name (``"train"``, ``"valid"``, ``"test"``, ...) ->
            ``tf.data.Dataset`` of ``(source, target)`` scalar ``tf.string``
            pairs, in corpus order (not shuffled).
        sizes: split name -> number of pairs, where known (None otherwise).
        files: split name -> ``(source_file, target_file)`` for text
            directories (empty otherwise).

    Example:
        >>> corpus = load_corpus("../shared/data/multi30k", "en", "de")
        >>> corpus.sizes
        {'train': 29000, 'valid': 1014, 'test': 1000}
        >>> train_tokenizer(corpus.texts("train"), "run/tokenizer", 8000)
    """

    name: str
    source_lang: str
    target_lang: str
    splits: dict[str, tf.data.Dataset]
    sizes: dict[str, int | None] = dataclasses.field(default_factory=dict)
    files: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)

    def dataset(self, split: str) -> tf.data.Dataset:
        """Returns one split.

        Args:
            split: a key of ``splits``.

        Returns:
            ``tf.data.Dataset`` of ``(source, target)`` ``tf.string`` scalars.

        Raises:
            CorpusError: no such split (the message lists the available ones).
        """
        if split not in self.splits:
            raise CorpusError(f"{self.name}: no split {split!r}, available: {sorted(self.splits)}")
        return self.splits[split]

    def texts(self, split: str = "train", limit: int | None = None) -> Iterator[str]:
        """Yields the sentences of both languages, for tokenizer training.

        Args:
            split: the split to read.
            limit: read at most this many pairs (yields up to ``2 * limit``
                sentences); None reads all.

        Yields:
            ``source_0, target_0, source_1, target_1, ...`` as Python str.
        """
        ds = self.dataset(split)
        if limit is not None:
            ds = ds.take(limit)
        for sources, targets in ds.batch(4096).as_numpy_iterator():
            for source, target in zip(sources, targets):
                yield source.decode("utf-8")
                yield target.decode("utf-8")


def load_corpus(data: str, source_lang: str | None = None, target_lang: str | None = None, *,
                tfds_data_dir: str | None = None, download: bool = True,
                seed: int = 0) -> ParallelCorpus:
    """Loads the parallel corpus named by a ``--data`` value.

    Args:
        data: ``"embedded"``, a directory of text files, ``"tfds:NAME"`` or a
            TFDS name (see the module docstring).
        source_lang: source language code; None -> ``"en"`` (see the module
            docstring for TFDS datasets without English/German).
        target_lang: target language code; None -> ``"de"``.
        tfds_data_dir: TFDS ``data_dir`` (None: TFDS's default).
        download: let TFDS download and prepare a dataset that is not there.
        seed: seed of the embedded corpus generator.

    Returns:
        The ``ParallelCorpus``.

    Raises:
        CorpusError: unknown ``data``, missing/unreadable/misaligned/empty
            files, unknown language codes (one line each).
    """
    if data == EMBEDDED:
        return _load_embedded(source_lang, target_lang, seed)
    path = pathlib.Path(data).expanduser()
    if path.is_dir():
        return _load_directory(path, source_lang or DEFAULT_SOURCE_LANG, target_lang or DEFAULT_TARGET_LANG)
    if data.startswith("tfds:"):
        return _load_tfds(data[len("tfds:"):], source_lang, target_lang, tfds_data_dir, download)
    if path.exists():
        raise CorpusError(f"--data={data}: is a file, expected a directory of train.SRC/train.TGT files")
    if _is_tfds_name(data):
        return _load_tfds(data, source_lang, target_lang, tfds_data_dir, download)
    raise CorpusError(
        f"--data={data}: no such directory and not a TFDS dataset name "
        f"(expected 'embedded', a directory with train.SRC/train.TGT, or tfds:NAME)")


# -- embedded ---------------------------------------------------------------

def _load_embedded(source_lang: str | None, target_lang: str | None, seed: int) -> ParallelCorpus:
    """The package's generated corpus, in either direction."""
    from keras_transformer.data import embedded  # noqa: PLC0415  (lazy: generator code)

    native = (embedded.SOURCE_LANG, embedded.TARGET_LANG)
    wanted = (source_lang or native[0], target_lang or native[1])
    if wanted not in (native, native[::-1]):
        raise CorpusError(f"embedded: languages {wanted[0]}->{wanted[1]} not available, "
                          f"the corpus is {native[0]}<->{native[1]}")
    reverse = wanted != native
    splits, sizes = {}, {}
    for split, pairs in embedded.embedded_corpus(seed=seed).items():
        if not pairs:
            raise CorpusError(f"embedded: split {split!r} is empty")
        sources = [p[1] if reverse else p[0] for p in pairs]
        targets = [p[0] if reverse else p[1] for p in pairs]
        splits[split] = tf.data.Dataset.from_tensor_slices(
            (tf.constant(sources, tf.string), tf.constant(targets, tf.string)))
        sizes[split] = len(pairs)
    return ParallelCorpus(EMBEDDED, wanted[0], wanted[1], splits, sizes)


# -- text directories ------------------------------------------------------

def count_lines(path: str | os.PathLike) -> int:
    """Counts the lines of a UTF-8 text file, validating the encoding.

    Counts like ``tf.data.TextLineDataset``: a last line without a newline
    counts, a final newline does not start a new line.

    Args:
        path: the file.

    Returns:
        The number of lines.

    Raises:
        CorpusError: the file is missing, unreadable or not valid UTF-8
            (with the line number).
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    lines, last = 0, b"\n"
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as e:
                    line = lines + chunk.count(b"\n", 0, max(e.start, 0)) + 1
                    raise CorpusError(f"{path}: invalid UTF-8 on line {line} ({e.reason})") from None
                lines += chunk.count(b"\n")
                last = chunk[-1:]
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as e:
                raise CorpusError(f"{path}: invalid UTF-8 at the end of the file ({e.reason})") from None
    except FileNotFoundError:
        raise CorpusError(f"{path}: file does not exist") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot read file ({e.strerror or e})") from None
    return lines + (last != b"\n")


def _aligned_pair_dataset(source: pathlib.Path, target: pathlib.Path) -> tuple[tf.data.Dataset, int]:
    """Checks two files are aligned and zips their lines."""
    n_source, n_target = count_lines(source), count_lines(target)
    if n_source != n_target:
        raise CorpusError(
            f"{source} has {n_source} lines but {target} has {n_target} lines: "
            f"parallel files must be aligned line by line")
    if n_source == 0:
        raise CorpusError(f"{source} and {target} are empty")
    ds = tf.data.Dataset.zip((tf.data.TextLineDataset(str(source)), tf.data.TextLineDataset(str(target))))
    return ds.apply(tf.data.experimental.assert_cardinality(n_source)), n_source


def _load_directory(directory: pathlib.Path, source_lang: str, target_lang: str) -> ParallelCorpus:
    """Plain-text files ``SPLIT.LANG`` in one directory."""
    def pair(stem: str) -> tuple[pathlib.Path, pathlib.Path]:
        return directory / f"{stem}.{source_lang}", directory / f"{stem}.{target_lang}"

    def check_both(stem: str) -> bool:
        """True if both files exist, False if neither, error if one."""
        source, target = pair(stem)
        if source.is_file() != target.is_file():
            present, missing = (source, target) if source.is_file() else (target, source)
            raise CorpusError(f"{missing}: file does not exist (its counterpart {present.name} does)")
        return source.is_file()

    if source_lang == target_lang:
        raise CorpusError(f"{directory}: source_lang and target_lang are both {source_lang!r}")
    train_source, train_target = pair("train")
    if not (train_source.is_file() and train_target.is_file()):
        found = sorted(p.name for p in directory.iterdir() if p.is_file() and p.suffix)
        raise CorpusError(
            f"{directory}: needs {train_source.name} and {train_target.name} "
            f"(source_lang={source_lang}, target_lang={target_lang}); found {found[:20]}")
    stems = {"train": "train"}
    valid = [stem for stem in VALID_STEMS if check_both(stem)]
    if valid:
        stems["valid"] = valid[0]
    tests = sorted(p.name[:-len(source_lang) - 1] for p in directory.glob(f"test*.{source_lang}"))
    tests = [stem for stem in tests if check_both(stem)]
    if len(tests) == 1:
        stems["test"] = tests[0]
    else:
        stems.update({stem: stem for stem in tests})
    splits, sizes, files = {}, {}, {}
    for split, stem in stems.items():
        source, target = pair(stem)
        splits[split], sizes[split] = _aligned_pair_dataset(source, target)
        files[split] = (str(source), str(target))
    return ParallelCorpus(str(directory), source_lang, target_lang, splits, sizes, files)


# -- TensorFlow Datasets ---------------------------------------------------

def _is_tfds_name(data: str) -> bool:
    """Whether ``data`` names a registered TFDS builder (``name[/config][:version]``)."""
    if importlib.util.find_spec("tensorflow_datasets") is None:
        return False
    import tensorflow_datasets as tfds  # noqa: PLC0415  (slow import, only when needed)

    base = data.split("/")[0].split(":")[0]
    return bool(base) and base in tfds.list_builders()


def _load_tfds(name: str, source_lang: str | None, target_lang: str | None,
               data_dir: str | None, download: bool) -> ParallelCorpus:
    """A TFDS translation dataset whose features are one string per language."""
    import tensorflow_datasets as tfds  # noqa: PLC0415

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # DatasetNotFoundError, config errors
        raise CorpusError(f"tfds:{name}: {_first_line(e)}") from None
    languages = sorted(builder.info.features.keys())
    if source_lang is None and target_lang is None:
        if {DEFAULT_SOURCE_LANG, DEFAULT_TARGET_LANG} <= set(languages):
            source_lang, target_lang = DEFAULT_SOURCE_LANG, DEFAULT_TARGET_LANG
        elif builder.info.supervised_keys:
            source_lang, target_lang = builder.info.supervised_keys[:2]
    elif len(languages) == 2 and (source_lang is None or target_lang is None):
        # one code given: the other is the dataset's other language
        other = [lang for lang in languages if lang not in (source_lang, target_lang)]
        source_lang, target_lang = source_lang or other[0], target_lang or other[0]
    for role, lang in (("source_lang", source_lang), ("target_lang", target_lang)):
        if lang not in languages:
            raise CorpusError(
                f"tfds:{name}: {role}={lang!r} is not one of the dataset's languages {languages}")
    if source_lang == target_lang:
        raise CorpusError(f"tfds:{name}: source_lang and target_lang are both {source_lang!r}")
    known = set(builder.info.splits.keys())  # empty until the dataset is prepared (and under mock_data)

    def to_pair(example):
        return example[source_lang], example[target_lang]

    splits, sizes = {}, {}
    for split, tfds_split in TFDS_SPLITS.items():
        if known and tfds_split not in known:
            continue
        try:
            ds = tfds.load(name, split=tfds_split, data_dir=data_dir, download=download,
                           as_supervised=False, shuffle_files=False)
        except Exception as e:
            raise CorpusError(
                f"tfds:{name}: split {tfds_split!r} could not be loaded: {_first_line(e)}") from None
        splits[split] = ds.map(to_pair, num_parallel_calls=tf.data.AUTOTUNE)
        cardinality = int(ds.cardinality())
        sizes[split] = cardinality if cardinality >= 0 else None
        if sizes[split] == 0:
            raise CorpusError(f"tfds:{name}: split {tfds_split!r} is empty")
    if "train" not in splits:
        raise CorpusError(f"tfds:{name}: no 'train' split (splits: {sorted(known)})")
    return ParallelCorpus(f"tfds:{name}", source_lang, target_lang, splits, sizes)


def _first_line(error: BaseException) -> str:
    """The first line of an exception message (library errors span many)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
