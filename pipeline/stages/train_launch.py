"""Where the Train stage runs: in this process, in ``distribution.local_workers`` worker processes, or as
this machine's worker of a cluster; and a signal's request to stop at the end of a step
(``pipeline.train.stop_signals``: in this process, or passed on to the workers, which agree on the step).

``train_launch_stage`` picks one from the config and ``TF_CONFIG`` and returns the line that sums up the
run; ``train_stage`` (``pipeline.stages.train``) is the training itself, in whichever process runs it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Protocol

import yaml

from pipeline.config import ConfigError
from pipeline.config_loader import config_to_dict
from pipeline.files import write_text_atomic
from pipeline.layout import Layout
from pipeline.reports import TrainReport, read_report
from pipeline.stages.train import train_stage
from pipeline.train import multiworker
from pipeline.train.cluster import apply_cluster
from pipeline.train.distribute import DistributionError, cluster_role
from pipeline.train.hooks import StepInfo, TrainHooks, ValidationInfo
from pipeline.train.stop_signals import SignalStop, stop_on_signals

__all__ = ["SignalStop", "TrainProgress", "stop_on_signals", "train_launch_stage"]

log = logging.getLogger(__name__)


class TrainProgress(Protocol):
    """What shows the progress of training in this process (the task's progress bar)."""

    def on_step(self, info: StepInfo) -> None:
        """After each step."""

    def on_validation(self, info: ValidationInfo) -> None:
        """After each validation."""

    def close(self) -> None:
        """When training ends, however it ends."""


def train_launch_stage(
    layout: Layout, on_message: Callable[[str], None], progress: Callable[[], TrainProgress]
) -> str:
    """Train as the config says and return the line that sums up the run (``done: ...``).

    With ``distribution.local_workers`` the workers are processes on this machine; with
    ``distribution.strategy: multi_worker`` and ``TF_CONFIG`` (set by hand or from the Slurm step,
    ``distribution.cluster``), this machine's worker of the cluster; otherwise training runs in this
    process, with ``progress()`` told each step. A signal asks for a stop at the end of a step, with a
    checkpoint: here, or passed on to the workers, which all stop after the same step (StopTraining).
    ``on_message`` gets the workers' status lines while they run.
    """
    apply_cluster(layout.config)  # distribution.cluster: slurm sets TF_CONFIG from the Slurm step
    distribution = layout.config.distribution
    if distribution.local_workers:
        if os.environ.get("TF_CONFIG"):
            log.warning(
                "TF_CONFIG is set but distribution.local_workers is %d: TF_CONFIG is ignored (each local "
                "worker gets its own)",
                distribution.local_workers,
            )
        return _run_local_workers(layout, on_message)
    if distribution.strategy == "multi_worker" and os.environ.get("TF_CONFIG"):
        return _run_cluster_worker(layout, on_message)
    shown = progress()
    stop = SignalStop(layout.config.training.accumulate_batches)
    try:

        def on_step(info: StepInfo) -> None:
            stop.check(info)
            shown.on_step(info)

        hooks = TrainHooks(on_step=on_step, on_validation=shown.on_validation)
        with stop_on_signals(stop):
            report = train_stage(layout, hooks=hooks)
    finally:
        shown.close()
    return f"done: {report.epochs_completed} epochs, {report.global_step} steps; stop: {report.stop.reason}"


def _scheduled_config(layout: Layout) -> str:
    """The config this stage was scheduled with, written as the run's resolved config (``config.yaml`` in
    the run directory) for the worker processes to read: the YAML file may have been edited since, and
    workers reading it would train (and report) under another fingerprint than the one the caller waits
    for."""
    snapshot = layout.train_run.resolved_config
    write_text_atomic(snapshot, yaml.safe_dump(config_to_dict(layout.config), sort_keys=False))
    return str(snapshot)


def _worker_args(layout: Layout) -> tuple[str, ...]:
    """What a worker is told besides the scheduled config: the digest of ``training.init_from`` the Train
    fingerprint holds, so that the worker trains under this run's fingerprint and its warm start checks the
    checkpoint against it (a worker computing its own would take whatever checkpoint is there later)."""
    digest = layout.init_from_digest
    return ("--init-digest", digest) if digest else ()


def _run_local_workers(layout: Layout, on_message: Callable[[str], None]) -> str:
    """``distribution.local_workers`` worker processes on this machine (multi-worker all-reduce)."""
    distribution = layout.config.distribution
    if distribution.strategy != "multi_worker":  # a config error (never retried); preflight refuses it first
        raise ConfigError(
            f"{layout.config.source}: distribution.local_workers needs distribution.strategy: multi_worker"
        )
    run = layout.train_run

    def poll(last_line: str) -> None:
        on_message(f"{distribution.local_workers} workers; worker 0: {last_line[-200:]}")

    multiworker.launch_local_workers(
        _scheduled_config(layout),
        distribution.local_workers,
        run.worker_log,
        grace_s=distribution.collective_timeout_s + 30,
        on_poll=poll,
        worker_args=_worker_args(layout),
    )
    report = read_report(run.report, TrainReport)
    return (
        f"done on {distribution.local_workers} workers: {report.epochs_completed} epochs, "
        f"{report.global_step} steps"
    )


def _run_cluster_worker(layout: Layout, on_message: Callable[[str], None]) -> str:
    """This machine's worker of a cluster described by ``TF_CONFIG``, in a child process that listens
    on this worker's own TF_CONFIG address only. A non-chief worker succeeds when the chief's report of
    the same run (its step and weights) is readable here: that report is its output too."""
    role = cluster_role()
    run = layout.train_run
    multiworker.run_cluster_worker(
        _scheduled_config(layout),
        role.index,
        run.worker_log,
        grace_s=layout.config.distribution.collective_timeout_s + 30,
        on_poll=lambda line: on_message(f"worker {role.index}: {line[-200:]}"),
        worker_args=_worker_args(layout),
    )
    if role.is_chief:
        report = read_report(run.report, TrainReport)
    else:
        # This worker's output is the chief's report of the same run: succeed only once it is readable.
        report = multiworker.wait_for_chief_report(
            run,
            _worker_result(run.worker_log(role.index)),
            timeout_s=layout.config.distribution.collective_timeout_s + 30,
        )
    return f"worker {role.index} done: {report.epochs_completed} epochs, {report.global_step} steps"


def _worker_result(log_path) -> dict:
    """The result line of a worker that exited 0 (it always prints one)."""
    result = multiworker.worker_result(log_path)
    if result is None:
        raise DistributionError(f"{log_path}: the worker exited 0 without its result line")
    return result
