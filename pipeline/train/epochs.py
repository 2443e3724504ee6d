"""The epoch-target rule (``training.epochs``; negative = that many more), shared by the trainer and Train.complete."""

from __future__ import annotations

from pipeline.reports import TrainReport


def epoch_target(configured: int, epochs_done: int, run_target: int) -> int:
    """The epoch a run trains to.

    ``configured`` is ``training.epochs``; ``epochs_done`` the epochs in the
    checkpoint; ``run_target`` the target of the unfinished run being resumed
    (0 when there is none), so a restarted "-N more" run keeps the target it
    started with instead of adding N again.
    """
    if configured > 0:
        return configured
    if run_target > 0:
        return run_target
    return epochs_done - configured


def training_done(configured: int, report: TrainReport) -> bool:
    """Whether the run that wrote ``report`` is finished for ``training.epochs`` = ``configured``:
    it stopped early, or it reached the target this rule gives."""
    if report.stop.rule is not None:
        return True
    return report.epochs_completed >= epoch_target(configured, report.epochs_completed, report.target_epochs)
