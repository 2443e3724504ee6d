"""Which epoch ends checkpoint averaging (``export.average``) takes, and the names of the epoch-end weights
Train keeps for it (``TrainRun.epoch_ends``). No TensorFlow here: ``deepspeech-train gc`` reads them too."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from pipeline.config import AverageConfig
from pipeline.reports import DevFigures
from pipeline.workdir import EPOCH_END_PREFIX

# ``epoch-<E>.index`` and its ``epoch-<E>.data-<i>-of-<n>``
_EPOCH_END_FILE = re.compile(rf"{EPOCH_END_PREFIX}-(\d+)\.(index|data-\d+-of-\d+)")


def wanted_epochs(
    average: AverageConfig, validations: Sequence[DevFigures], best_by: str, last_epoch: int
) -> list[int]:
    """The epochs (1-based, ascending) whose end-of-epoch weights ``average`` asks for, in a run that has
    finished ``last_epoch`` epochs with ``validations``."""
    if average.last:
        return list(range(max(1, last_epoch - average.last + 1), last_epoch + 1))
    finite = [v for v in validations if math.isfinite(v.dev_loss) and math.isfinite(getattr(v, best_by))]
    ranked = sorted(finite, key=lambda v: (getattr(v, best_by), v.epoch))
    return sorted({v.epoch for v in ranked[: average.best]})


def epoch_end_number(path: Path) -> int | None:
    """The epoch of a file of kept epoch-end weights (``epoch-<E>.index``, ``epoch-<E>.data-...``); None
    for any other file."""
    match = _EPOCH_END_FILE.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None
