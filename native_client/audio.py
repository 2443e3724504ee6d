"""Reading audio: WAV, FLAC and the other formats soundfile decodes, as int16 mono samples."""

from __future__ import annotations

from collections.abc import Iterator
from math import gcd
from pathlib import Path

import numpy as np
import soundfile
from scipy.signal import resample_poly


class AudioError(ValueError):
    """Audio that cannot be used; ``reason`` is a short code for reports, the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _info(path: str | Path):
    """soundfile's header information; AudioError for a missing, empty or undecodable file."""
    path = Path(path)
    if not path.exists():
        raise AudioError("missing_file", f"{path}: no such file")
    if path.is_file() and path.stat().st_size == 0:
        raise AudioError("empty_audio", f"{path}: empty file (0 bytes)")
    try:
        return soundfile.info(str(path))
    except (RuntimeError, soundfile.LibsndfileError, TypeError, ValueError) as error:
        raise AudioError(
            "unreadable_audio",
            f"{path}: cannot decode audio: not a sound file libsndfile reads (WAV, FLAC, OGG, ...): {error}",
        ) from error


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a sound file as int16 samples ``[frames, channels]`` and its sample rate.

    Raises AudioError("unreadable_audio") for anything soundfile cannot decode.
    """
    try:
        samples, rate = soundfile.read(str(path), dtype="int16", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError, TypeError, ValueError) as error:
        raise AudioError("unreadable_audio", f"{path}: cannot decode audio: {error}") from error
    return samples, rate


def to_mono(samples: np.ndarray) -> np.ndarray:
    """Average the channels of ``[frames, channels]`` int16 samples into one int16 channel."""
    if samples.shape[1] == 1:
        return samples[:, 0]
    return np.round(samples.astype(np.float64).mean(axis=1)).astype(np.int16)


def resample(samples: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    """Polyphase resampling of int16 mono samples from ``rate`` to ``target_rate``."""
    if rate == target_rate:
        return samples
    divisor = gcd(rate, target_rate)
    out = resample_poly(samples.astype(np.float64), target_rate // divisor, rate // divisor)
    return np.clip(np.round(out), -32768, 32767).astype(np.int16)


def load_checked(
    path: str | Path,
    sample_rate: int,
    *,
    convert_rate: bool = False,
    downmix: bool = True,
    convert_hint: str = "",
    downmix_hint: str = "",
) -> np.ndarray:
    """Read ``path`` as int16 mono at ``sample_rate``: the one audio check of training and inference.

    Raises AudioError with reason ``unreadable_audio``, ``empty_audio``,
    ``too_many_channels`` (unless ``downmix``, which averages the channels) or
    ``wrong_sample_rate`` (unless ``convert_rate``, which resamples). The hints
    say how the caller's user turns conversion on (a config key, a flag).
    """
    samples, rate = read_audio(path)
    if samples.shape[0] == 0:
        raise AudioError("empty_audio", f"{path}: no audio samples (header only)")
    if samples.shape[1] > 1 and not downmix:
        raise AudioError(
            "too_many_channels",
            f"{path}: {samples.shape[1]} channels, expected mono"
            + (f" ({downmix_hint})" if downmix_hint else ""),
        )
    if rate != sample_rate and not convert_rate:
        raise AudioError(
            "wrong_sample_rate",
            f"{path}: sample rate {rate} Hz, expected {sample_rate} Hz"
            + (f" ({convert_hint})" if convert_hint else ""),
        )
    return resample(to_mono(samples), rate, sample_rate)


def stream_for_model(
    path: str | Path,
    sample_rate: int,
    convert_rate: bool = False,
    block_seconds: float = 10.0,
    on_resample=None,
) -> Iterator[np.ndarray]:
    """``load_for_model`` in blocks of ``block_seconds`` (int16 mono), so that a long recording is never
    in memory whole; the same checks and errors. Resampling (``convert_rate``) reads the whole file,
    after calling ``on_resample(rate)``."""
    info = _info(path)
    if info.frames == 0 or info.samplerate != sample_rate:
        if info.frames and convert_rate and on_resample is not None:
            on_resample(info.samplerate)
        yield load_for_model(path, sample_rate, convert_rate)
        return
    try:
        for block in soundfile.blocks(
            str(path), blocksize=max(1, int(block_seconds * info.samplerate)), dtype="int16", always_2d=True
        ):
            yield to_mono(block)
    except (RuntimeError, soundfile.LibsndfileError, TypeError, ValueError) as error:
        raise AudioError("unreadable_audio", f"{path}: cannot decode audio: {error}") from error


def load_for_model(path: str | Path, sample_rate: int, convert_rate: bool = False) -> np.ndarray:
    """Read ``path`` for a model trained at ``sample_rate``: channels are averaged; another rate is
    refused with AudioError("wrong_sample_rate") unless ``convert_rate``, which resamples."""
    return load_checked(
        path,
        sample_rate,
        convert_rate=convert_rate,
        convert_hint="without --no-resample the client resamples it; accuracy may suffer",
    )
