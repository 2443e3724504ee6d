"""A front end of a user's own: log energies of equal-width frequency bands of Hann-windowed frames."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from native_client.frontends import FrontEnd, setting


@dataclass(frozen=True)
class BandSettings:
    """The ``features.*`` keys of this front end."""

    bands: int = setting(12, "Frequency bands per frame.", minimum=1)
    window_ms: float = setting(25.0, "Window length in milliseconds.", minimum=1.0)
    step_ms: float = setting(10.0, "Step between windows in milliseconds.", minimum=1.0)


class BandEnergies(FrontEnd):
    """``bands`` log band energies per frame; the last partial window is dropped."""

    name = "band_energies"
    Settings = BandSettings
    pads_last_frame = False

    @property
    def feature_size(self) -> int:
        """``bands``."""
        return self.settings.bands

    @property
    def frame_length(self) -> int:
        """``window_ms`` in samples."""
        return int(self.settings.window_ms * self.sample_rate / 1000)

    @property
    def frame_step(self) -> int:
        """``step_ms`` in samples."""
        return int(self.settings.step_ms * self.sample_rate / 1000)

    def windows_to_features(self, signal: np.ndarray) -> np.ndarray:
        """Log band energies of each whole window."""
        count = 1 + (len(signal) - self.frame_length) // self.frame_step
        starts = np.arange(count) * self.frame_step
        frames = np.stack([signal[s : s + self.frame_length] for s in starts]) * np.hanning(self.frame_length)
        power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
        bands = np.array_split(power, self.settings.bands, axis=1)
        return np.log(np.stack([b.sum(axis=1) for b in bands], axis=1) + 1e-3)


FRONTEND = BandEnergies
