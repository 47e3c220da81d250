"""The paper's learning-rate schedule and Adam settings (section 5.3)."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformer.config import TransformerConfig


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lrate = scale * d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)`.

    Linear warm-up for `warmup_steps`, then inverse square-root decay; `scale`
    is 1 in the paper (`TransformerConfig.learning_rate_scale`).

    Keras calls a schedule with the optimizer's `iterations`, which is 0 for
    the first update. The paper counts updates from 1, so `schedule(i)`
    returns the paper's rate at `step_num = i + 1`: the first update gets a
    small positive rate rather than 0.

    Args:
        d_model: model width (512 base, 1024 big).
        warmup_steps: 4000 in the paper.
        scale: a constant factor on the rate (1.0 in the paper).

    Example:
        >>> schedule = TransformerSchedule(512)
        >>> float(schedule(3999))  # step_num 4000, the peak
        0.000698771...
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if d_model <= 0 or warmup_steps <= 0 or scale <= 0:
            raise ValueError(f"d_model, warmup_steps and scale must be positive, got {d_model}, {warmup_steps}, "
                             f"{scale}")
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step_num = ops.cast(step, "float32") + 1.0
        return (self.scale * self.d_model ** -0.5) * ops.minimum(ops.rsqrt(step_num),
                                                    step_num * self.warmup_steps ** -1.5)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """Keras's Adam, whose TensorFlow update of each variable is one fused kernel.

    Keras's `Adam.update_step` writes the update of each variable as ~15 small ops
    (the learning-rate and bias-correction scalars recomputed per variable, then the
    moments and the step), and a `fit` traces them for every variable before its
    first step (the `multi30k` preset's warm-up: 16-19 s with them, 12 s without;
    docs/lab-notebook, "Adam as one TensorFlow kernel per variable").
    On the TensorFlow backend this class computes the scalars once per update and
    gives every variable to `ResourceApplyAdam`, TensorFlow's Adam kernel, which
    also runs under XLA and every `tf.distribute` strategy. Its update is the same
    formula (paper section 5.3; Kingma and Ba, section 2, with epsilon after the
    square root, as Keras):

        m <- m + (1 - beta_1) (g - m);  v <- v + (1 - beta_2) (g^2 - v)
        var <- var - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)

    with the same variables (moments under the same names, so checkpoints of
    either class restore into the other); the results agree to float32 rounding.
    Other backends (JAX: `benchmarks/gpu_step.py`) run Keras's own `update_step`.

    Example:
        >>> optimizer = FusedAdam(learning_rate=1e-3, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    """

    def _get_current_learning_rate(self):
        # Under gradient accumulation Keras (3.15.1) calls a schedule with `_iterations`, which
        # counts batches, although its docs promise the "real" iterations (updates): the
        # warm-up would end `gradient_accumulation_steps` times too early. The schedule here
        # reads `iterations`, the update count, as Adam's bias correction does.
        if self.gradient_accumulation_steps and isinstance(
                self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def _backend_apply_gradients(self, grads, trainable_variables):
        if not self.gradient_accumulation_steps or self.use_ema or keras.backend.backend() != "tensorflow":
            return super()._backend_apply_gradients(grads, trainable_variables)
        import tensorflow as tf

        if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            return super()._backend_apply_gradients(grads, trainable_variables)
        # Keras's accumulation chooses between the update and the accumulation with a cond in
        # the replica context, whose branches call `merge_call`: MirroredStrategy refuses that
        # ("`merge_call` called while defining a new graph", at the first step). Here the cond
        # is in the cross-replica context and each branch runs in the replicas, as Keras's
        # LossScaleOptimizer does with its own cond; the branches are Keras's.
        steps = self.gradient_accumulation_steps

        def update(grads, variables):
            accumulated = [self._accumulated_gradients[self._get_variable_index(v)] for v in variables]
            grads = self._clip_gradients([(g + a) / steps for g, a in zip(grads, accumulated)])
            self._apply_weight_decay(variables)
            self._backend_update_step(grads, variables, self.learning_rate)
            self._backend_reset_gradient_accumulators()

        def accumulate(grads, variables):
            self._backend_increment_gradient_accumulators(
                grads, [self._accumulated_gradients[self._get_variable_index(v)] for v in variables])

        def cross_replica(distribution, grads, variables):
            ops.cond((self._iterations + 1) % steps == 0,
                     lambda: distribution.extended.call_for_each_replica(update, args=(grads, variables)),
                     lambda: distribution.extended.call_for_each_replica(accumulate, args=(grads, variables)))

        tf.distribute.get_replica_context().merge_call(cross_replica, args=(grads, trainable_variables))

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        # Called by Keras's TensorFlow optimizer only (keras/src/backend/tensorflow/optimizer.py),
        # inside the replica context's merge call, as its per-variable loop is.
        import tensorflow as tf

        if self.amsgrad:
            return super()._distributed_tf_update_step(distribution, grads_and_vars, learning_rate)
        scalars = {}  # per replica's learning rate (one per device under MirroredStrategy): the kernel's scalars

        def kernel_scalars(learning_rate):
            if learning_rate.ref() not in scalars:
                step = tf.cast(self.iterations + 1, "float32")
                beta_1, beta_2 = tf.constant(self.beta_1, "float32"), tf.constant(self.beta_2, "float32")
                scalars[learning_rate.ref()] = dict(
                    beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step),
                    lr=tf.cast(learning_rate, "float32"), beta1=beta_1, beta2=beta_2,
                    epsilon=tf.constant(self.epsilon, "float32"))
            return scalars[learning_rate.ref()]

        def apply(variable, gradient, learning_rate):
            if variable.dtype != tf.float32:  # the kernel's scalars are float32
                return self.update_step(gradient, variable, learning_rate)
            index = self._get_variable_index(variable)
            return tf.raw_ops.ResourceApplyAdam(
                var=variable.handle, m=self._momentums[index].value.handle,
                v=self._velocities[index].value.handle, grad=tf.cast(tf.convert_to_tensor(gradient), "float32"),
                **kernel_scalars(learning_rate))

        for gradient, variable in grads_and_vars:
            distribution.extended.update(variable, apply, args=(gradient, learning_rate), group=False)


def make_optimizer(config: TransformerConfig, accumulate: int = 1) -> keras.optimizers.Adam:
    """Adam with beta1 0.9, beta2 0.98, epsilon 1e-9 and `TransformerSchedule`
    (`FusedAdam`: Keras's Adam with one TensorFlow kernel per variable).

    `accumulate` > 1 averages the gradients of that many batches into each update
    (Keras's `gradient_accumulation_steps`; `iterations` and the schedule then count
    updates, not batches)."""
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate must be a positive integer, got {accumulate!r}")
    return FusedAdam(
        learning_rate=TransformerSchedule(config.d_model, config.warmup_steps, config.learning_rate_scale),
        beta_1=0.9, beta_2=0.98, epsilon=1e-9, gradient_accumulation_steps=accumulate if accumulate > 1 else None)


@keras.saving.register_keras_serializable(package="keras_transformer")
class CountingLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras's dynamic loss scaling (`mixed_float16`), whose skipped steps still count.

    When the scaled gradients overflow, `LossScaleOptimizer` skips the update and
    halves the scale, but `iterations` (which numbers our checkpoints and drives
    the learning-rate schedule) does not advance: rounds would then end one step
    short of their multiple of `--checkpoint-every`, and averaging, which takes
    checkpoints on those multiples, would find none. Here a skipped step advances
    `iterations` like any other batch and is counted in `skipped_steps` (batches,
    under gradient accumulation).
    """

    def build(self, var_list):
        self.skipped_steps = self.add_variable(shape=(), dtype="int", initializer="zeros", aggregation="none",
                                               name="skipped_steps")
        super().build(var_list)

    def _stateful_handle_non_finite_grads(self):
        super()._stateful_handle_non_finite_grads()
        self.skipped_steps.assign_add(1)
        inner = self.inner_optimizer
        steps = inner.gradient_accumulation_steps
        if not steps:
            inner.iterations.assign_add(1)
            return
        # Accumulating: a skipped batch still counts as one of its update's batches, so that
        # updates stay `steps` batches apart. When it is the last of them, that update is
        # skipped too, and the gradients its other batches accumulated are dropped with it.
        ops.cond((inner._iterations + 1) % steps == 0, inner._backend_reset_gradient_accumulators,
                 lambda: None)
        inner._iterations.assign_add(1)
