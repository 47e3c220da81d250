"""The suite's per-test seeding (`helpers.seed_keeping_tensorflows_caches`, which
`conftest._seed` runs before every test): the seeds of `keras.utils.set_random_seed`,
without clearing what TensorFlow has instantiated."""

import random

import keras
import numpy as np
import tensorflow as tf
from helpers import seed_keeping_tensorflows_caches
from tensorflow.python.framework import random_seed


def draws():
    """What each seeded generator gives next: Python's, NumPy's, Keras' global seed generator,
    and the seeds TensorFlow hands ops with and without their own."""
    return {"python": [random.random() for _ in range(3)],
            "numpy": np.random.rand(3).tolist(),
            "keras": keras.ops.convert_to_numpy(keras.random.uniform([3])).tolist(),
            "tf_op_seeds": [random_seed.get_seed(None) for _ in range(3)] + [random_seed.get_seed(7)]}


def test_the_seeds_are_keras_set_random_seeds():
    keras.utils.set_random_seed(99)
    want = draws()
    draws()  # every generator moved on
    seed_keeping_tensorflows_caches(99)
    assert draws() == want
    seed_keeping_tensorflows_caches(98)
    assert draws() != want


def test_an_instantiated_function_is_kept():
    """A stateful random kernel in a function: `tf.random.set_seed` drops the instantiated
    function (its kernel starts its sequence again), the suite's seeding keeps it (the kernel
    goes on)."""
    noise = tf.function(lambda: tf.random.uniform([4], seed=3))
    tf.random.set_seed(5)
    first = noise().numpy()
    tf.random.set_seed(5)
    np.testing.assert_array_equal(noise().numpy(), first)  # cleared: instantiated again
    seed_keeping_tensorflows_caches(5)
    assert (noise().numpy() != first).all()  # kept: the same kernel's next draws
