"""The paper's learning-rate schedule and Adam; the loss-scale optimizer that counts
skipped steps."""

import keras
import numpy as np
import pytest

from keras_transformer import TransformerConfig, TransformerSchedule, make_optimizer


def paper_rate(step_num, d_model=512, warmup=4000):
    return d_model ** -0.5 * min(step_num ** -0.5, step_num * warmup ** -1.5)


@pytest.mark.parametrize("step_num", [1, 4000, 100000])
def test_schedule_matches_formula(step_num):
    schedule = TransformerSchedule(512, 4000)
    # Keras passes the 0-based optimizer iteration; step_num = iterations + 1.
    assert float(schedule(step_num - 1)) == pytest.approx(paper_rate(step_num), rel=1e-6)


def test_schedule_known_values_and_serialisation():
    schedule = TransformerSchedule(512, 4000)
    assert float(schedule(3999)) == pytest.approx(0.00069877, rel=1e-4)  # the peak
    assert float(schedule(0)) == pytest.approx(512 ** -0.5 * 4000 ** -1.5, rel=1e-6)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert float(clone(99999)) == float(schedule(99999))


def test_optimizer_is_papers_adam():
    optimizer = make_optimizer(TransformerConfig.from_preset("base"))
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(optimizer._learning_rate, TransformerSchedule)
    assert float(optimizer.learning_rate) == pytest.approx(paper_rate(1))  # before any update


def test_counting_loss_scale_optimizer_applies_finite_steps_and_counts_skipped_ones():
    from keras_transformer.schedule import CountingLossScaleOptimizer

    variable = keras.Variable(np.ones(3, "float32"))
    optimizer = CountingLossScaleOptimizer(keras.optimizers.SGD(learning_rate=0.5), initial_scale=4.0)
    optimizer.build([variable])
    optimizer.apply([np.full(3, 4.0, "float32")], [variable])  # scaled by 4: an unscaled gradient of 1
    np.testing.assert_allclose(variable.numpy(), 0.5)
    optimizer.apply([np.array([1.0, np.inf, 1.0], "float32")], [variable])  # overflow: skipped
    np.testing.assert_allclose(variable.numpy(), 0.5)
    assert (int(optimizer.iterations.numpy()), int(optimizer.skipped_steps.numpy())) == (2, 1)
    assert float(optimizer.dynamic_scale.numpy()) == 2.0


def test_learning_rate_scale_multiplies_the_paper_rate_and_keeps_its_shape():
    # Past warm-up the paper's rate does not depend on the warm-up: warm-up 800 at
    # scale 2 peaks where warm-up 200 at scale 1 does, then decays twice as high.
    fast = TransformerSchedule(128, 200)
    slow = TransformerSchedule(128, 800, scale=2.0)
    assert float(slow(799)) == pytest.approx(float(fast(199)), rel=1e-6)
    for step_num in (1, 200, 800, 10000):
        assert float(slow(step_num - 1)) == pytest.approx(2.0 * paper_rate(step_num, 128, 800), rel=1e-6)
    assert float(slow(9999)) == pytest.approx(2.0 * float(fast(9999)), rel=1e-6)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(slow))
    assert (clone.scale, float(clone(9999))) == (2.0, float(slow(9999)))
    # A schedule saved before the scale existed loads with the paper's 1.0.
    old = TransformerSchedule.from_config({"d_model": 128, "warmup_steps": 200})
    assert float(old(9999)) == float(fast(9999))


def test_optimizer_takes_the_configs_learning_rate_scale():
    config = TransformerConfig.from_preset("multi30k", learning_rate_scale=2.0, warmup_steps=800)
    optimizer = make_optimizer(config)
    assert float(optimizer.learning_rate) == pytest.approx(2.0 * paper_rate(1, 128, 800))
    from keras_transformer.config import ConfigError
    for bad in (0.0, -1.0, True, "2"):
        with pytest.raises(ConfigError, match="learning_rate_scale"):
            TransformerConfig.from_preset("multi30k", learning_rate_scale=bad)
