"""The training step: forward and backward over the tasks a step draws from, on every tower, the
all-reduce, the non-finite guard and the optimizer update; with ``training.accumulate_batches`` above 1
the steps of an update window add into accumulators and the window's last step updates.

A single-task run is the one-task case (``OneTask``), and a window of one step is the plain step, its add
and update fused into one compiled call. Each task's loss is its per-utterance loss summed over its batch,
times its coefficient: without accumulation its loss factor over the step's tasks and its global batch,
so the step's loss is the mean over its tasks of each task's weighted per-utterance mean; in a window, the
coefficients of ``windows.py``. The update moves the variables of the tasks the step (or window) added
and the shared part only: a head no batch reached gets no Adam momentum.

A step also carries a vote (``ballot``): each worker's vote travels in the step's own all-reduce (no extra
round trip), so every worker of a multi-worker run learns after the same step that a checkpoint is due,
or that training stops. Accumulators are not checkpointed: the loop saves only between windows
(``at_end``), and a run killed inside one resumes at the window's first step.

Nothing here knows about epochs, checkpoints or validation (``loop.py``, ``policy.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import keras
import tensorflow as tf

from pipeline.config import TrainingConfig
from pipeline.model import model_family
from pipeline.model.objectives import model_objective
from pipeline.train.windows import Windows, check_window_start


@dataclass(frozen=True)
class StepResult:
    """What one step did: its loss, whether that loss and the gradients were finite, whether an update was
    applied, the tasks it drew from and, per task, the per-tower tensors of its batch's utterance indices;
    whether any worker asked for a checkpoint (``save``) or a stop (``stop``) after it (the same answer on
    every worker); whether it ended an update window (``update``)."""

    loss: float
    finite: bool
    applied: bool
    tasks: tuple[int, ...]
    indices: tuple
    save: bool = False
    update: bool = True
    stop: bool = False


# A worker's vote travels in each step's own all-reduce as one number: 1 asks for a checkpoint after the
# step, STOP_VOTE for a stop with a checkpoint (a hook's StopTraining: a signal). The sum over every tower
# tells every worker both answers: a checkpoint when it is above 0, a stop from STOP_VOTE on (save votes
# alone, one per tower, never reach it).
STOP_VOTE = 4096.0


def ballot(save: bool, stop: bool = False) -> float:
    """This worker's vote for a step (the ``vote`` argument of a step)."""
    return float(save) + STOP_VOTE * float(stop)


def count_votes(votes) -> tuple[bool, bool]:
    """(checkpoint, stop): what the towers' votes summed (a tensor of this worker's) decided."""
    total = float(votes.numpy())
    return total > 0, total >= STOP_VOTE


def all_finite(tensors) -> tf.Tensor:
    """Whether every element of ``tensors`` is finite (one boolean)."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


class OneTask:
    """A single-task model as the step sees a multi-task one (``pipeline.model.heads.MultiTaskModel``):
    task 0 is the whole model."""

    def __init__(self, model: keras.Model):
        self.model = model
        self.family = model_family(model.model_config.architecture)
        self.objective = model_objective(model.model_config.objective)

    @property
    def trainable_variables(self) -> list:
        """The model's trainable variables."""
        return self.model.trainable_variables

    def forward(self, index: int, features, lengths, training: bool):
        """The family's forward pass: (logits, output lengths)."""
        return self.family.forward(self.model, features, lengths, training=training)

    def task_variables(self, indices) -> list:
        """Every trainable variable: the one task uses them all."""
        return self.model.trainable_variables


def task_gradients(model, tasks: tuple[int, ...], blanks, optimizer, training: TrainingConfig):
    """The per-tower forward and backward pass over ``tasks``: ``gradients(batches, coefficients)`` returns
    (each task's per-utterance losses summed over the tower's batch, their tower batch sizes, the sums
    weighted by ``coefficients``, the gradients of that weighted sum over the tasks' variables: of the
    scaled sum with ``mixed_float16``); one XLA cluster with ``training.jit_compile``."""
    variables = model.task_variables(tasks)
    scaled_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def gradients(batches, coefficients):
        with tf.GradientTape() as tape:
            sums, sizes = [], []
            for index, (features, lengths, labels, label_lengths, _) in zip(tasks, batches, strict=True):
                logits, output_lengths = model.forward(index, features, lengths, training=True)
                per_sample = model.objective.loss(
                    labels, label_lengths, logits, output_lengths, blanks[index], training.jit_compile
                )
                sums.append(tf.reduce_sum(per_sample))
                sizes.append(tf.shape(lengths)[0])
            weighted = tf.add_n([tf.cast(coefficients[j], s.dtype) * s for j, s in enumerate(sums)])
            backward = optimizer.scale_loss(weighted) if scaled_loss else weighted
        return sums, sizes, weighted, tape.gradient(backward, variables)

    return tf.function(gradients, jit_compile=True) if training.jit_compile else gradients


def guard_copies(variables, inner_optimizer, strategy: tf.distribute.Strategy, training) -> tuple[list, list]:
    """(the variables an update may change: ``variables`` and the optimizer's; their shadow copies, made in
    the strategy's scope, that a reverted update puts back: none without
    ``training.revert_nonfinite_updates``, which costs one copy of the weights and slots, and a copy a
    step)."""
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
    also when ``training.revert_nonfinite_updates`` put ``guarded`` back from ``shadows``)."""
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

            def revert():
                for shadow, variable in zip(shadows, guarded, strict=False):
                    variable.assign(shadow)
                return tf.constant(False)

            return tf.cond(all_finite(variables), lambda: tf.constant(True), revert)

        return tf.cond(distribution.experimental_local_results(finite)[0], apply, lambda: tf.constant(False))

    def update(context, grads, finite):
        if clip > 0:
            # Scaled gradients are clipped at the scaled norm: the same as clipping the true ones.
            grads, _ = tf.clip_by_global_norm(grads, clip * (optimizer.dynamic_scale if scaled_loss else 1.0))
        # The optimizer all-reduces (sums) again: hand it each tower's share of the global gradient.
        grads = [g / towers for g in grads]
        return context.merge_call(apply_if_finite, args=(finite, grads))

    return update


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
        """In replica context: ``update`` with the window's gradient of ``variables`` (summed over the
        towers, times ``rescale``), then empty every sum; returns whether the update was applied."""
        context = tf.distribute.get_replica_context()
        sums = [self._sums[id(v)].read_value() for v in variables]
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, sums)
        grads = [g * tf.cast(rescale, g.dtype) for g in grads]
        applied = update(context, grads, tf.constant(True) if scaled_loss else all_finite(grads))
        with tf.control_dependencies([applied]):
            for total in self._sums.values():
                total.assign(tf.zeros_like(total))
        return tf.identity(applied)


class TrainingStep:
    """The loop's step: ``start`` at each epoch's position, then ``step(tasks, batches, element_spec,
    vote)`` per step, a batch of each of ``tasks`` (elements of their distributed datasets, whose element
    specs are given, as tuples); compiled once per set of tasks. See the module docstring.

    ``model``: ``OneTask`` or a ``MultiTaskModel``; ``factors``: the tasks' loss factors
    (``windows.loss_factors``); ``blanks``: their blank indices; ``optimizer`` is the Adam whose slots are
    checkpointed, ``step_optimizer`` what applies the update (the same, or a ``LossScaleOptimizer`` around
    it with ``mixed_float16``); ``windows_of(epoch)``: an epoch's ``Windows`` (needed with accumulation).
    """

    def __init__(
        self,
        model,
        factors,
        blanks,
        optimizer,
        step_optimizer,
        strategy: tf.distribute.Strategy,
        training: TrainingConfig,
        steps_per_epoch: int,
        windows_of: Callable[[int], Windows] | None = None,
    ):
        self.model, self.strategy, self._training = model, strategy, training
        self._factors, self._blanks = list(factors), list(blanks)
        self._optimizer, self._scaled_loss = step_optimizer, step_optimizer is not optimizer
        self._guard = guard_copies(model.trainable_variables, optimizer, strategy, training)
        self.accumulate, self._steps_per_epoch, self._windows_of = (
            training.accumulate_batches,
            steps_per_epoch,
            windows_of,
        )
        every_task = model.task_variables(range(len(self._factors)))
        self._sums = GradientSums(every_task, strategy) if self.accumulate > 1 else None
        self._compiled: dict[tuple, Callable] = {}
        self._windows: Windows | None = None
        self._position = 0
        self._added, self._skipped, self._tasks = 0.0, False, set()

    @property
    def windows_per_epoch(self) -> int:
        """Optimizer updates per epoch."""
        return -(-self._steps_per_epoch // self.accumulate)

    def start(self, epoch: int, step_in_epoch: int) -> None:
        """Go to step ``step_in_epoch`` of ``epoch``, which must be where a window starts (TrainingError
        otherwise: checkpoints are only saved there)."""
        self._position, self._added, self._skipped, self._tasks = step_in_epoch, 0.0, False, set()
        if self.accumulate > 1:
            self._windows = self._windows_of(epoch)
            check_window_start(epoch, step_in_epoch, self._windows.ends, self.accumulate)

    def at_end(self) -> bool:
        """Whether the position is between two windows (where the loop may save)."""
        return self.accumulate == 1 or self._position == 0 or self._position in self._windows.ends

    def __call__(self, tasks: tuple[int, ...], batches, element_spec, vote: float = 0.0) -> StepResult:
        """Run the next step (and, at its window's end, the update); ``vote``: ``ballot``."""
        index = self._position
        self._position += 1
        if self.accumulate == 1:
            return self._result(tasks, self._function("step", tasks, element_spec)(tuple(batches), vote))
        windows = self._windows
        add = self._function("add", tasks, element_spec)
        coefficients = tf.constant(windows.coefficients[index], tf.float32)
        loss, finite, indices, votes = add(tuple(batches), vote, coefficients)
        result = self._result(tasks, (loss, finite, tf.constant(False), indices, votes), update=False)
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
        applied = False
        if self._added > 0:
            update = self._function("update", tuple(sorted(self._tasks)), None)
            local = self.strategy.experimental_local_results
            applied = bool(local(update(tf.constant(rescale, tf.float32)))[0].numpy())
        self._added, self._skipped, self._tasks = 0.0, False, set()
        return replace(result, applied=applied, update=True)

    def _result(self, tasks, outputs, update: bool = True) -> StepResult:
        loss, finite, applied, indices, votes = outputs
        local = self.strategy.experimental_local_results
        save, stop = count_votes(local(votes)[0])
        return StepResult(
            loss=float(local(loss)[0].numpy()),
            finite=bool(local(finite)[0].numpy()),
            applied=bool(local(applied)[0].numpy()),
            tasks=tasks,
            indices=tuple(tuple(local(part)) for part in indices),
            save=save,
            update=update,
            stop=stop,
        )

    def _function(self, kind: str, tasks: tuple[int, ...], element_spec):
        """The compiled ``kind`` (``step``, ``add``, ``update``) of ``tasks``, traced once."""
        key = (kind, tasks)
        if key not in self._compiled:
            replica, extra = getattr(self, f"_replica_{kind}")(tasks)
            self._compiled[key] = self._compile(replica, kind, element_spec, extra)
        return self._compiled[key]

    def _compile(self, replica, kind: str, element_spec, extra: list):
        """``replica`` run by the strategy as one ``tf.function`` of fixed signature; a step or an add takes
        its vote as a Python number."""
        strategy, scalar = self.strategy, tf.TensorSpec([], tf.float32)
        if kind == "update":
            return tf.function(lambda r: strategy.run(replica, args=(r,)), input_signature=[scalar])
        if kind == "step":
            compiled = tf.function(
                lambda b, v: strategy.run(replica, args=(b, v)), input_signature=[element_spec, scalar]
            )
            return lambda batches, vote: compiled(batches, tf.constant(float(vote)))
        compiled = tf.function(
            lambda b, v, c: strategy.run(replica, args=(b, v, c)),
            input_signature=[element_spec, scalar, *extra],
        )
        return lambda batches, vote, coefficients: compiled(batches, tf.constant(float(vote)), coefficients)

    def _update(self, tasks: tuple[int, ...]):
        variables = self.model.task_variables(tasks)
        return variables, update_function(
            variables, *self._guard, self._optimizer, self.strategy, self._training
        )

    def _step_loss(self, tasks, sums, sizes):
        """The step's loss as without accumulation (what the loop logs), from the towers' summed losses."""
        towers = self.strategy.num_replicas_in_sync
        terms = [
            self._factors[t] * s / tf.cast(n * towers, s.dtype)
            for t, s, n in zip(tasks, sums, sizes, strict=True)
        ]
        return tf.add_n(terms) / len(tasks)

    def _replica_step(self, tasks: tuple[int, ...]):
        """A window of one step: gradients, one all-reduce (with the loss and the vote), the update."""
        gradients, (_, update) = self._task_gradients(tasks), self._update(tasks)
        towers, factors, scaled_loss = self.strategy.num_replicas_in_sync, self._factors, self._scaled_loss

        def replica_step(batches, vote):
            # The step's global batch of each task: every tower gets as many utterances.
            coefficients = [
                factors[t] / (len(tasks) * tf.cast(tf.shape(batch[1])[0] * towers, tf.float32))
                for t, batch in zip(tasks, batches, strict=True)
            ]
            _, _, loss, grads = gradients(batches, tf.stack(coefficients))
            context = tf.distribute.get_replica_context()
            mine = tf.zeros_like(loss) + tf.cast(vote, loss.dtype)  # made on the tower's device
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, [*grads, loss, mine])
            grads, loss, votes = reduced[:-2], reduced[-2], reduced[-1]
            # With loss scaling, the LossScaleOptimizer skips steps whose gradients overflowed (and lowers
            # the scale); only the loss decides here.
            finite = all_finite([loss] if scaled_loss else reduced[:-1])
            applied = update(context, grads, finite)
            return loss, finite, applied, tuple(batch[-1] for batch in batches), votes

        return replica_step, []

    def _replica_add(self, tasks: tuple[int, ...]):
        """One step of a window: gradients into the accumulators; one all-reduce of the losses and flags."""
        gradients, variables = self._task_gradients(tasks), self.model.task_variables(tasks)
        sums, scaled_loss = self._sums, self._scaled_loss

        def replica_add(batches, vote, coefficients):
            losses, sizes, weighted, grads = gradients(batches, coefficients)
            grads = [tf.convert_to_tensor(g) for g in grads]
            # With loss scaling an overflow in the gradients is the LossScaleOptimizer's to handle at the
            # update (it skips it and lowers the scale); only the loss decides here.
            finite_here = all_finite([weighted] if scaled_loss else [weighted, *grads])
            dtype = losses[0].dtype
            flags = tf.stack([*losses, 1.0 - tf.cast(finite_here, dtype), tf.cast(vote, dtype)])
            summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, flags)
            finite = tf.logical_and(tf.reduce_all(tf.math.is_finite(summed[:-2])), tf.equal(summed[-2], 0.0))
            sums.add_if(finite, variables, grads)
            loss = self._step_loss(tasks, tf.unstack(summed[:-2], num=len(tasks)), sizes)
            return loss, finite, tuple(batch[-1] for batch in batches), summed[-1]

        return replica_add, [tf.TensorSpec([len(tasks)], tf.float32)]

    def _replica_update(self, tasks: tuple[int, ...]):
        """A window's end: the accumulated gradient of ``tasks``' variables applied, the sums emptied."""
        (variables, update), sums, scaled_loss = self._update(tasks), self._sums, self._scaled_loss

        def replica_update(rescale):
            return sums.apply(variables, update, rescale, scaled_loss)

        return replica_update, []

    def _task_gradients(self, tasks: tuple[int, ...]):
        return task_gradients(self.model, tasks, self._blanks, self._optimizer, self._training)
