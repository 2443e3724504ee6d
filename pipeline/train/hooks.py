"""Callbacks a caller (a Luigi task, a benchmark, a test) attaches to training, and what each receives.

Besides the caller's own, ``training.hooks`` names modules of the user's (a dotted name, found as every
plug-in is: ``native_client.plugins``) whose ``TRAIN_HOOKS`` attribute, called with the run's config,
returns a ``TrainHooks``: a notification at each validation, a lab's own progress feed, a test that
pauses training at a chosen step. They run in every training process (local and cluster workers too),
after the caller's hooks, and observe: a hook changes no result (the key is in no fingerprint), though it
may stop training by raising ``StopTraining``: from ``on_step``, after that step's checkpoint; from
``on_epoch`` or ``on_validation``, after the epoch's (so that a rerun goes on from the next epoch). With
several workers, the request of one reaches them all in the next step's all-reduce, and all stop after that
step, each with its checkpoint (``pipeline.train.loop``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from native_client.plugins import PluginError, find_plugin

if TYPE_CHECKING:
    from pipeline.config import Config


class StopTraining(Exception):  # noqa: N818 - a request, not an error
    """Raised by a hook to stop training now (a signal, a user): the trainer saves a checkpoint of the
    position the step (or the epoch) ended at first, so that a rerun resumes there."""


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


def combine_hooks(hooks: Sequence[TrainHooks]) -> TrainHooks:
    """One ``TrainHooks`` calling each of ``hooks``' callbacks in order (none where no hook has one)."""

    def chain(name: str):
        callbacks = [getattr(h, name) for h in hooks if getattr(h, name) is not None]
        if not callbacks:
            return None
        if len(callbacks) == 1:
            return callbacks[0]

        def call_each(info) -> None:
            for callback in callbacks:
                callback(info)

        return call_each

    return TrainHooks(
        on_step=chain("on_step"), on_validation=chain("on_validation"), on_epoch=chain("on_epoch")
    )


def configured_hooks(config: Config) -> list[TrainHooks]:
    """The hooks ``training.hooks`` names, each module's ``TRAIN_HOOKS(config)``; a name that is not an
    importable module with that attribute, or a factory that returns no ``TrainHooks``, is a
    ``PluginError`` naming the key."""
    found = []
    for name in config.training.hooks:
        factory = find_plugin("pipeline.train", name, "TRAIN_HOOKS", "training.hooks")
        hooks = factory(config)
        if not isinstance(hooks, TrainHooks):
            raise PluginError(
                f"training.hooks: {name}.TRAIN_HOOKS returned {type(hooks).__name__}, not TrainHooks"
            )
        found.append(hooks)
    return found
