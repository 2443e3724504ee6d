"""The tasks a run trains, and their input: one task, or several over one model (``multitask:``, as nabu's
trainers do it). The ``Trainer`` of ``loop.py`` trains a list of tasks; a single-task config is the list
of one (a multi-task config of one task stays multi-task: heads, positions and all).

- The model: ``task_model``, the family's model for one task, ``pipeline.model.heads.MultiTaskModel``
  for several (one network and a head per task, one network shared whole, or a network per task, as
  ``multitask.sharing`` says).
- The input (``TaskInputs``): a batch plan and a tf.data pipeline per task, and the steps' tasks from
  ``pipeline.batches.tasks`` (``multitask.sampling``). Each task's position (the batches it has drawn
  since the run began) is in every checkpoint of several tasks, so a resumed run draws the very next batch
  of each; with one task it is the run's own position (epoch, step).
- The update windows of ``training.accumulate_batches`` (``windows.py``): one task's are its plan's
  windows, several tasks' are cut from the epoch's task schedule.

A single-task config keeps what it had before there were several tasks (the family's model without
heads, its plan's windows, no positions in the checkpoint), so its checkpoints, batch order and figures
are unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from native_client.alphabet import Labels
from pipeline.batches.dataset import SplitReader, batch_plan, epoch_batches, plan_digest, train_dataset
from pipeline.batches.tasks import epoch_tasks, steps_per_epoch, task_batches_per_epoch, tasks_digest
from pipeline.config import Config
from pipeline.features.cache import CacheIndex, damage_in
from pipeline.model import build_model
from pipeline.model.heads import MultiTaskModel
from pipeline.train.checkpointing import TrainingError
from pipeline.train.step import OneTask, StepResult
from pipeline.train.windows import Windows, loss_factors, plan_windows, schedule_lengths, task_windows

# Seeds of the tasks' batch orders: task i goes round its plan in the order of shuffle_seed + i * this.
TASK_SEED_STRIDE = 1_000_003


@dataclass(frozen=True)
class TaskData:
    """One task as the trainer reads it: its name and loss weight, its cached train and dev splits (dev
    None: the task is not validated) and its labels."""

    name: str
    weight: float
    train: CacheIndex
    dev: CacheIndex | None
    alphabet: Labels

    @classmethod
    def only(cls, train: CacheIndex, dev: CacheIndex | None, alphabet: Labels) -> TaskData:
        """The task of a single-task run."""
        return cls("", 1.0, train, dev, alphabet)


def task_model(config: Config, tasks: list[TaskData]) -> tuple[keras.Model, object]:
    """(the Keras model of ``tasks``, built in the caller's strategy scope; its view for the step and the
    dev forward passes: ``forward(index, ...)``, ``task_variables``, ``family``, ``objective``)."""
    precision, n_input = config.training.precision, tasks[0].train.n_input
    if not config.tasks:
        model = build_model(config.model, n_input, tasks[0].alphabet.n_classes, precision)
        return model, OneTask(model)
    names, classes = tuple(t.name for t in tasks), tuple(t.alphabet.n_classes for t in tasks)
    model = MultiTaskModel(config.model, config.multitask.sharing, names, n_input, classes, precision)
    return model, model


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


class TaskInputs:
    """The batch plans, update windows and distributed batches of ``tasks`` (see the module docstring), for
    the replicas of ``strategy`` at a global batch of ``global_batch``; ``factors``, the tasks' loss
    factors."""

    def __init__(
        self, config: Config, tasks: list[TaskData], strategy: tf.distribute.Strategy, global_batch: int
    ):
        self.config, self.tasks, self.strategy = config, tasks, strategy
        self.several = bool(config.tasks)
        self.factors = loss_factors([task.weight for task in tasks])
        self.towers = strategy.num_replicas_in_sync
        self.sampling = config.multitask.sampling
        training = config.training
        self.plans = [
            batch_plan(t.train.lengths, global_batch, self.towers, training.max_batch_frames) for t in tasks
        ]
        self.sizes = [len(plan) for plan in self.plans]
        self.steps_per_epoch = steps_per_epoch(self.sampling, self.sizes)
        digests = [plan_digest(plan, training.accumulate_batches) for plan in self.plans]
        self.digest = tasks_digest(self.sampling, digests) if self.several else digests[0]
        self.readers = [SplitReader(task.train) for task in tasks]
        self.positions = tf.Variable(tf.zeros([len(tasks)], tf.int64), trainable=False, name="tasks")
        self._schedule: tuple[int | None, list] = (None, [])
        self._datasets: list = []
        self._iterators: list = []

    def checkpointed(self) -> dict:
        """What a checkpoint keeps of the input: several tasks' positions (one task's is the run's)."""
        return {"task_batches": self.positions} if self.several else {}

    def seed(self, index: int) -> int:
        """The shuffle seed of task ``index``'s batch order."""
        return self.config.training.shuffle_seed + TASK_SEED_STRIDE * index

    def epoch_tasks(self, epoch: int) -> list[tuple[int, ...]]:
        """The tasks of each step of ``epoch``."""
        if self._schedule[0] != epoch:
            tasks = epoch_tasks(self.sampling, self.sizes, epoch, self.config.training.shuffle_seed)
            self._schedule = (epoch, tasks)
        return self._schedule[1]

    def windows_of(self, epoch: int) -> Windows:
        """The update windows of ``epoch`` (``training.accumulate_batches``)."""
        training = self.config.training
        accumulate = training.accumulate_batches
        if not self.several:
            return plan_windows(self.plans[0], epoch, training.shuffle_seed, accumulate)
        rounds: dict[tuple[int, int], list[int]] = {}

        def batch_utterances(task: int, draw: int) -> int:
            plan = self.plans[task]
            key = (task, draw // len(plan))
            if key not in rounds:
                order = epoch_batches(plan, key[1], self.seed(task), accumulate)
                rounds[key] = [len(batch) for batch in order]
            return rounds[key][draw % len(plan)]

        first = [epoch * self._per_epoch(t) for t in range(len(self.tasks))]
        schedule = self.epoch_tasks(epoch)
        lengths = schedule_lengths(len(schedule), accumulate)
        return task_windows(schedule, first, batch_utterances, self.factors, lengths)

    def _per_epoch(self, index: int) -> int:
        return task_batches_per_epoch(self.sampling, self.sizes, index)

    def start(self, epoch: int, step: int, target: int, where: str) -> None:
        """Open every task's batches from the run's position (``step`` of ``epoch``) to as far as epoch
        ``target`` reaches. Several tasks' checkpointed positions must be where that position puts them,
        else the checkpoint (``where``) is of another plan (TrainingError)."""
        expected = np.array([epoch * self._per_epoch(i) for i in range(len(self.tasks))])
        for tasks in self.epoch_tasks(epoch)[:step]:
            expected[list(tasks)] += 1
        stored = self.positions.numpy()
        if not self.several:  # one task's position is the run's
            self.positions.assign(expected)
        elif not np.array_equal(stored, expected):
            raise TrainingError(
                f"{where}: the tasks' positions in the checkpoint ({stored.tolist()} batches) are not where "
                f"epoch {epoch + 1}, step {step} puts them ({expected.tolist()}): the checkpoint is of "
                f"another batch plan; delete the run (make rerun STAGE=Train) to start again"
            )
        self._datasets = [self._dataset(index, target) for index in range(len(self.tasks))]
        self._iterators = [iter(dataset) for dataset in self._datasets]

    def _dataset(self, index: int, target: int):
        """Task ``index``'s distributed batches from its position to as far as epoch ``target`` reaches."""
        reader, plan, towers = self.readers[index], self.plans[index], self.towers
        rounds, start = divmod(int(self.positions[index].numpy()), len(plan))
        # Through the round that holds draw target * per-epoch - 1; nothing when none is left to draw.
        end = max(rounds + (start > 0), math.ceil(target * self._per_epoch(index) / len(plan)))
        augment = self.config.augment if self.config.augment.features_on else None
        seed, accumulate = self.seed(index), self.config.training.accumulate_batches

        def dataset_fn(context: tf.distribute.InputContext):
            local = context.num_replicas_in_sync // context.num_input_pipelines
            offset = context.input_pipeline_id * local
            return train_dataset(
                reader, plan, towers, offset, local, rounds, start, end, seed, augment, accumulate
            )

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def next_batches(self, epoch: int, step: int) -> tuple[tuple[int, ...], tuple, tuple]:
        """(the tasks of ``step`` of ``epoch``, the next batch of each, their element specs)."""
        tasks = self.epoch_tasks(epoch)[step]
        try:
            batches = tuple(next(self._iterators[index]) for index in tasks)
        except tf.errors.OpError as error:
            raise damage_in(error) or error from None
        return tasks, batches, tuple(self._datasets[index].element_spec for index in tasks)

    def drawn(self, tasks: tuple[int, ...]) -> None:
        """A step over ``tasks`` is done: their positions move on (one task's is the run's own step count,
        which the loop keeps: nothing to add on every step)."""
        if self.several:
            self.positions.assign_add(
                tf.constant(np.isin(np.arange(len(self.tasks)), tasks).astype(np.int64))
            )

    def batch_files(self, result: StepResult) -> list[str]:
        """The audio files of a step's batches (named when they are skipped)."""
        files = set()
        for index, per_tower in zip(result.tasks, result.indices, strict=True):
            files |= {self.tasks[index].train.paths[int(i)] for part in per_tower for i in part.numpy()}
        return sorted(files)
