"""What training writes as it goes besides checkpoints: TensorBoard summaries (``summaries/<run>``, the
chief's alone) and the warning of a diverging loss."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipeline.model.weights import named_weights

log = logging.getLogger(__name__)


class Summaries:
    """The TensorBoard runs under ``directory`` (``train``, ``dev``, ``dev_<task>``); a worker that is not
    the chief writes none. Weight histograms at most every ``histogram_secs``."""

    def __init__(self, directory: Path, is_chief: bool, histogram_secs: float):
        self.directory, self.is_chief, self.histogram_secs = directory, is_chief, histogram_secs
        self._writers: dict = {}
        self._last_histogram = 0.0

    def writer(self, name: str):
        """The summary writer of run ``name`` (a no-op one off the chief)."""
        if not self.is_chief:
            return tf.summary.create_noop_writer()
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(str(self.directory / name))
        return self._writers[name]

    def step(self, step: int, loss: float | None, lr: float, model) -> None:
        """A training step's loss (None: not finite) and learning rate, and ``model``'s weight histograms
        when they are due."""
        with self.writer("train").as_default(step=step):
            if loss is not None:
                tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", min(lr, float(np.finfo(np.float32).max)))
            if time.monotonic() - self._last_histogram >= self.histogram_secs:
                self._last_histogram = time.monotonic()
                for name, variable in named_weights(model).items():
                    tf.summary.histogram(name, variable)

    def validation(self, step: int, figures) -> None:
        """A validation's figures (``DevFigures``) after global step ``step``."""
        with self.writer("dev").as_default(step=step):
            tf.summary.scalar("loss", figures.dev_loss)
            tf.summary.scalar("wer", figures.wer)
            tf.summary.scalar("cer", figures.cer)

    def flush(self) -> None:
        """Write out what every writer holds."""
        for writer in self._writers.values():
            writer.flush()


class LossWatch:
    """Warns once when the loss has grown 100x over the first loss of this run (diverging training)."""

    def __init__(self):
        self.first: float | None = None
        self.warned = False

    def __call__(self, step: int, loss: float) -> None:
        """Look at step ``step``'s finite ``loss``."""
        if self.first is None:
            self.first = loss
        elif self.first > 0 and loss > 100 * self.first and not self.warned:
            self.warned = True
            log.warning(
                "Step %d: loss %.4g is over 100x the first loss %.4g; training is diverging "
                "(lower training.learning_rate or set training.clip_grad_norm)",
                step,
                loss,
                self.first,
            )
