"""The compiled training step: forward and backward on each tower, CTC loss, all-reduce, the
non-finite guard, one optimizer update.

Nothing here knows about epochs, checkpoints or validation (``loop.py`` and
``policy.py``); a step takes one distributed batch and says what happened.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf

from pipeline.config import TrainingConfig
from pipeline.model import model_family
from pipeline.model.ctc import ctc_implementation


@dataclass(frozen=True)
class StepResult:
    """What one step did: its loss (summed over towers), whether that loss and the gradients were finite,
    whether the update was applied, the per-tower tensors of the batch's utterance indices, whether
    any worker asked for a checkpoint after this step (the same answer on every worker), and whether the
    step ended an update window (always without ``training.accumulate_batches``; ``accumulate.py``);
    ``stop``: whether any worker asked for training to stop (``ballot``), the same answer on every worker."""

    loss: float
    finite: bool
    applied: bool
    indices: tuple
    save: bool = False
    update: bool = True
    stop: bool = False

    def batch_indices(self) -> list[int]:
        """The utterance indices (into the train split) of the step's batch, all towers, sorted."""
        return sorted({int(i) for part in self.indices for i in part.numpy()})


# A worker's vote travels in each step's own all-reduce (no extra round trip) as one number: 1 asks for a
# checkpoint after the step, STOP_VOTE for a stop with a checkpoint (a hook's StopTraining: a signal). The
# sum over every tower tells every worker both answers after the same step: a checkpoint when it is above 0,
# a stop from STOP_VOTE on (save votes alone, one per tower, never reach it).
STOP_VOTE = 4096.0


def ballot(save: bool, stop: bool = False) -> float:
    """This worker's vote for a step (the ``vote`` argument of the step functions)."""
    return float(save) + STOP_VOTE * float(stop)


def count_votes(votes) -> tuple[bool, bool]:
    """(checkpoint, stop): what the towers' votes summed (a tensor of this worker's) decided."""
    total = float(votes.numpy())
    return total > 0, total >= STOP_VOTE


class TrainStep:
    """One training step over all towers, compiled on first use.

    Each tower computes its share of the loss (the per-utterance CTC loss summed
    and divided by the step's global batch) and its gradients; the gradients and
    the loss are summed over the towers; a step whose loss (or, without loss
    scaling, gradients) is not finite is skipped. With
    ``training.revert_nonfinite_updates`` the variables the update changes are
    copied into shadow variables first and put back when the update made any
    weight non-finite: one copy of the weights and optimizer slots in memory, and a
    copy per step.

    ``optimizer`` is the Adam whose slots are checkpointed; ``step_optimizer`` is
    what applies the update (the same object, or a ``LossScaleOptimizer`` around it
    with ``mixed_float16``).

    A step also carries a vote (``ballot``): each worker's vote travels in the step's own
    all-reduce (no extra round trip), so that every worker of a multi-worker run
    learns after the same step that a checkpoint is due, or that training stops, and
    saves (and stops) at the same step.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        step_optimizer: keras.optimizers.Optimizer,
        strategy: tf.distribute.Strategy,
        training: TrainingConfig,
        blank_index: int,
    ):
        self.strategy = strategy
        towers = strategy.num_replicas_in_sync
        variables = model.trainable_variables
        gradients = loss_gradients(model, step_optimizer, training, blank_index)

        def gradients_of(batch):
            features, lengths, labels, label_lengths, _ = batch
            # The step's global batch: every tower gets as many utterances (max_batch_frames may make a step
            # smaller than training.batch_size).
            step_batch = tf.cast(tf.shape(lengths)[0] * towers, tf.float32)
            return gradients(features, lengths, labels, label_lengths, step_batch)

        update = update_function(
            variables,
            *guard_copies(variables, optimizer, strategy, training),
            step_optimizer,
            strategy,
            training,
        )
        self._replica_step = self._build(
            gradients_of, lambda batch: batch[-1], update, step_optimizer is not optimizer
        )
        self._compiled = None

    @staticmethod
    def _build(gradients_of, indices_of, update, scaled_loss: bool):
        """The per-replica step function: ``gradients_of(batch)`` the tower's share of the step's loss and
        its gradients, ``indices_of(batch)`` the batch's utterance indices, ``update`` the optimizer update
        (``update_function``); ``scaled_loss``: the gradients are of a scaled loss (``mixed_float16``)."""

        def replica_step(batch, vote):
            scaled, grads = gradients_of(batch)
            context = tf.distribute.get_replica_context()
            # The vote comes in as one tensor for every tower: made on the tower's device to be reduced.
            mine = tf.zeros_like(scaled) + tf.cast(vote, scaled.dtype)
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, grads + [scaled, mine])
            grads, loss, votes = reduced[:-2], reduced[-2], reduced[-1]
            # With loss scaling, the LossScaleOptimizer skips steps whose gradients overflowed (and lowers
            # the scale); only the loss decides here.
            checked = [loss] if scaled_loss else reduced[:-1]
            finite = all_finite(checked)
            applied = update(context, grads, finite)
            return loss, finite, applied, indices_of(batch), votes

        return replica_step

    def __call__(self, batch, element_spec, vote: float = 0.0) -> StepResult:
        """Run one step on ``batch``, an element of a distributed dataset whose ``element_spec`` is given
        (one trace serves every batch shape: the signature has unknown batch and time sizes).
        ``vote``: this worker's ``ballot``, asking for a checkpoint or a stop after the step
        (``StepResult.save`` and ``.stop`` say whether any worker did)."""
        if self._compiled is None:
            replica_step, strategy = self._replica_step, self.strategy
            self._compiled = tf.function(
                lambda b, vote: strategy.run(replica_step, args=(b, vote)),
                input_signature=[element_spec, tf.TensorSpec([], tf.float32)],
            )
        loss, finite, applied, indices, votes = self._compiled(batch, tf.constant(float(vote)))
        local = self.strategy.experimental_local_results
        save, stop = count_votes(local(votes)[0])
        return StepResult(
            loss=float(local(loss)[0].numpy()),
            finite=bool(local(finite)[0].numpy()),
            applied=bool(local(applied)[0].numpy()),
            indices=tuple(local(indices)),
            save=save,
            stop=stop,
        )


def all_finite(tensors) -> tf.Tensor:
    """Whether every element of ``tensors`` is finite (one boolean)."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def loss_gradients(model, optimizer, training: TrainingConfig, blank: int):
    """The per-tower forward and backward pass: ``gradients(features, lengths, labels, label_lengths,
    divisor)`` returns (the per-utterance CTC losses summed over the tower's batch and divided by
    ``divisor``, their gradients), the gradients of the scaled loss with ``mixed_float16``; one XLA cluster
    with ``training.jit_compile``."""
    scaled_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    # The C++ CTC kernel has no XLA kernel and runs only on a CPU: elsewhere the exact log-space CTC.
    ctc = ctc_implementation(training.jit_compile)
    family = model_family(model.model_config.architecture)

    def gradients(features, lengths, labels, label_lengths, divisor):
        with tf.GradientTape() as tape:
            # [batch, time', classes] float32, and each row's output length: the family's stride
            logits, output_lengths = family.forward(model, features, lengths, training=True)
            per_sample = family.loss(labels, label_lengths, logits, output_lengths, blank, ctc)
            scaled = tf.reduce_sum(per_sample) / tf.cast(divisor, per_sample.dtype)
            backward = optimizer.scale_loss(scaled) if scaled_loss else scaled
        return scaled, tape.gradient(backward, model.trainable_variables)

    return tf.function(gradients, jit_compile=True) if training.jit_compile else gradients


def guard_copies(variables, inner_optimizer, strategy: tf.distribute.Strategy, training) -> tuple[list, list]:
    """(the variables an update may change: ``variables`` and the optimizer's; their shadow copies, made in
    the strategy's scope, that a reverted update puts back: none without
    ``training.revert_nonfinite_updates``)."""
    guarded = list(variables) + list(inner_optimizer.variables)
    with strategy.scope():
        shadows = (
            [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="shadow") for v in guarded]
            if training.revert_nonfinite_updates
            else []
        )
    return guarded, shadows


def update_function(variables, guarded, shadows, optimizer, strategy: tf.distribute.Strategy, training):
    """The optimizer update of ``variables``, called in replica context with the global gradient (summed
    over the towers) and whether it is finite: ``update(context, grads, finite)`` clips
    (``training.clip_grad_norm``), applies when finite and returns whether the update was applied (False
    also when ``training.revert_nonfinite_updates`` put ``guarded`` back from ``shadows``:
    ``guard_copies``)."""
    towers = strategy.num_replicas_in_sync
    scaled_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    clip = training.clip_grad_norm
    guard = training.revert_nonfinite_updates

    def apply_if_finite(distribution, finite, grads):
        # Runs in cross-replica context: assignments reach every replica.
        def apply():
            for shadow, variable in zip(shadows, guarded, strict=False):
                shadow.assign(variable)
            distribution.extended.call_for_each_replica(
                lambda g: optimizer.apply(g, variables), args=(grads,)
            )
            if not guard:
                return tf.constant(True)
            ok = all_finite(variables)

            def revert():
                for shadow, variable in zip(shadows, guarded, strict=False):
                    variable.assign(shadow)
                return tf.constant(False)

            return tf.cond(ok, lambda: tf.constant(True), revert)

        return tf.cond(distribution.experimental_local_results(finite)[0], apply, lambda: tf.constant(False))

    def update(context, grads, finite):
        if clip > 0:
            # Scaled gradients are clipped at the scaled norm: the same as clipping the true ones.
            grads, _ = tf.clip_by_global_norm(grads, clip * (optimizer.dynamic_scale if scaled_loss else 1.0))
        # The optimizer all-reduces (sums) again: hand it each tower's share of the global gradient.
        grads = [g / towers for g in grads]
        return context.merge_call(apply_if_finite, args=(finite, grads))

    return update
