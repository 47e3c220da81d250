"""Tests of keras_transformer.data.tokenizer: the TF op agrees with SentencePiece."""

import hashlib
import io
import random

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from keras_transformer.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.data.tokenizer import (TOKENIZER_FILENAME, SubwordSampling, Tokenizer, TokenizerError,
                                              check_vocab_size, tokenizer_path, train_tokenizer)

WORDS = ("the a dog cat runs sleeps under über Straße Hund Katze läuft schläft groß "
         "kleine rotes Haus house little red ball Ball spielt plays near neben").split()


def sentences(n, seed, max_words=12):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words))) for _ in range(n)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    train_tokenizer(sentences(1500, seed=0), tokenizer_path(directory).with_suffix(""), vocab_size=120)
    return directory


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer.load(model_dir / TOKENIZER_FILENAME)


@pytest.fixture(scope="module")
def processor(model_dir):
    return spm.SentencePieceProcessor(model_file=str(model_dir / TOKENIZER_FILENAME))


def test_round_trip_is_exact(tokenizer):
    texts = sentences(50, seed=1) + ["Straße über der Haus", "s"]
    ids = tokenizer.tokenize(texts)
    assert ids.dtype == tf.int32
    assert [t.decode() for t in tokenizer.detokenize(ids).numpy()] == texts


def test_ids_equal_sentencepiece_processor(tokenizer, processor):
    texts = sentences(50, seed=2) + ["unseen wörds ÿ and 123", ""]
    assert tokenizer.tokenize(texts).to_list() == processor.encode(texts)
    assert tokenizer.tokenize(texts[0]).numpy().tolist() == processor.encode(texts[0])  # scalar -> [len]
    assert UNK_ID in processor.encode("ÿ")  # unseen character is UNK in both


def test_special_ids_and_size_match_constants(tokenizer, processor):
    assert (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()) == (
        PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    assert tokenizer.vocab_size == processor.get_piece_size() <= 120
    ids = tokenizer.tokenize(sentences(30, seed=3)).flat_values.numpy()
    assert not np.isin(ids, [PAD_ID, BOS_ID, EOS_ID]).any()  # tokenize adds no specials


def test_sha256_is_hash_of_file(tokenizer, model_dir):
    data = (model_dir / TOKENIZER_FILENAME).read_bytes()
    assert tokenizer.sha256 == hashlib.sha256(data).hexdigest()
    assert tokenizer.model_bytes == data
    assert Tokenizer.load(model_dir).sha256 == tokenizer.sha256  # a directory resolves to tokenizer.model


def test_detokenize_ignores_pad_bos_and_everything_after_eos(tokenizer):
    texts = ["the red ball", "Hund läuft neben der Haus"]
    a, b = tokenizer.tokenize(texts).to_list()
    junk = tokenizer.tokenize("Katze").numpy().tolist()
    rows = [[BOS_ID] + a + [EOS_ID] + junk + [PAD_ID] * 3, [BOS_ID] + b + [PAD_ID] * 2]
    width = max(map(len, rows))
    dense = tf.constant([r + [PAD_ID] * (width - len(r)) for r in rows])  # [2, width]
    assert [t.decode() for t in tokenizer.detokenize(dense).numpy()] == texts
    assert [t.decode() for t in tokenizer.detokenize(tf.ragged.constant(rows)).numpy()] == texts
    assert tokenizer.detokenize(tf.constant(a + [EOS_ID] + junk)).numpy().decode() == texts[0]


def test_subword_sampling_draws_sentencepieces_segmentations_of_the_same_text(tokenizer, processor):
    """Sampled ids spell the same text in other pieces; among the 2 best, every draw is one
    of SentencePiece's own 2 best segmentations; a huge alpha is the best segmentation."""
    texts = sentences(200, seed=5)
    best = tokenizer.tokenize(texts).to_list()
    assert tokenizer.tokenize(texts, SubwordSampling(alpha=1000.0)).to_list() == best
    draws = [tokenizer.tokenize(texts, SubwordSampling(alpha=0.1)).to_list() for _ in range(2)]
    for draw in draws:
        assert [processor.decode(ids) for ids in draw] == texts
        assert sum(ids != viterbi for ids, viterbi in zip(draw, best)) > len(texts) // 2
    assert draws[0] != draws[1]
    two_best = tokenizer.tokenize(texts, SubwordSampling(alpha=0.1, nbest_size=2)).to_list()
    chosen = [processor.nbest_encode_as_ids(text, 2).index(ids) for text, ids in zip(texts, two_best)]
    assert 0 < sum(chosen) < len(texts)  # both of the two best are drawn
    with pytest.raises(ValueError, match="0 and 1 do not sample"):
        SubwordSampling(alpha=0.1, nbest_size=1)
    with pytest.raises(ValueError, match="alpha must be > 0, got 0"):
        SubwordSampling(alpha=0)


def test_works_inside_tf_function(tokenizer):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(texts):
        return tokenizer.detokenize(tokenizer.tokenize(texts))

    texts = sentences(5, seed=4)
    assert [t.decode() for t in round_trip(tf.constant(texts)).numpy()] == texts


def test_training_is_deterministic(tmp_path):
    texts = sentences(800, seed=5)
    a = train_tokenizer(texts, tmp_path / "a", vocab_size=80, max_sentences=500, seed=3).read_bytes()
    b = train_tokenizer(iter(texts), tmp_path / "b", vocab_size=80, max_sentences=500, seed=3).read_bytes()
    assert a == b


def test_a_tokenizer_that_cannot_be_written_leaves_no_partial_file(tmp_path, monkeypatch):
    """On a 100 KB disk (a tmpfs, by hand) train.py left 98 KB of `tokenizer.model.tmp` and
    said only "No space left on device". The error now names the file, and nothing is left."""
    import errno

    from helpers import full_disk_writes

    texts = sentences(800, seed=5)
    full_disk_writes(monkeypatch)
    with pytest.raises(OSError) as error:
        train_tokenizer(texts, tmp_path / "tokenizer", vocab_size=80, max_sentences=500, seed=3)
    monkeypatch.undo()
    assert (error.value.errno, error.value.strerror, error.value.filename) == (
        errno.ENOSPC, "No space left on device", str(tmp_path / "tokenizer.model"))
    assert list(tmp_path.iterdir()) == []
    path = train_tokenizer(texts, tmp_path / "tokenizer", vocab_size=80, max_sentences=500, seed=3)
    assert path.read_bytes() == train_tokenizer(texts, tmp_path / "again", vocab_size=80, max_sentences=500,
                                                seed=3).read_bytes()  # the rerun writes the whole model


def one_line(error):
    message = str(error.value)
    assert "\n" not in message
    return message


def test_missing_file(tmp_path):
    with pytest.raises(TokenizerError) as error:
        Tokenizer.load(tmp_path / "nothing.model")
    assert "nothing.model" in one_line(error) and "does not exist" in one_line(error)


def test_the_prefix_given_to_train_tokenizer_names_the_file_it_wrote(tmp_path):
    """`Tokenizer.load(PREFIX)` with the prefix `train_tokenizer` was given: the error names the
    `PREFIX.model` it wrote, which loads."""
    written = train_tokenizer(sentences(300, seed=8), tmp_path / "tokenizer", vocab_size=60)
    with pytest.raises(TokenizerError) as error:
        Tokenizer.load(tmp_path / "tokenizer")
    assert one_line(error) == (f"{tmp_path / 'tokenizer'}: tokenizer file does not exist; {written} does: "
                               "train_tokenizer writes PREFIX.model")
    assert Tokenizer.load(written).model_bytes == written.read_bytes()


def test_corrupt_file(tmp_path):
    path = tmp_path / "tokenizer.model"
    path.write_bytes(np.random.default_rng(0).bytes(300))
    with pytest.raises(TokenizerError) as error:
        Tokenizer.load(path)
    assert str(path) in one_line(error) and "not a valid SentencePiece model" in one_line(error)


def test_wrong_special_ids(tmp_path):
    model = io.BytesIO()  # SentencePiece defaults: unk=0, bos=1, eos=2, no pad
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences(300, seed=6)), model_writer=model,
                                   vocab_size=60, hard_vocab_limit=False, minloglevel=2)
    path = tmp_path / "default_ids.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(TokenizerError) as error:
        Tokenizer.load(path)
    assert "default_ids.model" in one_line(error) and "pad_id=-1" in one_line(error)


def test_bpe_model_is_refused(tmp_path):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences(300, seed=7)), model_writer=model,
                                   vocab_size=60, model_type="bpe", hard_vocab_limit=False, minloglevel=2,
                                   pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID)
    path = tmp_path / "bpe.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(TokenizerError) as error:
        Tokenizer.load(path)
    assert "bpe.model" in one_line(error) and "'bpe'" in one_line(error)
    with pytest.raises(TokenizerError, match="model_type='bpe'"):
        train_tokenizer(sentences(10, seed=8), tmp_path / "x", vocab_size=60, model_type="bpe")


def test_a_vocabulary_below_the_texts_characters_is_one_line_naming_both_sizes(tmp_path):
    """`train.py --vocab-size 5` was SentencePiece's C++ check, "INTERNAL: src/trainer_interface.cc(638)
    [(static_cast<int>(required_chars_.size() + ...". The text has 28 distinct characters (the
    space as "▁"), all within the character coverage: 28 + the 4 special ids."""
    texts = sentences(300, seed=9)
    with pytest.raises(TokenizerError) as error:
        train_tokenizer(texts, tmp_path / "small", vocab_size=10)
    message = one_line(error)
    assert message == (f"{tmp_path / 'small.model'}: vocab_size=10 is below the 32 pieces that the training "
                       f"text's characters and the special ids need; give a larger vocabulary size "
                       f"(train.py --vocab-size)")
    assert not (tmp_path / "small.model").exists()
    # Other failures keep SentencePiece's own first line.
    with pytest.raises(TokenizerError, match=r"SentencePiece training failed: .*Vocabulary size too high \(5000\)"):
        train_tokenizer(texts, tmp_path / "large", vocab_size=5000, hard_vocab_limit=True)


def test_check_vocab_size(tokenizer):
    check_vocab_size(tokenizer, tokenizer.vocab_size)
    with pytest.raises(TokenizerError) as error:
        check_vocab_size(tokenizer, 37000)
    message = one_line(error)
    assert TOKENIZER_FILENAME in message
    assert f"vocab_size={tokenizer.vocab_size}" in message and "vocab_size=37000" in message
