"""Gradient aggregation over a multi-task run's steps (``training.accumulate_batches`` with ``multitask:``).

An update window is N consecutive steps of the epoch's task schedule (``pipeline.batches.tasks``; the last
window of an epoch may be shorter, and a window never spans two epochs). Its gradient is that of one step
over all of its batches. A step's loss is the mean over its tasks of each task's weighted per-utterance
mean loss (``task_step.py``); over a window, each task's per-utterance mean is taken over all of its
utterances in the window and weighted by the share of the window's steps that drew the task. So a
``round_robin`` window of N steps at batch B is one step at batch N x B (each task's datasets keep the N
batches a window draws consecutive in their plan, as a single-task run does), and a ``proportional`` window
weighs its tasks as its N steps would, each task's batches pooled per utterance. With one task it is
``accumulate.py``'s window.

In numbers: in a window of N steps that each draw m tasks, the batch of task t adds
``factor_t * k_t / (N * m * U_t)`` times its summed per-utterance loss, where k_t is how many of the
window's steps drew t and U_t is t's utterances in the window: both known from the tasks' batch plans
before the window starts. The update moves the variables of the tasks whose batches the window added
(and the shared part) only, as a step does: a task the window never drew, or drew only in steps skipped
as non-finite, gets no update (no Adam momentum on a gradient it never had). Accumulators, non-finite
batches, the update and the loop's saves between windows are as in ``accumulate.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import tensorflow as tf

from pipeline.model.ctc import ctc_implementation
from pipeline.model.heads import MultiTaskModel
from pipeline.train.accumulate import GradientSums, check_window_start, reduce_flags
from pipeline.train.step import all_finite, count_votes, guard_copies, update_function
from pipeline.train.task_step import TaskStepResult, task_losses


@dataclass(frozen=True)
class TaskWindows:
    """The update windows of one multi-task epoch. For each step (in order): the loss coefficient of each
    of its tasks' batches (in the step's task order), its share of its window's loss (a window's shares sum
    to 1: what is left when a step is skipped); and the steps after which a window ends (counted from 1)."""

    coefficients: tuple[tuple[float, ...], ...]
    shares: tuple[float, ...]
    ends: frozenset[int]


def task_windows(
    schedule: Sequence[tuple[int, ...]],
    first_draws: Sequence[int],
    batch_utterances: Callable[[int, int], int],
    factors: Sequence[float],
    accumulate: int,
) -> TaskWindows:
    """The windows of an epoch whose steps draw the tasks of ``schedule`` (``epoch_tasks``), each task
    starting at its draw ``first_draws[t]``; ``batch_utterances(t, d)`` is the utterance count of task t's
    draw d; ``factors`` the tasks' loss factors (``loss_factors``)."""
    draws = list(first_draws)
    coefficients, shares, ends = [], [], set()
    for start in range(0, len(schedule), accumulate):
        steps = schedule[start : start + accumulate]
        sizes = []
        for tasks in steps:
            sizes.append([batch_utterances(t, draws[t]) for t in tasks])
            for t in tasks:
                draws[t] += 1
        drawn = Counter(t for tasks in steps for t in tasks)
        utterances = Counter()
        for tasks, counts in zip(steps, sizes, strict=True):
            utterances.update(dict(zip(tasks, counts, strict=True)))
        masses = []
        for tasks, counts in zip(steps, sizes, strict=True):
            each = tuple(factors[t] * drawn[t] / (len(steps) * len(tasks) * utterances[t]) for t in tasks)
            coefficients.append(each)
            masses.append(sum(c * u for c, u in zip(each, counts, strict=True)))
        shares.extend(mass / sum(masses) for mass in masses)
        ends.add(start + len(steps))
    return TaskWindows(tuple(coefficients), tuple(shares), frozenset(ends))


class MultiTaskAccumulatingStep:
    """The multi-task step of ``training.accumulate_batches`` above 1: ``add`` runs one step's batches
    forward and backward into the accumulators, ``update`` applies the window's gradient to the variables
    of the tasks it added and empties them. Compiled once per set of tasks, as ``MultiTaskStep``.

    ``factors``: the tasks' loss factors; ``blanks``: their blank indices; the rest as for ``TrainStep``.
    """

    def __init__(self, model: MultiTaskModel, factors, blanks, optimizer, step_optimizer, strategy, training):
        self.strategy, self.model = strategy, model
        self._training, self._optimizer = training, step_optimizer
        self._scaled_loss = step_optimizer is not optimizer
        self._factors, self._blanks = list(factors), list(blanks)
        self._guard = guard_copies(model.trainable_variables, optimizer, strategy, training)
        self._sums = GradientSums(model.task_variables(range(len(self._factors))), strategy)
        self._adds: dict[tuple[int, ...], object] = {}
        self._updates: dict[tuple[int, ...], object] = {}

    def _gradients(self, tasks: tuple[int, ...]):
        """``gradients(batches, coefficients)``: (the tower's per-task loss sums, its batch sizes, the
        coefficients' weighted sum of the loss sums, its gradients: of the scaled loss with
        ``mixed_float16``) over ``tasks``' variables."""
        model, optimizer, blanks = self.model, self._optimizer, self._blanks
        variables, scaled_loss = model.task_variables(tasks), self._scaled_loss
        ctc = ctc_implementation(self._training.jit_compile)

        def gradients(batches, coefficients):
            with tf.GradientTape() as tape:
                sums = task_losses(model, tasks, batches, blanks, ctc)
                losses = [summed for summed, _ in sums]
                weighted = tf.add_n([tf.cast(coefficients[j], s.dtype) * s for j, s in enumerate(losses)])
                backward = optimizer.scale_loss(weighted) if scaled_loss else weighted
            grads = tape.gradient(backward, variables)
            return losses, [size for _, size in sums], weighted, grads

        if self._training.jit_compile:
            return tf.function(gradients, jit_compile=True)
        return gradients

    def _add_for(self, tasks: tuple[int, ...], element_spec):
        if tasks not in self._adds:
            gradients, variables = self._gradients(tasks), self.model.task_variables(tasks)
            sums, factors, scaled_loss = self._sums, self._factors, self._scaled_loss
            towers, strategy = self.strategy.num_replicas_in_sync, self.strategy

            def replica_add(batches, vote, coefficients):
                losses, sizes, weighted, grads = gradients(batches, coefficients)
                grads = [tf.convert_to_tensor(g) for g in grads]
                # With loss scaling, an overflow in the gradients is the LossScaleOptimizer's to handle at
                # the update; only the loss decides here.
                finite_here = all_finite([weighted] if scaled_loss else [weighted, *grads])
                summed, finite, votes = reduce_flags(losses, finite_here, vote)
                sums.add_if(finite, variables, grads)
                # The step's loss as without aggregation (what the loop logs).
                loss = tf.add_n(
                    [
                        factors[t] * s / tf.cast(size * towers, s.dtype)
                        for t, s, size in zip(tasks, summed, sizes, strict=True)
                    ]
                ) / len(tasks)
                return loss, finite, tuple(batch[-1] for batch in batches), votes

            self._adds[tasks] = tf.function(
                lambda b, vote, c: strategy.run(replica_add, args=(b, vote, c)),
                input_signature=[
                    element_spec,
                    tf.TensorSpec([], tf.float32),
                    tf.TensorSpec([len(tasks)], tf.float32),
                ],
            )
        return self._adds[tasks]

    def add(self, tasks: tuple[int, ...], batches, element_spec, vote: float, coefficients) -> TaskStepResult:
        """Add one step's ``batches`` (of ``tasks``) to the window, each task's summed loss times its
        ``coefficients`` entry; the result's ``applied`` is False (no update yet)."""
        compiled = self._add_for(tasks, element_spec)
        loss, finite, indices, votes = compiled(
            tuple(batches), tf.constant(float(vote)), tf.constant(coefficients, tf.float32)
        )
        local = self.strategy.experimental_local_results
        save, stop = count_votes(local(votes)[0])
        return TaskStepResult(
            loss=float(local(loss)[0].numpy()),
            finite=bool(local(finite)[0].numpy()),
            applied=False,
            indices=tuple(tuple(local(part)) for part in indices),
            save=save,
            update=False,
            stop=stop,
            tasks=tasks,
        )

    def update(self, tasks: tuple[int, ...], rescale: float) -> bool:
        """Apply the accumulated gradient (times ``rescale``) to the variables of ``tasks`` (those whose
        batches the window added) and empty the accumulators; returns whether the update was applied."""
        if tasks not in self._updates:
            variables, sums, scaled_loss = self.model.task_variables(tasks), self._sums, self._scaled_loss
            update = update_function(variables, *self._guard, self._optimizer, self.strategy, self._training)
            strategy = self.strategy

            def replica_update(rescale):
                return sums.apply(variables, update, rescale, scaled_loss)

            # A named function: autograph cannot read the source of two nested lambdas on one line.
            self._updates[tasks] = tf.function(
                lambda r: strategy.run(replica_update, args=(r,)),
                input_signature=[tf.TensorSpec([], tf.float32)],
            )
        applied = self._updates[tasks](tf.constant(rescale, tf.float32))
        return bool(self.strategy.experimental_local_results(applied)[0].numpy())


class TaskWindowedSteps:
    """The multi-task loop's step with aggregation: ``start`` at each epoch's position, then one call per
    step; a result's ``update`` says whether the step ended an update window. ``windows_of(epoch)`` gives
    an epoch's ``TaskWindows``."""

    def __init__(
        self,
        step: MultiTaskAccumulatingStep,
        windows_of: Callable[[int], TaskWindows],
        accumulate: int,
        steps_per_epoch: int,
    ):
        self._step, self._windows_of = step, windows_of
        self.accumulate, self._steps_per_epoch = accumulate, steps_per_epoch
        self._windows: TaskWindows | None = None
        self._position = 0
        self._added, self._skipped = 0.0, False
        self._tasks: set[int] = set()  # the tasks of the window's steps added so far (finite)

    @property
    def windows_per_epoch(self) -> int:
        """Optimizer updates per epoch."""
        return -(-self._steps_per_epoch // self.accumulate)

    def start(self, epoch: int, step_in_epoch: int) -> None:
        """Go to step ``step_in_epoch`` of ``epoch``, which must be where a window starts (TrainingError
        otherwise: checkpoints are only saved there)."""
        self._position, self._added, self._skipped = step_in_epoch, 0.0, False
        self._tasks = set()
        self._windows = self._windows_of(epoch)
        check_window_start(epoch, step_in_epoch, self._windows.ends, self.accumulate)

    def at_end(self) -> bool:
        """Whether the position is between two windows (where the loop may save)."""
        return self._position == 0 or self._position in self._windows.ends

    def __call__(self, tasks: tuple[int, ...], batches, element_spec, vote: float = 0.0) -> TaskStepResult:
        """Run the next step's batches (and, at its window's end, the update); ``vote``: ``step.ballot``."""
        index = self._position
        self._position += 1
        windows = self._windows
        result = self._step.add(tasks, batches, element_spec, vote, windows.coefficients[index])
        if result.finite:
            self._added += windows.shares[index]
            self._tasks.update(tasks)
        else:
            self._skipped = True
        if not self.at_end():
            return result
        # What was added is scaled up to a whole window's weight; exactly 1 when no step was skipped.
        rescale = 1.0 / self._added if self._skipped and self._added > 0 else 1.0
        # A task drawn only in skipped steps has a zero gradient: Adam would still move it, so it is left out.
        applied = self._added > 0 and self._step.update(tuple(sorted(self._tasks)), rescale)
        self._added, self._skipped, self._tasks = 0.0, False, set()
        return replace(result, applied=applied, update=True)
