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


def apply_per_token(layer, x):
    """`layer(x)` for a `Dense` `layer` and `x` `[..., d]`, as one 2-D matmul.

    Keras's `Dense` runs a rank-3 input through `tf.tensordot`, which wraps
    its matmul in ~12 shape nodes (Shape, GatherV2, Prod, Pack, ConcatV2,
    Reshape); a decoding step makes 17 such projections, and a TensorFlow
    `while_loop` pays for every node of its body on every step. Flattening
    to `[tokens, d]` and back is two reshapes (constant shapes when at most
    one leading size is dynamic, as in a decoding step `[rows, 1, d]`). Same
    matmul on the same rows, so the same numbers.
    """
    if len(x.shape) == 2:
        return layer(x)
    y = layer(ops.reshape(x, (-1, x.shape[-1])))  # [tokens, units]
    return ops.reshape(y, leading_shape(x) + (y.shape[-1],))  # [..., units]
