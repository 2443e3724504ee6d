"""The training loop: positions, the input iterator, checkpoints (latest and best-dev, restore with
fallback), summaries and hooks.

Position is kept in the checkpoint (global step, epoch, step inside the epoch,
the epoch target and the ``training.epochs`` it came from) together with the
run's history (``history.py``), and the batch order of an epoch is a pure function
of its seed and number, so a restarted run continues at the very next batch: no
batch seen twice or skipped. The checkpoint also records the towers, global batch
and a digest of the batch plan the position refers to: a run resumed mid-epoch on
another plan (other devices) is refused, one resumed at an epoch boundary warned.

Multi-worker runs save together: the chief's clock decides when a checkpoint is
due and its vote reaches every worker in the step's all-reduce, so all save after
the same step; on restart the chief restores its latest checkpoint and every other
worker that same one (from the chief's directory on a shared work directory, else
its own scratch copy), or every worker stops with one line.

What one step computes is ``step.py``; what happens after an epoch (validation,
best-dev, plateau halving, early stop) is ``policy.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from native_client.alphabet import Labels
from pipeline.batches.dataset import SplitReader, batch_plan, plan_digest, train_dataset
from pipeline.config import Config
from pipeline.evaluation.metrics import best_and_worst, corpus_rates, format_report, headline_metric
from pipeline.evaluation.run import make_forward, run_split
from pipeline.features.cache import CacheIndex, damage_in
from pipeline.model import build_model
from pipeline.model.checkpoints import (
    check_geometry,
    checkpoints_on_disk,
    remove_checkpoint_leftovers,
    warm_start,
)
from pipeline.model.weights import named_weights, rng_states, weights_digest
from pipeline.reports import DevFigures, StopRecord, TrainReport
from pipeline.train.distribute import ClusterRole
from pipeline.train.epochs import RunRecord, epoch_target
from pipeline.train.history import EpochLoss, HistoryState, SkippedBatch, TrainHistory
from pipeline.train.hooks import EpochInfo, StepInfo, StopTraining, TrainHooks, ValidationInfo
from pipeline.train.policy import EpochPolicy, EpochVerdict, learning_rate
from pipeline.train.step import StepResult, TrainStep
from pipeline.workdir import BEST_PREFIX, CHECKPOINT_PREFIX, TrainRun

__all__ = ["Trainer", "TrainHooks", "TrainingError", "global_batch_size"]

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on (too many non-finite batches, bad batch geometry, ...)."""


def _counter(dtype=tf.int64, value=0):
    return field(default_factory=lambda: tf.Variable(value, dtype=dtype, trainable=False))


@dataclass
class _State:
    """Training position, saved in every checkpoint. ``epochs_setting`` is the ``training.epochs`` the
    target came from (0: not recorded, a checkpoint from before it was). ``towers``, ``global_batch`` and
    ``plan_digest`` describe the batch plan the position counts in (0: not recorded)."""

    global_step: tf.Variable = _counter()
    epoch: tf.Variable = _counter()
    step_in_epoch: tf.Variable = _counter()
    target_epochs: tf.Variable = _counter()
    epochs_setting: tf.Variable = _counter()
    finished: tf.Variable = _counter()
    lr_factor: tf.Variable = _counter(tf.float64, 1.0)
    epoch_loss_sum: tf.Variable = _counter(tf.float64, 0.0)
    epoch_loss_count: tf.Variable = _counter()
    towers: tf.Variable = _counter()
    global_batch: tf.Variable = _counter()
    plan_digest: tf.Variable = _counter()

    def variables(self) -> dict:
        """{checkpoint name: variable}."""
        return dict(self.__dict__)


def global_batch_size(config: Config, towers: int) -> tuple[int, int]:
    """(per-tower batch, global batch) for ``towers`` replicas; a ``global_batch_size`` must split evenly."""
    wanted = config.training.global_batch_size
    if wanted:
        if wanted % towers:
            raise TrainingError(
                f"training.global_batch_size {wanted} does not split over {towers} towers; "
                f"use a multiple of {towers}, or set training.batch_size (per tower) instead"
            )
        return wanted // towers, wanted
    return config.training.batch_size, config.training.batch_size * towers


class Trainer:
    """Trains the acoustic model of ``config`` on ``train_data``; validates on ``dev_data`` (None: no
    validation, the last checkpoint stands in for the best-dev one).

    ``run_dir`` receives ``checkpoints/``, ``best/``, ``summaries/``. Only the
    chief (``role.is_chief``) writes there; other workers save into a scratch
    directory, as MultiWorkerMirroredStrategy requires every worker to save.
    ``fingerprint`` (the Train stage's) and ``started`` (the ``time.time()`` the stage
    began, default: now) go into the report ``fit`` returns.
    """

    def __init__(
        self,
        config: Config,
        run_dir: Path,
        train_data: CacheIndex,
        dev_data: CacheIndex | None,
        alphabet: Labels,
        strategy: tf.distribute.Strategy,
        role: ClusterRole = ClusterRole(0, 1),
        hooks: TrainHooks | None = None,
        *,
        fingerprint: str = "",
        started: float | None = None,
    ):
        self.config = config
        self.run_dir = Path(run_dir)
        self.run = TrainRun(self.run_dir)
        self.train_data = train_data
        self.dev_data = dev_data
        self.alphabet = alphabet
        self.strategy = strategy
        self.role = role
        self.hooks = hooks or TrainHooks()
        self.fingerprint = fingerprint
        self.started = time.time() if started is None else started
        self.towers = strategy.num_replicas_in_sync
        self.per_tower_batch, self.global_batch = global_batch_size(config, self.towers)
        self.plan = batch_plan(
            train_data.lengths, self.global_batch, self.towers, config.training.max_batch_frames
        )
        self.steps_per_epoch = len(self.plan)
        self.plan_digest = plan_digest(self.plan)
        writes = self.run if role.is_chief else self.run.worker_scratch(role.index)
        self.scratch = None if role.is_chief else writes.root
        training = config.training
        with strategy.scope():
            self.model = build_model(config.model, train_data.n_input, alphabet.n_classes, training.precision)
            self.optimizer = keras.optimizers.Adam(
                learning_rate=training.learning_rate,
                beta_1=training.beta1,
                beta_2=training.beta2,
                epsilon=training.epsilon,
            )
            self.optimizer.build(self.model.trainable_variables)
            # float16 needs loss scaling; the checkpoint keeps the inner Adam (the same keys in every
            # precision, so a run can switch) and the scale beside it.
            self.step_optimizer = (
                keras.optimizers.LossScaleOptimizer(self.optimizer)
                if training.precision == "mixed_float16"
                else self.optimizer
            )
            self.step_optimizer.build(self.model.trainable_variables)
        loss_scale = (
            {"scale": self.step_optimizer.dynamic_scale, "counter": self.step_optimizer.step_counter}
            if self.step_optimizer is not self.optimizer
            else {}
        )
        self.state = _State()
        self.history_state = HistoryState()
        self.resumed = False
        # Everything a step depends on: weights, optimizer slots and step, dropout RNG state, data
        # position, learning-rate factor and history; so a resumed run is bit-identical.
        self.checkpoint = tf.train.Checkpoint(
            weights=named_weights(self.model),
            rng=rng_states(self.model),
            optimizer=self.optimizer,
            loss_scale=loss_scale,
            history=self.history_state,
            **self.state.variables(),
        )
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            str(writes.checkpoints),
            max_to_keep=training.max_to_keep,
            checkpoint_name=CHECKPOINT_PREFIX,
        )
        self.best_manager = tf.train.CheckpointManager(
            self.checkpoint, str(writes.best), max_to_keep=1, checkpoint_name=BEST_PREFIX
        )
        self._train_step = TrainStep(
            self.model, self.optimizer, self.step_optimizer, strategy, training, alphabet.blank_index
        )
        self.policy = EpochPolicy(config, has_dev=dev_data is not None)
        self._forward = make_forward(self.model, alphabet.blank_index)
        self._train_reader = SplitReader(train_data)
        self._dev_reader = SplitReader(dev_data) if dev_data is not None else None
        # The validation log's headline figure: CER where the dev references' language has no word spaces.
        self._dev_headline = headline_metric(dev_data.transcripts) if dev_data is not None else "wer"
        self._writers = None
        self._last_histogram = 0.0
        self._last_loss = float("nan")
        self._first_loss = None
        self._warned_growth = False
        if role.is_chief:
            remove_checkpoint_leftovers(self.run)

    @property
    def history(self) -> TrainHistory:
        """The run's record (restored with the checkpoint, saved with every checkpoint)."""
        return self.history_state.history

    # -- persistence ---------------------------------------------------------------------------
    def _save(self) -> None:
        """Write a checkpoint of everything (the history is serialised only here, never per step)."""
        saved = self.manager.save(checkpoint_number=int(self.state.global_step.numpy()))
        log.info(
            "Saved %s: epoch %d, step %d (%d of this epoch)",
            saved,
            int(self.state.epoch.numpy()),
            int(self.state.global_step.numpy()),
            int(self.state.step_in_epoch.numpy()),
        )

    def restore(self) -> str | None:
        """Restore the latest checkpoint (or warm-start from ``training.init_from``); returns what was loaded.

        A damaged checkpoint (unreadable data, a malformed history) is skipped with a warning for the one
        before it; ``resumed`` says whether a checkpoint of this run was restored. In a multi-worker run
        every worker restores the checkpoint the chief chose (``_restore_agreed``).
        """
        self.resumed = False
        if self.role.count > 1:
            return self._restore_agreed()
        return self._restore_latest()

    def _restore_prefix(self, prefix: str, directory: Path) -> None:
        """Restore checkpoint ``prefix`` (of ``directory``, named in errors) and log where training stands."""
        check_geometry(prefix, self.model, directory)
        self.checkpoint.restore(prefix).expect_partial()
        self.resumed = True
        log.info(
            "Restored %s: epoch %d, step %d (%d of this epoch)",
            prefix,
            int(self.state.epoch.numpy()),
            int(self.state.global_step.numpy()),
            int(self.state.step_in_epoch.numpy()),
        )

    def _restore_latest(self) -> str | None:
        """The latest intact checkpoint of this process's directory, else the warm start, else None."""
        candidates = list(reversed(self.manager.checkpoints)) or checkpoints_on_disk(self.manager.directory)
        for prefix in candidates:
            try:
                self._restore_prefix(prefix, Path(self.manager.directory))
            except (tf.errors.OpError, ValueError) as error:
                # Every checkpoint holds every variable, so the next restore overwrites a partial one.
                log.warning(
                    "%s: damaged checkpoint (%s); falling back to the one before it",
                    prefix,
                    str(error).splitlines()[0][:200],
                )
                continue
            return prefix
        if candidates:
            raise TrainingError(
                f"{self.run.checkpoints}: no intact checkpoint among {len(candidates)}; "
                f"delete the directory (make rerun STAGE=Train) to train from the start"
            )
        return self._warm_start()

    def _warm_start(self) -> str | None:
        """Copy the weights of ``training.init_from`` when it is set; returns it (None when unset)."""
        if not self.config.training.init_from:
            return None
        copied = warm_start(
            self.model,
            self.config.training.init_from,
            self.config.training.drop_source_layers,
            self.config,
            self.alphabet,
        )
        log.info(
            "Warm start from %s: %d weights copied, %d last layers fresh",
            self.config.training.init_from,
            len(copied),
            self.config.training.drop_source_layers,
        )
        return self.config.training.init_from

    def _sum_over_workers(self, value: int) -> int:
        """``value`` summed over the workers of a multi-worker run: one collective operation, which every
        worker must reach (each worker's first tower contributes its value, the others 0)."""
        local = self.towers // self.role.count

        def contribution(context: tf.distribute.ValueContext):
            first = context.replica_id_in_sync_group % local == 0
            return tf.constant(float(value) if first else 0.0, tf.float64)

        values = self.strategy.experimental_distribute_values_from_function(contribution)
        return int(round(float(self.strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None).numpy())))

    def _restore_agreed(self) -> str | None:
        """Multi-worker restore: the chief restores its latest intact checkpoint (``_restore_latest``) and
        every other worker the checkpoint of that same step, so that all resume at one position with one
        model. A non-chief reads it from the chief's directory when it can (a shared work directory), else
        from its own scratch directory (saves happen at the same steps everywhere). When any worker cannot,
        every worker raises TrainingError with the same line."""
        loaded = self._restore_latest() if self.role.is_chief else None
        chief_step = int(self.state.global_step.numpy()) if self.resumed else -1
        agreed = self._sum_over_workers(chief_step if self.role.is_chief else 0)
        problem = None
        if not self.role.is_chief:
            if agreed < 0:
                loaded = self._warm_start()
            else:
                loaded, problem = self._restore_step(agreed)
        failures = self._sum_over_workers(1 if problem else 0)
        if problem:
            log.error("%s", problem)
        if failures:
            raise TrainingError(
                f"{failures} worker(s) could not restore ckpt-{agreed}, the chief's latest checkpoint in "
                f"{self.run.checkpoints} (see their logs): put paths.work_dir on a filesystem every worker "
                f"shares, or delete the run directory (make rerun STAGE=Train) to train from the start"
            )
        return loaded

    def _restore_step(self, step: int) -> tuple[str | None, str | None]:
        """Restore the checkpoint numbered ``step``: the chief's copy, else this worker's scratch copy.
        Returns (the prefix restored, None) or (None, why not)."""
        tried = []
        for directory in dict.fromkeys([self.run.checkpoints, Path(self.manager.directory)]):
            prefix = directory / f"{CHECKPOINT_PREFIX}-{step}"
            if not Path(f"{prefix}.index").is_file():
                tried.append(f"{directory}: none")
                continue
            try:
                self._restore_prefix(str(prefix), directory)
            except (tf.errors.OpError, ValueError) as error:
                tried.append(f"{directory}: {str(error).splitlines()[0][:200]}")
                continue
            return str(prefix), None
        return (
            None,
            f"worker {self.role.index}: cannot restore {CHECKPOINT_PREFIX}-{step} ({'; '.join(tried)})",
        )

    def _check_plan(self) -> None:
        """Compare the restored position's batch plan (towers, global batch, plan digest in the checkpoint)
        with this run's, then record this run's. Mid-epoch on another plan the position would skip or
        repeat batches: TrainingError. At an epoch boundary the next epoch starts on the new plan: a
        warning. A checkpoint from before these were recorded is taken as it is."""
        state = self.state
        old_digest, old_towers, old_global = (
            int(v.numpy()) for v in (state.plan_digest, state.towers, state.global_batch)
        )
        epoch, step = int(state.epoch.numpy()), int(state.step_in_epoch.numpy())
        if self.resumed and old_digest and old_digest != self.plan_digest:
            was = f"{old_towers} towers x {old_global // max(old_towers, 1)} = global batch {old_global}"
            now = f"{self.towers} towers x {self.per_tower_batch} = global batch {self.global_batch}"
            if step > 0:
                # training.global_batch_size is in the Train fingerprint: setting it would start another run.
                raise TrainingError(
                    f"{self.run.checkpoints}: the run stopped in epoch {epoch + 1} at step {step} of a batch "
                    f"plan of {was}; this run has {now}, on which that position would skip or repeat "
                    f"batches. Finish the epoch on the old devices first (training.epochs: -1 stops at its "
                    f"end), or delete the run (make rerun STAGE=Train) to start again"
                )
            log.warning(
                "%s: resuming at the start of epoch %d with %s (the run had %s): the epochs from here follow "
                "the new batch plan",
                self.run.checkpoints,
                epoch + 1,
                now,
                was,
            )
        state.plan_digest.assign(self.plan_digest)
        state.towers.assign(self.towers)
        state.global_batch.assign(self.global_batch)

    def _last_run(self) -> RunRecord | None:
        """What the restored checkpoint says about its run (None when none of this run was restored)."""
        if not self.resumed:
            return None
        return RunRecord(
            epochs_done=int(self.state.epoch.numpy()),
            target=int(self.state.target_epochs.numpy()),
            setting=int(self.state.epochs_setting.numpy()) or None,
            finished=bool(self.state.finished.numpy()),
            stopped=self.history.stop is not None,
        )

    def _plan(self) -> tuple[int, int, int]:
        """(target epochs, epochs setting, finished): what a save records about the run's plan."""
        return tuple(
            int(v.numpy()) for v in (self.state.target_epochs, self.state.epochs_setting, self.state.finished)
        )

    def _run_over(self, target: int) -> bool:
        return int(self.state.epoch.numpy()) >= target or self.history.stop is not None

    def _ensure_best(self) -> None:
        """Make the last checkpoint the best-dev one when no validation has told better: no dev split,
        validation off, or no finite dev loss (and ``training.best_by`` figure) yet."""
        latest = self.best_manager.latest_checkpoint
        if latest and self.history.best(self.config.training.best_by) is not None:
            return
        step = int(self.state.global_step.numpy())
        if latest is None or not latest.endswith(f"-{step}"):
            self.best_manager.save(checkpoint_number=step)

    # -- summaries -----------------------------------------------------------------------------
    def _writer(self, name: str):
        if not self.role.is_chief:
            return tf.summary.create_noop_writer()
        if self._writers is None:
            self._writers = {}
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(str(self.run.summaries / name))
        return self._writers[name]

    def _learning_rate(self) -> float:
        return learning_rate(
            self.config.training, float(self.state.lr_factor.numpy()), int(self.state.global_step.numpy())
        )

    # -- the loop ------------------------------------------------------------------------------
    def _distributed_batches(self, epoch: int, start_step: int, end_epoch: int):
        reader, plan, towers = self._train_reader, self.plan, self.towers
        seed = self.config.training.shuffle_seed
        augment = self.config.augment if self.config.augment.features_on else None

        def dataset_fn(context: tf.distribute.InputContext):
            local = context.num_replicas_in_sync // context.num_input_pipelines
            return train_dataset(
                reader,
                plan,
                towers,
                context.input_pipeline_id * local,
                local,
                epoch,
                start_step,
                end_epoch,
                seed,
                augment,
            )

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def _after_step(self, result: StepResult, consecutive_bad: int, lr: float) -> int:
        """Book-keeping of one step: counters, skipped-batch record, summaries; returns the non-finite
        streak."""
        training = self.config.training
        loss, finite, applied = result.loss, result.finite, result.applied
        self._last_loss = loss
        self.state.global_step.assign_add(1)
        self.state.step_in_epoch.assign_add(1)
        step = int(self.state.global_step.numpy())
        if finite:
            self._watch_loss(step, loss)
        if finite and applied:
            consecutive_bad = 0
            self.state.epoch_loss_sum.assign_add(loss)
            self.state.epoch_loss_count.assign_add(1)
        else:
            consecutive_bad += 1
            files = sorted({self.train_data.paths[i] for i in result.batch_indices()})
            if finite:
                log.warning(
                    "Step %d: the update would make weights non-finite, so it was not applied "
                    "(training.learning_rate %g too high?); its files: %s",
                    step,
                    lr,
                    ", ".join(files),
                )
            else:
                log.warning("Step %d: non-finite loss, batch skipped; its files: %s", step, ", ".join(files))
            self.history.skipped_batches.append(SkippedBatch(step=step, files=files))
            if consecutive_bad >= training.max_nonfinite_batches:
                self._save()
                raise TrainingError(
                    f"{consecutive_bad} batches in a row had a non-finite loss "
                    f"(last files: {', '.join(files)}); check these files and the learning rate "
                    f"(training.learning_rate {training.learning_rate})"
                )
        with self._writer("train").as_default(step=step):
            if finite:
                tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", min(lr, float(np.finfo(np.float32).max)))
            if time.monotonic() - self._last_histogram >= training.summary_secs:
                self._last_histogram = time.monotonic()
                for name, variable in named_weights(self.model).items():
                    tf.summary.histogram(name, variable)
        return consecutive_bad

    def _watch_loss(self, step: int, loss: float) -> None:
        """Warn once when the loss has grown 100x over the first loss of this run (diverging training)."""
        if self._first_loss is None:
            self._first_loss = loss
        elif self._first_loss > 0 and loss > 100 * self._first_loss and not self._warned_growth:
            self._warned_growth = True
            log.warning(
                "Step %d: loss %.4g is over 100x the first loss %.4g; training is diverging "
                "(lower training.learning_rate or set training.clip_grad_norm)",
                step,
                loss,
                self._first_loss,
            )

    def validate(self, epoch: int) -> tuple[DevFigures, dict]:
        """Dev figures (loss, greedy WER/CER) of the current weights, as after epoch ``epoch``, and the
        best/worst samples."""
        results = run_split(
            self.model,
            self.dev_data,
            self.alphabet,
            self.config.training.dev_batch_size,
            self._forward,
            reader=self._dev_reader,
            max_batch_frames=self.config.training.max_batch_frames,
        )
        rates = corpus_rates(results, self._dev_headline)
        samples = best_and_worst(results, self.config.training.report_count, rates["headline"])
        log.info("%s", format_report(f"Validation after epoch {epoch}", rates, samples))
        return DevFigures(epoch=epoch, dev_loss=rates["loss"], wer=rates["wer"], cer=rates["cer"]), samples

    def _end_epoch(self, epoch: int, target: int) -> None:
        """Close epoch ``epoch`` (0-based): record its loss, carry out the policy's verdict, advance the
        position and save (the best-dev checkpoint too when it improved). The save that ends the run
        marks it finished in the same checkpoint, so no kill can separate the two."""
        history = self.history
        count = int(self.state.epoch_loss_count.numpy())
        epoch_loss = float(self.state.epoch_loss_sum.numpy()) / count if count else float("nan")
        history.epoch_losses.append(EpochLoss(epoch=epoch + 1, train_loss=epoch_loss))
        log.info("Epoch %d/%d: mean train loss %.4f", epoch + 1, target, epoch_loss)
        if self.hooks.on_epoch:
            self.hooks.on_epoch(EpochInfo(epoch=epoch + 1, target_epochs=target, train_loss=epoch_loss))
        verdict = self.policy.after_epoch(epoch + 1, history, self.validate)
        if verdict.validation is not None:
            self._record_validation(verdict)
        self.state.epoch.assign_add(1)
        self.state.step_in_epoch.assign(0)
        self.state.epoch_loss_sum.assign(0.0)
        self.state.epoch_loss_count.assign(0)
        if self._run_over(target):
            self.state.finished.assign(1)
        if verdict.is_best:
            self.best_manager.save(checkpoint_number=int(self.state.global_step.numpy()))
        self._save()

    def _record_validation(self, verdict: EpochVerdict) -> None:
        """Record a validation and what the policy decided on it; summaries, the WER line, hooks."""
        training, history, figures = self.config.training, self.history, verdict.validation
        history.validations.append(figures)
        history.last_samples = verdict.samples
        if verdict.stop is not None:
            history.stop = verdict.stop
        with self._writer("dev").as_default(step=int(self.state.global_step.numpy())):
            tf.summary.scalar("loss", figures.dev_loss)
            tf.summary.scalar("wer", figures.wer)
            tf.summary.scalar("cer", figures.cer)
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

    def fit(self) -> TrainReport:
        """Train until the target epoch or an early stop; returns the training report."""
        started = time.monotonic()
        self.restore()
        target = epoch_target(self.config.training.epochs, self._last_run())
        self._check_plan()
        plan_before = self._plan()
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
            if self._plan() != plan_before:
                self._save()  # the new target and setting, so checkpoint and report agree
        else:
            self._train(target, started)
        self._ensure_best()
        for writer in (self._writers or {}).values():
            writer.flush()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return self._report(target, time.monotonic() - started)

    def _train(self, target: int, started: float) -> None:
        """Run steps and epochs from the restored position to ``target`` or an early stop."""
        training = self.config.training
        log.info(
            "Training to epoch %d: %d towers x %d = global batch %d, %d steps per epoch",
            target,
            self.towers,
            self.per_tower_batch,
            self.global_batch,
            self.steps_per_epoch,
        )
        last_save = time.monotonic()
        consecutive_bad = 0
        current_lr = None
        # One iterator for the whole run: re-creating distributed datasets every epoch stalled
        # for up to a minute at each epoch boundary (tearing down the previous iterator).
        dataset = self._distributed_batches(
            int(self.state.epoch.numpy()), int(self.state.step_in_epoch.numpy()), target
        )
        batches = iter(dataset)
        while not self._run_over(target):
            epoch = int(self.state.epoch.numpy())
            for _ in range(self.steps_per_epoch - int(self.state.step_in_epoch.numpy())):
                try:
                    batch = next(batches)
                except tf.errors.OpError as error:
                    raise damage_in(error) or error from None
                lr = self._learning_rate()
                if lr != current_lr:
                    self.optimizer.learning_rate.assign(lr)
                    current_lr = lr
                # The chief's clock decides; every worker learns the decision from the step itself.
                vote = self.role.is_chief and time.monotonic() - last_save >= training.checkpoint_secs
                result = self._train_step(batch, dataset.element_spec, save_vote=vote)
                consecutive_bad = self._after_step(result, consecutive_bad, lr)
                if result.save:
                    self._save()
                    last_save = time.monotonic()
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
                    except StopTraining:
                        # The step's book-keeping is done: a consistent position. A multi-worker save is
                        # collective, so only a lone worker can save on a request of its own.
                        if self.role.count == 1:
                            self._save()
                        raise
            self._end_epoch(epoch, target)
            last_save = time.monotonic()

    def _report(self, target: int, wall_this_run: float) -> TrainReport:
        """The whole ``train_report.json`` of this run (the only place it is built)."""
        history = self.history
        stop = history.stop or StopRecord(rule=None, reason=f"reached the target of {target} epochs")
        return TrainReport(
            epochs_completed=int(self.state.epoch.numpy()),
            target_epochs=target,
            global_step=int(self.state.global_step.numpy()),
            steps_per_epoch=self.steps_per_epoch,
            towers=self.towers,
            batch_size_per_tower=self.per_tower_batch,
            global_batch_size=self.global_batch,
            train_losses=[dataclasses.asdict(e) for e in history.epoch_losses],
            validations=[dataclasses.asdict(v) for v in history.validations],
            best_dev=history.best(self.config.training.best_by),
            last_samples=history.last_samples,
            stop=stop,
            skipped_batches=[dataclasses.asdict(b) for b in history.skipped_batches],
            best_checkpoint=self.best_manager.latest_checkpoint,
            latest_checkpoint=self.manager.latest_checkpoint,
            wall_time_s_this_run=wall_this_run,
            epochs_setting=self.config.training.epochs,
            weights_sha256=weights_digest(self.model),
            fingerprint=self.fingerprint,
            config=self.config.source,
            train_samples=len(self.train_data),
            train_audio_hours=float(self.train_data.durations.sum()) / 3600,
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
            wall_time_s=time.time() - self.started,
        )
