"""The label-smoothed loss, the masked accuracy and the target-token count; `compile`
+ `fit` with them."""

import keras
import numpy as np
import pytest

from keras_transformer import (LabelSmoothedCrossEntropy, MaskedAccuracy, TransformerConfig, build_transformer,
                               make_optimizer)
from keras_transformer.constants import PAD_ID
from keras_transformer.training.losses import TargetTokens


def test_label_smoothing_zero_equals_sparse_cross_entropy_on_real_tokens():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7)).astype("float32") * 3
    labels = rng.integers(1, 7, size=(3, 5)).astype("int32")
    labels[0, 3:] = PAD_ID
    labels[2, 1:] = PAD_ID
    got = float(LabelSmoothedCrossEntropy(label_smoothing=0.0)(labels, logits))
    real = labels != PAD_ID
    per_token = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    want = float(np.asarray(per_token)[real].mean())
    assert got == pytest.approx(want, rel=1e-5)


def test_label_smoothing_matches_dense_reference():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 4, 6)).astype("float32")
    labels = np.array([[1, 2, 3, PAD_ID], [4, 5, PAD_ID, PAD_ID]], "int32")
    eps = 0.1
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    q = (1 - eps) * np.eye(6)[labels] + eps / 6  # the smoothed target distribution
    per_token = -(q * log_probs).sum(-1)
    want = per_token[labels != PAD_ID].mean()
    got = float(LabelSmoothedCrossEntropy(label_smoothing=eps)(labels, logits))
    assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothing_gradient_is_softmax_minus_q_over_real_tokens(eps):
    import tensorflow as tf

    rng = np.random.default_rng(4)
    logits = rng.normal(size=(2, 4, 6)).astype("float32") * 2
    labels = np.array([[1, 2, 3, PAD_ID], [4, 5, PAD_ID, PAD_ID]], "int32")
    x = tf.constant(logits)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = LabelSmoothedCrossEntropy(label_smoothing=eps)(labels, x)
    q = (1 - eps) * np.eye(6)[labels] + eps / 6
    softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    real = (labels != PAD_ID)[..., None]
    want = (softmax - q) * real / real.sum()
    np.testing.assert_allclose(np.asarray(tape.gradient(loss, x)), want, atol=1e-6)


def test_masked_accuracy_skips_padding():
    metric = MaskedAccuracy()
    labels = np.array([[1, 2, PAD_ID], [3, PAD_ID, PAD_ID]], "int32")
    logits = np.zeros((2, 3, 4), "float32")
    logits[0, 0, 1] = logits[0, 1, 3] = logits[1, 0, 3] = 1.0  # 2 of 3 real tokens right
    logits[0, 2, 0] = logits[1, 1, 0] = logits[1, 2, 0] = 1.0  # padding "right", ignored
    metric.update_state(labels, logits)
    assert float(metric.result()) == pytest.approx(2 / 3)


def test_fit_on_tiny_reduces_loss():
    rng = np.random.default_rng(2)
    config = TransformerConfig.from_preset("tiny", vocab_size=40, num_layers=1, d_model=32,
                                           d_ff=64, warmup_steps=20)
    model = build_transformer(config)
    model.compile(optimizer=make_optimizer(config),
                  loss=LabelSmoothedCrossEntropy(config.label_smoothing),
                  metrics=[MaskedAccuracy()])
    model.optimizer.build(model.trainable_variables)  # eagerly, as train.py does: faster than in the trace
    # Copy task: target = source.
    source = rng.integers(4, 40, size=(64, 6)).astype("int32")
    target_in = np.concatenate([np.full((64, 1), 2, "int32"), source], axis=1)
    target_out = np.concatenate([source, np.full((64, 1), 3, "int32")], axis=1)
    history = model.fit([source, target_in], target_out, batch_size=16, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.8 * losses[0]
    assert model.optimizer.iterations.numpy() == 24


def test_target_tokens_counts_real_tokens():
    metric = TargetTokens()
    y = np.array([[5, 6, PAD_ID], [7, PAD_ID, PAD_ID]])
    metric.update_state(y, None)
    metric.update_state(np.array([[9, 9, 9]]), None)
    assert float(metric.result()) == 6.0
