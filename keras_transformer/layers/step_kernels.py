"""The kernels of a cached decoding step that its caller may choose (`StepKernels`)."""

from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class StepKernels:
    """Products and transposes of a cached decoding step (one position per row) computed
    by a caller's kernels instead of the layers' `keras.ops`: a backend's kernels of
    choice for the shapes of a step (e.g. `Searcher`'s for TensorFlow's plain-graph
    loops, which keep them out of oneDNN's graph rewrites). A field left None keeps the
    layers' own. The same formulas, so the same numbers up to float rounding.

    Args:
        matmul: `(x [rows, d], kernel [d, units]) -> [rows, units]`: the product of
            every projection (`apply_per_token`), the output projection's too.
        batch_matmul: `(x, y, transpose_y=False) -> x @ y` (`x @ y^T` with
            `transpose_y`) over the two leading axes of rank-4 tensors: the
            attentions' two products where they would be einsums (not the
            broadcast products of `small_kernels`), their softmax then written
            out (exp, max, sum) as the broadcast products have it.
        transpose: `(x, axes) -> x` permuted as `keras.ops.transpose(x, axes)`:
            the attentions' transposes of heads and queries.

    Example:
        >>> kernels = StepKernels(matmul=lambda x, kernel: keras.ops.matmul(x, kernel))
        >>> logits, caches = model.decode(ids, None, mask, start_position=t, self_attention_caches=caches,
        ...                               cross_attention_caches=cross, kernels=kernels)
    """

    matmul: Callable | None = None
    batch_matmul: Callable | None = None
    transpose: Callable | None = None


# The layers' own kernels (`keras.ops`) everywhere.
LAYER_KERNELS = StepKernels()
