"""Position-wise projections as 2-D matmuls, and the reshape shapes they need."""

from __future__ import annotations

from keras import ops


def leading_shape(x):
    """`x`'s shape without its last axis, as `reshape` takes it: static sizes
    as ints and at most one dynamic size as -1 (a constant shape, no
    `Shape`/`StridedSlice`/`Pack` nodes), the others read from `ops.shape`."""
    dims = list(x.shape[:-1])
    unknown = [i for i, d in enumerate(dims) if d is None]
    for i in unknown[1:]:
        dims[i] = ops.shape(x)[i]
    if unknown:
        dims[unknown[0]] = -1
    return tuple(dims)


def apply_per_token(layer, x, matmul=None):
    """`layer(x)` for a `Dense` `layer` and `x` `[..., d]`, as one 2-D matmul.

    Keras's `Dense` runs a rank-3 input through `tf.tensordot`, which wraps
    its matmul in ~12 shape nodes (Shape, GatherV2, Prod, Pack, ConcatV2,
    Reshape); a decoding step makes 17 such projections, and a TensorFlow
    `while_loop` pays for every node of its body on every step. Flattening
    to `[tokens, d]` and back is two reshapes (constant shapes when at most
    one leading size is dynamic, as in a decoding step `[rows, 1, d]`). Same
    matmul on the same rows, so the same numbers.

    `matmul`: None, or a function `(x [rows, d], kernel [d, units]) -> [rows,
    units]` that computes the product of a 2-D `x` (one position per row: a
    decoding step) in place of the layer's own, the layer's bias and
    activation applied after it as `Dense` applies them (a backend's kernel
    of choice for small products, e.g. `Searcher`'s for TensorFlow's
    small-request loop).
    """
    if len(x.shape) == 2:
        return layer(x) if matmul is None else dense_with(layer, x, matmul)
    y = layer(ops.reshape(x, (-1, x.shape[-1])))  # [tokens, units]
    return ops.reshape(y, leading_shape(x) + (y.shape[-1],))  # [..., units]


def dense_with(layer, x, matmul):
    """What `Dense` `layer` computes on a 2-D `x` `[rows, d]`, its product taken
    by `matmul(x, kernel)`: `activation(matmul(x, kernel) + bias)` in `x`'s dtype."""
    y = matmul(x, ops.cast(layer.kernel, x.dtype))  # [rows, units]
    if layer.use_bias:
        y = ops.add(y, ops.cast(layer.bias, x.dtype))
    return layer.activation(y)
