"""MFCC features (python_speech_features) and context windows."""
from __future__ import annotations

import numpy as np
from python_speech_features import mfcc

from pipeline.config import FeaturesConfig


def compute_mfcc(samples: np.ndarray, features: FeaturesConfig) -> np.ndarray:
    """MFCC of int16 mono samples: float32 ``[frames, numcep]``, optionally normalised per utterance."""
    out = mfcc(
        samples,
        samplerate=features.sample_rate,
        winlen=features.winlen,
        winstep=features.winstep,
        numcep=features.numcep,
        nfilt=features.nfilt,
        nfft=features.nfft,
        preemph=features.preemph,
        ceplifter=features.ceplifter,
    ).astype(np.float32)
    if features.normalize:
        out = (out - out.mean(axis=0)) / (out.std(axis=0) + 1e-6)
    return out


def context_windows(frames: np.ndarray, n_context: int) -> np.ndarray:
    """``[time, n_input]`` -> ``[time, 2*n_context+1, n_input]``; frames past the edges are zero."""
    time, n_input = frames.shape
    padded = np.zeros((time + 2 * n_context, n_input), dtype=frames.dtype)
    padded[n_context:n_context + time] = frames
    window = 2 * n_context + 1
    return np.lib.stride_tricks.sliding_window_view(padded, window, axis=0).transpose(0, 2, 1)[:time].copy()


def ctc_min_frames(labels) -> int:
    """Fewest time steps CTC needs for ``labels``: one per label plus a blank between repeats."""
    repeats = sum(1 for a, b in zip(labels, labels[1:]) if a == b)
    return len(labels) + repeats
