"""The optimizers the training step applies its update with: Adam, over a gradient the step has already
summed over the towers, and the loss scaling of ``mixed_float16``."""

from __future__ import annotations

import keras

from pipeline.config import TrainingConfig
from pipeline.train.checkpointing import TrainingError


class ReducedGradientAdam(keras.optimizers.Adam):
    """Adam that applies the gradient it is given. Keras' optimizer sums the gradients over the towers
    again when it runs in a replica context (``_all_reduce_sum_gradients``, TensorFlow backend); the step
    has summed them once already, with its loss and vote, and clips and checks the sum before the update,
    so a second all-reduce would only cost time: a full gradient's worth of traffic per step between
    machines. Keras 2 let a caller skip it (``experimental_aggregate_gradients=False``); Keras 3 does not."""

    def __init__(self, *args, **kwargs):
        if not hasattr(keras.optimizers.Adam, "_all_reduce_sum_gradients"):  # a Keras that reduces elsewhere
            raise TrainingError(f"keras {keras.__version__}: the optimizer's gradient all-reduce moved")
        super().__init__(*args, **kwargs)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)


def optimizers(training: TrainingConfig, variables) -> tuple:
    """(the Adam the checkpoint keeps, what applies the step's update, the loss scale's variables to
    checkpoint beside them) of ``training`` for ``variables``, built in the caller's strategy scope.
    ``mixed_float16`` needs loss scaling: a ``LossScaleOptimizer`` around the same Adam, so the checkpoint
    has the same keys in every precision (a run can switch) with the scale beside them."""
    adam = ReducedGradientAdam(
        learning_rate=training.learning_rate,
        beta_1=training.beta1,
        beta_2=training.beta2,
        epsilon=training.epsilon,
    )
    adam.build(variables)
    if training.precision != "mixed_float16":
        return adam, adam, {}
    scaled = keras.optimizers.LossScaleOptimizer(adam)
    scaled.build(variables)
    return adam, scaled, {"scale": scaled.dynamic_scale, "counter": scaled.step_counter}
