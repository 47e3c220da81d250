"""Layers against NumPy references of the paper's equations."""

import math

import numpy as np
import pytest

from keras_transformer.layers import (FeedForward, MultiHeadAttention, PositionalEmbedding,
                                      ResidualConnection, StepKernels, sinusoidal_encoding)
from keras_transformer.layers import attention as attention_module
from keras_transformer.layers.attention import write_cache
from keras_transformer.layers.per_token import apply_per_token


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


def test_attention_over_one_key_equals_numpy_without_keras_softmax_warning():
    """One key (a one-token source, a decoding loop's first target position): every weight is
    1, so the output is that key's value projected; computed as numpy does, and without the
    warning Keras gives for a softmax over one value ("Did you mean to use a sigmoid
    instead?"), which a user's own decoding loop around the model met at its first step."""
    import warnings

    rng = np.random.default_rng(3)
    layer = MultiHeadAttention(num_heads=4, d_model=16)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    memory = rng.normal(size=(2, 1, 16)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = np.asarray(layer(x, memory))
        weights = np.asarray(layer.attention_weights(x, memory))
    assert not [str(w.message) for w in caught if "softmax" in str(w.message)]
    np.testing.assert_allclose(got, numpy_attention(layer, x, memory), atol=1e-5)
    np.testing.assert_array_equal(weights, np.ones((2, 4, 5, 1), "float32"))


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



@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_fused_projections_equal_separate_ones_with_their_gradients(dtype):
    """Self-attention's one Q/K/V matmul and cross-attention's one K/V matmul (the
    kernels side by side) give the separate projections' outputs and gradients; the
    fused calls really skip the Dense layers, and decoding with a cache does not."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    memory = rng.normal(size=(2, 7, 16)).astype("float32")
    fused = MultiHeadAttention(num_heads=4, d_model=16, dtype=dtype)
    fused.fuse_projections = True
    separate = MultiHeadAttention(num_heads=4, d_model=16, dtype=dtype)
    assert not separate.fuse_projections  # the default
    fused(x)
    separate(x)
    for a, b in zip(separate.weights, fused.weights):
        a.assign(b.numpy() + rng.normal(size=b.shape).astype("float32") * 0.1)  # nonzero biases too
        b.assign(a.numpy())
    calls = []
    for name in ("query_dense", "key_dense", "value_dense"):
        layer = getattr(fused, name)
        layer.call = (lambda original, name: lambda *a, **k: calls.append(name) or original(*a, **k))(layer.call, name)

    def run(layer, value):
        with tf.GradientTape() as tape:
            out = layer(x, value)  # value None: self-attention
            loss = tf.reduce_sum(tf.cast(out, "float32") * np.linspace(-1, 1, 16, dtype="float32"))
        return np.asarray(tf.cast(out, "float32")), [np.asarray(g) for g in tape.gradient(loss, layer.trainable_weights)]

    for value, expected_calls in ((None, []), (memory, ["query_dense"])):
        calls.clear()
        (got, got_grads), (want, want_grads) = run(fused, value), run(separate, value)
        assert calls == expected_calls
        assert np.abs(want).max() > 0.5
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert len(got_grads) == 8 and all(np.abs(g).max() > 0 for g in got_grads)
        # bfloat16 gradients are summed over rows in another order (one matmul, or
        # the bias gradient of one concatenated bias): equal to bfloat16 rounding of
        # the terms summed, whose scale is that of the largest gradient (the key
        # bias's gradient is zero in exact arithmetic: in bfloat16 it is that noise).
        scale = max(np.abs(w).max() for w in want_grads)
        rtol, atol = (1e-4, 1e-5) if dtype == "float32" else (3e-2, 2e-3 * scale)
        for g, w in zip(got_grads, want_grads):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    calls.clear()
    cache = (np.zeros((2, 4, 6, 4), "float32"), np.zeros((2, 4, 6, 4), "float32"))
    fused(x[:, :1], cache=cache, cache_index=0)
    assert calls == ["query_dense", "key_dense", "value_dense"]

def test_self_attention_cache_step_by_step_equals_causal_full_pass():
    rng = np.random.default_rng(2)
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    x = rng.normal(size=(3, 6, 8)).astype("float32")
    full = np.asarray(layer(x, x, attention_mask=np.tril(np.ones((6, 6), bool))[None]))
    cache = (np.zeros((3, 2, 9, 4), "float32"), np.zeros((3, 2, 9, 4), "float32"))  # [batch, heads, slots, d]
    flat_cache = cache
    for t in range(6):
        out, cache = layer(x[:, t:t + 1], cache=cache, cache_index=t)
        np.testing.assert_allclose(np.asarray(out)[:, 0], full[:, t], atol=1e-5)
        # One position per row as `[batch, d_model]` (the decoder's cached steps): the same.
        flat, flat_cache = layer(x[:, t], cache=flat_cache, cache_index=t)
        assert flat.shape == (3, 8)
        np.testing.assert_allclose(np.asarray(flat), full[:, t], atol=1e-5)
    np.testing.assert_allclose(np.asarray(flat_cache[0]), np.asarray(cache[0]), atol=1e-6)
    # The cache holds exactly the projected keys of the 6 positions, zeros after.
    keys = np.asarray(layer.compute_key_value(x)[0])
    np.testing.assert_allclose(np.asarray(cache[0])[:, :, :6], keys, atol=1e-6)
    assert not np.asarray(cache[0])[:, :, 6:].any()


@pytest.mark.parametrize("threshold", [0, 10**9], ids=["batched-matmuls", "broadcast-products"])
def test_small_kernels_equal_numpy_in_both_regimes(monkeypatch, threshold):
    """`small_kernels` picks, per call, oneDNN's batched matmuls or broadcast products
    (`SMALL_ATTENTION`); forced to each, a growing-cache decoding step equals the causal
    full pass in NumPy, and cross-attention with 3 beams' queries per cached sentence
    equals NumPy's attention over the sentence repeated per beam; both also with one
    position per row as `[rows, d_model]` (the decoder's steps: cross-attention then
    takes the beams query-major, with no transposes), and with `small_kernels="always"`
    (the broadcast products whatever the threshold)."""
    monkeypatch.setattr(attention_module, "SMALL_ATTENTION", threshold)
    rng = np.random.default_rng(7)
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    x = rng.normal(size=(3, 6, 8)).astype("float32")
    layer(x, x)  # build
    want = numpy_attention(layer, x, x, mask=np.broadcast_to(np.tril(np.ones((6, 6), bool)), (3, 6, 6)))
    cache = (np.zeros((3, 2, 0, 4), "float32"), np.zeros((3, 2, 0, 4), "float32"))  # grows by one slot a step
    flat_cache = cache
    for t in range(6):
        out, cache = layer(x[:, t:t + 1], cache=cache, cache_index=t, grow_cache=True, small_kernels=True)
        np.testing.assert_allclose(np.asarray(out)[:, 0], want[:, t], atol=1e-5)
        flat, grown = layer(x[:, t], cache=flat_cache, cache_index=t, grow_cache=True, small_kernels=True)
        np.testing.assert_allclose(np.asarray(flat), want[:, t], atol=1e-5)
        # "always": the broadcast products whatever the threshold.
        always, _ = layer(x[:, t], cache=flat_cache, cache_index=t, grow_cache=True, small_kernels="always")
        np.testing.assert_allclose(np.asarray(always), want[:, t], atol=1e-5)
        flat_cache = grown

    memory = rng.normal(size=(2, 5, 8)).astype("float32")  # 2 sentences
    padding = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    beams = rng.normal(size=(6, 1, 8)).astype("float32")  # 3 beams per sentence, one step
    got, _ = layer(beams, cache=layer.compute_key_value(memory), attention_mask=padding[:, None, :],
                   small_kernels=True)
    repeated = np.repeat(memory, 3, axis=0)  # [6, 5, 8]
    mask = np.broadcast_to(np.repeat(padding, 3, axis=0)[:, None, :], (6, 1, 5))
    np.testing.assert_allclose(np.asarray(got), numpy_attention(layer, beams, repeated, mask=mask), atol=1e-5)
    for small in (True, False, "always"):
        flat, _ = layer(beams[:, 0], cache=layer.compute_key_value(memory), attention_mask=padding[:, None, :],
                        small_kernels=small)  # [6, 8]
        np.testing.assert_allclose(np.asarray(flat), np.asarray(got)[:, 0], atol=1e-5)


def test_small_kernels_choose_by_the_size_of_the_product(monkeypatch):
    """The choice is made per call from the dynamic shapes: below the threshold the
    broadcast products run, above it the batched matmuls (seen through which kernel
    `_products` is asked for)."""
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    x = np.ones((4, 1, 8), "float32")
    cache = (np.zeros((4, 2, 2, 4), "float32"), np.zeros((4, 2, 2, 4), "float32"))
    layer(x, cache=cache, cache_index=2, grow_cache=True)  # build
    asked = []
    products = MultiHeadAttention._products
    monkeypatch.setattr(MultiHeadAttention, "_products",
                        staticmethod(lambda q, k, few: asked.append(few) or products(q, k, few)))
    size = 4 * 2 * 1 * 3 * 4  # rows x heads x queries x keys (2 cached + this one) x head size
    for threshold, want in ((size, [True]), (size - 1, [False])):
        monkeypatch.setattr(attention_module, "SMALL_ATTENTION", threshold)
        asked.clear()
        layer(x, cache=cache, cache_index=2, grow_cache=True, small_kernels=True)
        assert asked == want, threshold


def test_step_kernels_take_the_large_products_and_transposes_of_a_step(monkeypatch):
    """With `StepKernels(batch_matmul=..., transpose=...)` a decoding step's large products
    (above `SMALL_ATTENTION`, or without `small_kernels`) are that function's, two per call,
    with the softmax written out, and its transposes the other's: a growing-cache
    self-attention step of one position per row equals NumPy's causal full pass, and
    cross-attention with 3 beams' queries per cached sentence (query-major: its queries are
    transposed to heads first and its output back) equals NumPy's attention over the
    sentence repeated per beam; the small products (`"always"`) call neither, and calls
    that are not a decoding step ignore them."""
    from keras import ops

    monkeypatch.setattr(attention_module, "SMALL_ATTENTION", 0)  # every product is large
    calls = []

    def batch_matmul(x, y, transpose_y=False):
        calls.append(("matmul", tuple(x.shape), transpose_y))
        return ops.matmul(x, ops.swapaxes(y, -1, -2) if transpose_y else y)

    def transpose(x, axes):
        calls.append(("transpose", tuple(x.shape), tuple(axes)))
        return ops.transpose(x, axes)

    kernels = StepKernels(batch_matmul=batch_matmul, transpose=transpose)
    rng = np.random.default_rng(8)
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    x = rng.normal(size=(3, 6, 8)).astype("float32")
    layer(x, x)  # build
    for w in layer.weights:  # nonzero biases too
        w.assign(np.asarray(w) + rng.normal(size=w.shape).astype("float32") * 0.1)
    causal = np.broadcast_to(np.tril(np.ones((6, 6), bool)), (3, 6, 6))
    want = numpy_attention(layer, x, x, mask=causal)
    cache = (np.zeros((3, 2, 0, 4), "float32"), np.zeros((3, 2, 0, 4), "float32"))  # grows by one slot a step
    for t in range(6):
        for small in (True, False):
            calls.clear()
            got, grown = layer(x[:, t], cache=cache, cache_index=t, grow_cache=True, small_kernels=small,
                               kernels=kernels)
            np.testing.assert_allclose(np.asarray(got), want[:, t], atol=1e-5)
            assert [call[::2] for call in calls] == [("matmul", True), ("matmul", False)], (t, small)
        calls.clear()
        always, _ = layer(x[:, t], cache=cache, cache_index=t, grow_cache=True, small_kernels="always",
                          kernels=kernels)
        np.testing.assert_allclose(np.asarray(always), want[:, t], atol=1e-5)
        assert calls == []
        cache = grown

    memory = rng.normal(size=(2, 5, 8)).astype("float32")  # 2 sentences
    padding = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    beams = rng.normal(size=(6, 8)).astype("float32")  # 3 beams per sentence, one step
    repeated = np.repeat(memory, 3, axis=0)  # [6, 5, 8]
    mask = np.broadcast_to(np.repeat(padding, 3, axis=0)[:, None, :], (6, 1, 5))
    want = numpy_attention(layer, beams[:, None], repeated, mask=mask)[:, 0]  # [6, 8]
    for small in (True, False):
        calls.clear()
        got, _ = layer(beams, cache=layer.compute_key_value(memory), attention_mask=padding[:, None, :],
                       small_kernels=small, kernels=kernels)  # [6, 8]
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
        assert calls == [("transpose", (2, 3, 2, 4), (0, 2, 1, 3)), ("matmul", (2, 2, 3, 4), True),
                         ("matmul", (2, 2, 3, 5), False), ("transpose", (2, 2, 3, 4), (0, 2, 1, 3))], small
    calls.clear()
    full = np.asarray(layer(x, x, attention_mask=causal[:1], kernels=kernels))
    assert calls == []
    np.testing.assert_allclose(full, numpy_attention(layer, x, x, mask=causal), atol=1e-5)


def test_apply_per_token_equals_dense_on_rank_3_exactly():
    """`apply_per_token` (one 2-D matmul) gives Dense's rank-3 result (a tensordot) bit for bit."""
    import keras
    rng = np.random.default_rng(3)
    dense = keras.layers.Dense(5)
    x = rng.normal(size=(3, 4, 6)).astype("float32")
    want = np.asarray(dense(x))
    np.testing.assert_array_equal(np.asarray(apply_per_token(dense, x)), want)
    np.testing.assert_array_equal(np.asarray(apply_per_token(dense, x[:, :1])), want[:, :1])


def test_apply_per_token_with_a_matmul_is_dense_with_that_product():
    """With `matmul`, a 2-D input gets `activation(matmul(x, kernel) + bias)`: NumPy's formula
    with a bias and ReLU, and the product really is the given function's (a product that
    doubles gives twice the pre-activation), with and without a bias."""
    import keras
    rng = np.random.default_rng(4)
    dense = keras.layers.Dense(5, activation="relu", bias_initializer="random_normal")
    x = rng.normal(size=(4, 6)).astype("float32")
    dense.build(x.shape)
    kernel, bias = (np.asarray(w) for w in (dense.kernel, dense.bias))
    want = np.maximum(x @ kernel + bias, 0.0)
    got = np.asarray(apply_per_token(dense, x, matmul=keras.ops.matmul))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, np.asarray(dense(x)), rtol=1e-6, atol=1e-6)
    doubled = np.asarray(apply_per_token(dense, x, matmul=lambda a, b: 2.0 * keras.ops.matmul(a, b)))
    np.testing.assert_allclose(doubled, np.maximum(2.0 * (x @ kernel) + bias, 0.0), rtol=1e-6, atol=1e-6)
    linear = keras.layers.Dense(3, use_bias=False)
    linear.build(x.shape)
    np.testing.assert_allclose(np.asarray(apply_per_token(linear, x, matmul=keras.ops.matmul)),
                               x @ np.asarray(linear.kernel), rtol=1e-6, atol=1e-6)


def test_write_cache_places_rows():
    cache = np.zeros((1, 1, 5, 2), "float32")  # [batch, heads, slots, d]
    update = np.arange(4, dtype="float32").reshape(1, 1, 2, 2) + 1
    got = np.asarray(write_cache(cache, update, 2))[0, 0]
    np.testing.assert_array_equal(got, [[0, 0], [0, 0], [1, 2], [3, 4], [0, 0]])


def test_write_cache_of_one_position_equals_numpy_and_the_general_path():
    """The one-position path (every decoding step) writes exactly that row, at every index,
    and agrees bit for bit with placing the same row through the general (T > 1) path."""
    rng = np.random.default_rng(0)
    cache = rng.normal(size=(3, 2, 7, 4)).astype("float32")  # [batch, heads, slots, d]
    update = rng.normal(size=(3, 2, 1, 4)).astype("float32")
    for index in range(7):
        want = cache.copy()
        want[:, :, index] = update[:, :, 0]
        got = np.asarray(write_cache(cache, update, index))
        np.testing.assert_array_equal(got, want)
        # General path: two rows, the second one rewritten by the original cache row after.
        pair = np.concatenate([update, cache[:, :, index + 1:index + 2] if index < 6 else update], axis=2)
        np.testing.assert_array_equal(np.asarray(write_cache(cache, pair, index))[:, :, index],
                                      got[:, :, index])


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


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_residual_layer_norm_is_keras_layer_norm_bit_for_bit(dtype):
    """`ResidualConnection.layer_norm` (no reshape of gamma/beta) returns exactly what its
    `keras.layers.LayerNormalization` returns, on a decoding step's [rows, d_model] and on
    [batch, T, d_model], eagerly and in a tf.function (Grappler's rewrites), with trained
    (non-trivial) gamma and beta."""
    import tensorflow as tf

    rng = np.random.default_rng(21)
    layer = ResidualConnection(dropout=0.0, dtype=dtype)
    layer.build((None, None, 16))
    layer.norm.gamma.assign(rng.normal(size=16).astype("float32"))
    layer.norm.beta.assign(rng.normal(size=16).astype("float32"))
    inputs = [rng.normal(loc=3.0, size=shape).astype("float32") for shape in [(6, 16), (2, 5, 16)]]
    # Also in the compute dtype, as `call` hands it over (the sum of its cast inputs).
    inputs += [keras.ops.cast(x, layer.compute_dtype) for x in inputs]
    for x in inputs:
        for run in (lambda f: f(x), lambda f: tf.function(f)(tf.identity(x))):
            got, want = run(layer.layer_norm), run(layer.norm)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(_float32(got), _float32(want))


@pytest.mark.parametrize("layer", [
    MultiHeadAttention(num_heads=2, d_model=8, dropout=0.1),
    PositionalEmbedding(vocab_size=11, d_model=8),
    FeedForward(d_model=8, d_ff=16),
    ResidualConnection(dropout=0.2, norm_first=True, epsilon=1e-5),
])
def test_layer_configs_round_trip(layer):
    clone = layer.__class__.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


# --- The rest of the layer contract: initializer arguments, output shapes,
# mixed precision, configs. ---------------------------------------------------

import keras  # noqa: E402

from keras_transformer.layers import DecoderBlock, EncoderBlock  # noqa: E402


def _float32(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def _kernels_and_biases(layer):
    kernels = [w for w in layer.weights if w.path.endswith("/kernel")]
    biases = [w for w in layer.weights if w.path.endswith("/bias")]
    return kernels, biases


@pytest.mark.parametrize("make", [
    lambda **kw: MultiHeadAttention(num_heads=2, d_model=8, **kw),
    lambda **kw: FeedForward(d_model=8, d_ff=8, **kw),
    lambda **kw: EncoderBlock(8, 2, 8, **kw),
    lambda **kw: DecoderBlock(8, 2, 8, **kw),
], ids=["attention", "feed_forward", "encoder_block", "decoder_block"])
def test_default_initializers_are_glorot_and_zeros_with_unchanged_seeding(make):
    # The defaults are names, resolved when each Dense is made: an
    # initializer object passed in is copied per Dense at the same point, so
    # under one seed both give the same weights (and the weights of existing
    # runs stay reproducible). Every kernel gets its own seed.
    shape = (None, None, 8)
    keras.utils.set_random_seed(5)
    default = make(name="layer")
    default.build(shape)
    # (Making an unseeded initializer draws a seed itself: make it first.)
    kernel_initializer = keras.initializers.GlorotUniform()
    keras.utils.set_random_seed(5)
    explicit = make(kernel_initializer=kernel_initializer,
                    bias_initializer=keras.initializers.Zeros(), name="layer")
    explicit.build(shape)
    assert [w.path for w in default.weights] == [w.path for w in explicit.weights]
    for a, b in zip(default.weights, explicit.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    kernels, biases = _kernels_and_biases(default)
    assert biases and not any(np.asarray(b).any() for b in biases)
    values = [np.asarray(k) for k in kernels]
    for i, kernel in enumerate(values):
        limit = math.sqrt(6 / sum(kernel.shape))  # Glorot uniform
        assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.5 * limit
        assert all(not np.array_equal(kernel, other) for other in values[i + 1:])


def test_default_embedding_initializer_is_normal_with_stddev_d_model_to_the_minus_half():
    keras.utils.set_random_seed(5)
    default = PositionalEmbedding(vocab_size=500, d_model=64)
    default.build()
    keras.utils.set_random_seed(5)
    explicit = PositionalEmbedding(
        vocab_size=500, d_model=64,
        embeddings_initializer=keras.initializers.RandomNormal(stddev=64 ** -0.5))
    explicit.build()
    table = np.asarray(default.embeddings)
    np.testing.assert_array_equal(table, np.asarray(explicit.embeddings))
    assert table.std() == pytest.approx(64 ** -0.5, rel=0.02)
    assert abs(table.mean()) < 0.01


def _initialized_layers():
    """Each layer with non-default initializers, and how to build it."""
    kernel, bias = keras.initializers.Constant(0.5), keras.initializers.Constant(0.25)
    shape = (None, None, 8)
    return [
        (MultiHeadAttention(num_heads=2, d_model=8, kernel_initializer=kernel, bias_initializer=bias),
         shape),
        (FeedForward(d_model=8, d_ff=16, kernel_initializer=kernel, bias_initializer=bias), shape),
        (EncoderBlock(8, 2, 16, kernel_initializer=kernel, bias_initializer=bias), shape),
        (DecoderBlock(8, 2, 16, kernel_initializer=kernel, bias_initializer=bias), shape),
    ]


@pytest.mark.parametrize("index", range(4), ids=["attention", "feed_forward", "encoder_block",
                                                 "decoder_block"])
def test_config_round_trip_keeps_custom_initializers(index):
    layer, shape = _initialized_layers()[index]
    config = layer.get_config()
    assert config["kernel_initializer"]["class_name"] == "Constant"
    for clone in (layer.__class__.from_config(config),
                  keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))):
        assert type(clone) is type(layer)
        assert clone.get_config() == config
        clone.build(shape)
        kernels, biases = _kernels_and_biases(clone)
        assert len(kernels) == len(biases) >= 2
        for w in kernels:
            np.testing.assert_array_equal(np.asarray(w), np.full(w.shape, 0.5, "float32"))
        for w in biases:
            np.testing.assert_array_equal(np.asarray(w), np.full(w.shape, 0.25, "float32"))
    # The default initializers round-trip too.
    default = layer.__class__.from_config({**config, "kernel_initializer": "glorot_uniform",
                                           "bias_initializer": "zeros"})
    assert default.get_config()["kernel_initializer"] == "glorot_uniform"


def test_embedding_config_round_trip_keeps_custom_initializer():
    layer = PositionalEmbedding(vocab_size=11, d_model=8,
                                embeddings_initializer=keras.initializers.Constant(0.5))
    config = layer.get_config()
    clone = PositionalEmbedding.from_config(config)
    assert clone.get_config() == config
    clone.build()
    np.testing.assert_array_equal(np.asarray(clone.embeddings), np.full((11, 8), 0.5, "float32"))
    assert PositionalEmbedding(11, 8).get_config()["embeddings_initializer"] is None
    assert PositionalEmbedding.from_config(PositionalEmbedding(11, 8).get_config()) \
        .embeddings_initializer is None


def _shape_cases():
    """(layer, call, compute_output_shape arguments), with numpy inputs."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    memory = rng.normal(size=(2, 7, 8)).astype("float32")
    ids = rng.integers(1, 11, size=(2, 5)).astype("int32")
    cache = (np.zeros((2, 2, 9, 4), "float32"), np.zeros((2, 2, 9, 4), "float32"))
    padding = np.ones((2, 7), bool)
    return {
        "attention": (MultiHeadAttention(num_heads=2, d_model=8), lambda l, a: l(a["x"], a["memory"]),
                      lambda l: l.compute_output_shape(x.shape, memory.shape)),
        "attention_cached": (MultiHeadAttention(num_heads=2, d_model=8),
                             lambda l, a: l(a["x"], cache=a["cache"], cache_index=3),
                             lambda l: l.compute_output_shape(x.shape, cache_shape=[c.shape for c in cache])),
        "embedding": (PositionalEmbedding(11, 8), lambda l, a: l(a["ids"], start_position=2),
                      lambda l: l.compute_output_shape(ids.shape)),
        "embedding_reverse": (PositionalEmbedding(11, 8), lambda l, a: l(a["x"], reverse=True),
                              lambda l: l.compute_output_shape(x.shape, reverse=True)),
        "feed_forward": (FeedForward(8, 16), lambda l, a: l(a["x"]),
                         lambda l: l.compute_output_shape(x.shape)),
        "residual": (ResidualConnection(0.1), lambda l, a: l(a["x"], a["x"]),
                     lambda l: l.compute_output_shape(x.shape, x.shape)),
        "encoder_block": (EncoderBlock(8, 2, 16), lambda l, a: l(a["memory"], padding_mask=a["padding"]),
                          lambda l: l.compute_output_shape(memory.shape)),
        "decoder_block": (DecoderBlock(8, 2, 16),
                          lambda l, a: l(a["x"], a["memory"], encoder_padding_mask=a["padding"]),
                          lambda l: l.compute_output_shape(x.shape, memory.shape)),
        "decoder_block_cached": (
            DecoderBlock(8, 2, 16),
            lambda l, a: l(a["x"], a["memory"], encoder_padding_mask=a["padding"],
                           self_attention_cache=a["cache"], cache_index=0),
            lambda l: l.compute_output_shape(x.shape, memory.shape,
                                             self_attention_cache_shape=[c.shape for c in cache])),
    }, dict(x=x, memory=memory, ids=ids, cache=cache, padding=padding)


def _shapes(structure):
    """Shapes of a (nested) call output, or a (nested) `compute_output_shape`
    result, as nested tuples."""
    if hasattr(structure, "shape"):
        return tuple(structure.shape)
    if all(d is None or isinstance(d, int) for d in structure):
        return tuple(structure)
    return tuple(_shapes(s) for s in structure)


def _flatten_shapes(shapes):
    if all(d is None or isinstance(d, int) for d in shapes):
        return [shapes]
    return [s for part in shapes for s in _flatten_shapes(part)]


@pytest.mark.parametrize("case", list(_shape_cases()[0]))
def test_compute_output_shape_matches_call(case):
    cases, inputs = _shape_cases()
    layer, call, output_shape = cases[case]
    eager = _shapes(call(layer, inputs))
    assert _shapes(output_shape(layer)) == eager
    # Symbolic inputs (how the functional model calls the layers) go through
    # compute_output_shape; batch and time are unknown there, the feature
    # axes (d_model, vocab, cache slots) are known.
    symbolic = {k: keras.KerasTensor((None, None) + v.shape[2:], dtype=str(v.dtype))
                for k, v in inputs.items() if k != "cache"}
    symbolic["cache"] = tuple(keras.KerasTensor((None,) + c.shape[1:]) for c in inputs["cache"])
    spec = _flatten_shapes(_shapes(call(layer, symbolic)))
    want = _flatten_shapes(eager)
    assert len(spec) == len(want)
    for got, expected in zip(spec, want):
        assert len(got) == len(expected)
        assert got[0] is None and got[-1] == expected[-1]
        assert all(g is None or g == e for g, e in zip(got, expected))


def _bfloat16_rounded(x):
    return _float32(keras.ops.cast(np.asarray(x, "float32"), "bfloat16"))


def _assert_mixed_precision_matches_float32(make, call):
    """`make(dtype)` twice, the same weights in both, and `call(layer)` in
    float32 and under `mixed_bfloat16`: float32 variables, bfloat16 outputs
    that agree with float32 to bfloat16 accuracy, computed in bfloat16 (not
    float32 rounded at the end). Returns both first outputs."""
    assert keras.config.dtype_policy().name == "float32"
    exact, mixed = make("float32"), make("mixed_bfloat16")
    want = call(exact)
    call(mixed)  # builds it
    assert [w.path for w in mixed.weights] == [w.path for w in exact.weights]
    mixed.set_weights(exact.get_weights())
    assert mixed.weights and all(w.dtype == "float32" for w in mixed.weights)
    got = call(mixed)
    keras.tree.assert_same_structure(got, want)
    for g, w in zip(keras.tree.flatten(got), keras.tree.flatten(want)):
        assert keras.backend.standardize_dtype(g.dtype) == "bfloat16"
        assert keras.backend.standardize_dtype(w.dtype) == "float32"
    got, want = keras.tree.flatten(got)[0], np.asarray(keras.tree.flatten(want)[0])
    got = _float32(got)
    assert np.abs(want).max() > 0.5  # values of order 1, so the tolerances mean something
    np.testing.assert_allclose(got, want, atol=3e-2, rtol=3e-2)
    assert not np.array_equal(got, want)
    assert not np.array_equal(got, _bfloat16_rounded(want))
    assert keras.config.dtype_policy().name == "float32"
    return got, want


def test_attention_mixed_precision():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    memory = rng.normal(size=(2, 6, 16)).astype("float32")
    padding = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)[:, None, :]  # [2, 1, 6]
    bias = rng.normal(size=(1, 4, 5, 6)).astype("float32")
    got, _ = _assert_mixed_precision_matches_float32(
        lambda dtype: MultiHeadAttention(num_heads=4, d_model=16, dtype=dtype, name="mha"),
        lambda layer: layer(x, memory, attention_mask=padding, attention_bias=bias))

    # NEG_INF and the softmax in float32: masked positions get exactly zero
    # weight in bfloat16 too, whatever they hold.
    layer = MultiHeadAttention(num_heads=4, d_model=16, dtype="mixed_bfloat16")
    layer(x, memory)
    changed = memory.copy()
    changed[0, 4:] = 100.0
    np.testing.assert_array_equal(_float32(layer(x, memory, attention_mask=padding)),
                                  _float32(layer(x, changed, attention_mask=padding)))


def test_attention_cached_mixed_precision():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(2, 3, 16)).astype("float32")
    cache = (np.zeros((2, 4, 6, 4), "float32"), np.zeros((2, 4, 6, 4), "float32"))

    def two_steps(layer):
        first, state = layer(x[:, :2], cache=cache, cache_index=0)
        second, state = layer(x[:, 2:], cache=state, cache_index=2)
        return keras.ops.concatenate([first, second], axis=1), state

    got, _ = _assert_mixed_precision_matches_float32(
        lambda dtype: MultiHeadAttention(num_heads=4, d_model=16, dtype=dtype, name="mha"), two_steps)
    # ...and the cached bfloat16 steps agree with the bfloat16 full causal pass.
    layer = MultiHeadAttention(num_heads=4, d_model=16, dtype="mixed_bfloat16")
    full = layer(x, x, attention_mask=np.tril(np.ones((3, 3), bool))[None])
    np.testing.assert_allclose(_float32(two_steps(layer)[0]), _float32(full), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("reverse", [False, True])
def test_positional_embedding_mixed_precision(reverse):
    rng = np.random.default_rng(9)
    ids = rng.integers(1, 50, size=(2, 6)).astype("int32")
    states = rng.normal(size=(2, 6, 16)).astype("float32")
    if reverse:
        call = lambda layer: layer(states, reverse=True)  # noqa: E731
    else:
        call = lambda layer: layer(ids, start_position=3)  # noqa: E731
    _assert_mixed_precision_matches_float32(
        lambda dtype: PositionalEmbedding(50, 16, dtype=dtype, name="embedding"), call)


def test_feed_forward_mixed_precision():
    x = np.random.default_rng(10).normal(size=(2, 5, 16)).astype("float32")
    _assert_mixed_precision_matches_float32(
        lambda dtype: FeedForward(16, 32, dtype=dtype, name="ffn"), lambda layer: layer(x))


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_connection_mixed_precision(norm_first):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    y = rng.normal(size=(2, 5, 16)).astype("float32")

    def call(layer):
        if not layer.built:
            layer.build(x.shape)
        return layer(x, layer.normalize_input(y) + 0.5)

    _assert_mixed_precision_matches_float32(
        lambda dtype: ResidualConnection(0.0, norm_first=norm_first, dtype=dtype, name="residual"),
        call)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_mixed_precision(norm_first):
    rng = np.random.default_rng(12)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    padding = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    _assert_mixed_precision_matches_float32(
        lambda dtype: EncoderBlock(16, 4, 32, dropout=0.0, norm_first=norm_first, dtype=dtype,
                                   name="block"),
        lambda layer: layer(x, padding_mask=padding))


@pytest.mark.parametrize("cached", [False, True])
def test_decoder_block_mixed_precision(cached):
    rng = np.random.default_rng(13)
    y = rng.normal(size=(2, 4, 16)).astype("float32")
    memory = rng.normal(size=(2, 5, 16)).astype("float32")
    padding = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    cache = (np.zeros((2, 4, 6, 4), "float32"), np.zeros((2, 4, 6, 4), "float32"))

    def call(layer):
        if not cached:
            return layer(y, memory, encoder_padding_mask=padding)
        cross = layer.cross_attention.compute_key_value(memory) if layer.built else None
        return layer(y, None if layer.built else memory, encoder_padding_mask=padding,
                     self_attention_cache=cache, cache_index=1, cross_attention_cache=cross)

    _assert_mixed_precision_matches_float32(
        lambda dtype: DecoderBlock(16, 4, 32, dropout=0.0, dtype=dtype, name="block"), call)
