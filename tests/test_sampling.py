"""Random sampling in the search (`SearchOptions.sampling_topk`, `sampling_topp`,
`sampling_temperature`, `seed`): the sampled tokens follow the model's distribution as
CTranslate2's RandomSampler shapes it, the scores are the model's own log-probabilities, the
same seed gives the same samples in every loop, and bad values are one-line errors."""

import keras
import numpy as np
import pytest
from helpers import fixture_seed
import tensorflow as tf

from keras_transformer import TransformerConfig, build_transformer
from keras_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.decoding import SearchOptions, length_penalty
from keras_transformer.inference.scoring import score_tokens
from keras_transformer.inference.searcher import STATIC_BUFFER, Searcher

CONFIG = TransformerConfig(vocab_size=24, num_layers=1, d_model=32, d_ff=64, num_heads=4, dropout=0.0,
                           max_length=12, decode_extra_length=8)
SOURCE = np.array([[5, 9, 13, EOS_ID]], np.int32)
COPIES = 4000  # one source repeated: each row draws its own first token


@pytest.fixture(scope="module")
def searcher():
    keras.utils.set_random_seed(fixture_seed(21))
    return Searcher(build_transformer(CONFIG), CONFIG)


def first_token_probabilities(searcher):
    """The model's distribution of the first target token for SOURCE: `[V]`, float64."""
    logits = keras.ops.convert_to_numpy(searcher.decoder.model([SOURCE, np.array([[BOS_ID]], np.int32)]))[0, 0]
    logits = logits.astype(np.float64)
    return np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()


def sample(searcher, copies=COPIES, buffer=None, source=SOURCE, **sampling):
    options = SearchOptions(beam_size=1, alpha=0.6, num_results=1, extra_length=CONFIG.decode_extra_length,
                            **sampling)
    kwargs = {} if buffer is None else {"buffer": buffer}
    run = tf.function(lambda s, n: searcher.search(s, n, options, **kwargs), autograph=False)
    sources = np.repeat(source, copies, axis=0)
    lengths = np.argmax(sources == EOS_ID, axis=1).astype(np.int32)  # tokens before EOS
    ids, scores = run(tf.constant(sources), tf.constant(lengths))
    return ids.numpy()[:, 0], scores.numpy()[:, 0]


@pytest.mark.parametrize("sampling", [
    {"sampling_topk": 0},
    {"sampling_topk": 0, "sampling_temperature": 1.7},
    {"sampling_topk": 5, "sampling_temperature": 0.8},
    {"sampling_topk": 0, "sampling_topp": 0.6}])
def test_the_first_tokens_follow_the_models_distribution(searcher, sampling):
    """4,000 draws of the first token against its expected distribution: the model's
    probabilities raised to 1/temperature, kept among the top k and within the top-p
    nucleus (the smallest set of best tokens reaching p), renormalized. Every token's
    frequency is within 4.5 standard errors of its probability, and no token outside the
    kept set is ever drawn."""
    p = first_token_probabilities(searcher)
    q = p ** (1.0 / sampling.get("sampling_temperature", 1.0))
    order = np.argsort(-p)
    keep = np.zeros_like(q, bool)
    keep[order[:sampling["sampling_topk"] or len(p)]] = True
    q = np.where(keep, q, 0.0) / np.where(keep, q, 0.0).sum()
    if "sampling_topp" in sampling:
        ranked = q[order]
        before = np.cumsum(ranked) - ranked
        nucleus = np.zeros_like(keep)
        nucleus[order[before < sampling["sampling_topp"]]] = True
        q = np.where(nucleus, q, 0.0) / np.where(nucleus, q, 0.0).sum()
    assert (q > 0).sum() >= 2  # a distribution, not one token
    ids, _ = sample(searcher, seed=3, **sampling)
    frequency = np.bincount(ids[:, 0], minlength=len(p)) / len(ids)
    bound = 4.5 * np.sqrt(q * (1 - q) / len(ids)) + 1e-9
    assert (np.abs(frequency - q) <= bound).all(), np.stack([frequency, q])
    assert frequency[q == 0].sum() == 0


def test_a_seed_gives_the_same_samples_in_every_loop_and_another_seed_others(searcher):
    """The same seed: the same sequences twice, and in the loop that drops finished
    sentences and the static buffer's (each sentence takes its own noise); another seed:
    other sequences. The scores are each sequence's forced-decoding log-probability under
    the model's own (untempered) distribution, over the length penalty."""
    source = np.array([[5, 9, 13, EOS_ID], [7, 8, EOS_ID, PAD_ID], [20, EOS_ID, PAD_ID, PAD_ID]], np.int32)
    sampling = {"sampling_topk": 0, "sampling_temperature": 1.3, "seed": 7}
    ids, scores = sample(searcher, copies=4, source=source, **sampling)
    again, again_scores = sample(searcher, copies=4, source=source, **sampling)
    static, static_scores = sample(searcher, copies=4, source=source, buffer=STATIC_BUFFER, **sampling)
    other, _ = sample(searcher, copies=4, source=source, **{**sampling, "seed": 8})
    assert (ids == again).all() and (scores == again_scores).all()
    assert (static[:, :ids.shape[1]] == ids).all()
    np.testing.assert_allclose(static_scores, scores, atol=1e-5)
    assert (other[:, :ids.shape[1]] != ids).any()
    assert len({tuple(row) for row in ids}) > 3  # copies of a source draw different sequences
    sources = np.repeat(source, 4, axis=0)
    for row, (tokens, score) in enumerate(zip(ids, scores)):
        tokens = [int(t) for t in tokens]
        ended = EOS_ID in tokens
        if ended:
            tokens = tokens[:tokens.index(EOS_ID)]
        else:  # at the length limit: the buffer's PAD after it (a random model may draw PAD itself)
            tokens = tokens[:int(np.argmax(sources[row] == EOS_ID)) + CONFIG.decode_extra_length]
        forced = np.asarray(score_tokens(searcher.decoder.model, sources[row:row + 1],
                                         np.array([tokens or [PAD_ID]], np.int32), np.array([len(tokens)])))[0]
        counted = len(tokens) + 1 if ended else len(tokens)
        penalty = float(keras.ops.convert_to_numpy(length_penalty(counted, 0.6)))
        np.testing.assert_allclose(forced[:counted].sum() / penalty, score, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad, words", [
    ({"beam_size": 4, "sampling_topk": 0}, "needs beam_size 1"),
    ({"beam_size": 1, "sampling_topk": -1}, "sampling_topk"),
    ({"beam_size": 1, "sampling_topk": 0, "sampling_topp": 0.0}, "sampling_topp"),
    ({"beam_size": 1, "sampling_topk": 0, "sampling_temperature": float("nan")}, "sampling_temperature"),
    ({"beam_size": 1, "sampling_topk": 0, "seed": -3}, "seed")])
def test_bad_sampling_values_are_one_line_errors_naming_them(bad, words):
    with pytest.raises(ValueError, match=words) as raised:
        SearchOptions(**bad)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("sampling", [
    {"sampling_topk": 0, "sampling_temperature": 1.3, "seed": 7},
    {"sampling_topk": 5, "sampling_temperature": 0.8, "sampling_topp": 1.0, "seed": 3},
    {"sampling_topk": 0, "sampling_topp": 0.6, "seed": 9}])
def test_run_time_sampling_options_draw_the_python_ones_samples(searcher, sampling):
    """Sampling options given as tensors at run time (the SavedModel's `translate_advanced`)
    draw the same sequences, with the same scores, as the python values with the same seed."""
    source = np.array([[5, 9, 13, EOS_ID], [7, 8, EOS_ID, PAD_ID], [20, EOS_ID, PAD_ID, PAD_ID]], np.int32)
    want, want_scores = sample(searcher, copies=8, source=source, **sampling)
    tensors = {"sampling_topk": tf.constant(sampling["sampling_topk"]),
               "sampling_topp": tf.constant(sampling.get("sampling_topp", 1.0)),
               "sampling_temperature": tf.constant(sampling.get("sampling_temperature", 1.0)),
               "seed": tf.constant(sampling["seed"])}
    ids, scores = sample(searcher, copies=8, source=source, **tensors)
    assert (ids == want).all()
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6)


def test_a_run_time_topk_of_one_is_greedy_decoding(searcher):
    """`sampling_topk` 1 given at run time runs the sampling search, which then draws the
    best token every step: the greedy search's ids and scores."""
    source = np.array([[5, 9, 13, EOS_ID], [7, 8, EOS_ID, PAD_ID], [20, EOS_ID, PAD_ID, PAD_ID]], np.int32)
    greedy, greedy_scores = sample(searcher, copies=2, source=source)
    ids, scores = sample(searcher, copies=2, source=source, sampling_topk=tf.constant(1),
                         sampling_temperature=tf.constant(1.7), seed=tf.constant(5))
    assert (ids == greedy).all()
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-6)
