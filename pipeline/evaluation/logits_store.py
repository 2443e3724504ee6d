"""A split's logits on disk: written utterance by utterance while a model runs, read back as a stream.

Evaluate and TuneDecoder keep logits here instead of in memory (about 42 MB per
audio hour at 29 classes): the decoders read them back one utterance at a time,
and TuneDecoder reads them once per trial from the page cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

CHUNK_FRAMES = 8192


class LogitsStore:
    """Logits ``[time, classes]`` of ``count`` utterances in one HDF5 file (a scratch file, not an output)."""

    def __init__(self, path: Path, count: int, classes: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = h5py.File(self.path, "w")
        self._frames = self._file.create_dataset(
            "logits",
            shape=(0, classes),
            maxshape=(None, classes),
            dtype=np.float32,
            chunks=(CHUNK_FRAMES, classes),
        )
        self.starts = np.full(count, -1, np.int64)
        self.lengths = np.zeros(count, np.int64)
        self._used = 0

    def put(self, index: int, logits: np.ndarray) -> None:
        """Append the logits of utterance ``index`` (any order; each index once)."""
        length = len(logits)
        if self._used + length > self._frames.shape[0]:
            self._frames.resize(max(self._used + length, 2 * self._frames.shape[0]), axis=0)
        self._frames[self._used : self._used + length] = logits
        self.starts[index], self.lengths[index] = self._used, length
        self._used += length

    def __iter__(self) -> Iterator[np.ndarray]:
        """Every utterance's logits in index order."""
        missing = np.flatnonzero(self.starts < 0)
        if len(missing):
            raise ValueError(f"{self.path}: no logits for utterance(s) {missing[:5].tolist()}")
        for start, length in zip(self.starts, self.lengths, strict=False):
            yield self._frames[start : start + length]

    def __len__(self) -> int:
        return len(self.starts)

    def close(self) -> None:
        """Close and delete the file."""
        self._file.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> LogitsStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
