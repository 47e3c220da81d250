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


def make_optimizer(config: TransformerConfig) -> keras.optimizers.Adam:
    """Adam with beta1 0.9, beta2 0.98, epsilon 1e-9 and `TransformerSchedule`."""
    return keras.optimizers.Adam(
        learning_rate=TransformerSchedule(config.d_model, config.warmup_steps, config.learning_rate_scale),
        beta_1=0.9, beta_2=0.98, epsilon=1e-9)


@keras.saving.register_keras_serializable(package="keras_transformer")
class CountingLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras's dynamic loss scaling (`mixed_float16`), whose skipped steps still count.

    When the scaled gradients overflow, `LossScaleOptimizer` skips the update and
    halves the scale, but `iterations` (which numbers our checkpoints and drives
    the learning-rate schedule) does not advance: rounds would then end one step
    short of their multiple of `--checkpoint-every`, and averaging, which takes
    checkpoints on those multiples, would find none. Here a skipped step advances
    `iterations` like any other batch and is counted in `skipped_steps`.
    """

    def build(self, var_list):
        self.skipped_steps = self.add_variable(shape=(), dtype="int", initializer="zeros", aggregation="none",
                                               name="skipped_steps")
        super().build(var_list)

    def _stateful_handle_non_finite_grads(self):
        super()._stateful_handle_non_finite_grads()
        self.skipped_steps.assign_add(1)
        self.inner_optimizer.iterations.assign_add(1)
