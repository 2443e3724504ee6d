"""The statistics of ``features.normalize: global``: each coefficient's mean and standard deviation over
the train split's features, from the float64 sums its cache's writer recorded (no pass over the frames).

The sums are attributes of the cache, written with it under its temporary name and renamed into place
with it, so they exist exactly when the whole cache does. Train pools them when a run starts (every worker
of a multi-worker run the same recorded sums in the same order, so the very same numbers) into the model's
normalisation layer (``pipeline.model.normalization``), whose checkpoints carry them to every later stage.
A multi-task config pools every task's train cache: the tasks share one encoder, which takes one input
distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from native_client.cmvn import GlobalStats
from pipeline.features.cache import CacheError, frame_sums


def train_statistics(caches: Sequence[Path]) -> GlobalStats:
    """The mean and standard deviation per coefficient over every frame of ``caches`` (train splits'
    caches, pooled). CacheError naming a cache that records no sums, or ones of another width."""
    count, total, squares, first = 0, None, None, None
    for path in caches:
        frames, sums, square_sums = frame_sums(path)
        if total is None:
            total, squares, first = np.zeros_like(sums), np.zeros_like(square_sums), path
        elif sums.shape != total.shape:
            raise CacheError(
                f"{path}: {sums.shape[0]} coefficients per frame, but {first} has {total.shape[0]}"
            )
        count, total, squares = count + frames, total + sums, squares + square_sums
    if total is None or count == 0:
        raise CacheError(f"{', '.join(map(str, caches)) or 'no train cache'}: no frames to normalise with")
    return GlobalStats.from_sums(count, total, squares)
