"""Gradient aggregation (``training.accumulate_batches``): several batches, one optimizer update.

An update window is N consecutive steps of the batch plan (``pipeline.batches.dataset.epoch_windows``:
the epoch shuffles windows, so a window's batches follow each other and a window never spans two
epochs). Each batch's summed per-utterance loss is divided by its window's utterance count (known from
the plan), so the gradients summed over the window are those of one batch N times the size: the CTC loss
averaged per utterance over the whole window, as ``step.py`` averages it over one step.

The gradients stay on their tower (per-replica accumulators) and are all-reduced once per window; each
batch all-reduces three numbers only: its loss, a non-finite flag and the vote (a save, a stop:
``step.ballot``). A batch whose loss or
gradients are not finite adds nothing (the loop records it as a skipped batch, as without aggregation);
the window's update then averages the batches that were added. The update itself is ``step.py``'s:
clipping, the non-finite guard, the revert of an update that made weights non-finite.

The accumulators are not in the checkpoint: the loop saves only between windows (``WindowedSteps.at_end``
tells it where they end), so a checkpoint never holds a part of a window, and a run killed inside one
resumes at the window's first batch and computes it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import tensorflow as tf

from pipeline.batches.dataset import epoch_windows
from pipeline.config import TrainingConfig
from pipeline.train.checkpointing import TrainingError
from pipeline.train.step import (
    StepResult,
    TrainStep,
    all_finite,
    count_votes,
    guard_copies,
    loss_gradients,
    update_function,
)


@dataclass(frozen=True)
class EpochWindows:
    """The update windows of one epoch: for each step of the epoch (in order), the utterances of its
    window, and the steps after which a window ends (counted from 1: the ``step_in_epoch`` reached)."""

    utterances: tuple[int, ...]
    ends: frozenset[int]


@dataclass
class WindowRecord:
    """The finite batches of the loop's current update window: their losses and files (what the epoch's
    mean loss and the warning of an update that was not applied need)."""

    losses: list = field(default_factory=list)
    files: set = field(default_factory=set)


def windows_of_epoch(plan: list[np.ndarray], epoch: int, seed: int, accumulate: int) -> EpochWindows:
    """Where the update windows of ``epoch`` end, and each step's window size in utterances."""
    utterances, ends, done = [], set(), 0
    for window in epoch_windows(len(plan), epoch, seed, accumulate):
        size = sum(len(plan[i]) for i in window)
        utterances.extend([size] * len(window))
        done += len(window)
        ends.add(done)
    return EpochWindows(tuple(utterances), frozenset(ends))


def check_window_start(epoch: int, step_in_epoch: int, ends, accumulate: int) -> None:
    """TrainingError when a run's position (``step_in_epoch`` of ``epoch``) is not between two of the
    epoch's windows (``ends``: the steps after which one ends): checkpoints are only saved there, so such a
    position comes from another batch plan."""
    if step_in_epoch and step_in_epoch not in ends:
        raise TrainingError(
            f"the run's position, step {step_in_epoch} of epoch {epoch + 1}, is inside an update window "
            f"of training.accumulate_batches {accumulate}; checkpoints are only saved between "
            f"windows, so this one comes from another batch plan: delete the run (make rerun STAGE=Train)"
        )


def reduce_flags(losses: list, finite_here, vote):
    """In replica context, one all-reduce of a batch's scalars: ``losses`` (this tower's), whether this
    tower's loss and gradients were finite, its vote (``step.ballot``). Returns (the losses summed over the
    towers, whether every tower was finite and the sums are, the votes summed: ``step.count_votes``)."""
    dtype = losses[0].dtype
    flags = tf.stack([*losses, 1.0 - tf.cast(finite_here, dtype), tf.cast(vote, dtype)])
    summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, flags)
    finite = tf.logical_and(tf.reduce_all(tf.math.is_finite(summed[:-2])), tf.equal(summed[-2], 0.0))
    return tf.unstack(summed[:-2], num=len(losses)), finite, summed[-1]


class GradientSums:
    """The accumulators of an update window: a per-replica variable (``ON_READ``) for each of
    ``variables``, so that each tower adds its own gradients and the update all-reduces them once."""

    def __init__(self, variables, strategy: tf.distribute.Strategy):
        with strategy.scope():
            self._sums = {
                id(v): tf.Variable(
                    tf.zeros(v.shape, v.dtype),
                    trainable=False,
                    name="accumulated",
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.SUM,
                )
                for v in variables
            }

    def add_if(self, finite, variables, grads) -> None:
        """In replica context: add this tower's ``grads`` (of ``variables``) when ``finite``."""

        def add():
            for variable, grad in zip(variables, grads, strict=True):
                self._sums[id(variable)].assign_add(grad)
            return tf.constant(True)

        tf.cond(finite, add, lambda: tf.constant(False))

    def apply(self, variables, update, rescale, scaled_loss: bool):
        """In replica context: ``update`` (``step.update_function`` of ``variables``) with the window's
        gradient of ``variables`` (summed over the towers, times ``rescale``), then empty every sum; returns
        whether the update was applied."""
        context = tf.distribute.get_replica_context()
        sums = [self._sums[id(v)].read_value() for v in variables]
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, sums)
        grads = [g * tf.cast(rescale, g.dtype) for g in grads]
        applied = update(context, grads, tf.constant(True) if scaled_loss else all_finite(grads))
        with tf.control_dependencies([applied]):
            for total in self._sums.values():
                total.assign(tf.zeros_like(total))
        return tf.identity(applied)


class AccumulatingStep:
    """The training step of ``training.accumulate_batches`` above 1: ``add`` runs one batch forward and
    backward into the accumulators, ``update`` applies the window's mean gradient and empties them.

    The arguments are ``TrainStep``'s. The accumulators are per-replica variables (``ON_READ``): each
    tower adds its own gradients, and the update all-reduces them once.
    """

    def __init__(
        self, model, optimizer, step_optimizer, strategy, training: TrainingConfig, blank_index: int
    ):
        self.strategy = strategy
        towers = strategy.num_replicas_in_sync
        scaled_loss = step_optimizer is not optimizer
        gradients = loss_gradients(model, step_optimizer, training, blank_index)
        variables = model.trainable_variables
        update = update_function(
            variables,
            *guard_copies(variables, optimizer, strategy, training),
            step_optimizer,
            strategy,
            training,
        )
        sums = GradientSums(variables, strategy)

        def replica_add(batch, vote, window_utterances):
            features, lengths, labels, label_lengths, indices = batch
            scaled, grads = gradients(features, lengths, labels, label_lengths, window_utterances)
            grads = [tf.convert_to_tensor(g) for g in grads]
            # With loss scaling an overflow in the gradients is the LossScaleOptimizer's to handle at the
            # update (it skips it and lowers the scale); only the loss decides here.
            finite_here = all_finite([scaled] if scaled_loss else [scaled, *grads])
            (summed,), finite, votes = reduce_flags([scaled], finite_here, vote)
            sums.add_if(finite, variables, grads)
            batch_utterances = tf.cast(tf.shape(lengths)[0] * towers, summed.dtype)
            # The batch's own mean loss (what the loop logs): its sum was divided by the window's size.
            loss = summed * tf.cast(window_utterances, summed.dtype) / batch_utterances
            return loss, finite, indices, votes

        def replica_update(rescale):
            return sums.apply(variables, update, rescale, scaled_loss)

        self._replica_add, self._replica_update = replica_add, replica_update
        self._add = self._update = None

    def add(self, batch, element_spec, vote: float, window_utterances: int) -> StepResult:
        """Add one batch to the window whose utterances are ``window_utterances``; the result's ``applied``
        is False (no update yet)."""
        if self._add is None:
            replica_add, strategy = self._replica_add, self.strategy
            self._add = tf.function(
                lambda b, vote, size: strategy.run(replica_add, args=(b, vote, size)),
                input_signature=[element_spec, tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32)],
            )
        loss, finite, indices, votes = self._add(
            batch, tf.constant(float(vote)), tf.constant(float(window_utterances))
        )
        local = self.strategy.experimental_local_results
        save, stop = count_votes(local(votes)[0])
        return StepResult(
            loss=float(local(loss)[0].numpy()),
            finite=bool(local(finite)[0].numpy()),
            applied=False,
            indices=tuple(local(indices)),
            save=save,
            update=False,
            stop=stop,
        )

    def update(self, rescale: float) -> bool:
        """Apply the accumulated gradient times ``rescale`` (the window's utterances over those added) and
        empty the accumulators; returns whether the update was applied."""
        if self._update is None:
            replica_update, strategy = self._replica_update, self.strategy
            self._update = tf.function(
                lambda r: strategy.run(replica_update, args=(r,)),
                input_signature=[tf.TensorSpec([], tf.float32)],
            )
        applied = self._update(tf.constant(rescale, tf.float32))
        return bool(self.strategy.experimental_local_results(applied)[0].numpy())


class WindowedSteps:
    """The loop's training step with or without aggregation: ``start`` at each epoch's position, then one
    call per batch; a result's ``update`` says whether the step ended an update window (always, with
    ``training.accumulate_batches`` 1: each step is then ``TrainStep`` as it is without this module)."""

    def __init__(
        self, model, optimizer, step_optimizer, strategy, training: TrainingConfig, blank_index: int, plan
    ):
        self.accumulate = training.accumulate_batches
        self.plan = plan
        self.seed = training.shuffle_seed
        args = (model, optimizer, step_optimizer, strategy, training, blank_index)
        self._step = TrainStep(*args) if self.accumulate == 1 else AccumulatingStep(*args)
        self._windows: EpochWindows | None = None
        self._position = 0
        self._added = 0  # utterances added to the current window (every worker counts the same)

    @property
    def windows_per_epoch(self) -> int:
        """Optimizer updates per epoch."""
        return -(-len(self.plan) // self.accumulate)

    def start(self, epoch: int, step_in_epoch: int) -> None:
        """Go to step ``step_in_epoch`` of ``epoch``, which must be where a window starts: a checkpoint is
        only ever saved there."""
        self._position, self._added = step_in_epoch, 0
        if self.accumulate == 1:
            return
        self._windows = windows_of_epoch(self.plan, epoch, self.seed, self.accumulate)
        check_window_start(epoch, step_in_epoch, self._windows.ends, self.accumulate)

    def at_end(self) -> bool:
        """Whether the position is between two windows (where the loop may save)."""
        return self.accumulate == 1 or self._position == 0 or self._position in self._windows.ends

    def __call__(self, batch, element_spec, vote: float = 0.0) -> StepResult:
        """Run the next batch (and, at its window's end, the update); ``vote``: ``step.ballot``."""
        self._position += 1
        if self.accumulate == 1:
            return self._step(batch, element_spec, vote=vote)
        size = self._windows.utterances[self._position - 1]
        result = self._step.add(batch, element_spec, vote, size)
        if result.finite:
            self._added += len(result.indices[0]) * self._step.strategy.num_replicas_in_sync
        if not self.at_end():
            return result
        applied = self._added > 0 and self._step.update(size / self._added)
        self._added = 0
        return replace(result, applied=applied, update=True)
