"""One step of the beam search after the step function: the logits processors, the
candidates, the new alive and finished sets, the early stop."""

from keras import ops

from keras_transformer.constants import NEG_INF, PAD_ID
from keras_transformer.decoding.processors import _processed
from keras_transformer.decoding.tensors import length_penalty


def _grow_candidates(sentences, step, logits, spec):
    """Extends every alive beam by every token and keeps the best candidates.

    The best ``C`` of the ``k * V`` (beam, token) pairs by summed log-prob,
    found as the best ``C`` of each beam's best ``C`` tokens (`BestSampler`;
    the same candidates, in the same order: ``top_k`` keeps the lower index
    first on ties within a beam, and the merge keeps the lower beam first);
    the chosen token is written into the copied sequence at position ``step``
    (a one-hot ``where`` blend, no scatter).

    Args:
        sentences: the state's per-sentence entries.
        step: int32 scalar, the state's step.
        logits: float32 ``[b * k, V]``, the scores of the token after
            ``alive_last`` for every alive beam (batch-major).
        spec: the `_SearchSpec`.

    Returns:
        dict of candidates, best first:
        seqs int32 ``[b, C, L]`` (the new token at ``step``),
        logp float32 ``[b, C]`` (sum of token log-probs),
        tok int32 ``[b, C]`` (the new token),
        beam int32 ``[b, C]`` (the alive beam it extends),
        length int32 scalar (generated tokens, EOS included: ``step + 1``),
        at_limit bool ``[b, 1]`` (``length`` reached the sentence's limit),
        finishing bool ``[b, C]`` (valid and EOS or at the limit),
        continuing bool ``[b, C]`` (valid and neither).
    """
    k, num_candidates = spec.beam_size, spec.num_candidates
    beam_logp, beam_tok, per_beam = spec.sampler(logits, spec, step, sentences.get("sentence"))  # [b, k, P], [b, k*P]
    valid = ops.logical_and(
        sentences["alive_valid"][:, :, None], beam_logp > NEG_INF / 2
    )  # [b, k, P]
    logp = ops.where(
        valid, sentences["alive_logp"][:, :, None] + beam_logp, spec.neg_inf
    )  # [b, k, P]
    flat_logp = ops.reshape(logp, (-1, k * per_beam))  # [b, k * P]
    flat_valid = ops.reshape(valid, (-1, k * per_beam))  # [b, k * P]
    if isinstance(k, int) and k * per_beam == num_candidates:  # greedy: the one candidate is the beam's best
        top_logp = flat_logp
        top_idx = ops.zeros_like(beam_tok)
    else:
        top_logp, top_idx = ops.top_k(flat_logp, num_candidates)  # [b, C] x2
        top_idx = ops.cast(top_idx, "int32")
    top_valid = spec.gather(flat_valid, top_idx, 1)  # [b, C]
    top_beam = ops.floor_divide(top_idx, per_beam)  # [b, C]
    top_tok = spec.gather(beam_tok, top_idx, 1)  # [b, C]
    top_seqs = spec.gather(sentences["alive_seqs"], top_beam, 1)  # [b, C, L]
    write = (spec.positions == step)[None, None, :]  # [1, 1, L]
    top_seqs = ops.where(write, top_tok[:, :, None], top_seqs)  # [b, C, L]

    length = step + 1
    at_limit = (length >= sentences["max_lengths"])[:, None]  # [b, 1]
    is_eos = top_tok == spec.eos_id  # [b, C]
    finishing = ops.logical_and(top_valid, ops.logical_or(is_eos, at_limit))  # [b, C]
    continuing = ops.logical_and(
        top_valid, ops.logical_not(ops.logical_or(is_eos, at_limit))
    )  # [b, C]
    return {
        "seqs": top_seqs,
        "logp": top_logp,
        "tok": top_tok,
        "beam": top_beam,
        "length": length,
        "at_limit": at_limit,
        "finishing": finishing,
        "continuing": continuing,
    }


def _update_alive(candidates, spec):
    """The new alive set: the best ``k`` continuing candidates.

    Args:
        candidates: the dict from `_grow_candidates`.
        spec: the `_SearchSpec`.

    Returns:
        dict with the state's ``alive_seqs``, ``alive_last``, ``alive_logp``
        and ``alive_valid``, and ``source_beam`` int32 ``[b, k]``: the
        previous alive beam each new one extends (how to reorder the cache).
    """
    k = spec.beam_size
    key = ops.where(candidates["continuing"], candidates["logp"], spec.neg_inf)  # [b, C]
    # top_k's values are key's entries at idx, NEG_INF wherever the slot is not valid
    # (the key masks them): no gather or where for them.
    logp, idx = ops.top_k(key, k)  # [b, k] x2
    idx = ops.cast(idx, "int32")
    valid = spec.gather(candidates["continuing"], idx, 1)  # [b, k]
    return {
        "alive_seqs": spec.gather(candidates["seqs"], idx, 1),  # [b, k, L]
        "alive_last": spec.gather(candidates["tok"], idx, 1),  # [b, k]
        "alive_logp": logp,
        "alive_valid": valid,
        "source_beam": spec.gather(candidates["beam"], idx, 1),  # [b, k]
    }


def _update_finished(sentences, candidates, spec):
    """The new finished set: the best ``k`` of (old finished + finishing candidates).

    Old entries come first in the merge: ``top_k`` is stable, so on a tie
    the older hypothesis is kept.  Sentences already done are frozen
    (batching must not change them); in `DropFinished`'s loop
    (``spec.keeps_done`` False) no sentence in the loop is done.

    Args:
        sentences: the state's per-sentence entries (the finished set and
            ``done``, if kept).
        candidates: the dict from `_grow_candidates`.
        spec: the `_SearchSpec`.

    Returns:
        dict with the state's ``finished_seqs``, ``finished_scores``,
        ``finished_valid`` and, with patience, ``finished_count``.
    """
    old_scores = sentences["finished_scores"]  # [b, k]
    old_valid = sentences["finished_valid"]  # [b, k]
    old_seqs = sentences["finished_seqs"]  # [b, k, L]
    new_scores = ops.where(
        candidates["finishing"],
        candidates["logp"] / length_penalty(candidates["length"], spec.alpha),
        spec.neg_inf,
    )  # [b, C]
    all_scores = ops.concatenate(
        [ops.where(old_valid, old_scores, spec.neg_inf), new_scores], axis=1
    )  # [b, k + C]
    all_valid = ops.concatenate([old_valid, candidates["finishing"]], axis=1)  # [b, k + C]
    all_seqs = ops.concatenate([old_seqs, candidates["seqs"]], axis=1)  # [b, k + C, L]
    scores, idx = ops.top_k(all_scores, spec.beam_size)  # [b, k] x2 (the values: all_scores at idx)
    idx = ops.cast(idx, "int32")
    valid = spec.gather(all_valid, idx, 1)  # [b, k]
    seqs = spec.gather(all_seqs, idx, 1)  # [b, k, L]
    finished = {"finished_seqs": seqs, "finished_scores": scores, "finished_valid": valid}
    if spec.patience is not None:
        finished["finished_count"] = sentences["finished_count"] + ops.sum(
            ops.cast(candidates["finishing"], "int32"), axis=1)  # [b]
    if spec.keeps_done:
        done = sentences["done"]  # [b]
        old = {"finished_seqs": old_seqs, "finished_scores": old_scores, "finished_valid": old_valid,
               "finished_count": sentences.get("finished_count")}
        finished = {name: ops.where(ops.reshape(done, (-1,) + (1,) * (len(x.shape) - 1)), old[name], x)
                    for name, x in finished.items()}
    return finished


def _cannot_improve(sentences, candidates, alive, finished, spec):
    """The exact stop: no alive hypothesis can beat the finished ones that the
    result needs, with ``r = spec.exact_results``: the ``r``-th best of them
    (exact for the ``r`` best hypotheses and their scores): the best one when
    one result is asked (tensor2tensor's stop), the worst of the ``k``
    finished ones for the whole n-best. Any extension of an alive hypothesis
    has log-prob <= the best alive one and a length in
    ``[length + 1, max_length]``; the length penalty is monotonic in the
    length, so the best possible score is at one of the two ends (the
    ``max_length`` end when alpha >= 0), which bounds it for any alpha.

    Args:
        sentences: the state's per-sentence entries before this step (``max_penalty``).
        candidates, alive, finished: the dicts of `_grow_candidates`,
            `_update_alive` and `_update_finished`.
        spec: the `_SearchSpec`.

    Returns:
        bool ``[b]``.
    """
    alive_logp = alive["alive_logp"]  # [b, k]
    fin_valid, fin_scores = finished["finished_valid"], finished["finished_scores"]  # [b, k] x2
    best_alive = ops.max(alive_logp, axis=1)  # [b]
    bound = ops.maximum(
        best_alive / length_penalty(candidates["length"] + 1, spec.alpha),
        best_alive / sentences["max_penalty"],
    )  # [b]
    rank = spec.exact_results
    # Finished hypotheses are sorted best first, the used slots before the unused ones
    # (a used slot scores above NEG_INF, an unused one is NEG_INF): the r-th best is
    # slot r - 1, and with r = k it is valid only when all k are (the n-best's bound).
    if isinstance(rank, int):
        valid_at, score_at = fin_valid[:, rank - 1], fin_scores[:, rank - 1]  # [b] x2
    else:  # a tensor (`translate_options`' num_results)
        slot = ops.cast(rank, "int32") - 1
        valid_at, score_at = ops.take(fin_valid, slot, axis=1), ops.take(fin_scores, slot, axis=1)  # [b] x2
    return ops.logical_and(valid_at, score_at >= bound)  # [b]


def _patient(finished, spec):
    """CTranslate2's patience stop (not exact): ``round(k * patience)`` hypotheses
    of the sentence have finished, and that count is above 0. bool ``[b]``."""
    k = spec.beam_size if isinstance(spec.beam_size, int) else ops.cast(spec.beam_size, "float32")
    wanted = ops.cast(ops.round(k * ops.cast(spec.patience, "float32")), "int32")
    return ops.logical_and(wanted > 0, finished["finished_count"] >= wanted)  # [b]


def _update_done(sentences, candidates, alive, finished, spec):
    """Which sentences are done after this step (early termination): those done
    before (``spec.keeps_done``), and those that reached their length limit, have
    no alive hypothesis or cannot improve (`_cannot_improve`), or, with
    `spec.patience`, are patient (`_patient`). bool ``[b]``."""
    any_alive = ops.any(alive["alive_valid"], axis=1)  # [b]
    cannot_improve = _cannot_improve(sentences, candidates, alive, finished, spec)  # [b]
    at_limit = candidates["at_limit"][:, 0]  # [b]
    done = ops.logical_or(
        ops.logical_or(sentences["done"], at_limit) if spec.keeps_done else at_limit,
        ops.logical_or(ops.logical_not(any_alive), cannot_improve),
    )  # [b]
    if spec.patience is not None:
        done = ops.logical_or(done, _patient(finished, spec))
    return done


def _best_results(sentences, num_results, spec):
    """The ``num_results`` best finished hypotheses; unused slots are PAD / NEG_INF.

    Returns:
        ``(sequences, scores)``: int32 ``[b, n, L]`` and float32 ``[b, n]``.
    """
    valid = sentences["finished_valid"][:, :num_results]  # [b, n]
    sequences = ops.where(
        valid[:, :, None], sentences["finished_seqs"][:, :num_results], PAD_ID
    )  # [b, n, L]
    scores = ops.where(
        valid, sentences["finished_scores"][:, :num_results], spec.neg_inf
    )  # [b, n]
    return ops.cast(sequences, "int32"), ops.cast(scores, "float32")


def _search_step(state, logits, cache, spec):
    """One step of the search after the step function: candidates, the new
    alive and finished sets, and which sentences are done.

    Returns:
        ``(state, source_beam, done)``: the new state (with ``cache`` still in
        the previous beams' order, and ``done`` among its sentences'
        entries when ``spec.keeps_done``), ``source_beam`` int32 ``[b, k]``
        (see `_update_alive`) and ``done`` bool ``[b]``.
    """
    sentences = state["sentences"]
    logits = ops.cast(logits, "float32")
    if spec.processors:  # (no ops at all in a search without constraints)
        logits = _processed(logits, sentences, state["step"], spec)
    candidates = _grow_candidates(sentences, state["step"], logits, spec)
    alive = _update_alive(candidates, spec)
    source_beam = alive.pop("source_beam")
    finished = _update_finished(sentences, candidates, spec)
    done = _update_done(sentences, candidates, alive, finished, spec)
    new_sentences = {**sentences, **alive, **finished}
    if spec.keeps_done:
        new_sentences["done"] = done
    return {**state, "sentences": new_sentences, "cache": cache, "step": state["step"] + 1}, source_beam, done


def _step_caller(step_fn, with_static):
    """``run_step(state, static) -> (logits, cache)``: the step function on the state's
    last tokens (``ids`` int32 ``[b * k, 1]``), cache and step, and `static` (the static
    cache's rows) when the search has one."""
    def run_step(state, static):
        ids = ops.reshape(state["sentences"]["alive_last"], (-1, 1))  # [b * k, 1]
        if not with_static:
            return step_fn(ids, state["cache"], state["step"])
        return step_fn(ids, state["cache"], state["step"], static)

    return run_step
