"""The search's loops (fixed shapes, in cache stages, with batch halvings; or shrinking as
sentences finish) and `beam_search` / `greedy_search`, which run them."""

import keras
import numpy as np
from keras import ops

from keras_transformer.constants import BOS_ID, EOS_ID, NEG_INF, PAD_ID
from keras_transformer.decoding.beam_step import _best_results, _search_step, _step_caller
from keras_transformer.decoding.settings import _checked_settings, DropFinished, Halvings, SearchOptions
from keras_transformer.decoding.state import _initial_state, _make_spec
from keras_transformer.decoding.tensors import _beam_rows, _buffer_length, gather_rows


# --------------------------------------------------------------------------
# The loops: fixed shapes (KeepAll, Halvings; in cache stages or not) and shrinking (DropFinished)
# --------------------------------------------------------------------------
def _fixed_shape_body(run_step, spec, deferred):
    """``search_body(state, static, not_done_first=False) -> state``: one step of the
    fixed-shape loop (the step function, the search's bookkeeping, the cache's beam
    reorder). `static`: the static cache's rows for the state's sentences.

    `deferred` (`Halvings`): the beam reorder of the step before is done here, where
    XLA fuses it with the step's write of its keys and values: two passes over each
    cache leaf a step instead of three (write, reorder, and the copy of the reordered
    buffer into the loop's; docs/lab-notebook, serving speed part 15); the state's
    ``cache_rows`` holds the rows to gather. `not_done_first` (`Halvings`): the
    sentences not done move first."""
    def search_body(state, static, not_done_first=False):
        if deferred:  # the cache's rows in the order of the state's hypotheses
            state = {**state, "cache": gather_rows(state["cache"], state["cache_rows"], spec.gather)}
        logits, cache = run_step(state, static)
        state, source_beam, done = _search_step(state, logits, cache, spec)
        order = None
        if not_done_first:
            order = ops.argsort(ops.cast(done, "int32"))  # [b]
            source_beam = spec.gather(source_beam, order, 0)
            state = {**state, "sentences": gather_rows(state["sentences"], order, spec.gather)}
        # One gather per cache leaf: the beam reorder (and the sentences' move), or
        # with `deferred` the rows it will gather at the start of the next step.
        rows = _beam_rows(source_beam, spec.beam_size, order)  # [b * k]
        if deferred:
            return {**state, "cache_rows": rows}
        return {**state, "cache": gather_rows(cache, rows, spec.gather)}

    return search_body


def _fixed_shape_loop(run_step, state, static_cache, spec, loop):
    """The loop of `KeepAll` and `Halvings`: every sentence stays in the loop until
    the whole batch is done, each frozen once it is; in `loop.stages` or in one
    ``while_loop``. Returns ``(sequences [batch, n, L], scores [batch, n])``."""
    halvings = loop.finished.count if isinstance(loop.finished, Halvings) else 0
    search_body = _fixed_shape_body(run_step, spec, deferred=halvings > 0)
    if loop.ops.trace_once is not None:
        search_body = loop.ops.trace_once(search_body)
    if halvings:
        sentence = ops.arange(spec.batch_size, dtype="int32")  # [batch]: each row's sentence
        # [batch * k]: the cache's row of each hypothesis (its beam reorder waits for the next step)
        state = {**state, "sentences": {**state["sentences"], "sentence": sentence},
                 "cache_rows": ops.arange(spec.batch_size * spec.beam_size, dtype="int32")}
        body = _halving_body(search_body, halvings, static_cache, spec)
        # The first cache stage runs on the whole batch: few sentences of a batch end
        # in its steps, and each halving is one more compiled copy of the step in each
        # stage (a batch-32 program traced in 11.9 instead of 13.7 s and compiled in
        # 13.1 instead of 16.8, same run time and results; docs/lab-notebook, serving
        # speed part 16).
        first_stage_body = _halving_body(search_body, 0, static_cache, spec)
    else:
        def body(state):
            return search_body(state, static_cache)

        first_stage_body = body

    def cond(state):
        return ops.logical_and(
            state["step"] < spec.max_decode_length, ops.any(ops.logical_not(state["sentences"]["done"]))
        )

    if loop.stages is None:
        state = loop.ops.while_loop(cond, body, state, maximum_iterations=spec.max_decode_length)
    else:
        state = _run_stages(state, cond, (first_stage_body, body), loop.stages, spec, loop.ops.while_loop)
    seqs, scores = _best_results(state["sentences"], spec.num_results, spec)
    if halvings:  # rows back in the sentences' order
        order = ops.argsort(state["sentences"]["sentence"])  # [batch]
        seqs, scores = ops.take(seqs, order, axis=0), ops.take(scores, order, axis=0)
    return seqs, scores


def _run_stages(state, cond, bodies, stages, spec, while_loop):
    """The fixed-shape loop in `CacheStages`: one ``while_loop`` per stage, the cache
    resized before each; `bodies`: the first stage's body and the others'."""
    previous_end = 0
    for index, stage_end in enumerate(_stage_ends(stages.ends, spec.max_decode_length)):
        state = {**state, "cache": stages.resize(state["cache"], stage_end)}

        def stage_cond(state, stage_end=stage_end):
            return ops.logical_and(cond(state), state["step"] < stage_end)

        stage_body = bodies[0] if index == 0 else bodies[1]

        def run_stage(state):
            return while_loop(stage_cond, stage_body, state, maximum_iterations=stage_end)

        # (a stage after a given end below min_decode_length is not empty; with python
        # ints, _stage_ends leaves the empty ones out)
        if index == 0 or isinstance(stage_end, int) or stages.ends[index - 1] < stages.min_decode_length:
            state = run_stage(state)
        else:
            # A stage that ends where the one before did (a buffer shorter than the given
            # end before it) runs no step. Under XLA the shapes make this condition a
            # constant, and the optimized program keeps no loop for the stage (one more
            # copy of the step per batch halving; docs/lab-notebook, serving speed part 31).
            # (`cond` traces both branches at once: no late binding of `state`.)
            state = ops.cond(stage_end > previous_end, lambda: run_stage(state), lambda: state)
        previous_end = stage_end
    return state


def halving_sizes(batch_size, halvings):
    """The batch sizes a step of `Halvings(halvings)` may run on:
    ``batch, ceil(batch / 2), ..., ceil(batch / 2**halvings)`` (python ints
    without repeats, or scalar tensors). A step runs on the smallest that holds
    the sentences not yet done."""
    sizes = [batch_size]
    for h in range(1, halvings + 1):
        size = (batch_size + 2 ** h - 1) // 2 ** h  # ceil(batch / 2**h)
        if isinstance(size, int) and size == sizes[-1]:
            break
        sizes.append(size)
    return sizes


def _halving_body(search_body, halvings, static_cache, spec):
    """The loop body of `Halvings`: `search_body` on the smallest prefix of sentences
    that holds every one not done, which also moves the sentences not done first
    (`search_body(..., not_done_first=True)`: the permutation folded into the cache's
    beam reorder, on every step).

    The state carries ``sentence`` (each row's sentence) and ``cache_rows`` (the
    cache's row of each hypothesis: `search_body` reorders the cache at the start
    of the next step, so a step gathers its prefix's rows from the whole cache,
    where the step before may have left them beyond the prefix; part 15). The
    static cache stays out of the state, in the sentences' order: each step
    gathers the rows of its prefix. (It was a loop variable permuted with the
    rows, and XLA copied it, and every cache, out of the branches of the
    `switch` and of a `cond` that moved the sentences only on the steps where
    one ended: 17% of a batch-32 step; without them the step took 7.5 ms
    instead of 11.3, docs/lab-notebook serving speed part 14. The prefix branches
    still copy the state they `slice_update`; one loop per size, with no
    `switch`, copied less but was no faster and compiled slower, part 14.)
    With a python batch size the sizes are python ints; with a scalar tensor
    (TensorFlow) XLA still sees each as a constant, since it compiles one program
    per batch size.
    """
    batch_size, beam_size = spec.batch_size, spec.beam_size
    sizes = halving_sizes(batch_size, halvings)
    static_cache = static_cache if static_cache is not None else {}

    def on_prefix(state, size):
        if size is batch_size:  # the whole batch: no slicing
            return search_body(state, gather_rows(static_cache, state["sentences"]["sentence"], spec.gather),
                               not_done_first=True)
        head = {"step": state["step"], "cache": state["cache"],  # (the cache: `search_body` gathers its rows)
                "cache_rows": state["cache_rows"][: size * beam_size],
                "sentences": keras.tree.map_structure(lambda leaf: leaf[:size], state["sentences"])}
        static = gather_rows(static_cache, head["sentences"]["sentence"], spec.gather)
        head = search_body(head, static, not_done_first=True)
        return {"step": head["step"], **{name: keras.tree.map_structure(
                    lambda full, part: ops.slice_update(full, [0] * len(full.shape), part), state[name], head[name])
                for name in ("cache", "cache_rows", "sentences")}}

    def body(state):
        alive = ops.sum(ops.cast(ops.logical_not(state["sentences"]["done"]), "int32"))
        # the smallest size that holds them (a size equal to the batch, as every size of a batch of
        # one is, takes the whole-batch branch, which slices nothing)
        index = sum(ops.cast(ops.logical_and(alive <= size, size < batch_size), "int32") for size in sizes[1:])
        return ops.switch(index, [lambda s, size=size: on_prefix(s, size) for size in sizes], state)

    return body


def _stage_ends(ends, max_decode_length):
    """The steps at which the stages of `CacheStages(ends)` end: the given ones
    below `max_decode_length` (all of them, capped, when it is a tensor), then it."""
    if isinstance(max_decode_length, int):
        return [end for end in ends if end < max_decode_length] + [max_decode_length]
    return [ops.minimum(end, max_decode_length) for end in ends] + [max_decode_length]


def _shrinking_body(run_step, spec, nonzero):
    """One step of `DropFinished`'s loop: the search's step, then the sentences that
    ended write their results and leave the state."""
    def body(state):
        logits, cache = run_step(state, state["static"])
        state, source_beam, done = _search_step(state, logits, cache, spec)
        sentences = state["sentences"]
        # Every step writes the results of the sentences that ended (on most steps
        # none: an empty scatter) and keeps the others, with no `cond` over the
        # state: such a cond cost more per step (a Switch, a Merge and two
        # function-boundary copies per tensor of the state, and the branch not
        # taken) than these small gathers, and a `while_loop` pays for every node
        # of its body on every step.
        seqs, scores = _best_results(sentences, spec.num_results, spec)  # [b, n, L], [b, n]
        ended = nonzero(done)  # [e]
        written = ops.expand_dims(spec.gather(sentences["sentence"], ended, 0), 1)  # [e, 1]
        out_seqs = ops.scatter_update(state["out_seqs"], written, spec.gather(seqs, ended, 0))
        out_scores = ops.scatter_update(state["out_scores"], written, spec.gather(scores, ended, 0))
        kept = nonzero(ops.logical_not(done))  # [b']
        # One gather per cache leaf: beam reorder and dropped sentences together.
        rows = _beam_rows(spec.gather(source_beam, kept, 0), spec.beam_size, kept)  # [b' * k]
        return {"step": state["step"], "cache": gather_rows(cache, rows, spec.gather),
                "sentences": gather_rows(sentences, kept, spec.gather), "out_seqs": out_seqs,
                "out_scores": out_scores, "static": _kept_static(state["static"], done, kept, spec.gather)}

    return body


def _kept_static(static, done, kept, gather):
    """The static cache's rows of the sentences `kept` (`DropFinished`): the encoder's
    keys and values, the largest per-sentence tensors, are copied only on a step where
    a sentence ended. ``{}`` without a static cache."""
    if not static:
        return static
    return ops.cond(ops.any(done), lambda: gather_rows(static, kept, gather), lambda: static)


def _shrinking_loop(run_step, state, static_cache, spec, loop_ops):
    """The loop of `DropFinished`: it carries only the sentences not done (their
    original row in ``sentence``), and each writes its results when done. No
    sentence in the loop is done (each leaves when it is): no ``done`` to carry.
    Returns ``(sequences [batch, n, L], scores [batch, n])``."""
    batch_size, num_results = spec.batch_size, spec.num_results
    sentences = {**state["sentences"], "sentence": ops.arange(batch_size, dtype="int32")}  # [b]
    state = {
        **state, "sentences": sentences, "static": static_cache if static_cache is not None else {},
        "out_seqs": ops.full((batch_size, num_results, spec.max_decode_length), PAD_ID, dtype="int32"),  # [batch, n, L]
        "out_scores": ops.full((batch_size, num_results), NEG_INF, dtype="float32"),  # [batch, n]
    }

    def cond(state):
        return ops.logical_and(state["step"] < spec.max_decode_length,
                               ops.shape(state["sentences"]["sentence"])[0] > 0)

    # `cond` bounds the steps: no iteration counter (a loop variable more).
    state = loop_ops.while_loop(cond, _shrinking_body(run_step, spec, loop_ops.nonzero), state,
                                maximum_iterations=None)
    return state["out_seqs"], state["out_scores"]


# --------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------
def beam_search(step_fn, initial_cache, batch_size, max_lengths, options=None, *, loop=None, static_cache=None,
                max_decode_length=None, bos_id=BOS_ID, eos_id=EOS_ID, target_prefix=None):
    """Batched beam search with GNMT length penalty and early termination.

    Args:
        step_fn: ``step_fn(ids, cache, step) -> (logits, cache)``, see the
            module docstring (``step_fn(ids, cache, step, static_cache)``
            when `static_cache` is given). ``ids`` int32 ``[batch * beam, 1]``
            is the token at position ``step`` (BOS at step 0), ``logits``
            ``[batch * beam, vocab]`` (vocab >= 2) are for position
            ``step + 1``; the returned cache must keep the structure and
            dtypes of its input, and its shapes unless `DropFinished`.
        initial_cache: nested structure of tensors with leading dimension
            ``batch``; tiled here to ``batch * beam`` (row ``b * beam + k``)
            and reordered along beams after every step. May be ``{}``/``()``.
        batch_size: python int (or int32 scalar tensor on the TensorFlow
            backend for a dynamic batch): the number of sentences.
        max_lengths: int ``[batch]``: the maximum number of generated tokens
            (EOS included) per sentence, e.g. ``source_length + 50``.  A
            hypothesis reaching its limit without EOS is finished as it is.
            Values are clipped to ``[1, max_decode_length]``.
        options: `SearchOptions` (beam size, alpha, results, patience): what
            the search finds. None: ``SearchOptions()`` (beam 4, alpha 0.6).
        loop: `SearchLoop` (its ops, what happens to finished sentences, cache
            stages): how the loop runs; the same results with any. None:
            ``SearchLoop()`` (keras.ops, `KeepAll`, one stage).
        static_cache: None, or a nested structure of tensors with leading
            dimension ``batch`` that the step function reads and never
            changes (e.g. cross-attention keys/values, one row per sentence
            shared by its beams): it is neither tiled nor reordered; with
            `DropFinished` it keeps the rows of the sentences searched.
        max_decode_length: the size of the sequence buffers and the hard
            bound on the number of loop iterations: a python int (static
            shapes: XLA, LiteRT, JAX), or, on the TensorFlow backend without
            XLA, an int32 scalar tensor, so that a graph sizes its buffers to
            each request (``max(max_lengths)``) instead of the largest one.
            If None it is ``max(max_lengths)``, which requires
            ``max_lengths`` to be concrete (eager / numpy); inside a graph
            pass it explicitly (e.g. ``max_source_length + 50``).
        bos_id: the id fed at step 0.
        eos_id: the id that ends a hypothesis.
        target_prefix: None, or ``(ids int [batch, P], lengths int [batch])``: each
            sentence's hypotheses start with its first ``lengths`` ids (CTranslate2's
            ``target_prefix``; 0: none). A prefix token is forced as the only allowed
            token of its step (so it adds 0 to the log-probability, as in
            CTranslate2), counts in the hypothesis's length and is returned with it.
    Returns:
        ``(sequences, scores)``:
        sequences: int32 ``[batch, num_results, max_decode_length]``, best
            first, without BOS, with EOS when it was produced, ``PAD_ID``
            after the end;
        scores: float32 ``[batch, num_results]``: sum of token
            log-probabilities divided by ``length_penalty(len, alpha)``.
            A result slot with no hypothesis (only possible when fewer than
            ``num_results`` distinct hypotheses exist) has an all-PAD
            sequence and score ``NEG_INF``.

    Example:
        >>> ids, scores = beam_search(step_fn, cache, 2, np.array([7, 9]), SearchOptions(beam_size=4))
    """
    options, loop = _checked_settings(options, loop)
    max_decode_length = _buffer_length(max_decode_length, max_lengths)
    spec = _make_spec(options, loop, batch_size, max_decode_length, eos_id, has_prefix=target_prefix is not None)
    state = _initial_state(initial_cache, max_lengths, bos_id, spec, target_prefix)
    run_step = _step_caller(step_fn, with_static=static_cache is not None)
    if isinstance(loop.finished, DropFinished):
        return _shrinking_loop(run_step, state, static_cache, spec, loop.ops)
    return _fixed_shape_loop(run_step, state, static_cache, spec, loop)


def greedy_search(
    step_fn,
    initial_cache,
    batch_size,
    max_lengths,
    *,
    alpha=0.6,
    max_decode_length=None,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
):
    """Greedy decoding: the argmax token every step until EOS or the length limit.

    Exactly ``beam_search(..., SearchOptions(beam_size=1))`` with the result
    dimension removed.

    Args:
        step_fn, initial_cache, batch_size, max_lengths, max_decode_length,
        bos_id, eos_id: as in `beam_search`.
        alpha: only used for the returned score (greedy choices do not
            depend on it).

    Returns:
        ``(sequences, scores)``: int32 ``[batch, max_decode_length]`` (no BOS,
        EOS included when produced, PAD after the end) and float32
        ``[batch]`` (length-penalised log-probability).
    """
    sequences, scores = beam_search(
        step_fn,
        initial_cache,
        batch_size,
        max_lengths,
        SearchOptions(beam_size=1, alpha=alpha, num_results=1),
        max_decode_length=max_decode_length,
        bos_id=bos_id,
        eos_id=eos_id,
    )
    return sequences[:, 0], scores[:, 0]  # [batch, L], [batch]
