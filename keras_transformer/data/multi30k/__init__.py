"""Multi30k (task 1, English-German) as a TensorFlow Datasets builder.

Importing this package registers the builder with TFDS under the name
``multi30k``: ``tfds.load("multi30k")``, ``load_corpus("multi30k")`` and
``python train.py --data multi30k`` download, check, prepare and cache it
(``~/tensorflow_datasets/multi30k`` by default).
"""

from keras_transformer.data.multi30k.multi30k_dataset_builder import Multi30k

__all__ = ["Multi30k"]
