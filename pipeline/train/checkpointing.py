"""A Train run's checkpoints: what one holds, saving, restoring with fallback, the batch-plan check, and
multi-worker agreement on where to resume; the run directory's leftovers and checkpoints found on disk.

Position is kept in the checkpoint (global step, epoch, step inside the epoch,
the epoch target and the ``training.epochs`` it came from) together with the
run's history, the weights, the optimizer and the dropout RNG state, so a
resumed run is bit-identical. The checkpoint also records the towers, global
batch and a digest of the batch plan the position refers to: a run resumed
mid-epoch on another plan (other devices) is refused, one resumed at an epoch
boundary warned.

Multi-worker runs save together (the loop decides when, ``pipeline.train.loop``);
on restart the chief restores its latest checkpoint and every other worker that
same one (from the chief's directory on a shared work directory, else its own
scratch copy), or every worker stops with one line.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow as tf

from native_client.alphabet import Labels
from pipeline.config import Config
from pipeline.files import remove_leftovers
from pipeline.model.checkpoints import check_geometry, check_init_from, warm_start
from pipeline.model.weights import named_weights, rng_states
from pipeline.train.distribute import ClusterRole, sum_over_workers
from pipeline.train.epochs import RunRecord
from pipeline.train.history import HistoryState, TrainHistory
from pipeline.workdir import BEST_PREFIX, CHECKPOINT_PREFIX, LEFTOVER_PATTERNS, TrainRun

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on (too many non-finite batches, bad batch geometry, no intact checkpoint, ...)."""


def _counter(dtype=tf.int64, value=0):
    return field(default_factory=lambda: tf.Variable(value, dtype=dtype, trainable=False))


@dataclass
class TrainState:
    """Training position, saved in every checkpoint. ``epochs_setting`` is the ``training.epochs`` the
    target came from (0: not recorded, a checkpoint from before it was). ``towers``, ``global_batch`` and
    ``plan_digest`` describe the batch plan the position counts in (0: not recorded). ``updates`` counts
    optimizer updates (the learning-rate schedule's step; the global step without
    ``training.accumulate_batches``); -1 until set: a checkpoint from before it was recorded lacks it.
    ``deterministic_ops``: 1 while every session that trained had TensorFlow's op determinism on, 0 once
    one did not, -1 not recorded (a run not trained yet, or resumed from a checkpoint from before)."""

    global_step: tf.Variable = _counter()
    updates: tf.Variable = _counter(value=-1)
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
    deterministic_ops: tf.Variable = _counter(value=-1)

    def variables(self) -> dict:
        """{checkpoint name: variable}."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class BatchPlan:
    """The batch plan a run's position counts in: its towers, per-tower and global batch, and digest."""

    towers: int
    per_tower_batch: int
    global_batch: int
    digest: int


def remove_checkpoint_leftovers(run: TrainRun) -> list[Path]:
    """Remove what a killed run left in ``run``: the ``<prefix>_temp`` directories of an interrupted
    checkpoint write (TensorFlow writes there, then renames) and temporary files; returns what was removed."""
    removed = remove_leftovers(run.root, LEFTOVER_PATTERNS)
    for directory in (run.checkpoints, run.best, run.epoch_ends):
        for leftover in directory.glob("*_temp*") if directory.is_dir() else ():
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(
                missing_ok=True
            )
            removed.append(leftover)
    if removed:
        log.info(
            "Removed %d leftovers of an interrupted checkpoint write: %s",
            len(removed),
            ", ".join(str(p) for p in removed),
        )
    return removed


def checkpoints_on_disk(directory: Path) -> list[str]:
    """Checkpoint prefixes found by their index files, newest first: what a run can still resume from
    when TensorFlow's ``checkpoint`` state file is missing or damaged (TensorFlow then lists none)."""
    found = []
    for index in Path(directory).glob(f"{CHECKPOINT_PREFIX}-*.index"):
        number = index.name[len(CHECKPOINT_PREFIX) + 1 : -len(".index")]
        if number.isdigit():
            found.append((int(number), str(index.with_suffix(""))))
    if found:
        log.warning(
            "%s: the checkpoint state file lists no checkpoint; resuming from the %d found on disk",
            directory,
            len(found),
        )
    return [prefix for _, prefix in sorted(found, reverse=True)]


class RunCheckpoints:
    """The checkpoints of one Train run, as one process of it sees them.

    ``run`` is the chief's run directory; a worker other than the chief saves into
    its scratch copy (``TrainRun.worker_scratch``), as MultiWorkerMirroredStrategy
    makes every worker save. ``tracked`` holds what a checkpoint saves besides the
    model's weights and RNG state, the position and the history (the optimizer,
    the loss scale). ``init_digest``: what ``training.init_from`` held when the run
    was scheduled (``Layout.init_from_digest``), checked when the warm start reads it.
    """

    def __init__(
        self,
        config: Config,
        run: TrainRun,
        model,
        alphabet: Labels,
        strategy: tf.distribute.Strategy,
        role: ClusterRole,
        tracked: dict,
        init_digest: str | None = None,
    ):
        self.config = config
        self.init_digest = init_digest
        self.run = run
        self.model = model
        self.alphabet = alphabet
        self.strategy = strategy
        self.role = role
        self.writes = run if role.is_chief else run.worker_scratch(role.index)
        self.state = TrainState()
        self.history_state = HistoryState()
        self.resumed = False
        self.checkpoint = tf.train.Checkpoint(
            weights=named_weights(model),
            rng=rng_states(model),
            **tracked,
            history=self.history_state,
            **self.state.variables(),
        )
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            str(self.writes.checkpoints),
            max_to_keep=config.training.max_to_keep,
            checkpoint_name=CHECKPOINT_PREFIX,
        )
        self.best_manager = tf.train.CheckpointManager(
            self.checkpoint, str(self.writes.best), max_to_keep=1, checkpoint_name=BEST_PREFIX
        )
        if role.is_chief:
            remove_checkpoint_leftovers(run)

    @property
    def history(self) -> TrainHistory:
        """The run's record (restored with the checkpoint, saved with every checkpoint)."""
        return self.history_state.history

    @property
    def scratch(self) -> Path | None:
        """This worker's scratch directory (None on the chief), removed when a run ends."""
        return None if self.role.is_chief else self.writes.root

    def step(self) -> int:
        """The global step of the current position."""
        return int(self.state.global_step.numpy())

    # -- saving --------------------------------------------------------------------------------
    def save(self) -> None:
        """Write a checkpoint of everything (the history is serialised only here, never per step)."""
        saved = self.manager.save(checkpoint_number=self.step())
        log.info(
            "Saved %s: epoch %d, step %d (%d of this epoch)",
            saved,
            int(self.state.epoch.numpy()),
            self.step(),
            int(self.state.step_in_epoch.numpy()),
        )

    def save_best(self) -> None:
        """Write the current position as the best-dev checkpoint."""
        self.best_manager.save(checkpoint_number=self.step())

    def ensure_best(self) -> None:
        """Make the last checkpoint the best-dev one when no validation has told better: no dev split,
        validation off, or no finite dev loss (and ``training.best_by`` figure) yet. With several workers the
        chief decides: another's scratch copy may be gone (a rerun), and a save is taken together."""
        latest = self.best_manager.latest_checkpoint
        told = latest and self.history.best(self.config.training.best_by) is not None
        wanted = not told and (latest is None or not latest.endswith(f"-{self.step()}"))
        if self.role.count > 1:
            wanted = self._sum_over_workers(int(wanted) if self.role.is_chief else 0) > 0
        if wanted:
            self.save_best()

    # -- restoring -----------------------------------------------------------------------------
    def restore(self) -> str | None:
        """Restore the latest checkpoint (or warm-start from ``training.init_from``); returns what was loaded.

        A damaged checkpoint (unreadable data, a malformed history) is skipped with a warning for the one
        before it; ``resumed`` says whether a checkpoint of this run was restored. In a multi-worker run
        every worker restores the checkpoint the chief chose (``_restore_agreed``).
        """
        self.resumed = False
        loaded = self._restore_agreed() if self.role.count > 1 else self._restore_latest()
        if int(self.state.updates.numpy()) < 0:
            # A new run, or a checkpoint from before updates were counted (one update per step then).
            self.state.updates.assign(self.state.global_step)
        return loaded

    def _restore_prefix(self, prefix: str, directory: Path) -> None:
        """Restore checkpoint ``prefix`` (of ``directory``, named in errors) and log where training stands."""
        check_geometry(prefix, self.model, directory)
        self.checkpoint.restore(prefix).expect_partial()
        self.resumed = True
        log.info(
            "Restored %s: epoch %d, step %d (%d of this epoch)",
            prefix,
            int(self.state.epoch.numpy()),
            self.step(),
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
        """Copy the weights of ``training.init_from`` when it is set; returns it (None when unset). Its
        files are checked against ``init_digest`` before and after they are read: the run's fingerprint
        holds that digest, and a run still training there may have saved since (InitFromChanged)."""
        training = self.config.training
        if not training.init_from:
            return None
        if self.init_digest is not None:
            check_init_from(training.init_from, self.init_digest)
        copied = warm_start(
            self.model, training.init_from, training.drop_source_layers, self.config, self.alphabet
        )
        if self.init_digest is not None:
            check_init_from(training.init_from, self.init_digest)
        log.info(
            "Warm start from %s: %d weights copied, %d last layers fresh",
            training.init_from,
            len(copied),
            training.drop_source_layers,
        )
        return training.init_from

    def _sum_over_workers(self, value: int) -> int:
        """``value`` summed over the workers of a multi-worker run (``sum_over_workers``): one collective
        operation, which every worker must reach."""
        return int(round(sum_over_workers(self.strategy, self.role.count, [value])[0]))

    def _restore_agreed(self) -> str | None:
        """Multi-worker restore: the chief restores its latest intact checkpoint (``_restore_latest``) and
        every other worker the checkpoint of that same step, so that all resume at one position with one
        model. A non-chief reads it from the chief's directory when it can (a shared work directory), else
        from its own scratch directory (saves happen at the same steps everywhere). When any worker cannot,
        every worker raises TrainingError with the same line."""
        loaded = self._restore_latest() if self.role.is_chief else None
        chief_step = self.step() if self.resumed else -1
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

    # -- what the restored position says -------------------------------------------------------
    def check_plan(self, plan: BatchPlan) -> None:
        """Compare the restored position's batch plan (towers, global batch, plan digest in the checkpoint)
        with this run's, then record this run's. Mid-epoch on another plan the position would skip or
        repeat batches: TrainingError. At an epoch boundary the next epoch starts on the new plan: a
        warning. A checkpoint from before these were recorded is taken as it is."""
        state = self.state
        old_digest, old_towers, old_global = (
            int(v.numpy()) for v in (state.plan_digest, state.towers, state.global_batch)
        )
        epoch, step = int(state.epoch.numpy()), int(state.step_in_epoch.numpy())
        if self.resumed and old_digest and old_digest != plan.digest:
            was = f"{old_towers} towers x {old_global // max(old_towers, 1)} = global batch {old_global}"
            now = f"{plan.towers} towers x {plan.per_tower_batch} = global batch {plan.global_batch}"
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
        state.plan_digest.assign(plan.digest)
        state.towers.assign(plan.towers)
        state.global_batch.assign(plan.global_batch)

    def last_run(self) -> RunRecord | None:
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

    def plan_record(self) -> tuple[int, int, int]:
        """(target epochs, epochs setting, finished): what a save records about the run's plan."""
        return tuple(
            int(v.numpy()) for v in (self.state.target_epochs, self.state.epochs_setting, self.state.finished)
        )
