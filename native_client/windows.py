"""Context windows of feature frames (DeepSpeech's ``input_node``): the one numpy definition, used by the
client's whole-utterance and streaming paths alike (training makes them inside the model)."""

from __future__ import annotations

import numpy as np


def window_view(frames: np.ndarray, n_context: int) -> np.ndarray:
    """``[time, n_input]`` -> a read-only view ``[time, 2*n_context+1, n_input]`` (float32) over one
    zero-padded copy of the frames: the windows are not materialised (19x the frames' memory)."""
    time, n_input = frames.shape
    if time == 0:
        return np.zeros((0, 2 * n_context + 1, n_input), np.float32)
    padded = np.zeros((time + 2 * n_context, n_input), dtype=np.float32)
    padded[n_context : n_context + time] = frames
    return ready_windows(padded, 2 * n_context + 1, time)


def ready_windows(padded: np.ndarray, window: int, count: int) -> np.ndarray:
    """The first ``count`` windows of ``window`` frames over frames that already hold their context:
    window ``i`` is ``padded[i : i + window]`` (a view, not a copy)."""
    return np.lib.stride_tricks.sliding_window_view(padded, window, axis=0).transpose(0, 2, 1)[:count]


def context_windows(frames: np.ndarray, n_context: int) -> np.ndarray:
    """``[time, n_input]`` -> ``[time, 2*n_context+1, n_input]``; frames past the edges are zero."""
    return window_view(frames, n_context).astype(frames.dtype, copy=True)
