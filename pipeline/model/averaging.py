"""Checkpoint averaging (``export.average``): which epoch-end checkpoints of a Train run are averaged, and
the model whose weights are their mean; the model TuneDecoder, Evaluate and Export use.

The epochs wanted (``pipeline.model.averaged_epochs``): ``last: N``, the run's last N epochs; ``best: N``,
the N validated epochs with the lowest ``training.best_by`` figure among those with a finite dev loss (the
earlier of equals), the ranking that picks the single best-dev checkpoint. Where their weights are found:
the ``epoch-<E>`` weights Train keeps for the averaging (``TrainRun.epoch_ends``,
``pipeline.train.epoch_ends``), else any checkpoint of the run (``checkpoints/``, ``best/``) saved at the
end of epoch E; one whose weights do not read back whole (damaged on disk) is left out with a warning, for
another of the same epoch. Wanted epochs found nowhere intact (a run trained before ``export.average`` was
set keeps only ``training.max_to_keep`` checkpoints) are left out: the mean is of those found, and the log
and the Evaluate report say which are missing and which were damaged. For a task of a multi-task run, the
task's model is averaged: the shared part and its head or network, over the same checkpoints of the whole
multi-task model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipeline.config import Config
from pipeline.model import build_model
from pipeline.model.averaged_epochs import wanted_epochs
from pipeline.model.checkpoints import (
    CheckpointMismatchError,
    check_geometry,
    checkpoint_key,
    load_trained_model,
    resolve_checkpoint,
)
from pipeline.model.heads import task_weight_names
from pipeline.model.weights import named_weights
from pipeline.reports import DevFigures, TrainReport, read_report
from pipeline.workdir import EPOCH_END_PREFIX, TrainRun

log = logging.getLogger(__name__)


def _state_value(reader, name: str) -> int | None:
    key = f"{name}/.ATTRIBUTES/VARIABLE_VALUE"
    return int(reader.get_tensor(key)) if reader.has_tensor(key) else None


def epoch_end_checkpoints(run: TrainRun) -> dict[int, list[str]]:
    """{epoch: the prefixes of every checkpoint of ``run`` holding the weights at that epoch's end}: the kept
    ``epoch-<E>`` weights first, then the run's checkpoints whose position is the start of the next epoch.
    A checkpoint whose index is unreadable is skipped with a warning."""
    found: dict[int, list[str]] = {}
    for index in sorted(run.epoch_ends.glob(f"{EPOCH_END_PREFIX}-*.index")):
        number = index.name[len(EPOCH_END_PREFIX) + 1 : -len(".index")]
        if number.isdigit():
            found.setdefault(int(number), []).append(str(index.with_suffix("")))
    for directory in (run.checkpoints, run.best):
        for index in sorted(directory.glob("*-*.index")):
            prefix = str(index.with_suffix(""))
            try:
                reader = tf.train.load_checkpoint(prefix)
                epoch, step = _state_value(reader, "epoch"), _state_value(reader, "step_in_epoch")
            except _READ_ERRORS as error:
                log.warning(
                    "%s: unreadable checkpoint left out of the average (%s)", prefix, _first_line(error)
                )
                continue
            if epoch and step == 0:
                found.setdefault(epoch, []).append(prefix)
    return found


# What reading a damaged checkpoint raises: TensorFlow's errors, and IndexError from a data file shorter than
# its index says (``CheckpointReader.get_tensor``).
_READ_ERRORS = (tf.errors.OpError, ValueError, IndexError, OSError)


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


def weights_damage(prefix: str) -> str | None:
    """None when every weight of checkpoint ``prefix`` reads back whole (its checksums hold), else what is
    wrong, in one line. Reads one weight at a time."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        keys = [key for key in reader.get_variable_to_shape_map() if key.startswith("weights/")]
        for key in keys:
            reader.get_tensor(key)
    except _READ_ERRORS as error:
        return _first_line(error)
    return None if keys else "it holds no weights"


@dataclass(frozen=True)
class Averaging:
    """The checkpoints an ``export.average`` takes: ``mode`` and ``asked`` as configured, the epochs found
    and their prefixes (ascending), the epochs wanted but found nowhere intact, and the damaged checkpoints
    left out."""

    mode: str
    asked: int
    epochs: tuple[int, ...]
    prefixes: tuple[str, ...]
    missing: tuple[int, ...]
    damaged: tuple[str, ...] = ()

    @property
    def checkpoint(self) -> str:
        """What the reports and the export's metadata name as their checkpoint."""
        return "average of " + ", ".join(self.prefixes)

    def describe(self) -> str:
        """One line: how many of how many, which epochs, and which are missing."""
        epochs = ", ".join(str(e) for e in self.epochs)
        text = (
            f"the average of {len(self.epochs)} checkpoints "
            f"(export.average {self.mode} {self.asked}: epochs {epochs})"
        )
        if self.missing:
            missing = ", ".join(str(e) for e in self.missing)
            text += f"; epochs {missing} wanted but not kept by the run, so averaged without them"
        if self.damaged:
            text += f"; left out as damaged: {', '.join(self.damaged)}"
        if self.short:
            have = len(self.epochs) + len(self.missing)
            kind = "epochs" if self.mode == "last" else "validated epochs with a finite dev figure"
            text += f"; the run has only {have} {kind}, fewer than the {self.asked} asked for"
        return text

    @property
    def short(self) -> bool:
        """Whether the run has fewer epochs to average (finished, or validated for ``best``) than asked."""
        return len(self.epochs) + len(self.missing) < self.asked

    def to_dict(self) -> dict:
        """The report's record of it."""
        return {
            "mode": self.mode,
            "asked": self.asked,
            "epochs": list(self.epochs),
            "checkpoints": list(self.prefixes),
            "missing": list(self.missing),
            "damaged": list(self.damaged),
        }


def plan_average(config: Config, run: TrainRun) -> Averaging:
    """The checkpoints of ``run`` that ``config.export.average`` averages (its report says how many epochs
    it finished and its validations): for each epoch wanted, the first of its checkpoints whose weights
    read back whole (a damaged one is left out with a warning, for another of the same epoch); a
    CheckpointMismatchError when not one is found."""
    average = config.export.average
    report = read_report(run.report, TrainReport)
    validations = [DevFigures(**v) for v in report.validations]
    wanted = wanted_epochs(average, validations, config.training.best_by, report.epochs_completed)
    candidates = epoch_end_checkpoints(run)
    found, damaged = {}, []
    for epoch in wanted:
        for prefix in candidates.get(epoch, ()):
            problem = weights_damage(prefix)
            if problem is None:
                found[epoch] = prefix
                break
            log.warning("%s: damaged checkpoint left out of the average (%s)", prefix, problem)
            damaged.append(prefix)
    epochs = tuple(e for e in wanted if e in found)
    if not epochs:
        raise CheckpointMismatchError(
            f"export.average: none of the checkpoints of epochs {', '.join(map(str, wanted)) or '(none)'} "
            f"is in {run.root}{' intact' if damaged else ''}; train with export.average set (make rerun "
            f"STAGE=Train), or unset it"
        )
    return Averaging(
        mode=average.mode,
        asked=average.count,
        epochs=epochs,
        prefixes=tuple(found[e] for e in epochs),
        missing=tuple(e for e in wanted if e not in found),
        damaged=tuple(damaged),
    )


def load_averaged_model(config: Config, prefixes: Sequence[str], n_input: int, n_classes: int):
    """The model of ``config`` with each weight the mean of that weight in ``prefixes`` (summed in float64,
    one weight at a time: memory holds one weight's sum, not the checkpoints). For a task of a multi-task
    config (its view), the task's single-task model, as ``load_trained_model`` reads it: the shared part
    and the task's head or network, each the mean over the same checkpoints."""
    model = build_model(config.model, n_input, n_classes, normalized=config.features.normalize == "global")
    stored = task_weight_names(config, model)
    readers = []
    for prefix in prefixes:
        try:
            check_geometry(prefix, model, Path(prefix).parent, stored)
            readers.append((prefix, tf.train.load_checkpoint(prefix)))
        except _READ_ERRORS as error:
            raise _damaged(prefix, error) from None
    for name, variable in named_weights(model).items():
        key = checkpoint_key(stored[name])
        total = np.zeros(variable.shape, np.float64)
        for prefix, reader in readers:
            try:
                total += reader.get_tensor(key)
            except _READ_ERRORS as error:
                raise _damaged(prefix, error) from None
        variable.assign((total / len(readers)).astype(tf.as_dtype(variable.dtype).as_numpy_dtype))
    return model


def _damaged(prefix: str, error: BaseException) -> CheckpointMismatchError:
    return CheckpointMismatchError(
        f"{prefix}: damaged checkpoint ({_first_line(error)}); "
        f"make rerun STAGE=Train to train again, or unset export.average"
    )


def stage_model(config: Config, run: TrainRun, checkpoint, n_input: int, n_classes: int):
    """The trained model a stage uses: ``checkpoint`` when one is given, else the average
    ``export.average`` asks for, else ``run``'s best-dev checkpoint. Returns (model, the checkpoint it names
    in its report, the ``Averaging`` or None)."""
    if checkpoint is None and config.export.average.count:
        averaging = plan_average(config, run)
        shortfall = averaging.missing or averaging.damaged or averaging.short
        (log.warning if shortfall else log.info)("Using %s", averaging.describe())
        model = load_averaged_model(config, averaging.prefixes, n_input, n_classes)
        return model, averaging.checkpoint, averaging
    prefix = resolve_checkpoint(checkpoint or run.best)
    return load_trained_model(config, prefix, n_input, n_classes), prefix, None
