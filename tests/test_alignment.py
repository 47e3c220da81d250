"""Alignments (`keras_transformer.inference.alignment`): attention rows that are distributions over the
real source, the decoder layer chosen by index, and word pairs made from piece attention.
CTranslate2 parity and the toy language's diagonal are in test_ctranslate2.py."""

import keras
import numpy as np
import pytest
from helpers import fixture_seed

from keras_transformer import TransformerConfig, build_transformer
from keras_transformer.inference.alignment import attention_alignments, word_alignments
from keras_transformer.constants import EOS_ID, PAD_ID

CONFIG = TransformerConfig(vocab_size=30, num_layers=2, d_model=32, d_ff=64, num_heads=4, dropout=0.0,
                           max_length=12, decode_extra_length=6)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(fixture_seed(4))
    return build_transformer(CONFIG)


def numpy_cross_attention(model, source, target_in, layer):
    """A NumPy reference of one decoder layer's cross-attention weights (post-norm), from its
    weights and the layer's input (the model's own blocks before it)."""
    encoded, mask = (keras.ops.convert_to_numpy(t) for t in model.encode(source))
    y = model.embedding(target_in)
    for block in model.decoder_layers[:layer]:
        y = block(y, encoded, encoder_padding_mask=mask)
    block = model.decoder_layers[layer]
    x, _ = block._self_attended(y)  # the self-attention sub-layer and its residual
    x = keras.ops.convert_to_numpy(x)
    attention = block.cross_attention
    q = x @ keras.ops.convert_to_numpy(attention.query_dense.kernel) + keras.ops.convert_to_numpy(
        attention.query_dense.bias)
    k = encoded @ keras.ops.convert_to_numpy(attention.key_dense.kernel) + keras.ops.convert_to_numpy(
        attention.key_dense.bias)
    heads, size = CONFIG.num_heads, CONFIG.d_model // CONFIG.num_heads
    q = q.reshape(q.shape[0], q.shape[1], heads, size).transpose(0, 2, 1, 3)
    k = k.reshape(k.shape[0], k.shape[1], heads, size).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(size)  # [b, h, T, S]
    scores = np.where(mask[:, None, None, :], scores, -1e9)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)).mean(1)  # [b, T, S]


@pytest.mark.parametrize("layer", [0, 1, -1])
def test_attention_rows_are_the_layers_cross_attention_over_the_real_source(model, layer):
    """Against a NumPy reference of the chosen layer's heads averaged: each row of a real
    target token (and EOS) sums to 1 over the source tokens and EOS, PAD columns get 0,
    and rows after a translation's end are 0."""
    source = np.array([[5, 9, 13, EOS_ID, PAD_ID], [7, EOS_ID, PAD_ID, PAD_ID, PAD_ID]], np.int32)
    target = np.array([[11, 12, 13], [14, 0, 0]], np.int32)
    lengths = np.array([3, 1])
    got = np.asarray(attention_alignments(model, source, target, lengths, layer=layer))  # [2, 4, 5]
    target_in = np.array([[2, 11, 12, 13], [2, 14, 0, 0]], np.int32)
    want = numpy_cross_attention(model, source, target_in, layer % 2)
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(got[row, :length + 1], want[row, :length + 1], atol=1e-5)
        assert (got[row, length + 1:] == 0).all()
    np.testing.assert_allclose(got[0].sum(-1), 1.0, atol=1e-5)
    assert (got[0, :, 4] == 0).all() and (got[1, :2, 2:] == 0).all()
    with pytest.raises(ValueError, match="layer=2: the decoder has 2 layer"):
        attention_alignments(model, source, target, lengths, layer=2)


def test_word_alignments_sum_the_pieces_of_each_word():
    """Target word j goes to the source word whose pieces its pieces attend to most in all;
    EOS rows and columns are ignored; a word of several pieces counts all of them."""
    source = ["\u2581the", "\u2581apple", "\u2581tr", "ee", "</s>"]  # words: the, apple, tree
    target = ["\u2581der", "\u2581Apfel", "baum", "</s>"]  # words: der, Apfelbaum
    attention = np.array([[0.7, 0.1, 0.1, 0.0, 0.1],
                          [0.1, 0.5, 0.2, 0.1, 0.1],   # Apfel: apple 0.5 + ...
                          [0.0, 0.1, 0.3, 0.3, 0.3],   # baum: tree 0.6 -> Apfelbaum: apple 0.6, tree 0.9
                          [0.0, 0.0, 0.0, 0.0, 1.0]])
    assert word_alignments(source, target, attention) == [(0, 0), (2, 1)]
    attention[1, 1] = 0.9  # Apfelbaum: apple 1.0 against tree 0.9
    assert word_alignments(source, target, attention) == [(0, 0), (1, 1)]
