"""MFCC features exactly as training computes them, for whole utterances and for streams.

Training (``pipeline.features.frontend``) calls ``mfcc_features`` from here, so a
client cannot drift from the features its model was trained on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from python_speech_features import mfcc
from python_speech_features.sigproc import round_half_up


@dataclass(frozen=True)
class FeatureSettings:
    """The MFCC settings a model was trained with (``features`` in the export metadata)."""

    sample_rate: int
    numcep: int
    nfilt: int
    winlen: float
    winstep: float
    nfft: int
    preemph: float
    ceplifter: int
    normalize: bool

    @classmethod
    def from_dict(cls, values: dict) -> FeatureSettings:
        """Settings from a mapping with (at least) these field names."""
        return cls(**{name: values[name] for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict:
        """The settings as a plain dict (for metadata)."""
        return asdict(self)

    @property
    def frame_length(self) -> int:
        """Samples per analysis window."""
        return int(round_half_up(self.winlen * self.sample_rate))

    @property
    def frame_step(self) -> int:
        """Samples between window starts."""
        return int(round_half_up(self.winstep * self.sample_rate))


def _mfcc(signal: np.ndarray, settings: FeatureSettings, preemph: float) -> np.ndarray:
    return mfcc(
        signal,
        samplerate=settings.sample_rate,
        winlen=settings.winlen,
        winstep=settings.winstep,
        numcep=settings.numcep,
        nfilt=settings.nfilt,
        nfft=settings.nfft,
        preemph=preemph,
        ceplifter=settings.ceplifter,
    ).astype(np.float32)


def normalize_frames(frames: np.ndarray) -> np.ndarray:
    """Per-utterance normalisation: zero mean and unit variance per coefficient."""
    return (frames - frames.mean(axis=0)) / (frames.std(axis=0) + 1e-6)


def mfcc_features(samples: np.ndarray, settings: FeatureSettings) -> np.ndarray:
    """MFCC of int16 mono samples: float32 ``[frames, numcep]``, normalised when the settings say so."""
    out = _mfcc(samples, settings, settings.preemph)
    return normalize_frames(out) if settings.normalize else out


def frame_count(n_samples: int, settings: FeatureSettings) -> int:
    """Frames python_speech_features makes of ``n_samples`` (the last one zero-padded)."""
    if n_samples <= settings.frame_length:
        return 1
    return 1 + int(math.ceil((n_samples - settings.frame_length) / settings.frame_step))


class StreamingMfcc:
    """MFCC of audio arriving in chunks of any size, frame for frame equal to ``mfcc_features``
    on the whole signal (before normalisation, which needs the whole utterance).

    Pre-emphasis is applied here, carrying the previous sample across chunks, and
    python_speech_features then runs without it on whole frames only.
    """

    def __init__(self, settings: FeatureSettings):
        self.settings = settings
        self._previous = None  # last raw sample seen, for pre-emphasis
        self._pending = np.zeros(0)  # emphasised samples from the start of the next frame on
        self._samples = 0
        self._frames = 0
        self._finished = False

    def _emphasise(self, chunk: np.ndarray) -> np.ndarray:
        chunk = np.asarray(chunk).astype(np.float64)
        before = np.empty_like(chunk)
        before[1:] = chunk[:-1]
        if self._previous is None:
            before[0] = 0.0
            emphasised = chunk - self.settings.preemph * before
            emphasised[0] = chunk[0]
        else:
            before[0] = self._previous
            emphasised = chunk - self.settings.preemph * before
        self._previous = chunk[-1]
        return emphasised

    def _take(self, n_frames: int) -> np.ndarray:
        step, length = self.settings.frame_step, self.settings.frame_length
        needed = (n_frames - 1) * step + length
        signal = self._pending[:needed]
        if len(signal) < needed:
            signal = np.concatenate([signal, np.zeros(needed - len(signal))])
        frames = _mfcc(signal, self.settings, preemph=0.0)
        self._pending = self._pending[n_frames * step :]
        self._frames += n_frames
        return frames

    def feed(self, chunk: np.ndarray) -> np.ndarray:
        """Add int16 samples; returns the MFCC frames ``[n, numcep]`` completed by them (maybe none)."""
        if self._finished:
            raise RuntimeError("the stream is finished")
        chunk = np.asarray(chunk)
        if chunk.size == 0:
            return np.zeros((0, self.settings.numcep), np.float32)
        self._pending = np.concatenate([self._pending, self._emphasise(chunk.reshape(-1))])
        self._samples += chunk.size
        length, step = self.settings.frame_length, self.settings.frame_step
        # A frame is complete when its window is full and a later sample exists, because
        # python_speech_features only ends on a full window when nothing follows it.
        if len(self._pending) <= length:
            return np.zeros((0, self.settings.numcep), np.float32)
        return self._take(1 + (len(self._pending) - length - 1) // step)

    def finish(self) -> np.ndarray:
        """The remaining frames, the last one zero-padded as python_speech_features pads it."""
        if self._finished:
            raise RuntimeError("the stream is finished")
        self._finished = True
        if self._samples == 0:
            return np.zeros((0, self.settings.numcep), np.float32)
        remaining = frame_count(self._samples, self.settings) - self._frames
        if remaining <= 0:
            return np.zeros((0, self.settings.numcep), np.float32)
        return self._take(remaining)


def window_view(frames: np.ndarray, n_context: int) -> np.ndarray:
    """``[time, n_input]`` -> a read-only view ``[time, 2*n_context+1, n_input]`` (float32) over one
    zero-padded copy of the frames: the windows are not materialised (19x the frames' memory)."""
    time, n_input = frames.shape
    padded = np.zeros((time + 2 * n_context, n_input), dtype=np.float32)
    padded[n_context : n_context + time] = frames
    window = 2 * n_context + 1
    return np.lib.stride_tricks.sliding_window_view(padded, window, axis=0).transpose(0, 2, 1)[:time]


def context_windows(frames: np.ndarray, n_context: int) -> np.ndarray:
    """``[time, n_input]`` -> ``[time, 2*n_context+1, n_input]``; frames past the edges are zero."""
    return window_view(frames, n_context).astype(frames.dtype, copy=True)
