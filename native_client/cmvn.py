"""Global feature normalisation (``features.normalize: global``): one mean and standard deviation per
feature coefficient, computed once over the training set and applied frame by frame.

Per-utterance normalisation needs the whole utterance before its first frame is known; with global
statistics every frame is normalised as soon as it exists, so a model trained that way streams. Since
export format 6 the statistics are weights of the model and its graph applies them
(``pipeline.model.normalization``, the same float32 arithmetic as ``apply``); the client applies them
itself only for exports of format 5, whose metadata carries them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# A coefficient that never varies over the training set is divided by this instead of 0.
STD_FLOOR = 1e-6


@dataclass(frozen=True)
class GlobalStats:
    """The training set's mean and standard deviation of each feature coefficient (float64 values)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def from_sums(cls, count: int, total: np.ndarray, squares: np.ndarray) -> GlobalStats:
        """The statistics of ``count`` frames whose coefficients sum to ``total`` and whose squares sum to
        ``squares`` (float64 sums; the population standard deviation, as numpy's ``std``). ValueError for
        no frames."""
        if count <= 0:
            raise ValueError("no frames to compute the statistics from")
        total, squares = np.asarray(total, np.float64), np.asarray(squares, np.float64)
        mean = total / count
        variance = np.maximum(squares / count - mean * mean, 0.0)
        return cls(tuple(float(v) for v in mean), tuple(float(v) for v in np.sqrt(variance)))

    @property
    def feature_size(self) -> int:
        """Coefficients per frame."""
        return len(self.mean)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, standard deviation) as float32 arrays, the deviation floored at ``STD_FLOOR``: the numbers
        every normalisation divides by."""
        mean = np.asarray(self.mean, np.float32)
        return mean, np.maximum(np.asarray(self.std, np.float64), STD_FLOOR).astype(np.float32)

    def apply(self, frames: np.ndarray) -> np.ndarray:
        """``frames`` ``[n, feature_size]`` normalised: ``(frames - mean) / std`` in float32 (the standard
        deviation floored at ``STD_FLOOR``)."""
        mean, std = self.arrays()
        return (np.asarray(frames, np.float32) - mean) / std

    def to_dict(self) -> dict:
        """``mean`` and ``std`` as lists (the export's metadata entry)."""
        return {"mean": list(self.mean), "std": list(self.std)}


def stats_from_metadata(mean, std, feature_size: int) -> GlobalStats:
    """The statistics an export's ``features`` entry records. ValueError ``mean: ...`` / ``std: ...`` for
    a value that is not a list of ``feature_size`` finite numbers (a standard deviation not negative)."""
    for key, values in (("mean", mean), ("std", std)):
        wanted = f"expected a list of {feature_size} finite numbers"
        if not isinstance(values, list) or len(values) != feature_size:
            shown = f"{len(values)} values" if isinstance(values, list) else repr(values)[:60]
            raise ValueError(f"{key}: {wanted}, got {shown}")
        for position, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{key}[{position}]: {wanted}, got {value!r}")
            if key == "std" and value < 0:
                raise ValueError(f"std[{position}]: a standard deviation cannot be negative, got {value!r}")
    return GlobalStats(tuple(float(v) for v in mean), tuple(float(v) for v in std))
