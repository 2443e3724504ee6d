"""The tasks a run trains, their input and their update windows: one task, or several over one model
(``multitask:``, as nabu's trainers do it). A single-task config is the list of one, with the family's
model without heads (``OneTask``), its plan's windows and no positions in its checkpoints.

- ``TaskInputs``: a batch plan and a tf.data pipeline per task, and the steps' tasks
  (``pipeline.batches.tasks``, ``multitask.sampling``). Several tasks' positions (batches drawn) are
  checkpointed, so a resumed run draws the very next batch of each.
- ``Windows`` (``training.accumulate_batches``): N consecutive steps whose gradient is that of one step over
  all of their batches: in a window of N steps that each draw m tasks, task t's batch adds
  ``factor_t * k_t / (N * m * U_t)`` times its summed loss (k_t: the window's steps that drew t; U_t: its
  utterances in the window). One task's windows are its plan's (``epoch_windows``), several tasks' are
  cut from the epoch's task schedule; a window never spans two epochs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from native_client.alphabet import Labels
from native_client.cmvn import GlobalStats
from pipeline.batches.buckets import shape_grid
from pipeline.batches.dataset import (
    SplitReader,
    batch_plan,
    epoch_batches,
    epoch_windows,
    plan_digest,
    train_dataset,
)
from pipeline.batches.tasks import epoch_tasks, steps_per_epoch, task_batches_per_epoch, tasks_digest
from pipeline.config import Config
from pipeline.features.cache import CacheIndex, damage_in
from pipeline.train.checkpointing import TrainingError
from pipeline.train.joint_plans import joint_cap, planned

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

    def config(self, config: Config) -> Config:
        """The task's view of the run's ``config`` (its own model keys: its objective), or ``config`` itself
        for a single-task run."""
        return config.task_view(self.name) if self.name else config

    @classmethod
    def only(cls, train: CacheIndex, dev: CacheIndex | None, alphabet: Labels) -> TaskData:
        """The task of a single-task run."""
        return cls("", 1.0, train, dev, alphabet)


@dataclass(frozen=True)
class Windows:
    """The update windows of one epoch. For each step (in order): the loss coefficient of each of its
    tasks' batches (in the step's task order), its share of its window's loss (a window's shares sum to 1:
    what is left when a step is skipped); and the steps after which a window ends (counted from 1)."""

    coefficients: tuple[tuple[float, ...], ...]
    shares: tuple[float, ...]
    ends: frozenset[int]


def task_windows(
    schedule: Sequence[tuple[int, ...]],
    first_draws: Sequence[int],
    batch_utterances: Callable[[int, int], int],
    factors: Sequence[float],
    lengths: Sequence[int],
) -> Windows:
    """The windows of an epoch whose steps draw the tasks of ``schedule``, cut into windows of
    ``lengths`` steps; each task starts at its draw ``first_draws[t]``, ``batch_utterances(t, d)`` is the
    utterance count of task t's draw d, ``factors`` the tasks' loss factors."""
    draws = list(first_draws)
    coefficients, shares, ends, start = [], [], set(), 0
    for length in lengths:
        steps = schedule[start : start + length]
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
        start += length
        ends.add(start)
    return Windows(tuple(coefficients), tuple(shares), frozenset(ends))


def schedule_lengths(steps: int, accumulate: int) -> list[int]:
    """A multi-task epoch of ``steps`` steps cut into windows of ``accumulate`` (the last may be shorter)."""
    return [min(accumulate, steps - start) for start in range(0, steps, accumulate)]


def plan_windows(plan: list[np.ndarray], epoch: int, seed: int, accumulate: int) -> Windows:
    """The windows of a single-task epoch over ``plan``, in the order ``epoch_windows`` gives it."""
    windows = epoch_windows(len(plan), epoch, seed, accumulate)
    order = [i for window in windows for i in window]
    return task_windows(
        [(0,)] * len(order), [0], lambda _, draw: len(plan[order[draw]]), [1.0], [len(w) for w in windows]
    )


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
        mean_weight = sum(task.weight for task in tasks) / len(tasks)
        self.factors = [task.weight / mean_weight for task in tasks]  # the tasks' loss factors
        self.towers = strategy.num_replicas_in_sync
        self.sampling = config.multitask.sampling
        training = config.training
        grids = [shape_grid(t.train, training.bucket_growth) for t in tasks]
        self.plans = [
            planned(
                t.train,
                batch_plan,
                t.train.lengths,
                global_batch,
                self.towers,
                training.max_batch_frames,
                grid,
                joint_cap(t.config(config), t.train, grid, t.alphabet.n_classes),
            )
            for t, grid in zip(tasks, grids, strict=True)
        ]
        self.sizes = [len(plan) for plan in self.plans]
        self.steps_per_epoch = steps_per_epoch(self.sampling, self.sizes)
        digests = [plan_digest(plan, training.accumulate_batches) for plan in self.plans]
        self.digest = tasks_digest(self.sampling, digests) if self.several else digests[0]
        self.readers = [SplitReader(task.train, grid) for task, grid in zip(tasks, grids, strict=True)]
        self.positions = tf.Variable(tf.zeros([len(tasks)], tf.int64), trainable=False, name="tasks")
        self._schedule: tuple[int | None, list] = (None, [])
        self._datasets, self._iterators = [], []

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

    def start(self, epoch: int, step: int, target: int, where: str, stats: GlobalStats | None = None) -> None:
        """Open every task's batches from the run's position (``step`` of ``epoch``) to as far as epoch
        ``target`` reaches; ``stats``: what the model normalises with (``features.normalize: global``),
        the scale of the augmentation. Several tasks' checkpointed positions must be where that position
        puts them, else the checkpoint (``where``) is of another plan (TrainingError)."""
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
        self._datasets = [self._dataset(index, target, stats) for index in range(len(self.tasks))]
        self._iterators = [iter(dataset) for dataset in self._datasets]

    def _dataset(self, index: int, target: int, stats: GlobalStats | None):
        """Task ``index``'s distributed batches from its position to as far as epoch ``target`` reaches,
        augmented in the scale of ``stats`` (``start``)."""
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
                reader, plan, towers, offset, local, rounds, start, end, seed, augment, accumulate, stats
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

    def batch_files(self, tasks: tuple[int, ...], indices) -> list[str]:
        """The audio files of a step's batches (``StepResult.tasks`` and ``indices``), named when skipped."""
        files = set()
        for index, per_tower in zip(tasks, indices, strict=True):
            files |= {self.tasks[index].train.paths[int(i)] for part in per_tower for i in part.numpy()}
        return sorted(files)
