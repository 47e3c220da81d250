"""Inference with a trained model (TensorFlow-only code, like `data/` and `training/`): the
cached decoder that runs the model one target position at a time (`incremental`), the
ids-to-ids search that drives `keras_transformer.decoding`'s loops in the plain graph, XLA
or LiteRT's builtins (`searcher`), strings in and strings out with the tokenizer inside the
graph (`translator`), and forced decoding over a given translation for its score
(`scoring`) and its attention alignments (`alignment`).

The search itself (options, processors, samplers, the beam step, the loops) is
`keras_transformer.decoding`, written in keras.ops. `IncrementalDecoder` also imports from
the package root, `keras_transformer`.
"""
