"""The search's tensor helpers in ``keras.ops``: beams flattened, tiled and gathered, the
blockwise top-k, the length penalty, the buffer's length, and whether a value is a python
one or a tensor."""

import warnings

import keras
import numpy as np
from keras import ops



# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
def length_penalty(length, alpha):
    """GNMT length penalty ``((5 + length) / 6) ** alpha``.

    Args:
        length: int or float tensor (any shape) or python number: the number
            of generated tokens, EOS included.
        alpha: python float or float scalar tensor; 0 disables the penalty.

    Returns:
        float32 tensor with the shape of ``length``.
    """
    length = ops.cast(length, "float32")
    alpha = ops.cast(alpha, "float32")
    return ops.power((5.0 + length) / 6.0, alpha)


def flatten_beams(x):
    """Merges the batch and beam dimensions.

    Args:
        x: tensor ``[batch, beam, ...]``.

    Returns:
        tensor ``[batch * beam, ...]``, row ``b * beam + k`` = ``x[b, k]``.
    """
    shape = ops.shape(x)
    return ops.reshape(x, (-1,) + tuple(shape[2:]))  # [batch * beam, ...]


def unflatten_beams(x, beam_size):
    """Splits the leading ``batch * beam`` dimension (inverse of `flatten_beams`).

    Args:
        x: tensor ``[batch * beam, ...]`` (batch-major).
        beam_size: python int, the number of beams.

    Returns:
        tensor ``[batch, beam, ...]``.
    """
    shape = ops.shape(x)
    return ops.reshape(x, (-1, beam_size) + tuple(shape[1:]))  # [batch, beam, ...]


def expand_to_beams(x, beam_size):
    """Repeats every row ``beam_size`` times: ``[batch, ...] -> [batch, beam, ...]``.

    Args:
        x: tensor ``[batch, ...]``.
        beam_size: python int.

    Returns:
        tensor ``[batch, beam, ...]`` with ``out[b, k] = x[b]``.
    """
    x = ops.expand_dims(x, 1)  # [batch, 1, ...]
    reps = [1, beam_size] + [1] * (len(x.shape) - 2)
    return ops.tile(x, reps)  # [batch, beam, ...]


def tile_beams(x, beam_size):
    """Tiles a batch-major tensor to ``[batch * beam, ...]`` (row ``b * beam + k`` = ``x[b]``).

    Args:
        x: tensor ``[batch, ...]``.
        beam_size: python int.

    Returns:
        tensor ``[batch * beam, ...]``.
    """
    return flatten_beams(expand_to_beams(x, beam_size))  # [batch * beam, ...]


def gather_beams(x, beam_indices):
    """Selects beams per sentence: ``out[b, j] = x[b, beam_indices[b, j]]``.

    Implemented as one ``take`` (GATHER) on the flattened tensor with
    batch offsets, which converts to a LiteRT builtin and XLA.

    Args:
        x: tensor ``[batch, beam, ...]``.
        beam_indices: int32 tensor ``[batch, new_beam]`` with values in
            ``[0, beam)``.

    Returns:
        tensor ``[batch, new_beam, ...]``.
    """
    beam_indices = ops.cast(beam_indices, "int32")
    num_beams = ops.shape(x)[1]
    batch = ops.shape(beam_indices)[0]
    offsets = ops.arange(batch, dtype="int32")[:, None] * num_beams  # [batch, 1]
    flat_x = flatten_beams(x)  # [batch * beam, ...]
    return ops.take(flat_x, beam_indices + offsets, axis=0)  # [batch, new_beam, ...]


def keras_gather(x, indices, batch_dims=0):
    """The search's gathers in ``keras.ops``, with ``tf.gather(x, indices,
    axis=batch_dims, batch_dims=batch_dims)``'s meaning (what `beam_search`
    takes as ``gather``):

    * ``batch_dims=0``: rows of ``x`` ``[n, ...]`` by ``indices`` (any shape);
    * ``batch_dims=1``: ``out[b, j] = x[b, indices[b, j]]``: `gather_beams`.

    Runs on every backend and converts to LiteRT's GATHER; a TensorFlow graph
    may pass ``tf.gather`` instead (one node per call, where ``ops.take``
    adds its negative-index fix and `gather_beams` its offsets: a while
    loop pays for every node on every step).
    """
    if batch_dims == 0:
        return ops.take(x, indices, axis=0)
    if batch_dims == 1:
        return gather_beams(x, indices)
    raise ValueError(f"keras_gather takes batch_dims 0 or 1, got {batch_dims!r}")


# Smallest and largest block of `top_k_blockwise`, and how many blocks per wanted entry
# it needs before it beats one `top_k` over the whole row.
_MIN_BLOCK, _MAX_BLOCK, _MIN_BLOCKS_PER_ENTRY = 16, 256, 2


def _block_size(vocab, bound):
    """`top_k_blockwise`'s block for a row of `vocab` entries and up to `bound` wanted:
    a power of two near ``sqrt(vocab / bound)``, within [16, 256]; where that does not
    divide the row, the divisor of `vocab` in [16, 256] nearest to it, within a factor
    of two, so that the row is cut into blocks without a padded copy of it (10,000
    pieces: 40, not 32 and 16 padding entries; the padded copy of a batch-32 step's
    ``[rows, 10,000]`` log-probabilities was 7% of its traced kernel time). Any block
    gives the same values and indices."""
    power = 2 ** int(round(np.log2(max(np.sqrt(vocab / bound), 1.0))))
    power = min(max(power, _MIN_BLOCK), _MAX_BLOCK)
    if vocab % power == 0:
        return power
    divisors = [d for d in range(max(_MIN_BLOCK, power // 2), min(_MAX_BLOCK, 2 * power) + 1) if vocab % d == 0]
    if not divisors:
        return power
    return min(divisors, key=lambda d: (abs(np.log(d / power)), -d))


def top_k_blockwise(x, k, block_size=None, gather=keras_gather, max_k=None):
    """``ops.top_k(x, k)`` over the last axis of a float ``[rows, V]``, exactly (same
    values, same indices, ties to the lower index), in two small passes instead of
    one ``top_k`` over ``V``.

    The row is cut into blocks of ``block_size`` entries; the ``k`` blocks with
    the largest maxima hold the row's ``k`` largest entries (any entry outside
    them is beaten by those ``k`` maxima, and on a tie a block of lower index
    wins, as does its entry), so ``top_k`` over those ``k * block_size``
    candidates, in their original order, is the row's ``top_k``. One pass of
    ``max`` over the row replaces the per-entry comparisons of ``top_k`` with a
    heap: on ``[128, 8000]``, k 8, 3.3 -> 0.8 ms in a TensorFlow graph and
    1.6 -> 0.6 ms under XLA on this 2-core CPU (docs/lab-notebook). Plain
    ``top_k`` where the row is too short for blocks to help.

    Args:
        x: float ``[rows, V]``, ``V`` static.
        k: python int, ``1 <= k <= V``, or (TensorFlow) an int32 scalar tensor
            with `max_k`.
        block_size: None (a power of two near ``sqrt(V / k)``, within
            [16, 256], or the divisor of ``V`` nearest to it: `_block_size`) or a
            python int.
        gather: `keras_gather` or a function with its meaning (``tf.gather``).
        max_k: with a tensor `k`, the largest it may be (python int): the
            blocks are sized and counted for it, which is exact for any
            smaller ``k`` (the ``k`` best blocks still hold the ``k`` best).

    Returns:
        ``(values [rows, k], indices int32 [rows, k])``, as ``ops.top_k``.
    """
    vocab = x.shape[-1]
    bound = k if max_k is None else max_k  # python int
    if block_size is None and vocab is not None:
        block_size = _block_size(vocab, bound)
    if vocab is None or -(-vocab // block_size) < _MIN_BLOCKS_PER_ENTRY * bound:
        values, indices = ops.top_k(x, k)
        return values, ops.cast(indices, "int32")
    num_blocks = -(-vocab // block_size)
    padding = num_blocks * block_size - vocab
    if padding:  # the last block filled with the lowest float: never above a real entry
        x = ops.pad(x, [[0, 0], [0, padding]], constant_values=float(np.finfo(np.float32).min))
    blocks = ops.reshape(x, (-1, num_blocks, block_size))  # [rows, blocks, block]
    _, best = ops.top_k(ops.max(blocks, axis=2), k)  # [rows, k]
    best = ops.sort(ops.cast(best, "int32"), axis=-1)  # [rows, k]: candidates in index order
    candidates = gather(blocks, best, 1)  # [rows, k, block]
    values, position = ops.top_k(ops.reshape(candidates, (-1, k * block_size)), k)  # [rows, k] x2
    position = ops.cast(position, "int32")
    block = gather(best, position // block_size, 1)  # [rows, k]
    return values, block * block_size + position % block_size


def _infer_max_decode_length(max_lengths):
    """``max(max_lengths)`` as a python int; only for concrete (eager/numpy) values."""
    try:
        if isinstance(max_lengths, (int, np.integer, list, tuple, np.ndarray)):
            values = np.asarray(max_lengths)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values = np.asarray(ops.convert_to_numpy(max_lengths))
    except Exception as error:  # symbolic tensor (tf.function graph / jit tracer)
        raise ValueError(
            "beam_search: `max_decode_length` (a static python int, the buffer "
            "size) must be given when `max_lengths` is not a concrete value "
            "(e.g. inside tf.function or jax.jit)."
        ) from error
    return max(int(values.max()) if values.size else 1, 1)


def _buffer_length(max_decode_length, max_lengths):
    """`beam_search`'s ``max_decode_length``, checked: a python int >= 1 (inferred from
    concrete `max_lengths` when None), or an int32 scalar tensor at least 1."""
    if max_decode_length is None:
        max_decode_length = _infer_max_decode_length(max_lengths)
    if _is_int(max_decode_length):
        if max_decode_length < 1:
            raise ValueError(f"max_decode_length must be >= 1, got {max_decode_length}")
        return int(max_decode_length)
    # a tensor: buffers sized per call (TensorFlow graphs without XLA)
    return ops.maximum(ops.cast(max_decode_length, "int32"), 1)


def _is_int(value):
    """Whether `value` is a python (or NumPy) integer, not a tensor."""
    return isinstance(value, (int, np.integer))


def _is_python(value):
    """Whether `value` is a python (or NumPy) value, not a tensor (a run-time option)."""
    return not ops.is_tensor(value)


def gather_rows(structure, rows, gather=keras_gather):
    """Rows of every leaf of a nested structure: ``out = x[rows]`` along the leading
    axis (one ``gather(x, rows, 0)`` per leaf). The search's one way to reorder a
    cache along beams, to keep some sentences of the state (``sentences``, the
    static cache), and to move them.

    Args:
        structure: nested structure of tensors, all with leading dimension ``n``
            (may be empty: ``{}``).
        rows: int32 ``[m]``, values in ``[0, n)``.
        gather: `keras_gather` or a function with its meaning (``tf.gather``).

    Returns:
        the structure with leaves ``[m, ...]``.
    """
    return keras.tree.map_structure(lambda x: gather(x, rows, 0), structure)


def _beam_rows(beam_indices, beam_size, sentences=None):
    """Flat ``[b * beam]`` row indices into a ``[batch * beam, ...]`` cache.

    Row ``i * new_beam + j`` of the result is ``s_i * beam_size + beam_indices[i, j]``
    with ``s_i = sentences[i]`` (or ``i``): the one gather that reorders a
    cache along beams, and with `sentences` also keeps only those sentences.

    Args:
        beam_indices: int32 ``[b, new_beam]``, values in ``[0, beam_size)``.
        beam_size: python int.
        sentences: None or int32 ``[b]``, the sentence of each row.
    """
    if sentences is None:
        sentences = ops.arange(ops.shape(beam_indices)[0], dtype="int32")  # [b]
    rows = sentences[:, None] * beam_size + ops.cast(beam_indices, "int32")  # [b, new_beam]
    return ops.reshape(rows, (-1,))  # [b * new_beam]
