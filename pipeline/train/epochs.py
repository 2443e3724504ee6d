"""The epoch-target rule (``training.epochs``; negative = that many more), shared by the trainer and
Train.complete, so the two never disagree on whether a run has more to do.

The rule, for ``training.epochs`` = E and the run found in the checkpoint (or report):

- no run yet: train to E, or to N for E = -N;
- the run stopped early: it keeps its target and trains no more, whatever E says
  (an early stop is final; a new run needs other settings, or ``training.init_from``);
- E > 0: train to E;
- E = -N: if the run was last given this same -N, keep the target it got then (a killed
  run resumes to it, a finished run has nothing to do: the same command run again never
  trains again); otherwise N more than the run has now. So changing -2 to -3 adds three
  epochs, and going back to -2 adds two more.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.reports import TrainReport


@dataclass(frozen=True)
class RunRecord:
    """What a run's checkpoint or report says about where it is and what it was asked to do.

    ``setting`` is the ``training.epochs`` it last trained for (None when unknown: written
    before that was recorded); ``target`` the epoch that setting resolved to; ``finished``
    whether it got there (or stopped early); ``stopped`` whether an early stop ended it.
    """

    epochs_done: int
    target: int
    setting: int | None
    finished: bool
    stopped: bool

    @classmethod
    def of_report(cls, report: TrainReport) -> RunRecord:
        """The record of the finished run that wrote ``report``."""
        return cls(
            epochs_done=report.epochs_completed,
            target=report.target_epochs,
            setting=report.epochs_setting,
            finished=True,
            stopped=report.stop.rule is not None,
        )


def epoch_target(configured: int, last: RunRecord | None) -> int:
    """The epoch a run trains to for ``training.epochs`` = ``configured``, given the ``last`` run in its
    directory (None when there is none); see the module docstring for the rule."""
    if last is None:
        return configured if configured > 0 else -configured
    if last.stopped:
        return last.target
    if configured > 0:
        return configured
    # A killed run from before the setting was recorded keeps its target, as it would have then.
    same = last.setting == configured or (last.setting is None and not last.finished)
    return last.target if same else last.epochs_done - configured


def training_done(configured: int, report: TrainReport) -> bool:
    """Whether the run that wrote ``report`` is finished for ``training.epochs`` = ``configured``: it
    stopped early, or it reached the target the rule gives."""
    if report.stop.rule is not None:
        return True
    return report.epochs_completed >= epoch_target(configured, RunRecord.of_report(report))
