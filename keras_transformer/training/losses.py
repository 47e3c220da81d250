"""Label-smoothed cross-entropy and token accuracy, both ignoring padding."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformer.constants import PAD_ID


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against labels smoothed with eps_ls (paper section 5.4).

    The target distribution is `q = (1 - eps) * one_hot(y) + eps / V` (Szegedy
    et al., the reference the paper cites), so per token, with logits `x`,

        loss = -sum_v q_v log softmax(x)_v = logsumexp(x) - sum_v q_v x_v

    (as `sum_v q_v = 1`): one `logsumexp` and one weighted sum, whose
    gradient `softmax(x) - q` is elementwise. (Picking `log p_y` with
    `take_along_axis` instead, as this class did until issue #9's profile,
    has a scatter for its gradient: 2.2x slower for the loss's forward and
    backward with 8,000 pieces, 2.4x with 37,000; `benchmarks/loss.py`.)

    Positions whose label is `PAD_ID` are ignored; the result is the mean over
    the real tokens of the batch. (Keras 3's sparse cross-entropy has no label
    smoothing, hence this class.)

    Args:
        label_smoothing: eps_ls, 0.1 in the paper.
        pad_id: label id to ignore.

    Call arguments:
        y_true: int `[batch, T]` target-output ids.
        y_pred: float `[batch, T, V]` logits.

    Returns:
        Scalar loss.
    """

    def __init__(self, label_smoothing=0.1, pad_id=PAD_ID, name="label_smoothed_cross_entropy",
                 reduction="sum_over_batch_size", **kwargs):
        super().__init__(name=name, reduction=reduction, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "int32")
        logits = ops.cast(y_pred, "float32")  # [batch, T, V]
        vocab = ops.shape(logits)[-1]
        smoothed = (ops.one_hot(y_true, vocab, dtype="float32") * (1.0 - self.label_smoothing)
                    + self.label_smoothing / ops.cast(vocab, "float32"))  # q, [batch, T, V]
        per_token = ops.logsumexp(logits, axis=-1) - ops.sum(logits * smoothed, axis=-1)  # [batch, T]
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        # "sum_over_batch_size" divides by batch * T; rescale so the result is
        # the mean over real tokens instead.
        total = ops.cast(ops.size(mask), "float32")
        real = ops.maximum(ops.sum(mask), 1.0)
        return per_token * mask * (total / real)

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing, pad_id=self.pad_id)
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Metric):
    """Fraction of non-padding target tokens whose argmax logit is the label.

    Call arguments:
        y_true: int `[batch, T]`; positions equal to `pad_id` are skipped.
        y_pred: float `[batch, T, V]` logits.
    """

    def __init__(self, pad_id=PAD_ID, name="accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        if sample_weight is not None:
            mask = mask * ops.cast(sample_weight, "float32")
        hits = ops.cast(ops.equal(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), y_true), "float32")
        self.correct.assign_add(ops.sum(hits * mask))
        self.count.assign_add(ops.sum(mask))

    def result(self):
        return self.correct / ops.maximum(self.count, 1.0)

    def reset_state(self):
        self.correct.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        config = super().get_config()
        config.update(pad_id=self.pad_id)
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class TargetTokens(keras.metrics.Metric):
    """Real (non-padding) target tokens seen since the metric was reset: the
    progress display turns it into tokens per second."""

    def __init__(self, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(keras.ops.sum(keras.ops.cast(keras.ops.not_equal(y_true, PAD_ID), "float32")))

    def result(self):
        return self.total
