"""The training loop: towers via ``strategy.run``, checkpoints with exact resume, validation, early stopping.

Position is kept in the checkpoint (global step, epoch, step inside the
epoch, target epochs, validation history), and the batch order of an epoch
is a pure function of its seed and number, so a restarted run continues at
the very next batch: no batch seen twice or skipped.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from native_client.alphabet import Alphabet
from pipeline.config import Config
from pipeline.evaluation.metrics import best_and_worst, corpus_rates, format_report
from pipeline.evaluation.run import make_forward, run_split
from pipeline.features.cache import CacheIndex, damage_in
from pipeline.layout import BEST_PREFIX, CHECKPOINT_PREFIX, TrainRun
from pipeline.model.checkpoints import (
    check_geometry,
    checkpoints_on_disk,
    named_weights,
    remove_checkpoint_leftovers,
    rng_states,
    warm_start,
)
from pipeline.model import build_model
from pipeline.reports import DevFigures, StopRecord, TrainReport
from pipeline.train.ctc import ctc_loss, sparse_labels_supported
from pipeline.train.dataset import SplitReader, batch_plan, train_dataset
from pipeline.train.distribute import ClusterRole
from pipeline.train.early_stop import should_stop
from pipeline.train.epochs import epoch_target

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on (too many non-finite batches, bad batch geometry, ...)."""


@dataclass
class TrainHooks:
    """Callbacks a caller (a Luigi task, a test) can attach; each gets a dict of figures."""

    on_step: Callable[[dict], None] | None = None
    on_validation: Callable[[dict], None] | None = None
    on_epoch: Callable[[dict], None] | None = None


@dataclass
class _State:
    """Training position and history, saved in every checkpoint."""

    global_step: tf.Variable = field(default_factory=lambda: tf.Variable(0, dtype=tf.int64, trainable=False))
    epoch: tf.Variable = field(default_factory=lambda: tf.Variable(0, dtype=tf.int64, trainable=False))
    step_in_epoch: tf.Variable = field(
        default_factory=lambda: tf.Variable(0, dtype=tf.int64, trainable=False)
    )
    target_epochs: tf.Variable = field(
        default_factory=lambda: tf.Variable(0, dtype=tf.int64, trainable=False)
    )
    finished: tf.Variable = field(default_factory=lambda: tf.Variable(0, dtype=tf.int64, trainable=False))
    lr_factor: tf.Variable = field(
        default_factory=lambda: tf.Variable(1.0, dtype=tf.float64, trainable=False)
    )
    epoch_loss_sum: tf.Variable = field(
        default_factory=lambda: tf.Variable(0.0, dtype=tf.float64, trainable=False)
    )
    epoch_loss_count: tf.Variable = field(
        default_factory=lambda: tf.Variable(0, dtype=tf.int64, trainable=False)
    )
    history: tf.Variable = field(default_factory=lambda: tf.Variable("{}", dtype=tf.string, trainable=False))

    def variables(self) -> dict:
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
    """Trains the acoustic model of ``config`` on ``train_data``; validates on ``dev_data``.

    ``run_dir`` receives ``checkpoints/``, ``best/``, ``summaries/``. Only the
    chief (``role.is_chief``) writes there; other workers save into a scratch
    directory, as MultiWorkerMirroredStrategy requires every worker to save.
    """

    def __init__(
        self,
        config: Config,
        run_dir: Path,
        train_data: CacheIndex,
        dev_data: CacheIndex | None,
        alphabet: Alphabet,
        strategy: tf.distribute.Strategy,
        role: ClusterRole = ClusterRole(0, 1),
        hooks: TrainHooks | None = None,
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
        self.towers = strategy.num_replicas_in_sync
        self.per_tower_batch, self.global_batch = global_batch_size(config, self.towers)
        self.plan = batch_plan(
            train_data.lengths, self.global_batch, self.towers, config.training.max_batch_frames
        )
        self.steps_per_epoch = len(self.plan)
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
        # Everything a step depends on: weights, optimizer slots and step, dropout RNG state, data
        # position, learning-rate factor and history; so a resumed run is bit-identical.
        self.checkpoint = tf.train.Checkpoint(
            weights=named_weights(self.model),
            rng=rng_states(self.model),
            optimizer=self.optimizer,
            loss_scale=loss_scale,
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
        self._train_step = self._make_train_step()
        self._forward = make_forward(self.model, alphabet.blank_index)
        self._train_reader = SplitReader(train_data)
        self._dev_reader = SplitReader(dev_data) if dev_data is not None else None
        self._writers = None
        self._last_histogram = 0.0
        self._last_loss = float("nan")
        self._first_loss = None
        self._warned_growth = False
        if role.is_chief:
            remove_checkpoint_leftovers(self.run)

    # -- the step ------------------------------------------------------------------------------
    def _make_train_step(self):
        model, optimizer, towers = self.model, self.step_optimizer, self.towers
        scaled_loss = optimizer is not self.optimizer
        jit = self.config.training.jit_compile
        blank, clip = self.alphabet.blank_index, self.config.training.clip_grad_norm
        guard = self.config.training.revert_nonfinite_updates
        # XLA has no kernel for the sparse-label CTC op: with jit_compile the dense-label loss is used.
        sparse = sparse_labels_supported() and not jit

        def gradients(windows, lengths, labels, label_lengths):
            """(the tower's share of the loss, its gradients): forward and backward, one XLA cluster with
            jit_compile."""
            with tf.GradientTape() as tape:
                logits = model(windows, training=True)  # [batch, time, classes], float32
                per_sample = ctc_loss(labels, label_lengths, logits, lengths, blank, sparse)
                # The step's global batch: every tower gets as many utterances (max_batch_frames may
                # make a step smaller than training.batch_size).
                step_batch = tf.cast(tf.shape(lengths)[0] * towers, per_sample.dtype)
                scaled = tf.reduce_sum(per_sample) / step_batch
                backward = optimizer.scale_loss(scaled) if scaled_loss else scaled
            return scaled, tape.gradient(backward, model.trainable_variables)

        if jit:
            gradients = tf.function(gradients, jit_compile=True)

        # Shadow copies of every variable a step changes: an update that would make a weight non-finite
        # is undone (costs one copy of weights + optimizer slots in memory and a copy per step).
        guarded = list(model.trainable_variables) + list(self.optimizer.variables)
        with self.strategy.scope():
            shadows = (
                [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="shadow") for v in guarded]
                if guard
                else []
            )

        def apply_if_finite(distribution, finite, grads):
            # Runs in cross-replica context: assignments reach every replica.
            def apply():
                for shadow, variable in zip(shadows, guarded, strict=False):
                    shadow.assign(variable)
                distribution.extended.call_for_each_replica(
                    lambda g: optimizer.apply(g, model.trainable_variables), args=(grads,)
                )
                if not guard:
                    return tf.constant(True)
                ok = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in model.trainable_variables])

                def revert():
                    for shadow, variable in zip(shadows, guarded, strict=False):
                        variable.assign(shadow)
                    return tf.constant(False)

                return tf.cond(ok, lambda: tf.constant(True), revert)

            return tf.cond(
                distribution.experimental_local_results(finite)[0], apply, lambda: tf.constant(False)
            )

        def replica_step(windows, lengths, labels, label_lengths, indices):
            scaled, grads = gradients(windows, lengths, labels, label_lengths)
            context = tf.distribute.get_replica_context()
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, grads + [scaled])
            grads, loss = reduced[:-1], reduced[-1]
            # With loss scaling, the LossScaleOptimizer skips steps whose gradients overflowed (and lowers
            # the scale); only the loss decides here.
            checked = [loss] if scaled_loss else reduced
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in checked])
            if clip > 0:
                # Scaled gradients are clipped at the scaled norm: the same as clipping the true ones.
                grads, _ = tf.clip_by_global_norm(
                    grads, clip * (optimizer.dynamic_scale if scaled_loss else 1.0)
                )
            # The optimizer all-reduces (sums) again: hand it each tower's share of the global gradient.
            grads = [g / towers for g in grads]
            applied = context.merge_call(apply_if_finite, args=(finite, grads))
            return loss, finite, applied, indices

        compiled = {}

        def train_step(dataset, batch):
            # One trace for all batch shapes: the signature has unknown batch and time sizes.
            if "fn" not in compiled:
                compiled["fn"] = tf.function(
                    lambda b: self.strategy.run(replica_step, args=b), input_signature=[dataset.element_spec]
                )
            return compiled["fn"](batch)

        return train_step

    # -- persistence ---------------------------------------------------------------------------
    def _history(self) -> dict:
        return json.loads(self.state.history.numpy().decode())

    def _set_history(self, history: dict) -> None:
        self.state.history.assign(json.dumps(history))

    def _save(self, history: dict | None = None) -> None:
        # The history is serialised into the checkpoint only when one is written, never per step.
        if history is not None:
            self._set_history(history)
        self.manager.save(checkpoint_number=int(self.state.global_step.numpy()))

    def restore(self) -> str | None:
        """Restore the latest checkpoint (or warm-start from ``training.init_from``); returns what was loaded."""
        candidates = list(reversed(self.manager.checkpoints)) or checkpoints_on_disk(self.run.checkpoints)
        for prefix in candidates:
            try:
                check_geometry(prefix, self.model, self.run.checkpoints)
                self.checkpoint.restore(prefix).expect_partial()
            except (tf.errors.OpError, ValueError) as error:
                # Every checkpoint holds every variable, so the next restore overwrites a partial one.
                log.warning(
                    "%s: damaged checkpoint (%s); falling back to the one before it",
                    prefix,
                    str(error).splitlines()[0][:200],
                )
                continue
            log.info(
                "Restored %s: epoch %d, step %d (%d of this epoch)",
                prefix,
                int(self.state.epoch.numpy()),
                int(self.state.global_step.numpy()),
                int(self.state.step_in_epoch.numpy()),
            )
            return prefix
        if candidates:
            raise TrainingError(
                f"{self.run.checkpoints}: no intact checkpoint among {len(candidates)}; "
                f"delete the directory (make rerun STAGE=Train) to train from the start"
            )
        if self.config.training.init_from:
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
        return None

    def _resolve_target(self, restored: bool) -> int:
        unfinished = restored and not int(self.state.finished.numpy())
        target = epoch_target(
            self.config.training.epochs,
            int(self.state.epoch.numpy()),
            int(self.state.target_epochs.numpy()) if unfinished else 0,
        )
        self.state.target_epochs.assign(target)
        self.state.finished.assign(0)
        return target

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
        training = self.config.training
        lr = training.learning_rate * float(self.state.lr_factor.numpy())
        if training.lr_decay == "exponential":
            lr *= training.decay_rate ** (int(self.state.global_step.numpy()) / training.decay_steps)
        return lr

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

    def _after_step(self, outputs, history: dict, consecutive_bad: int, lr: float) -> int:
        """Book-keeping of one step: counters, skipped-batch log, summaries; returns the non-finite streak."""
        training = self.config.training
        loss, finite, applied, indices = outputs
        loss = float(self.strategy.experimental_local_results(loss)[0].numpy())
        finite = bool(self.strategy.experimental_local_results(finite)[0].numpy())
        applied = bool(self.strategy.experimental_local_results(applied)[0].numpy())
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
            files = sorted(
                {
                    self.train_data.paths[i]
                    for part in self.strategy.experimental_local_results(indices)
                    for i in part.numpy()
                }
            )
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
            history["skipped_batches"].append({"step": step, "files": files})
            if consecutive_bad >= training.max_nonfinite_batches:
                self._save(history)
                raise TrainingError(
                    f"{consecutive_bad} batches in a row had a non-finite loss (last files: {', '.join(files)}); "
                    f"check these files and the learning rate (training.learning_rate {training.learning_rate})"
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

    def validate(self, epoch: int) -> dict:
        """Dev loss, greedy WER/CER and best/worst samples of the current weights."""
        results = run_split(
            self.model,
            self.dev_data,
            self.alphabet,
            self.config.training.dev_batch_size,
            self._forward,
            reader=self._dev_reader,
            max_batch_frames=self.config.training.max_batch_frames,
        )
        rates = corpus_rates(results)
        samples = best_and_worst(results, self.config.training.report_count)
        log.info("%s", format_report(f"Validation after epoch {epoch}", rates, samples))
        return {
            "epoch": epoch,
            "dev_loss": rates["loss"],
            "wer": rates["wer"],
            "cer": rates["cer"],
            "samples": samples,
        }

    def _end_epoch(self, epoch: int, target: int, history: dict, best_loss: float) -> float:
        """Close epoch ``epoch`` (0-based): record its loss, validate when due, advance the position and
        save (the best-dev checkpoint too when it improved); returns the best dev loss so far."""
        count = int(self.state.epoch_loss_count.numpy())
        epoch_loss = float(self.state.epoch_loss_sum.numpy()) / count if count else float("nan")
        history["epoch_losses"].append({"epoch": epoch + 1, "train_loss": epoch_loss})
        log.info("Epoch %d/%d: mean train loss %.4f", epoch + 1, target, epoch_loss)
        if self.hooks.on_epoch:
            self.hooks.on_epoch({"epoch": epoch + 1, "target_epochs": target, "train_loss": epoch_loss})
        is_best, best_loss = self._validate_and_decide(epoch + 1, history, best_loss)
        self.state.epoch.assign_add(1)
        self.state.step_in_epoch.assign(0)
        self.state.epoch_loss_sum.assign(0.0)
        self.state.epoch_loss_count.assign(0)
        self._set_history(history)
        if is_best:
            self.best_manager.save(checkpoint_number=int(self.state.global_step.numpy()))
        self._save()
        return best_loss

    def _validate_and_decide(self, epoch: int, history: dict, best_loss: float) -> tuple[bool, float]:
        """The end-of-epoch policy after epoch ``epoch`` (1-based): validate when due, then decide whether
        this is the best-dev model, whether to halve the learning rate, and whether to stop early
        (recorded in ``history["stop"]``). Returns (best-dev model?, best dev loss so far)."""
        training = self.config.training
        due = (
            self.dev_data is not None
            and training.validation_epochs
            and epoch % training.validation_epochs == 0
        )
        if not due:
            if training.validation_epochs == 0 and self.config.early_stop.rule != "off" and epoch == 1:
                log.warning(
                    "early_stop.rule is %r but validation is off (training.validation_epochs: 0): "
                    "no early stopping",
                    self.config.early_stop.rule,
                )
            return False, best_loss
        validation = self.validate(epoch)
        history["validations"].append(validation)
        with self._writer("dev").as_default(step=int(self.state.global_step.numpy())):
            for key in ("dev_loss", "wer", "cer"):
                tf.summary.scalar(key.replace("dev_", ""), validation[key])
        if training.wer_log_pattern:
            print(
                training.wer_log_pattern.format(
                    epoch=epoch, wer=validation["wer"], cer=validation["cer"], loss=validation["dev_loss"]
                ),
                flush=True,
            )
        is_best = validation["dev_loss"] < best_loss
        if not is_best and training.halve_lr_on_plateau:
            self.state.lr_factor.assign(self.state.lr_factor * 0.5)
            log.info(
                "Dev loss %.4f is worse than the best %.4f: learning rate halved to %.3g",
                validation["dev_loss"],
                best_loss,
                self._learning_rate(),
            )
        decision = should_stop([v["dev_loss"] for v in history["validations"]], self.config.early_stop)
        if decision is not None:
            log.info("Early stop check (%s rule): %s", decision.rule, decision.reason)
            if decision.stop:
                history["stop"] = {"rule": decision.rule, "reason": decision.reason, "epoch": epoch}
                log.warning(
                    "Early stop after epoch %d by the %s rule: %s", epoch, decision.rule, decision.reason
                )
        if self.hooks.on_validation:
            self.hooks.on_validation(validation)
        return is_best, min(best_loss, validation["dev_loss"])

    def fit(self) -> TrainReport:
        """Train until the target epoch or an early stop; returns the training report."""
        started = time.monotonic()
        restored = self.restore() is not None
        target = self._resolve_target(restored)
        training = self.config.training
        history = self._history()
        history.setdefault("validations", [])
        history.setdefault("epoch_losses", [])
        history.setdefault("skipped_batches", [])
        history.setdefault("stop", None)
        history["stop"] = None
        best_loss = min(
            (v["dev_loss"] for v in history["validations"] if np.isfinite(v["dev_loss"])), default=math.inf
        )
        last_save = time.monotonic()
        consecutive_bad = 0
        current_lr = None
        log.info(
            "Training to epoch %d: %d towers x %d = global batch %d, %d steps per epoch",
            target,
            self.towers,
            self.per_tower_batch,
            self.global_batch,
            self.steps_per_epoch,
        )

        # One iterator for the whole run: re-creating distributed datasets every epoch stalled
        # for up to a minute at each epoch boundary (tearing down the previous iterator).
        first_epoch = int(self.state.epoch.numpy())
        if first_epoch < target:
            dataset = self._distributed_batches(first_epoch, int(self.state.step_in_epoch.numpy()), target)
            batches = iter(dataset)
        while int(self.state.epoch.numpy()) < target and history["stop"] is None:
            epoch = int(self.state.epoch.numpy())
            start_step = int(self.state.step_in_epoch.numpy())
            if start_step < self.steps_per_epoch:
                for _ in range(self.steps_per_epoch - start_step):
                    try:
                        batch = next(batches)
                    except tf.errors.OpError as error:
                        raise damage_in(error) or error from None
                    lr = self._learning_rate()
                    if lr != current_lr:
                        self.optimizer.learning_rate.assign(lr)
                        current_lr = lr
                    outputs = self._train_step(dataset, batch)
                    consecutive_bad = self._after_step(outputs, history, consecutive_bad, lr)
                    if time.monotonic() - last_save >= training.checkpoint_secs:
                        self._save(history)
                        last_save = time.monotonic()
                    if self.hooks.on_step:
                        self.hooks.on_step(
                            {
                                "epoch": epoch,
                                "target_epochs": target,
                                "step": int(self.state.global_step.numpy()),
                                "step_in_epoch": int(self.state.step_in_epoch.numpy()),
                                "steps_per_epoch": self.steps_per_epoch,
                                "loss": self._last_loss,
                                "elapsed_s": time.monotonic() - started,
                            }
                        )
            best_loss = self._end_epoch(epoch, target, history, best_loss)
            last_save = time.monotonic()

        self.state.finished.assign(1)
        self._set_history(history)
        self._save()
        if not self.best_manager.latest_checkpoint:
            self.best_manager.save(checkpoint_number=int(self.state.global_step.numpy()))
        for writer in (self._writers or {}).values():
            writer.flush()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return self._report(history, target, time.monotonic() - started)

    def _report(self, history: dict, target: int, wall: float) -> TrainReport:
        validations = history["validations"]
        best = min(validations, key=lambda v: v["dev_loss"]) if validations else None
        stop = history["stop"] or {"rule": None, "reason": f"reached the target of {target} epochs"}
        figures = ("epoch", "dev_loss", "wer", "cer")
        return TrainReport(
            epochs_completed=int(self.state.epoch.numpy()),
            target_epochs=target,
            global_step=int(self.state.global_step.numpy()),
            steps_per_epoch=self.steps_per_epoch,
            towers=self.towers,
            batch_size_per_tower=self.per_tower_batch,
            global_batch_size=self.global_batch,
            train_losses=history["epoch_losses"],
            validations=[{k: v[k] for k in figures} for v in validations],
            best_dev=DevFigures(**{k: best[k] for k in figures}) if best else None,
            last_samples=validations[-1]["samples"] if validations else None,
            stop=StopRecord(**stop),
            skipped_batches=history["skipped_batches"],
            best_checkpoint=self.best_manager.latest_checkpoint,
            latest_checkpoint=self.manager.latest_checkpoint,
            wall_time_s_this_run=wall,
        )
