"""Layers against NumPy references of the paper's equations."""

import math

import numpy as np
import pytest

from keras_transformer.layers import (FeedForward, MultiHeadAttention, PositionalEmbedding,
                                      ResidualConnection, sinusoidal_encoding)
from keras_transformer.layers.attention import write_cache


def numpy_attention(layer, query, value, mask=None, bias=None):
    """softmax(Q K^T / sqrt(d_k) + M) V per head, then W^O, in NumPy."""
    def dense(sub, x):
        kernel, b = [np.asarray(w) for w in sub.weights]
        return x @ kernel + b

    h, dk = layer.num_heads, layer.head_size
    q = dense(layer.query_dense, query).reshape(*query.shape[:2], h, dk).transpose(0, 2, 1, 3)
    k = dense(layer.key_dense, value).reshape(*value.shape[:2], h, dk).transpose(0, 2, 1, 3)
    v = dense(layer.value_dense, value).reshape(*value.shape[:2], h, dk).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dk)  # [b, h, q, k]
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = np.where(mask[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(*query.shape[:2], h * dk)
    return dense(layer.output_dense, context)


def test_attention_matches_numpy_with_padding_and_causal_masks():
    rng = np.random.default_rng(0)
    layer = MultiHeadAttention(num_heads=4, d_model=16)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    memory = rng.normal(size=(2, 6, 16)).astype("float32")
    padding = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)[:, None, :]  # [2, 1, 6]
    got = np.asarray(layer(x, memory, attention_mask=padding))
    want = numpy_attention(layer, x, memory, mask=np.broadcast_to(padding, (2, 5, 6)))
    np.testing.assert_allclose(got, want, atol=1e-5)

    causal = np.tril(np.ones((5, 5), bool))[None]
    got = np.asarray(layer(x, x, attention_mask=causal))
    want = numpy_attention(layer, x, x, mask=np.broadcast_to(causal, (2, 5, 5)))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_attention_bias_is_added_to_scaled_logits():
    rng = np.random.default_rng(1)
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    x = rng.normal(size=(1, 4, 8)).astype("float32")
    bias = rng.normal(size=(1, 2, 4, 4)).astype("float32") * 3
    got = np.asarray(layer(x, x, attention_bias=bias))
    np.testing.assert_allclose(got, numpy_attention(layer, x, x, bias=bias), atol=1e-5)
    assert not np.allclose(got, np.asarray(layer(x, x)), atol=1e-3)


def test_attention_rejects_heads_not_dividing_width():
    with pytest.raises(ValueError, match="num_heads=7 does not divide d_model=512"):
        MultiHeadAttention(num_heads=7, d_model=512)


def test_self_attention_cache_step_by_step_equals_causal_full_pass():
    rng = np.random.default_rng(2)
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    x = rng.normal(size=(3, 6, 8)).astype("float32")
    full = np.asarray(layer(x, x, attention_mask=np.tril(np.ones((6, 6), bool))[None]))
    cache = (np.zeros((3, 9, 2, 4), "float32"), np.zeros((3, 9, 2, 4), "float32"))
    for t in range(6):
        out, cache = layer(x[:, t:t + 1], cache=cache, cache_index=t)
        np.testing.assert_allclose(np.asarray(out)[:, 0], full[:, t], atol=1e-5)
    # The cache holds exactly the projected keys of the 6 positions, zeros after.
    keys = np.asarray(layer.compute_key_value(x)[0])
    np.testing.assert_allclose(np.asarray(cache[0])[:, :6], keys, atol=1e-6)
    assert not np.asarray(cache[0])[:, 6:].any()


def test_write_cache_places_rows():
    cache = np.zeros((1, 5, 1, 2), "float32")
    update = np.arange(4, dtype="float32").reshape(1, 2, 1, 2) + 1
    got = np.asarray(write_cache(cache, update, 2))[0, :, 0]
    np.testing.assert_array_equal(got, [[0, 0], [0, 0], [1, 2], [3, 4], [0, 0]])


def test_positional_encoding_matches_formula():
    d_model = 16
    pe = np.asarray(sinusoidal_encoding(np.arange(50), d_model))
    for pos, i in [(0, 0), (1, 0), (7, 3), (13, 5), (49, 7)]:
        angle = pos / 10000 ** (2 * i / d_model)
        assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
        assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


def test_positional_embedding_scales_and_offsets():
    layer = PositionalEmbedding(vocab_size=11, d_model=8)
    ids = np.array([[3, 5, 7]], "int32")
    got = np.asarray(layer(ids, start_position=4))
    table = np.asarray(layer.embeddings)
    want = table[ids] * math.sqrt(8) + np.asarray(sinusoidal_encoding(np.arange(4, 7), 8))[None]
    np.testing.assert_allclose(got, want, atol=1e-5)
    h = np.random.default_rng(0).normal(size=(1, 2, 8)).astype("float32")
    np.testing.assert_allclose(np.asarray(layer(h, reverse=True)), h @ table.T, atol=1e-5)


def test_feed_forward_is_relu_mlp():
    layer = FeedForward(d_model=4, d_ff=6)
    x = np.random.default_rng(3).normal(size=(2, 3, 4)).astype("float32")
    out = np.asarray(layer(x))
    w1, b1, w2, b2 = [np.asarray(w) for w in layer.weights]
    np.testing.assert_allclose(out, np.maximum(0, x @ w1 + b1) @ w2 + b2, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_connection_post_and_pre_norm(norm_first):
    layer = ResidualConnection(dropout=0.0, norm_first=norm_first)
    x = np.random.default_rng(4).normal(size=(2, 3, 4)).astype("float32")
    layer.build(x.shape)
    y = 2 * x + 1

    def layer_norm(v):
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-6)

    np.testing.assert_allclose(np.asarray(layer.normalize_input(x)),
                               layer_norm(x) if norm_first else x, atol=1e-5)
    want = x + y if norm_first else layer_norm(x + y)
    np.testing.assert_allclose(np.asarray(layer(x, y)), want, atol=1e-5)


@pytest.mark.parametrize("layer", [
    MultiHeadAttention(num_heads=2, d_model=8, dropout=0.1),
    PositionalEmbedding(vocab_size=11, d_model=8),
    FeedForward(d_model=8, d_ff=16),
    ResidualConnection(dropout=0.2, norm_first=True, epsilon=1e-5),
])
def test_layer_configs_round_trip(layer):
    clone = layer.__class__.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
