"""Input pipeline: corpora -> shared SentencePiece tokenizer -> token-budget batches.

TensorFlow-only code (tf.data, tensorflow_text); the model never imports it.

    corpus = load_corpus("embedded")                      # or a directory, or tfds:NAME
    path = train_tokenizer(corpus.texts("train"), "run/tokenizer", vocab_size=8000)
    tokenizer = Tokenizer.load(path)
    train = make_batches(corpus.splits["train"], tokenizer, batch_tokens=4096,
                         max_length=128, shuffle=True, seed=0, repeat=True)
"""

import typing as _typing

from keras_transformer import console as _console

# Each public name and the module that defines it.
_MODULES = {
    "make_batches": "batching", "default_boundaries": "batching", "bucket_batch_sizes": "batching",
    "count_overlong": "batching", "OverlongCount": "batching",
    "load_corpus": "corpora", "ParallelCorpus": "corpora", "CorpusError": "corpora", "count_lines": "corpora",
    "describe_fingerprint_change": "corpora",
    "train_tokenizer": "tokenizer", "Tokenizer": "tokenizer", "SubwordSampling": "tokenizer",
    "TokenizerError": "tokenizer", "check_vocab_size": "tokenizer", "tokenizer_path": "tokenizer",
    "TOKENIZER_FILENAME": "tokenizer",
}

if _typing.TYPE_CHECKING or not _console.running_command():
    from keras_transformer.data.batching import (OverlongCount, bucket_batch_sizes, count_overlong,
                                                 default_boundaries, make_batches)
    from keras_transformer.data.corpora import (CorpusError, ParallelCorpus, count_lines,
                                                describe_fingerprint_change, load_corpus)
    from keras_transformer.data.tokenizer import (TOKENIZER_FILENAME, SubwordSampling, Tokenizer, TokenizerError,
                                                  check_vocab_size, tokenizer_path, train_tokenizer)
else:
    # As the package's own names (keras_transformer/__init__): in the project's commands these
    # load on first use, so that a command that needs only `data.syntax` (plain Python and NumPy),
    # `python -m keras_transformer.parsing`, runs without TensorFlow.
    __getattr__ = _console.names_on_first_use(__name__, {name: f"{__name__}.{module}"
                                                         for name, module in _MODULES.items()})

__all__ = [
    "load_corpus", "ParallelCorpus", "CorpusError", "count_lines", "describe_fingerprint_change",
    "train_tokenizer", "Tokenizer", "SubwordSampling", "TokenizerError", "check_vocab_size", "tokenizer_path",
    "TOKENIZER_FILENAME",
    "make_batches", "default_boundaries", "bucket_batch_sizes", "count_overlong", "OverlongCount",
]
