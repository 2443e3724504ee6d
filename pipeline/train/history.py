"""What a training run has done so far (validations, epoch losses, skipped batches, an early stop), as
typed records, and how that record sits in a checkpoint.

The record is saved in every checkpoint through ``tf.train.experimental.PythonState``:
TensorFlow calls ``serialize`` when (and only when) a checkpoint is written and
``deserialize`` when one is restored, so the record lives as a dataclass between saves
and is read back field by field (an unknown or missing field is an error naming it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import tensorflow as tf

from pipeline.reports import DevFigures, ReportError, StopRecord, report_from_dict, report_to_dict

# The serialized form's version; the form before it (a JSON dict in a tf.string variable) had none.
HISTORY_FORMAT = 1


@dataclass(frozen=True)
class EpochLoss:
    """The mean training loss of one epoch (1-based), over the batches whose update was applied."""

    epoch: int
    train_loss: float


@dataclass(frozen=True)
class SkippedBatch:
    """A batch whose update was not applied (non-finite loss, or an update that made weights non-finite)."""

    step: int
    files: list[str]


@dataclass
class TrainHistory:
    """The record of a run, across restarts: every validation's figures, the last validation's samples,
    the epoch losses, the skipped batches, and the early stop that ended the run (None while it goes on)."""

    validations: list[DevFigures] = field(default_factory=list)
    last_samples: dict | None = None
    epoch_losses: list[EpochLoss] = field(default_factory=list)
    skipped_batches: list[SkippedBatch] = field(default_factory=list)
    stop: StopRecord | None = None

    def dev_losses(self) -> list[float]:
        """The dev loss of every validation, oldest first (what the early-stop rules read)."""
        return [v.dev_loss for v in self.validations]

    def best(self, by: str = "dev_loss") -> DevFigures | None:
        """The validation with the lowest ``by`` (``dev_loss``, ``cer`` or ``wer``; the earliest of equals)
        among those whose dev loss and ``by`` are finite; None when there is none (a validation with a
        NaN loss, a model that produced non-finite outputs, is never the best whatever its error rate)."""
        finite = [v for v in self.validations if math.isfinite(v.dev_loss) and math.isfinite(getattr(v, by))]
        return min(finite, key=lambda v: getattr(v, by)) if finite else None

    def best_dev_loss(self) -> float:
        """The lowest finite dev loss so far, ``inf`` when there is none."""
        best = self.best()
        return best.dev_loss if best else math.inf

    def to_json(self) -> str:
        """The record as JSON text (with its format version)."""
        return json.dumps({"format": HISTORY_FORMAT, **report_to_dict(self)})

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> TrainHistory:
        """Read a record written by ``to_json``, or by the trainer before records were typed (a plain
        JSON dict whose validations carried their samples); a malformed one raises ReportError naming
        ``where``."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ReportError(f"{where}: the training history is not valid JSON ({error})") from None
        if not isinstance(data, dict):
            raise ReportError(f"{where}: the training history is not a JSON object")
        version = data.pop("format", None)
        if version is None:
            data = _from_untyped(data)
        elif version != HISTORY_FORMAT:
            raise ReportError(
                f"{where}: training history format {version} is newer than this code ({HISTORY_FORMAT})"
            )
        return report_from_dict(cls, data, f"{where}: training history")


def _from_untyped(data: dict) -> dict:
    """The fields of a history saved as an untyped dict (checkpoints written before the typed record)."""
    validations = data.get("validations", [])
    figures = ("epoch", "dev_loss", "wer", "cer")
    return {
        "validations": [{k: v[k] for k in figures} for v in validations],
        "last_samples": validations[-1].get("samples") if validations else None,
        "epoch_losses": data.get("epoch_losses", []),
        "skipped_batches": data.get("skipped_batches", []),
        "stop": data.get("stop"),
    }


class HistoryState(tf.train.experimental.PythonState):
    """A ``TrainHistory`` as a checkpointed object: ``tf.train.Checkpoint(history=HistoryState())``.

    Restoring a checkpoint written before this class existed (where ``history`` was a
    ``tf.string`` variable holding a JSON dict) reads that dict into the typed record.
    """

    def __init__(self, history: TrainHistory | None = None):
        self.history = history or TrainHistory()

    def serialize(self) -> str:
        """PythonState: the record as text, called when a checkpoint is written."""
        return self.history.to_json()

    def deserialize(self, string_value) -> None:
        """PythonState: replace the record with the one a restored checkpoint holds."""
        raw = string_value.numpy() if hasattr(string_value, "numpy") else string_value
        self.history = TrainHistory.from_json(raw, "checkpoint")
