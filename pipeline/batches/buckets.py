"""Padded batch shapes on a fixed grid (``training.bucket_growth``), so a run sees few distinct shapes.

Without it each batch is padded to its own longest utterance and labels to its
own longest label: every batch of an epoch can be a new shape, and on a GPU each
new shape is one XLA compile (``training.jit_compile``) or one round of cuDNN's
convolution autotuning. With it a batch's frames are padded up to the next value
of a grid that grows by at most ``growth`` a step (multiples of 8: 8, 16, ...,
then ``x growth`` rounded down to 8), the same for every split and corpus, and its
labels to the longest label of any utterance of the split up to that grid value,
rounded up to 8: one label width per frame bucket. The batch plan's sizes are
fixed per bucket (``batch_plan``), so the shapes of an epoch are about as many as
the buckets its lengths span.

For the same random draws padding changes no loss, logit or gradient (beyond
float rounding): the models read lengths and masks, the losses label lengths. But
dropout's masks and ``augment.feature_noise_std``'s noise are drawn over the padded
shape, so a bucketed run draws other numbers than an unbucketed one: another run
(the key is in Train's fingerprint), not a worse one.
"""

from __future__ import annotations

import numpy as np

QUANTUM = 8  # frames and labels are padded to multiples of this


def _round_up(value: np.ndarray | int) -> np.ndarray:
    """``value`` rounded up to a multiple of ``QUANTUM`` (at least one ``QUANTUM``)."""
    return np.maximum(QUANTUM, -(-np.asarray(value, np.int64) // QUANTUM) * QUANTUM)


def frame_grid(longest: int, growth: float) -> np.ndarray:
    """The grid's values up to the first one at least ``longest``: ``QUANTUM``, then each the previous
    times ``growth`` rounded down to a multiple of ``QUANTUM``, and at least ``QUANTUM`` more."""
    grid = [QUANTUM]
    while grid[-1] < longest:
        grown = int(grid[-1] * growth) // QUANTUM * QUANTUM
        grid.append(max(grid[-1] + QUANTUM, grown))
    return np.array(grid, np.int64)


class ShapeGrid:
    """The padded shapes of one split's batches: ``frames(longest)`` and ``labels(longest)`` for a batch
    whose longest utterance has ``longest`` frames. Built from the split's index (frame and label
    lengths, in memory anyway), not from its features."""

    def __init__(self, lengths: np.ndarray, label_lengths: np.ndarray, growth: float):
        if growth <= 1.0:
            raise ValueError(f"a shape grid grows by a factor above 1, got {growth}")
        lengths = np.asarray(lengths, np.int64)
        self.grid = frame_grid(int(lengths.max(initial=0)), growth)
        # The widest label of any utterance at most as long as each grid value: a batch's labels all
        # belong to utterances no longer than its frame bucket.
        widest = np.zeros(len(self.grid), np.int64)
        np.maximum.at(widest, np.searchsorted(self.grid, lengths), np.asarray(label_lengths, np.int64))
        self.label_widths = _round_up(np.maximum.accumulate(widest))

    def bucket(self, longest: int) -> int:
        """The grid position of a batch whose longest utterance has ``longest`` frames."""
        position = int(np.searchsorted(self.grid, longest))
        if position == len(self.grid):
            raise ValueError(f"{longest} frames is longer than the split this grid was made for")
        return position

    def frames(self, longest: int) -> int:
        """The padded frames of a batch whose longest utterance has ``longest`` frames."""
        return int(self.grid[self.bucket(longest)])

    def labels(self, longest: int) -> int:
        """The padded label width of a batch whose longest utterance has ``longest`` frames."""
        return int(self.label_widths[self.bucket(longest)])


def shape_grid(index, growth: float) -> ShapeGrid | None:
    """The grid of a cached split (``CacheIndex``) with ``training.bucket_growth`` ``growth``; None when
    it is 0 (off)."""
    if not growth:
        return None
    return ShapeGrid(index.lengths, np.array([len(label) for label in index.labels], np.int64), growth)
