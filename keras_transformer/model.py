"""The encoder-decoder Transformer: one wiring for training and for decoding.

`build_transformer(config)` returns a `Transformer`, a functional
`keras.Model` (`[source_ids, target_ids] -> logits`, the product's shape:
`fit`, `evaluate`, `save`, `.keras` files all work as for any functional
model). Its graph is traced from two methods, `encode` and `decode`, and the
cached decoder (`keras_transformer.inference.incremental`) calls the very same methods
with key/value caches, so training and beam search share one wiring and the
same layer objects: a change to the model cannot silently diverge from
decoding (as keras-hub's `call_decoder_with_cache` or Flax's `decode=True`).
"""

from __future__ import annotations

import keras
from keras import ops

from keras_transformer.config import TransformerConfig
from keras_transformer.constants import PAD_ID
from keras_transformer.constants import SOURCE_TAG_SETS, TAG_OFFSET
from keras_transformer.layers import (DecoderBlock, EncoderBlock, PositionalEmbedding, SyntaxAttentionMatrix,
                                      TagFactorEmbedding)
from keras_transformer.layers.step_kernels import LAYER_KERNELS

# Layer names. They are the keys of the weights in `.weights.h5` files and
# of the checkpoints, so they stay as they are; nothing looks layers up by them.
EMBEDDING = "embedding"
ENCODER_LAYER = "encoder_layer_{}"
DECODER_LAYER = "decoder_layer_{}"
ENCODER_NORM = "encoder_norm"
DECODER_NORM = "decoder_norm"
ENCODER_DROPOUT = "encoder_embedding_dropout"
DECODER_DROPOUT = "decoder_embedding_dropout"
TAG_EMBEDDING = "source_tag_embedding"
SYNTAX_ATTENTION = "syntax_attention_matrix"
# Names of the syntax-aware model's extra inputs (after source_ids, target_ids).
SOURCE_TAGS = "source_tags"
SOURCE_DISTANCES = "source_distances"


def tag_vocab_sizes(config: TransformerConfig) -> tuple[int, ...]:
    """Rows of each source tag table: the special ids and the tag set (see `constants`)."""
    return tuple(TAG_OFFSET + len(SOURCE_TAG_SETS[name]) for name in config.source_tags)


def source_feature_names(config: TransformerConfig) -> tuple[str, ...]:
    """The model's inputs besides source and target ids, in order: `source_tags`
    (int32 `[batch, S, len(source_tags)]`) with tag factors, `source_distances`
    (int32 `[batch, S, S]`, tree distances between pieces) with syntax attention."""
    return ((SOURCE_TAGS,) if config.uses_source_tags else ()) + \
        ((SOURCE_DISTANCES,) if config.uses_syntax_attention else ())


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


def _built(layer, input_shape):
    layer.build(input_shape)
    return layer


def _final_norm(config: TransformerConfig, name: str):
    """The LayerNorm that ends each stack in pre-norm; None in the paper's post-norm."""
    if not config.norm_first:
        return None
    return _built(keras.layers.LayerNormalization(epsilon=config.layer_norm_epsilon, name=name),
                  (None, None, config.d_model))


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The paper's encoder-decoder Transformer as a functional `keras.Model`.

    Inputs, in this order: source ids and target-input ids (the target shifted
    right, starting with BOS), int32 `[batch, length]`, padded with `PAD_ID`
    (0). Output: float32 logits `[batch, target_length, vocab_size]`.

    Syntax-aware options (survey section 3, `TransformerConfig.source_tags`,
    `syntax_attention`) add inputs after these (`source_feature_names`):
    `source_tags` int32 `[batch, S, kappa]` for the tag-factor embedding
    (`TagFactorEmbedding`) and `source_distances` int32 `[batch, S, S]` for
    syntax-aware encoder self-attention (`SyntaxAttentionMatrix`, in the
    layers and heads the config names). With every option off the model is
    the paper's, with the same weights for a seed and the same numbers.

    One `PositionalEmbedding` matrix serves as source embedding, target
    embedding and pre-softmax projection (paper section 3.4). With
    `config.norm_first` each stack ends with a LayerNorm (survey, pre-norm).

    Args:
        config: the `TransformerConfig`.
        name: model name.

    Methods shared by the functional graph and cached decoding:
        encode(source_ids) -> (encoder_output [batch, S, d_model], source_mask [batch, S])
        decode(target_ids, encoder_output, source_mask, ...) -> logits, caches

    Example:
        >>> model = build_transformer(TransformerConfig.from_preset("tiny"))
        >>> logits = model([source_ids, target_input_ids])
        >>> encoded, mask = model.encode(source_ids)          # what beam search runs once
    """

    def __init__(self, config: TransformerConfig, name: str = "transformer", **kwargs):
        # === Layers ===
        # Each layer is built right after it is made, in the order the graph
        # uses them: Dropout and initializer seeds are drawn when those objects
        # are created, so this order keeps `set_random_seed(s)` giving the same
        # initial weights as every earlier version (and existing checkpoints'
        # numbers reproducible).
        features = (None, None, config.d_model)
        self.transformer_config = config
        self.embedding = PositionalEmbedding(config.vocab_size, config.d_model, name=EMBEDDING)
        self.embedding.build()
        self.source_padding_mask = PaddingMask(name="source_padding_mask")
        self.encoder_dropout = keras.layers.Dropout(config.dropout, name=ENCODER_DROPOUT)
        self.encoder_layers = [_built(EncoderBlock(**_block_kwargs(config), name=ENCODER_LAYER.format(i)),
                                      features) for i in range(config.num_layers)]
        self.encoder_norm = _final_norm(config, ENCODER_NORM)
        self.decoder_dropout = keras.layers.Dropout(config.dropout, name=DECODER_DROPOUT)
        self.decoder_layers = [_built(DecoderBlock(**_block_kwargs(config), name=DECODER_LAYER.format(i)),
                                      features) for i in range(config.decoder_depth)]
        self.decoder_norm = _final_norm(config, DECODER_NORM)
        # Logits in float32 even under mixed precision: the loss and the beam
        # search's log-softmax need the range.
        self.logits_output = keras.layers.Activation("linear", dtype="float32", name="logits")
        # Syntax-aware options, made last so that every other weight is the
        # plain model's for the same seed.
        self.tag_embedding = None
        if config.uses_source_tags:
            self.tag_embedding = TagFactorEmbedding(tag_vocab_sizes(config), config.d_model,
                                                    config.tag_combination, name=TAG_EMBEDDING)
            self.tag_embedding.build(features, (None, None, len(config.source_tags)))
        self.syntax_attention = None
        if config.uses_syntax_attention:
            self.syntax_attention = SyntaxAttentionMatrix(
                config.num_heads, config.syntax_attention, config.syntax_form, config.syntax_max_distance,
                config.syntax_dnorm, config.syntax_heads, name=SYNTAX_ATTENTION)

        # === Functional graph, traced from the same methods decoding calls ===
        source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
        target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
        feature_shapes = {SOURCE_TAGS: (None, len(config.source_tags)), SOURCE_DISTANCES: (None, None)}
        features = {name: keras.Input(shape=feature_shapes[name], dtype="int32", name=name)
                    for name in source_feature_names(config)}
        encoder_output, source_mask = self.encode(source_ids, **features)
        logits, _ = self.decode(target_ids, encoder_output, source_mask)
        super().__init__([source_ids, target_ids, *features.values()], logits, name=name, **kwargs)

    # -- the wiring ------------------------------------------------------------
    def encode(self, source_ids, source_tags=None, source_distances=None, training=None):
        """The encoder stack (paper section 3.1; survey section 3 with syntax options).

        Args:
            source_ids: int `[batch, S]`, padded with `PAD_ID`.
            source_tags: int `[batch, S, kappa]`, required with tag factors.
            source_distances: int `[batch, S, S]`, required with syntax attention.
            training: enables dropout.

        Returns:
            encoder output `[batch, S, d_model]` and the source padding mask
            bool `[batch, S]`.
        """
        config = self.transformer_config
        for name, value, needed in ((SOURCE_TAGS, source_tags, config.uses_source_tags),
                                    (SOURCE_DISTANCES, source_distances, config.uses_syntax_attention)):
            if needed and value is None:
                raise ValueError(f"this model is syntax-aware: encode() needs {name} "
                                 f"(inputs: {', '.join(source_feature_names(config))})")
        source_mask = self.source_padding_mask(source_ids)  # [batch, S]
        if self.tag_embedding is None:
            x = self.embedding(source_ids)  # [batch, S, d_model]
        else:
            x = self.tag_embedding(self.embedding(source_ids, positions=False), source_tags)  # [batch, S, d_model]
        x = self.encoder_dropout(x, training=training)
        matrix = None if self.syntax_attention is None else self.syntax_attention(source_distances, source_mask)
        syntax_layers = config.syntax_layer_indices()
        for index, layer in enumerate(self.encoder_layers):
            if index not in syntax_layers:
                x = layer(x, padding_mask=source_mask, training=training)
            elif config.syntax_form == "additive":
                x = layer(x, padding_mask=source_mask, attention_bias=matrix, training=training)
            else:
                x = layer(x, padding_mask=source_mask, attention_scale=matrix, training=training)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, source_mask

    def attention_layers(self):
        """Every `MultiHeadAttention` of the model, in graph order: each encoder layer's
        self-attention, then each decoder layer's self- and cross-attention (e.g. to set
        their `fuse_projections` before a step is traced)."""
        return [layer.self_attention for layer in self.encoder_layers] + [
            attention for layer in self.decoder_layers for attention in (layer.self_attention, layer.cross_attention)]

    def cross_attention_caches(self, encoder_output):
        """`(key, value)` of the encoder output per decoder layer, each
        `[batch, heads, S, head_size]`: computed once per source."""
        return [layer.cross_attention.compute_key_value(encoder_output)
                for layer in self.decoder_layers]

    def decode(self, target_ids, encoder_output, source_mask, *, start_position=0,
               self_attention_caches=None, cross_attention_caches=None, training=None, grow_caches=False,
               output_kernel=None, small_kernels=None, kernels=None):
        """The decoder stack and the tied output projection.

        Without caches this is the training pass: causal self-attention over
        all of `target_ids`. With `self_attention_caches` (one `(key, value)`
        `[batch, heads, max_length, head_size]` per layer) it is one decoding
        step: `target_ids` sit at positions `start_position ...`, their keys
        and values are written into the caches, and `cross_attention_caches`
        (from `cross_attention_caches(encoder_output)`) replace the
        encoder output.

        Args:
            target_ids: int `[batch, T]`.
            encoder_output: `[batch, S, d_model]`; may be None with
                `cross_attention_caches`.
            source_mask: bool `[batch, S]`.
            start_position: int32 scalar, position of `target_ids[:, 0]`.
            self_attention_caches, cross_attention_caches: per-layer caches.
            training: enables dropout.
            grow_caches: the self-attention caches hold exactly the
                `start_position` positions before and grow by concatenation
                (`MultiHeadAttention`'s `grow_cache`).
            output_kernel: None, or `embedding.output_kernel()` computed
                once before a decoding loop (the loop then does not
                transpose the embeddings every step).
            small_kernels: with caches, None or the attentions'
                `small_kernels` (`DecoderBlock`).
            kernels: with caches and one position, None or the step's
                `StepKernels` (the products of every projection, the output
                projection's too, and of the attentions; their transposes).

        Returns:
            float32 logits `[batch, T, vocab]` and the updated self-attention
            caches (None without caches).
        """
        y = self.embedding(target_ids, start_position=start_position)  # [batch, T, d_model]
        y = self.decoder_dropout(y, training=training)
        cached = self_attention_caches is not None
        # A cached step of one position (every step of beam search): the layers
        # take `[batch, d_model]`, so every projection is a plain 2-D matmul with
        # no reshape around it, and cross-attention needs no transposes (a
        # TensorFlow `while_loop` pays for every node of its body on every step).
        one_position = cached and target_ids.shape[1] == 1
        if one_position:
            y = ops.reshape(y, (-1, self.transformer_config.d_model))  # [batch, d_model]
        kernels = (kernels if one_position else None) or LAYER_KERNELS  # a step's (2-D inputs) only
        self_caches = self_attention_caches if cached else [None] * len(self.decoder_layers)
        cross_caches = cross_attention_caches or [None] * len(self.decoder_layers)
        new_caches = []
        for layer, self_cache, cross_cache in zip(self.decoder_layers, self_caches, cross_caches):
            if cached:
                y, self_cache = layer(y, encoder_output, encoder_padding_mask=source_mask,
                                      self_attention_cache=self_cache, cache_index=start_position,
                                      cross_attention_cache=cross_cache, training=training,
                                      grow_cache=grow_caches, small_kernels=small_kernels, kernels=kernels)
                new_caches.append(self_cache)
            else:
                y = layer(y, encoder_output, encoder_padding_mask=source_mask,
                          cross_attention_cache=cross_cache, training=training)
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)
        logits = self.logits_output(self.embedding(y, reverse=True, output_kernel=output_kernel,
                                                   matmul=kernels.matmul))  # [batch, T, vocab]
        if one_position:
            logits = ops.expand_dims(logits, 1)  # [batch, 1, vocab]
        return logits, (new_caches if cached else None)

    # -- serialisation ------------------------------------------------------------
    def get_config(self):
        # The functional graph's config (so `keras.Model.from_config` rebuilds a
        # plain functional model) plus the `TransformerConfig`, from which
        # `Transformer.from_config` rebuilds this class with its methods.
        graph = keras.Model(self.inputs, self.outputs, name=self.name).get_config()
        return {**graph, "transformer_config": self.transformer_config.to_dict()}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(TransformerConfig.from_dict(config["transformer_config"]), name=config["name"])


def build_transformer(config: TransformerConfig, name: str = "transformer") -> Transformer:
    """Builds the paper's encoder-decoder Transformer (see `Transformer`).

    Example:
        >>> config = TransformerConfig.from_preset("tiny")
        >>> model = build_transformer(config)
        >>> logits = model([source_ids, target_input_ids])
    """
    return Transformer(config, name=name)
