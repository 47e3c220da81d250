"""Multi-head scaled dot-product attention with a key/value cache."""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_transformer.constants import NEG_INF
from keras_transformer.layers.per_token import apply_per_token, leading_shape
from keras_transformer.layers.step_kernels import LAYER_KERNELS

# Largest product `q * k` (entries: rows x heads x queries x keys x head size)
# that `MultiHeadAttention(small_kernels=True)` computes by broadcasting instead
# of oneDNN's batched matmuls: the crossover measured on this 2-core CPU
# (docs/lab-notebook, "Serving speed, part 4").
SMALL_ATTENTION = 65536


def write_cache(cache, update, index):
    """Writes `update` into `cache` at positions `index ... index + T - 1` (axis 2).

    The cache is a preallocated buffer; instead of a dynamic slice update
    (XLA/TFLite-specific ops) the new rows are placed with a one-hot placement
    matrix, which is plain matmul/where and runs in TensorFlow, XLA, TF
    Serving and LiteRT alike. (Here and in the other layers, new axes come
    from `expand_dims`: `x[:, None]` on a dynamic dimension lowers to a
    StridedSlice that LiteRT has no kernel for.)

    Args:
        cache: `[batch, heads, max_length, head_size]`.
        update: `[batch, heads, T, head_size]`.
        index: int32 scalar, first position to write.

    Returns:
        The cache with positions `index .. index+T-1` replaced.
    """
    max_length = ops.shape(cache)[2]
    positions = ops.arange(max_length, dtype="int32")  # [max_length]
    if update.shape[2] == 1:
        # One position (every step of cached decoding): a broadcasting
        # `where` is the whole write, one pass over the buffer with no
        # placement matmul and its transposes (they were 40% of a beam-search
        # step on `base`). Bit-identical to the general path below.
        written = ops.reshape(ops.equal(positions, ops.cast(index, "int32")), (1, 1, -1, 1))
        return ops.where(written, update, cache)  # update [batch, heads, 1, ...] broadcasts over positions
    length = ops.shape(update)[2]
    targets = ops.cast(index, "int32") + ops.arange(length, dtype="int32")  # [T]
    # placement[s, t] = 1 where cache row s receives update row t.
    placement = ops.cast(ops.equal(ops.expand_dims(positions, 1), ops.expand_dims(targets, 0)),
                         cache.dtype)  # [max_length, T]
    placed = ops.einsum("st,bhtd->bhsd", placement, update)  # [batch, heads, max_length, head_size]
    written = ops.reshape(ops.sum(placement, axis=1), (1, 1, -1, 1))  # [1, 1, max_length, 1]
    return ops.where(written > 0, placed, cache)


def _written_out_softmax(scores):
    """The softmax over the last axis (the keys) as exp, max and sum ops."""
    exp = ops.exp(scores - ops.max(scores, axis=-1, keepdims=True))  # as scores
    return exp / ops.sum(exp, axis=-1, keepdims=True)


def _softmax_over_keys(scores):
    """`ops.softmax(scores, axis=-1)`, written out where the keys axis has one position.

    Keras warns about a softmax over an axis of size 1 ("Did you mean to use a sigmoid
    instead?"); here that is a model called on a one-token target or source, such as the
    first step of a decoding loop written around `model([source, target])`, and every
    weight is 1 either way (exp(0) / exp(0), exactly)."""
    if scores.shape[-1] == 1:
        return _written_out_softmax(scores)
    return ops.softmax(scores, axis=-1)


def sublayer_initializer(identifier):
    """What to pass as the initializer of one sub-layer's weights.

    Sub-layers must not share one initializer object: an unseeded Keras
    initializer draws its seed once, when it is made, so a shared one would
    give every same-shaped kernel the same values. A Keras initializer is
    therefore turned into its config (`keras.initializers.serialize`), from
    which the sub-layer makes its own (`keras.initializers.get`); names and
    configs are passed as they are. With the default names this is exactly
    what the layers did before they took initializer arguments (each `Dense`
    makes its initializer, drawing its seed from the global RNG when it is
    made), so `keras.utils.set_random_seed(s)` gives the same weights. A
    seeded initializer gives each sub-layer the same seed (as in
    `keras.layers.MultiHeadAttention`); plain functions are shared.

    Args:
        identifier: a name, a config dict, a `keras.initializers.Initializer`
            or a function `(shape, dtype) -> tensor`.

    Returns:
        A name, a config dict or the function.
    """
    if isinstance(identifier, keras.initializers.Initializer):
        return keras.initializers.serialize(identifier)
    return identifier


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, `MultiHead(Q, K, V) = Concat(head_1..head_h) W^O`.

    Each head computes `softmax(Q K^T / sqrt(d_k) + M) V` (paper eq. 1) on its
    own learned projections, `d_k = d_v = d_model / h`. Illegal connections
    (padding, the causal future) get `NEG_INF` before the softmax; an optional
    additive bias `M` (the survey's structure-aware attention) is added to the
    scaled logits.

    Args:
        num_heads: h.
        d_model: model width; must be divisible by `num_heads`.
        dropout: dropout rate on the attention weights (paper: none).
        use_bias: whether the Q/K/V/O projections have biases.
        kernel_initializer: initializer of the Q/K/V/O kernels (a name, a
            config or a `keras.initializers.Initializer`; each projection
            gets its own copy, see `sublayer_initializer`).
        bias_initializer: initializer of their biases.

    Call arguments:
        query: `[batch, T_q, d_model]`.
        value: `[batch, T_k, d_model]`, keys and values come from it
            (the decoder states in self-attention, the encoder output in
            cross-attention); None (or `query` itself) for self-attention.
            Ignored when a static `cache` is given.
        attention_mask: boolean, broadcastable to `[batch, T_q, T_k]`;
            True where attending is allowed.
        attention_bias: float, broadcastable to `[batch, heads, T_q, T_k]`,
            added to the scaled logits (survey Eq. 53).
        attention_scale: float, broadcastable to `[batch, heads, T_q, T_k]`,
            multiplying the scaled logits before the bias (survey Eq. 54).
        cache: `(key, value)`, each `[batch, heads, S, head_size]` (heads
            first: attention reads the cache as it is stored, with no
            transpose of the whole buffer per decoding step).
            With `cache_index=None` it is a static cache: precomputed keys and
            values (cross-attention, computed once per source by
            `compute_key_value`); it may have fewer rows than `query`, one
            per `m` consecutive query rows (one per sentence, shared by its
            `m` beams, which attend as `m * T_q` queries of that row). With
            `cache_index` it is a self-attention
            cache of `S = max_length` slots: this call's keys/values are
            written at `cache_index ...`, and the queries attend causally to
            slots `<= cache_index + t`.
        cache_index: int32 scalar, the position of the first query.
        grow_cache: with `cache_index`, the cache holds exactly the
            `cache_index` positions before this call's (`S = cache_index`,
            starting from `S = 0`), and this call's keys/values are appended
            (concatenated) instead of written into preallocated slots: a
            decoding step then costs in proportion to its position, not to
            the buffer. Its shape changes every step (a TensorFlow graph
            without XLA, or eager). Same results as the preallocated cache.
        small_kernels: with a cache and one query position (a decoding
            step), choose per call between oneDNN's batched matmuls and
            broadcast products by the size of the product (`SMALL_ATTENTION`;
            see `_attend`): for a TensorFlow graph without XLA, where a
            step's batch shrinks as sentences end. Same results up to float
            rounding. `"always"`: the broadcast products with no choice (a
            caller that knows every product is at most `SMALL_ATTENTION`:
            the same kernels, without a `cond` in the step).
        kernels: None, or the `StepKernels` of a decoding step (a cache and
            one query position per row): the product of the projections of
            2-D queries and values, as `apply_per_token` takes it; the
            attention's products where it would use einsums (products larger
            than `SMALL_ATTENTION` with `small_kernels`, or without it), the
            softmax then written out; its transposes (see `_attend`).
        training: enables dropout.

    Returns:
        `[batch, T_q, d_model]`, plus the updated `(key, value)` cache when a
        cache is given. Under a mixed policy (`dtype="mixed_bfloat16"`) the
        weights are float32, the output is in the compute dtype, and the
        scores and softmax are computed in float32.

    `compute_output_shape(query_shape, value_shape, cache_shape)` follows the
    call: `query_shape[:-1] + (d_model,)`, and with a cache the pair
    `(output_shape, cache_shape)` (the updated cache has the given cache's
    shape).

    Fused projections (off by default): with the attribute
    `fuse_projections = True` set on a layer before it is traced, self-attention
    (`value` None or the same tensor as `query`) without a cache computes Q, K
    and V with one matmul against `[W^Q | W^K | W^V]` (the three kernels
    concatenated at call time) and cross-attention K and V with one against
    `[W^K | W^V]`; the weights stay three `Dense` layers, so checkpoints are
    the same either way, and so are the results (up to float rounding; cached
    decoding always projects separately). Off because it measured no faster
    on CPU (`benchmarks/train_speed.py --variants ...,ours-fused`,
    docs/lab-notebook): oneDNN runs the three matmuls as fast as the one, and
    the concatenation costs a copy of the kernels per step.

    Example:
        >>> mha = MultiHeadAttention(num_heads=8, d_model=512)
        >>> y = mha(x, x, attention_mask=mask)  # x: [2, 10, 512]
    """

    fuse_projections = False

    def __init__(self, num_heads, d_model, dropout=0.0, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} does not divide d_model={d_model}")
        self.num_heads = num_heads
        self.d_model = d_model
        self.dropout = dropout
        self.use_bias = use_bias
        # Kept as given and only resolved in `build`, one copy per projection:
        # resolving a random initializer here would draw a seed from the
        # global RNG and shift the seeds of every weight made after it.
        self.kernel_initializer = kernel_initializer
        self.bias_initializer = bias_initializer
        self.head_size = d_model // num_heads

    def build(self, query_shape, value_shape=None):
        def dense(name):
            return keras.layers.Dense(self.d_model, use_bias=self.use_bias,
                                      kernel_initializer=sublayer_initializer(self.kernel_initializer),
                                      bias_initializer=sublayer_initializer(self.bias_initializer),
                                      name=name, dtype=self.dtype_policy)

        self.query_dense = dense("query")
        self.key_dense = dense("key")
        self.value_dense = dense("value")
        self.output_dense = dense("output")
        feature_shape = (None, None, self.d_model)
        for layer in (self.query_dense, self.key_dense, self.value_dense, self.output_dense):
            layer.build(feature_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def split_heads(self, x):
        """`[batch, T, d_model]` (or `[batch, d_model]`, one position per row) ->
        `[batch, heads, T, head_size]`."""
        if len(x.shape) == 2 or x.shape[1] == 1:  # one position (a decoding step): the transpose is a reshape
            return ops.reshape(x, (-1, self.num_heads, 1, self.head_size))  # [batch, heads, 1, head_size]
        x = ops.reshape(x, leading_shape(x) + (self.num_heads, self.head_size))  # [batch, T, heads, head_size]
        return ops.transpose(x, (0, 2, 1, 3))  # [batch, heads, T, head_size]

    def project(self, x, layers, fused, matmul=None):
        """`[layer(x) for layer in layers]` (each `[batch, T, d_model]`); with `fused`,
        one matmul of `x` against the layers' kernels side by side, split back
        (`matmul`: see `apply_per_token`)."""
        if not fused:
            return [apply_per_token(layer, x, matmul) for layer in layers]
        kernel = ops.concatenate([layer.kernel for layer in layers], axis=-1)  # [d_model, n * d_model]
        y = ops.matmul(x, kernel)  # [batch, T, n * d_model]
        if self.use_bias:
            y = y + ops.concatenate([layer.bias for layer in layers], axis=-1)
        return ops.split(y, len(layers), axis=-1)

    def compute_key_value(self, value, fused=False, matmul=None):
        """Projects `value` [batch, T, d_model] to the `(key, value)` cache, each [batch, heads, T, head_size]."""
        k, v = self.project(value, (self.key_dense, self.value_dense), fused, matmul)
        return self.split_heads(k), self.split_heads(v)

    def call(self, query, value=None, attention_mask=None, attention_bias=None,
             cache=None, cache_index=None, training=None, attention_scale=None, grow_cache=False,
             small_kernels=False, kernels=None):
        kernels = kernels or LAYER_KERNELS
        if cache is not None and cache_index is None:
            return self._attend_static_cache(query, cache, attention_mask, attention_bias,
                                             attention_scale, training, small_kernels, kernels)
        self_attention = value is None or value is query
        flat = len(query.shape) == 2  # [rows, d_model]: one position per row (a cached decoding step)
        if cache is None and self_attention and self.fuse_projections:  # whole sequences
            q, k, v = (self.split_heads(x) for x in self.project(
                query, (self.query_dense, self.key_dense, self.value_dense), fused=True))
        else:
            q = self.split_heads(apply_per_token(self.query_dense, query,
                                                 kernels.matmul))  # [batch, heads, T_q, head_size]
        if cache is None:
            if not (self_attention and self.fuse_projections):
                k, v = self.compute_key_value(query if value is None else value,
                                              fused=self.fuse_projections)  # [batch, heads, T_k, head_size]
        else:
            new_k, new_v = self.compute_key_value(query if value is None else value, matmul=kernels.matmul)
            if grow_cache:  # the cache holds positions 0 .. cache_index - 1 exactly
                k = ops.concatenate([cache[0], new_k], axis=2)  # [batch, heads, cache_index + T, head_size]
                v = ops.concatenate([cache[1], new_v], axis=2)
            else:
                k = write_cache(cache[0], new_k, cache_index)  # [batch, heads, max_length, head_size]
                v = write_cache(cache[1], new_v, cache_index)
            if not (grow_cache and (flat or query.shape[1] == 1)):  # one query at the end sees every slot
                # Causal mask over the cache: query t (absolute position
                # cache_index + t) sees slots <= cache_index + t.
                slots = ops.arange(ops.shape(k)[2], dtype="int32")  # [slots]
                query_positions = ops.cast(cache_index, "int32") + ops.arange(ops.shape(q)[2], dtype="int32")
                causal = ops.expand_dims(ops.expand_dims(slots, 0) <= ops.expand_dims(query_positions, 1),
                                         0)  # [1, T_q, slots]
                attention_mask = causal if attention_mask is None else ops.logical_and(attention_mask, causal)

        step = cache is not None and q.shape[2] == 1  # one query per row: a decoding step
        output = self._attend(q, k, v, attention_mask, attention_bias, attention_scale, training,
                              small_kernels if step else False, flat=flat,
                              kernels=kernels if step else LAYER_KERNELS)
        if cache is None:
            return output
        return output, (k, v)

    def _attend_static_cache(self, query, cache, attention_mask, attention_bias, attention_scale, training,
                             small_kernels, kernels=LAYER_KERNELS):
        """Attention over precomputed `(key, value)` `[rows, heads, S, head_size]`
        (cross-attention during decoding), where `query` `[rows * m, T, d_model]`
        may hold `m` query rows per cache row (the beams of one sentence: the
        keys and values are kept once per sentence, and its beams' queries
        attend to them together, as `[rows, m * T]` queries); masks and biases
        have one row per cache row. Returns `(output [rows * m, T, d_model], cache)`.
        `kernels` (see `call`) apply to one position per row."""
        k, v = cache
        if len(query.shape) == 2:  # [rows * m, d_model]: one position per row (a decoding step)
            if attention_bias is not None or attention_scale is not None:
                raise ValueError("a static cache with one position per query row takes no attention_bias "
                                 "or attention_scale (they have a heads axis; the queries here are beams-first)")
            q = apply_per_token(self.query_dense, query, kernels.matmul)  # [rows * m, d_model]
            # [rows, m, heads, head_size]: the beams' queries of each row, query-major (no transpose)
            q = ops.reshape(q, (ops.shape(k)[0], -1, self.num_heads, self.head_size))
            output = self._attend(q, k, v, attention_mask, None, None, training, small_kernels, flat=True,
                                  query_major=True, kernels=kernels)
            return output, cache  # [rows * m, d_model]
        small = small_kernels if query.shape[1] == 1 else False  # a decoding step: m beams' queries per row
        shape = ops.shape(query)
        query = ops.reshape(query, (ops.shape(k)[0], -1, self.d_model))  # [rows, m * T, d_model]
        q = self.split_heads(apply_per_token(self.query_dense, query))  # [rows, heads, m * T, head_size]
        output = self._attend(q, k, v, attention_mask, attention_bias, attention_scale, training, small)
        return ops.reshape(output, shape), cache  # [rows * m, T, d_model]

    def _attend(self, q, k, v, attention_mask, attention_bias, attention_scale, training, small=False,
                flat=False, query_major=False, kernels=LAYER_KERNELS):
        """softmax(q k^T / sqrt(d_k) (* scale) + bias, masked) v, then the output projection.

        `q` is `[batch, heads, T_q, head_size]`, or with `query_major`
        `[batch, T_q, heads, head_size]` (no bias or scale: the masks then
        broadcast over `[batch, T_q, heads, T_k]`); the output is
        `[batch, T_q, d_model]`, or with `flat` `[batch * T_q, d_model]`.

        With `small` (a decoding step with few queries per row, in a graph
        whose shapes change per call) a call whose product
        `q * k` has at most `SMALL_ATTENTION` entries computes the two products
        as broadcast multiplies and sums and writes the softmax out (exp, max,
        sum): on such shapes TensorFlow's oneDNN BatchMatMul, Einsum and
        Softmax kernels cost ~35-45 us a call each, over half of a batch-1
        decoding step; on larger ones they are the faster (docs/lab-notebook).
        The same formulas, so the same numbers up to float rounding.

        With `kernels.batch_matmul`, the einsums of the other products are
        that function's products (plus a transpose of the output when
        `T_q > 1`) and their softmax is written out too; `kernels.transpose`
        takes the transposes: in TensorFlow's plain-graph loop at batch 32,
        oneDNN's Einsum, BatchMatMul, Softmax and Transpose kernels cost
        1.3-2.7x what `Searcher`'s Eigen ones cost on these shapes
        (docs/lab-notebook, serving speed part 21).
        """
        batch_matmul = kernels.batch_matmul
        transpose = kernels.transpose or ops.transpose

        def context(few):
            # Query-major products broadcast in q's layout (no transpose); oneDNN's
            # batched matmuls take heads first.
            major = query_major and few
            batched = not few and batch_matmul is not None  # the caller's products in place of einsums
            heads_axis = 2 if major else 1  # of the scores
            if major:
                scores = ops.sum(ops.expand_dims(q, 3) * ops.expand_dims(k, 1), axis=-1)  # [batch, T_q, heads, T_k]
            else:
                heads_first = transpose(q, (0, 2, 1, 3)) if query_major else q  # [batch, heads, T_q, head_size]
                if batched:
                    scores = batch_matmul(heads_first, k, transpose_y=True)  # [batch, heads, T_q, T_k]
                else:
                    scores = self._products(heads_first, k, few)  # [batch, heads, T_q, T_k]
            # Scores in float32 so that NEG_INF and the softmax are exact under
            # mixed precision.
            scores = ops.cast(scores, "float32") / math.sqrt(self.head_size)
            if attention_scale is not None:
                scores = scores * ops.cast(attention_scale, "float32")
            if attention_bias is not None:
                scores = scores + ops.cast(attention_bias, "float32")
            if attention_mask is not None:
                mask = ops.expand_dims(ops.cast(attention_mask, "bool"), heads_axis)  # heads axis of 1
                scores = ops.where(mask, scores, NEG_INF)
            weights = _written_out_softmax(scores) if few or batched else _softmax_over_keys(scores)
            weights = self.dropout_layer(ops.cast(weights, self.compute_dtype), training=training)
            if batched:
                out = batch_matmul(weights, v)  # [batch, heads, T_q, head_size]
                if weights.shape[2] != 1:  # (one query: the same layout)
                    out = transpose(out, (0, 2, 1, 3))  # [batch, T_q, heads, head_size]
            elif not few:
                out = ops.einsum("bhqk,bhkd->bqhd", weights, v)  # [batch, T_q, heads, head_size]
            elif major:
                out = ops.sum(ops.expand_dims(weights, 4) * ops.expand_dims(v, 1),
                              axis=3)  # [batch, T_q, heads, head_size]
            elif q.shape[2] == 1:  # (heads-first q)
                out = ops.sum(ops.expand_dims(ops.squeeze(weights, 2), 3) * v, axis=2)  # [batch, heads, head_size]
            else:
                out = ops.sum(ops.expand_dims(weights, 4) * ops.expand_dims(v, 2),
                              axis=3)  # [batch, heads, T_q, head_size]
                out = transpose(out, (0, 2, 1, 3))  # [batch, T_q, heads, head_size]
            if flat:
                return ops.reshape(out, (-1, self.d_model))  # [batch * T_q, d_model]
            if not query_major and q.shape[2] == 1:
                return ops.reshape(out, (-1, 1, self.d_model))  # [batch, 1, d_model]
            return ops.reshape(out, leading_shape(out)[:-1] + (self.d_model,))  # [batch, T_q, d_model]

        if small == "always":
            attended = context(True)
        elif small:
            shape_q, shape_k = ops.shape(q), ops.shape(k)
            size = shape_q[0] * self.num_heads * shape_q[1 if query_major else 2] * shape_k[2] * self.head_size
            attended = ops.cond(size <= SMALL_ATTENTION, lambda: context(True), lambda: context(False))
        else:
            attended = context(False)
        return apply_per_token(self.output_dense, attended, kernels.matmul)

    def attention_weights(self, query, value, attention_mask=None):
        """The attention weights of whole sequences, `softmax(Q K^T / sqrt(d_k))` masked as
        `call` masks them (no bias, scale or dropout): what each query position attends to,
        for alignments (`keras_transformer.inference.alignment`).

        Args:
            query: `[batch, T_q, d_model]`.
            value: `[batch, T_k, d_model]` (the keys come from it).
            attention_mask: bool, broadcastable to `[batch, T_q, T_k]`; False is never attended.

        Returns:
            float32 `[batch, heads, T_q, T_k]`, each row summing to 1.
        """
        q = self.split_heads(apply_per_token(self.query_dense, query))  # [batch, heads, T_q, head_size]
        k, _ = self.compute_key_value(value)  # [batch, heads, T_k, head_size]
        scores = ops.cast(self._products(q, k, False), "float32") / math.sqrt(self.head_size)
        if attention_mask is not None:
            scores = ops.where(ops.expand_dims(ops.cast(attention_mask, "bool"), 1), scores, NEG_INF)
        return _softmax_over_keys(scores)  # [batch, heads, T_q, T_k]

    @staticmethod
    def _products(q, k, few):
        """`q k^T` `[batch, heads, T_q, T_k]` from q `[batch, heads, T_q, head_size]` and
        k `[batch, heads, T_k, head_size]`: an einsum, or with `few` a broadcast product."""
        if not few:
            return ops.einsum("bhqd,bhkd->bhqk", q, k)
        if q.shape[2] == 1:  # q broadcasts over the keys
            return ops.expand_dims(ops.sum(q * k, axis=-1), 2)  # [batch, heads, 1, T_k]
        return ops.sum(ops.expand_dims(q, 3) * ops.expand_dims(k, 2), axis=-1)  # [batch, heads, T_q, T_k]

    def compute_output_shape(self, query_shape, value_shape=None, cache_shape=None):
        output_shape = tuple(query_shape[:-1]) + (self.d_model,)  # [batch, T_q, d_model]
        if cache_shape is None:
            return output_shape
        return output_shape, tuple(tuple(shape) for shape in cache_shape)

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, d_model=self.d_model,
                      dropout=self.dropout, use_bias=self.use_bias,
                      kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
                      bias_initializer=keras.initializers.serialize(self.bias_initializer))
        return config
