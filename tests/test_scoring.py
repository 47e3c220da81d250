"""Forced decoding (`keras_transformer.inference.scoring`, `Translator.score`): the log-probability the
model gives a target, checked against a NumPy reference of the full forward pass, against the
beam search's own score of its best hypothesis, and row by row against the batch."""

import keras
import numpy as np
import pytest
from helpers import fixture_seed
import tensorflow as tf

from keras_transformer import TransformerConfig, build_transformer
from keras_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.decoding import SearchOptions, length_penalty
from keras_transformer.inference.scoring import forced_decoding_ids, score_tokens
from keras_transformer.inference.translator import Translator

CONFIG = TransformerConfig(vocab_size=40, num_layers=2, d_model=32, d_ff=64, num_heads=4, dropout=0.0,
                           max_length=16, decode_extra_length=6)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(fixture_seed(3))
    return build_transformer(CONFIG)


def numpy_log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_the_decoder_reads_bos_and_the_tokens_and_predicts_the_tokens_and_eos():
    decoder_input, predicted = forced_decoding_ids(np.array([[7, 8, 9], [5, 0, 0], [0, 0, 0]]),
                                                   np.array([3, 1, 0]))
    assert np.asarray(decoder_input).tolist() == [[BOS_ID, 7, 8, 9], [BOS_ID, 5, PAD_ID, PAD_ID],
                                                  [BOS_ID, PAD_ID, PAD_ID, PAD_ID]]
    assert np.asarray(predicted).tolist() == [[7, 8, 9, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID],
                                              [EOS_ID, PAD_ID, PAD_ID, PAD_ID]]


def test_token_scores_are_the_full_forward_passs_log_probabilities_of_the_target(model):
    """Against the functional model's logits, log-softmaxed in NumPy: each target token's
    log-probability, then EOS's, 0 after; the rows padded differently agree with themselves
    scored alone (padding does not leak into a row)."""
    rng = np.random.default_rng(0)
    source = np.array([[9, 12, 30, EOS_ID, 0], [17, EOS_ID, 0, 0, 0], [5, 6, 7, 8, EOS_ID]], np.int32)
    lengths = np.array([4, 1, 0])
    target = np.zeros((3, 4), np.int32)
    for row, length in enumerate(lengths):
        target[row, :length] = rng.integers(4, CONFIG.vocab_size, length)
    got = np.asarray(score_tokens(model, source, target, lengths))  # [3, 5]
    for row, length in enumerate(lengths):
        tokens = list(target[row, :length])
        target_in = np.array([[BOS_ID] + tokens], np.int32)
        logits = keras.ops.convert_to_numpy(model([source[row:row + 1], target_in]))[0]  # [length + 1, V]
        want = numpy_log_softmax(logits.astype(np.float64))[np.arange(length + 1), tokens + [EOS_ID]]
        np.testing.assert_allclose(got[row, :length + 1], want, atol=1e-5)
        assert (got[row, length + 1:] == 0).all()
        alone = np.asarray(score_tokens(model, source[row:row + 1], target[row:row + 1, :max(length, 1)],
                                        lengths[row:row + 1]))[0]
        np.testing.assert_allclose(alone[:length + 1], got[row, :length + 1], atol=1e-5)


def test_the_search_scores_its_best_hypothesis_as_forced_decoding_does(toy_translator):
    """Two computations that must agree: the beam search's score of its best translation is
    that translation's forced-decoding log-probability divided by the length penalty (beam 4,
    alpha 0.6). The toy model ends its translations with EOS; a sentence it cannot translate
    runs to the length limit, whose score has no EOS term."""
    model, config, tokenizer = (toy_translator[k] for k in ("model", "config", "tokenizer"))
    translator = Translator(model, config, tokenizer.model_bytes)
    texts = ["the man sees the dog", "a red house today", "the big cat buys a small book",
             "dog dog dog dog dog dog dog dog dog dog dog dog dog dog dog dog"]
    source, lengths = translator.encode_text(tf.constant(texts))
    options = SearchOptions(beam_size=4, alpha=0.6, num_results=1, extra_length=config.decode_extra_length)
    ids, scores = tf.function(lambda s, n: translator.searcher.search(s, n, options), autograph=False)(
        source, lengths)
    ended = 0
    for row, (hypothesis, score) in enumerate(zip(ids.numpy()[:, 0], scores.numpy()[:, 0])):
        hypothesis = [int(i) for i in hypothesis if i != PAD_ID]
        tokens = hypothesis[:hypothesis.index(EOS_ID)] if EOS_ID in hypothesis else hypothesis
        token_scores = np.asarray(score_tokens(model, source[row:row + 1], np.array([tokens], np.int32),
                                               np.array([len(tokens)])))[0]
        counted = len(tokens) + 1 if EOS_ID in hypothesis else len(tokens)  # the length limit: no EOS
        penalty = float(keras.ops.convert_to_numpy(length_penalty(counted, 0.6)))
        np.testing.assert_allclose(token_scores[:counted].sum() / penalty, score, rtol=1e-5, atol=1e-5)
        ended += EOS_ID in hypothesis
    assert ended >= 3
