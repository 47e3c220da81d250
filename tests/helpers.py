"""Small corpora and models made inside the tests."""

import contextlib
import os

WORDS_EN = "the a man woman dog cat sees buys red big small house book today".split()
WORDS_DE = "der die Mann Frau Hund Katze sieht kauft rot groß klein Haus Buch heute".split()

# Test sentences of the toy language (test_ctranslate2, benchmarks.ctranslate2_parity),
# whose sentences have 3-7 words; a few here are shorter or longer (the toy model then
# repeats words up to the length limit), and two have a word ("and") that is not in the
# toy vocabulary.
GOLDEN = [
    "the man sees the dog", "a red house today", "the big cat buys a small book",
    "today the woman sees a small red cat", "book", "the dog", "a woman buys the house",
    "the small man sees a big dog today", "red cat", "the woman buys a book today",
    "a big red house", "the cat sees the man", "today a dog buys a small red book",
    "the house", "a small woman sees the big cat", "the man buys a red book today",
    "big dog sees small cat", "the woman sees the man and the dog",
    "today the big red cat sees a small woman buys the book",
    "the red dog buys the house today and the small cat sees a man",
]


def reference(text):
    """The toy corpus's word-for-word translation (unknown words kept)."""
    return " ".join(WORDS_DE[WORDS_EN.index(w)] if w in WORDS_EN else w for w in text.split())


def target_prefixes(references):
    """One target prefix per sentence, in turn: its reference's first word, a word the
    reference lacks ("heute": a start the model would not choose), none ("")."""
    return [text.split()[0] if i % 3 == 0 else ("heute" if i % 3 == 1 else "") for i, text in enumerate(references)]


# Each GOLDEN sentence's prefix.
PREFIXES = target_prefixes([reference(text) for text in GOLDEN])

# Sentences of the toy language that say a word pair again (3-7 words, as the toy corpus's): their
# word-for-word translations repeat a bigram (and so a word), which `no_repeat_ngram_size` must
# change whatever weights the toy learned (test_ctranslate2).
REPEATING = [
    "the dog the dog the dog", "a cat sees a cat", "red book red book red book", "the man buys the man today",
    "big house big house", "the woman sees the woman", "a small dog a small dog", "today the cat today the cat",
]

# What TensorFlow 2.21 logs on each hit of its persistent XLA cache (export.translate, README).
CACHE_HIT = ("E0000 00:00:1795929083.036984    9037 text_format.cc:378] Error parsing text-format "
             "tensorflow.XlaSerializedCacheEntry: 2:1: Expected identifier, got: 5\n")
# What TensorFlow 2.21 logs with oneDNN on, on a CPU without AVX-512, when a plain search first
# runs an int32 op that its graph rewrite gave to oneDNN (export.translate --n-best or --no-xla on
# a 2-vCPU AVX2 EPYC, 2026-11-29).
ONEDNN_FALLBACK = ("E0000 00:00:1795975060.214005   24496 util.cc:131] oneDNN supports DT_INT32 only on "
                   "platforms with AVX-512. Falling back to the default Eigen-based implementation if present.\n")


# What LiteRT (ai-edge-litert) logs from C++ when its interpreter first runs a model.
LITERT_DELEGATE = "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n"


def import_log(stderr: str) -> tuple[set[str], list[str]]:
    """The standard error of a `python -X importtime ...` run, split in two: the modules the
    interpreter's import log names (its `import time: ... | NAME` lines), and the other lines
    (what the program itself wrote)."""
    imported, lines = set(), []
    for line in stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[-1].strip())
        else:
            lines.append(line)
    return imported, lines


# The environment variable that moves the seed of every trained (or randomly initialised) test
# fixture: `KERAS_TRANSFORMER_TEST_SEED=1 python -m pytest -q` trains the toy models, draws
# their corpora and initialises the fixtures' models from other seeds, as an unseen CPU's
# floats would give other weights (docs/development.md, "Tests on any CPU").
SEED_VARIABLE = "KERAS_TRANSFORMER_TEST_SEED"


# The seed every test starts from (`conftest._seed`).
TEST_SEED = 1234


def seed_keeping_tensorflows_caches(seed):
    """`keras.utils.set_random_seed(seed)` (Python's, NumPy's, Keras' and TensorFlow's global
    seeds) without the one thing more that `tf.random.set_seed` does in eager mode: clear the
    eager context's caches, which drops every function TensorFlow has instantiated. Run before
    each test, that clear made each test instantiate again (Grappler and all) every loaded or
    traced function it called, although an earlier test had: 2-3 s for one call of a loaded
    export's `translate_advanced`.

    What the clear is for, restarting the counters of stateful random kernels (`tf.random.uniform`
    run eagerly twice with the same seeds), no code here relies on: the package's random ops are
    stateless, and Keras draws its seeds from its own seed generator. The ops' seeds are those of
    `tf.random.set_seed` (tests/test_suite_seeding.py checks both)."""
    import random

    import keras
    import tensorflow as tf
    from tensorflow.python.eager import context

    eager = context.context()

    def set_seed(value):  # `Context._set_global_seed` less its `TFE_ContextClearCaches`
        eager._seed = value
        eager._rng = random.Random(value)

    if not (hasattr(eager, "_seed") and hasattr(eager, "_set_global_seed")):  # (another TensorFlow)
        keras.utils.set_random_seed(seed)
        return
    original = tf.random.set_seed
    tf.random.set_seed = set_seed  # (what keras.utils.set_random_seed calls, looked up at the call)
    try:
        keras.utils.set_random_seed(seed)
    finally:
        tf.random.set_seed = original


def fixture_seed(seed: int = 0) -> int:
    """The seed a test fixture trains or initialises with: `seed` plus `$KERAS_TRANSFORMER_TEST_SEED`
    (0 when unset, so that a plain run keeps every fixture's own seed)."""
    value = os.environ.get(SEED_VARIABLE, "0")
    try:
        offset = int(value)
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE} must be an integer, got {value!r}") from None
    if offset < 0:
        raise ValueError(f"{SEED_VARIABLE} must be >= 0, got {offset}")
    return seed + offset


def write_corpus(directory, pairs=240, valid=12, seed=0):
    """A toy word-for-word corpus in the text-directory layout."""
    import random

    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)

    def lines(n):
        src, tgt = [], []
        for _ in range(n):
            idx = [rng.randrange(len(WORDS_EN)) for _ in range(rng.randint(3, 7))]
            src.append(" ".join(WORDS_EN[i] for i in idx))
            tgt.append(" ".join(WORDS_DE[i] for i in idx))
        return src, tgt

    for split, n in (("train", pairs), ("valid", valid)):
        src, tgt = lines(n)
        (directory / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (directory / f"{split}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return directory


def train_toy_translator(directory, steps=250, seed=None):
    """Trains a one-layer model on `write_corpus` data for a few seconds, from `seed`
    (default `fixture_seed()`: 0 unless `$KERAS_TRANSFORMER_TEST_SEED` says otherwise).

    Returns `(model, config, tokenizer, corpus)`; the model translates the toy
    language well enough that its outputs end with EOS.
    """
    import keras

    from keras_transformer import (LabelSmoothedCrossEntropy, TransformerConfig, build_transformer,
                                   make_optimizer)
    from keras_transformer.data import Tokenizer, load_corpus, make_batches, train_tokenizer

    seed = fixture_seed() if seed is None else seed
    keras.utils.set_random_seed(seed)
    data = write_corpus(directory / "data", pairs=600, valid=20, seed=seed)
    corpus = load_corpus(str(data), "en", "de")
    tokenizer = Tokenizer.load(train_tokenizer(corpus.texts("train"), directory / "tokenizer", 60))
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, num_layers=1, d_model=32, d_ff=64,
                               num_heads=2, dropout=0.0, max_length=24, decode_extra_length=10,
                               warmup_steps=40)
    batches = make_batches(corpus.splits["train"], tokenizer, batch_tokens=384, max_length=24,
                           shuffle=True, seed=seed, repeat=True)
    model = build_transformer(config)
    model.compile(optimizer=make_optimizer(config), loss=LabelSmoothedCrossEntropy(0.1))
    model.optimizer.build(model.trainable_variables)  # eagerly, as train.py does: 12x faster than in the trace
    model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
    return model, config, tokenizer, corpus


def warmup_requests(path):
    """The requests of a `tf_serving_warmup_requests` file (a version directory's, or
    the file itself): `[(signature_name, {input name: tf.Tensor})]`, in file order, each
    ready to call as `loaded.signatures[name](**inputs)`."""
    import pathlib

    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "assets.extra" / "tf_serving_warmup_requests"
    requests = [prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
                for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator()]
    return [(request.model_spec.signature_name,
             {name: tf.constant(tf.make_ndarray(tensor)) for name, tensor in request.inputs.items()})
            for request in requests]


def tf_serving_batching(signature, requests, allowed_batch_sizes=(4, 8, 16)):
    """What a TF Serving started with `--enable_batching` does with `requests` (dicts of
    input tensors) to one signature, as its `BatchingSession` does it
    (tensorflow_serving/batching/batching_session.cc, `ComputeTensorBatchSize` in
    batching_util.h): it refuses an input without a first dimension, or inputs of one
    request whose first dimensions differ; concatenates each input of the requests along
    it; pads the merged batch to the smallest allowed size with copies of the last
    request's first row; runs the signature once; requires every output to have the
    padded size as its first dimension; and splits the outputs back, one dict per request."""
    import tensorflow as tf

    sizes = []
    for inputs in requests:
        if any(tensor.shape.rank == 0 for tensor in inputs.values()):
            raise ValueError("Batching Run() input tensors must have at least one dimension")
        firsts = {tensor.shape[0] for tensor in inputs.values()}
        if len(firsts) != 1:
            raise ValueError("Batching Run() input tensors must have equal 0th-dimension size")
        sizes.append(firsts.pop())
    total = sum(sizes)
    padded = min(size for size in allowed_batch_sizes if size >= total)
    merged = {name: tf.concat([inputs[name] for inputs in requests] + [requests[-1][name][:1]] * (padded - total), 0)
              for name in requests[0]}
    outputs = signature(**merged)
    for name, tensor in outputs.items():
        assert tensor.shape.rank >= 1 and tensor.shape[0] == padded, (name, tensor.shape)
    parts = {name: tf.split(tensor, sizes + [padded - total]) for name, tensor in outputs.items()}
    return [{name: parts[name][i] for name in outputs} for i in range(len(requests))]


def in_background(function, *args, **kwargs):
    """Starts `function(*args, **kwargs)` in a thread; returns its `concurrent.futures.Future`.

    For the suite's subprocesses (each pays TensorFlow's start-up and often a
    SavedModel load, mostly on one core): started together, or beside in-process
    work, they use the CI machine's second core. `.result()` returns the
    function's value or raises its exception (an assertion included) in the test
    that awaits it, so the checks stay where they were.
    """
    import concurrent.futures

    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return executor.submit(function, *args, **kwargs)
    finally:
        executor.shutdown(wait=False)


@contextlib.contextmanager
def closed_pipe(buffering=-1):
    """A text stream into a pipe whose reader is gone, as `command | head -3` leaves the
    command's standard output once `head` has its lines: a write or flush that reaches the
    pipe raises `BrokenPipeError`. Closed on leaving the block."""
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w", buffering=buffering) as closed:
        yield closed


def full_disk_writes(monkeypatch, keep=1000):
    """Makes `pathlib.Path.write_bytes` fail as a full disk does: it writes the first `keep`
    bytes, then raises `OSError(ENOSPC)` (what a tmpfs mounted small did by hand)."""
    import errno
    import pathlib

    real_write = pathlib.Path.write_bytes

    def full_disk(self, data):
        real_write(self, data[:keep])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_bytes", full_disk)


def sigterm_self():
    """Sends SIGTERM to this process, as `kill PID` does, from the main thread (elsewhere the
    handler of `console.sigterm_raises` is not installed and the signal would end the test
    worker), and waits for the handler to raise `console.Terminated` at the next bytecode."""
    import os
    import signal
    import threading
    import time

    from keras_transformer.console import _raise_terminated

    assert threading.current_thread() is threading.main_thread()
    assert signal.getsignal(signal.SIGTERM) is _raise_terminated, "not inside console.sigterm_raises"
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    raise AssertionError("SIGTERM did not raise Terminated")


def teacher_forced_log_probs(model, source_ids, targets):
    """log p(target piece) of our model under teacher forcing, EOS included: `[batch, T + 1]`."""
    import keras
    import numpy as np

    from keras_transformer.constants import BOS_ID, EOS_ID, PAD_ID

    width = max(len(t) for t in targets) + 1
    target_in = np.full((len(targets), width), PAD_ID, np.int32)
    target_out = np.full((len(targets), width), PAD_ID, np.int32)
    for i, target in enumerate(targets):
        target_in[i, :len(target) + 1] = [BOS_ID] + target
        target_out[i, :len(target) + 1] = target + [EOS_ID]
    log_probs = keras.ops.convert_to_numpy(keras.ops.log_softmax(model([source_ids, target_in]), axis=-1))
    return np.take_along_axis(log_probs, target_out[..., None], axis=-1)[..., 0]  # [batch, width]


def assert_served_scores(served, expected):
    """A `score` signature's outputs give `Translator.score`'s `expected` (a list of
    `ScoredTranslation`): each pair's score, pieces and per-piece log-probabilities."""
    import numpy as np

    np.testing.assert_allclose(served["score"].numpy(), [w.score for w in expected], atol=1e-5)
    for row, want in enumerate(expected):
        count = len(want.tokens)
        assert [t.decode() for t in served["tokens"].numpy()[row, :count]] == want.tokens
        np.testing.assert_allclose(served["token_scores"].numpy()[row, :count], want.token_scores, atol=1e-5)


def assert_served_alignments(served, expected):
    """An `align` signature's outputs give `Translator.align`'s `expected` (a list of
    `AlignedTranslation`): each pair's source and target pieces and their attention."""
    import numpy as np

    for row, want in enumerate(expected):
        source = [t.decode() for t in served["source_tokens"].numpy()[row] if t]
        target = [t.decode() for t in served["target_tokens"].numpy()[row] if t]
        assert (source, target) == (want.source_tokens, want.target_tokens)
        np.testing.assert_allclose(served["attention"].numpy()[row, :len(target), :len(source)],
                                   want.attention, atol=1e-5)


def function_nodes(functions: dict, names, seen=None):
    """The nodes of the functions `names` of a function library (`functions`: `{name:
    FunctionDef}`) and of every function they call, each function once (`seen`: the names
    already walked, shared between calls): a call is a node whose op is a library function,
    or a function in a node's attributes (a `While`'s body, a `StatefulPartitionedCall`'s `f`,
    a `Case`'s branches)."""
    seen = set() if seen is None else seen
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for node in functions[name].node_def:
            yield node
            if node.op in functions:
                pending.append(node.op)
            for value in node.attr.values():
                if value.HasField("func"):
                    pending.append(value.func.name)
                pending.extend(function.name for function in value.list.func)

