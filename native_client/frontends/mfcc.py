"""MFCC as python_speech_features computes it (DeepSpeech's training default): 26 coefficients of 25 ms
windows every 10 ms, the first replaced by the log frame energy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from native_client.frontends._base import MAX_CHANNELS, MAX_FFT, FrontEnd, round_half_up, setting


@dataclass(frozen=True)
class MfccSettings:
    """The ``features.*`` keys of the ``mfcc`` front end."""

    numcep: int = setting(26, "MFCC coefficients per frame (the model's n_input).", minimum=1)
    nfilt: int = setting(26, "Mel filters.", minimum=1, maximum=MAX_CHANNELS)
    winlen: float = setting(0.025, "Analysis window length in seconds.", minimum=0.0, exclusive_min=True)
    winstep: float = setting(0.01, "Step between frames in seconds.", minimum=0.0, exclusive_min=True)
    nfft: int = setting(512, "FFT size.", minimum=1, maximum=MAX_FFT)
    preemph: float = setting(0.97, "Pre-emphasis coefficient.", minimum=0.0, maximum=1.0)
    ceplifter: int = setting(22, "Cepstral lifter.", minimum=0)


def check_window(settings, sample_rate: int) -> None:
    """The window checks python_speech_features' front ends share: the step fits in the window and the
    FFT covers it."""
    if settings.winstep > settings.winlen:
        raise ValueError(f"winstep: expected at most winlen ({settings.winlen}), got {settings.winstep}")
    frame = int(round_half_up(settings.winlen * sample_rate))
    if settings.nfft < frame:
        raise ValueError(
            f"nfft: expected at least the window length in samples ({frame}), got {settings.nfft}"
        )


class PythonSpeechFeaturesFrontEnd(FrontEnd):
    """What python_speech_features' front ends share: settings ``winlen``/``winstep`` in seconds (rounded
    to samples as it rounds them) and ``preemph``."""

    @property
    def preemphasis(self) -> float:
        """``preemph``."""
        return self.settings.preemph

    @property
    def frame_length(self) -> int:
        """``winlen`` in samples, rounded as python_speech_features rounds it."""
        return int(round_half_up(self.settings.winlen * self.sample_rate))

    @property
    def frame_step(self) -> int:
        """``winstep`` in samples."""
        return int(round_half_up(self.settings.winstep * self.sample_rate))


class Mfcc(PythonSpeechFeaturesFrontEnd):
    """python_speech_features' ``mfcc`` (no window function, energy in the first coefficient)."""

    name = "mfcc"
    Settings = MfccSettings

    def check(self) -> None:
        """numcep at most nfilt; the window checks of ``check_window``."""
        if self.settings.numcep > self.settings.nfilt:
            raise ValueError(
                f"numcep: expected at most nfilt ({self.settings.nfilt}), got {self.settings.numcep}"
            )
        check_window(self.settings, self.sample_rate)

    @property
    def feature_size(self) -> int:
        """``numcep``."""
        return self.settings.numcep

    def windows_to_features(self, signal: np.ndarray) -> np.ndarray:
        """python_speech_features' mfcc over whole windows (pre-emphasis already applied)."""
        from python_speech_features import mfcc  # here, so that reading a config does not load scipy

        s = self.settings
        return mfcc(
            signal,
            samplerate=self.sample_rate,
            winlen=s.winlen,
            winstep=s.winstep,
            numcep=s.numcep,
            nfilt=s.nfilt,
            nfft=s.nfft,
            preemph=0.0,
            ceplifter=s.ceplifter,
        )


FRONTEND = Mfcc
