"""The training step: forward and backward over the step's tasks on every tower, the all-reduce, the
non-finite guard and the optimizer update. With ``training.accumulate_batches`` above 1 a window's steps add
into accumulators and its last step updates (``tasks.Windows`` weighs them); a window of one step is the
plain step, add and update in one compiled call. An update moves the shared variables and those of the
tasks its steps drew: a head no batch reached gets no Adam momentum.

With ``training.jit_compile`` XLA compiles the forward and backward pass; on one device, the whole step,
update included (``compiles_the_update``): a few launches where the separate update was several small
ops per variable.

Each worker's vote (``ballot``) travels in the step's own all-reduce, so every worker learns after the same
step that a checkpoint is due or that training stops. Accumulators are not checkpointed: the loop saves
between windows only (``at_end``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import keras
import tensorflow as tf

from pipeline.config import TrainingConfig
from pipeline.model.objective import objective_loss
from pipeline.train.checkpointing import TrainingError
from pipeline.train.tasks import Windows


@dataclass(frozen=True)
class StepResult:
    """What one step did: its loss, whether it (and the gradients) were finite, whether an update was
    applied, its tasks and, per task, the per-tower tensors of its batch's utterance indices; whether any
    worker asked for a checkpoint or a stop after it (every worker's answer); whether it ended a window;
    whether ``mixed_float16``'s loss scaling skipped its update (gradients overflowed at the scale, which
    it then lowers: not a bad batch, and not an update either)."""

    loss: float
    finite: bool
    applied: bool
    tasks: tuple[int, ...]
    indices: tuple
    save: bool = False
    update: bool = True
    stop: bool = False
    overflowed: bool = False


# What an update did (a tensor of the traced step): applied; not applied (not finite, or reverted); skipped
# by the LossScaleOptimizer (the gradients overflowed at the loss scale).
REFUSED, APPLIED, OVERFLOWED = 0, 1, 2


# A vote is one number in the step's all-reduce: 1 asks for a checkpoint, STOP_VOTE for a stop with one (a
# hook's StopTraining). Summed over the towers: a checkpoint above 0, a stop from STOP_VOTE on.
STOP_VOTE = 4096.0


def ballot(save: bool, stop: bool = False) -> float:
    """This worker's vote for a step (the ``vote`` argument of a step)."""
    return float(save) + STOP_VOTE * float(stop)


def all_finite(tensors) -> tf.Tensor:
    """Whether every element of ``tensors`` is finite (one boolean)."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def dense(gradient):
    """``gradient`` as a dense tensor (``tf.IndexedSlices`` summed into one); None stays None."""
    return tf.convert_to_tensor(gradient) if isinstance(gradient, tf.IndexedSlices) else gradient


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
                per_sample = objective_loss(
                    model.task_objective(index),
                    labels,
                    label_lengths,
                    logits,
                    output_lengths,
                    blanks[index],
                    training.jit_compile,
                    model.objective_head(index),
                )
                sums.append(tf.reduce_sum(per_sample))
                sizes.append(tf.shape(lengths)[0])
            weighted = tf.add_n([tf.cast(coefficients[j], s.dtype) * s for j, s in enumerate(sums)])
            backward = optimizer.scale_loss(weighted) if scaled_loss else weighted
        # An embedding's gradient (a transducer's predictor) comes as slices, one per label of the batch,
        # repeats included; Keras' Adam would square each slice apart (the sum of squares, not the square
        # of the sum) and an accumulated window, summed dense, would not: dense, every update is Adam's.
        grads = [dense(g) for g in tape.gradient(backward, variables)]
        return sums, sizes, weighted, grads

    return tf.function(gradients, jit_compile=True) if training.jit_compile else gradients


def compiles_the_update(training: TrainingConfig, strategy: tf.distribute.Strategy) -> bool:
    """Whether XLA compiles a step's update (clipping, the optimizer, the shadow copies and the finiteness
    guard) together with its forward and backward pass: with ``training.jit_compile`` on a
    ``OneDeviceStrategy``. A mirrored or multi-worker strategy (even of one device) updates through a
    merge into cross-replica context, which a compiled function cannot hold, so there XLA compiles the
    forward and backward pass only and the update runs as separate ops, several per variable."""
    return training.jit_compile and isinstance(strategy, tf.distribute.OneDeviceStrategy)


class TrainingStep:
    """The loop's step: ``start`` at each epoch's position, then ``step(tasks, batches, element_spec,
    vote)`` per step, a batch of each of ``tasks`` (elements of their distributed datasets, whose element
    specs are given); compiled once per set of tasks.

    ``model``: ``OneTask`` or a ``MultiTaskModel``; ``factors``: the tasks' loss factors; ``blanks``:
    their blank indices; ``optimizer``: the Adam whose slots are checkpointed; ``step_optimizer``: what
    applies the update (the same, or a ``LossScaleOptimizer`` around it with ``mixed_float16``);
    ``windows_of(epoch)``: an epoch's ``Windows`` (with accumulation).
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
        self.accumulate, self._windows_of = training.accumulate_batches, windows_of
        self.windows_per_epoch = -(-steps_per_epoch // self.accumulate)
        # What an update may change, and (training.revert_nonfinite_updates) the copies a reverted one puts
        # back: a copy of the weights and slots, refreshed every update.
        self._guarded = list(model.trainable_variables) + list(optimizer.variables)
        every_task = model.task_variables(range(len(self._factors))) if self.accumulate > 1 else []
        shadowed = self._guarded if training.revert_nonfinite_updates else []

        def zeros(v, name, **kind):
            return tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=name, **kind)

        with strategy.scope():
            self._shadows = [zeros(v, "shadow") for v in shadowed]
            # A window's per-tower gradient sums (ON_READ): each tower adds its own, the update reduces once.
            on_read = dict(
                synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM
            )
            self._sums = {id(v): zeros(v, "accumulated", **on_read) for v in every_task}
        self._compiled: dict[tuple, Callable] = {}
        self._windows: Windows | None = None
        self._position, self._added, self._skipped, self._tasks = 0, 0.0, False, set()

    def start(self, epoch: int, step_in_epoch: int) -> None:
        """Go to step ``step_in_epoch`` of ``epoch``, which must be where a window starts."""
        self._position, self._added, self._skipped, self._tasks = step_in_epoch, 0.0, False, set()
        if self.accumulate > 1:
            self._windows = self._windows_of(epoch)
            if step_in_epoch and step_in_epoch not in self._windows.ends:
                raise TrainingError(
                    f"the run's position, step {step_in_epoch} of epoch {epoch + 1}, is inside an update "
                    f"window of training.accumulate_batches {self.accumulate}; checkpoints are only saved "
                    "between windows, so this one comes from another batch plan: delete the run "
                    "(make rerun STAGE=Train)"
                )

    def at_end(self) -> bool:
        """Whether the position is between two windows (where the loop may save)."""
        return self.accumulate == 1 or self._position == 0 or self._position in self._windows.ends

    def __call__(self, tasks: tuple[int, ...], batches, element_spec, vote: float = 0.0) -> StepResult:
        """Run the next step (and, at its window's end, the update); ``vote``: ``ballot``."""
        index = self._position
        self._position += 1
        batches, vote = tuple(batches), tf.constant(float(vote))
        if self.accumulate == 1:
            return self._result(tasks, self._function("step", tasks, element_spec)(batches, vote))
        windows = self._windows
        coefficients = tf.constant(windows.coefficients[index], tf.float32)
        loss, finite, indices, votes = self._function("add", tasks, element_spec)(batches, vote, coefficients)
        result = self._result(tasks, (loss, finite, tf.constant(REFUSED), indices, votes), update=False)
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
        status = REFUSED
        if self._added > 0:
            update = self._function("update", tuple(sorted(self._tasks)), None)
            local = self.strategy.experimental_local_results
            status = int(local(update(tf.constant(rescale, tf.float32)))[0].numpy())
        self._added, self._skipped, self._tasks = 0.0, False, set()
        return replace(result, applied=status == APPLIED, overflowed=status == OVERFLOWED, update=True)

    def traced_graph(self, kind: str, tasks: tuple[int, ...], element_spec=None):
        """The ``GraphDef`` of the traced ``kind`` of step of ``tasks``: ``step`` (a window of one step),
        ``add`` or ``update`` (a window's steps, and its end, with accumulation); for counting its ops."""
        return self._function(kind, tasks, element_spec).get_concrete_function().graph.as_graph_def()

    def _result(self, tasks, outputs, update: bool = True) -> StepResult:
        loss, finite, applied, indices, votes = outputs
        local = self.strategy.experimental_local_results
        total = float(local(votes)[0].numpy())  # the towers' votes (ballot) summed
        save, stop = total > 0, total >= STOP_VOTE
        loss, finite, status = (local(tensor)[0].numpy() for tensor in (loss, finite, applied))
        indices = tuple(tuple(local(part)) for part in indices)
        return StepResult(
            float(loss),
            bool(finite),
            status == APPLIED,
            tasks,
            indices,
            save,
            update,
            stop,
            status == OVERFLOWED,
        )

    def _function(self, kind: str, tasks: tuple[int, ...], element_spec):
        """The ``kind`` (``step``, ``add``, ``update``) of ``tasks`` run by the strategy as one
        ``tf.function`` of fixed signature, traced once."""
        key = (kind, tasks)
        if key not in self._compiled:
            scalar = tf.TensorSpec([], tf.float32)
            replica, signature = {
                "step": (self._replica_step, [element_spec, scalar]),
                "add": (self._replica_add, [element_spec, scalar, tf.TensorSpec([len(tasks)], tf.float32)]),
                "update": (self._replica_update, [scalar]),
            }[kind]
            run, strategy = replica(tasks), self.strategy
            if compiles_the_update(self._training, strategy):
                run = tf.function(run, jit_compile=True)
            self._compiled[key] = tf.function(
                lambda *args: strategy.run(run, args=args), input_signature=signature
            )
        return self._compiled[key]

    def _update(self, tasks: tuple[int, ...]):
        """(the variables of ``tasks``, their update): ``update(context, grads, finite)``, in replica context
        with the global gradient (summed over the towers), clips (``training.clip_grad_norm``), applies when
        ``finite`` and returns what it did: APPLIED, REFUSED (also when ``training.revert_nonfinite_updates``
        put the weights and slots back because the update made them non-finite) or OVERFLOWED."""
        variables, optimizer, guard = self.model.task_variables(tasks), self._optimizer, self._shadows
        clip, scaled_loss = self._training.clip_grad_norm, self._scaled_loss

        def apply_if_finite(distribution, finite, grads):
            # Runs in cross-replica context: assignments reach every replica.
            def apply():
                for shadow, variable in zip(guard, self._guarded, strict=False):
                    shadow.assign(variable)
                distribution.extended.call_for_each_replica(
                    lambda g: optimizer.apply(g, variables), args=(grads,)
                )
                if not guard:
                    return tf.constant(APPLIED)

                def revert():
                    for shadow, variable in zip(guard, self._guarded, strict=False):
                        variable.assign(shadow)
                    return tf.constant(REFUSED)

                return tf.cond(all_finite(variables), lambda: tf.constant(APPLIED), revert)

            return tf.cond(
                distribution.experimental_local_results(finite)[0], apply, lambda: tf.constant(REFUSED)
            )

        def update(context, grads, finite):
            # The LossScaleOptimizer skips an update whose scaled gradients overflowed (the same on every
            # tower: they are the sum).
            overflowed = tf.logical_not(all_finite(grads)) if scaled_loss else tf.constant(False)
            if clip > 0:
                # Scaled gradients are clipped at the scaled norm: the same as clipping the true ones.
                grads, _ = tf.clip_by_global_norm(
                    grads, clip * (optimizer.dynamic_scale if scaled_loss else 1.0)
                )
            status = context.merge_call(apply_if_finite, args=(finite, grads))
            return tf.where(tf.logical_and(finite, overflowed), OVERFLOWED, status)

        return variables, update

    def _replica_step(self, tasks: tuple[int, ...]):
        """A window of one step: gradients, one all-reduce (with the loss and the vote), the update."""
        gradients = task_gradients(self.model, tasks, self._blanks, self._optimizer, self._training)
        _, update = self._update(tasks)
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

        return replica_step

    def _replica_add(self, tasks: tuple[int, ...]):
        """One step of a window: gradients into the accumulators; one all-reduce of the losses and flags."""
        gradients = task_gradients(self.model, tasks, self._blanks, self._optimizer, self._training)
        variables = self.model.task_variables(tasks)
        sums, scaled_loss, factors = self._sums, self._scaled_loss, self._factors
        towers = self.strategy.num_replicas_in_sync

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

            def add():
                for variable, grad in zip(variables, grads, strict=True):
                    sums[id(variable)].assign_add(grad)
                return tf.constant(True)

            tf.cond(finite, add, lambda: tf.constant(False))
            # The step's loss as without accumulation (what the loop logs).
            terms = zip(tasks, tf.unstack(summed[:-2], num=len(tasks)), sizes, strict=True)
            loss = tf.add_n([factors[t] * s / tf.cast(n * towers, s.dtype) for t, s, n in terms]) / len(tasks)
            return loss, finite, tuple(batch[-1] for batch in batches), summed[-1]

        return replica_add

    def _replica_update(self, tasks: tuple[int, ...]):
        """A window's end: the accumulated gradient of ``tasks``' variables (times a rescale) applied and
        every sum emptied."""
        (variables, update), sums, scaled_loss = self._update(tasks), self._sums, self._scaled_loss

        def replica_update(rescale):
            context = tf.distribute.get_replica_context()
            grads = context.all_reduce(
                tf.distribute.ReduceOp.SUM, [sums[id(v)].read_value() for v in variables]
            )
            grads = [g * tf.cast(rescale, g.dtype) for g in grads]
            applied = update(context, grads, tf.constant(True) if scaled_loss else all_finite(grads))
            with tf.control_dependencies([applied]):
                for total in sums.values():
                    total.assign(tf.zeros_like(total))
            return tf.identity(applied)

        return replica_update
