"""Tests of keras_transformer.data.batching: budgets, buckets, and no token lost."""

import collections
import random

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from keras_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.data.batching import (bucket_batch_sizes, count_overlong, default_boundaries,
                                             make_batches)
from keras_transformer.data.tokenizer import SubwordSampling, Tokenizer, train_tokenizer

WORDS = ("the a dog cat runs sleeps under über Straße Hund Katze läuft schläft groß "
         "kleine rotes Haus house little red ball Ball spielt plays near neben").split()
BATCH_TOKENS = 120
MAX_LENGTH = 24
BOUNDARIES = (6, 8, 12, 16, 24)


def sentences(n, seed, max_words):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = sentences(1500, seed=0, max_words=12)
    path = train_tokenizer(texts, tmp_path_factory.mktemp("tok") / "tokenizer", vocab_size=120)
    return Tokenizer.load(path)


@pytest.fixture(scope="module")
def pairs():
    """300 pairs of 1-28 words: about a fifth exceed MAX_LENGTH tokens."""
    return list(zip(sentences(300, seed=1, max_words=28), sentences(300, seed=2, max_words=28)))


@pytest.fixture(scope="module")
def encoded(tokenizer, pairs):
    """Token ids of every pair, computed by SentencePiece itself (independent of the TF op)."""
    processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_bytes)
    return [(tuple(processor.encode(s)), tuple(processor.encode(t))) for s, t in pairs]


def dataset(pairs):
    sources, targets = zip(*pairs)
    return tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))


def split_row(row, head=None):
    """A padded row -> its ids before PAD, checking that only PAD follows."""
    row = list(row)
    n = next((i for i in range(len(row) - 1, -1, -1) if row[i] != PAD_ID), -1) + 1
    assert all(x == PAD_ID for x in row[n:])
    return row[:n]


def unpack(batches):
    """Checks each batch's layout; returns (shapes, [(source tokens, target tokens)])."""
    shapes, found = [], []
    for (source, target_in), target_out in batches.as_numpy_iterator():
        assert source.dtype == target_in.dtype == target_out.dtype == np.int32
        assert source.shape == target_in.shape == target_out.shape
        shapes.append(source.shape)
        for s, ti, to in zip(source, target_in, target_out):
            s, ti, to = split_row(s), split_row(ti), split_row(to)
            assert s[-1] == EOS_ID and EOS_ID not in s[:-1] and BOS_ID not in s
            assert ti[0] == BOS_ID and BOS_ID not in ti[1:] and EOS_ID not in ti
            assert len(ti) == len(to) and to[:-1] == ti[1:]  # labels = inputs shifted left by one
            if to[-1] == EOS_ID:
                found.append((tuple(s[:-1]), tuple(to[:-1])))
            else:  # truncated target: no EOS
                found.append((tuple(s[:-1]), tuple(to)))
    return shapes, found


def test_default_boundaries_and_batch_sizes():
    assert default_boundaries(256) == (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    assert default_boundaries(100) == (8, 12, 16, 24, 32, 48, 64, 96, 100)
    assert default_boundaries(5) == (5,)
    assert bucket_batch_sizes((8, 12, 16), 100) == (12, 8, 6)
    assert bucket_batch_sizes((8, 12, 16), 100, batch_multiple=4) == (12, 8, 4)
    with pytest.raises(ValueError, match="batch_tokens=10"):
        bucket_batch_sizes((8, 12, 16), 10)


def test_budget_buckets_and_no_pair_lost(tokenizer, pairs, encoded):
    batches = make_batches(dataset(pairs), tokenizer, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                           boundaries=BOUNDARIES)
    shapes, found = unpack(batches)
    sizes = dict(zip(BOUNDARIES, bucket_batch_sizes(BOUNDARIES, BATCH_TOKENS)))
    for batch_size, length in shapes:
        assert length in BOUNDARIES and batch_size * length <= BATCH_TOKENS
        assert batch_size <= sizes[length]
    fits = [p for p in encoded if len(p[0]) + 1 <= MAX_LENGTH and len(p[1]) + 1 <= MAX_LENGTH]
    assert 0 < len(fits) < len(encoded)  # the data does have over-long pairs
    assert collections.Counter(found) == collections.Counter(fits)  # each kept pair exactly once
    # Each pair sits in the smallest bucket that holds it (no needless padding).
    for (source, target_in), _ in batches.as_numpy_iterator():
        lengths = np.maximum((source != PAD_ID).sum(axis=1), (target_in != PAD_ID).sum(axis=1))  # [batch]
        previous = max([0] + [b for b in BOUNDARIES if b < source.shape[1]])
        assert ((lengths > previous) & (lengths <= source.shape[1])).all()
    # Full batches: every bucket but the flushed remainders is filled to its size.
    full = sum(1 for b, length in shapes if b == sizes[length])
    assert full >= len(shapes) - len(BOUNDARIES)


def test_count_overlong_matches_reference(tokenizer, pairs, encoded):
    count = count_overlong(dataset(pairs), tokenizer, MAX_LENGTH)
    source = sum(len(s) + 1 > MAX_LENGTH for s, _ in encoded)
    target = sum(len(t) + 1 > MAX_LENGTH for _, t in encoded)
    either = sum(len(s) + 1 > MAX_LENGTH or len(t) + 1 > MAX_LENGTH for s, t in encoded)
    assert (count.pairs, count.source, count.target, count.either) == (len(pairs), source, target, either)
    assert either > 0 and f"{either} of {len(pairs)} pairs" in str(count)


def test_truncate_keeps_every_pair(tokenizer, pairs, encoded):
    batches = make_batches(dataset(pairs), tokenizer, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                           boundaries=BOUNDARIES, overlong="truncate")
    shapes, found = unpack(batches)
    assert all(length in BOUNDARIES and b * length <= BATCH_TOKENS for b, length in shapes)
    expected = []
    for s, t in encoded:
        # source: first MAX_LENGTH-1 tokens + EOS; target: first MAX_LENGTH tokens (EOS only if it fits).
        expected.append((s[:MAX_LENGTH - 1], t if len(t) + 1 <= MAX_LENGTH else t[:MAX_LENGTH]))
    assert collections.Counter(found) == collections.Counter(expected)


def test_exact_layout_of_one_pair(tokenizer):
    ids_s = tokenizer.tokenize("the dog").numpy().tolist()
    ids_t = tokenizer.tokenize("der Hund läuft").numpy().tolist()
    (source, target_in), target_out = next(iter(make_batches(
        dataset([("the dog", "der Hund läuft")]), tokenizer, batch_tokens=64, max_length=16,
        boundaries=(8, 16))))
    length = 8 if max(len(ids_s), len(ids_t)) + 1 <= 8 else 16
    pad = lambda row: row + [PAD_ID] * (length - len(row))  # noqa: E731
    assert source.numpy().tolist() == [pad(ids_s + [EOS_ID])]
    assert target_in.numpy().tolist() == [pad([BOS_ID] + ids_t)]
    assert target_out.numpy().tolist() == [pad(ids_t + [EOS_ID])]


def test_shuffle_is_seeded_and_repeat_gives_full_static_batches(tokenizer, pairs):
    def first(n, **kwargs):
        ds = make_batches(dataset(pairs), tokenizer, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                          boundaries=BOUNDARIES, **kwargs)
        return [x for (x, _), _ in ds.take(n).as_numpy_iterator()]

    a, b = first(5, shuffle=True, seed=7), first(5, shuffle=True, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    plain = first(5)
    assert not all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, plain))

    ds = make_batches(dataset(pairs), tokenizer, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                      boundaries=BOUNDARIES, shuffle=True, seed=1, repeat=True, drop_remainder=True,
                      batch_multiple=4)
    assert ds.element_spec[1].shape.as_list() == [None, None]  # one of a few shapes; rank 2
    sizes = dict(zip(BOUNDARIES, bucket_batch_sizes(BOUNDARIES, BATCH_TOKENS, batch_multiple=4)))
    for (source, _), _ in ds.take(40).as_numpy_iterator():  # more batches than one epoch holds
        assert source.shape[0] == sizes[source.shape[1]] and source.shape[0] % 4 == 0


def test_subword_sampling_batches_every_pair_in_other_pieces(tokenizer, pairs, encoded):
    """With subword regularization every pair comes out once, each row spelling its pair's
    text unless a draw was cut at max_length, most in pieces other than the best
    segmentation's. (Draws are not seeded, and with this 120-piece vocabulary a draw can be
    several times as long as the best segmentation: only a text shorter than the limit in
    characters is sure to fit, a piece being at least one character.) Made twice: the
    sampler made by the first pipeline's trace serves the second."""
    processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_bytes)
    wanted = collections.Counter(pairs)
    sure = [(s, t) for s, t in pairs if max(len(s), len(t)) + 1 < MAX_LENGTH - 1]  # + 1: the leading "▁"
    fits = sum(2 * max(len(es), len(et)) < MAX_LENGTH - 1 for es, et in encoded)
    assert len(sure) >= 5
    for _ in range(2):
        ds = make_batches(dataset(pairs), tokenizer, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                          boundaries=BOUNDARIES, overlong="truncate",
                          subword_sampling=SubwordSampling(alpha=0.1))
        _, found = unpack(ds)
        assert len(found) == len(pairs)
        texts = collections.Counter()
        for s, t in found:
            text = (processor.decode(list(s)), processor.decode(list(t)))
            if wanted[text] > texts[text]:
                texts[text] += 1  # sampled, still the same sentence
            else:  # cut at the limit: max_length - 1 source pieces before EOS, max_length target labels
                assert len(s) == MAX_LENGTH - 1 or len(t) == MAX_LENGTH, text
        assert all(texts[pair] >= 1 for pair in sure)
        assert sum(texts.values()) >= fits - 5  # a draw is rarely over twice the best segmentation
        assert len(set(found) & set(encoded)) < len(pairs) // 2
    with pytest.raises(ValueError, match="subword_sampling cannot be used with source_features"):
        make_batches(dataset(pairs), tokenizer, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                     source_features=("source_distances",), subword_sampling=SubwordSampling(alpha=0.1))


def test_distributed_dataset_matches(tokenizer, pairs):
    ds = make_batches(dataset(pairs), tokenizer, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                      boundaries=BOUNDARIES)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    distributed = strategy.experimental_distribute_dataset(ds)
    for ((source, target_in), target_out), ((s, ti), to) in zip(distributed, ds.take(3)):
        for x, y in ((source, s), (target_in, ti), (target_out, to)):
            np.testing.assert_array_equal(strategy.experimental_local_results(x)[0].numpy(), y.numpy())
        break


@pytest.mark.parametrize("kwargs, match", [
    (dict(overlong="cut"), "overlong='cut'"),
    (dict(boundaries=(8, 8, 16)), "strictly increasing"),
    (dict(boundaries=(8, 32)), "exceed max_length=24"),
    (dict(batch_tokens=20), "batch_tokens=20"),
])
def test_invalid_arguments(tokenizer, pairs, kwargs, match):
    args = dict(batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH) | kwargs
    with pytest.raises(ValueError, match=match):
        make_batches(dataset(pairs), tokenizer, **args)
