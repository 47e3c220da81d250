"""Parallel corpora behind one ``--data`` value, all returned in one form.

``load_corpus(data, source_lang, target_lang)`` accepts

* ``"embedded"``: the generated English->German corpus shipped with the
  package (``keras_transformer.data.embedded``), splits train/valid/test;
* a directory of plain-text, line-aligned UTF-8 files ``train.SRC`` /
  ``train.TGT`` (required), ``valid.*`` or ``dev.*`` or ``val.*`` or
  ``validation.*`` (optional, split name ``valid``; a run without one says
  so) and ``test*.SRC`` / ``test*.TGT`` (optional; a single set such as
  multi30k's ``test2016.*`` is split ``test``, several sets keep their stems
  as split names);
* ``tfds:NAME`` or a TensorFlow Datasets name such as
  ``wmt14_translate/de-en``, ``ted_hrlr_translate/pt_to_en`` or ``multi30k``
  (this package's builder, ``keras_transformer.data.multi30k``): TFDS splits
  train/validation/test become train/valid/test, and other test sets keep
  their names (multi30k's ``test2016``, ``test2017_flickr``, ...).

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

Syntax-aware models read the source side as CoNLL-U (the field's format
for parsed text; ``keras_transformer.data.syntax``): a directory may hold
``SPLIT.SRC.conllu`` beside (or instead of) ``SPLIT.SRC``, one sentence per
CoNLL-U block, aligned with ``SPLIT.TGT``; the embedded corpus knows its own
grammar and carries gold annotations of its English side.
``ParallelCorpus.annotated(split)`` gives ``(CoNLL-U sentence, target)``
pairs; without a plain ``SPLIT.SRC`` the plain source is the words joined
by spaces.

Only locally installed TFDS builders (TFDS's own and this package's
``multi30k``) are recognised: an unknown name fails at once, offline, without
asking TFDS's community catalogue (which lives on GCS).

``ParallelCorpus.fingerprint()`` identifies the data (file contents, the TFDS
name/config/version, the embedded generator's output) so that a resumed run
can notice it is given different data; ``describe_fingerprint_change`` says
in one line what differs.
"""

from __future__ import annotations

import codecs
import contextlib
import copy
import dataclasses
import difflib
import hashlib
import importlib.util
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterator

import tensorflow as tf

from keras_transformer.constants import UTF8_BOM

EMBEDDED = "embedded"
DEFAULT_SOURCE_LANG = "en"
DEFAULT_TARGET_LANG = "de"
# Accepted file stems of the validation split, in order of preference.
VALID_STEMS = ("valid", "dev", "val", "validation")  # "validation": TFDS's name for the split
# TFDS split name for each of ours.
TFDS_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
# Files are read (line counts, SHA-256) in blocks of this many bytes.
READ_BLOCK_BYTES = 1 << 20
# Version of the layout of ParallelCorpus.fingerprint(); bump it when the layout changes.
FINGERPRINT_FORMAT = 1


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
        origin: what ``fingerprint()`` records besides the languages and the
            files, set by ``load_corpus``: ``{"kind": "directory"}``,
            ``{"kind": "embedded", "seed": ..., "splits": ...}`` or
            ``{"kind": "tfds", "name": ..., "config": ..., "version": ...}``.
        annotation_files: split name -> the source side's CoNLL-U file
            (text directories with ``SPLIT.SRC.conllu``).
        annotation_reader: split name -> its source sentences as CoNLL-U
            blocks, read when first asked (``annotated``); None when the
            corpus has no annotations.

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
    origin: dict[str, object] = dataclasses.field(default_factory=dict)
    annotation_files: dict[str, str] = dataclasses.field(default_factory=dict)
    annotation_reader: Callable[[str], list[str]] | None = dataclasses.field(default=None, compare=False,
                                                                               repr=False)

    @property
    def annotated_splits(self) -> tuple[str, ...]:
        """Splits whose sources have CoNLL-U annotations."""
        if self.annotation_reader is None:
            return ()
        return tuple(self.annotation_files) if self.annotation_files else tuple(self.splits)

    def annotated(self, split: str) -> tf.data.Dataset:
        """One split with its sources as CoNLL-U, for syntax-aware models.

        Returns:
            ``tf.data.Dataset`` of ``(conllu, target)`` scalar ``tf.string``
            pairs: each source sentence's CoNLL-U block, in corpus order.

        Raises:
            CorpusError: the split has no annotations, or their count is not
                the split's number of pairs.
        """
        targets = self.dataset(split)
        if split not in self.annotated_splits:
            hint = (f"a directory needs {split}.{self.source_lang}.conllu beside {split}.{self.target_lang}"
                    if self.origin.get("kind") == "directory" else "only CoNLL-U directories and the "
                    "embedded corpus (en->de) carry source annotations")
            raise CorpusError(f"{self.name}: split {split!r} has no syntactic annotations of its "
                              f"source ({hint})")
        blocks = self.annotation_reader(split)
        if self.sizes.get(split) is not None and len(blocks) != self.sizes[split]:
            raise CorpusError(f"{self.annotation_files.get(split, self.name)}: {len(blocks)} CoNLL-U "
                              f"sentences for {self.sizes[split]} target sentences in split {split!r}")
        annotations = tf.data.Dataset.from_tensor_slices(tf.constant(blocks, tf.string))
        return tf.data.Dataset.zip((annotations, targets.map(lambda source, target: target)))

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

    def fingerprint(self) -> dict:
        """Identifies the data, for checking a resumed run is given the same.

        JSON-serialisable and deterministic.  Where the data lives is not part
        of it (a text directory may be moved or copied, a TFDS ``data_dir``
        changed); what it contains is:

        * text directory: every file's name (relative to the directory), size
          and SHA-256, per split and side, and the split's number of pairs.
          This reads every file once (a WMT corpus: seconds per GB).
        * TFDS: the builder's name, config (None if it has none) and version,
          from its ``info``; nothing is downloaded or read.
        * embedded: the generator seed and, per split, the number of pairs and
          the SHA-256 of the pairs (so a change of the generator is caught).

        Returns:
            For example, for a text directory::

                {"format": 1, "kind": "directory", "source_lang": "en", "target_lang": "de",
                 "splits": {"train": {"pairs": 29000,
                                      "source": {"file": "train.en", "bytes": 1801238, "sha256": "460a..."},
                                      "target": {"file": "train.de", "bytes": 2110398, "sha256": "2c2b..."}},
                            "valid": {...}, "test": {...}}}

            for TFDS ``{"format": 1, "kind": "tfds", "source_lang": "en",
            "target_lang": "de", "name": "wmt14_translate", "config": "de-en",
            "version": "1.0.0"}``, and for the embedded corpus
            ``{"format": 1, "kind": "embedded", "source_lang": "en",
            "target_lang": "de", "seed": 0, "splits": {"train": {"pairs":
            30000, "sha256": "..."}, "valid": {...}, "test": {...}}}``.

        Raises:
            CorpusError: a file can no longer be read, or the corpus was not
                made by ``load_corpus`` (no ``origin``, no ``files``).
        """
        kind = self.origin.get("kind", "directory" if self.files else None)
        if kind is None:
            raise CorpusError(f"{self.name}: cannot fingerprint a corpus without origin or files "
                              f"(make it with load_corpus)")
        fingerprint = {"format": FINGERPRINT_FORMAT, "kind": kind,
                       "source_lang": self.source_lang, "target_lang": self.target_lang}
        fingerprint.update(copy.deepcopy({key: value for key, value in self.origin.items() if key != "kind"}))
        if kind == "directory":
            directory = pathlib.Path(self.name)
            fingerprint["splits"] = {
                split: {"pairs": self.sizes.get(split),
                        "source": _file_fingerprint(source, directory),
                        "target": _file_fingerprint(target, directory)}
                for split, (source, target) in self.files.items()}
            for split, path in self.annotation_files.items():
                if path != self.files.get(split, ("",))[0]:  # beside a plain source file
                    fingerprint["splits"][split]["annotations"] = _file_fingerprint(path, directory)
        return fingerprint


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
    raise CorpusError(_unknown_data_message(data))


# -- fingerprints ----------------------------------------------------------

def describe_fingerprint_change(old: dict, new: dict) -> str:
    """Says in one line what differs between two ``ParallelCorpus.fingerprint()`` values.

    Args:
        old: the fingerprint recorded earlier (e.g. read back from JSON).
        new: the fingerprint of the data given now.

    Returns:
        ``""`` when they are equal, otherwise the differences joined by
        ``"; "``, e.g. ``"train.de changed (size 1234 -> 1250 bytes)"``,
        ``"tfds version 1.0.0 -> 1.1.0"``, ``"embedded seed 0 -> 1"``,
        ``"data changed from embedded corpus (seed 0) to text directory"``.

    Example:
        >>> describe_fingerprint_change(run_config["data_fingerprint"], corpus.fingerprint())
        "train.de changed (size 1234 -> 1250 bytes); split 'train' has 7 -> 8 pairs"
    """
    if old == new:
        return ""
    if old.get("kind") != new.get("kind"):
        return f"data changed from {_describe_origin(old)} to {_describe_origin(new)}"
    if old.get("format") != new.get("format"):
        return f"fingerprint format {old.get('format')} -> {new.get('format')} (cannot compare)"
    changes = []
    old_direction = f"{old.get('source_lang')}->{old.get('target_lang')}"
    new_direction = f"{new.get('source_lang')}->{new.get('target_lang')}"
    if old_direction != new_direction:
        changes.append(f"direction {old_direction} -> {new_direction}")
    new_splits = new.get("splits") or {}
    if (new.get("source_lang"), new.get("target_lang")) == (old.get("target_lang"), old.get("source_lang")):
        # reversed: compare a directory's files with the sides swapped back
        new_splits = {split: {**entry, "source": entry.get("target"), "target": entry.get("source")}
                      if isinstance(entry, dict) and "source" in entry else entry
                      for split, entry in new_splits.items()}
    if new.get("kind") == "tfds":
        changes += [f"tfds {key} {old.get(key)} -> {new.get(key)}"
                    for key in ("name", "config", "version") if old.get(key) != new.get(key)]
    elif new.get("kind") == EMBEDDED and old.get("seed") != new.get("seed"):
        changes.append(f"embedded seed {old.get('seed')} -> {new.get('seed')}")
    else:  # a directory, or the embedded generator's output for the same seed
        changes += _split_changes(old.get("splits") or {}, new_splits, new.get("kind"))
    if not changes:  # fields this function does not know about
        keys = sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))
        changes.append("fingerprint differs in " + ", ".join(map(str, keys)))
    return "; ".join(changes)


def _describe_origin(fingerprint: dict) -> str:
    """``"TFDS wmt14_translate/de-en 1.0.0"``, ``"embedded corpus (seed 0)"``, ``"text directory"``."""
    kind = fingerprint.get("kind")
    if kind == "tfds":
        name = "/".join(str(x) for x in (fingerprint.get("name"), fingerprint.get("config")) if x)
        return f"TFDS {name} {fingerprint.get('version')}"
    if kind == EMBEDDED:
        return f"embedded corpus (seed {fingerprint.get('seed')})"
    if kind == "directory":
        return "text directory"
    return f"{kind!r} data"


def _split_changes(old: dict, new: dict, kind: str | None) -> list[str]:
    """Splits added, removed, or with different files / pairs."""
    def file_names(entry: dict) -> str:
        names = [entry.get(side, {}).get("file") for side in ("source", "target")]
        return f" ({', '.join(names)})" if all(names) else ""

    changes = [f"split {split!r} removed{file_names(old[split])}" for split in old if split not in new]
    changes += [f"split {split!r} added{file_names(new[split])}" for split in new if split not in old]
    for split in (split for split in new if split in old):
        before, after = old[split], new[split]
        if kind == EMBEDDED:  # same seed, so the generator changed
            if before.get("pairs") != after.get("pairs"):
                changes.append(f"embedded {split} changed ({before.get('pairs')} -> "
                               f"{after.get('pairs')} pairs with the same seed)")
            elif before != after:
                changes.append(f"embedded {split} changed (same seed and size, different SHA-256)")
            continue
        for side in ("source", "target"):
            was, now = before.get(side) or {}, after.get(side) or {}
            if was.get("file") != now.get("file"):
                changes.append(f"{split} {side} file {was.get('file')} -> {now.get('file')}")
            elif was.get("bytes") != now.get("bytes"):
                changes.append(
                    f"{now.get('file')} changed (size {was.get('bytes')} -> {now.get('bytes')} bytes)")
            elif was.get("sha256") != now.get("sha256"):
                changes.append(f"{now.get('file')} changed (same size, different SHA-256)")
        if before.get("pairs") != after.get("pairs"):
            changes.append(f"split {split!r} has {before.get('pairs')} -> {after.get('pairs')} pairs")
    return changes


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
    splits, sizes, hashes = {}, {}, {}
    for split, pairs in embedded.embedded_corpus(seed=seed).items():
        if not pairs:
            raise CorpusError(f"embedded: split {split!r} is empty")
        sources = [p[1] if reverse else p[0] for p in pairs]
        targets = [p[0] if reverse else p[1] for p in pairs]
        splits[split] = tf.data.Dataset.from_tensor_slices(
            (tf.constant(sources, tf.string), tf.constant(targets, tf.string)))
        sizes[split] = len(pairs)
        hashes[split] = {"pairs": len(pairs), "sha256": _pairs_sha256(pairs)}
    origin = {"kind": EMBEDDED, "seed": seed, "splits": hashes}

    def read_annotations(split: str) -> list[str]:
        from keras_transformer.data.syntax import to_conllu  # noqa: PLC0415

        return [to_conllu(sentence) for sentence in embedded.embedded_annotations(seed=seed)[split]]

    return ParallelCorpus(EMBEDDED, wanted[0], wanted[1], splits, sizes, origin=origin,
                          annotation_reader=None if reverse else read_annotations)


def _pairs_sha256(pairs: list[tuple[str, str]]) -> str:
    """SHA-256 of the pairs written as ``english<TAB>german<NEWLINE>`` lines (~10 ms for 30k)."""
    digest = hashlib.sha256()
    for pair in pairs:
        digest.update(("\t".join(pair) + "\n").encode("utf-8"))
    return digest.hexdigest()


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
            while chunk := f.read(READ_BLOCK_BYTES):
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


def _file_fingerprint(path: str, directory: pathlib.Path) -> dict:
    """``{"file": name relative to directory, "bytes": size, "sha256": hex}``, read in blocks."""
    digest, size = hashlib.sha256(), 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(READ_BLOCK_BYTES):
                digest.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        raise CorpusError(f"{path}: file does not exist (any more)") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot read file ({e.strerror or e})") from None
    name = pathlib.Path(path).relative_to(directory).as_posix()
    return {"file": name, "bytes": size, "sha256": digest.hexdigest()}


def _text_lines(path: pathlib.Path) -> tf.data.Dataset:
    """``tf.data.TextLineDataset`` of ``path`` (line ends, ``\\r\\n`` too, removed), less a UTF-8
    byte order mark before its first line: Windows editors write one, and it stayed glued to
    the first sentence, a source the tokenizer and the model learned from or a reference
    that BLEU scored against."""
    lines = tf.data.TextLineDataset(str(path))
    with open(path, "rb") as f:
        if f.read(len(UTF8_BOM)) != UTF8_BOM:
            return lines
    return lines.take(1).map(lambda line: tf.strings.substr(line, len(UTF8_BOM), tf.strings.length(line))
                             ).concatenate(lines.skip(1))


def _aligned_pair_dataset(source: pathlib.Path, target: pathlib.Path) -> tuple[tf.data.Dataset, int]:
    """Checks two files are aligned and zips their lines."""
    n_source, n_target = count_lines(source), count_lines(target)
    if n_source != n_target:
        raise CorpusError(
            f"{source} has {n_source} lines but {target} has {n_target} lines: "
            f"parallel files must be aligned line by line")
    if n_source == 0:
        raise CorpusError(f"{source} and {target} are empty")
    ds = tf.data.Dataset.zip((_text_lines(source), _text_lines(target)))
    return ds.apply(tf.data.experimental.assert_cardinality(n_source)), n_source


def _load_directory(directory: pathlib.Path, source_lang: str, target_lang: str) -> ParallelCorpus:
    """Plain-text files ``SPLIT.LANG`` in one directory."""
    def pair(stem: str) -> tuple[pathlib.Path, pathlib.Path]:
        return directory / f"{stem}.{source_lang}", directory / f"{stem}.{target_lang}"

    def conllu(stem: str) -> pathlib.Path:
        return directory / f"{stem}.{source_lang}.conllu"

    def check_both(stem: str) -> bool:
        """True if both files exist, False if neither, error if one."""
        source, target = pair(stem)
        has_source = source.is_file() or conllu(stem).is_file()
        if has_source != target.is_file():
            present, missing = (source if source.is_file() else conllu(stem), target) if has_source \
                else (target, source)
            raise CorpusError(f"{missing}: file does not exist (its counterpart {present.name} does)")
        return has_source

    if source_lang == target_lang:
        raise CorpusError(f"{directory}: source_lang and target_lang are both {source_lang!r}")
    train_source, train_target = pair("train")
    if not ((train_source.is_file() or conllu("train").is_file()) and train_target.is_file()):
        found = sorted(p.name for p in directory.iterdir() if p.is_file() and p.suffix)
        raise CorpusError(
            f"{directory}: needs {train_source.name} and {train_target.name} "
            f"(source_lang={source_lang}, target_lang={target_lang}); found {found[:20]}")
    stems = {"train": "train"}
    valid = [stem for stem in VALID_STEMS if check_both(stem)]
    if valid:
        stems["valid"] = valid[0]
    tests = sorted({p.name[:-len(source_lang) - 1] for p in directory.glob(f"test*.{source_lang}")}
                   | {p.name[:-len(source_lang) - 8] for p in directory.glob(f"test*.{source_lang}.conllu")})
    tests = [stem for stem in tests if check_both(stem)]
    if len(tests) == 1:
        stems["test"] = tests[0]
    else:
        stems.update({stem: stem for stem in tests})
    splits, sizes, files, annotation_files, read = {}, {}, {}, {}, {}
    for split, stem in stems.items():
        source, target = pair(stem)
        if conllu(stem).is_file():
            annotation_files[split] = str(conllu(stem))
        if source.is_file():
            splits[split], sizes[split] = _aligned_pair_dataset(source, target)
            files[split] = (str(source), str(target))
        else:  # CoNLL-U only: the plain source is its words joined by spaces
            read[split] = _read_conllu_blocks(conllu(stem))
            plain = [" ".join(sentence.words) for sentence in read[split][1]]
            n_target = count_lines(target)
            if len(plain) != n_target:
                raise CorpusError(f"{conllu(stem)} has {len(plain)} sentences but {target} has {n_target} "
                                  f"lines: parallel files must be aligned sentence by line")
            targets = _text_lines(target)
            splits[split] = tf.data.Dataset.zip((tf.data.Dataset.from_tensor_slices(tf.constant(plain)), targets))
            sizes[split] = len(plain)
            files[split] = (str(conllu(stem)), str(target))

    def read_annotations(split: str) -> list[str]:
        if split not in read:
            read[split] = _read_conllu_blocks(pathlib.Path(annotation_files[split]))
        return read[split][0]

    return ParallelCorpus(str(directory), source_lang, target_lang, splits, sizes, files,
                          origin={"kind": "directory"}, annotation_files=annotation_files,
                          annotation_reader=read_annotations if annotation_files else None)


def _read_conllu_blocks(path: pathlib.Path):
    """A CoNLL-U file's sentences as (CoNLL-U blocks, `AnnotatedSentence`s); its trees are checked."""
    from keras_transformer.data.syntax import AnnotationError, read_conllu, to_conllu  # noqa: PLC0415

    try:
        sentences = read_conllu(path)
    except AnnotationError as error:
        raise CorpusError(str(error)) from None
    except (OSError, UnicodeDecodeError) as error:
        raise CorpusError(f"{path}: cannot read CoNLL-U ({error})") from None
    except Exception as error:  # the conllu parser's own errors
        raise CorpusError(f"{path}: not valid CoNLL-U ({type(error).__name__}: {error})") from None
    if not sentences:
        raise CorpusError(f"{path} is empty")
    return [to_conllu(sentence) for sentence in sentences], sentences


# -- TensorFlow Datasets ---------------------------------------------------

def _local_tfds_builders() -> list[str]:
    """Names of the TFDS builders installed here ([] without tensorflow_datasets).

    Only the locally registered ones: the community catalogue that
    ``tfds.list_builders()`` adds by default is fetched from GCS (seconds
    offline, longer where the network drops packets).
    """
    if importlib.util.find_spec("tensorflow_datasets") is None:
        return []
    import tensorflow_datasets as tfds  # noqa: PLC0415  (slow import, only when needed)

    _register_package_builders()
    return tfds.list_builders(with_community_datasets=False)


def _register_package_builders() -> None:
    """Registers this package's TFDS builders (``multi30k``) by importing them: TFDS knows a
    builder once its class is defined."""
    import keras_transformer.data.multi30k  # noqa: F401, PLC0415  (imports TFDS: only when needed)


def _tfds_base_name(data: str) -> str:
    """``wmt14_translate`` of ``wmt14_translate/de-en``, ``wmt14_translate:1.0.0``, ..."""
    return data.split("/")[0].split(":")[0]


def _is_tfds_name(data: str) -> bool:
    """Whether ``data`` names a locally registered TFDS builder (``name[/config][:version]``)."""
    base = _tfds_base_name(data)
    return bool(base) and base in _local_tfds_builders()


def _unknown_data_message(data: str) -> str:
    """One line for a ``--data`` value that is neither a directory nor a TFDS name: a TFDS name
    it is a near miss of (``multi3k``, ``wmt14_translat``), or, for a relative path, the
    directory it was looked for at (a command run from another directory). The cutoff keeps
    far names out: at difflib's default 0.6 ``data`` got "did you mean dart?" and ``nonexist``
    "mnist"."""
    close = difflib.get_close_matches(_tfds_base_name(data), _local_tfds_builders(), n=1, cutoff=0.85)
    hint = f"; did you mean {close[0]}?" if close else ""
    path = pathlib.Path(data).expanduser()
    where = "" if close or path.is_absolute() else f"; looked for the directory at {path.absolute()}"
    return (f"--data={data}: no such directory and not a TFDS dataset name "
            f"(expected 'embedded', a directory with train.SRC/train.TGT, or tfds:NAME){hint}{where}")


@contextlib.contextmanager
def _tfds_scratch() -> Iterator[None]:
    """Python's temporary files in a directory of our own while TFDS runs, removed after.

    tensorflow_datasets 4.9 makes an empty ``tempfile.mkdtemp("tfds")`` for every
    builder made without local dataset info (``DatasetInfo.initialize_from_bucket``)
    and never removes it: a ``/tmp/tmp*tfds`` directory for the builder and for each
    split's ``tfds.load``, four a corpus, at every run. The process's ``tempfile``
    directory points into a ``TemporaryDirectory`` for the duration (a process-wide
    setting: nothing else in this process should make temporary files meanwhile).
    """
    previous = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="keras_transformer-tfds-") as scratch:
        tempfile.tempdir = scratch
        try:
            yield
        finally:
            tempfile.tempdir = previous


def _load_tfds(name: str, source_lang: str | None, target_lang: str | None,
               data_dir: str | None, download: bool) -> ParallelCorpus:
    """A TFDS translation dataset whose features are one string per language."""
    import tensorflow_datasets as tfds  # noqa: PLC0415

    _register_package_builders()
    try:
        with _tfds_scratch():
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

    if known and "train" not in known:
        raise CorpusError(f"tfds:{name}: no 'train' split (splits: {sorted(known)})")
    splits, sizes = {}, {}

    def load(split: str, tfds_split: str) -> None:
        try:
            with _tfds_scratch():
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

    load("train", "train")  # downloads and prepares the dataset when it is not there yet
    if not known:  # now prepared: a fresh builder reads its splits (still none under mock_data)
        with _tfds_scratch():
            known = set(tfds.builder(name, data_dir=data_dir).info.splits.keys())
    for split, tfds_split in _corpus_splits(known).items():
        if split != "train":
            load(split, tfds_split)
    origin = {"kind": "tfds", "name": builder.info.name,
              "config": builder.builder_config.name if builder.builder_config else None,
              "version": str(builder.info.version)}
    return ParallelCorpus(f"tfds:{name}", source_lang, target_lang, splits, sizes, origin=origin)


def _corpus_splits(known: set[str]) -> dict[str, str]:
    """Our split name -> the TFDS split, for a dataset whose splits are ``known``: train,
    validation -> valid, test, and every other ``test*`` split by its own name (multi30k's
    test2016, test2017_flickr, ...; BLEU is reported on each). With ``known`` empty (mock
    data), the three standard ones."""
    if not known:
        return dict(TFDS_SPLITS)
    ours = {split: tfds_split for split, tfds_split in TFDS_SPLITS.items() if tfds_split in known}
    ours.update({tfds_split: tfds_split for tfds_split in sorted(known)
                 if tfds_split.startswith("test") and tfds_split not in TFDS_SPLITS.values()})
    return ours


def _first_line(error: BaseException) -> str:
    """The first line of an exception message (library errors span many)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
