"""What every feature front end provides, the frame arithmetic they share, and streaming.

Front ends here are *windowed*: frame ``i`` is computed from the samples
``[i * frame_step, i * frame_step + frame_length)`` after an optional
pre-emphasis (``y[n] = x[n] - a * x[n-1]``). That is enough to stream any of them
frame for frame equal to the whole-utterance computation (``FrameStream``), so a
new front end only says how it turns whole windows into features.
"""

from __future__ import annotations

import abc
import dataclasses
import decimal
import math
from typing import Any, ClassVar

import numpy as np

from native_client.cmvn import GlobalStats

# Bounds that keep a front end's filterbank small whatever an export's metadata says (1,024 filters over a
# 65,536-point FFT: 268 MB); speech uses ~40 filters and 512 points.
MAX_CHANNELS = 1024
MAX_FFT = 65536


def setting(default: Any, doc: str, *, minimum=None, maximum=None, exclusive_min: bool = False):
    """A front-end setting: a dataclass field with its documentation and range (the same metadata the
    config schema's own fields carry, so the loader checks and documents both alike)."""
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for sequence defaults")
    meta = {"doc": doc, "min": minimum, "max": maximum, "exclusive_min": exclusive_min, "path": False}
    return dataclasses.field(default=default, metadata=meta)


class FrontEnd(abc.ABC):
    """A feature front end: settings in, ``frames(samples)`` out.

    Subclasses set ``name``, ``Settings`` (a frozen dataclass of ``setting`` fields)
    and implement ``feature_size``, ``frame_length``, ``frame_step`` and
    ``windows_to_features``; ``preemphasis`` and ``pads_last_frame`` describe the
    framing. ``check()`` may refuse inconsistent settings with a ValueError naming
    the key.
    """

    name: ClassVar[str]
    Settings: ClassVar[type]
    # Coefficient of the pre-emphasis filter applied before framing (0: none).
    preemphasis: float = 0.0
    # Whether a last, partial window is zero-padded into a frame (python_speech_features) or dropped
    # (TensorFlow's AudioSpectrogram).
    pads_last_frame: bool = True

    def __init__(self, settings, sample_rate: int):
        self.settings = settings
        self.sample_rate = int(sample_rate)
        self.check()
        # Streaming assumes consecutive windows touch or overlap (no samples between them to skip).
        if not 0 < self.frame_step <= self.frame_length:
            raise ValueError(
                f"the frame step ({self.frame_step} samples) must be between 1 and the window "
                f"length ({self.frame_length} samples)"
            )

    # An optional hook, deliberately not abstract: a front end without cross-setting constraints
    # (a plugin's, say) need not override it.
    def check(self) -> None:  # noqa: B027
        """Raise ValueError ``"<key>: ..."`` for settings that contradict each other (default: none)."""

    @property
    @abc.abstractmethod
    def feature_size(self) -> int:
        """Values per frame (the model's ``n_input``)."""

    @property
    @abc.abstractmethod
    def frame_length(self) -> int:
        """Samples per analysis window."""

    @property
    @abc.abstractmethod
    def frame_step(self) -> int:
        """Samples between window starts."""

    @abc.abstractmethod
    def windows_to_features(self, signal: np.ndarray) -> np.ndarray:
        """Features ``[k, feature_size]`` of a float64 signal (already pre-emphasised) that is exactly
        ``(k - 1) * frame_step + frame_length`` samples long: its ``k`` whole windows."""

    @property
    def seconds_per_frame(self) -> float:
        """The frame step in seconds (word timings, frame rates)."""
        return self.frame_step / self.sample_rate

    def frame_count(self, n_samples: int) -> int:
        """Frames made of ``n_samples`` samples."""
        length, step = self.frame_length, self.frame_step
        if self.pads_last_frame:
            if n_samples == 0:
                return 0
            return 1 if n_samples <= length else 1 + math.ceil((n_samples - length) / step)
        return 0 if n_samples < length else 1 + (n_samples - length) // step

    def frames(self, samples: np.ndarray) -> np.ndarray:
        """Features ``[frames, feature_size]`` (float32) of a whole utterance of int16 mono samples."""
        samples = np.asarray(samples).reshape(-1)
        count = self.frame_count(len(samples))
        if count == 0:
            return np.zeros((0, self.feature_size), np.float32)
        signal = emphasise(samples.astype(np.float64), self.preemphasis, previous=None)
        return self._features_of(signal, count)

    def _features_of(self, signal: np.ndarray, count: int) -> np.ndarray:
        needed = (count - 1) * self.frame_step + self.frame_length
        if len(signal) < needed:
            signal = np.concatenate([signal, np.zeros(needed - len(signal))])
        return np.asarray(self.windows_to_features(signal[:needed]), dtype=np.float32)

    def stream(self) -> FrameStream:
        """A stream computing the same frames from audio arriving in chunks."""
        return FrameStream(self)

    def describe(self) -> dict:
        """``type`` and every setting, as plain data (the export metadata and the cache record it)."""
        return {"type": self.name, **dataclasses.asdict(self.settings)}


def round_half_up(number: float) -> int:
    """Round halves up, as python_speech_features rounds window sizes (its own function would import scipy
    with the package, and a config is read without loading it)."""
    return int(decimal.Decimal(number).quantize(decimal.Decimal("1"), rounding=decimal.ROUND_HALF_UP))


def emphasise(signal: np.ndarray, coefficient: float, previous: float | None) -> np.ndarray:
    """Pre-emphasis ``y[n] = x[n] - a * x[n-1]``; the first sample of an utterance (``previous`` None) is
    kept as it is, as python_speech_features does."""
    if not coefficient or len(signal) == 0:
        return signal
    before = np.empty_like(signal)
    before[1:] = signal[:-1]
    before[0] = 0.0 if previous is None else previous
    out = signal - coefficient * before
    if previous is None:
        out[0] = signal[0]
    return out


class FrameStream:
    """Frames of audio arriving in chunks of any size, equal frame for frame to ``FrontEnd.frames`` on
    the whole signal. ``feed`` returns the frames each chunk completes; ``finish`` the rest."""

    def __init__(self, frontend: FrontEnd):
        self.frontend = frontend
        self._previous: float | None = None  # last raw sample, for pre-emphasis across chunks
        self._pending = np.zeros(0)  # emphasised samples from the start of the next frame on
        self._samples = 0
        self._frames = 0
        self._finished = False

    def _empty(self) -> np.ndarray:
        return np.zeros((0, self.frontend.feature_size), np.float32)

    def _take(self, count: int) -> np.ndarray:
        frames = self.frontend._features_of(self._pending, count)
        self._pending = self._pending[count * self.frontend.frame_step :]
        self._frames += count
        return frames

    def feed(self, chunk: np.ndarray) -> np.ndarray:
        """Add int16 samples; returns the frames ``[n, feature_size]`` they complete (maybe none)."""
        if self._finished:
            raise RuntimeError("the stream is finished")
        chunk = np.asarray(chunk).reshape(-1).astype(np.float64)
        if chunk.size == 0:
            return self._empty()
        self._pending = np.concatenate(
            [self._pending, emphasise(chunk, self.frontend.preemphasis, self._previous)]
        )
        self._previous = float(chunk[-1])
        self._samples += chunk.size
        length, step = self.frontend.frame_length, self.frontend.frame_step
        # A padding front end's frame is final only when a later sample exists: with nothing after it,
        # a full last window is also where the utterance ends, and the count rule may differ there.
        spare = 1 if self.frontend.pads_last_frame else 0
        if len(self._pending) < length + spare:
            return self._empty()
        return self._take(1 + (len(self._pending) - length - spare) // step)

    def finish(self) -> np.ndarray:
        """The remaining frames (the last one zero-padded when the front end pads)."""
        if self._finished:
            raise RuntimeError("the stream is finished")
        self._finished = True
        remaining = self.frontend.frame_count(self._samples) - self._frames
        return self._take(remaining) if remaining > 0 else self._empty()


def normalize_frames(frames: np.ndarray) -> np.ndarray:
    """Per-utterance normalisation: zero mean and unit variance per coefficient."""
    return (frames - frames.mean(axis=0)) / (frames.std(axis=0) + 1e-6)


NORMALIZE_MODES = (False, True, "global")


def normalize_mode(value) -> bool | str:
    """``value`` as a normalisation mode: false (none), true (per utterance) or ``"global"`` (the training
    set's statistics, frame by frame). ValueError for anything else (also 0 and 1)."""
    if not any(value == mode and type(value) is type(mode) for mode in NORMALIZE_MODES):
        raise ValueError(f"normalize: expected true, false or global, got {value!r}")
    return value


class FeaturePipeline:
    """A model's whole feature computation: front end, sample rate and normalisation.

    Built from the config by training and from the export metadata's ``features``
    entry by the client (``from_dict``), so both compute the same numbers.
    ``normalize``: false, true (each utterance to zero mean and unit variance with its own statistics)
    or ``"global"`` (with ``stats``, the training set's, frame by frame: ``normalise``).
    """

    def __init__(
        self,
        frontend: FrontEnd,
        normalize: bool | str,
        type_name: str | None = None,
        stats: GlobalStats | None = None,
    ):
        self.frontend = frontend
        self.normalize = normalize_mode(normalize)
        if stats is not None and normalize != "global":
            raise ValueError("mean, std: global statistics only go with normalize: global")
        if stats is not None and stats.feature_size != frontend.feature_size:
            raise ValueError(
                f"mean, std: {stats.feature_size} values each, but the front end gives "
                f"{frontend.feature_size} per frame"
            )
        self.stats = stats
        # The name the front end was found by (``features.type``: a built-in name or a dotted module).
        self.type_name = type_name or frontend.name

    @property
    def per_utterance(self) -> bool:
        """Whether each utterance is normalised with its own statistics (no frame is final before its end)."""
        return self.normalize is True

    def with_stats(self, stats: GlobalStats) -> FeaturePipeline:
        """This pipeline with the training set's statistics (``normalize: global``)."""
        return FeaturePipeline(self.frontend, self.normalize, self.type_name, stats)

    @property
    def sample_rate(self) -> int:
        """The sample rate the front end expects."""
        return self.frontend.sample_rate

    @property
    def feature_size(self) -> int:
        """Values per frame."""
        return self.frontend.feature_size

    @property
    def seconds_per_frame(self) -> float:
        """Seconds between frames."""
        return self.frontend.seconds_per_frame

    def normalise(self, frames: np.ndarray) -> np.ndarray:
        """The frame-by-frame step of the normalisation: ``frames`` with the global statistics applied
        (``normalize: global``), unchanged otherwise. ValueError for global without statistics."""
        if self.normalize != "global":
            return frames
        if self.stats is None:
            raise ValueError("normalize: global, but no mean and std (the training set's statistics) given")
        return self.stats.apply(frames)

    def utterance_frames(self, samples: np.ndarray) -> np.ndarray:
        """Features of a whole utterance as the feature cache holds them: normalised per utterance when
        ``normalize`` is true; global statistics are not applied (the model's own layer applies them)."""
        out = self.frontend.frames(samples)
        return normalize_frames(out) if self.per_utterance and len(out) else out

    def frames(self, samples: np.ndarray) -> np.ndarray:
        """Features of a whole utterance, normalised as ``normalize`` says (what the model takes)."""
        return self.normalise(self.utterance_frames(samples))

    def frames_of_blocks(self, blocks) -> tuple[np.ndarray, int]:
        """Features of one utterance arriving as int16 blocks, equal to ``utterance_frames`` of the whole
        signal (``FrameStream`` is frame-exact), and the number of samples seen. Memory: the frames and one
        block, never the whole signal or its windows (an hour of audio as windows is gigabytes)."""
        stream, pieces, samples = self.frontend.stream(), [], 0
        for block in blocks:
            samples += len(block)
            pieces.append(stream.feed(block))
        pieces.append(stream.finish())
        out = np.concatenate(pieces)
        return (normalize_frames(out) if self.per_utterance and len(out) else out), samples

    def to_dict(self) -> dict:
        """The metadata entry: ``type``, ``sample_rate``, ``normalize`` and the front end's settings, and
        with global statistics their ``mean`` and ``std``."""
        return {
            **self.frontend.describe(),
            "type": self.type_name,
            "sample_rate": self.sample_rate,
            "normalize": self.normalize,
            **(self.stats.to_dict() if self.stats is not None else {}),
        }
