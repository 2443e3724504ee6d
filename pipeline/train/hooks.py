"""Callbacks a caller (a Luigi task, a benchmark, a test) attaches to training, and what each receives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class StopTraining(Exception):  # noqa: N818 - a request, not an error
    """Raised by a hook to stop training now (a signal, a user): the trainer saves a checkpoint of the
    position the step ended at first, so that a rerun resumes there."""


@dataclass(frozen=True)
class StepInfo:
    """After each training step: where the run is (``epoch`` 0-based, ``step`` the global step after
    this one) and the step's loss (NaN when it was not finite)."""

    epoch: int
    target_epochs: int
    step: int
    step_in_epoch: int
    steps_per_epoch: int
    loss: float
    elapsed_s: float


@dataclass(frozen=True)
class EpochInfo:
    """After each epoch (``epoch`` 1-based, the one just finished): its mean training loss."""

    epoch: int
    target_epochs: int
    train_loss: float


@dataclass(frozen=True)
class ValidationInfo:
    """After each validation (``epoch`` 1-based): the dev figures, whether they are the best so far
    (the best-dev checkpoint is saved), and the best and worst samples."""

    epoch: int
    dev_loss: float
    wer: float
    cer: float
    is_best: bool
    samples: dict


@dataclass
class TrainHooks:
    """Callbacks ``Trainer.fit`` calls; each gets one of the records above."""

    on_step: Callable[[StepInfo], None] | None = None
    on_validation: Callable[[ValidationInfo], None] | None = None
    on_epoch: Callable[[EpochInfo], None] | None = None
