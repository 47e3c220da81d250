"""What a search finds (`SearchOptions`, each option checked by its row of
`keras_transformer.decoding.options`) and how its loop runs (`SearchLoop`: `LoopOps`,
`KeepAll` / `DropFinished` / `Halvings`, `CacheStages`)."""

import dataclasses
import textwrap
import typing

import keras
from keras import ops

from keras_transformer.decoding.options import OPTIONS
from keras_transformer.decoding.tensors import _is_int, _is_python, keras_gather


# `SearchOptions`' options checked together, with the loop-only fields, by `_checked_options` (the
# others each by its own row of the options table).
_CHECKED_TOGETHER = ("beam_size", "num_results")
_AS_KIND = {"int": int, "float": float, "bool": bool,
            # (ids as python ints, the empty sequences dropped as CTranslate2 drops them)
            "sequences": lambda value: tuple(tuple(int(i) for i in sequence) for sequence in value if len(sequence))}


def _table_fields(cls):
    """`SearchOptions`' option fields, made from the options table: one field per row of
    `keras_transformer.decoding.options.OPTIONS`, in its order, its default the row's
    `search_default`, then the class's own fields (the loop's); each row's `doc` joins the
    docstring's Args (for `help()`; docs/reference/options.md renders the same words)."""
    own = dict(cls.__dict__.get("__annotations__", {}))
    for option in OPTIONS:
        setattr(cls, option.name, option.search_default)
    cls.__annotations__ = {**{option.name: typing.Any for option in OPTIONS}, **own}
    if cls.__doc__ is None:  # (python -OO)
        return cls
    head, args = cls.__doc__.split("    Args:\n", 1)
    rows = "".join(textwrap.fill(f"{option.name}: {' '.join(option.doc.split())}", 88, initial_indent=" " * 8,
                                 subsequent_indent=" " * 12) + "\n" for option in OPTIONS)
    cls.__doc__ = f"{head}    Args:\n{rows}{args}"
    return cls


# --------------------------------------------------------------------------
# Settings: what the search finds (SearchOptions) and how its loop runs (SearchLoop)
# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
@_table_fields
class SearchOptions:
    """What a beam search finds. The loop's settings (`SearchLoop`) never change it.

    Keyword arguments only: one per decoding option of the options table, its field and
    default made from its row (`keras_transformer.decoding.options.OPTIONS`; each row's words
    are in docs/reference/options.md and in `help(SearchOptions)`) and its python value checked
    by it, and two of the loop's own:

    Args:
        exact_results: None (``num_results``), or a python int or int32
            scalar tensor in ``[1, num_results]``: the stop is exact for this
            many of the best results (the bound of ``num_results`` with this ``n``);
            the result slots after it may then hold other hypotheses than the
            exhaustive n-best's. A tensor lets one graph return
            ``num_results`` slots and stop by a count given at run time
            (the SavedModel's ``translate_options``).
        max_beam_size: with a tensor `beam_size`, the largest it may be
            (python int): the candidates' top-k sizes its blocks for it.
            Ignored (None) with a python int `beam_size`.

    The run-time forms (tensors: the SavedModel's ``translate_advanced``) are the
    caller's to keep in range, as a tensor ``beam_size`` is; the python forms are
    checked here.

    A disallowed token's logit is set to ``NEG_INF`` before the step's
    log-softmax (as CTranslate2 does), so the other tokens' log-probabilities
    are those of the distribution without it.

    Checked when made: a `ValueError` names the value received and the range
    expected. Python integers are stored as ``int``.

    Example:
        >>> options = SearchOptions(beam_size=4, alpha=0.6, num_results=2)
        >>> ids, scores = beam_search(step_fn, cache, batch, max_lengths, options)
    """

    exact_results: typing.Any = None
    max_beam_size: typing.Optional[int] = None

    @property
    def samples(self) -> bool:
        """Whether the search samples its tokens (``sampling_topk`` other than 1, or a tensor)."""
        return not (_is_int(self.sampling_topk) and self.sampling_topk == 1)

    def __post_init__(self):
        for name, value in _checked_options(self).items():
            object.__setattr__(self, name, value)  # (a frozen dataclass stores its checked values so)


def _checked_options(options):
    """`SearchOptions`' beam size, result counts and largest beam size, checked and
    normalized (python ints as ``int``); `ValueError` naming a bad value."""
    beam_size, num_results, max_beam_size = options.beam_size, options.num_results, options.max_beam_size
    if _is_int(beam_size):
        if beam_size < 1:
            raise ValueError(f"beam_size must be a python int >= 1, got {beam_size!r}")
        if not _is_int(num_results) or not 1 <= num_results <= beam_size:
            raise ValueError(
                f"num_results must be a python int in [1, beam_size={beam_size}], got {num_results!r}")
        beam_size, num_results, max_beam_size = int(beam_size), int(num_results), None
    else:  # a run-time beam size: in [1, max_beam_size], which the caller ensures
        if not _is_int(max_beam_size) or max_beam_size < 1:
            raise ValueError("a tensor beam_size needs max_beam_size, a python int >= 1 (the largest "
                             f"beam size it may hold), got {max_beam_size!r}")
        max_beam_size = int(max_beam_size)
        if _is_int(num_results):
            if not 1 <= num_results <= max_beam_size:
                raise ValueError(f"num_results must be in [1, max_beam_size={max_beam_size}], got {num_results!r}")
            num_results = int(num_results)
    exact_results = options.exact_results
    if _is_int(exact_results):
        name, limit = ("num_results", num_results) if _is_int(num_results) else ("max_beam_size", max_beam_size)
        if not 1 <= exact_results <= limit:
            raise ValueError(f"exact_results must be in [1, {name}={limit}], got {exact_results!r}")
        exact_results = int(exact_results)
    checked = {}
    for option in OPTIONS:  # each option's own values: its row of the options table
        value = getattr(options, option.name)
        if option.name in _CHECKED_TOGETHER:
            continue
        if (not _is_python(value) or (value is None and option.search_default is None)
                or _is_run_time_pair(value)):
            checked[option.name] = value  # a run-time value (or None: off): the caller's to keep in range
            continue
        problem = option.python_problem(value)
        if problem:
            raise ValueError(problem)
        checked[option.name] = value if option.as_given else _AS_KIND[option.kind](value)
    topk = checked["sampling_topk"]
    samples = not (_is_int(topk) and topk == 1)
    if samples and beam_size != 1:
        raise ValueError(f"sampling (sampling_topk={topk}) draws one token a step: it needs beam_size 1 (a python "
                         f"int), got {beam_size!r}")
    return {**checked, "beam_size": beam_size, "num_results": num_results, "max_beam_size": max_beam_size,
            "exact_results": exact_results}


def _is_run_time_pair(value):
    """Whether `value` is a run-time `suppress_sequences`: a pair of tensors (ids, lengths)."""
    return isinstance(value, tuple) and len(value) == 2 and not any(_is_python(item) for item in value)


def keras_nonzero(mask):
    """The positions of the True entries of a bool ``[b]``, ascending (``keras.ops.nonzero``):
    `LoopOps`' default ``nonzero``."""
    return ops.nonzero(mask)[0]


def keras_uniform(shape, seed, step):
    """`LoopOps`' default noise: ``keras.random.uniform`` from the seed ``(seed, step)``
    (python ints: an eager or traced-per-step search; a loop's tensor step needs a
    backend's stateless generator, as `keras_transformer.inference.searcher`'s presets give)."""
    if not _is_int(step):
        raise ValueError("sampling inside a compiled loop needs LoopOps.uniform of the backend's stateless "
                         "generator (keras_transformer.inference.searcher's presets)")
    return keras.random.uniform(shape, minval=1e-7, maxval=1.0, seed=keras.random.SeedGenerator(seed * 100003 + step))


@dataclasses.dataclass(frozen=True)
class LoopOps:
    """The ops a search loop is written with. Any of them give the same results
    (`normalize_after_top_k`: up to float32 rounding); they differ in the nodes
    and kernels a step runs.

    Args:
        while_loop: ``(cond, body, loop_vars, maximum_iterations) -> loop_vars``
            (``keras.ops.while_loop``'s signature); for `DropFinished` in a
            TensorFlow graph one that relaxes the loop's shape invariants
            (`keras_transformer.inference.searcher.relaxed_while_loop`), which LiteRT's
            WHILE runs too once converted.
        gather: `keras_gather`, or a function with its meaning, for the loop's
            gathers (beam reorders, the candidates' top-k, the dropped
            sentences): ``tf.gather`` in a TensorFlow graph, one node per
            gather instead of ~6-18.
        nonzero: with `DropFinished`, ``mask -> indices``: the positions of the
            True entries of a bool ``[b]`` as int32 ``[m]``, ascending
            (`keras_nonzero`, the default): on TensorFlow one ``tf.where``,
            which LiteRT converts, where ``keras.ops.nonzero`` unstacks int64
            indices, which LiteRT's builtins cannot.
        trace_once: None, or (not with `DropFinished`, whose loop has a body of
            its own) a function that wraps the loop's body (a step and the
            search's bookkeeping for it) so that it is traced once for every
            copy of it in the graph (each cache stage, each batch halving), e.g.
            ``tf.function(body, autograph=False, reduce_retracing=True)`` when
            the search itself is traced with unknown sizes.
        normalize_after_top_k: False: a step's logits become log-probabilities
            (``log_softmax`` over ``[rows, V]``), then each beam's best tokens
            are taken; True: the best tokens are taken from the logits and only
            those are normalized (minus the row's ``logsumexp``). The same
            tokens (``log_softmax`` subtracts one value from a row; only a tie
            that its rounding makes can break otherwise) and scores equal to
            float32 rounding. Under XLA it saves writing and reading the
            ``[rows, V]`` log-probabilities (the whole search 0.94-0.96x the
            time, docs/lab-notebook serving speed part 29); in a TensorFlow graph
            ``logsumexp``'s nodes cost more than they save (1.01-1.07x), so
            only the XLA search sets it.

        uniform: for sampling, ``(shape, seed, step) -> float32`` noise uniform in
            ``(0, 1)``, the same for the same arguments (`keras_uniform`, the
            default; a TensorFlow graph's: ``tf.random.stateless_uniform``).

    Presets: `KERAS_OPS` (every backend, LiteRT's builtins); the TensorFlow
    graph's and XLA's are `keras_transformer.inference.searcher`'s.
    """

    while_loop: typing.Callable = ops.while_loop
    gather: typing.Callable = keras_gather
    nonzero: typing.Callable = keras_nonzero
    trace_once: typing.Optional[typing.Callable] = None
    normalize_after_top_k: bool = False
    uniform: typing.Callable = None

    def __post_init__(self):
        if self.uniform is None:
            object.__setattr__(self, "uniform", keras_uniform)
        for name in ("while_loop", "gather", "nonzero", "trace_once", "uniform"):
            value = getattr(self, name)
            if not callable(value) and not (name == "trace_once" and value is None):
                raise TypeError(f"LoopOps.{name} must be a function, got {value!r}")
        object.__setattr__(self, "normalize_after_top_k", bool(self.normalize_after_top_k))


# The loop written in keras.ops alone: every backend, and LiteRT's builtins once converted.
KERAS_OPS = LoopOps()


@dataclasses.dataclass(frozen=True)
class KeepAll:
    """`SearchLoop.finished`: every sentence stays in the loop, its state frozen once it
    is done, until the whole batch is done (static shapes: XLA, JAX, LiteRT's static
    buffer)."""


@dataclasses.dataclass(frozen=True)
class DropFinished:
    """`SearchLoop.finished`: finished sentences leave the loop (each writes its results
    when it finishes), so the step function runs on the sentences still searched only.

    The loop variables then change their leading dimension: for eager TensorFlow, or a
    TensorFlow graph whose `LoopOps.while_loop` relaxes the loop's shape invariants
    (LiteRT's WHILE runs it too once converted, with `LoopOps.nonzero`); not XLA or
    JAX, which need static shapes. Caches may then also grow by concatenation. Not
    with `CacheStages` or `LoopOps.trace_once` (its loop has one body, one stage).
    Same results as `KeepAll`."""


@dataclasses.dataclass(frozen=True)
class Halvings:
    """`SearchLoop.finished` for static shapes (XLA), where `DropFinished` cannot shrink
    the loop's tensors: the loop keeps the sentences not done first (a permutation of
    every per-sentence row on every step, folded into the caches' beam reorder, which
    is done at the start of the next step), and a step runs on the first
    ``ceil(batch / 2**h)`` sentences for the largest ``h <= count`` that still holds
    all those not done (one branch per size, a ``switch``; the others keep their
    rows). With `CacheStages` the first stage runs on the whole batch. Needs a python
    int beam size and ``slice_update`` (on TensorFlow an XLA op: for ``jit_compile``
    functions only). Same results as `KeepAll`.

    Args:
        count: python int >= 1, the most halvings (`halving_sizes`).
    """

    count: int

    def __post_init__(self):
        if not _is_int(self.count) or isinstance(self.count, bool) or self.count < 1:
            raise ValueError(f"Halvings.count must be a python int >= 1 (KeepAll for none), got {self.count!r}")
        object.__setattr__(self, "count", int(self.count))


@dataclasses.dataclass(frozen=True)
class CacheStages:
    """`SearchLoop.stages`: the loop runs in stages, the first until step ``ends[0]``,
    the next until ``ends[1]``, ..., the last until ``max_decode_length``, and before
    each stage the cache is resized by ``resize(cache, stage_end)`` (from the
    ``initial_cache`` as given: e.g. self-attention buffers of 0 positions, padded to
    the stage's end). With static shapes (XLA) a step then reads and reorders a buffer
    of its stage's size instead of the largest one. Same results.

    Args:
        ends: increasing python ints >= 1.
        resize: ``(cache, length) -> cache``.
        min_decode_length: python int >= 0, with a tensor ``max_decode_length``: a
            bound it never goes below (the XLA search's shortest buffer). A stage
            may be empty (the buffer ends before its given start) only after a
            given end ``>= min_decode_length``; only such stages are traced inside
            the ``cond`` that leaves an empty stage out of the compiled program (a
            ``cond`` around a stage cost ~1.5 s of tracing). 0: every stage after
            the first. Same results with any bound: an empty stage outside the
            ``cond`` runs no step.
    """

    ends: typing.Tuple[int, ...]
    resize: typing.Callable
    min_decode_length: int = 0

    def __post_init__(self):
        ends = tuple(self.ends)
        if not ends or not all(_is_int(end) and end >= 1 for end in ends) or list(ends) != sorted(set(ends)):
            raise ValueError(f"CacheStages.ends must be increasing python ints >= 1, got {self.ends!r}")
        if not callable(self.resize):
            raise TypeError(f"CacheStages.resize must be a function (cache, length) -> cache, got {self.resize!r}")
        if not _is_int(self.min_decode_length) or self.min_decode_length < 0:
            raise ValueError(f"CacheStages.min_decode_length must be a python int >= 0, got {self.min_decode_length!r}")
        object.__setattr__(self, "ends", tuple(int(end) for end in ends))
        object.__setattr__(self, "min_decode_length", int(self.min_decode_length))


@dataclasses.dataclass(frozen=True)
class SearchLoop:
    """How the search's loop runs (never what it finds: `SearchOptions`).

    Args:
        ops: `LoopOps`, the ops the loop is written with (`KERAS_OPS`).
        finished: what happens to the sentences that are done: `KeepAll()`
            (fixed shapes), `DropFinished()` (the loop shrinks) or
            `Halvings(count)` (fixed shapes, steps on a prefix of the batch).
        stages: None, or `CacheStages` (the fixed-shape loops: not with
            `DropFinished`).

    Example:
        >>> loop = SearchLoop(finished=Halvings(3), stages=CacheStages((16, 32, 64), resize))
    """

    ops: LoopOps = KERAS_OPS
    finished: typing.Union[KeepAll, DropFinished, Halvings] = KeepAll()
    stages: typing.Optional[CacheStages] = None

    def __post_init__(self):
        if not isinstance(self.ops, LoopOps):
            raise TypeError(f"SearchLoop.ops must be a LoopOps, got {self.ops!r}")
        if not isinstance(self.finished, (KeepAll, DropFinished, Halvings)):
            raise TypeError(f"SearchLoop.finished must be KeepAll(), DropFinished() or Halvings(n), "
                            f"got {self.finished!r}")
        if self.stages is not None and not isinstance(self.stages, CacheStages):
            raise TypeError(f"SearchLoop.stages must be None or a CacheStages, got {self.stages!r}")
        if isinstance(self.finished, DropFinished) and (self.stages is not None or self.ops.trace_once is not None):
            raise ValueError("DropFinished runs one loop with a body of its own: not with CacheStages "
                             f"(got {self.stages!r}) or LoopOps.trace_once (got {self.ops.trace_once!r})")


def _checked_settings(options, loop):
    """`beam_search`'s `SearchOptions` and `SearchLoop` (None: the defaults), checked:
    a `TypeError` naming what else was given, a `ValueError` for `Halvings` with a
    run-time beam size."""
    options = SearchOptions() if options is None else options
    loop = SearchLoop() if loop is None else loop
    if not isinstance(options, SearchOptions):
        raise TypeError(f"beam_search: options must be a SearchOptions, got {options!r}")
    if not isinstance(loop, SearchLoop):
        raise TypeError(f"beam_search: loop must be a SearchLoop, got {loop!r}")
    if isinstance(loop.finished, Halvings) and not isinstance(options.beam_size, int):
        raise ValueError("Halvings (batch_halvings) needs a python int beam_size (static shapes), got "
                         f"{options.beam_size!r}")
    return options, loop
