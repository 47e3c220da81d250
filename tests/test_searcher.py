"""The searches of `Searcher`: the plain graph's kernel choice per request, the XLA
search's programs per batch bucket."""

import os
import traceback

import numpy as np
import pytest
import tensorflow as tf
from helpers import WORDS_EN

from keras_transformer import TransformerConfig, build_transformer
from keras_transformer.inference import searcher as searcher_module
from keras_transformer.constants import EOS_ID, PAD_ID
from keras_transformer.layers import attention as attention_module
from keras_transformer.layers.attention import SMALL_ATTENTION
from keras_transformer.decoding import DropFinished, SearchOptions
from keras_transformer.inference.searcher import (LITERT_BATCH, REQUEST_SIZED, STATIC_BUFFER, RequestLoop, Searcher,
                                        broadcast_products_suffice)
from keras_transformer.inference.translator import Translator


def tiny_model_and_sources(num_layers, seed, width):
    """A small random model (12 tokens, +6) and three random sources of `width`
    tokens ending with EOS."""
    config = TransformerConfig(vocab_size=40, num_layers=num_layers, d_model=16, d_ff=32, num_heads=2,
                               dropout=0.0, max_length=12, decode_extra_length=6)
    source = np.random.default_rng(seed).integers(3, 40, size=(3, width)).astype("int32")
    source[:, -1] = EOS_ID
    return config, build_transformer(config), source


def assert_same_search(ids, scores, want_ids, want_scores):
    """XLA search results against the plain search's: the same ids over the shorter
    buffer, PAD beyond it, scores equal to float32 rounding."""
    ids, want_ids = ids.numpy(), want_ids.numpy()
    width = min(ids.shape[2], want_ids.shape[2])
    np.testing.assert_array_equal(ids[:, :, :width], want_ids[:, :, :width])
    assert (ids[:, :, width:] == PAD_ID).all() and (want_ids[:, :, width:] == PAD_ID).all()
    np.testing.assert_allclose(scores.numpy(), want_scores.numpy(), rtol=1e-5)


def test_broadcast_products_suffice_at_the_largest_product():
    """rows x d_model x keys entries against SMALL_ATTENTION, as each attention call
    compares its own product (rows x heads x keys x head_size); no int32 overflow."""
    assert bool(broadcast_products_suffice(4, 128, SMALL_ATTENTION // 512))
    assert not bool(broadcast_products_suffice(4, 128, SMALL_ATTENTION // 512 + 1))
    assert not bool(broadcast_products_suffice(2**20, 1024, 2**12))  # 2^42 entries


def test_one_loop_of_broadcast_products_equals_the_choice_per_call(monkeypatch):
    """When every product is small the request runs a loop traced with the broadcast
    products alone (no cond per attention): the same kernels as choosing per call,
    so bit-identical ids and scores, at batch 1 and batch 3, also with n-best, when
    both loops are lowered into the graph (`single_threaded_loop=False`). Run by the
    single-threaded executor (the default), its body is a function of its own, which
    Grappler folds constants into differently: the same ids, scores to float32 rounding."""
    config, model, source = tiny_model_and_sources(num_layers=2, seed=3, width=7)
    source[1, 4:] = PAD_ID
    source[1, 3] = EOS_ID
    lengths = np.array([7, 4, 7], "int32")

    requests = ((1, 1), (3, 1), (3, 2))
    spec = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)]

    def run(searcher):  # every request, one trace per num_results
        searches = {n: tf.function(lambda i, l, n=n: searcher.search(i, l, SearchOptions(
                        beam_size=4, alpha=0.6, extra_length=6, num_results=n)), input_signature=spec)
                    for n in {n for _, n in requests}}
        return [tuple(x.numpy() for x in searches[n](source[:batch], lengths[:batch])) for batch, n in requests]

    single_threaded = run(Searcher(model, config))
    results = {}
    for forced in (False, True):
        if forced:  # no request qualifies: every attention chooses per call (and picks broadcast)
            monkeypatch.setattr(searcher_module, "SMALL_ATTENTION", -1)
        results[forced] = run(Searcher(model, config, single_threaded_loop=False))
    for (ids, scores), (want_ids, want_scores) in zip(results[False], results[True]):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(scores, want_scores)
    for (ids, scores), (want_ids, want_scores) in zip(single_threaded, results[False]):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-6)
    assert (results[False][1][0][:, 0, 0] > PAD_ID).all()  # real outputs


def test_a_batch_of_one_runs_the_xla_search_without_halvings():
    """A batch bucket of one sentence cannot shrink, so `search_xla` runs (and
    compiles) the program without batch halvings there, and the halving one for
    larger buckets: each gives the plain search's ids and scores, and traces the
    loop's body once."""
    config, model, source = tiny_model_and_sources(num_layers=1, seed=5, width=6)
    lengths = np.array([6, 6, 6], "int32")
    searcher = Searcher(model, config)
    options = SearchOptions(beam_size=3, alpha=0.6, extra_length=6, num_results=1)
    plain = tf.function(lambda i, n: searcher.search(i, n, options))
    for batch, halvings in ((1, 0), (3, searcher_module.XLA_BATCH_HALVINGS)):
        ids, scores = searcher.search_xla(source[:batch], lengths[:batch], options)  # eager: one branch runs
        traced = {key[2] for key, f in searcher._compiled.items() if f.experimental_get_tracing_count()}
        assert halvings in traced and (batch > 1 or traced == {0}), (batch, traced)
        assert_same_search(ids, scores, *plain(source[:batch], lengths[:batch]))
    # Each program traces the loop's body once (the decoder step and the search's bookkeeping
    # for it), a function its copies call (4 cache stages, times 4 batch sizes after the first
    # stage with halvings): the two programs' graphs hold the same products, where a copy
    # traced per call would give 13 steps' against 4.
    def counts(halvings):
        graph = searcher.compiled_search(options, halvings).get_concrete_function().graph.as_graph_def()
        traced = [sum(name in f.signature.name for f in graph.library.function) for name in ("step_fn", "search_body")]
        nodes = [*graph.node, *(node for f in graph.library.function for node in f.node_def)]
        return (*traced, sum(node.op in ("MatMul", "BatchMatMulV3", "Einsum") for node in nodes))

    no_halvings = counts(0)
    assert counts(searcher_module.XLA_BATCH_HALVINGS) == no_halvings
    assert no_halvings[:2] == (1, 1) and no_halvings[2] > 0, no_halvings


def test_a_large_output_matrix_is_read_as_stored_by_the_batch_one_xla_program(monkeypatch):
    """From `XLA_FOLDED_PROJECTION_BYTES` on, the batch-1 XLA program multiplies by the
    embeddings as stored: it makes no transposed copy of them before its loop (each step's
    transpose is XLA's to fold into the dot), where the same program without the fold
    makes one; and it gives the plain search's ids and scores."""
    config, model, source = tiny_model_and_sources(num_layers=1, seed=7, width=6)
    matrix_bytes = config.vocab_size * config.d_model * 4  # float32
    monkeypatch.setattr(searcher_module, "XLA_FOLDED_PROJECTION_BYTES", matrix_bytes + 1)
    assert not Searcher(model, config).folds_projection_at_batch_one()
    monkeypatch.setattr(searcher_module, "XLA_FOLDED_PROJECTION_BYTES", matrix_bytes)
    searcher = Searcher(model, config)
    assert searcher.folds_projection_at_batch_one()
    lengths = np.array([6], "int32")

    options = SearchOptions(beam_size=3, alpha=0.6, extra_length=6, num_results=1)
    ids, scores = searcher.search_xla(source[:1], lengths, options)  # eager: one branch runs
    plain = tf.function(lambda i, n: searcher.search(i, n, options))
    assert_same_search(ids, scores, *plain(source[:1], lengths))
    ran = {key for key, f in searcher._compiled.items() if f.experimental_get_tracing_count()}
    assert ran == {(3, 1, 0, True)}, ran  # (beam, results, halvings, folded)

    def transposes_before_the_loop(function):  # of the embeddings, [d_model, vocab]
        graph = function.get_concrete_function().graph
        return sum(op.type == "Transpose" and op.outputs[0].shape.as_list() == [config.d_model, config.vocab_size]
                   for op in graph.get_operations())

    assert transposes_before_the_loop(searcher.compiled_search(options, 0, fold_projection=True)) == 0
    assert transposes_before_the_loop(searcher.compiled_search(options, 0, fold_projection=False)) == 1


def test_eigen_transpose_moves_the_bits_as_tf_transpose_does():
    """`eigen_transpose` (a transpose of the bits as integers) equals `tf.transpose` bit for
    bit on float32, bfloat16 and float64, -0.0, infinities and NaN included, and its graph
    transposes integers only (what TensorFlow's oneDNN pass leaves to Eigen)."""
    values = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype("float32")
    values.flat[:4] = [-0.0, np.inf, -np.inf, np.nan]
    for dtype in (tf.float32, tf.bfloat16, tf.float64):
        x = tf.cast(values, dtype)
        got, want = searcher_module.eigen_transpose(x, (0, 2, 1, 3)), tf.transpose(x, (0, 2, 1, 3))
        assert got.dtype == dtype and got.shape == want.shape == (2, 4, 3, 5)
        integer = searcher_module._SAME_SIZE_INTEGER[dtype.size]
        np.testing.assert_array_equal(tf.bitcast(got, integer).numpy(), tf.bitcast(want, integer).numpy())
    graph = tf.function(lambda x: searcher_module.eigen_transpose(x, (1, 0))).get_concrete_function(
        tf.TensorSpec([2, 3], tf.float32)).graph
    assert [op.get_attr("T") for op in graph.get_operations() if op.type == "Transpose"] == [tf.int32]


def test_the_plain_loops_large_attention_products_run_out_of_onednn_and_equal_the_static_search(monkeypatch):
    """The loop that chooses per attention (`small_kernels=True`) takes its large products as
    `eigen_matmul`'s `BatchMatMulV3` and its transposes as `eigen_transpose`'s
    (`LARGE_REQUEST_KERNELS`): with every product
    large it gives the ids and scores of the static-buffer search (LiteRT's, whose attentions
    keep their einsums and softmax), at batch 3 with a padded source, also with n-best; its
    graph holds one `q k^T` (`adj_y`) node per attention of each layer, and no other, and
    cross-attention's two transposes of each layer, of integers."""
    monkeypatch.setattr(searcher_module, "SMALL_ATTENTION", -1)  # no request runs the small-request loop
    monkeypatch.setattr(attention_module, "SMALL_ATTENTION", 0)  # every attention call takes the large products
    config, model, source = tiny_model_and_sources(num_layers=2, seed=9, width=7)
    source[1, 4:] = PAD_ID
    source[1, 3] = EOS_ID
    lengths = np.array([7, 4, 7], "int32")
    searcher = Searcher(model, config)
    for num_results in (1, 2):
        options = SearchOptions(beam_size=4, alpha=0.6, extra_length=6, num_results=num_results)
        plain = tf.function(lambda i, n: searcher.search(i, n, options))
        static = tf.function(lambda i, n: searcher.search(i, n, options, buffer=STATIC_BUFFER))
        ids, scores = plain(source, lengths)
        assert (ids.numpy()[:, 0, 0] > PAD_ID).all()  # real outputs
        assert_same_search(*static(source, lengths), ids, scores)
    library = plain.get_concrete_function(source, lengths).graph.as_graph_def().library
    transposed = [node for function in library.function for node in function.node_def
                  if node.op == "BatchMatMulV3" and node.attr["adj_y"].b]
    assert len(transposed) == 2 * config.num_layers, [node.name for node in transposed]
    integer_transposes = [node for function in library.function for node in function.node_def
                          if node.op == "Transpose" and node.attr["T"].type == tf.int32.as_datatype_enum]
    assert len(integer_transposes) == 2 * config.num_layers, [node.name for node in integer_transposes]


def test_autograph_rewrites_none_of_the_search(tmp_path):
    """The search graph needs no autograph (`searcher.not_converted`): traced from a
    caller's `tf.function` with autograph on (the default), through
    `Translator.translate_graph` and as the XLA program, every
    frame of the package's code between the entry point and the step function runs
    from the package's source files, none from autograph's rewritten copies (where a
    converted function's frames live, in `__autograph_generated_file*.py`); and the
    search gives the same results as in eager mode."""
    from keras_transformer.data import Tokenizer, train_tokenizer

    config, model, source = tiny_model_and_sources(num_layers=1, seed=3, width=6)
    stacks = []

    def probe(logits):  # the search's logits_filter: runs inside the step function, at trace time
        stacks.append([frame.filename for frame in traceback.extract_stack()])
        return logits

    def rewritten_below_entry(stack):
        """The frames from the first of the package's on that autograph rewrote."""
        first = next(i for i, name in enumerate(stack) if "keras_transformer" in name)
        return [name for name in stack[first:] if "__autograph_generated" in name]

    def traced_stacks(trace):
        """The stacks `trace()` records (at least one: its step function was traced)."""
        before = len(stacks)
        result = trace()
        assert len(stacks) > before
        return result, stacks[before:]

    searcher = Searcher(model, config, logits_filter=probe)
    lengths = np.array([6, 6, 6], "int32")
    options = SearchOptions(beam_size=2, alpha=0.6, extra_length=6, num_results=1)
    plain, traced = traced_stacks(  # autograph on, as in a caller's own tf.function
        lambda: tf.function(lambda i, n: searcher.search(i, n, options))(source, lengths))
    assert_same_search(*plain, *searcher.search(source, lengths, options))  # eager
    traced += traced_stacks(lambda: searcher.compiled_search(options, 0).get_concrete_function())[1]
    texts = [" ".join(WORDS_EN[i:] + WORDS_EN[:i]) for i in range(len(WORDS_EN))] * 4
    tokenizer = Tokenizer.load(train_tokenizer(texts, tmp_path / "sp", config.vocab_size))
    translator = Translator(model, config, tokenizer.model_bytes, logits_filter=probe)
    traced += traced_stacks(
        lambda: tf.function(lambda t: translator.translate_graph(t, options))(tf.constant(texts[:2])))[1]
    for stack in traced:
        assert any(name.endswith(os.path.join("decoding", "loops.py")) for name in stack), stack  # beam_search's own frame
        assert not rewritten_below_entry(stack), stack


def test_each_buffer_searches_as_the_request_sized_one():
    """`Searcher.search(ids, lengths, SearchOptions(...), buffer=...)`: `STATIC_BUFFER` and
    `LITERT_BATCH` find `REQUEST_SIZED`'s ids, and its scores to float32 rounding (n-best with
    patience; the static buffer's ids are wider, PAD after);
    anything but a `SearchOptions`, or a `RequestLoop` that cannot run, is an error naming
    what was given."""
    config, model, source = tiny_model_and_sources(num_layers=1, seed=5, width=6)
    lengths = np.array([6, 6, 6], "int32")
    searcher = Searcher(model, config)
    options = SearchOptions(beam_size=3, alpha=0.6, num_results=2, extra_length=6, patience=1.0)
    want = tf.function(lambda i, n: searcher.search(i, n, options, buffer=REQUEST_SIZED))(source, lengths)
    assert (want[0].numpy()[:, 0, 0] != PAD_ID).all()
    for buffer in (STATIC_BUFFER, LITERT_BATCH):
        assert_same_search(*tf.function(lambda i, n: searcher.search(i, n, options, buffer=buffer))(source, lengths),
                           *want)
    with pytest.raises(TypeError, match="Searcher.search takes a SearchOptions, got 3"):
        searcher.search(source, lengths, 3)
    with pytest.raises(ValueError, match="a single-threaded loop runs no cond"):
        RequestLoop("always", None, DropFinished(), single_threaded=True)

