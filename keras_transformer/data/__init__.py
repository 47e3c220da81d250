"""Input pipeline: corpora -> shared SentencePiece tokenizer -> token-budget batches.

TensorFlow-only code (tf.data, tensorflow_text); the model never imports it.

    corpus = load_corpus("embedded")                      # or a directory, or tfds:NAME
    path = train_tokenizer(corpus.texts("train"), "run/tokenizer", vocab_size=8000)
    tokenizer = Tokenizer.load(path)
    train = make_batches(corpus.splits["train"], tokenizer, batch_tokens=4096,
                         max_length=128, shuffle=True, seed=0, repeat=True)
"""

from keras_transformer.data.batching import (OverlongCount, bucket_batch_sizes, count_overlong,
                                             default_boundaries, make_batches)
from keras_transformer.data.corpora import (CorpusError, ParallelCorpus, count_lines,
                                            describe_fingerprint_change, load_corpus)
from keras_transformer.data.tokenizer import (TOKENIZER_FILENAME, SubwordSampling, Tokenizer, TokenizerError,
                                              check_vocab_size, tokenizer_path, train_tokenizer)

__all__ = [
    "load_corpus", "ParallelCorpus", "CorpusError", "count_lines", "describe_fingerprint_change",
    "train_tokenizer", "Tokenizer", "SubwordSampling", "TokenizerError", "check_vocab_size", "tokenizer_path",
    "TOKENIZER_FILENAME",
    "make_batches", "default_boundaries", "bucket_batch_sizes", "count_overlong", "OverlongCount",
]
