"""Batched beam search (and greedy search) behind a step function.

The search is written with ``keras.ops`` only, so the same code runs eagerly,
inside a ``tf.function`` (with or without ``jit_compile``), in a SavedModel
graph, converts to LiteRT (TFLite) builtin ops without Flex, and runs on the
JAX backend.  Every buffer is preallocated with a fixed size
(``max_decode_length``: a python int, or in a TensorFlow graph a scalar
tensor fixed for the call) and the loop is a ``keras.ops.while_loop``; new
tokens are written into the sequence buffers with a one-hot ``where`` blend
at position ``step`` (no scatter / ``slice_update``), and beams are reordered
with ``take`` (GATHER). (`DropFinished`, for TensorFlow graphs without
XLA and their LiteRT conversion, adds ``nonzero`` and ``scatter_update`` and
changes shapes in the loop; `Halvings`, for XLA, adds a ``switch`` and
``slice_update``.)

The model is hidden behind a *step function*::

    step_fn(ids, cache, step) -> (logits, cache)

* ``ids``: int32 ``[batch * beam, 1]``, the token at position ``step`` of
  every hypothesis (``BOS_ID`` at step 0);
* ``cache``: a nested structure (dict / list / tuple) of tensors whose
  leaves all have leading dimension ``batch * beam`` (batch-major: row
  ``b * beam + k`` is beam ``k`` of sentence ``b``).  The returned cache
  must have the same structure and dtypes as the one passed in, and the
  same shapes unless the loop allows them to change (`DropFinished`
  with a ``while_loop`` of relaxed shape invariants: caches may then grow
  by concatenation; with static shapes, preallocate them, or grow them
  between `CacheStages`);
* ``step``: int32 scalar, the position of ``ids``;
* ``logits``: float ``[batch * beam, vocab]`` for the token at position
  ``step + 1``.

Scoring follows "Attention Is All You Need" / GNMT: the score of a finished
hypothesis is the sum of the log-probabilities of its tokens (EOS included)
divided by ``length_penalty(len, alpha) = ((5 + len) / 6) ** alpha`` where
``len`` counts the generated tokens including EOS.  The search keeps
``beam_size`` alive and ``beam_size`` finished hypotheses per sentence with
the usual top-``2 * beam_size`` candidate scheme (tensor2tensor, Flax WMT
example, T5X), stops a sentence as soon as no alive hypothesis can beat the
best of its finished ones (the ``n``-th best when ``n`` results are asked),
and stops the loop when every sentence is done or
the buffer is full.

Two frozen objects set a search: `SearchOptions` says what it finds (beam
size, alpha, results, the exact stop's count, CTranslate2's patience rule),
`SearchLoop` how its loop runs, with the same results: its `LoopOps` (the
ops it is written with: `KERAS_OPS`, or a TensorFlow graph's and XLA's in
`keras_transformer.inference.searcher`), what happens to finished sentences
(`KeepAll`, `DropFinished`, `Halvings`) and `CacheStages`. `beam_search`
checks them, then runs the fixed-shape loop (`_fixed_shape_loop`, in
stages or not) or the shrinking one (`_shrinking_loop`).

One loop step (each a small helper below): the step function scores the
next token of every alive beam; the logits processors of the options that
are on (`make_logits_processors`: the class each row of the options table
names, e.g. `MinLength`, then `TargetPrefix`; none, and no op, when all are
off) act on the logits before the log-softmax; the sampler (`make_sampler`:
`BestSampler`, or `RandomSampler` when sampling) draws each beam's
candidates; `_grow_candidates` keeps the best ``2 * beam_size`` (beam,
token) extensions; `_update_alive` keeps the best
``beam_size`` that continue (and reorders the cache); `_update_finished`
merges the ones that end into the finished set; `_update_done` applies the
early-termination bound (`_cannot_improve`, exact) and the patience rule
(`_patient`).  The loop state is a dict (`_initial_state`) whose
per-sentence entries are one sub-dict, ``sentences``: dropping, slicing or
moving sentences is one `gather_rows` (or ``map_structure``) of it.

Numerics: no ``-inf`` is ever used; impossible entries carry ``NEG_INF``
(finite) *and* an explicit validity flag, so no NaN can appear.  A token
whose log-probability is below ``NEG_INF / 2`` (e.g. its logit was masked
with ``NEG_INF``) is treated as impossible.
"""

import importlib as _importlib

from keras_transformer.decoding import options as _options

# Each public name and the module of this package that defines it: imported on first use, so
# that `keras_transformer.decoding.options` (the options table) loads without Keras, and with
# it a command's `--help` without TensorFlow.
_MODULES = {
    "KERAS_OPS": "settings",
    "BestSampler": "samplers",
    "CacheStages": "settings",
    "DropFinished": "settings",
    "Halvings": "settings",
    "KeepAll": "settings",
    "LoopOps": "settings",
    "RandomSampler": "samplers",
    "SearchLoop": "settings",
    "SearchOptions": "settings",
    "TargetPrefix": "processors",
    "beam_search": "loops",
    "expand_to_beams": "tensors",
    "flatten_beams": "tensors",
    "gather_beams": "tensors",
    "gather_rows": "tensors",
    "greedy_search": "loops",
    "halving_sizes": "loops",
    "keras_gather": "tensors",
    "keras_nonzero": "settings",
    "length_penalty": "tensors",
    "make_logits_processors": "processors",
    "make_sampler": "samplers",
    "tile_beams": "tensors",
    "top_k_blockwise": "tensors",
    "unflatten_beams": "tensors",
}
# The logits processors of the options table's rows (`DecodingOption.processor`): each a class
# of `processors`, exported under its own name.
_MODULES.update({option.processor: "processors" for option in _options.OPTIONS if option.processor is not None})
__all__ = sorted(_MODULES)


def __getattr__(name):
    if name in _MODULES:
        return getattr(_importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_MODULES))
