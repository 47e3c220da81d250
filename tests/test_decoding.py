"""Tests of keras_transformer.decoding (beam search behind a step function).

The toy "model" is a fixed random table of logits (one per sentence)
indexed by (prefix state, last token) plus a term from a decayed sum of the
prefix embeddings.  Its cache holds the sentence id, the running hash of the
prefix (int, rank 1) and the decayed sum (float, rank 3), and the hash also
mixes in `step`, so a beam search that
gathers the cache wrongly, feeds the wrong token or the wrong step gets
different logits and fails the exact comparisons with the pure-python
references below.
"""


import dataclasses
import functools

import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer.constants import BOS_ID, EOS_ID, NEG_INF, PAD_ID
from keras_transformer.decoding import (
    KERAS_OPS,
    CacheStages,
    DropFinished,
    Halvings,
    KeepAll,
    LoopOps,
    SearchLoop,
    SearchOptions,
    beam_search,
    expand_to_beams,
    flatten_beams,
    gather_beams,
    greedy_search,
    halving_sizes,
    keras_gather,
    length_penalty,
    tile_beams,
    top_k_blockwise,
    unflatten_beams,
)

NUM_STATES = 7
EMB = (2, 3)


class ToyModel:
    """Random step function, in keras.ops (for the search) and numpy (reference)."""

    def __init__(self, seed, vocab=8, batch=3, eos_bias=0.0, scale=1.5,
                 masked=(PAD_ID, BOS_ID)):
        rng = np.random.default_rng(seed)
        self.vocab = vocab
        # One random table per sentence: a batch = many independent problems.
        self.table = scale * rng.normal(size=(batch, NUM_STATES, vocab, vocab))
        self.table = self.table.astype("float32")
        self.table[..., EOS_ID] += eos_bias
        self.emb = rng.normal(size=(vocab,) + EMB).astype("float32")
        self.proj = (0.5 * rng.normal(size=(EMB[0] * EMB[1], vocab))).astype("float32")
        self.mask = np.zeros(vocab, bool)
        self.mask[list(masked)] = True
        self.h0 = rng.integers(0, NUM_STATES, size=batch).astype("int32")
        self.acc0 = rng.normal(size=(batch,) + EMB).astype("float32")

    def initial_cache(self, rows=None):
        rows = slice(None) if rows is None else rows
        sid = np.arange(len(self.h0), dtype="int32")
        return {"sid": sid[rows], "h": self.h0[rows], "acc": self.acc0[rows]}

    # -- keras.ops version, used by beam_search ----------------------------
    def step_fn(self, ids, cache, step):
        vocab = self.vocab
        tok = ids[:, 0]  # [n]
        h = ops.mod(cache["h"] * 7 + tok * 3 + step + 1, NUM_STATES)  # [n]
        acc = 0.5 * cache["acc"] + ops.take(self.emb, tok, axis=0)  # [n, 2, 3]
        table = ops.reshape(self.table, (-1, vocab))  # [batch * states * vocab, vocab]
        row = (cache["sid"] * NUM_STATES + h) * vocab + tok  # [n]
        logits = ops.take(table, row, axis=0)  # [n, vocab]
        logits = logits + ops.matmul(ops.reshape(acc, (-1, EMB[0] * EMB[1])), self.proj)
        logits = ops.where(self.mask[None, :], NEG_INF, logits)
        return logits, {"sid": cache["sid"], "h": h, "acc": acc}

    # -- numpy reference ---------------------------------------------------
    def start(self, b):
        return (b, int(self.h0[b]), self.acc0[b].astype(np.float64))

    def np_step(self, state, tok, step):
        """Returns (log_probs [vocab] float64, new state) after feeding `tok` at `step`."""
        b, h, acc = state
        h = (h * 7 + tok * 3 + step + 1) % NUM_STATES
        acc = 0.5 * acc + self.emb[tok]
        logits = self.table[b, h, tok].astype(np.float64) + acc.reshape(-1) @ self.proj
        logits = np.where(self.mask, NEG_INF, logits)
        m = logits.max()
        log_probs = logits - m - np.log(np.exp(logits - m).sum())
        return log_probs, (b, h, acc)

    def valid_tokens(self, log_probs):
        return [t for t in range(self.vocab) if log_probs[t] > NEG_INF / 2]


def lp(n, alpha):
    return ((5.0 + n) / 6.0) ** alpha


def ref_score(model, b, seq, alpha):
    """Length-penalised log-prob of the generated tokens `seq` for sentence b."""
    state, tok, total = model.start(b), BOS_ID, 0.0
    for step, nxt in enumerate(seq):
        log_probs, state = model.np_step(state, tok, step)
        total += log_probs[nxt]
        tok = nxt
    return total / lp(len(seq), alpha)


def enumerate_all(model, b, max_len, alpha):
    """Every possible output (EOS-terminated, or max_len tokens) with its score, best first."""
    out = []

    def dfs(state, tok, step, prefix, total):
        log_probs, state = model.np_step(state, tok, step)
        for t in model.valid_tokens(log_probs):
            seq, tot = prefix + [t], total + log_probs[t]
            if t == EOS_ID or len(seq) == max_len:
                out.append((tot / lp(len(seq), alpha), tuple(seq)))
            else:
                dfs(state, t, step + 1, seq, tot)

    dfs(model.start(b), BOS_ID, 0, [], 0.0)
    return sorted(out, key=lambda x: -x[0])


def ref_greedy(model, b, max_len, alpha):
    state, tok, seq, total = model.start(b), BOS_ID, [], 0.0
    for step in range(max_len):
        log_probs, state = model.np_step(state, tok, step)
        tok = int(np.argmax(log_probs))
        seq.append(tok)
        total += log_probs[tok]
        if tok == EOS_ID:
            break
    return tuple(seq), total / lp(len(seq), alpha)


def ref_beam(model, b, max_len, k, alpha):
    """Plain python top-2k beam search WITHOUT early termination (runs to max_len)."""
    alive = [(0.0, (), model.start(b))]
    finished = []
    num_cand = 2 * k if k > 1 else 1
    for step in range(max_len):
        cands = []
        for logp, seq, state in alive:
            tok = seq[-1] if seq else BOS_ID
            log_probs, new_state = model.np_step(state, tok, step)
            for t in model.valid_tokens(log_probs):
                cands.append((logp + log_probs[t], seq + (t,), new_state))
        cands = sorted(cands, key=lambda c: -c[0])[:num_cand]
        at_limit = step + 1 >= max_len
        finished += [(c[0] / lp(step + 1, alpha), c[1]) for c in cands
                     if at_limit or c[1][-1] == EOS_ID]
        finished = sorted(finished, key=lambda f: -f[0])[:k]
        alive = [c for c in cands if not at_limit and c[1][-1] != EOS_ID][:k]
        if not alive:
            break
    return finished


def strip(row):
    """Generated tokens of one output row (drops the PAD tail)."""
    row = list(np.asarray(row))
    while row and row[-1] == PAD_ID:
        row.pop()
    return tuple(int(t) for t in row)


def run(model, max_lengths, options, **kwargs):
    max_lengths = np.asarray(max_lengths, "int32")
    seqs, scores = beam_search(model.step_fn, model.initial_cache(), len(max_lengths),
                               max_lengths, options, **kwargs)
    seqs, scores = np.asarray(seqs), np.asarray(scores)
    assert not np.isnan(scores).any()
    return seqs, scores


# --------------------------------------------------------------------------
def test_helpers():
    x = np.arange(2 * 3, dtype="float32").reshape(2, 3)
    tiled = np.asarray(tile_beams(x, 2))
    np.testing.assert_array_equal(tiled, x[[0, 0, 1, 1]])
    np.testing.assert_array_equal(np.asarray(expand_to_beams(x, 2))[:, 1], x)
    un = np.asarray(unflatten_beams(tiled, 2))
    assert un.shape == (2, 2, 3)
    np.testing.assert_array_equal(np.asarray(flatten_beams(un)), tiled)
    y = np.arange(2 * 3 * 2).reshape(2, 3, 2)
    idx = np.array([[2, 0, 2, 1], [1, 1, 0, 2]], "int32")
    expected = np.stack([y[b, idx[b]] for b in range(2)])
    np.testing.assert_array_equal(np.asarray(gather_beams(y, idx)), expected)
    np.testing.assert_allclose(np.asarray(length_penalty(np.array([1, 4]), 0.6)),
                               [1.0, (9 / 6) ** 0.6], rtol=1e-6)
    np.testing.assert_allclose(float(length_penalty(7, 0.0)), 1.0)


def test_keras_gather_has_tf_gathers_meaning():
    """`keras_gather` (keras.ops) and `tf_gather` (one tf.gather node, what the
    plain graph's loop uses) give the rows and the per-sentence beams NumPy
    indexing gives, on float and bool values, eagerly and in a graph."""
    from keras_transformer.inference.searcher import tf_gather

    y = np.arange(3 * 4 * 2, dtype="float32").reshape(3, 4, 2)
    beams = np.array([[3, 0, 3], [1, 1, 2], [0, 2, 1]], "int32")  # [3, 3]: each sentence's own beams
    rows = np.array([5, 0, 11, 5], "int32")
    flat = y.reshape(12, 2)
    cases = [(y, beams, 1, np.stack([y[b, beams[b]] for b in range(3)])),
             (y[:, :, 0] > 7, beams, 1, np.stack([(y[:, :, 0] > 7)[b, beams[b]] for b in range(3)])),
             (flat, rows, 0, flat[rows]), (flat, beams, 0, flat[beams])]
    for gather in (keras_gather, tf_gather):
        graph = tf.function(lambda x, i, b, gather=gather: gather(x, i, b), autograph=False)
        for x, indices, batch_dims, expected in cases:
            np.testing.assert_array_equal(np.asarray(gather(x, indices, batch_dims)), expected)
            np.testing.assert_array_equal(graph(x, indices, batch_dims).numpy(), expected)
    with pytest.raises(ValueError, match="batch_dims 0 or 1, got 2"):
        keras_gather(y, beams, 2)


@pytest.mark.parametrize("alpha", [0.6, 0.0, -0.4])
def test_exhaustive_nbest(alpha):
    # vocab {UNK, EOS, 4, 5} (PAD/BOS masked): 1+3+9+27 = 40 outputs up to 3
    # tokens, 1+3+9+27+81 = 121 up to 4.  A beam of 128 keeps everything.
    model = ToyModel(seed=11, vocab=6, batch=2)
    max_lengths = [4, 3]
    seqs, scores = run(model, max_lengths, SearchOptions(beam_size=128, num_results=121, alpha=alpha))
    for b, max_len in enumerate(max_lengths):
        truth = enumerate_all(model, b, max_len, alpha)
        assert len(truth) == (121 if max_len == 4 else 40)
        got = [strip(r) for r in seqs[b, : len(truth)]]
        assert got == [t[1] for t in truth]
        np.testing.assert_allclose(scores[b, : len(truth)], [t[0] for t in truth],
                                   rtol=1e-5, atol=1e-5)
        # Slots with no hypothesis: all PAD, score NEG_INF.
        assert (seqs[b, len(truth):] == PAD_ID).all()
        assert (scores[b, len(truth):] == np.float32(NEG_INF)).all()


def test_exhaustive_best_with_small_beam_output():
    model = ToyModel(seed=5, vocab=6, batch=2, eos_bias=-1.0)
    seqs, scores = run(model, [4, 4], SearchOptions(beam_size=64, num_results=3))
    for b in range(2):
        truth = enumerate_all(model, b, 4, 0.6)[:3]
        assert [strip(r) for r in seqs[b]] == [t[1] for t in truth]
        np.testing.assert_allclose(scores[b], [t[0] for t in truth], rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.6, 0.0, -1.0])
def test_beam4_matches_reference_beam_without_early_stop(alpha):
    # Same algorithm in plain python with no early termination: the early
    # stopping bound is exact, so sequences and scores must be identical.
    # 16 sentences, each with its own random table.
    model = ToyModel(seed=100, vocab=9, batch=16, eos_bias=-0.5)
    max_lengths = np.tile([3, 9, 6, 12], 4)
    seqs, scores = run(model, max_lengths, SearchOptions(beam_size=4, num_results=4, alpha=alpha))
    for b, max_len in enumerate(max_lengths):
        ref = ref_beam(model, b, max_len, 4, alpha)
        assert [strip(r) for r in seqs[b, : len(ref)]] == [r[1] for r in ref]
        np.testing.assert_allclose(scores[b, : len(ref)], [r[0] for r in ref], rtol=1e-5)


def test_top_k_blockwise_equals_top_k_eager_graph_xla_and_litert():
    """Same values and indices as one top_k (ties to the lower index), for rows whose
    length is or is not a multiple of the block, with ties, masked entries, k = 1, and k
    given at run time with a bound (blocks sized for 16 entries)."""
    rng = np.random.default_rng(5)
    cases = [(rng.normal(size=(6, 8000)), 8, None), (rng.integers(0, 4, size=(5, 1000)), 8, None),
             (rng.integers(0, 3, size=(4, 333)), 3, 16), (rng.normal(size=(3, 1000)), 1, None),
             (rng.normal(size=(2, 40)), 8, None),  # 40: too short for blocks, plain top_k
             (rng.normal(size=(3, 10000)), 10, None),  # blocks of 40, a divisor (no padding)
             (rng.normal(size=(3, 997)), 8, None)]  # a prime width: blocks of 16, the last one padded
    masked = rng.normal(size=(4, 700))
    masked[:, rng.integers(0, 700, size=650)] = NEG_INF  # a few real entries left per row
    cases.append((masked, 8, None))
    from keras_transformer.inference.searcher import tf_gather

    for x, k, block in cases:
        x = x.astype("float32")
        expected_values, expected_indices = (np.asarray(t) for t in tf.math.top_k(x, k))
        eager = top_k_blockwise(ops.convert_to_tensor(x), k, block)
        graph = tf.function(lambda t: top_k_blockwise(t, k, block),
                            input_signature=[tf.TensorSpec([None, x.shape[1]], tf.float32)], autograph=False)(x)
        xla = tf.function(lambda t: top_k_blockwise(t, k, block), jit_compile=True, autograph=False)(x)
        tf_gathers = tf.function(lambda t: top_k_blockwise(t, k, block, gather=tf_gather),
                                 input_signature=[tf.TensorSpec([None, x.shape[1]], tf.float32)], autograph=False)(x)
        for values, indices in (eager, graph, xla, tf_gathers):
            np.testing.assert_array_equal(np.asarray(values), expected_values)
            np.testing.assert_array_equal(np.asarray(indices), expected_indices)
    # k given at run time, the blocks sized and counted for its bound (16): exact for every k up to it
    x = cases[0][0].astype("float32")
    run_time_k = tf.function(lambda t, k: top_k_blockwise(t, k, gather=tf_gather, max_k=16),
                             input_signature=[tf.TensorSpec([None, x.shape[1]], tf.float32),
                                              tf.TensorSpec([], tf.int32)], autograph=False)
    for k in (1, 5, 16):
        values, indices = run_time_k(x, tf.constant(k))
        np.testing.assert_array_equal(values.numpy(), tf.math.top_k(x, k).values.numpy())
        np.testing.assert_array_equal(indices.numpy(), tf.math.top_k(x, k).indices.numpy())
    interpreter_lib = pytest.importorskip("ai_edge_litert.interpreter")
    x = cases[1][0].astype("float32")
    litert_fn = tf.function(lambda t: top_k_blockwise(t, 8), input_signature=[tf.TensorSpec(x.shape, tf.float32)],
                            autograph=False)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([litert_fn.get_concrete_function()], litert_fn)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    interpreter = interpreter_lib.Interpreter(model_content=converter.convert())
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    outputs = sorted((interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()),
                     key=lambda o: o.dtype.kind)  # float values, then int indices
    np.testing.assert_array_equal(outputs[0], tf.math.top_k(x, 8).values.numpy())
    np.testing.assert_array_equal(outputs[1], tf.math.top_k(x, 8).indices.numpy())


def test_top_k_blockwise_cuts_the_row_without_padding_where_a_divisor_is_near():
    """The power of two near sqrt(V / k) where it divides V, else the divisor of V nearest
    to it (within a factor of two), else that power of two with the last block padded."""
    from keras_transformer.decoding.tensors import _block_size

    assert _block_size(8000, 8) == 32  # 8000 = 250 x 32: as before
    assert _block_size(10000, 10) == 40  # 32 would pad 16 entries; 25 and 40 divide, 40 is nearer
    assert _block_size(1000, 8) == 20  # 16 would pad; 20 and 25 divide
    assert _block_size(997, 8) == 16  # prime: no divisor, padded
    assert _block_size(30000, 2) == 125  # 128 would pad; 125 = 30000 / 240


def test_large_vocabulary_search_matches_the_reference():
    """A vocabulary large enough for `top_k_blockwise`'s blocks (300 tokens, k = 8
    candidates per beam): same n-best and scores as the pure-python reference."""
    model = ToyModel(seed=101, vocab=300, batch=3, eos_bias=2.0)
    max_lengths = np.array([3, 7, 5])
    seqs, scores = run(model, max_lengths, SearchOptions(beam_size=4, num_results=4, alpha=0.6))
    for b, max_len in enumerate(max_lengths):
        ref = ref_beam(model, b, max_len, 4, 0.6)
        assert [strip(r) for r in seqs[b, : len(ref)]] == [r[1] for r in ref]
        np.testing.assert_allclose(scores[b, : len(ref)], [r[0] for r in ref], rtol=1e-5)


@pytest.mark.parametrize("vocab, beam_size", [(300, 4), (8, 3), (8, 1)])
def test_normalizing_after_the_top_k_finds_the_reference_hypotheses(vocab, beam_size):
    """`normalize_after_top_k` (the XLA search's order: each beam's best tokens taken from
    the logits, then only those normalized): the reference n-best and scores, and the same
    sequences as normalizing every row first, eager and under XLA, with masked tokens (PAD,
    BOS at NEG_INF), blocks (300 tokens) or plain top_k (8), and greedy (beam 1)."""
    model = ToyModel(seed=101, vocab=vocab, batch=3, eos_bias=2.0)
    max_lengths = np.array([3, 7, 5], "int32")
    options = SearchOptions(beam_size=beam_size, num_results=beam_size, alpha=0.6)
    seqs, scores = run(model, max_lengths, options, loop=SearchLoop(LoopOps(normalize_after_top_k=True)))
    for b, max_len in enumerate(max_lengths):
        ref = ref_beam(model, b, max_len, beam_size, 0.6)
        assert [strip(r) for r in seqs[b, : len(ref)]] == [r[1] for r in ref]
        np.testing.assert_allclose(scores[b, : len(ref)], [r[0] for r in ref], rtol=1e-5)
    before_seqs, before_scores = run(model, max_lengths, options)
    np.testing.assert_array_equal(seqs, before_seqs)
    np.testing.assert_allclose(scores, before_scores, rtol=1e-5)  # float32 sums of other roundings
    from keras_transformer.inference.searcher import tf_gather

    @tf.function(jit_compile=True, autograph=False)
    def compiled(normalize_after_top_k):
        loop = SearchLoop(LoopOps(gather=tf_gather, normalize_after_top_k=normalize_after_top_k))
        return beam_search(model.step_fn, model.initial_cache(), 3, tf.constant(max_lengths), options, loop=loop,
                           max_decode_length=7)

    xla_seqs, xla_scores = (np.asarray(t) for t in compiled(True))
    np.testing.assert_array_equal(xla_seqs, seqs)
    np.testing.assert_allclose(xla_scores, scores, rtol=1e-5)


@pytest.mark.parametrize("alpha, max_steps", [(0.0, 5), (0.6, 20)])
def test_early_termination_stops_the_loop(alpha, max_steps):
    # EOS very likely: every sentence is done long before the length limit of
    # 40 (the eager loop calls step_fn once per step).  With alpha > 0 the
    # bound logprob / lp(40) is looser, so it takes a few more steps.
    model = ToyModel(seed=3, vocab=8, batch=3, eos_bias=6.0)
    steps = []

    def counting_step(ids, cache, step):
        steps.append(int(step))
        return model.step_fn(ids, cache, step)

    seqs, scores = beam_search(counting_step, model.initial_cache(), 3,
                               np.array([40, 40, 40], "int32"),
                               SearchOptions(beam_size=4, num_results=4, alpha=alpha))
    assert 1 <= len(steps) <= max_steps, steps
    assert steps == list(range(len(steps)))
    for b in range(3):
        ref = ref_beam(model, b, 40, 4, alpha)
        assert [strip(r) for r in np.asarray(seqs)[b]] == [r[1] for r in ref]
        np.testing.assert_allclose(np.asarray(scores)[b], [r[0] for r in ref], rtol=1e-5)


def test_beam1_is_greedy():
    model = ToyModel(seed=200, vocab=10, batch=16, eos_bias=-0.5)
    max_lengths = np.tile([1, 5, 11, 8], 4)
    seqs, scores = run(model, max_lengths, SearchOptions(beam_size=1, alpha=0.6))
    g_seqs, g_scores = greedy_search(model.step_fn, model.initial_cache(), 16,
                                     np.asarray(max_lengths, "int32"))
    np.testing.assert_array_equal(np.asarray(g_seqs), seqs[:, 0])
    np.testing.assert_allclose(np.asarray(g_scores), scores[:, 0])
    for b, max_len in enumerate(max_lengths):
        ref_seq, ref_sc = ref_greedy(model, b, max_len, 0.6)
        assert strip(seqs[b, 0]) == ref_seq
        np.testing.assert_allclose(scores[b, 0], ref_sc, rtol=1e-5)


def test_beam4_not_worse_than_greedy():
    # 48 sentences, each with its own random table, in one batch.  (Not a
    # theorem for beam search in general, but it holds for these tables and a
    # broken search falls below greedy quickly.)
    model = ToyModel(seed=300, vocab=10, batch=48, eos_bias=-1.0)
    max_lengths = np.tile([6, 8, 10, 7], 12)
    _, beam_scores = run(model, max_lengths, SearchOptions(beam_size=4, alpha=0.6))
    greedy_scores = np.array([ref_greedy(model, b, m, 0.6)[1]
                              for b, m in enumerate(max_lengths)])
    assert (beam_scores[:, 0] >= greedy_scores - 1e-5).all()
    assert (beam_scores[:, 0] > greedy_scores + 1e-5).sum() > 5  # beam finds better ones


def test_batch_equals_each_sentence_alone():
    model = ToyModel(seed=7, vocab=9, batch=5, eos_bias=-0.8)
    max_lengths = np.array([1, 3, 12, 7, 5], "int32")
    seqs, scores = run(model, max_lengths, SearchOptions(beam_size=4, num_results=3))
    assert seqs.shape == (5, 3, 12)
    for b in range(5):
        alone_s, alone_sc = beam_search(model.step_fn, model.initial_cache([b]), 1,
                                        max_lengths[b:b + 1], SearchOptions(beam_size=4, num_results=3))
        alone_s = np.asarray(alone_s)
        assert alone_s.shape == (1, 3, max_lengths[b])  # buffer = its own max length
        np.testing.assert_array_equal(alone_s[0], seqs[b, :, : max_lengths[b]])
        assert (seqs[b, :, max_lengths[b]:] == PAD_ID).all()
        # Equal up to float rounding (the toy matmul is not batch-size invariant).
        np.testing.assert_allclose(np.asarray(alone_sc)[0], scores[b], rtol=1e-6)


def test_never_eos_stops_exactly_at_max_lengths():
    model = ToyModel(seed=9, vocab=8, batch=4, masked=(PAD_ID, BOS_ID, EOS_ID))
    max_lengths = [2, 9, 5, 30]  # 30 > buffer: clipped to max_decode_length
    seqs, scores = run(model, max_lengths, SearchOptions(beam_size=4, num_results=4), max_decode_length=12)
    assert seqs.shape == (4, 4, 12)
    for b, max_len in enumerate([2, 9, 5, 12]):
        for r in range(4):
            assert len(strip(seqs[b, r])) == max_len
            assert (seqs[b, r, :max_len] != PAD_ID).all()
            assert (seqs[b, r, :max_len] != EOS_ID).all()
        assert len({strip(s) for s in seqs[b]}) == 4  # distinct hypotheses


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_scores_equal_recomputed_scores(alpha):
    model = ToyModel(seed=21, vocab=12, batch=3, eos_bias=-0.3)
    max_lengths = [10, 4, 7]
    seqs, scores = run(model, max_lengths, SearchOptions(beam_size=4, num_results=4, alpha=alpha))
    for b in range(3):
        assert (np.diff(scores[b]) <= 1e-6).all()  # best first
        for r in range(4):
            seq = strip(seqs[b, r])
            assert len(seq) <= max_lengths[b]
            assert EOS_ID not in seq[:-1]  # EOS only as the last token
            np.testing.assert_allclose(scores[b, r], ref_score(model, b, seq, alpha),
                                       rtol=1e-5)


def test_single_possible_token_no_nan():
    # Only EOS is possible: one finished hypothesis, the other slots are empty.
    model = ToyModel(seed=1, vocab=6, batch=2,
                     masked=[t for t in range(6) if t != EOS_ID])
    seqs, scores = run(model, [5, 5], SearchOptions(beam_size=4, num_results=4))
    np.testing.assert_array_equal(seqs[:, 0, 0], [EOS_ID, EOS_ID])
    np.testing.assert_allclose(scores[:, 0], 0.0, atol=1e-6)
    assert (seqs[:, 0, 1:] == PAD_ID).all() and (seqs[:, 1:] == PAD_ID).all()
    assert (scores[:, 1:] == np.float32(NEG_INF)).all()
    assert np.isfinite(scores).all()


def test_tf_function_graph_and_xla():
    model = ToyModel(seed=31, vocab=10, batch=3, eos_bias=-0.5)
    max_lengths = np.array([6, 3, 9], "int32")
    eager = run(model, max_lengths, SearchOptions(beam_size=4, num_results=2, alpha=0.6))

    def decode(h, acc, max_lengths, alpha):
        cache = {"sid": tf.range(tf.shape(h)[0]), "h": h, "acc": acc}
        return beam_search(model.step_fn, cache, tf.shape(h)[0], max_lengths,
                           SearchOptions(beam_size=4, num_results=2, alpha=alpha), max_decode_length=9)

    # Dynamic batch and alpha as a tensor input (a SavedModel signature).
    graph_fn = tf.function(decode, jit_compile=False, input_signature=[
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, *EMB], tf.float32),
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.float32)], autograph=False)
    args = (model.h0, model.acc0, max_lengths, np.float32(0.6))
    graph = [np.asarray(t) for t in graph_fn(*args)]
    np.testing.assert_array_equal(graph[0], eager[0])
    np.testing.assert_allclose(graph[1], eager[1], rtol=1e-6)

    xla_fn = tf.function(lambda h, acc, m, a: beam_search(
        model.step_fn, {"sid": tf.range(3), "h": h, "acc": acc}, 3, m, SearchOptions(beam_size=4, num_results=2,
                                                                                      alpha=a),
        max_decode_length=9), jit_compile=True, autograph=False)
    xla = [np.asarray(t) for t in xla_fn(*args)]
    np.testing.assert_array_equal(xla[0], eager[0])
    np.testing.assert_allclose(xla[1], eager[1], rtol=1e-5)


def test_argument_validation():
    model = ToyModel(seed=0, batch=1)
    with pytest.raises(ValueError):
        beam_search(model.step_fn, model.initial_cache(), 1, np.array([3], "int32"),
                    SearchOptions(beam_size=2, num_results=3))
    with pytest.raises(ValueError):
        tf.function(lambda m: beam_search(model.step_fn, model.initial_cache(), 1, m), autograph=False)(
            tf.constant([3]))


def test_converts_to_litert_builtins():
    # TFLITE_BUILTINS only: the conversion fails if any op needs Flex.
    interpreter_lib = pytest.importorskip("ai_edge_litert.interpreter")
    model = ToyModel(seed=31, vocab=10, batch=3, eos_bias=-0.5)
    max_lengths = np.array([6, 3, 9], "int32")
    eager = run(model, max_lengths, SearchOptions(beam_size=4, num_results=2, alpha=0.6),
                max_decode_length=9)

    @tf.function(input_signature=[
        tf.TensorSpec([3], tf.int32), tf.TensorSpec([3, *EMB], tf.float32),
        tf.TensorSpec([3], tf.int32), tf.TensorSpec([], tf.float32)], autograph=False)
    def decode(h, acc, lengths, alpha):
        cache = {"sid": tf.range(3), "h": h, "acc": acc}
        return beam_search(model.step_fn, cache, 3, lengths, SearchOptions(beam_size=4, num_results=2,
                                                                           alpha=alpha), max_decode_length=9)

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [decode.get_concrete_function()], decode)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    interpreter = interpreter_lib.Interpreter(model_content=converter.convert())
    interpreter.allocate_tensors()
    values = {"h": model.h0, "acc": model.acc0, "lengths": max_lengths,
              "alpha": np.float32(0.6)}
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], np.asarray(values[detail["name"]], detail["dtype"]))
    interpreter.invoke()
    outputs = [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]
    seqs = next(o for o in outputs if o.ndim == 3)
    scores = next(o for o in outputs if o.ndim == 2)
    np.testing.assert_array_equal(seqs, eager[0])
    np.testing.assert_allclose(scores, eager[1], rtol=1e-5)


# --------------------------------------------------------------------------
# The search that does only the work each sentence needs
# --------------------------------------------------------------------------
def static_step_fn(model, beam_size):
    """The toy step function reading the sentence id from a static cache (one
    row per sentence, shared by its beams), as the translator's decoder does."""
    def step_fn(ids, cache, step, static_cache):
        sid = ops.repeat(static_cache["sid"], beam_size, axis=0)  # [rows]
        logits, cache = model.step_fn(ids, {**cache, "sid": sid}, step)
        return logits, {"h": cache["h"], "acc": cache["acc"]}

    return step_fn


def run_static(model, max_lengths, options, loop):
    cache = model.initial_cache()
    static = {"sid": cache.pop("sid")}
    return beam_search(static_step_fn(model, options.beam_size), cache, len(max_lengths),
                       np.asarray(max_lengths, "int32"), options, loop=loop, static_cache=static)


@pytest.mark.parametrize("beam_size, num_results", [(4, 1), (4, 3), (1, 1)])
def test_drop_finished_equals_the_full_batch_loop(beam_size, num_results):
    """Finished sentences leave the loop (their results written as they end):
    same sequences and scores as the loop that keeps every sentence, eagerly
    and in a graph (a while_loop whose shapes change), with the sentence id
    in a static cache that must follow the kept sentences."""
    from keras_transformer.inference.searcher import relaxed_while_loop, tf_gather

    model = ToyModel(seed=41, vocab=9, batch=12, eos_bias=0.5)
    max_lengths = np.array([1, 3, 12, 7, 5, 9, 2, 12, 4, 6, 8, 10], "int32")
    options = SearchOptions(beam_size=beam_size, num_results=num_results)
    seqs, scores = run(model, max_lengths, options)
    dropped = run_static(model, max_lengths, options, SearchLoop(finished=DropFinished()))
    np.testing.assert_array_equal(np.asarray(dropped[0]), seqs)
    np.testing.assert_allclose(np.asarray(dropped[1]), scores, rtol=1e-6)

    def decode(h, acc, lengths, gather):
        loop_ops = LoopOps(while_loop=relaxed_while_loop, **({} if gather is None else {"gather": gather}))
        return beam_search(static_step_fn(model, beam_size), {"h": h, "acc": acc}, tf.shape(h)[0], lengths,
                           options, loop=SearchLoop(loop_ops, DropFinished()), max_decode_length=12,
                           static_cache={"sid": tf.range(tf.shape(h)[0])})

    for gather in (None, tf_gather):  # keras.ops' gathers, and the plain graph's one-node ones
        graph = tf.function(lambda h, a, m, gather=gather: decode(h, a, m, gather), input_signature=[
            tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, *EMB], tf.float32),
            tf.TensorSpec([None], tf.int32)], autograph=False)(model.h0, model.acc0, max_lengths)
        np.testing.assert_array_equal(graph[0].numpy(), seqs)
        np.testing.assert_allclose(graph[1].numpy(), scores, rtol=1e-6)


def count_steps(model, max_lengths, options, **kwargs):
    """Runs the search eagerly; returns its results and the rows the step function saw per step."""
    rows = []

    def counting_step(ids, cache, step):
        rows.append(int(ids.shape[0]))
        return model.step_fn(ids, cache, step)

    seqs, scores = beam_search(counting_step, model.initial_cache(), len(max_lengths),
                               np.asarray(max_lengths, "int32"), options, **kwargs)
    return np.asarray(seqs), np.asarray(scores), rows


@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_one_result_stops_at_the_bound_exact_for_the_best(alpha):
    """With one result the loop stops as soon as no alive hypothesis can beat the
    best finished one: the best hypothesis and its score are those of the n-best
    search (which runs until the worst of k finished ones is safe) and of the
    reference beam search without early stop, in fewer steps."""
    model = ToyModel(seed=8, vocab=10, batch=24, eos_bias=1.0)
    max_lengths = np.tile([20, 14, 25, 9], 6)
    one, one_scores, one_steps = count_steps(model, max_lengths, SearchOptions(beam_size=4, num_results=1, alpha=alpha))
    best, best_scores, all_steps = count_steps(model, max_lengths, SearchOptions(beam_size=4, num_results=4, alpha=alpha))
    np.testing.assert_array_equal(one[:, 0], best[:, 0])
    np.testing.assert_array_equal(one_scores[:, 0], best_scores[:, 0])
    for b, max_len in enumerate(max_lengths):
        ref = ref_beam(model, b, max_len, 4, alpha)
        assert strip(one[b, 0]) == ref[0][1]
        np.testing.assert_allclose(one_scores[b, 0], ref[0][0], rtol=1e-5)
    assert len(one_steps) < len(all_steps), (len(one_steps), len(all_steps))


@pytest.mark.parametrize("drop_finished", [False, True])
def test_exact_results_stops_when_the_first_r_results_are_known(drop_finished):
    """`exact_results=r` stops a sentence as soon as its r-th best finished hypothesis
    cannot be beaten: a search returning 4 slots with r given as a tensor (how
    `translate_options` takes `num_results`) runs exactly the steps of the search asked
    for r results, and its first r results are those of the reference beam search
    without early stop (r = 2: the same two best, in fewer steps than the full n-best,
    more than the best alone)."""
    model = ToyModel(seed=8, vocab=10, batch=24, eos_bias=1.0)
    max_lengths = np.tile([20, 14, 25, 9], 6)
    loop = SearchLoop(finished=DropFinished() if drop_finished else KeepAll())
    steps = {}
    for r in (1, 2, 4):
        static, static_scores, steps[r] = count_steps(
            model, max_lengths, SearchOptions(beam_size=4, alpha=0.6, num_results=r), loop=loop)
        seqs, scores, tensor_steps = count_steps(
            model, max_lengths, SearchOptions(beam_size=4, alpha=0.6, num_results=4, exact_results=tf.constant(r)),
            loop=loop)
        assert tensor_steps == steps[r], (r, len(tensor_steps), len(steps[r]))
        np.testing.assert_array_equal(seqs[:, :r], static)
        np.testing.assert_array_equal(scores[:, :r], static_scores)
        for b, max_len in enumerate(max_lengths):
            ref = ref_beam(model, b, max_len, 4, 0.6)[:r]
            assert [strip(row) for row in static[b]] == [seq for _, seq in ref], (r, b)
            np.testing.assert_allclose(static_scores[b], [score for score, _ in ref], rtol=1e-5)
    assert len(steps[1]) < len(steps[2]) < len(steps[4]), [len(steps[r]) for r in (1, 2, 4)]
    with pytest.raises(ValueError, match="exact_results must be in \\[1, num_results=2\\], got 3"):
        count_steps(model, max_lengths, SearchOptions(num_results=2, exact_results=3, beam_size=4))


# The eager reference searches of test_run_time_beam_size_equals_each_static_beam_size, by
# (vocab, k, exact, patience): the same for both loops (drop_finished or not), so the second
# parameter set reads the first's (30 eager searches, 6 of its 7 s alone) instead of again.
_STATIC_BEAM_RESULTS = {}


@pytest.mark.parametrize("vocab, max_beam, drop_finished", [(10, 8, True), (10, 8, False), (300, 3, True)])
def test_run_time_beam_size_equals_each_static_beam_size(vocab, max_beam, drop_finished):
    """One TensorFlow graph takes the beam size as an input (`translate_options`' single
    search): for every k it returns what the search built for that python int k returns,
    all k slots (k = 1: exactly greedy, one candidate a step), with the stop exact for
    one result or for all of them, and with patience; at vocab 300 and at most 3 beams
    the candidates' top-k runs in blocks sized for 6 candidates (exact for fewer)."""
    from keras_transformer.inference.searcher import relaxed_while_loop, tf_gather

    model = ToyModel(seed=44, vocab=vocab, batch=8, eos_bias=0.5)
    max_lengths = np.array([1, 3, 12, 7, 5, 9, 2, 12], "int32")
    loop = (SearchLoop(LoopOps(while_loop=relaxed_while_loop, gather=tf_gather), DropFinished()) if drop_finished
            else SearchLoop())

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32),
                                  tf.TensorSpec([], tf.float32)], autograph=False)
    def search(k, exact, patience):
        static = {"sid": tf.range(8)}

        # `static_step_fn`'s, with the beams of a row from the shapes (keras' repeat takes no tensor count)
        def step_fn(ids, cache, step, static_cache):
            sid = tf.repeat(static_cache["sid"], tf.shape(ids)[0] // tf.shape(static_cache["sid"])[0])
            logits, cache = model.step_fn(ids, {**cache, "sid": sid}, step)
            return logits, {"h": cache["h"], "acc": cache["acc"]}

        options = SearchOptions(beam_size=k, max_beam_size=max_beam, num_results=k, exact_results=exact, alpha=0.6,
                                patience=patience)
        return beam_search(step_fn, {"h": model.h0, "acc": model.acc0}, 8, max_lengths, options, loop=loop,
                           max_decode_length=12, static_cache=static)

    for k in range(1, max_beam + 1):
        for exact in sorted({1, k}):
            for patience in (0.0, 0.5):
                key = (vocab, k, exact, patience)
                if key not in _STATIC_BEAM_RESULTS:
                    _STATIC_BEAM_RESULTS[key] = run(model, max_lengths, SearchOptions(
                        beam_size=k, num_results=k, alpha=0.6, exact_results=exact, patience=patience or None))
                want, want_scores = _STATIC_BEAM_RESULTS[key]
                got, got_scores = search(tf.constant(k), tf.constant(exact), tf.constant(patience))
                assert got.shape == want.shape, (k, got.shape, want.shape)
                np.testing.assert_array_equal(got.numpy(), want, err_msg=f"k={k} exact={exact} p={patience}")
                np.testing.assert_allclose(got_scores.numpy(), want_scores, rtol=1e-6)
    greedy, greedy_scores = greedy_search(model.step_fn, model.initial_cache(), 8, max_lengths, alpha=0.6)
    got, got_scores = search(tf.constant(1), tf.constant(1), tf.constant(0.0))
    np.testing.assert_array_equal(got.numpy()[:, 0], np.asarray(greedy))
    np.testing.assert_allclose(got_scores.numpy()[:, 0], np.asarray(greedy_scores), rtol=1e-6)
    with pytest.raises(ValueError, match="a tensor beam_size needs max_beam_size"):
        tf.function(lambda k: beam_search(model.step_fn, model.initial_cache(), 8, max_lengths,
                                          SearchOptions(beam_size=k), max_decode_length=12),
                    autograph=False)(tf.constant(2))


def test_dropped_sentences_leave_the_step_function():
    """With drop_finished the step function sees only the beams of sentences not
    yet done: the rows it runs shrink as sentences end, and sum to fewer than the
    full batch's rows times the steps."""
    model = ToyModel(seed=8, vocab=10, batch=6, eos_bias=1.0)
    max_lengths = [2, 30, 4, 30, 1, 30]
    _, _, full_rows = count_steps(model, max_lengths, SearchOptions(beam_size=4))
    seqs, _, rows = count_steps(model, max_lengths, SearchOptions(beam_size=4), loop=SearchLoop(finished=DropFinished()))
    assert full_rows == [24] * len(full_rows)
    assert rows[0] == 24 and rows == sorted(rows, reverse=True) and rows[-1] < 24
    assert all(r % 4 == 0 for r in rows) and len(rows) == len(full_rows)
    assert (seqs[4, 0, 1:] == PAD_ID).all()  # the 1-token sentence ended at step 0


@pytest.mark.parametrize("beam_size, num_results", [(4, 1), (4, 3), (1, 1)])
def test_batch_halvings_equal_the_full_batch_loop(beam_size, num_results):
    """With batch_halvings the sentences not done move first and a step runs on
    the smallest of 12, 6 or 3 sentences that holds them: the step function
    sees fewer rows as sentences end, and the results (in the sentences' order)
    are the full loop's, eagerly and XLA-compiled with cache stages, with the
    sentence id in a static cache and a cache buffer that must follow their
    rows."""
    model = ToyModel(seed=41, vocab=9, batch=12, eos_bias=0.5)
    max_lengths = np.array([1, 3, 12, 7, 5, 9, 2, 12, 4, 6, 8, 10], "int32")
    options = SearchOptions(beam_size=beam_size, num_results=num_results)
    seqs, scores = run(model, max_lengths, options)
    rows = []

    def step_fn(ids, cache, step, static_cache):
        rows.append(int(ids.shape[0]) if ids.shape[0] is not None else None)
        logits, inner = history_step_fn(model)(ids, {**cache, "sid": ops.repeat(static_cache["sid"], beam_size,
                                                                                 axis=0)}, step)
        return logits, {"h": inner["h"], "acc": inner["acc"], "hist": inner["hist"]}

    def search(h, acc, lengths, halvings, static_shapes):
        batch = 12 if static_shapes else tf.shape(h)[0]
        loop = SearchLoop(finished=Halvings(halvings) if halvings else KeepAll(),
                          stages=CacheStages((2, 5), resize_history))
        return beam_search(step_fn, {"h": h, "acc": acc, "hist": tf.zeros([batch, 0])}, batch, lengths, options,
                           loop=loop, max_decode_length=12, static_cache={"sid": tf.range(batch)})

    want = [np.asarray(t) for t in search(model.h0, model.acc0, max_lengths, 0, True)]
    full_rows, rows[:] = list(rows), []
    halved = [np.asarray(t) for t in search(model.h0, model.acc0, max_lengths, 2, True)]
    np.testing.assert_array_equal(halved[0], want[0])
    np.testing.assert_allclose(halved[1], want[1], rtol=1e-6)  # a matmul over fewer rows may round differently
    # the history step function gives other logits than the plain toy's: compare its own loop only
    assert full_rows == [12 * beam_size] * len(full_rows)
    assert len(rows) == len(full_rows) and rows[0] == 12 * beam_size
    assert rows == sorted(rows, reverse=True) and set(rows) <= {12 * beam_size, 6 * beam_size, 3 * beam_size}
    assert rows[-1] == 3 * beam_size  # the last steps run on a quarter of the batch
    assert halving_sizes(12, 2) == [12, 6, 3] and halving_sizes(5, 3) == [5, 3, 2, 1]
    assert halving_sizes(1, 2) == [1] and halving_sizes(32, 0) == [32]
    if beam_size == 4 and num_results == 1:  # the toy loop agrees with the reference search
        plain = [np.asarray(t) for t in run_static(model, max_lengths, SearchOptions(beam_size=beam_size),
                                                   SearchLoop(finished=Halvings(2)))]
        np.testing.assert_array_equal(plain[0], seqs)
        np.testing.assert_allclose(plain[1], scores, rtol=1e-6)
    xla = tf.function(lambda h, a, m: search(h, a, m, 2, False), jit_compile=True, input_signature=[
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, *EMB], tf.float32),
        tf.TensorSpec([None], tf.int32)], autograph=False)
    compiled = [t.numpy() for t in xla(model.h0, model.acc0, max_lengths)]
    np.testing.assert_array_equal(compiled[0], want[0])
    np.testing.assert_allclose(compiled[1], want[1], rtol=1e-5)


def test_batch_halvings_start_after_the_first_cache_stage():
    """The first cache stage runs on the whole batch even when most sentences
    are done (each halving is one more compiled copy of the step per stage);
    from the second stage a step runs on the smallest prefix that holds the
    sentences not done, with the whole-batch loop's results."""
    beam_size = 2
    model = ToyModel(seed=5, vocab=9, batch=8, eos_bias=0.5)
    max_lengths = [1, 1, 1, 1, 1, 1, 9, 9]  # six sentences end at step 0
    options = SearchOptions(beam_size=beam_size)
    stages = CacheStages((4,), lambda cache, length: cache)  # (the toy's cache has no positions)
    want, want_scores, full_rows = count_steps(model, max_lengths, options, max_decode_length=9,
                                               loop=SearchLoop(stages=stages))
    seqs, scores, halved_rows = count_steps(model, max_lengths, options, max_decode_length=9,
                                            loop=SearchLoop(finished=Halvings(2), stages=stages))
    np.testing.assert_array_equal(seqs, want)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6)
    steps = len(full_rows)
    assert steps > 4 and full_rows == [8 * beam_size] * steps  # the search outlives the first stage
    # steps 0-3 (the first stage) on all 8 sentences, then on the first 2 (8 / 4)
    assert halved_rows == [8 * beam_size] * 4 + [2 * beam_size] * (steps - 4)


def test_patience_stops_after_round_beam_times_patience_hypotheses():
    """CTranslate2's patience rule: a sentence stops once round(k * patience)
    hypotheses have finished. Off (None, 0) it is the exact search; a large
    patience never triggers before the exact bound; patience 0.25 (one
    hypothesis at beam 4) stops at the first finished one, which is a valid,
    correctly scored hypothesis, no better than the exact best."""
    model = ToyModel(seed=12, vocab=10, batch=16, eos_bias=0.0)
    max_lengths = np.tile([20, 14, 25, 9], 4)
    exact, exact_scores, exact_steps = count_steps(model, max_lengths, SearchOptions(beam_size=4))
    for patience in (None, 0.0, 100.0):
        seqs, scores, steps = count_steps(model, max_lengths, SearchOptions(beam_size=4, patience=patience))
        np.testing.assert_array_equal(seqs, exact)
        np.testing.assert_array_equal(scores, exact_scores)
        assert len(steps) == len(exact_steps)
    seqs, scores, steps = count_steps(model, max_lengths, SearchOptions(beam_size=4, patience=0.25))
    assert len(steps) < len(exact_steps)
    assert (scores[:, 0] <= exact_scores[:, 0] + 1e-6).all()
    assert (scores[:, 0] < exact_scores[:, 0] - 1e-6).any()
    for b in range(16):
        np.testing.assert_allclose(scores[b, 0], ref_score(model, b, strip(seqs[b, 0]), 0.6), rtol=1e-5)


def history_step_fn(model):
    """The toy step function plus a buffer cache `hist` [rows, slots] written at
    position `step` (a where-blend, as the decoder's preallocated caches) whose
    contents feed the logits: a search that loses or misplaces buffer contents
    between stages gets other logits."""
    def step_fn(ids, cache, step):
        logits, inner = model.step_fn(ids, {k: v for k, v in cache.items() if k != "hist"}, step)
        hist = cache["hist"]
        slots = ops.arange(ops.shape(hist)[1], dtype="int32")  # [slots]
        hist = ops.where(slots[None, :] == step, ops.cast(ids, "float32") + 1.0, hist)  # [rows, slots]
        weights = ops.cos(ops.cast(slots, "float32"))  # depends on the position, not on the buffer size
        mixed = ops.sum(hist * weights[None, :], axis=1, keepdims=True)  # [rows, 1]
        logits = logits + 0.3 * ops.sin(mixed * ops.arange(model.vocab, dtype="float32")[None, :])
        return logits, {**inner, "hist": hist}

    return step_fn


def resize_history(cache, length):
    hist = cache["hist"]
    return {**cache, "hist": ops.pad(hist, [[0, 0], [0, length - ops.shape(hist)[1]]])}


def test_cache_stages_equal_one_buffer_eager_and_xla():
    """The loop in stages (the buffer padded to 2, then 5, then 12 positions)
    gives the results of one loop over a 12-position buffer, eagerly and
    XLA-compiled."""
    model = ToyModel(seed=17, vocab=9, batch=5, eos_bias=-0.5)
    max_lengths = np.array([1, 3, 12, 7, 5], "int32")

    def search(h, acc, lengths, staged):
        start = {"sid": tf.range(5), "h": h, "acc": acc}
        if staged:
            return beam_search(history_step_fn(model), {**start, "hist": tf.zeros([5, 0])}, 5, lengths,
                               SearchOptions(beam_size=4, num_results=2), max_decode_length=12,
                               loop=SearchLoop(stages=CacheStages((2, 5), resize_history)))
        return beam_search(history_step_fn(model), {**start, "hist": tf.zeros([5, 12])}, 5, lengths,
                           SearchOptions(beam_size=4, num_results=2), max_decode_length=12)

    want = [np.asarray(t) for t in search(model.h0, model.acc0, max_lengths, staged=False)]
    assert len({len(strip(row)) for row in want[0][:, 0]}) > 2  # outputs of several lengths
    staged = [np.asarray(t) for t in search(model.h0, model.acc0, max_lengths, staged=True)]
    np.testing.assert_array_equal(staged[0], want[0])
    np.testing.assert_allclose(staged[1], want[1], rtol=1e-6)
    xla = tf.function(lambda h, a, m: search(h, a, m, staged=True), jit_compile=True, autograph=False)
    compiled = [t.numpy() for t in xla(model.h0, model.acc0, max_lengths)]
    np.testing.assert_array_equal(compiled[0], want[0])
    np.testing.assert_allclose(compiled[1], want[1], rtol=1e-5)


def test_xla_compiles_no_loop_for_a_stage_of_no_steps():
    """With the buffer's length a tensor (one trace for every source width, as in
    `Searcher.compiled_search`) the given stages past the buffer run no step; XLA, for
    which the length is a constant, compiles no loop for them: the program of stages
    (2, 5, 16, 32) over a 12-position buffer has three loops (those of (2, 5); five
    before), and gives the one-buffer search's results. With `min_decode_length` 12
    only the stages after the given ends 16 and 32 are traced inside a `cond`."""
    model = ToyModel(seed=17, vocab=9, batch=5, eos_bias=-0.5)
    max_lengths = np.array([1, 3, 12, 7, 5], "int32")

    def search(h, acc, lengths, template):  # the template's length is the buffer's
        start = {"sid": tf.range(5), "h": h, "acc": acc, "hist": tf.zeros([5, 0])}
        stages = CacheStages((2, 5, 16, 32), resize_history, min_decode_length=12)
        return beam_search(history_step_fn(model), start, 5, lengths, SearchOptions(beam_size=4, num_results=2),
                           loop=SearchLoop(stages=stages), max_decode_length=tf.shape(template)[0])

    want = [np.asarray(t) for t in beam_search(
        history_step_fn(model), {"sid": tf.range(5), "h": model.h0, "acc": model.acc0, "hist": tf.zeros([5, 12])},
        5, max_lengths, SearchOptions(beam_size=4, num_results=2), max_decode_length=12)]
    xla = tf.function(search, jit_compile=True, autograph=False, input_signature=[
        tf.TensorSpec(model.h0.shape, tf.int32), tf.TensorSpec(model.acc0.shape, tf.float32),
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.float32)])
    args = (model.h0, model.acc0, max_lengths, tf.zeros([12]))
    graph = xla.get_concrete_function(*args).graph
    assert sum(op.type in ("If", "StatelessIf") for op in graph.get_operations()) == 2
    assert xla.experimental_get_compiler_ir(*args)(stage="optimized_hlo").count(" while(") == 3
    compiled = [t.numpy() for t in xla(*args)]
    np.testing.assert_array_equal(compiled[0], want[0])
    np.testing.assert_allclose(compiled[1], want[1], rtol=1e-5)


# --------------------------------------------------------------------------
# The settings objects (SearchOptions, SearchLoop)
# --------------------------------------------------------------------------
def test_settings_are_checked_when_made():
    """Each setting is checked where it is made, with a message naming the value; the
    exclusions (`DropFinished` with cache stages or a traced-once body, halvings with a
    run-time beam size) are errors, not docstrings."""
    model = ToyModel(seed=1, vocab=6, batch=1)
    search = functools.partial(beam_search, model.step_fn, model.initial_cache(), 1, np.array([3], "int32"))
    stages = CacheStages((2, 5), resize_history)
    for make, error, message in (
            (lambda: SearchOptions(beam_size=0), ValueError, "beam_size must be a python int >= 1, got 0"),
            (lambda: SearchOptions(beam_size=2, num_results=3), ValueError,
             r"num_results must be a python int in \[1, beam_size=2\], got 3"),
            (lambda: SearchOptions(alpha=float("nan")), ValueError, "alpha must be a finite number"),
            (lambda: SearchOptions(beam_size=tf.constant(2)), ValueError, "a tensor beam_size needs max_beam_size"),
            (lambda: Halvings(0), ValueError, r"Halvings.count must be a python int >= 1 \(KeepAll for none\), got 0"),
            (lambda: CacheStages((5, 2), resize_history), ValueError, r"increasing python ints >= 1, got \(5, 2\)"),
            (lambda: CacheStages((2,), None), TypeError, "CacheStages.resize must be a function"),
            (lambda: LoopOps(gather=None), TypeError, "LoopOps.gather must be a function, got None"),
            (lambda: SearchLoop(finished=DropFinished(), stages=stages), ValueError, "not with CacheStages"),
            (lambda: SearchLoop(LoopOps(trace_once=tf.function), DropFinished()), ValueError, "LoopOps.trace_once"),
            (lambda: SearchLoop(finished="drop"), TypeError, "KeepAll\\(\\), DropFinished\\(\\) or Halvings"),
            (lambda: search({"beam_size": 2}), TypeError, "options must be a SearchOptions"),
            (lambda: search(loop=DropFinished()), TypeError, "loop must be a SearchLoop"),
            (lambda: tf.function(lambda k: search(SearchOptions(beam_size=k, max_beam_size=4),
                                                  loop=SearchLoop(finished=Halvings(1))))(tf.constant(2)),
             ValueError, "needs a python int beam_size")):
        with pytest.raises(error, match=message):
            make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        SearchOptions().beam_size = 2
    assert SearchOptions(beam_size=np.int64(3), num_results=np.int32(2)).beam_size.__class__ is int
    assert SearchLoop().finished == KeepAll() and SearchLoop().ops is KERAS_OPS



def test_a_processor_joins_the_search_only_when_its_option_is_on():
    """`make_logits_processors` gives one processor per option that is on (a python value
    other than 0 / False, or a tensor), in CTranslate2's order with the prefix last, and none
    for the defaults (the step then adds no op); `make_sampler` samples only where the
    options do."""
    from keras_transformer.decoding import (BestSampler, DisallowUnk, MinLength, NoRepeatNgram, RandomSampler,
                                            TargetPrefix, make_logits_processors, make_sampler)

    assert make_logits_processors(SearchOptions(), EOS_ID) == ()
    assert make_logits_processors(SearchOptions(min_length=0, no_repeat_ngram_size=0), EOS_ID, has_prefix=True) == (
        TargetPrefix(),)
    processors = make_logits_processors(SearchOptions(disallow_unk=True, no_repeat_ngram_size=2, min_length=3),
                                        EOS_ID, has_prefix=True)
    assert processors == (MinLength(3, EOS_ID), NoRepeatNgram(2), DisallowUnk(True), TargetPrefix())
    size = tf.constant(0)  # a run-time value may be on: its processor is in the step
    assert [type(p) for p in make_logits_processors(SearchOptions(no_repeat_ngram_size=size), EOS_ID)] == [
        NoRepeatNgram]
    assert make_sampler(SearchOptions(), KERAS_OPS) == BestSampler()
    sampler = make_sampler(SearchOptions(beam_size=1, sampling_topk=5, seed=3), KERAS_OPS)
    assert isinstance(sampler, RandomSampler) and (sampler.topk, sampler.seed) == (5, 3)


def test_repetition_penalty_rescales_the_logits_of_each_generated_token_once():
    """`RepetitionPenalty` against CTranslate2's formula in NumPy, on hand-made logits: each
    distinct token among a hypothesis' tokens before `step` (a token twice is penalized once;
    BOS, never in `alive_seqs`, is not; PAD after `step` is not) has its logit divided by the
    penalty where >= 0, multiplied where < 0; the penalty comes before every mask (a masked
    token stays NEG_INF); 1.0 adds no processor."""
    import types

    from keras_transformer.decoding import NoRepeatNgram, RepetitionPenalty, make_logits_processors
    from keras_transformer.decoding.processors import _processed

    rng = np.random.default_rng(0)
    batch, beams, length, vocab, step = 2, 2, 6, 9, 4
    seqs = rng.integers(3, vocab, size=(batch, beams, length)).astype("int32")
    seqs[0, 0, :4] = [5, 5, 7, 5]  # a token three times
    seqs[..., step:] = PAD_ID
    logits = rng.normal(size=(batch * beams, vocab)).astype("float32")
    logits[0, 7] = 0.0
    for penalty in (1.8, 0.6):
        want = logits.copy()
        for row, history in enumerate(seqs.reshape(-1, length)):
            for token in set(history[:step].tolist()):
                want[row, token] = want[row, token] * penalty if want[row, token] < 0 else want[row, token] / penalty
        spec = types.SimpleNamespace(processors=(RepetitionPenalty(penalty),), neg_inf=np.float32(NEG_INF),
                                     beam_size=beams)
        got = ops.convert_to_numpy(_processed(ops.convert_to_tensor(logits), {"alive_seqs": seqs}, step, spec))
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert (got != logits).sum() >= batch * beams  # (the precondition: some logits penalized)
        run_time = RepetitionPenalty(tf.constant(penalty))  # a tensor penalty: the same logits
        np.testing.assert_allclose(ops.convert_to_numpy(run_time.rescaled(logits, {"alive_seqs": seqs}, step, spec)),
                                   want, rtol=1e-6)
    spec = types.SimpleNamespace(processors=(RepetitionPenalty(0.5), NoRepeatNgram(1)), neg_inf=np.float32(NEG_INF),
                                 beam_size=beams)
    got = ops.convert_to_numpy(_processed(ops.convert_to_tensor(logits), {"alive_seqs": seqs}, step, spec))
    assert got[0, 5] == got[0, 7] == np.float32(NEG_INF)  # (masked after the penalty: 0.5 would lift them)
    assert make_logits_processors(SearchOptions(repetition_penalty=1.0), EOS_ID) == ()
    processors = make_logits_processors(SearchOptions(repetition_penalty=2, min_length=2), EOS_ID)
    assert processors[0] == RepetitionPenalty(2.0) and len(processors) == 2


def test_suppress_sequences_disallow_what_ctranslate2s_rule_does():
    """`SuppressSequences` against CTranslate2's rule in NumPy, on hand-made histories: a
    one-token sequence is disallowed at every step (step 0 too); the last token of a longer one
    only where the hypothesis' last n - 1 tokens (before `step`) are its first n - 1, never
    at a step with fewer tokens; each row (hypothesis) by its own history; and no processor
    for no sequence."""
    import types

    from keras_transformer.decoding import SuppressSequences, make_logits_processors
    from keras_transformer.decoding.processors import _processed

    sequences = ((4,), (5, 6), (7, 5, 8), (6, 6, 6, 3))
    seqs = np.full((2, 2, 6), PAD_ID, np.int32)
    seqs[0, 0, :3] = [9, 7, 5]  # ends with (7, 5): 8 disallowed; with 5: 6 disallowed
    seqs[0, 1, :3] = [5, 7, 9]  # (5, 6)'s head not last: nothing but 4
    seqs[1, 0, :3] = [6, 6, 6]  # 3 disallowed (the 4-gram)
    seqs[1, 1, :3] = [8, 6, 6]  # 3 not: its last 3 are (8, 6, 6)... (6, 6) is not (6, 6, 6)
    logits = np.random.default_rng(1).normal(size=(4, 10)).astype("float32")
    spec = types.SimpleNamespace(processors=(SuppressSequences(sequences),), neg_inf=np.float32(NEG_INF),
                                 beam_size=2)

    def reference(step):
        banned = np.zeros_like(logits, bool)
        for row, history in enumerate(seqs.reshape(4, -1)):
            history = history[:step].tolist()
            for sequence in sequences:
                head = list(sequence[:-1])
                if len(history) >= len(head) and (not head or history[len(history) - len(head):] == head):
                    banned[row, sequence[-1]] = True
        return np.where(banned, np.float32(NEG_INF), logits)

    for step in (0, 1, 2, 3):
        got = ops.convert_to_numpy(_processed(ops.convert_to_tensor(logits), {"alive_seqs": seqs}, step, spec))
        np.testing.assert_array_equal(got, reference(step))
    got = ops.convert_to_numpy(_processed(ops.convert_to_tensor(logits), {"alive_seqs": seqs}, 3, spec))
    assert got[0, 8] == got[0, 6] == got[2, 3] == np.float32(NEG_INF) and got[3, 3] == logits[3, 3]
    assert (got[:, 4] == np.float32(NEG_INF)).all() and got[1, 8] == logits[1, 8]
    assert make_logits_processors(SearchOptions(suppress_sequences=[[], ()]), EOS_ID) == ()
    assert make_logits_processors(SearchOptions(suppress_sequences=[[np.int64(4)], [5, 6]]), EOS_ID) == (
        SuppressSequences(((4,), (5, 6))),)
    with pytest.raises(ValueError, match="suppress_sequences must be"):
        SearchOptions(suppress_sequences=[["a"]])
