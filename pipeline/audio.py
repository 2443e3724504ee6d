"""Reading and checking audio: WAV or FLAC through soundfile, as int16 mono at the configured rate."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from native_client.audio import AudioError, read_audio, resample, to_mono
from pipeline.config import FeaturesConfig

__all__ = ["AudioError", "load_checked", "read_audio", "resample", "to_mono"]


def load_checked(path: str | Path, features: FeaturesConfig) -> np.ndarray:
    """Read ``path`` and return int16 mono samples at ``features.sample_rate``.

    Raises AudioError with reason ``unreadable_audio``, ``empty_audio``,
    ``wrong_sample_rate`` (unless ``features.resample``) or
    ``too_many_channels`` (unless ``features.downmix``).
    """
    samples, rate = read_audio(path)
    if samples.shape[0] == 0:
        raise AudioError("empty_audio", f"{path}: no audio samples (header only)")
    if samples.shape[1] > 1 and not features.downmix:
        raise AudioError("too_many_channels", f"{path}: {samples.shape[1]} channels, expected mono (set features.downmix: true to average them)")
    if rate != features.sample_rate and not features.resample:
        raise AudioError("wrong_sample_rate", f"{path}: sample rate {rate} Hz, expected {features.sample_rate} Hz (set features.resample: true to convert)")
    return resample(to_mono(samples), rate, features.sample_rate)
