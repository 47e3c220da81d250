"""`build_transformer(config)`: the encoder-decoder as a functional `keras.Model`."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformer.config import TransformerConfig
from keras_transformer.constants import PAD_ID
from keras_transformer.layers import DecoderBlock, EncoderBlock, PositionalEmbedding

# Layer names; `keras_transformer.incremental` finds the layers by these.
EMBEDDING = "embedding"
ENCODER_LAYER = "encoder_layer_{}"
DECODER_LAYER = "decoder_layer_{}"
ENCODER_NORM = "encoder_norm"
DECODER_NORM = "decoder_norm"
ENCODER_DROPOUT = "encoder_embedding_dropout"
DECODER_DROPOUT = "decoder_embedding_dropout"


@keras.saving.register_keras_serializable(package="keras_transformer")
class PaddingMask(keras.layers.Layer):
    """Boolean `[batch, T]` mask, True where the id is not `PAD_ID`."""

    def call(self, ids):
        return ops.not_equal(ids, PAD_ID)

    def compute_output_shape(self, ids_shape):
        return ids_shape


def _block_kwargs(config: TransformerConfig) -> dict:
    return dict(d_model=config.d_model, num_heads=config.num_heads, d_ff=config.d_ff,
                dropout=config.dropout, attention_dropout=config.attention_dropout,
                norm_first=config.norm_first, epsilon=config.layer_norm_epsilon)


def build_transformer(config: TransformerConfig, name: str = "transformer") -> keras.Model:
    """Builds the paper's encoder-decoder Transformer.

    Inputs, in this order: source ids and target-input ids (the target shifted
    right, starting with BOS), int32 `[batch, length]`, padded with `PAD_ID`
    (0). Output: float32 logits `[batch, target_length, vocab_size]`.

    One `PositionalEmbedding` matrix serves as source embedding, target
    embedding and pre-softmax projection (paper section 3.4). With
    `config.norm_first` each stack ends with a LayerNorm (survey, pre-norm).

    Example:
        >>> config = TransformerConfig.from_preset("tiny")
        >>> model = build_transformer(config)
        >>> logits = model([source_ids, target_input_ids])
    """
    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
    embedding = PositionalEmbedding(config.vocab_size, config.d_model, name=EMBEDDING)
    source_mask = PaddingMask(name="source_padding_mask")(source_ids)

    x = embedding(source_ids)
    x = keras.layers.Dropout(config.dropout, name=ENCODER_DROPOUT)(x)
    for i in range(config.num_layers):
        x = EncoderBlock(**_block_kwargs(config), name=ENCODER_LAYER.format(i))(
            x, padding_mask=source_mask)
    if config.norm_first:
        x = keras.layers.LayerNormalization(epsilon=config.layer_norm_epsilon, name=ENCODER_NORM)(x)

    y = embedding(target_ids)
    y = keras.layers.Dropout(config.dropout, name=DECODER_DROPOUT)(y)
    for i in range(config.num_layers):
        y = DecoderBlock(**_block_kwargs(config), name=DECODER_LAYER.format(i))(
            y, x, encoder_padding_mask=source_mask)
    if config.norm_first:
        y = keras.layers.LayerNormalization(epsilon=config.layer_norm_epsilon, name=DECODER_NORM)(y)
    logits = embedding(y, reverse=True)
    # Logits in float32 even under mixed precision: the loss and the beam
    # search's log-softmax need the range.
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(logits)
    return keras.Model([source_ids, target_ids], logits, name=name)
