"""Validation during training: every task's dev split through its part of the model, as after an epoch.

The figures the policy reads (early stop, plateau halving, ``training.best_by``) are a single-task run's
own, or a multi-task run's tasks' weighted mean (tasks without a dev split left out), each task's loss,
WER and CER also in the history, the report and TensorBoard (under ``dev_<task>``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf

from pipeline.batches.buckets import shape_grid
from pipeline.batches.dataset import SplitReader
from pipeline.config import Config
from pipeline.evaluation.metrics import best_and_worst, corpus_rates, format_report, headline_metric
from pipeline.evaluation.run import make_forward, run_split
from pipeline.reports import DevFigures
from pipeline.train.joint_plans import checked_eval_cap
from pipeline.train.tasks import TaskData

log = logging.getLogger(__name__)


def task_forward(view, index: int, blank_index: int):
    """``make_forward`` (``pipeline.evaluation.run``) for task ``index`` of a model's task view
    (``pipeline.model.heads.task_model``)."""

    def run(features, lengths):
        return view.forward(index, features, lengths, training=False)

    return make_forward(run, view.task_objective(index), blank_index, view.objective_head(index))


class TaskValidation:
    """Validates ``tasks`` through the model's task ``view``; ``writer(name)`` is the summary writer of a
    TensorBoard run (a task's: ``dev_<task>``)."""

    def __init__(self, config: Config, tasks: list[TaskData], view, writer: Callable[[str], object]):
        self.config, self.tasks, self.writer = config, tasks, writer
        self.forwards = [task_forward(view, i, t.alphabet.blank_index) for i, t in enumerate(tasks)]
        growth = config.training.bucket_growth
        self.readers = [
            SplitReader(t.dev, shape_grid(t.dev, growth)) if t.dev is not None else None for t in tasks
        ]
        # a dev utterance a transducer cannot score: refused before any step
        self.joints = [
            checked_eval_cap(t.config(config), t.dev, reader.grid, t.alphabet.n_classes)
            if t.dev is not None
            else None
            for t, reader in zip(tasks, self.readers, strict=True)
        ]
        self.headlines = [headline_metric(t.dev.transcripts) if t.dev is not None else "wer" for t in tasks]

    @property
    def has_dev(self) -> bool:
        """Whether any task has a dev split."""
        return any(task.dev is not None for task in self.tasks)

    def __call__(self, epoch: int, step: int) -> tuple[DevFigures, dict]:
        """The dev figures of the current weights, as after epoch ``epoch`` (global step ``step``), and the
        best and worst samples (by task with several)."""
        if not self.config.tasks:
            rates, samples = self._task(0, f"Validation after epoch {epoch}")
            return DevFigures(
                epoch=epoch, dev_loss=rates["loss"], wer=rates["wer"], cer=rates["cer"]
            ), samples
        figures, samples, weights = {}, {}, []
        for index, task in enumerate(self.tasks):
            if task.dev is None:
                continue
            rates, samples[task.name] = self._task(
                index, f"Validation of task {task.name} after epoch {epoch}"
            )
            figures[task.name] = {"dev_loss": rates["loss"], "wer": rates["wer"], "cer": rates["cer"]}
            weights.append(task.weight)
            with self.writer(f"dev_{task.name}").as_default(step=step):
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

    def _task(self, index: int, title: str) -> tuple[dict, dict]:
        """(the rates, the best and worst samples) of task ``index``'s dev split, logged under ``title``."""
        task, training = self.tasks[index], self.config.training
        results = run_split(
            None,
            task.dev,
            task.alphabet,
            training.dev_batch_size,
            self.forwards[index],
            reader=self.readers[index],
            max_batch_frames=training.max_batch_frames,
            joint=self.joints[index],
        )
        rates = corpus_rates(results, self.headlines[index])
        samples = best_and_worst(results, training.report_count, rates["headline"])
        log.info("%s", format_report(title, rates, samples))
        return rates, samples
