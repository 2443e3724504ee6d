"""The training step of a multi-task run (``multitask:``): each task's loss on its head or network through
the family's forward pass and loss head, times its weight over the mean weight, averaged over the step's
tasks; one update of what those tasks use (a head a step did not use is not moved: no Adam momentum on
it), with the towers, the non-finite guard and the vote (save, stop) of the single-task step (``step.py``).
With ``training.accumulate_batches`` the steps add into update windows instead (``task_windows.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from pipeline.model.ctc import ctc_implementation
from pipeline.model.heads import MultiTaskModel
from pipeline.train.step import StepResult, TrainStep, count_votes, guard_copies, update_function


@dataclass(frozen=True)
class TaskStepResult(StepResult):
    """A multi-task step's result: ``tasks`` the tasks it drew from, ``indices`` per task (in that order)
    the per-tower tensors of its utterance indices."""

    tasks: tuple[int, ...] = ()


def loss_factors(weights) -> list[float]:
    """Each task's loss factor: its weight over the tasks' mean weight (equal weights: all 1)."""
    mean = sum(weights) / len(weights)
    return [w / mean for w in weights]


def task_losses(model: MultiTaskModel, tasks: tuple[int, ...], batches, blanks, ctc) -> list[tuple]:
    """In replica context, the forward pass and loss head of each of ``tasks`` on its batch (``blanks``: the
    tasks' blank indices): for each, (its per-utterance CTC losses summed over the tower's batch, the
    tower's batch size)."""
    sums = []
    for index, (features, lengths, labels, label_lengths, _) in zip(tasks, batches, strict=True):
        logits, output_lengths = model.forward(index, features, lengths, training=True)
        per_sample = model.family.loss(labels, label_lengths, logits, output_lengths, blanks[index], ctc)
        sums.append((tf.reduce_sum(per_sample), tf.shape(lengths)[0]))
    return sums


class MultiTaskStep(TrainStep):
    """The training step over the tasks a step draws from (``__call__(tasks, batches, ...)``), compiled once
    per set of tasks (one per task with ``proportional``, one with ``round_robin``)."""

    def __init__(self, model: MultiTaskModel, factors, blanks, optimizer, step_optimizer, strategy, training):
        """``factors``: the tasks' loss factors (``loss_factors``); ``blanks``: their blank indices; the rest
        as for ``TrainStep``."""
        self.strategy, self.model = strategy, model
        self._guarded, self._shadow_copies = guard_copies(
            model.trainable_variables, optimizer, strategy, training
        )
        self._optimizers, self._training = (optimizer, step_optimizer), training
        self._factors, self._blanks = list(factors), list(blanks)
        self._steps: dict[tuple[int, ...], tuple] = {}

    def start(self, epoch: int, step_in_epoch: int) -> None:
        """Every step is its own update: nothing to prepare at an epoch's start."""

    def at_end(self) -> bool:
        """Every step is its own update window: the loop may save after any."""
        return True

    def _loss(self, tasks: tuple[int, ...]):
        """``loss(batches)``: the tower's share of the step's loss over ``tasks``' batches."""
        model, towers = self.model, self.strategy.num_replicas_in_sync
        ctc = ctc_implementation(self._training.jit_compile)

        def loss(batches):
            total, sums = 0.0, task_losses(model, tasks, batches, self._blanks, ctc)
            for index, (summed, size) in zip(tasks, sums, strict=True):
                total += self._factors[index] * summed / tf.cast(size * towers, summed.dtype)
            return total / len(tasks)

        return loss

    def _compiled_for(self, tasks: tuple[int, ...], element_spec):
        if tasks not in self._steps:
            inner, optimizer = self._optimizers
            scaled_loss, loss, variables = (
                optimizer is not inner,
                self._loss(tasks),
                self.model.task_variables(tasks),
            )

            def gradients_of(batches):
                with tf.GradientTape() as tape:
                    scaled = loss(batches)
                    backward = optimizer.scale_loss(scaled) if scaled_loss else scaled
                return scaled, tape.gradient(backward, variables)

            if self._training.jit_compile:
                gradients_of = tf.function(gradients_of, jit_compile=True)
            update = update_function(
                variables, self._guarded, self._shadow_copies, optimizer, self.strategy, self._training
            )
            replica_step = self._build(
                gradients_of, lambda batches: tuple(batch[-1] for batch in batches), update, scaled_loss
            )
            strategy = self.strategy
            self._steps[tasks] = tf.function(
                lambda b, vote: strategy.run(replica_step, args=(b, vote)),
                input_signature=[element_spec, tf.TensorSpec([], tf.float32)],
            )
        return self._steps[tasks]

    def __call__(self, tasks: tuple[int, ...], batches, element_spec, vote: float = 0.0) -> TaskStepResult:
        """One step on ``batches`` (a batch of each of ``tasks``, elements of their distributed datasets
        whose ``element_spec`` is given, as a tuple); ``vote``: ``step.ballot``."""
        compiled = self._compiled_for(tasks, element_spec)
        loss, finite, applied, indices, votes = compiled(tuple(batches), tf.constant(float(vote)))
        local = self.strategy.experimental_local_results
        save, stop = count_votes(local(votes)[0])
        return TaskStepResult(
            loss=float(local(loss)[0].numpy()),
            finite=bool(local(finite)[0].numpy()),
            applied=bool(local(applied)[0].numpy()),
            indices=tuple(tuple(local(part)) for part in indices),
            save=save,
            stop=stop,
            tasks=tasks,
        )
