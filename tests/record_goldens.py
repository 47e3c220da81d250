"""The decoding goldens (issue #91, "Goldens first"): what a restructuring of the decoding code
must not change, computed here and recorded in `tests/data/decoding_goldens.json`.

    python -m tests.record_goldens     # re-record: only for a change meant to change these numbers

`tests/test_goldens.py` computes the same things with the functions of this module and
compares them with the file. What is recorded, on one small random model (fixed seeds, not
`KERAS_TRANSFORMER_TEST_SEED`: goldens are fixed numbers; nothing trained):

* `searches`: the ids and scores of every search loop (`Searcher.search`'s request-sized
  graph loop and `STATIC_BUFFER`, `Searcher.search_litert` at a batch and at one sentence,
  `Searcher.search_xla`) with no constraint, each constraint (`min_length`,
  `no_repeat_ngram_size`, `disallow_unk`), a target prefix, sampling (top-k, top-p,
  temperature, fixed seeds), beam 1 and 4, one result and several. Each loop runs every
  case through two graphs whose options are run-time tensors (`translate_options`' and
  `translate_advanced`'s form: one trace runs every case), a beam search and a sampling
  search; the plain loop also runs python-valued options (`serving_default`'s form: no
  constraint, the three constraints, sampling), and `search_xla` takes python values.
* `xla_programs`: the programs `search_xla` traced (`Searcher._compiled`'s keys, as
  tests/test_searcher.py counts them) and each one's op multiset.
* `signature_ops`: each exported signature's op multiset (its function and every function
  it calls) in `saved_model.pb` of an export of all signatures.
* `step_nodes`: `benchmarks.step_nodes`' loop steps and nodes run per step by op type, per
  oneDNN setting (TensorFlow's graph rewrite changes the op types that run).

The recorder also checks that the goldens hold on other CPUs (`check_margins`): no search's
ids change when every logit is moved by up to `MARGIN` in `MARGIN_DRAWS` pseudo-random ways
(floats differ between CPU kinds by ~1e-6 in a logit), and that each constraint and the
prefix change some result (so that a golden of them is not the unconstrained search's).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDENS = pathlib.Path(__file__).with_name("data") / "decoding_goldens.json"
MODEL_SEED = 11
CONFIG_ARGS = dict(vocab_size=40, num_layers=1, d_model=32, d_ff=64, num_heads=4, dropout=0.0, max_length=12,
                   decode_extra_length=10)
# Four sources (ids 4..39; EOS 3, PAD 0) of 1-4 tokens, one padded batch.
SOURCE = [[5, 9, 13, 3, 0], [31, 3, 0, 0, 0], [7, 7, 7, 7, 3], [20, 4, 3, 0, 0]]
LENGTHS = [3, 1, 4, 2]
# Each sentence's target prefix (lengths 3, 1, 0, 4).
PREFIX = [[9, 9, 22, 0], [4, 0, 0, 0], [0, 0, 0, 0], [17, 18, 19, 20]]
PREFIX_LENGTHS = [3, 1, 0, 4]
# The recorder's margin check: each logit moved by up to MARGIN, MARGIN_DRAWS times.
MARGIN = 1e-4
MARGIN_DRAWS = 8

# The run-time (tensor) options' cases: name -> values; the rest are the defaults below.
BEAM_DEFAULTS = dict(beam_size=4, num_results=4, min_length=0, no_repeat_ngram_size=0, disallow_unk=False,
                     prefix=False)
BEAM_CASES = {
    "beam4_n4": {},
    "beam4_n1": {"num_results": 1},
    "beam1": {"beam_size": 1, "num_results": 1},
    "beam4_n4_min_length": {"min_length": 6},
    "beam4_n4_no_repeat": {"no_repeat_ngram_size": 2},
    "beam4_n4_disallow_unk": {"disallow_unk": True},
    "beam1_constraints": {"beam_size": 1, "num_results": 1, "min_length": 6, "no_repeat_ngram_size": 1,
                          "disallow_unk": True},
    "beam4_n4_prefix": {"prefix": True},
    "beam1_prefix": {"beam_size": 1, "num_results": 1, "prefix": True},
}
SAMPLE_DEFAULTS = dict(sampling_topk=1, sampling_topp=1.0, sampling_temperature=1.0, seed=0, min_length=0,
                       no_repeat_ngram_size=0, disallow_unk=False, prefix=False)
SAMPLE_CASES = {
    "sample_temperature": {"sampling_topk": 0, "sampling_temperature": 1.3, "seed": 7},
    "sample_topk": {"sampling_topk": 5, "sampling_temperature": 0.8, "seed": 3},
    "sample_topp": {"sampling_topk": 0, "sampling_topp": 0.6, "seed": 9},
    "sample_constraints": {"sampling_topk": 0, "seed": 5, "min_length": 4, "no_repeat_ngram_size": 1,
                           "disallow_unk": True},
    "sample_prefix": {"sampling_topk": 0, "sampling_temperature": 1.3, "seed": 7, "prefix": True},
}
# Cases that must differ from another (the constraint or prefix changes some result): the
# recorder's check that each golden shows what it is named for.
DIFFERS_FROM = {"beam4_n4_min_length": "beam4_n4", "beam4_n4_no_repeat": "beam4_n4",
                "beam4_n4_disallow_unk": "beam4_n4", "beam4_n4_prefix": "beam4_n4", "beam1_prefix": "beam1",
                "beam1_constraints": "beam1", "sample_prefix": "sample_temperature"}
# The python-valued searches of the plain graph's loop: name -> SearchOptions arguments (the
# other loops run the run-time options' graphs alone: each trace costs the test ~2 s).
PYTHON_CASES = {
    "beam4_n2": dict(beam_size=4, num_results=2),
    "beam4_n4_constraints": dict(beam_size=4, num_results=4, min_length=6, no_repeat_ngram_size=2,
                                 disallow_unk=True),
    "sample_topk_topp": dict(beam_size=1, num_results=1, sampling_topk=5, sampling_topp=0.8,
                             sampling_temperature=1.2, seed=3),
}
LOOPS = ("plain", "static", "litert")
# The XLA programs: name -> (beam, results, batch halvings, constraints).
XLA_CASES = {"xla_beam4_n2": (4, 2, 3, (0, 0, False)), "xla_beam1_constraints": (1, 1, 0, (6, 1, True))}


def config():
    from keras_transformer import TransformerConfig

    return TransformerConfig(**CONFIG_ARGS)


def build_model():
    """The random model, from `MODEL_SEED` alone; and its weights' SHA-256 (the goldens are
    only this model's: Keras initialising other weights is a re-recording, not a failure of
    the decoding code)."""
    import keras

    from keras_transformer import build_transformer
    from keras_transformer.constants import UNK_ID

    keras.utils.set_random_seed(MODEL_SEED)
    model = build_transformer(config())
    # UNK's row of the (tied) embeddings: 1.1 times that of token 5, which the random model
    # repeats: UNK then outscores it wherever its logit is positive, so that `disallow_unk`
    # changes results by construction.
    embeddings = next(v for v in model.weights if v.path == "embedding/embeddings")  # [vocab, d_model]
    rows = np.array(embeddings.numpy())
    rows[UNK_ID] = 1.1 * rows[5]
    embeddings.assign(rows)
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight, np.float32).tobytes())
    return model, digest.hexdigest()


def noise_filter(amplitude, seed):
    """A `logits_filter` that adds to each logit a pseudo-random value in
    `[-amplitude, amplitude]` (a hash of its row, column and the `seed` variable): the
    margin check's CPU of other floats."""
    import tensorflow as tf

    def add_noise(logits):  # [rows, vocab]
        shape = tf.shape(logits)
        rows = tf.cast(tf.range(shape[0]), tf.float32)[:, None]
        columns = tf.cast(tf.range(shape[1]), tf.float32)[None, :]
        hashed = tf.sin(rows * 12.9898 + columns * 78.233 + seed * 37.719) * 43758.5453
        uniform = hashed - tf.floor(hashed)  # [rows, vocab] in [0, 1)
        return logits + tf.cast(amplitude * (2.0 * uniform - 1.0), logits.dtype)

    return add_noise


def _tensors(values, names):
    import tensorflow as tf

    dtypes = {"disallow_unk": tf.bool, "sampling_topp": tf.float32, "sampling_temperature": tf.float32}
    return {name: tf.constant(values[name], dtypes.get(name, tf.int32)) for name in names}


def search_goldens(searcher):
    """`{case name: {"ids": nested list, "scores": nested list}}` of every loop's searches."""
    return search_runner(searcher)()


def search_runner(searcher):
    """A function that runs every loop's searches and returns `search_goldens`' dict: each
    graph traced (and each XLA program compiled) on its first call only."""
    import tensorflow as tf

    from keras_transformer.decoding import SearchOptions
    from keras_transformer.inference.searcher import STATIC_BUFFER

    source, lengths = tf.constant(SOURCE, tf.int32), tf.constant(LENGTHS, tf.int32)
    prefix, prefix_lengths = tf.constant(PREFIX, tf.int32), tf.constant(PREFIX_LENGTHS, tf.int32)
    extra = searcher.config.decode_extra_length
    constraint_names = ("min_length", "no_repeat_ngram_size", "disallow_unk")
    sampling_names = ("sampling_topk", "sampling_topp", "sampling_temperature", "seed")
    results = {}

    def run(loop, options, ids, lengths, use_prefix, prefix_lengths):
        if loop == "litert":
            return searcher.search_litert(ids, lengths, options)
        kwargs = {"buffer": STATIC_BUFFER} if loop == "static" else {}
        if use_prefix is not None:  # (a prefix of length 0 where the case has none)
            kwargs["target_prefix"] = (prefix, tf.where(use_prefix, prefix_lengths, 0))
        return searcher.search(ids, lengths, options, **kwargs)

    def record(name, ids, scores):
        results[name] = {"ids": ids.numpy().tolist(), "scores": scores.numpy().tolist()}

    beam_names = ("beam_size", "num_results") + constraint_names
    sample_names = constraint_names + sampling_names
    ids_spec, lengths_spec = tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)

    def signature(names):  # one trace for every batch (search_litert's two branches)
        values = _tensors({**BEAM_DEFAULTS, **SAMPLE_DEFAULTS}, names)
        return [ids_spec, lengths_spec, {n: tf.TensorSpec([], v.dtype) for n, v in values.items()},
                tf.TensorSpec([], tf.bool), lengths_spec]

    def graphs(loop):
        """The loop's traced searches: the run-time options' beam search and sampling
        search, and one per python-valued case."""
        with_prefix = loop != "litert"  # (search_litert takes no prefix)

        @tf.function(autograph=False, input_signature=signature(beam_names))
        def beam(ids, lengths, values, use_prefix, prefix_lengths):
            options = SearchOptions(beam_size=values["beam_size"], num_results=values["num_results"], max_beam_size=4,
                                    alpha=0.6, extra_length=extra, **{n: values[n] for n in constraint_names})
            return run(loop, options, ids, lengths, use_prefix if with_prefix else None, prefix_lengths)

        @tf.function(autograph=False, input_signature=signature(sample_names))
        def sample(ids, lengths, values, use_prefix, prefix_lengths):
            options = SearchOptions(beam_size=1, num_results=1, alpha=0.6, extra_length=extra,
                                    **{n: values[n] for n in sample_names})
            return run(loop, options, ids, lengths, use_prefix if with_prefix else None, prefix_lengths)

        def python(arguments):
            options = SearchOptions(alpha=0.6, extra_length=extra, **arguments)
            return tf.function(lambda i, n: run(loop, options, i, n, None, None), autograph=False,
                               input_signature=[ids_spec, lengths_spec])

        cases = PYTHON_CASES.items() if loop == "plain" else ()
        return beam, sample, {case: python(arguments) for case, arguments in cases}

    traced = {loop: graphs(loop) for loop in LOOPS}

    def run_all():
        results.clear()
        for loop, (beam, sample, python) in traced.items():
            batches = {"": (source, lengths, prefix_lengths)}
            if loop == "litert":  # one sentence too: search_litert's static-buffer branch
                batches["_one"] = (source[:1], lengths[:1], prefix_lengths[:1])
            for suffix, (ids, sentence_lengths, sentence_prefix_lengths) in batches.items():
                for cases, defaults, function, names in ((BEAM_CASES, BEAM_DEFAULTS, beam, beam_names),
                                                         (SAMPLE_CASES, SAMPLE_DEFAULTS, sample, sample_names)):
                    for case, changes in cases.items():
                        values = {**defaults, **changes}
                        if values["prefix"] and loop == "litert":
                            continue
                        out = function(ids, sentence_lengths, _tensors(values, names), tf.constant(values["prefix"]),
                                       sentence_prefix_lengths)
                        record(f"{loop}{suffix}/runtime/{case}", *out)
                for case, function in python.items():
                    record(f"{loop}{suffix}/python/{case}", *function(ids, sentence_lengths))
        for name, (beam_size, num_results, halvings, constraints) in XLA_CASES.items():
            min_length, no_repeat_ngram_size, disallow_unk = constraints
            options = SearchOptions(beam_size=beam_size, alpha=0.6, extra_length=extra, num_results=num_results,
                                    min_length=min_length, no_repeat_ngram_size=no_repeat_ngram_size,
                                    disallow_unk=disallow_unk)
            record(name, *searcher.search_xla(source, lengths, options, batch_halvings=halvings))
        return dict(results)

    return run_all


def function_ops(library, name, ops=None, seen=None):
    """The op multiset of function `name` and every function it calls (once each), in a
    `FunctionDefLibrary`: a Counter of op type (`helpers.function_nodes`)."""
    from helpers import function_nodes

    ops = collections.Counter() if ops is None else ops
    ops.update(node.op for node in function_nodes({f.signature.name: f for f in library.function}, [name], seen))
    return ops


def graph_ops(graph_def):
    """The op multiset of a `GraphDef`'s nodes and the functions they call."""
    ops = collections.Counter(node.op for node in graph_def.node)
    seen = set()
    for node in graph_def.node:
        for value in node.attr.values():
            if value.HasField("func"):
                function_ops(graph_def.library, value.func.name, ops, seen)
            for f in value.list.func:
                function_ops(graph_def.library, f.name, ops, seen)
        if node.op in {f.signature.name for f in graph_def.library.function}:
            function_ops(graph_def.library, node.op, ops, seen)
    return ops


def xla_goldens(searcher):
    """The programs `search_xla` traced (after `search_goldens`): `{key: {"traces", "ops"}}`."""
    programs = {}
    for key, function in searcher._compiled.items():
        traces = function.experimental_get_tracing_count()
        if traces:
            graph = function.get_concrete_function().graph.as_graph_def()
            programs[repr(key)] = {"traces": traces, "ops": dict(sorted(graph_ops(graph).items()))}
    return programs


def tokenizer_bytes(directory):
    """A SentencePiece model of the config's vocabulary (the toy language's words): the
    export needs one; the op multisets do not depend on its pieces."""
    from helpers import WORDS_EN

    from keras_transformer.data import Tokenizer, train_tokenizer

    texts = [" ".join(WORDS_EN[i:] + WORDS_EN[:i]) for i in range(len(WORDS_EN))] * 4
    return Tokenizer.load(train_tokenizer(texts, pathlib.Path(directory) / "sp", CONFIG_ARGS["vocab_size"])).model_bytes


def signature_goldens(model, directory):
    """Each signature's op multiset in `saved_model.pb` of an export of all signatures:
    the function its signature def's outputs come from and all it calls."""
    from tensorflow.core.protobuf import saved_model_pb2

    from export.saved_model import export_model

    path = export_model(model, config(), tokenizer_bytes(directory), pathlib.Path(directory) / "export")
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / "saved_model.pb").read_bytes())
    meta = proto.meta_graphs[0]
    nodes = {node.name: node for node in meta.graph_def.node}
    signatures = {}
    for name, signature in sorted(meta.signature_def.items()):
        if name.startswith("__"):  # (`__saved_model_init_op`: no signature)
            continue
        callers = {tensor.name.split(":")[0] for tensor in signature.outputs.values()}  # StatefulPartitionedCall
        ops = collections.Counter()
        seen = set()
        for node in sorted(callers):
            function_ops(meta.graph_def.library, nodes[node].attr["f"].func.name, ops, seen)
        signatures[name] = dict(sorted(ops.items()))
    return signatures


def onednn_key():
    """"onednn" where TensorFlow's oneDNN graph rewrite is on (`TF_ENABLE_ONEDNN_OPTS`, or by
    default on CPUs with AVX-512 VNNI or BF16, or AMX), else "eigen"."""
    from tensorflow.python.util import _pywrap_util_port

    return "onednn" if _pywrap_util_port.IsMklEnabled() else "eigen"


def step_nodes_goldens(model, directory):
    """`benchmarks.step_nodes` on the model (beam 4, batch 1 and the four sources):
    `{"batch1": {"steps", "ops"}, "batch4": ...}`."""
    from benchmarks import step_nodes

    path = str(pathlib.Path(directory) / "step_nodes")
    step_nodes.save_search(model, config(), 4, path)
    source, lengths = np.array(SOURCE, np.int32), np.array(LENGTHS, np.int32)
    counted = {}
    for batch in (1, 4):
        steps, ops = step_nodes.count_nodes(path, source[:batch], lengths[:batch])
        counted[f"batch{batch}"] = {"steps": steps, "ops": dict(sorted(ops.items()))}
    return counted


def compute(directory):
    """Every golden but `step_nodes`: `(goldens, searcher)`."""
    from keras_transformer.inference.searcher import Searcher

    model, digest = build_model()
    searcher = Searcher(model, config())
    goldens = {"weights_sha256": digest, "searches": search_goldens(searcher)}
    goldens["xla_programs"] = xla_goldens(searcher)
    goldens["signature_ops"] = signature_goldens(model, directory)
    return goldens, model


def check_margins(model, searches):
    """The recorder's checks that the goldens hold on any CPU: no search's ids change when
    each logit moves by up to `MARGIN` (`MARGIN_DRAWS` draws); each constraint and the prefix
    change some result of their case against the unconstrained one's."""
    import tensorflow as tf

    from keras_transformer.inference.searcher import Searcher

    for name in searches:
        loop, _, case = name.rpartition("/")
        if case in DIFFERS_FROM and not loop.startswith("litert_one"):  # (one sentence: it may not)
            assert searches[name]["ids"] != searches[f"{loop}/{DIFFERS_FROM[case]}"]["ids"], f"{name} changes nothing"
    seed = tf.Variable(0.0)
    noisy = Searcher(model, config(), logits_filter=noise_filter(MARGIN, seed))
    moved = collections.Counter()
    run_all = search_runner(noisy)
    for draw in range(1, MARGIN_DRAWS + 1):
        seed.assign(float(draw))  # (a variable the graphs read: no draw traces or compiles again)
        for name, got in run_all().items():
            if got["ids"] != searches[name]["ids"]:
                moved[name] += 1
    assert not moved, f"ids a logit move of {MARGIN} changes (near-ties: choose other inputs): {dict(moved)}"


def record_step_nodes(goldens, model):
    with tempfile.TemporaryDirectory() as directory:
        goldens.setdefault("step_nodes", {})[onednn_key()] = step_nodes_goldens(model, directory)


def dumps(goldens):
    """The goldens as JSON with one line per search, program, signature and batch (diffs
    that show which changed)."""
    lines = ["{"]
    for i, (key, value) in enumerate(goldens.items()):
        comma = "," if i < len(goldens) - 1 else ""
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            lines.append(f"  {json.dumps(key)}: {{")
            for j, (name, item) in enumerate(value.items()):
                inner = "," if j < len(value) - 1 else ""
                if key == "step_nodes":
                    lines.append(f"    {json.dumps(name)}: {json.dumps(item, sort_keys=True)}{inner}")
                else:
                    lines.append(f"    {json.dumps(name)}: {json.dumps(item)}{inner}")
            lines.append(f"  }}{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    return "\n".join(lines + ["}"]) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-nodes-only", action="store_true",
                        help="record only the step nodes of this process's oneDNN setting, keeping the rest")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).parent))  # (helpers, as under pytest)
    import keras
    import tensorflow as tf

    old = json.loads(GOLDENS.read_text()) if GOLDENS.exists() else {}
    if args.step_nodes_only:
        model, digest = build_model()
        assert digest == old["weights_sha256"], "the model's weights are not the recording's"
        record_step_nodes(old, model)
        goldens = old
    else:
        with tempfile.TemporaryDirectory() as directory:
            goldens, model = compute(directory)
        check_margins(model, goldens["searches"])
        goldens["step_nodes"] = {}
        record_step_nodes(goldens, model)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        goldens = {"recorded": {"commit": commit, "tensorflow": tf.__version__, "keras": keras.__version__},
                   **goldens}
    GOLDENS.write_text(dumps(goldens))
    print(f"wrote {GOLDENS.relative_to(ROOT)}: {len(goldens['searches'])} searches, "
          f"{len(goldens['xla_programs'])} XLA programs, {len(goldens['signature_ops'])} signatures, "
          f"step nodes for {', '.join(goldens['step_nodes'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
