"""The Train task."""

from __future__ import annotations

import time

import luigi

from pipeline.reports import TrainReport, read_report
from pipeline.train.epochs import training_done
from pipeline.train.hooks import StepInfo, ValidationInfo
from tasks.base import ConfigTask, Progress


class Train(ConfigTask):
    """Train the acoustic model; output: the run directory's ``train_report.json`` (checkpoints beside it).

    Complete only when the report exists and covers the configured epochs
    (``pipeline.train.epochs``' rule), so a killed run resumes from its checkpoints
    when asked again, and raising ``training.epochs`` (or a new "-N more") continues
    the same run. Without ``data.dev_files`` it needs no dev features and trains
    without validation.
    """

    stage = "train"
    needs_tensorflow = True

    def output(self):
        return luigi.LocalTarget(str(self.layout.train_run.report))

    def stage_complete(self):
        report = self.layout.train_run.report
        return report.is_file() and training_done(self.cfg.training.epochs, read_report(report, TrainReport))

    def run_stage(self):
        from pipeline.stages.train_launch import train_launch_stage

        message = train_launch_stage(
            self.layout,
            on_message=lambda text: self.tell_scheduler(message=text),
            progress=lambda: _TrainProgress(self),
        )
        self.tell_scheduler(percent=100)
        self.tell_scheduler(message=message)


class _TrainProgress(Progress):
    """Train's progress: percent of all target steps; epoch, step, loss, last dev WER and ETA."""

    def __init__(self, task):
        super().__init__(task, total=1, unit="step", description="train")
        self.first_done = None
        self.started = time.monotonic()
        self.dev_wer = None

    def on_step(self, info: StepInfo) -> None:
        """TrainHooks.on_step: the bar and the scheduler's message."""
        total = info.target_epochs * info.steps_per_epoch
        done = info.epoch * info.steps_per_epoch + info.step_in_epoch
        if self.first_done is None:
            self.first_done, self.started = done - 1, time.monotonic()
        self.bar.total = total
        rate = (done - self.first_done) / max(time.monotonic() - self.started, 1e-6)
        wer = f", dev WER {self.dev_wer:.3f}" if self.dev_wer is not None else ""
        self.update(
            done,
            f"epoch {info.epoch + 1}/{info.target_epochs}, step {info.step}, "
            f"loss {info.loss:.2f}{wer}, ETA {(total - done) / max(rate, 1e-6) / 60:.1f} min",
        )

    def on_validation(self, info: ValidationInfo) -> None:
        """TrainHooks.on_validation."""
        self.dev_wer = info.wer
