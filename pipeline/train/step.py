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
    whether the update was applied, the per-tower tensors of the batch's utterance indices, and whether
    any worker asked for a checkpoint after this step (the same answer on every worker)."""

    loss: float
    finite: bool
    applied: bool
    indices: tuple
    save: bool = False

    def batch_indices(self) -> list[int]:
        """The utterance indices (into the train split) of the step's batch, all towers, sorted."""
        return sorted({int(i) for part in self.indices for i in part.numpy()})


def tower_loss(model, training: TrainingConfig, blank: int, towers: int):
    """``loss(batch)``: a tower's share of the step's loss of a batch (features, lengths, labels, label
    lengths, indices) through ``model``'s family: its forward pass and loss head, the per-utterance losses
    summed and divided by the step's global batch."""
    # The C++ CTC kernel has no XLA kernel and runs only on a CPU: elsewhere the exact log-space CTC.
    ctc = ctc_implementation(training.jit_compile)
    family = model_family(model.model_config.architecture)

    def loss(batch):
        features, lengths, labels, label_lengths, _ = batch
        # [batch, time', classes] float32, and each row's output length: the family's stride
        logits, output_lengths = family.forward(model, features, lengths, training=True)
        per_sample = family.loss(labels, label_lengths, logits, output_lengths, blank, ctc)
        # The step's global batch: every tower gets as many utterances (max_batch_frames may make a step
        # smaller than training.batch_size).
        step_batch = tf.cast(tf.shape(lengths)[0] * towers, per_sample.dtype)
        return tf.reduce_sum(per_sample) / step_batch

    return loss


def _indices(batch):
    """A batch's utterance indices (its last element)."""
    return batch[-1]


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

    A step also carries a save vote: each worker's vote travels in the step's own
    all-reduce (no extra round trip), so that every worker of a multi-worker run
    learns after the same step that a checkpoint is due, and saves at the same step.
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
        guarded, shadows = self._shadows(model.trainable_variables, optimizer, strategy, training)
        loss = tower_loss(model, training, blank_index, strategy.num_replicas_in_sync)
        variables = model.trainable_variables
        self._replica_step = self._build(
            loss, _indices, variables, guarded, shadows, optimizer, step_optimizer, strategy, training
        )
        self._compiled = None

    @staticmethod
    def _shadows(variables, inner_optimizer, strategy, training: TrainingConfig) -> tuple[list, list]:
        """(the variables an update may change: ``variables`` and the optimizer's, their shadow copies made
        in the strategy's scope; none without ``training.revert_nonfinite_updates``)."""
        guarded = list(variables) + list(inner_optimizer.variables)
        with strategy.scope():
            shadows = (
                [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="shadow") for v in guarded]
                if training.revert_nonfinite_updates
                else []
            )
        return guarded, shadows

    @staticmethod
    def _build(
        loss_of, indices_of, variables, guarded, shadows, inner_optimizer, optimizer, strategy, training
    ):
        """The per-replica step function: ``loss_of(batch)`` the tower's share of the step's loss (forward
        pass in a gradient tape), ``indices_of(batch)`` the batch's utterance indices, ``variables`` what
        the update trains, ``guarded``/``shadows`` what a reverted update puts back (``_shadows``)."""
        towers = strategy.num_replicas_in_sync
        scaled_loss = optimizer is not inner_optimizer
        jit = training.jit_compile
        clip = training.clip_grad_norm
        guard = training.revert_nonfinite_updates

        def gradients(batch):
            """(the tower's share of the loss, its gradients): forward and backward, one XLA cluster with
            jit_compile."""
            with tf.GradientTape() as tape:
                scaled = loss_of(batch)
                backward = optimizer.scale_loss(scaled) if scaled_loss else scaled
            return scaled, tape.gradient(backward, variables)

        if jit:
            gradients = tf.function(gradients, jit_compile=True)

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
                ok = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])

                def revert():
                    for shadow, variable in zip(shadows, guarded, strict=False):
                        variable.assign(shadow)
                    return tf.constant(False)

                return tf.cond(ok, lambda: tf.constant(True), revert)

            return tf.cond(
                distribution.experimental_local_results(finite)[0], apply, lambda: tf.constant(False)
            )

        def replica_step(batch, save_vote):
            indices = indices_of(batch)
            scaled, grads = gradients(batch)
            context = tf.distribute.get_replica_context()
            # The vote comes in as one tensor for every tower: made on the tower's device to be reduced.
            vote = tf.zeros_like(scaled) + tf.cast(save_vote, scaled.dtype)
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, grads + [scaled, vote])
            grads, loss, votes = reduced[:-2], reduced[-2], reduced[-1]
            # With loss scaling, the LossScaleOptimizer skips steps whose gradients overflowed (and lowers
            # the scale); only the loss decides here.
            checked = [loss] if scaled_loss else reduced[:-1]
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in checked])
            if clip > 0:
                # Scaled gradients are clipped at the scaled norm: the same as clipping the true ones.
                grads, _ = tf.clip_by_global_norm(
                    grads, clip * (optimizer.dynamic_scale if scaled_loss else 1.0)
                )
            # The optimizer all-reduces (sums) again: hand it each tower's share of the global gradient.
            grads = [g / towers for g in grads]
            applied = context.merge_call(apply_if_finite, args=(finite, grads))
            return loss, finite, applied, indices, votes > 0

        return replica_step

    def __call__(self, batch, element_spec, save_vote: bool = False) -> StepResult:
        """Run one step on ``batch``, an element of a distributed dataset whose ``element_spec`` is given
        (one trace serves every batch shape: the signature has unknown batch and time sizes).
        ``save_vote``: this worker asks for a checkpoint after the step (``StepResult.save`` says whether
        any worker did)."""
        if self._compiled is None:
            replica_step, strategy = self._replica_step, self.strategy
            self._compiled = tf.function(
                lambda b, vote: strategy.run(replica_step, args=(b, vote)),
                input_signature=[element_spec, tf.TensorSpec([], tf.float32)],
            )
        loss, finite, applied, indices, save = self._compiled(batch, tf.constant(float(save_vote)))
        local = self.strategy.experimental_local_results
        return StepResult(
            loss=float(local(loss)[0].numpy()),
            finite=bool(local(finite)[0].numpy()),
            applied=bool(local(applied)[0].numpy()),
            indices=tuple(local(indices)),
            save=bool(local(save)[0].numpy()),
        )
