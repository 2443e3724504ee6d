"""Audio-level augmentation at feature time: extra copies of the training utterances, each played at
another speed, at another volume and/or with a noise recording mixed in. The copies are cached like any
utterance, so they cost nothing per epoch; every draw is seeded by (``augment.seed``, row, copy)."""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from pathlib import Path

import numpy as np
from scipy.signal import resample_poly

from native_client.audio import load_checked
from pipeline.config import AugmentConfig

NOISE_SUFFIXES = (".wav", ".flac", ".ogg")


@dataclass(frozen=True)
class Variant:
    """How one copy differs from its utterance."""

    copy: int
    speed: float
    gain_db: float
    noise: str | None = None
    snr_db: float = 0.0
    noise_offset: float = 0.0  # where in the noise recording to start, as a fraction of its length

    def describe(self) -> str:
        """A short tag for reports: ``copy 2: speed 1.1, gain -2.3 dB, noise rain.wav at 14.2 dB``."""
        parts = [f"speed {self.speed:g}"] if self.speed != 1.0 else []
        if self.gain_db:
            parts.append(f"gain {self.gain_db:+.1f} dB")
        if self.noise:
            parts.append(f"noise {Path(self.noise).name} at {self.snr_db:.1f} dB")
        return f"copy {self.copy}: " + (", ".join(parts) or "unchanged")


def noise_files(settings: AugmentConfig) -> list[str]:
    """The noise recordings of ``augment.noise_dir``, sorted (so draws are reproducible)."""
    if not settings.noise_dir:
        return []
    return sorted(str(p) for p in Path(settings.noise_dir).iterdir() if p.suffix.lower() in NOISE_SUFFIXES)


def variants(settings: AugmentConfig, row: int, noises: list[str]) -> list[Variant]:
    """The copies of the training utterance at position ``row``: one per speed factor, then
    ``audio_copies`` at the original speed; gain and noise drawn per copy."""
    speeds = list(settings.speed_factors) + [1.0] * settings.audio_copies
    found = []
    for copy, speed in enumerate(speeds, 1):
        draw = np.random.default_rng([settings.seed, row, copy])
        gain = float(draw.uniform(-settings.gain_db, settings.gain_db)) if settings.gain_db else 0.0
        noise, snr, offset = None, 0.0, 0.0
        if noises:
            noise = noises[int(draw.integers(len(noises)))]
            snr = float(draw.uniform(*settings.noise_snr_db))
            offset = float(draw.uniform())
        found.append(Variant(copy, speed, gain, noise, snr, offset))
    return found


def _change_speed(samples: np.ndarray, speed: float) -> np.ndarray:
    """Play ``speed`` times faster (tempo and pitch, as sox's ``speed``): ``len / speed`` samples."""
    if speed == 1.0:
        return samples
    up, down = 1000, int(round(speed * 1000))
    divisor = gcd(up, down)
    return resample_poly(samples.astype(np.float64), up // divisor, down // divisor)


def apply_variant(samples: np.ndarray, variant: Variant, sample_rate: int) -> np.ndarray:
    """The int16 samples of one copy: speed, then gain, then noise at the drawn SNR (noise looped or cut
    to the utterance's length from the drawn offset)."""
    audio = _change_speed(samples, variant.speed).astype(np.float64)
    audio *= 10 ** (variant.gain_db / 20)
    if variant.noise:
        noise = load_checked(variant.noise, sample_rate, convert_rate=True, downmix=True).astype(np.float64)
        if len(noise) and np.any(noise):
            start = int(variant.noise_offset * len(noise))
            noise = np.resize(np.roll(noise, -start), len(audio))
            signal_power = np.mean(audio**2) or 1.0
            noise *= np.sqrt(signal_power / (np.mean(noise**2) * 10 ** (variant.snr_db / 10)))
            audio += noise
    return np.clip(np.round(audio), -32768, 32767).astype(np.int16)
