"""Token-budget batches of sentence pairs, bucketed by length (paper, 5.1).

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately
25000 source tokens and 25000 target tokens."

Conventions (every batch element)::

    ((source_ids, target_input_ids), target_output_ids)

    source_ids        = tokens(source) + [EOS_ID]
    target_input_ids  = [BOS_ID] + tokens(target)      # decoder input
    target_output_ids = tokens(target) + [EOS_ID]      # labels, shifted by one

all int32 ``[batch, bucket_length]``, right-padded with ``PAD_ID``.  The two
target tensors have the same length; ``target_output_ids[:, i]`` is the label
of position ``i`` whose input is ``target_input_ids[:, i]``.

Shapes: the length of a pair is ``max(len(source_ids), len(target_ids))``; it
goes to the smallest bucket boundary ``>= length`` and *both* sides are padded
to that boundary.  A bucket of length ``L`` holds ``batch_tokens // L``
pairs (rounded down to a multiple of ``batch_multiple``), so every batch has
``batch_size * L <= batch_tokens`` (padded) tokens on each side, and there is
one shape per bucket: XLA compiles a handful of programs, not one per batch.
With ``drop_remainder=False`` the last batch of a bucket at the end of the data
may be smaller; with ``repeat=True`` that never happens.

Over-long pairs (``len(source_ids) > max_length`` or ``len(target_ids) >
max_length``) are dropped (``overlong="drop"``) or truncated
(``overlong="truncate"``: the source keeps its first ``max_length - 1``
tokens and its EOS; the target keeps its first ``max_length`` tokens, so
``target_output_ids`` then ends without EOS instead of teaching a false
sentence end).  ``count_overlong`` says how many that affects.

Syntax-aware models (``source_features``): the source of each pair is a
CoNLL-U sentence (``ParallelCorpus.annotated``), turned into pieces, tags
and tree distances by ``annotated.annotated_features`` (the ops the
exported model runs too), and the elements become::

    ((source_ids, target_input_ids, [source_tags], [source_distances]), target_output_ids)

with ``source_tags`` int32 ``[batch, L, len(tag_factors)]`` and
``source_distances`` int32 ``[batch, L, L]`` (0 on padding), in the order
``model.source_feature_names(config)`` gives.

Everything is TensorFlow ops without Python state, so the dataset can be
handed to ``strategy.experimental_distribute_dataset`` (batches are global).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf

from keras_transformer.constants import BOS_ID, EOS_ID, PAD_ID, TAG_PAD_ID
from keras_transformer.data.annotated import annotated_features
from keras_transformer.data.tokenizer import SubwordSampling, Tokenizer

OVERLONG_POLICIES = ("drop", "truncate")
# Sentences tokenized per call of the tokenizer op (vectorized map).
_TOKENIZE_BATCH = 256
# CoNLL-U sentences turned into features per call (their distance matrices are dense).
_ANNOTATE_BATCH = 64
SOURCE_FEATURES = ("source_tags", "source_distances")


def default_boundaries(max_length: int, min_length: int = 8) -> tuple[int, ...]:
    """Geometric bucket boundaries 8, 12, 16, 24, 32, 48, 64, ... up to ``max_length``.

    Powers of two and 1.5 times powers of two: at most ~1/3 of a batch is
    padding, and there are only ``~2 log2(max_length / min_length)`` shapes.

    Args:
        max_length: the longest sequence (the last boundary).
        min_length: the first boundary.

    Returns:
        Strictly increasing boundaries ending with ``max_length``.
    """
    if max_length < 1 or min_length < 1:
        raise ValueError(f"max_length={max_length} and min_length={min_length} must be >= 1")
    boundaries, power = [], 1
    while power < 2 * max_length:
        for b in (power, power * 3 // 2):
            if min_length <= b < max_length and (not boundaries or b > boundaries[-1]):
                boundaries.append(b)
        power *= 2
    return tuple(boundaries) + (max_length,)


def bucket_batch_sizes(boundaries: Sequence[int], batch_tokens: int,
                       batch_multiple: int = 1) -> tuple[int, ...]:
    """Pairs per batch of each bucket: the most that fit the token budget.

    Args:
        boundaries: padded length of each bucket.
        batch_tokens: budget of padded tokens per side (source, target).
        batch_multiple: round each size down to a multiple of this (e.g. the
            number of replicas, so every replica gets an equal share).

    Returns:
        ``(batch_tokens // L) // batch_multiple * batch_multiple`` per
        boundary ``L``.

    Raises:
        ValueError: a bucket would hold no pair.
    """
    if batch_multiple < 1:
        raise ValueError(f"batch_multiple={batch_multiple} must be >= 1")
    sizes = tuple((batch_tokens // length) // batch_multiple * batch_multiple for length in boundaries)
    if min(sizes) < 1:
        raise ValueError(
            f"batch_tokens={batch_tokens} cannot hold {batch_multiple} pair(s) of the longest bucket "
            f"(length {max(boundaries)}); need batch_tokens >= {batch_multiple * max(boundaries)}")
    return sizes


def _check_boundaries(boundaries: Sequence[int] | None, max_length: int) -> tuple[int, ...]:
    """Validates user boundaries; appends ``max_length`` if they stop short."""
    if max_length < 2:
        raise ValueError(f"max_length={max_length} must be >= 2 (a token plus EOS/BOS)")
    if boundaries is None:
        return default_boundaries(max_length)
    boundaries = tuple(int(b) for b in boundaries)
    if not boundaries or boundaries[0] < 1 or any(b >= c for b, c in zip(boundaries, boundaries[1:])):
        raise ValueError(f"boundaries={boundaries} must be positive and strictly increasing")
    if boundaries[-1] > max_length:
        raise ValueError(f"boundaries={boundaries} exceed max_length={max_length}")
    return boundaries if boundaries[-1] == max_length else boundaries + (max_length,)


def _tokenized_pairs(pairs: tf.data.Dataset, tokenizer: Tokenizer,
                     sampling: SubwordSampling | None) -> tf.data.Dataset:
    """(source, target) strings -> (source ids [n], target ids [m]), vectorized."""
    def tokenize(sources, targets):  # ragged [b, (n)], [b, (m)]
        return tokenizer.tokenize(sources, sampling), tokenizer.tokenize(targets, sampling)

    return (pairs.batch(_TOKENIZE_BATCH)
            .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
            .unbatch())


def _annotated_examples(pairs: tf.data.Dataset, tokenizer: Tokenizer, max_length: int, truncate: bool,
                        tag_factors: Sequence[str]) -> tf.data.Dataset:
    """(CoNLL-U, target) strings -> ({source_ids [n + 1] (with EOS), source_distances
    [n + 1, n + 1], source_tags [n + 1, k] (with tag factors)}, target ids [m])."""
    names = ("source_ids", "source_distances") + (("source_tags",) if tag_factors else ())

    def featurize(blocks, targets):
        features = annotated_features(blocks, tokenizer.fast, max_length, tuple(tag_factors), truncate=truncate)
        return {name: features[name] for name in names + ("source_lengths",)}, tokenizer.tokenize(targets)

    def trim(features, target):
        width = features["source_lengths"] + 1  # with EOS
        trimmed = {"source_ids": features["source_ids"][:width],
                   "source_distances": features["source_distances"][:width, :width]}
        if tag_factors:
            trimmed["source_tags"] = features["source_tags"][:width]
        return trimmed, target

    return (pairs.batch(_ANNOTATE_BATCH)
            .map(featurize, num_parallel_calls=tf.data.AUTOTUNE)
            .unbatch()
            .map(trim, num_parallel_calls=tf.data.AUTOTUNE))


def make_batches(pairs: tf.data.Dataset, tokenizer: Tokenizer, *, batch_tokens: int, max_length: int,
                 boundaries: Sequence[int] | None = None, overlong: str = "drop",
                 shuffle: bool = False, shuffle_buffer: int = 100_000, seed: int | None = None,
                 repeat: bool = False, drop_remainder: bool = False,
                 batch_multiple: int = 1, source_features: Sequence[str] = (),
                 tag_factors: Sequence[str] = (),
                 subword_sampling: SubwordSampling | None = None) -> tf.data.Dataset:
    """Tokenizes, bucket-batches and pads sentence pairs (see the module docstring).

    Args:
        pairs: ``(source, target)`` scalar ``tf.string`` pairs, e.g.
            ``ParallelCorpus.splits["train"]``.
        tokenizer: the shared ``Tokenizer``.
        batch_tokens: padded tokens per side per batch (paper: ~25,000).
        max_length: longest ``source_ids`` / ``target_*_ids`` (EOS/BOS
            included); the last bucket boundary.
        boundaries: padded lengths of the buckets; default
            ``default_boundaries(max_length)``.  ``max_length`` is appended
            if the last boundary is smaller.
        overlong: ``"drop"`` or ``"truncate"`` pairs longer than
            ``max_length``.
        shuffle: shuffle pairs (before bucketing) with a buffer of
            ``shuffle_buffer``, reshuffled every epoch.
        shuffle_buffer: pairs in the shuffle buffer.
        seed: shuffle seed (None: nondeterministic).
        repeat: repeat the pairs forever (training).
        drop_remainder: drop each bucket's final partial batch, making the
            batch dimension static too.
        batch_multiple: batch sizes are multiples of this (number of
            replicas under ``tf.distribute``, or 8 for tensor cores).
        source_features: for a syntax-aware model, its extra inputs
            (``model.source_feature_names(config)``: ``source_tags``,
            ``source_distances``); the sources are then CoNLL-U sentences.
        tag_factors: the tag factors of ``source_tags`` (``config.source_tags``).
        subword_sampling: sample a segmentation of both sides of every pair
            each time it is read (subword regularization, training only);
            None: the best segmentation.  A draw longer than ``max_length``
            is dropped or truncated as ``overlong`` says, for that epoch
            (``count_overlong`` counts the best segmentations).  Not with
            ``source_features`` (CoNLL-U words carry their own pieces).

    Returns:
        ``tf.data.Dataset`` of ``((source_ids, target_input_ids),
        target_output_ids)``, int32 ``[batch, bucket_length]`` each (the
        global batch under ``tf.distribute``).

    Raises:
        ValueError: bad ``overlong``, ``boundaries``, ``max_length`` or a
            ``batch_tokens`` too small for the longest bucket.

    Example:
        >>> train = make_batches(corpus.splits["train"], tokenizer, batch_tokens=25000,
        ...                      max_length=256, shuffle=True, seed=0, repeat=True)
        >>> (source, target_in), target_out = next(iter(train))
    """
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong={overlong!r}, expected one of {OVERLONG_POLICIES}")
    unknown = [name for name in source_features if name not in SOURCE_FEATURES]
    if unknown:
        raise ValueError(f"source_features={list(source_features)}: {unknown} not in {SOURCE_FEATURES}")
    if "source_tags" in source_features and not tag_factors:
        raise ValueError("source_features has source_tags but tag_factors is empty")
    if source_features and subword_sampling is not None:
        raise ValueError("subword_sampling cannot be used with source_features: the annotated sources' "
                         "pieces are aligned with their CoNLL-U words")
    annotated = bool(source_features)
    boundaries = _check_boundaries(boundaries, max_length)
    batch_sizes = bucket_batch_sizes(boundaries, batch_tokens, batch_multiple)
    boundaries_t = tf.constant(boundaries, tf.int64)
    batch_sizes_t = tf.constant(batch_sizes, tf.int64)

    def target_ids(target):
        if overlong == "truncate":
            target_in = tf.concat([[BOS_ID], target[:max_length - 1]], axis=0)  # [<= max_length]
            target_out = tf.concat([target, [EOS_ID]], axis=0)[:max_length]     # [<= max_length]
        else:
            target_in = tf.concat([[BOS_ID], target], axis=0)                  # [m + 1]
            target_out = tf.concat([target, [EOS_ID]], axis=0)                 # [m + 1]
        return target_in, target_out

    def add_special_ids(source, target):
        target_in, target_out = target_ids(target)
        if overlong == "truncate":
            source = source[:max_length - 1]
        source = tf.concat([source, [EOS_ID]], axis=0)                         # [n + 1]
        return (source, target_in), target_out

    def add_annotated_special_ids(features, target):
        target_in, target_out = target_ids(target)  # the source has its EOS (and truncation) already
        return (features["source_ids"], target_in, *(features[name] for name in source_features)), target_out

    def fits(inputs, target_out):
        return tf.logical_and(tf.size(inputs[0]) <= max_length, tf.size(target_out) <= max_length)

    def bucket_id(inputs, target_out):
        length = tf.cast(tf.maximum(tf.size(inputs[0]), tf.size(target_out)), tf.int64)
        # index of the first boundary >= length
        return tf.searchsorted(boundaries_t, length[tf.newaxis], side="left", out_type=tf.int64)[0]

    feature_shapes = {"source_tags": lambda length: [length, len(tag_factors)],
                      "source_distances": lambda length: [length, length]}
    feature_padding = {"source_tags": TAG_PAD_ID, "source_distances": 0}

    def batch_bucket(bucket, window):
        length = boundaries_t[bucket]
        shapes = ([length], [length], *(feature_shapes[name](length) for name in source_features))
        padding = (PAD_ID, PAD_ID, *(feature_padding[name] for name in source_features))
        return window.padded_batch(
            batch_sizes_t[bucket], padded_shapes=(shapes, [length]),
            padding_values=(padding, PAD_ID), drop_remainder=drop_remainder)

    def window_size(bucket):
        return batch_sizes_t[bucket]

    ds = pairs
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    if annotated:
        ds = _annotated_examples(ds, tokenizer, max_length, overlong == "truncate", tag_factors)
        ds = ds.map(add_annotated_special_ids, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        ds = _tokenized_pairs(ds, tokenizer, subword_sampling)
        ds = ds.map(add_special_ids, num_parallel_calls=tf.data.AUTOTUNE)
    if overlong == "drop":
        ds = ds.filter(fits)
    ds = ds.group_by_window(key_func=bucket_id, reduce_func=batch_bucket, window_size_func=window_size)
    return ds.prefetch(tf.data.AUTOTUNE)


@dataclasses.dataclass(frozen=True)
class OverlongCount:
    """How many pairs of a split exceed ``max_length``.

    Attributes:
        pairs: pairs in the split.
        source: pairs whose ``tokens(source) + [EOS]`` is longer.
        target: pairs whose ``[BOS] + tokens(target)`` is longer.
        either: pairs with either side longer (dropped or truncated).
    """

    pairs: int
    source: int
    target: int
    either: int

    def __str__(self) -> str:
        share = self.either / self.pairs if self.pairs else 0.0
        return (f"{self.either} of {self.pairs} pairs ({share:.2%}) exceed max_length "
                f"(source {self.source}, target {self.target})")


def count_overlong(pairs: tf.data.Dataset, tokenizer: Tokenizer, max_length: int) -> OverlongCount:
    """Counts the pairs ``make_batches`` would drop or truncate (one pass).

    Args:
        pairs: ``(source, target)`` string pairs (finite).
        tokenizer: the shared ``Tokenizer``.
        max_length: as for ``make_batches``.

    Returns:
        An ``OverlongCount``; ``print`` it in the training log.
    """
    def lengths(sources, targets):
        source_len = tokenizer.tokenize(sources).row_lengths() + 1  # [b], + EOS
        target_len = tokenizer.tokenize(targets).row_lengths() + 1  # [b], + BOS / EOS
        return source_len > max_length, target_len > max_length

    def add(total, flags):
        source, target = flags
        return total + tf.stack([
            tf.size(source, out_type=tf.int64),
            tf.math.count_nonzero(source),
            tf.math.count_nonzero(target),
            tf.math.count_nonzero(source | target)])

    ds = pairs.batch(_TOKENIZE_BATCH).map(lengths, num_parallel_calls=tf.data.AUTOTUNE)
    total = ds.reduce(tf.zeros([4], tf.int64), add).numpy()
    return OverlongCount(*(int(x) for x in total))
