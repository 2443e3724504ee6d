"""The training loop: steps and epochs, when to save, the policy's verdicts and hooks.

The batch order of an epoch is a pure function of its seed and number, and the
position is in every checkpoint, so a restarted run continues at the very next
batch: no batch seen twice or skipped. What a checkpoint holds, restoring it
(with fallback, the batch-plan check and multi-worker agreement) is
``checkpointing.py``.

Multi-worker runs save together: the chief's clock decides when a checkpoint is
due and its vote reaches every worker in the step's all-reduce, so all save after
the same step. A stop is agreed the same way: a worker asked to stop (a hook's
``StopTraining``: a signal) votes for it in its next step, and every worker saves
after that step and stops.

The tasks it trains (one, or several over one model) and their input are
``tasks.py`` (with ``training.accumulate_batches``, the update windows too, which the loop saves
between, never inside); what one step computes is ``step.py``;
what happens after an epoch (validation: ``validation.py``; best-dev, plateau halving,
early stop) is ``policy.py``; summaries ``summaries.py``; the report ``report.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from pathlib import Path

import tensorflow as tf

from pipeline.config import Config
from pipeline.model.heads import task_model
from pipeline.model.normalization import model_statistics
from pipeline.reports import TrainReport
from pipeline.train.agreement import chiefs_verdict
from pipeline.train.checkpointing import BatchPlan, RunCheckpoints, TrainingError
from pipeline.train.determinism import record_session_determinism
from pipeline.train.distribute import ClusterRole
from pipeline.train.epoch_ends import EpochEnds
from pipeline.train.epochs import epoch_target
from pipeline.train.history import EpochLoss, SkippedBatch, TrainHistory
from pipeline.train.hooks import (
    EpochInfo,
    StepInfo,
    StopTraining,
    TrainHooks,
    ValidationInfo,
    combine_hooks,
    configured_hooks,
)
from pipeline.train.nonfinite_stop import check_not_stopped, record_stop, stop_message
from pipeline.train.optimizer import optimizers
from pipeline.train.policy import EpochPolicy, EpochVerdict, learning_rate
from pipeline.train.report import train_report
from pipeline.train.step import StepResult, TrainingStep, ballot
from pipeline.train.stop_signals import stop_vote, stopped_with_the_others
from pipeline.train.summaries import LossWatch, Summaries
from pipeline.train.tasks import TaskData, TaskInputs, global_batch_size
from pipeline.train.validation import TaskValidation
from pipeline.workdir import TrainRun

__all__ = ["TaskData", "Trainer", "TrainHooks", "TrainingError"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class WindowRecord:
    """The finite batches of the loop's current update window: their losses and files (what the epoch's
    mean loss and the warning of an update that was not applied need)."""

    losses: list = dataclasses.field(default_factory=list)
    files: set = dataclasses.field(default_factory=set)


class Trainer:
    """Trains the acoustic model of ``config`` on ``tasks`` (``tasks.TaskData``: one, or several over one
    model as ``multitask:`` says); validates on their dev splits (none: the last checkpoint stands in for
    the best-dev one).

    ``run_dir`` receives ``checkpoints/``, ``best/``, ``summaries/``. Only the
    chief (``role.is_chief``) writes there; other workers save into a scratch
    directory, as MultiWorkerMirroredStrategy requires every worker to save.
    ``fingerprint`` (the Train stage's) and ``started`` (the ``time.time()`` the stage
    began, default: now) go into the report ``fit`` returns. ``init_digest``: the digest
    of ``training.init_from`` the fingerprint holds, which a warm start checks the
    checkpoint against when it reads it (None: not checked).
    """

    def __init__(
        self,
        config: Config,
        run_dir: Path,
        tasks: list[TaskData],
        strategy: tf.distribute.Strategy,
        role: ClusterRole = ClusterRole(0, 1),
        hooks: TrainHooks | None = None,
        *,
        fingerprint: str = "",
        started: float | None = None,
        init_digest: str | None = None,
    ):
        self.config = config
        self.run_dir = Path(run_dir)
        self.run = TrainRun(self.run_dir)
        self.tasks = list(tasks)
        self.strategy = strategy
        self.role = role
        self.hooks = combine_hooks([hooks or TrainHooks(), *configured_hooks(config)])
        self.fingerprint = fingerprint
        self.started = time.time() if started is None else started
        self.towers = strategy.num_replicas_in_sync
        self.per_tower_batch, self.global_batch = global_batch_size(config, self.towers)
        self.inputs = TaskInputs(config, self.tasks, strategy, self.global_batch)
        self.steps_per_epoch, self.plan_digest = self.inputs.steps_per_epoch, self.inputs.digest
        training = config.training
        with strategy.scope():
            self.model, view = task_model(config, self.tasks)
            self.optimizer, self.step_optimizer, loss_scale = optimizers(
                training, self.model.trainable_variables
            )
        # Everything a step depends on: weights, optimizer slots and step, dropout RNG state, data
        # position, learning-rate factor and history; so a resumed run is bit-identical.
        self.checkpoints = RunCheckpoints(
            config,
            self.run,
            self.model,
            self.tasks[0].alphabet,
            strategy,
            role,
            tracked={"optimizer": self.optimizer, "loss_scale": loss_scale, **self.inputs.checkpointed()},
            init_digest=init_digest,
        )
        self.state = self.checkpoints.state
        self._epoch_ends = EpochEnds(config, self.run, self.model) if role.is_chief else None
        self._train_step = TrainingStep(
            view,
            self.inputs.factors,
            [task.alphabet.blank_index for task in self.tasks],
            self.optimizer,
            self.step_optimizer,
            strategy,
            training,
            self.steps_per_epoch,
            self.inputs.windows_of,
        )
        self._window = WindowRecord()
        self.summaries = Summaries(self.run.summaries, role.is_chief, training.summary_secs)
        self.validate = TaskValidation(config, self.tasks, view, self.summaries.writer)
        self.policy = EpochPolicy(config, has_dev=self.validate.has_dev)
        self._watch_loss = LossWatch()
        self._last_loss = float("nan")
        self._session_recorded = False  # this session's op determinism, folded in at its first step

    def _step(self, vote: float) -> StepResult:
        """Run one training step on the next batches of the step's tasks; ``vote``: this worker's
        ``step.ballot``."""
        epoch, step = int(self.state.epoch.numpy()), int(self.state.step_in_epoch.numpy())
        tasks, batches, specs = self.inputs.next_batches(epoch, step)
        if not self._session_recorded:  # at a session's first step: one that trains none changes nothing
            record_session_determinism(self.state)
            self._session_recorded = True
        result = self._train_step(tasks, batches, specs, vote=vote)
        self.inputs.drawn(tasks)
        return result

    @property
    def history(self) -> TrainHistory:
        """The run's record (restored with the checkpoint, saved with every checkpoint)."""
        return self.checkpoints.history

    def _save(self) -> None:
        """Write a checkpoint of everything (every save of the loop goes through here)."""
        self.checkpoints.save()

    def restore(self) -> str | None:
        """Restore the latest checkpoint, or warm-start (``RunCheckpoints.restore``); returns what was
        loaded."""
        return self.checkpoints.restore()

    def _run_over(self, target: int) -> bool:
        return int(self.state.epoch.numpy()) >= target or self.history.stop is not None

    def _learning_rate(self) -> float:
        state, per_epoch = self.state, self._train_step.windows_per_epoch
        run_updates, updates = int(state.target_epochs.numpy()) * per_epoch, int(state.updates.numpy())
        return learning_rate(self.config.training, float(state.lr_factor.numpy()), updates, run_updates)

    # -- the loop ------------------------------------------------------------------------------
    def _after_step(self, result: StepResult, consecutive_bad: int, lr: float) -> int:
        """Book-keeping of one step: counters, skipped-batch record, summaries; returns the non-finite
        streak (batches skipped and updates not applied since the last applied update)."""
        loss, finite = result.loss, result.finite
        self._last_loss = loss
        self.state.global_step.assign_add(1)
        self.state.step_in_epoch.assign_add(1)
        if result.update and not result.overflowed:  # the schedule counts updates made
            self.state.updates.assign_add(1)
        step = int(self.state.global_step.numpy())
        window = self._window
        if finite:
            self._watch_loss(step, loss)
            window.losses.append(loss)
            window.files.update(self.inputs.batch_files(result.tasks, result.indices))
        else:
            files = self.inputs.batch_files(result.tasks, result.indices)
            log.warning("Step %d: non-finite loss, batch skipped; its files: %s", step, ", ".join(files))
            consecutive_bad = self._skipped(step, files, consecutive_bad)
        if result.update:
            self._window = WindowRecord()
            if result.applied:
                consecutive_bad = 0
                self.state.epoch_loss_sum.assign_add(sum(window.losses))
                self.state.epoch_loss_count.assign_add(len(window.losses))
            elif result.overflowed:
                log.info(
                    "Step %d: gradients overflowed at the float16 loss scale: update skipped, scale lowered",
                    step,
                )
            elif window.losses:
                files = sorted(window.files)
                log.warning(
                    "Step %d: the update would make weights non-finite, so it was not applied "
                    "(training.learning_rate %g too high?); its files: %s",
                    step,
                    lr,
                    ", ".join(files),
                )
                consecutive_bad = self._skipped(step, files, consecutive_bad)
        self.summaries.step(step, loss if finite else None, lr, self.model)
        return consecutive_bad

    def _skipped(self, step: int, files: list[str], consecutive_bad: int) -> int:
        """Record a skipped batch (or update) of ``files``; returns the streak, or stops the run when it is
        ``training.max_nonfinite_batches`` long (saving first when between two update windows)."""
        training = self.config.training
        self.history.skipped_batches.append(SkippedBatch(step=step, files=files))
        consecutive_bad += 1
        if consecutive_bad >= training.max_nonfinite_batches:
            if self._train_step.at_end():
                self._save()
            message = stop_message(consecutive_bad, files, training.learning_rate, step)
            if self.role.is_chief:  # a rerun stops here again until the limit is raised
                record_stop(self.run, training.max_nonfinite_batches, step, message)
            raise TrainingError(message)
        return consecutive_bad

    def _end_epoch(self, epoch: int, target: int) -> StopTraining | None:
        """Close epoch ``epoch`` (0-based): record its loss, carry out the policy's verdict, advance the
        position and save (the best-dev checkpoint too when it improved). The save that ends the run
        marks it finished in the same checkpoint, so no kill can separate the two. Returns the stop an
        ``on_epoch`` or ``on_validation`` hook asked for (``StopTraining``), for the caller to carry out
        after this checkpoint: a rerun then goes on from the next epoch instead of training this one again
        and meeting the same stop."""
        history = self.history
        count = int(self.state.epoch_loss_count.numpy())
        epoch_loss = float(self.state.epoch_loss_sum.numpy()) / count if count else float("nan")
        history.epoch_losses.append(EpochLoss(epoch=epoch + 1, train_loss=epoch_loss))
        log.info("Epoch %d/%d: mean train loss %.4f", epoch + 1, target, epoch_loss)
        stop = None
        if self.hooks.on_epoch:
            try:
                self.hooks.on_epoch(EpochInfo(epoch=epoch + 1, target_epochs=target, train_loss=epoch_loss))
            except StopTraining as request:
                stop = request
        step = int(self.state.global_step.numpy())
        verdict = self.policy.after_epoch(epoch + 1, history, lambda at: self.validate(at, step))
        if self.role.count > 1 and verdict.validation is not None:
            verdict = chiefs_verdict(self.strategy, self.role, verdict, epoch + 1)
        if verdict.validation is not None:
            asked = self._record_validation(verdict)
            stop = stop or asked
        self.state.epoch.assign_add(1)
        self.state.step_in_epoch.assign(0)
        self.state.epoch_loss_sum.assign(0.0)
        self.state.epoch_loss_count.assign(0)
        if self._run_over(target):
            self.state.finished.assign(1)
        if self._epoch_ends is not None:  # before the checkpoint: a kill in between trains the epoch again
            self._epoch_ends.keep(epoch + 1, history)
        if verdict.is_best:
            self.checkpoints.save_best()
        self._save()
        if self._epoch_ends is not None:  # after it: a kill before it loses nothing the checkpoint wants
            self._epoch_ends.prune(epoch + 1, history)
        return stop

    def _record_validation(self, verdict: EpochVerdict) -> StopTraining | None:
        """Record a validation and what the policy decided on it; summaries, the WER line, hooks. Returns
        the stop an ``on_validation`` hook asked for (carried out after the epoch's checkpoint)."""
        training, history, figures = self.config.training, self.history, verdict.validation
        history.validations.append(figures)
        history.last_samples = verdict.samples
        if verdict.stop is not None:
            history.stop = verdict.stop
        self.summaries.validation(int(self.state.global_step.numpy()), figures)
        if training.wer_log_pattern:
            print(
                training.wer_log_pattern.format(
                    epoch=figures.epoch, wer=figures.wer, cer=figures.cer, loss=figures.dev_loss
                ),
                flush=True,
            )
        if verdict.halve_lr:
            self.state.lr_factor.assign(self.state.lr_factor * 0.5)
            log.info(
                "Dev loss %.4f is worse than the best %.4f: learning rate halved to %.3g",
                figures.dev_loss,
                verdict.best_before,
                self._learning_rate(),
            )
        if self.hooks.on_validation:
            try:
                self.hooks.on_validation(
                    ValidationInfo(
                        epoch=figures.epoch,
                        dev_loss=figures.dev_loss,
                        wer=figures.wer,
                        cer=figures.cer,
                        is_best=verdict.is_best,
                        samples=verdict.samples,
                    )
                )
            except StopTraining as request:
                return request
        return None

    def fit(self) -> TrainReport:
        """Train until the target epoch or an early stop; returns the training report."""
        started = time.monotonic()
        check_not_stopped(self.run, self.config.training.max_nonfinite_batches, self.role.is_chief)
        self.restore()
        checkpoints = self.checkpoints
        target = epoch_target(self.config.training.epochs, checkpoints.last_run())
        checkpoints.check_plan(
            BatchPlan(self.towers, self.per_tower_batch, self.global_batch, self.plan_digest)
        )
        plan_before = checkpoints.plan_record()
        self.state.target_epochs.assign(target)
        self.state.epochs_setting.assign(self.config.training.epochs)
        self.state.finished.assign(int(self._run_over(target)))
        for warning in self.policy.blind_spots():
            log.warning("%s", warning)
        if self._run_over(target):
            log.info(
                "Nothing to train: %d epochs done, target %d%s",
                int(self.state.epoch.numpy()),
                target,
                f", stopped early ({self.history.stop.reason})" if self.history.stop else "",
            )
            if checkpoints.plan_record() != plan_before:
                self._save()  # the new target and setting, so checkpoint and report agree
        else:
            self._train(target, started)
        checkpoints.ensure_best()
        self.summaries.flush()
        if checkpoints.scratch is not None:
            shutil.rmtree(checkpoints.scratch, ignore_errors=True)
        return train_report(self, target, time.monotonic() - started)

    def _train(self, target: int, started: float) -> None:
        """Run steps and epochs from the restored position to ``target`` or an early stop."""
        training = self.config.training
        log.info(
            "Training to epoch %d: %d towers x %d = global batch %d, %d steps per epoch%s",
            target,
            self.towers,
            self.per_tower_batch,
            self.global_batch,
            self.steps_per_epoch,
            f", {self._train_step.windows_per_epoch} updates of {training.accumulate_batches} batches"
            if training.accumulate_batches > 1
            else "",
        )
        last_save = time.monotonic()
        consecutive_bad = 0
        current_lr = None
        # A save (or a stop's save) asked for inside an update window is made at the window's end.
        save_due, stop = False, None
        # With several workers a stop is agreed: ``asked``, this worker's request (a hook's StopTraining),
        # is its vote in every step that follows; ``agreed``, that a worker's stop vote reached every worker.
        asked, agreed = None, False
        # One iterator for the whole run: re-creating distributed datasets every epoch stalled
        # for up to a minute at each epoch boundary (tearing down the previous iterator).
        where, stats = str(self.run.checkpoints), model_statistics(self.model)  # a checkpoint's, if restored
        self.inputs.start(
            int(self.state.epoch.numpy()), int(self.state.step_in_epoch.numpy()), target, where, stats
        )
        while not self._run_over(target):
            epoch = int(self.state.epoch.numpy())
            self._train_step.start(epoch, int(self.state.step_in_epoch.numpy()))
            for _ in range(self.steps_per_epoch - int(self.state.step_in_epoch.numpy())):
                lr = self._learning_rate()
                if lr != current_lr:
                    self.optimizer.learning_rate.assign(lr)
                    current_lr = lr
                # The chief's clock (or step count) decides; every worker learns the decision from the step.
                vote = self.role.is_chief and (
                    time.monotonic() - last_save >= training.checkpoint_secs
                    or _step_save_due(int(self.state.global_step.numpy()) + 1, training.checkpoint_steps)
                )
                result = self._step(ballot(vote, stop=asked is not None))
                consecutive_bad = self._after_step(result, consecutive_bad, lr)
                save_due, agreed = save_due or result.save, agreed or result.stop
                saved = save_due and result.update
                if saved:
                    self._save()
                    last_save, save_due = time.monotonic(), False
                if self.hooks.on_step:
                    info = StepInfo(
                        epoch=epoch,
                        target_epochs=target,
                        step=int(self.state.global_step.numpy()),
                        step_in_epoch=int(self.state.step_in_epoch.numpy()),
                        steps_per_epoch=self.steps_per_epoch,
                        loss=self._last_loss,
                        elapsed_s=time.monotonic() - started,
                    )
                    try:
                        self.hooks.on_step(info)
                    except StopTraining as request:
                        # A multi-worker save is collective, so only a lone worker can save on a request of
                        # its own; with several, the request reaches them all with the next step's vote.
                        if self.role.count > 1:
                            asked = stop_vote(request, asked, int(self.state.global_step.numpy()))
                        else:
                            stop = request
                if (stop is not None or agreed) and result.update:
                    # The step's book-keeping is done and no window is open: a consistent position.
                    if not saved:
                        self._save()
                    raise stop or asked or stopped_with_the_others(int(self.state.global_step.numpy()))
            request = self._end_epoch(epoch, target)
            last_save = time.monotonic()
            if request is not None and self._run_over(target):
                log.info("The run is over: nothing left to stop (%s)", request)
            elif request is not None and self.role.count == 1:
                raise request  # after the epoch's checkpoint
            elif request is not None:
                asked = stop_vote(request, asked, int(self.state.global_step.numpy()))


def _step_save_due(step: int, every: int) -> bool:
    """Whether ``training.checkpoint_steps`` (``every``; 0 = off) asks for a save after global step
    ``step``."""
    return every > 0 and step % every == 0
