"""Multi-task training (``multitask:``): several tasks over one model, as nabu's trainers do it.

The ``Trainer`` of ``loop.py`` runs the steps, epochs, checkpoints, policy and hooks; this module gives it
what differs with several tasks:

- the model: ``pipeline.model.heads.MultiTaskModel`` (one network and a head per task, one network shared
  whole, or a network per task, as ``multitask.sharing`` says);
- the input: a batch plan and a tf.data pipeline per task, and the steps' tasks from
  ``pipeline.batches.tasks`` (``multitask.sampling``); each task's position (the batches it has drawn since
  the run began) is in every checkpoint, so a resumed run draws the very next batch of each task;
- the step: ``step.TrainingStep`` over the step's tasks (each task's weighted loss on its head or network,
  one update of what the step's tasks use), with ``training.accumulate_batches`` in the update windows
  of ``windows.py``;
- validation: every task's dev split on its head (its loss, WER and CER in the history, the report and
  TensorBoard under ``dev_<task>``), and the figures the policy reads (early stop, plateau halving,
  ``training.best_by``) as the tasks' weighted mean.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from native_client.alphabet import Labels
from pipeline.batches.dataset import SplitReader, batch_plan, epoch_batches, plan_digest, train_dataset
from pipeline.batches.tasks import epoch_tasks, steps_per_epoch, task_batches_per_epoch, tasks_digest
from pipeline.config import Config
from pipeline.evaluation.metrics import best_and_worst, corpus_rates, format_report, headline_metric
from pipeline.evaluation.run import run_split
from pipeline.features.cache import CacheIndex, damage_in
from pipeline.model.ctc import ctc_implementation
from pipeline.model.heads import MultiTaskModel
from pipeline.reports import DevFigures, TrainReport
from pipeline.train.checkpointing import TrainingError
from pipeline.train.distribute import ClusterRole
from pipeline.train.hooks import TrainHooks
from pipeline.train.loop import Trainer
from pipeline.train.step import StepResult, TrainingStep
from pipeline.train.windows import Windows, loss_factors, schedule_lengths, task_windows

log = logging.getLogger(__name__)

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


def make_task_forward(model: MultiTaskModel, index: int, blank_index: int):
    """``make_forward`` (``pipeline.evaluation.run``) for task ``index`` of a multi-task model."""
    ctc = ctc_implementation(jit_compile=False)

    @tf.function(reduce_retracing=True)
    def forward(features, lengths, labels, label_lengths):
        logits, output_lengths = model.forward(index, features, lengths, training=False)
        loss = model.family.loss(labels, label_lengths, logits, output_lengths, blank_index, ctc)
        return logits, loss, output_lengths

    return forward


class _TaskInputs:
    """Each task's distributed dataset and iterator, from its checkpointed position."""

    def __init__(self, datasets: list):
        self.datasets = datasets
        self.iterators = [iter(dataset) for dataset in datasets]

    def next_batches(self, tasks: tuple[int, ...]) -> tuple[tuple, tuple]:
        """(the next batch of each of ``tasks``, their element specs)."""
        try:
            batches = tuple(next(self.iterators[index]) for index in tasks)
        except tf.errors.OpError as error:
            raise damage_in(error) or error from None
        return batches, tuple(self.datasets[index].element_spec for index in tasks)


class MultiTaskTrainer(Trainer):
    """``Trainer`` over the ``tasks`` of a multi-task config (``multitask.tasks`` order); see the module
    docstring. ``run_dir``, ``strategy``, ``role``, ``hooks``, ``fingerprint``, ``started`` and
    ``init_digest`` as for ``Trainer``."""

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
        self.tasks = list(tasks)
        self.sampling = config.multitask.sampling
        self.factors = loss_factors([task.weight for task in self.tasks])
        self._positions = None
        self._schedule: tuple[int | None, list] = (None, [])
        first = self.tasks[0]
        super().__init__(
            config, run_dir, first.train, None, first.alphabet, strategy, role, hooks,
            fingerprint=fingerprint, started=started, init_digest=init_digest,
        )  # fmt: skip
        self._readers = [self._train_reader] + [SplitReader(task.train) for task in self.tasks[1:]]
        self._dev_readers = [SplitReader(task.dev) if task.dev is not None else None for task in self.tasks]
        self._dev_headlines = [
            headline_metric(t.dev.transcripts) if t.dev is not None else "wer" for t in tasks
        ]
        self._task_forwards = [
            make_task_forward(self.model, index, task.alphabet.blank_index)
            for index, task in enumerate(tasks)
        ]

    # -- the seams of Trainer ------------------------------------------------------------------------
    def _batch_plan(self) -> tuple[list, int, int]:
        """Each task's batch plan; steps per epoch by ``multitask.sampling``; a digest of them all."""
        max_frames = self.config.training.max_batch_frames
        plans = [batch_plan(t.train.lengths, self.global_batch, self.towers, max_frames) for t in self.tasks]
        sizes = [len(plan) for plan in plans]
        return (
            plans,
            steps_per_epoch(self.sampling, sizes),
            tasks_digest(
                self.sampling, [plan_digest(plan, self.config.training.accumulate_batches) for plan in plans]
            ),
        )

    def _build_model(self) -> MultiTaskModel:
        multitask = self.config.multitask
        return MultiTaskModel(
            self.config.model,
            multitask.sharing,
            tuple(task.name for task in self.tasks),
            self.tasks[0].train.n_input,
            tuple(task.alphabet.n_classes for task in self.tasks),
            self.config.training.precision,
        )

    def _extra_state(self) -> dict:
        """The tasks' positions: the batches each has drawn since the run began."""
        self._positions = tf.Variable(tf.zeros([len(self.tasks)], tf.int64), trainable=False, name="tasks")
        return {"task_batches": self._positions}

    def _make_step(self) -> TrainingStep:
        blanks = [task.alphabet.blank_index for task in self.tasks]
        args = (
            self.optimizer,
            self.step_optimizer,
            self.strategy,
            self.config.training,
            self.steps_per_epoch,
        )
        return TrainingStep(self.model, self.factors, blanks, *args, self._windows_of)

    def _windows_of(self, epoch: int) -> Windows:
        """The update windows of ``epoch`` (``training.accumulate_batches``), from the tasks' plans."""
        sizes = [len(plan) for plan in self.plan]
        accumulate = self.config.training.accumulate_batches
        rounds: dict[tuple[int, int], list[int]] = {}

        def batch_utterances(task: int, draw: int) -> int:
            plan = self.plan[task]
            key = (task, draw // len(plan))
            if key not in rounds:
                order = epoch_batches(plan, key[1], self._task_seed(task), accumulate)
                rounds[key] = [len(batch) for batch in order]
            return rounds[key][draw % len(plan)]

        first = [epoch * task_batches_per_epoch(self.sampling, sizes, t) for t in range(len(sizes))]
        schedule = self._epoch_tasks(epoch)
        lengths = schedule_lengths(len(schedule), accumulate)
        return task_windows(schedule, first, batch_utterances, self.factors, lengths)

    def _has_dev(self) -> bool:
        return any(task.dev is not None for task in self.tasks)

    def _batch_files(self, result: StepResult) -> list[str]:
        files = set()
        for index, per_tower in zip(result.tasks, result.indices, strict=True):
            files |= {self.tasks[index].train.paths[int(i)] for part in per_tower for i in part.numpy()}
        return sorted(files)

    def _task_seed(self, index: int) -> int:
        return self.config.training.shuffle_seed + TASK_SEED_STRIDE * index

    def _task_dataset(self, index: int, target: int):
        """Task ``index``'s distributed batches from its position to as far as epoch ``target`` reaches."""
        reader, plan, towers = self._readers[index], self.plan[index], self.towers
        rounds, start = divmod(int(self._positions[index].numpy()), len(plan))
        sizes = [len(p) for p in self.plan]
        needed = target * task_batches_per_epoch(self.sampling, sizes, index)
        end = max(rounds + 1, math.ceil(needed / len(plan)))
        augment = self.config.augment if self.config.augment.features_on else None
        seed, accumulate = self._task_seed(index), self.config.training.accumulate_batches

        def dataset_fn(context: tf.distribute.InputContext):
            local = context.num_replicas_in_sync // context.num_input_pipelines
            offset = context.input_pipeline_id * local
            return train_dataset(
                reader, plan, towers, offset, local, rounds, start, end, seed, augment, accumulate
            )

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def _train_inputs(self, target: int) -> _TaskInputs:
        self._check_positions()
        return _TaskInputs([self._task_dataset(index, target) for index in range(len(self.tasks))])

    def _epoch_tasks(self, epoch: int) -> list[tuple[int, ...]]:
        sizes = [len(plan) for plan in self.plan]
        if self._schedule[0] != epoch:
            self._schedule = (
                epoch,
                epoch_tasks(self.sampling, sizes, epoch, self.config.training.shuffle_seed),
            )
        return self._schedule[1]

    def _check_positions(self) -> None:
        """The tasks' checkpointed positions must be where the run's position (epoch, step) puts them: else
        the checkpoint is not of this run's plan (TrainingError)."""
        epoch, step = int(self.state.epoch.numpy()), int(self.state.step_in_epoch.numpy())
        sizes = [len(plan) for plan in self.plan]
        expected = np.array(
            [epoch * task_batches_per_epoch(self.sampling, sizes, i) for i in range(len(sizes))]
        )
        for tasks in self._epoch_tasks(epoch)[:step]:
            expected[list(tasks)] += 1
        stored = self._positions.numpy()
        if not np.array_equal(stored, expected):
            raise TrainingError(
                f"{self.run.checkpoints}: the tasks' positions in the checkpoint ({stored.tolist()} batches) "
                f"are not where epoch {epoch + 1}, step {step} puts them ({expected.tolist()}): the "
                f"checkpoint is of another batch plan; delete the run (make rerun STAGE=Train) to start again"
            )

    def _step(self, inputs: _TaskInputs, vote: float) -> StepResult:
        tasks = self._epoch_tasks(int(self.state.epoch.numpy()))[int(self.state.step_in_epoch.numpy())]
        batches, specs = inputs.next_batches(tasks)
        result = self._train_step(tasks, batches, specs, vote=vote)
        drawn = np.isin(np.arange(len(self.tasks)), tasks).astype(np.int64)
        self._positions.assign_add(tf.constant(drawn))
        return result

    # -- validation and the report ---------------------------------------------------------------------
    def validate(self, epoch: int) -> tuple[DevFigures, dict]:
        """Every task's dev figures on its head (logged, and under ``dev_<task>`` in TensorBoard) and the
        run's: their weighted mean (tasks without a dev split left out); the samples by task."""
        figures, samples, weights = {}, {}, []
        step = int(self.state.global_step.numpy())
        for index, task in enumerate(self.tasks):
            if task.dev is None:
                continue
            results = run_split(
                None,
                task.dev,
                task.alphabet,
                self.config.training.dev_batch_size,
                self._task_forwards[index],
                reader=self._dev_readers[index],
                max_batch_frames=self.config.training.max_batch_frames,
            )
            rates = corpus_rates(results, self._dev_headlines[index])
            samples[task.name] = best_and_worst(results, self.config.training.report_count, rates["headline"])
            log.info(
                "%s",
                format_report(
                    f"Validation of task {task.name} after epoch {epoch}", rates, samples[task.name]
                ),
            )
            figures[task.name] = {"dev_loss": rates["loss"], "wer": rates["wer"], "cer": rates["cer"]}
            weights.append(task.weight)
            with self._writer(f"dev_{task.name}").as_default(step=step):
                for key, value in figures[task.name].items():
                    tf.summary.scalar("loss" if key == "dev_loss" else key, value)
        total = sum(weights)

        def mean(key: str) -> float:
            return sum(w * f[key] for w, f in zip(weights, figures.values(), strict=True)) / total

        combined = DevFigures(
            epoch=epoch, dev_loss=mean("dev_loss"), wer=mean("wer"), cer=mean("cer"), tasks=figures
        )
        log.info(
            "Validation after epoch %d, the tasks' weighted mean: loss %.4f, WER %.4f, CER %.4f",
            epoch,
            combined.dev_loss,
            combined.wer,
            combined.cer,
        )
        return combined, samples

    def _report(self, target: int, wall_this_run: float) -> TrainReport:
        report = super()._report(target, wall_this_run)
        positions = self._positions.numpy()
        tasks = [
            {
                "name": task.name,
                "weight": task.weight,
                "loss_factor": self.factors[index],
                "train_samples": len(task.train),
                "train_audio_hours": float(task.train.durations.sum()) / 3600,
                "batches_per_round": len(self.plan[index]),
                "batches_drawn": int(positions[index]),
            }
            for index, task in enumerate(self.tasks)
        ]
        return dataclasses.replace(
            report,
            train_samples=sum(t["train_samples"] for t in tasks),
            train_audio_hours=sum(t["train_audio_hours"] for t in tasks),
            tasks=tasks,
        )
