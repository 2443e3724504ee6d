"""The transducer's joint computation in the batch plans (``model.transducer.max_joint_mib``).

A transducer's joiner works on every pair of an encoder frame and a label count: for each pair of one
tower's batch it holds the sum of the two projections and its tanh (``joint_dim`` values each, and their
gradients) and the scores over the classes (float32, with their log-softmax and its gradient). That
grows with the product of an utterance's length and its transcript's, so a cap on frames
(``training.max_batch_frames``) does not bound it. ``JointCap`` estimates those bytes, ``4 x joint_dim``
values of the compute dtype and ``3 x classes`` float32 a pair, and says how many utterances of a batch
fit under the cap, counting the batch's padded frames (at the family's output rate) and its padded
labels; the training and evaluation plans cut a batch to that many utterances a tower. An utterance that
alone would not fit is refused in one line (``JointTooLarge``) before any step, not an out-of-memory kill
in the middle of an epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.batches.buckets import ShapeGrid

MIB = 2**20
FLOAT_BYTES = 4


class JointTooLarge(ValueError):
    """One utterance's joint tensor alone is over the cap; ``index`` is the utterance's."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class JointCap:
    """``max_mib`` MiB of joint scores a tower's batch, over a split of utterances of ``lengths`` feature
    frames and ``label_lengths`` labels (padded on ``grid`` when given); ``output_frames(feature_frames)``
    is the family's output rate, ``classes`` the labels and the blank."""

    lengths: np.ndarray
    label_lengths: np.ndarray
    output_frames: Callable[[int], int]
    classes: int
    max_mib: float
    grid: ShapeGrid | None = None
    joint_dim: int = 0
    hidden_bytes: int = FLOAT_BYTES  # of the compute dtype: 2 with mixed precision

    def _padded(self, batch: np.ndarray) -> tuple[int, int]:
        """(frames, labels) a batch of ``batch`` (indices) is padded to."""
        longest = int(self.lengths[batch].max(initial=1))
        if self.grid is not None:
            return self.grid.frames(longest), self.grid.labels(longest)
        return longest, int(self.label_lengths[batch].max(initial=0))

    def mib_each(self, frames: int, labels: int) -> float:
        """The joint computation of one utterance in a batch padded to ``frames`` feature frames and
        ``labels`` labels, in MiB (see the module docstring)."""
        pair = 3 * self.classes * FLOAT_BYTES + 4 * self.joint_dim * self.hidden_bytes
        return int(self.output_frames(frames)) * (labels + 1) * pair / MIB

    def per_tower(self, batch: np.ndarray) -> int:
        """How many utterances of ``batch`` (indices, padded together) fit one tower's batch: at least
        one, unless an utterance's own scores are over the cap (``JointTooLarge``, naming it)."""
        each = self.mib_each(*self._padded(batch))
        if each <= self.max_mib:
            return int(self.max_mib // each)
        for index in batch:
            frames, labels = self._padded(np.array([index]))
            alone = self.mib_each(frames, labels)
            if alone > self.max_mib:
                padded = ", padded to its bucket: training.bucket_growth" if self.grid is not None else ""
                raise JointTooLarge(
                    f"it alone needs {alone:.0f} MiB for the joiner ({int(self.output_frames(frames))} "
                    f"frames x {labels + 1} label positions{padded}), over "
                    f"model.transducer.max_joint_mib {self.max_mib:g}",
                    int(index),
                )
        return 1
