"""The CTranslate2 side of `export.ctranslate2`: a `build_transformer` model's weights as
CTranslate2's `TransformerSpec` (the mapping that module's docstring gives) and the
`ctranslate2.converters.Converter` that writes it.

`export.ctranslate2` is the command, the atomic `convert` and the decoding options. It
imports this module (Keras, NumPy and CTranslate2) only when it converts, so that its
`--help` and flag errors answer without them, and gives this module's public names as its
own on first use (`from export.ctranslate2 import build_spec`).
"""

from __future__ import annotations

from export.errors import ConversionError
from keras_transformer.config import TransformerConfig
from keras_transformer.constants import BOS_ID, EOS_ID, UNK_ID
from keras_transformer.layers import sinusoidal_encoding

import ctranslate2
import numpy as np
from keras import ops

# Position-table rows at least: CTranslate2's default `max_input_length`, so
# that requests with its default options never run past the table.
MIN_POSITIONS = 1024


def _numpy(variable) -> np.ndarray:
    """A Keras variable as a float32 NumPy array."""
    return np.asarray(ops.convert_to_numpy(variable), dtype=np.float32)


def _set_linear(spec, *dense_layers) -> None:
    """Sets a `LinearSpec` from Keras `Dense` layers fused along the output axis.

    Keras kernels are `[in, out]`; CTranslate2 weights are `[out, in]`, so
    each kernel is transposed and the transposes are stacked:
    `[sum(out), in]`, biases `[sum(out)]`.
    """
    spec.weight = np.concatenate([_numpy(d.kernel).T for d in dense_layers], axis=0)  # [sum(out), in]
    if all(d.bias is not None for d in dense_layers):
        spec.bias = np.concatenate([_numpy(d.bias) for d in dense_layers], axis=0)  # [sum(out)]


def _set_layer_norm(spec, norm) -> None:
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_self_attention(spec, attention, residual) -> None:
    _set_linear(spec.linear[0], attention.query_dense, attention.key_dense, attention.value_dense)
    _set_linear(spec.linear[1], attention.output_dense)
    # Post-norm: the norm after the residual add; pre-norm: the one on the
    # sub-layer input. Either way it is the residual connection's one norm.
    _set_layer_norm(spec.layer_norm, residual.norm)


def _set_cross_attention(spec, attention, residual) -> None:
    _set_linear(spec.linear[0], attention.query_dense)
    _set_linear(spec.linear[1], attention.key_dense, attention.value_dense)
    _set_linear(spec.linear[2], attention.output_dense)
    _set_layer_norm(spec.layer_norm, residual.norm)


def _set_feed_forward(spec, feed_forward, residual) -> None:
    _set_linear(spec.linear_0, feed_forward.inner)
    _set_linear(spec.linear_1, feed_forward.outer)
    _set_layer_norm(spec.layer_norm, residual.norm)


def _pieces(tokenizer) -> list[str]:
    """The SentencePiece pieces in id order (the CTranslate2 vocabulary)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_bytes)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def position_table(config: TransformerConfig) -> np.ndarray:
    """Our positional encodings for positions 0 .. N-1, float32 `[N, d_model]`."""
    rows = max(config.max_length + config.decode_extra_length, MIN_POSITIONS)
    return _numpy(sinusoidal_encoding(np.arange(rows), config.d_model))  # [N, d_model]


def build_spec(model, config: TransformerConfig, tokenizer) -> ctranslate2.specs.TransformerSpec:
    """The `TransformerSpec` of a `build_transformer(config)` model, weights set.

    Args:
        model: the (trained) `Transformer`.
        config: its `TransformerConfig`.
        tokenizer: its `keras_transformer.data.Tokenizer`.

    Returns:
        The spec, ready for `validate`, `optimize` and `save`.
    """
    if not hasattr(model, "encoder_layers") or not hasattr(model, "decoder_layers"):
        raise TypeError(f"expected a Transformer from build_transformer(config), got {type(model).__name__}")
    if config.syntax_aware:
        raise ConversionError("a syntax-aware model (source tags / syntax attention) has inputs CTranslate2's "
                              "Transformer does not; export it as a SavedModel (python -m export.saved_model)")
    pieces = _pieces(tokenizer)
    embeddings = _numpy(model.embedding.embeddings)  # [vocab, d_model]
    if not len(pieces) == embeddings.shape[0] == config.vocab_size:
        raise ValueError(f"the tokenizer has {len(pieces)} pieces, the model {embeddings.shape[0]} "
                         f"embedding rows and config.vocab_size={config.vocab_size}; they must be equal")

    spec = ctranslate2.specs.TransformerSpec.from_config(
        (config.num_layers, config.decoder_depth), config.num_heads, pre_norm=config.norm_first,
        activation=ctranslate2.specs.Activation.RELU,
        # `return_attention`: the last decoder layer's heads averaged, as `Translator.align` gives
        alignment_layer=-1, alignment_heads=config.num_heads)
    positions = position_table(config)
    for stack in (spec.encoder, spec.decoder):
        stack.scale_embeddings = True  # x sqrt(d_model), as PositionalEmbedding
        stack.position_encodings.encodings = positions
    spec.encoder.embeddings[0].weight = embeddings
    spec.decoder.embeddings.weight = embeddings
    spec.decoder.projection.weight = embeddings  # tied, [vocab, d_model] is already [out, in]; no bias

    for layer_spec, layer in zip(spec.encoder.layer, model.encoder_layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_residual)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_residual)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder_layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_residual)
        _set_cross_attention(layer_spec.attention, layer.cross_attention, layer.cross_attention_residual)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_residual)
    if config.norm_first:  # pre-norm ends each stack with a LayerNorm
        _set_layer_norm(spec.encoder.layer_norm, model.encoder_norm)
        _set_layer_norm(spec.decoder.layer_norm, model.decoder_norm)

    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    spec.config.unk_token = pieces[UNK_ID]
    spec.config.bos_token = pieces[BOS_ID]
    spec.config.eos_token = pieces[EOS_ID]
    spec.config.decoder_start_token = pieces[BOS_ID]  # decoding starts from BOS_ID
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True  # sources end with EOS_ID, as in training
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


class KerasTransformerConverter(ctranslate2.converters.Converter):
    """`ctranslate2.converters.Converter` for an in-memory `build_transformer` model.

    Args:
        model, config, tokenizer: as `build_spec`.

    Example:
        >>> KerasTransformerConverter(model, config, tokenizer).convert("ct2_model", quantization="int8")
    """

    def __init__(self, model, config: TransformerConfig, tokenizer):
        self.model = model
        self.config = config
        self.tokenizer = tokenizer

    def _load(self):
        return build_spec(self.model, self.config, self.tokenizer)
