"""Log mel filterbank energies as python_speech_features computes them (``logfbank``): ``nfilt`` values
per frame, no cepstral transform."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from native_client.frontends._base import MAX_CHANNELS, MAX_FFT, setting
from native_client.frontends.mfcc import PythonSpeechFeaturesFrontEnd, check_window


@dataclass(frozen=True)
class LogFbankSettings:
    """The ``features.*`` keys of the ``logfbank`` front end."""

    nfilt: int = setting(
        40, "Mel filters (values per frame: the model's n_input).", minimum=1, maximum=MAX_CHANNELS
    )
    winlen: float = setting(0.025, "Analysis window length in seconds.", minimum=0.0, exclusive_min=True)
    winstep: float = setting(0.01, "Step between frames in seconds.", minimum=0.0, exclusive_min=True)
    nfft: int = setting(512, "FFT size.", minimum=1, maximum=MAX_FFT)
    lowfreq: float = setting(0.0, "Lowest band edge of the mel filters in Hz.", minimum=0.0)
    highfreq: float = setting(
        0.0, "Highest band edge of the mel filters in Hz; 0 = half the sample rate.", minimum=0.0
    )
    preemph: float = setting(0.97, "Pre-emphasis coefficient.", minimum=0.0, maximum=1.0)


class LogFbank(PythonSpeechFeaturesFrontEnd):
    """python_speech_features' ``logfbank``."""

    name = "logfbank"
    Settings = LogFbankSettings

    def check(self) -> None:
        """Band edges inside [0, sample_rate / 2] and in order; the window checks of ``check_window``."""
        s, nyquist = self.settings, self.sample_rate / 2
        if s.highfreq > nyquist:
            raise ValueError(
                f"highfreq: expected at most half the sample rate ({nyquist:g}), got {s.highfreq}"
            )
        if s.lowfreq >= (s.highfreq or nyquist):
            raise ValueError(f"lowfreq: expected below highfreq ({s.highfreq or nyquist:g}), got {s.lowfreq}")
        check_window(s, self.sample_rate)

    @property
    def feature_size(self) -> int:
        """``nfilt``."""
        return self.settings.nfilt

    def windows_to_features(self, signal: np.ndarray) -> np.ndarray:
        """python_speech_features' logfbank over whole windows (pre-emphasis already applied)."""
        from python_speech_features import logfbank  # here, so that reading a config does not load scipy

        s = self.settings
        return logfbank(
            signal,
            samplerate=self.sample_rate,
            winlen=s.winlen,
            winstep=s.winstep,
            nfilt=s.nfilt,
            nfft=s.nfft,
            lowfreq=s.lowfreq,
            highfreq=s.highfreq or None,
            preemph=0.0,
        )


FRONTEND = LogFbank
