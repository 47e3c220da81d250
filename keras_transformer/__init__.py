"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3."""

from keras_transformer import console as _console

if _console.onednn_requested():  # train.py, export.translate: oneDNN kernels (before TensorFlow loads)
    _console.request_onednn()
if _console.quiet_requested():  # a command asked for quiet output (before TensorFlow loads)
    _console.quiet_tensorflow()

from keras_transformer.config import PRESETS, TransformerConfig
from keras_transformer.constants import BOS_ID, EOS_ID, NEG_INF, PAD_ID, UNK_ID
from keras_transformer.incremental import IncrementalDecoder
from keras_transformer.layers import (DecoderBlock, EncoderBlock, FeedForward, MultiHeadAttention,
                                      PositionalEmbedding, ResidualConnection)
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer, build_transformer
from keras_transformer.schedule import TransformerSchedule, make_optimizer

__version__ = "0.1.0"

__all__ = [
    "TransformerConfig", "PRESETS", "Transformer", "build_transformer", "IncrementalDecoder",
    "MultiHeadAttention", "PositionalEmbedding", "FeedForward", "ResidualConnection",
    "EncoderBlock", "DecoderBlock", "TransformerSchedule", "make_optimizer",
    "LabelSmoothedCrossEntropy", "MaskedAccuracy",
    "PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "NEG_INF",
]
