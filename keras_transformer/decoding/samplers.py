"""How each beam's candidates are drawn from its logits (CTranslate2's ``make_sampler``):
`BestSampler` (the best tokens) or `RandomSampler` (one token drawn)."""

import dataclasses
import typing

from keras import ops

from keras_transformer.decoding.tensors import _is_python, top_k_blockwise


@dataclasses.dataclass(frozen=True)
class BestSampler:
    """Each alive beam's best ``P`` next tokens (``P = min(C, V)``; a beam never contributes
    more than ``C`` candidates): the beam search's own choice (CTranslate2's BestSampler)."""

    def __call__(self, logits, spec, step=None, sentence=None):
        """
        Args:
            logits: float32 ``[b * k, V]``. They become log-probabilities before
                each beam's top tokens are taken, or with
                ``spec.normalize_after_top_k`` only those tokens' are (the same
                order: ``log_softmax`` subtracts one value from a row).
            spec: the `_SearchSpec`.

        Returns:
            ``(beam_logp float32 [b, k, P], beam_tok int32 [b, k * P], P)``.
        """
        k, num_candidates = spec.beam_size, spec.num_candidates
        vocab = logits.shape[-1]
        if vocab is None:
            per_beam = num_candidates
        elif isinstance(num_candidates, int):
            per_beam = min(num_candidates, vocab)
        else:  # a run-time beam size
            per_beam = ops.minimum(num_candidates, vocab)
        bound = spec.max_candidates if vocab is None else min(spec.max_candidates, vocab)  # the largest P
        ranked = logits if spec.normalize_after_top_k else ops.log_softmax(logits, axis=-1)  # [b * k, V]
        beam_logp, beam_tok = top_k_blockwise(ranked, per_beam, gather=spec.gather, max_k=bound)  # [b * k, P] x2
        if spec.normalize_after_top_k:  # only the chosen entries become log-probabilities
            beam_logp = beam_logp - ops.logsumexp(logits, axis=-1, keepdims=True)  # [b * k, P]
        beam_logp = ops.reshape(beam_logp, (-1, k, per_beam))  # [b, k, P]
        beam_tok = ops.reshape(ops.cast(beam_tok, "int32"), (-1, k * per_beam))  # [b, k * P]
        return beam_logp, beam_tok, per_beam


@dataclasses.dataclass(frozen=True)
class RandomSampler:
    """One token per row drawn from the step's distribution as CTranslate2's RandomSampler
    draws it: among the ``topk`` most likely (0: all), log-probabilities divided by the
    temperature, then the smallest set whose probabilities reach ``topp``; sampled with the
    Gumbel-max trick from `LoopOps.uniform` noise. The noise is drawn for the whole batch
    and each row takes its sentence's, so a sentence gets the same samples in every loop
    (one that drops finished sentences, or halves the batch, or keeps it whole). One beam.

    Args:
        topk, topp, temperature, seed: `SearchOptions`' ``sampling_*`` and ``seed`` (python
            values or scalar tensors).
        uniform: `LoopOps.uniform`.
    """

    topk: object
    topp: object
    temperature: object
    seed: object
    uniform: typing.Callable

    def __call__(self, logits, spec, step=None, sentence=None):
        """
        Args:
            logits: float32 ``[rows, V]`` (one beam a sentence).
            sentence: None (row ``i`` is sentence ``i``), or int32 ``[rows]``, each row's
                sentence (the state's ``sentence`` entry of the loops that move rows).

        Returns:
            ``(logp float32 [rows, 1, 1], token int32 [rows, 1], 1)``: the token and its
            log-probability under the model's own distribution (CTranslate2's score).
        """
        topk, topp, temperature = self.topk, self.topp, self.temperature
        logp = ops.log_softmax(logits, axis=-1)  # [rows, V]
        scores = logp
        if _is_python(topk):
            if topk > 0:
                kth = ops.top_k(logp, topk)[0][:, -1:]  # [rows, 1]
                scores = ops.where(logp >= kth, scores, spec.neg_inf)
        else:  # given at run time (>= 0): the k-th best, or with 0 every token
            k = ops.clip(ops.cast(topk, "int32"), 1, ops.shape(logp)[-1])
            kth = ops.top_k(logp, k)[0][:, -1:]  # [rows, 1]
            scores = ops.where(ops.logical_or(logp >= kth, topk <= 0), scores, spec.neg_inf)
        scores = ops.log_softmax(scores / temperature, axis=-1)  # [rows, V]
        if not _is_python(topp) or topp < 1.0:
            ranked = ops.sort(ops.exp(scores), axis=-1)[:, ::-1]  # [rows, V], most likely first
            before = ops.cumsum(ranked, axis=-1) - ranked  # [rows, V]: the mass of the tokens ranked before
            smallest = ops.min(ops.where(before < topp, ranked, 2.0), axis=-1, keepdims=True)  # [rows, 1]
            nucleus = ops.exp(scores) >= smallest
            # (a run-time 1.0 keeps every token, as the python 1.0 does: no float sum decides it)
            scores = ops.where(nucleus if _is_python(topp) else ops.logical_or(nucleus, topp >= 1.0),
                               scores, spec.neg_inf)
        noise = self.uniform((spec.batch_size, ops.shape(logits)[-1]), self.seed, step)  # [batch, V] in (0, 1)
        noise = noise if sentence is None else spec.gather(noise, sentence, 0)  # [rows, V]
        token = ops.cast(ops.argmax(scores - ops.log(-ops.log(noise)), axis=-1), "int32")[:, None]  # [rows, 1]
        beam_logp = ops.take_along_axis(logp, token, axis=-1)  # [rows, 1]
        return ops.reshape(beam_logp, (-1, 1, 1)), token, 1


def make_sampler(options, loop_ops):
    """The sampler of a search (CTranslate2's ``make_sampler``): `RandomSampler` where
    `options` samples (`SearchOptions.samples`), else `BestSampler`."""
    if not options.samples:
        return BestSampler()
    return RandomSampler(options.sampling_topk, options.sampling_topp, options.sampling_temperature, options.seed,
                         loop_ops.uniform)
