"""Train's side of checkpoint averaging (``export.average``): the weights of the epoch ends the average
will want, kept apart from the latest checkpoints so that ``training.max_to_keep`` and the mid-epoch saves
never push them out.

After each epoch, with ``export.average`` set, the epoch's weights are written (weights only, a third of a
full checkpoint) as ``epoch-<E>`` in ``TrainRun.epoch_ends`` when the average would take them if the run
ended now (``keep``), and once the epoch's checkpoint is saved, the kept epochs it would no longer take are
removed (``prune``): at most N are kept (N + 1 in between). They are written before the epoch's
checkpoint, so a run killed in between trains that epoch again (to the same weights) and writes them
again; they are removed after it, so such a kill never loses weights the last checkpoint's run still
wants (a run then ended there, with ``training.epochs`` lowered, or one whose retrained epoch validates
otherwise). Without ``export.average`` nothing is written or removed.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from pipeline.config import Config
from pipeline.model.averaged_epochs import wanted_epochs
from pipeline.model.weights import named_weights
from pipeline.train.history import TrainHistory
from pipeline.workdir import EPOCH_END_PREFIX, TrainRun

log = logging.getLogger(__name__)


class EpochEnds:
    """The kept epoch-end weights of ``run`` (the chief's run directory) for ``config.export.average``."""

    def __init__(self, config: Config, run: TrainRun, model):
        self.config = config
        self.run = run
        self.average = config.export.average
        self._checkpoint = tf.train.Checkpoint(weights=named_weights(model))

    def kept(self) -> list[int]:
        """The epochs whose weights are kept now, ascending."""
        numbers = (p.name[len(EPOCH_END_PREFIX) + 1 : -len(".index")] for p in self._indexes())
        return sorted(int(n) for n in numbers if n.isdigit())

    def _indexes(self) -> list:
        return list(self.run.epoch_ends.glob(f"{EPOCH_END_PREFIX}-*.index"))

    def keep(self, epoch: int, history: TrainHistory) -> None:
        """Epoch ``epoch`` (1-based) has ended with ``history``: write its weights if the average wants them
        (before the epoch's checkpoint)."""
        if not self.average.count:
            return
        if epoch in wanted_epochs(self.average, history.validations, self.config.training.best_by, epoch):
            self.run.epoch_ends.mkdir(parents=True, exist_ok=True)
            self._checkpoint.write(str(self.run.epoch_end(epoch)))

    def prune(self, epoch: int, history: TrainHistory) -> None:
        """Epoch ``epoch``'s checkpoint is saved: remove the kept weights the average no longer wants."""
        if not self.average.count:
            return
        wanted = set(wanted_epochs(self.average, history.validations, self.config.training.best_by, epoch))
        # The index first: without it the weights are no longer found, whatever happens to the rest.
        for index in self._indexes():
            number = index.name[len(EPOCH_END_PREFIX) + 1 : -len(".index")]
            if number.isdigit() and int(number) not in wanted:
                index.unlink(missing_ok=True)
        for data in self.run.epoch_ends.glob(f"{EPOCH_END_PREFIX}-*.data-*"):
            if not data.with_name(data.name.split(".data-")[0] + ".index").exists():
                data.unlink(missing_ok=True)
        log.info(
            "Kept for export.average %s %d: the weights of epochs %s",
            self.average.mode,
            self.average.count,
            ", ".join(map(str, self.kept())) or "(none yet)",
        )
