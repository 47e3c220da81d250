"""Syntax-aware attention: the matrix `M` from source tree distances."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformer.constants import NEG_INF

MODES = ("hard", "soft")
FORMS = ("additive", "multiplicative")
DNORMS = ("zscore", "inverse")


@keras.saving.register_keras_serializable(package="keras_transformer")
class SyntaxAttentionMatrix(keras.layers.Layer):
    """`M(i, j)` of syntax-aware self-attention from tree distances `omega(i, j)`.

    Survey section 3.2: encoder self-attention becomes
    `softmax(QK^T / sqrt(d) + M) V` (additive, Eq. 53) or
    `softmax(QK^T / sqrt(d) * M) V` (multiplicative, Eq. 54), with `omega`
    the number of tree edges between two words (their pieces inherit it):

    * `"hard"` (0-1 masking): allowed where `omega <= max_distance`. Additive:
      `M = 0` there and `NEG_INF` elsewhere (a hard constraint);
      multiplicative: `M = 1` / `0`.
    * `"soft"`: `M = DNorm(omega)` per query row over the real (unpadded)
      keys: `"zscore"`, `(s - mean_j s) / std_j s` with `s = -omega` (0 where
      the row is constant), or `"inverse"`, `(1 / (1 + omega))` divided by its
      row sum. (`keras_transformer.data.syntax.soft_mask` is the NumPy
      reference.)

    Heads not in `heads` get the neutral `M` (0 additive, 1 multiplicative).
    Padding is not this layer's business: attention's padding mask still
    applies on top.

    Args:
        num_heads: h of the attention it feeds.
        mode: `"hard"` or `"soft"`.
        form: `"additive"` or `"multiplicative"`.
        max_distance: omega_max of `"hard"`.
        dnorm: `"zscore"` or `"inverse"` for `"soft"`.
        heads: head indices that use `M`; () = all.

    Call arguments:
        distances: int `[batch, S, S]`, `omega` between source pieces.
        padding_mask: bool `[batch, S]`, True on real source tokens.

    Returns:
        float32 `[batch, h, S, S]` (`[batch, 1, S, S]` when every head uses it):
        pass as `attention_bias` (additive) or `attention_scale`
        (multiplicative) of `EncoderBlock`.

    Example:
        >>> matrix = SyntaxAttentionMatrix(8, "hard", max_distance=1)
        >>> m = matrix(distances, source_ids != 0)
        >>> y = encoder_block(x, padding_mask=source_ids != 0, attention_bias=m)
    """

    def __init__(self, num_heads, mode="hard", form="additive", max_distance=1, dnorm="zscore",
                 heads=(), **kwargs):
        super().__init__(**kwargs)
        for name, value, allowed in (("mode", mode, MODES), ("form", form, FORMS), ("dnorm", dnorm, DNORMS)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r}, expected one of {allowed}")
        heads = tuple(int(h) for h in heads)
        if any(not 0 <= h < num_heads for h in heads):
            raise ValueError(f"heads={list(heads)} must be in 0..{num_heads - 1}")
        self.num_heads = num_heads
        self.mode = mode
        self.form = form
        self.max_distance = max_distance
        self.dnorm = dnorm
        self.heads = heads

    @property
    def neutral(self) -> float:
        """`M` of a head (or position) it does not apply to."""
        return 0.0 if self.form == "additive" else 1.0

    def _dnorm(self, omega, valid):
        """Row-wise DNorm over the keys where `valid` (float 0/1, `[batch, 1, S]`)."""
        count = ops.maximum(ops.sum(valid, axis=-1, keepdims=True), 1.0)  # [batch, 1, 1]
        if self.dnorm == "zscore":
            score = -omega
            mean = ops.sum(score * valid, axis=-1, keepdims=True) / count  # [batch, S, 1]
            variance = ops.sum(ops.square(score - mean) * valid, axis=-1, keepdims=True) / count
            std = ops.sqrt(variance)
            return ops.where(std > 0, (score - mean) / ops.where(std > 0, std, 1.0), 0.0)
        inverse = valid / (1.0 + omega)  # [batch, S, S]
        return inverse / ops.maximum(ops.sum(inverse, axis=-1, keepdims=True), 1e-9)

    def call(self, distances, padding_mask):
        omega = ops.cast(distances, "float32")  # [batch, S, S]
        if self.mode == "hard":
            allowed = omega <= float(self.max_distance)
            if self.form == "additive":
                matrix = ops.where(allowed, 0.0, NEG_INF)
            else:
                matrix = ops.cast(allowed, "float32")
        else:
            valid = ops.expand_dims(ops.cast(padding_mask, "float32"), 1)  # [batch, 1, S]
            matrix = self._dnorm(omega, valid)
        matrix = ops.expand_dims(matrix, 1)  # [batch, 1, S, S]
        if not self.heads or len(self.heads) == self.num_heads:
            return matrix
        selected = ops.reshape(ops.convert_to_tensor(
            [h in self.heads for h in range(self.num_heads)]), (1, self.num_heads, 1, 1))
        return ops.where(selected, matrix, self.neutral)  # [batch, h, S, S]

    def compute_output_shape(self, distances_shape, padding_mask_shape=None):
        heads = 1 if not self.heads or len(self.heads) == self.num_heads else self.num_heads
        return (distances_shape[0], heads, distances_shape[1], distances_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, mode=self.mode, form=self.form,
                      max_distance=self.max_distance, dnorm=self.dnorm, heads=list(self.heads))
        return config
