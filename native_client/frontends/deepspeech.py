"""DeepSpeech's own features (DeepSpeech 0.7+, Coqui STT): TensorFlow's ``AudioSpectrogram`` and ``Mfcc`` ops.

Their training (``audio_to_features``) and their models' MFCC subgraph compute
``Mfcc(AudioSpectrogram(samples / 32768, window 512, stride 320, magnitude_squared),
sample_rate, lower 20 Hz, upper sample_rate / 2, 40 channels, 26 coefficients)``:
32 ms windows every 20 ms at 16 kHz, 50 frames per second.

Written here in numpy, following TensorFlow's C++ kernels (spectrogram.cc,
mfcc_mel_filterbank.cc, mfcc_dct.cc, mfcc.cc) step for step and in the same
precisions (float32 samples, double arithmetic, a float32 power spectrum, float32
coefficients), so that neither training nor the client needs TensorFlow for them:
a periodic Hann window, an FFT of the next power of two, the squared magnitude;
then the square root of each bin, HTK-style triangular mel weights from
``lower_frequency_limit`` (DC excluded) to ``upper_frequency_limit``, the log with a
floor of 1e-12, and an orthonormal-scaled DCT-II. Hand-written because no library
computes TensorFlow's particular filterbank (its bin-to-band mapping and weights
differ from librosa's and python_speech_features'); tests compare it with the
TensorFlow ops and with a Coqui model's own ``mfccs`` output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from native_client.frontends._base import MAX_CHANNELS, FrontEnd, setting

# The longest window: at 384 kHz (the highest features.sample_rate) a 65,536-point FFT, as MAX_FFT.
MAX_WINDOW_S = 0.1
# Below this a mel band's log is taken of the floor instead (TensorFlow's kFilterbankFloor).
FILTERBANK_FLOOR = 1e-12


@dataclass(frozen=True)
class DeepSpeechSettings:
    """The ``features.*`` keys of the ``deepspeech`` front end (DeepSpeech's and Coqui STT's defaults)."""

    numcep: int = setting(
        26,
        "MFCC coefficients per frame (TensorFlow's dct_coefficient_count; the model's n_input).",
        minimum=1,
    )
    filterbank_channels: int = setting(
        40, "Mel filterbank channels (filterbank_channel_count).", minimum=1, maximum=MAX_CHANNELS
    )
    winlen: float = setting(
        0.032,
        "Window length in seconds (DeepSpeech's feature_win_len, 32 ms); a whole number of samples.",
        minimum=0.0,
        maximum=MAX_WINDOW_S,
        exclusive_min=True,
    )
    winstep: float = setting(
        0.02,
        "Step between windows in seconds (feature_win_step, 20 ms); a whole number of samples.",
        minimum=0.0,
        exclusive_min=True,
    )
    lowfreq: float = setting(20.0, "Lowest mel band edge in Hz (lower_frequency_limit).", minimum=0.0)
    highfreq: float = setting(
        0.0,
        "Highest mel band edge in Hz (upper_frequency_limit); 0 = half the sample rate, "
        "as DeepSpeech sets it.",
        minimum=0.0,
    )
    final_window: bool = setting(
        False,
        "Add one last frame of the samples after the last whole window, "
        "zero-padded, as DeepSpeech's native client does when a stream ends (their "
        "training, like TensorFlow's op, drops those samples).",
    )


def whole_samples(seconds: float, sample_rate: int, key: str) -> int:
    """``seconds`` at ``sample_rate`` as a sample count; ValueError naming ``key`` unless it is whole."""
    samples = seconds * sample_rate
    if abs(samples - round(samples)) > 1e-6 or round(samples) < 2:
        raise ValueError(f"{key}: {seconds:g} s is not a whole number (>= 2) of samples at {sample_rate} Hz")
    return int(round(samples))


def periodic_hann(length: int) -> np.ndarray:
    """TensorFlow's spectrogram window: ``0.5 - 0.5 cos(2 pi i / length)`` in double."""
    return 0.5 - 0.5 * np.cos(2.0 * math.pi * np.arange(length) / length)


def hz_to_mel(frequency):
    """The mel scale TensorFlow's filterbank uses: ``1127 ln(1 + f / 700)``."""
    return 1127.0 * np.log1p(np.asarray(frequency, dtype=np.float64) / 700.0)


def mel_weights(bins: int, sample_rate: int, channels: int, lower: float, upper: float) -> np.ndarray:
    """The ``[bins, channels]`` matrix of TensorFlow's ``MfccMelFilterbank``: each spectrum bin between
    the limits (DC excluded) weighs ``w`` into the band whose centre is at or below it and ``1 - w`` into
    the next one, ``w`` falling linearly in mel between the two centres."""
    centres = hz_to_mel(lower) + (hz_to_mel(upper) - hz_to_mel(lower)) / (channels + 1) * np.arange(
        1, channels + 2
    )
    hz_per_bin = 0.5 * sample_rate / (bins - 1)
    start = int(1.5 + lower / hz_per_bin)
    end = int(upper / hz_per_bin)
    matrix = np.zeros((bins, channels))
    mel_low = hz_to_mel(lower)
    for i in range(start, min(end, bins - 1) + 1):
        mel = hz_to_mel(i * hz_per_bin)
        # The band whose right slope this bin is on: the last centre below it (-1: below the first centre).
        channel = int(np.searchsorted(centres[:channels], mel, side="left")) - 1
        if channel >= 0:
            weight = (centres[channel + 1] - mel) / (centres[channel + 1] - centres[channel])
            matrix[i, channel] += weight
        else:
            weight = (centres[0] - mel) / (centres[0] - mel_low)
        if channel + 1 < channels:
            matrix[i, channel + 1] += 1.0 - weight
    return matrix


def dct_matrix(coefficients: int, channels: int) -> np.ndarray:
    """TensorFlow's ``MfccDct``: ``sqrt(2 / n) cos(pi i (j + 0.5) / n)``, ``[coefficients, channels]``."""
    i, j = np.meshgrid(np.arange(coefficients), np.arange(channels), indexing="ij")
    return math.sqrt(2.0 / channels) * np.cos(math.pi / channels * i * (j + 0.5))


class DeepSpeechFrontEnd(FrontEnd):
    """TensorFlow's AudioSpectrogram + Mfcc as DeepSpeech 0.7+ and Coqui STT compute features."""

    name = "deepspeech"
    Settings = DeepSpeechSettings
    pads_last_frame = False

    def check(self) -> None:
        """Whole-sample windows, the step within the window, band edges in order below Nyquist, at most as
        many coefficients as channels (TensorFlow's own conditions, as ValueErrors naming the key)."""
        s, nyquist = self.settings, self.sample_rate / 2
        length = whole_samples(s.winlen, self.sample_rate, "winlen")
        if whole_samples(s.winstep, self.sample_rate, "winstep") > length:
            raise ValueError(f"winstep: expected at most winlen ({s.winlen:g}), got {s.winstep:g}")
        if self.upper > nyquist:
            raise ValueError(
                f"highfreq: expected at most half the sample rate ({nyquist:g}), got {s.highfreq:g}"
            )
        if s.lowfreq >= self.upper:
            raise ValueError(f"lowfreq: expected below highfreq ({self.upper:g}), got {s.lowfreq:g}")
        if s.numcep > s.filterbank_channels:
            raise ValueError(
                f"numcep: expected at most filterbank_channels ({s.filterbank_channels}), got {s.numcep}"
            )

    @property
    def upper(self) -> float:
        """The upper band edge in Hz (``highfreq``, or half the sample rate)."""
        return self.settings.highfreq or self.sample_rate / 2

    @property
    def feature_size(self) -> int:
        """``numcep``."""
        return self.settings.numcep

    @property
    def frame_length(self) -> int:
        """``winlen`` in samples (512 at 16 kHz)."""
        return whole_samples(self.settings.winlen, self.sample_rate, "winlen")

    @property
    def frame_step(self) -> int:
        """``winstep`` in samples (320 at 16 kHz)."""
        return whole_samples(self.settings.winstep, self.sample_rate, "winstep")

    @property
    def fft_length(self) -> int:
        """The FFT size: the window length rounded up to a power of two."""
        return 1 << (self.frame_length - 1).bit_length()

    def frame_count(self, n_samples: int) -> int:
        """Whole windows, plus the final zero-padded one when ``final_window``."""
        length, step = self.frame_length, self.frame_step
        whole = 0 if n_samples < length else 1 + (n_samples - length) // step
        return whole + int(self.settings.final_window)

    @cached_property
    def _matrices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # The op's frequency limits are float32 attributes: round them as TensorFlow does.
        lower, upper = float(np.float32(self.settings.lowfreq)), float(np.float32(self.upper))
        bins = self.fft_length // 2 + 1
        weights = mel_weights(bins, self.sample_rate, self.settings.filterbank_channels, lower, upper)
        return (
            periodic_hann(self.frame_length),
            weights,
            dct_matrix(self.settings.numcep, self.settings.filterbank_channels).T,
        )

    def power_spectrum(self, signal: np.ndarray) -> np.ndarray:
        """AudioSpectrogram with ``magnitude_squared``: float32 ``[k, fft_length / 2 + 1]`` of the whole
        windows of ``signal`` (int16 sample values)."""
        window, _, _ = self._matrices
        # TensorFlow reads float32 samples scaled by 1/32768 and computes in double.
        samples = (np.asarray(signal, np.float64) / 32768.0).astype(np.float32).astype(np.float64)
        frames = np.lib.stride_tricks.sliding_window_view(samples, self.frame_length)[:: self.frame_step]
        spectrum = np.fft.rfft(frames * window, n=self.fft_length, axis=1)
        return (spectrum.real**2 + spectrum.imag**2).astype(np.float32)

    def windows_to_features(self, signal: np.ndarray) -> np.ndarray:
        """Mfcc of the power spectrum of each whole window: float32 ``[k, numcep]``."""
        _, weights, dct = self._matrices
        bands = np.sqrt(self.power_spectrum(signal).astype(np.float64)) @ weights
        return (np.log(np.maximum(bands, FILTERBANK_FLOOR)) @ dct).astype(np.float32)


FRONTEND = DeepSpeechFrontEnd
