"""The Train task."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

import luigi

from pipeline.reports import TrainReport, read_report
from pipeline.train.epochs import training_done
from pipeline.train.hooks import StepInfo, ValidationInfo
from tasks.base import ConfigTask, Progress

log = logging.getLogger("luigi-interface")


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

    def stage_paths(self):
        return [self.layout.train_run.root]

    def stage_complete(self):
        report = self.layout.train_run.report
        return report.is_file() and training_done(self.cfg.training.epochs, read_report(report, TrainReport))

    def run_stage(self):
        from pipeline.train.cluster import apply_cluster

        apply_cluster(self.cfg)  # distribution.cluster: slurm sets TF_CONFIG from the Slurm step
        distribution = self.cfg.distribution
        if distribution.local_workers:
            if os.environ.get("TF_CONFIG"):
                log.warning(
                    "TF_CONFIG is set but distribution.local_workers is %d: TF_CONFIG is ignored (each local "
                    "worker gets its own)",
                    distribution.local_workers,
                )
            self._run_local_workers()
            return
        if distribution.strategy == "multi_worker" and os.environ.get("TF_CONFIG"):
            self._run_cluster_worker()
            return
        from pipeline.stages.train import train_stage
        from pipeline.train.hooks import TrainHooks

        progress = _TrainProgress(self)
        try:
            hooks = TrainHooks(on_step=progress.on_step, on_validation=progress.on_validation)
            with _stop_on_signals(progress):
                report = train_stage(self.layout, hooks=hooks)
        finally:
            progress.close()
        self.tell_scheduler(percent=100)
        self.tell_scheduler(
            message=(
                f"done: {report.epochs_completed} epochs, {report.global_step} steps; "
                f"stop: {report.stop.reason}"
            )
        )

    def _scheduled_config(self) -> str:
        """The config this task was scheduled with, written as the run's resolved config (``config.yaml`` in
        the run directory) for the worker processes to read: the YAML file may have been edited since, and
        workers reading it would train (and report) under another fingerprint than the one this task
        waits for."""
        import yaml

        from pipeline.config_loader import config_to_dict
        from pipeline.files import write_text_atomic

        snapshot = self.layout.train_run.resolved_config
        write_text_atomic(snapshot, yaml.safe_dump(config_to_dict(self.cfg), sort_keys=False))
        return str(snapshot)

    def _run_local_workers(self):
        """``distribution.local_workers`` worker processes on this machine (multi-worker all-reduce)."""
        from pipeline.train.distribute import DistributionError
        from pipeline.train.multiworker import launch_local_workers

        distribution = self.cfg.distribution
        if distribution.strategy != "multi_worker":
            raise DistributionError(
                f"{self.config}: distribution.local_workers needs distribution.strategy: multi_worker"
            )
        run = self.layout.train_run

        def poll(last_line: str) -> None:
            self.tell_scheduler(message=f"{distribution.local_workers} workers; worker 0: {last_line[-200:]}")

        launch_local_workers(
            self._scheduled_config(),
            distribution.local_workers,
            run.worker_log,
            grace_s=distribution.collective_timeout_s + 30,
            on_poll=poll,
        )
        report = read_report(run.report, TrainReport)
        self.tell_scheduler(percent=100)
        self.tell_scheduler(
            message=f"done on {distribution.local_workers} workers: {report.epochs_completed} epochs, "
            f"{report.global_step} steps"
        )

    def _run_cluster_worker(self):
        """This machine's worker of a cluster described by ``TF_CONFIG``, in a child process that listens
        on this worker's own TF_CONFIG address only. A non-chief worker's task succeeds when the chief's
        report of the same run (its step and weights) is readable here: that report is its output too."""
        from pipeline.train.distribute import cluster_role
        from pipeline.train.multiworker import run_cluster_worker, wait_for_chief_report

        role = cluster_role()
        run_cluster_worker(
            self._scheduled_config(),
            role.index,
            self.layout.train_run.worker_log,
            grace_s=self.cfg.distribution.collective_timeout_s + 30,
            on_poll=lambda line: self.tell_scheduler(message=f"worker {role.index}: {line[-200:]}"),
        )
        if role.is_chief:
            report = read_report(self.layout.train_run.report, TrainReport)
        else:
            # This task's output is the chief's report of the same run: succeed only once it is readable.
            report = wait_for_chief_report(
                self.layout.train_run,
                _worker_result(self.layout.train_run.worker_log(role.index)),
                timeout_s=self.cfg.distribution.collective_timeout_s + 30,
            )
        self.tell_scheduler(percent=100)
        self.tell_scheduler(
            message=f"worker {role.index} done: {report.epochs_completed} epochs, {report.global_step} steps"
        )


def _worker_result(log_path) -> dict:
    """The result line of a worker that exited 0 (it always prints one)."""
    from pipeline.train.distribute import DistributionError
    from pipeline.train.multiworker import worker_result

    result = worker_result(log_path)
    if result is None:
        raise DistributionError(f"{log_path}: the worker exited 0 without its result line")
    return result


@contextlib.contextmanager
def _stop_on_signals(progress: _TrainProgress):
    """While training: SIGTERM (Luigi's worker stopping its task processes, e.g. when it lost the
    scheduler; a container stopping), SIGINT (Ctrl-C) and SIGHUP ask for a stop at the end of the current
    step, where the trainer saves a checkpoint (``StopTraining``) before the task exits, instead of dying
    with everything since the last checkpoint. The same signal again acts at once, as it would have.
    Only in the main thread (signals cannot be set elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def request(number, frame):
        name = signal.Signals(number).name
        if progress.stop_requested == name:  # asked twice: do what the signal would have done
            signal.signal(number, previous[number])
            signal.raise_signal(number)
            return
        progress.stop_requested = name
        log.warning("%s: training stops after this step, with a checkpoint (%s again: at once)", name, name)

    previous = {number: signal.getsignal(number) or signal.SIG_DFL for number in numbers}
    for number in numbers:
        signal.signal(number, request)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


class _TrainProgress(Progress):
    """Train's progress: percent of all target steps; epoch, step, loss, last dev WER and ETA."""

    def __init__(self, task):
        super().__init__(task, total=1, unit="step", description="train")
        self.first_done = None
        self.started = time.monotonic()
        self.dev_wer = None
        self.stop_requested = ""  # the signal that asked training to stop

    def on_step(self, info: StepInfo) -> None:
        """TrainHooks.on_step; raises StopTraining (the trainer saves first) when a signal asked to stop."""
        if self.stop_requested:
            from pipeline.train.hooks import StopTraining

            raise StopTraining(
                f"training stopped by {self.stop_requested} after step {info.step}; a checkpoint of that "
                f"step was saved: run Train again to resume"
            )
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
