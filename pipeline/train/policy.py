"""The training policy: what happens after each epoch (validate when due, keep the best-dev model,
halve the learning rate on a plateau, stop early) and the learning rate of each step.

The policy decides; the loop (``loop.py``) carries the decision out (records it,
saves, writes summaries, calls hooks). The epoch target is ``epochs.py``'s rule and
the early-stop rules are ``early_stop.py``'s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.config import Config, TrainingConfig
from pipeline.reports import DevFigures, StopRecord
from pipeline.train.early_stop import should_stop
from pipeline.train.history import TrainHistory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpochVerdict:
    """The policy's decision after one epoch. ``validation`` is None when none was due; then nothing
    else is decided. ``best_before`` is the best finite dev loss before this validation."""

    validation: DevFigures | None = None
    samples: dict | None = None
    is_best: bool = False
    best_before: float = math.inf
    halve_lr: bool = False
    stop: StopRecord | None = None


def learning_rate(training: TrainingConfig, lr_factor: float, updates: int, run_updates: int = 0) -> float:
    """The learning rate of the next optimizer update, ``updates`` having been made in a run of
    ``run_updates`` (its epoch target times the updates of an epoch; only ``cosine`` reads it): the
    configured ``training.learning_rate`` times the plateau factor, raised linearly over the first
    ``training.warmup_steps`` updates, then shaped by ``training.lr_decay``."""
    peak = training.learning_rate * lr_factor
    warmup, update = training.warmup_steps, updates + 1
    lr = peak * update / warmup if updates < warmup else peak
    if training.lr_decay == "exponential":
        lr *= training.decay_rate ** (updates / training.decay_steps)
    elif training.lr_decay == "noam" and update > warmup:
        lr *= math.sqrt(warmup / update)
    elif training.lr_decay == "cosine" and updates >= warmup:
        floor = min(training.min_learning_rate, peak)
        progress = min(1.0, (updates - warmup) / max(1, run_updates - 1 - warmup))
        lr = floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr


class EpochPolicy:
    """After-epoch decisions for ``config``; ``has_dev`` says whether a dev split exists."""

    def __init__(self, config: Config, has_dev: bool):
        self.training = config.training
        self.early_stop = config.early_stop
        self.validates = has_dev and self.training.validation_epochs > 0
        self.has_dev = has_dev

    def blind_spots(self) -> list[str]:
        """Warnings for settings that need validation when there is none (said once per run)."""
        if self.validates:
            return []
        why = (
            "data.dev_files is empty"
            if not self.has_dev
            else "validation is off (training.validation_epochs: 0)"
        )
        warnings = []
        if not self.has_dev:
            warnings.append(
                f"{why}: training without validation; the last checkpoint is the one Evaluate and Export use"
            )
        if self.early_stop.rule != "off":
            warnings.append(f"early_stop.rule is {self.early_stop.rule!r} but {why}: no early stopping")
        if self.training.halve_lr_on_plateau:
            warnings.append(
                f"training.halve_lr_on_plateau is on but {why}: the learning rate is never halved"
            )
        return warnings

    def validation_due(self, epoch: int) -> bool:
        """Whether to validate after epoch ``epoch`` (1-based)."""
        return self.validates and epoch % self.training.validation_epochs == 0

    def after_epoch(
        self,
        epoch: int,
        history: TrainHistory,
        validate: Callable[[int], tuple[DevFigures, dict]],
    ) -> EpochVerdict:
        """Decide after epoch ``epoch`` (1-based): validate with ``validate(epoch)`` when due, then
        whether the model is the best so far (a lower ``training.best_by`` figure than every finite one in
        ``history``),
        whether to halve the learning rate, and whether to stop early. ``history`` is not changed."""
        if not self.validation_due(epoch):
            return EpochVerdict()
        figures, samples = validate(epoch)
        best_before = history.best_dev_loss()
        by = self.training.best_by
        best = history.best(by)
        is_best = math.isfinite(figures.dev_loss) and getattr(figures, by) < (
            getattr(best, by) if best else math.inf
        )
        halve = not figures.dev_loss < best_before and self.training.halve_lr_on_plateau
        stop = None
        decision = should_stop(history.dev_losses() + [figures.dev_loss], self.early_stop)
        if decision is not None:
            log.info("Early stop check (%s rule): %s", decision.rule, decision.reason)
            if decision.stop:
                stop = StopRecord(rule=decision.rule, reason=decision.reason, epoch=epoch)
                log.warning(
                    "Early stop after epoch %d by the %s rule: %s", epoch, decision.rule, decision.reason
                )
        return EpochVerdict(figures, samples, is_best, best_before, halve, stop)
