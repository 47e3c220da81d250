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
    from keras_transformer.training.schedule import CountingLossScaleOptimizer

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


def test_fused_adam_updates_as_keras_adam_in_one_kernel_per_variable(tmp_path):
    """`make_optimizer`'s FusedAdam against Keras's Adam and the formula in NumPy, on dense
    and IndexedSlices gradients, eager and under XLA; its graph holds one ResourceApplyAdam
    per variable; a Keras Adam checkpoint restores into it (runs started before it resume)."""
    import tensorflow as tf

    from keras_transformer.training.schedule import FusedAdam

    config = TransformerConfig.from_preset("tiny", warmup_steps=3)
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (3,), (7, 2)]
    initial = [rng.normal(size=s).astype("float32") for s in shapes]
    gradients = [[rng.normal(size=s).astype("float32") * 10.0 ** -k for k, s in enumerate(shapes)] for _ in range(3)]

    def run(optimizer, jit=False):
        variables = [keras.Variable(w) for w in initial]
        optimizer.build(variables)
        apply = tf.function(lambda grads: optimizer.apply(grads, variables), jit_compile=jit)
        for step, grads in enumerate(gradients):
            grads = [tf.constant(g) for g in grads]
            if step == 1:  # an embedding's gradient: rows 1 and 3 of the first variable
                rows = tf.constant([1, 3])
                grads[0] = tf.IndexedSlices(tf.gather(grads[0], rows), rows, tf.constant(shapes[0]))
            apply(grads)
        return [v.numpy() for v in variables], apply

    keras_adam = keras.optimizers.Adam(TransformerSchedule(config.d_model, 3), beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    expected, _ = run(keras_adam)
    fused = make_optimizer(config)
    assert isinstance(fused, FusedAdam)
    got, apply = run(fused)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
    got_xla, _ = run(make_optimizer(config), jit=True)
    for a, b in zip(got_xla, expected):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)

    # The formula (paper section 5.3), step by step in float64.
    weights, m, v = [w.astype("float64") for w in initial], [0.0] * 3, [0.0] * 3
    for step, grads in enumerate(gradients, start=1):
        lr = paper_rate(step, config.d_model, 3)
        for i, g in enumerate(grads):
            g = g.astype("float64")
            if step == 2 and i == 0:
                g = np.where(np.isin(np.arange(5), [1, 3])[:, None], g, 0.0)
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.98 * v[i] + 0.02 * g * g
            weights[i] = weights[i] - lr * np.sqrt(1 - 0.98 ** step) / (1 - 0.9 ** step) * m[i] / (np.sqrt(v[i]) + 1e-9)
    for a, b in zip(got, weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)

    graph = apply.get_concrete_function([tf.TensorSpec(s, tf.float32) for s in shapes]).graph
    assert [op.type for op in graph.get_operations()].count("ResourceApplyAdam") == len(shapes)

    # A checkpoint of Keras's Adam (a run started before FusedAdam) restores into it.
    variables = [keras.Variable(w) for w in got]
    restored = make_optimizer(config)
    restored.build(variables)
    path = tf.train.Checkpoint(optimizer=keras_adam).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(optimizer=restored).read(path).assert_consumed()
    for a, b in zip(restored.variables, keras_adam.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(restored.iterations.numpy()) == 3


@pytest.mark.parametrize("jit", [False, True])
def test_accumulated_updates_are_the_papers_adam_on_each_updates_mean_gradient_at_its_update_number(jit):
    """`make_optimizer(config, accumulate=2)` (`train.py --accumulate 2`): six batches' gradients
    make three updates, each the formula's Adam step on the mean of its two batches'
    gradients, with the schedule's rate and the bias correction of the update's number
    (1, 2, 3): Keras 3.15.1 called a schedule with the batch count, a warm-up twice as fast.
    `iterations` counts updates, the learning rate read afterwards is the fourth update's."""
    import tensorflow as tf

    config = TransformerConfig.from_preset("tiny", warmup_steps=3)
    rng = np.random.default_rng(1)
    shapes = [(5, 3), (3,), (7, 2)]
    initial = [rng.normal(size=s).astype("float32") for s in shapes]
    gradients = [[rng.normal(size=s).astype("float32") for s in shapes] for _ in range(6)]
    optimizer = make_optimizer(config, accumulate=2)
    variables = [keras.Variable(w) for w in initial]
    optimizer.build(variables)
    apply = tf.function(lambda grads: optimizer.apply(grads, variables), jit_compile=jit)
    for grads in gradients:
        apply([tf.constant(g) for g in grads])
    assert int(optimizer.iterations.numpy()) == 3
    assert float(optimizer.learning_rate) == pytest.approx(paper_rate(4, config.d_model, 3), rel=1e-6)

    weights, m, v = [w.astype("float64") for w in initial], [0.0] * 3, [0.0] * 3
    for step in (1, 2, 3):
        lr = paper_rate(step, config.d_model, 3)
        for i in range(3):
            g = (gradients[2 * step - 2][i].astype("float64") + gradients[2 * step - 1][i]) / 2
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.98 * v[i] + 0.02 * g * g
            weights[i] = weights[i] - lr * np.sqrt(1 - 0.98 ** step) / (1 - 0.9 ** step) * m[i] / (np.sqrt(v[i]) + 1e-9)
    for got, want in zip(variables, weights):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-7)


def test_a_skipped_batch_that_closes_an_accumulated_update_skips_it_and_drops_its_gradients():
    """mixed_float16 with `--accumulate 2`: an overflowing batch counts as one of its update's
    two batches; when it is the second, the update is skipped and the first batch's gradient
    dropped, so the next update is the mean of its own two batches only."""
    from keras_transformer.training.schedule import CountingLossScaleOptimizer

    variable = keras.Variable(np.ones(1, "float32"))
    optimizer = CountingLossScaleOptimizer(keras.optimizers.SGD(learning_rate=0.5, gradient_accumulation_steps=2),
                                           initial_scale=4.0)
    optimizer.build([variable])
    seen = []
    for scaled in (4.0, np.inf, 2.0, 6.0):  # unscaled 1; overflow (the scale halves to 2); 1; 3
        optimizer.apply([np.array([scaled], "float32")], [variable])
        seen.append((float(variable.numpy()[0]), int(optimizer.iterations.numpy()), int(optimizer.skipped_steps.numpy())))
    # The last update: 1 - 0.5 * (1 + 3) / 2 = 0.0 (with the dropped batch kept: -0.25).
    assert seen == [(1.0, 0, 0), (1.0, 1, 1), (1.0, 1, 1), (0.0, 2, 1)]
