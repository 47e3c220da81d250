"""Keras layers of the Transformer, written with `keras.ops` only."""

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.blocks import DecoderBlock, EncoderBlock
from keras_transformer.layers.embedding import PositionalEmbedding, sinusoidal_encoding
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.residual import ResidualConnection
from keras_transformer.layers.step_kernels import StepKernels
from keras_transformer.layers.syntax_attention import SyntaxAttentionMatrix
from keras_transformer.layers.tag_embedding import TagFactorEmbedding

__all__ = ["MultiHeadAttention", "PositionalEmbedding", "sinusoidal_encoding", "FeedForward",
           "ResidualConnection", "EncoderBlock", "DecoderBlock", "TagFactorEmbedding",
           "SyntaxAttentionMatrix", "StepKernels"]
