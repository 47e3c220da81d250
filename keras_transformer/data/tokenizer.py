"""The shared source-target subword vocabulary (SentencePiece).

The paper encodes both languages with one shared vocabulary of about 37,000
subword tokens, so that the source embedding, the target embedding and the
pre-softmax projection can share one matrix.  This module trains such a
vocabulary with the ``sentencepiece`` package and applies it with
``tensorflow_text.FastSentencepieceTokenizer`` -- the same TensorFlow op the
SavedModel and LiteRT exports run, so text is split identically in training
and in serving.

Unigram, not BPE: the paper uses byte-pair encoding, but
``FastSentencepieceTokenizer`` segments every model with the unigram
(Viterbi, highest total score) algorithm.  On a BPE model that does *not*
reproduce SentencePiece's merge order: on multi30k with 8,000 pieces it
produced 1.8x as many tokens as ``SentencePieceProcessor`` and differed on
every sentence.  On a unigram model both agree exactly.  A unigram vocabulary
of the same size is therefore the default and the only model type
``Tokenizer`` accepts (``TokenizerError`` otherwise).

Subword regularization (Kudo, ACL 2018) samples a segmentation of each
training sentence from the unigram model's distribution instead of taking the
best one, so that the model sees many segmentations of the same words.  The
sampling is ``tensorflow_text.SentencepieceTokenizer``'s (SentencePiece's own
``nbest_size``/``alpha`` sampler, the same model file); ``SubwordSampling``
holds its two settings.  It is a training-time option only: evaluation,
serving and LiteRT keep the deterministic ``FastSentencepieceTokenizer``.

The special ids are those of ``keras_transformer.constants``: the trainer is
told to use them and ``Tokenizer.load`` refuses a model whose ids differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pathlib
import random
import re
from collections.abc import Iterable

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.atomic_writes import write_bytes_atomically
from keras_transformer.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# The file name of the tokenizer inside a model directory.
TOKENIZER_FILENAME = "tokenizer.model"
# Default cap on the number of sentences (both languages counted) fed to the
# SentencePiece trainer; larger corpora are subsampled reproducibly.
DEFAULT_MAX_SENTENCES = 2_000_000
# Trainer threads.  The learned vocabulary depends on the thread count, so it
# is fixed (not os.cpu_count()) to make a model reproducible across machines.
DEFAULT_NUM_THREADS = 8
SUPPORTED_MODEL_TYPES = ("unigram",)


class TokenizerError(ValueError):
    """A tokenizer file is missing, unreadable, corrupt or incompatible.

    The message is one line naming the file and the problem.
    """


@dataclasses.dataclass(frozen=True)
class SubwordSampling:
    """Subword regularization: a segmentation sampled per sentence and epoch.

    SentencePiece samples from the ``nbest_size`` best segmentations (all of
    them when negative) with probabilities proportional to ``P(x) ** alpha``:
    a small ``alpha`` samples widely, a large one is nearly always the best
    segmentation.  Kudo (2018) found ``nbest_size=64, alpha=0.1`` best for
    NMT; on Multi30k's training side it re-segments ~95% of the sentences and
    makes them ~1.1x as long.

    Not reproducible bit for bit: the op draws from SentencePiece's own
    generator, which takes no seed.

    Raises:
        ValueError: ``alpha`` not positive, or ``nbest_size`` 0 or 1 (no
            sampling).
    """

    alpha: float
    nbest_size: int = 64

    def __post_init__(self):
        if isinstance(self.alpha, bool) or not self.alpha > 0:
            raise ValueError(f"subword sampling alpha must be > 0, got {self.alpha!r}")
        if isinstance(self.nbest_size, bool) or not isinstance(self.nbest_size, int) or self.nbest_size in (0, 1):
            raise ValueError(f"subword sampling nbest_size must be an integer >= 2 or negative (all "
                             f"segmentations), got {self.nbest_size!r}: 0 and 1 do not sample")


def tokenizer_path(model_dir: str | os.PathLike) -> pathlib.Path:
    """Returns where the tokenizer of a model directory is stored.

    Args:
        model_dir: the model (checkpoint) directory.

    Returns:
        ``model_dir / "tokenizer.model"``.
    """
    return pathlib.Path(model_dir) / TOKENIZER_FILENAME


def _sample_sentences(texts: Iterable[str], max_sentences: int, seed: int) -> list[str]:
    """Keeps at most ``max_sentences`` of ``texts`` (reservoir sampling).

    All sentences are kept, in order, when there are not more than the cap;
    otherwise a uniform sample that depends only on ``seed``.  SentencePiece's
    own ``input_sentence_size`` sampling is not reproducible, hence this.
    """
    rng = random.Random(seed)
    kept: list[str] = []
    for i, text in enumerate(texts):
        if i < max_sentences:
            kept.append(text)
        else:
            j = rng.randrange(i + 1)
            if j < max_sentences:
                kept[j] = text
    return kept


def train_tokenizer(texts: Iterable[str], model_prefix_path: str | os.PathLike,
                    vocab_size: int, model_type: str = "unigram", *,
                    max_sentences: int = DEFAULT_MAX_SENTENCES,
                    hard_vocab_limit: bool = False,
                    character_coverage: float = 1.0,
                    normalization_rule_name: str = "nmt_nfkc",
                    num_threads: int = DEFAULT_NUM_THREADS,
                    seed: int = 0) -> pathlib.Path:
    """Trains a shared SentencePiece vocabulary and writes ``PREFIX.model``.

    Feed both languages of the training split (``ParallelCorpus.texts``).
    The result is a deterministic function of the arguments and the text
    (fixed thread count, seeded subsampling).

    Args:
        texts: training sentences of both languages.
        model_prefix_path: output path without extension; the model is
            written to ``model_prefix_path + ".model"`` (parent directories
            are created).  Use ``tokenizer_path(model_dir).with_suffix("")``
            for the standard location ``model_dir/tokenizer.model``.
        vocab_size: number of pieces including the four special ids (the
            paper: ~37,000).
        model_type: only ``"unigram"`` (see the module docstring for why
            ``"bpe"`` is refused).
        max_sentences: at most this many sentences are used; more are
            subsampled uniformly with ``seed``.
        hard_vocab_limit: if False (default), ``vocab_size`` is an upper bound
            and a tiny corpus yields a smaller vocabulary instead of an error;
            build the model from ``Tokenizer.vocab_size``, not from the
            request.
        character_coverage: fraction of characters covered by the vocabulary
            (1.0: every character of the training text is a piece).
        normalization_rule_name: SentencePiece normalization
            (``"nmt_nfkc"``: NFKC plus whitespace clean-up; ``"identity"``).
        num_threads: trainer threads (the result depends on it).
        seed: seed of the sentence subsampling.

    Returns:
        The path of the written ``.model`` file.

    Raises:
        TokenizerError: unsupported ``model_type``, too small a
            ``vocab_size``, no text, or a SentencePiece training failure.

    Example:
        >>> path = train_tokenizer(corpus.texts("train"), "run/tokenizer", 37000)
        >>> tokenizer = Tokenizer.load(path)
    """
    path = pathlib.Path(str(model_prefix_path) + ".model")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise TokenizerError(
            f"{path}: model_type={model_type!r} is not supported, expected one of "
            f"{SUPPORTED_MODEL_TYPES} (FastSentencepieceTokenizer, used in training and export, "
            f"does not reproduce SentencePiece's BPE segmentation)")
    if vocab_size <= 4:
        raise TokenizerError(f"{path}: vocab_size={vocab_size} must exceed the 4 special ids")
    if max_sentences < 1:
        raise TokenizerError(f"{path}: max_sentences={max_sentences} must be >= 1")
    sentences = _sample_sentences(texts, max_sentences, seed)
    if not any(s.strip() for s in sentences):
        raise TokenizerError(f"{path}: no training text (all {len(sentences)} sentences empty)")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            character_coverage=character_coverage,
            hard_vocab_limit=hard_vocab_limit,
            normalization_rule_name=normalization_rule_name,
            input_sentence_size=0,  # sampled above, reproducibly
            num_threads=num_threads,
            minloglevel=2,
        )
    except (RuntimeError, OSError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        # A vocabulary below the text's characters (`--vocab-size 5`) failed with SentencePiece's
        # C++ check, "INTERNAL: src/trainer_interface.cc(638) [(static_cast<int>(...` first.
        needed = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", first_line)
        if needed:
            raise TokenizerError(
                f"{path}: vocab_size={vocab_size} is below the {needed.group(1)} pieces that the training "
                f"text's characters and the special ids need; give a larger vocabulary size "
                f"(train.py --vocab-size)") from e
        raise TokenizerError(f"{path}: SentencePiece training failed: {first_line}") from e
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_bytes_atomically(path, model.getvalue())  # never a half-written tokenizer


def _validate_model(model_bytes: bytes, name: str) -> spm.SentencePieceProcessor:
    """Parses a SentencePiece model and checks it fits this project.

    Args:
        model_bytes: the serialized ModelProto.
        name: the file name used in error messages.

    Returns:
        The parsed processor.

    Raises:
        TokenizerError: not a SentencePiece model, wrong special ids, or a
            model type FastSentencepieceTokenizer cannot reproduce.
    """
    if not model_bytes:
        raise TokenizerError(f"{name}: tokenizer file is empty")
    try:
        processor = spm.SentencePieceProcessor(model_proto=model_bytes)
    except Exception as e:  # the parser raises RuntimeError / OSError / TypeError
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TokenizerError(f"{name}: not a valid SentencePiece model ({detail})") from None
    size = processor.get_piece_size()
    if size <= 4:
        raise TokenizerError(f"{name}: not a usable SentencePiece model (only {size} pieces)")
    found = {"pad_id": processor.pad_id(), "unk_id": processor.unk_id(),
             "bos_id": processor.bos_id(), "eos_id": processor.eos_id()}
    expected = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
    if found != expected:
        got = ", ".join(f"{k}={v}" for k, v in found.items())
        want = ", ".join(f"{k}={v}" for k, v in expected.items())
        raise TokenizerError(f"{name}: special ids {got} do not match keras_transformer.constants ({want})")
    from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415  (needs protobuf)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_bytes)
    model_type = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type).lower()
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise TokenizerError(
            f"{name}: model_type={model_type!r} is not supported, expected one of {SUPPORTED_MODEL_TYPES} "
            f"(FastSentencepieceTokenizer does not reproduce its segmentation); retrain the tokenizer")
    if proto.trainer_spec.byte_fallback:
        raise TokenizerError(f"{name}: byte_fallback models are not supported by FastSentencepieceTokenizer")
    return processor


class Tokenizer:
    """The shared subword vocabulary, applied with TensorFlow ops.

    Wraps ``tensorflow_text.FastSentencepieceTokenizer`` so the same op
    tokenizes in ``tf.data``, in the exported SavedModel and in LiteRT.  All
    methods are TensorFlow ops without Python state: usable inside
    ``tf.data.Dataset.map`` and ``tf.function``.

    ``tokenize`` adds no special ids; the batching code appends ``EOS_ID``
    and prepends ``BOS_ID`` (see ``keras_transformer.data.batching``).

    Args:
        model_bytes: a serialized SentencePiece unigram model whose special
            ids are ``PAD_ID, UNK_ID, BOS_ID, EOS_ID``.
        name: the file name used in error messages.

    Attributes:
        model_bytes: the serialized model.
        sha256: hex SHA-256 of ``model_bytes`` (equal to the hash of the
            ``tokenizer.model`` file), to pin a checkpoint to its vocabulary.
        vocab_size: number of ids, special ids included.
        path: the file it was loaded from, or None.
        fast: the underlying ``FastSentencepieceTokenizer``.

    Example:
        >>> tokenizer = Tokenizer.load("run/tokenizer.model")
        >>> ids = tokenizer.tokenize(["A dog runs."])        # ragged [1, (n)]
        >>> tokenizer.detokenize(ids)                        # [b"A dog runs."]
    """

    def __init__(self, model_bytes: bytes, name: str = "<tokenizer bytes>"):
        self._processor = _validate_model(model_bytes, name)
        self.model_bytes = bytes(model_bytes)
        self.sha256 = hashlib.sha256(self.model_bytes).hexdigest()
        self.vocab_size = int(self._processor.get_piece_size())
        self.path: pathlib.Path | None = None
        self._samplers: dict[SubwordSampling, tf_text.SentencepieceTokenizer] = {}
        try:
            self.fast = tf_text.FastSentencepieceTokenizer(self.model_bytes)
        except Exception as e:  # conversion errors come from C++
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TokenizerError(
                f"{name}: FastSentencepieceTokenizer cannot load the model ({detail})") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Reads and validates a tokenizer file.

        Args:
            path: a ``.model`` file, or a model directory containing
                ``tokenizer.model``.

        Returns:
            The tokenizer.

        Raises:
            TokenizerError: the file is missing, unreadable, not a
                SentencePiece model, or its special ids / model type do not
                fit (one line naming the file and the problem).
        """
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILENAME
        try:
            model_bytes = path.read_bytes()
        except FileNotFoundError:
            written = path.with_name(path.name + ".model")  # train_tokenizer's PREFIX -> PREFIX.model
            hint = f"; {written} does: train_tokenizer writes PREFIX.model" if written.is_file() else ""
            raise TokenizerError(f"{path}: tokenizer file does not exist{hint}") from None
        except OSError as e:
            raise TokenizerError(f"{path}: cannot read tokenizer file ({e.strerror or e})") from None
        tokenizer = cls(model_bytes, name=str(path))
        tokenizer.path = path
        return tokenizer

    def tokenize(self, strings, sampling: SubwordSampling | None = None) -> tf.Tensor | tf.RaggedTensor:
        """Splits text into subword ids (no BOS/EOS added).

        Args:
            strings: a string, a list of strings or a ``tf.string`` tensor of
                rank 0 or 1.
            sampling: sample each segmentation (training only); None: the
                best segmentation, as served.

        Returns:
            int32 ids: ``[len]`` for a scalar, ``RaggedTensor [batch, (len)]``
            for a vector.
        """
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        if sampling is None:
            return self.fast.tokenize(strings)
        if sampling not in self._samplers:
            # Made eagerly (its model is a resource) even when the first call is traced (a
            # dataset's map): one made inside a graph could not serve the next one's.
            with tf.init_scope():
                self._samplers[sampling] = tf_text.SentencepieceTokenizer(
                    self.model_bytes, out_type=tf.int32, nbest_size=sampling.nbest_size, alpha=sampling.alpha)
        return self._samplers[sampling].tokenize(strings)

    def detokenize(self, ids) -> tf.Tensor:
        """Turns ids back into text, stopping at the first ``EOS_ID``.

        ``PAD_ID`` and ``BOS_ID`` are ignored, and so is everything from the
        first ``EOS_ID`` on (a decoded row may continue after EOS).

        Args:
            ids: integer ids ``[len]``, ``[batch, len]`` (dense, e.g. padded
                beam-search output) or ``RaggedTensor [batch, (len)]``.

        Returns:
            ``tf.string``: a scalar for ``[len]`` input, else ``[batch]``.
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=PAD_ID)  # [batch, max_len]
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        scalar = ids.shape.rank == 1
        if scalar:
            ids = ids[tf.newaxis, :]  # [1, len]
        eos_seen = tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=-1)  # [batch, len]
        keep = (eos_seen == 0) & tf.not_equal(ids, PAD_ID) & tf.not_equal(ids, BOS_ID)
        text = self.fast.detokenize(tf.ragged.boolean_mask(ids, keep))  # [batch]
        return text[0] if scalar else text

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, sha256={self.sha256[:12]}..., path={self.path})"


def check_vocab_size(tokenizer: Tokenizer, expected: int) -> None:
    """Checks a tokenizer against a model's vocabulary size.

    Args:
        tokenizer: the tokenizer.
        expected: the model's ``vocab_size`` (embedding rows).

    Raises:
        TokenizerError: the sizes differ (one line naming the file and both
            sizes).
    """
    if tokenizer.vocab_size != expected:
        name = tokenizer.path or "<tokenizer bytes>"
        raise TokenizerError(
            f"{name}: tokenizer vocab_size={tokenizer.vocab_size} does not match the model's "
            f"vocab_size={expected}")
