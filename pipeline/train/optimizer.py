"""The optimizer the training step applies its update with: Adam, over a gradient the step has already
summed over the towers."""

from __future__ import annotations

import keras

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
