"""MFCC features of the training data; the computation itself is ``native_client.features``."""

from __future__ import annotations

from native_client.features import FeatureSettings, context_windows
from pipeline.config import FeaturesConfig

__all__ = ["context_windows", "ctc_min_frames", "feature_settings"]


def feature_settings(features: FeaturesConfig) -> FeatureSettings:
    """The settings an inference client needs to compute the same features."""
    return FeatureSettings(
        sample_rate=features.sample_rate,
        numcep=features.numcep,
        nfilt=features.nfilt,
        winlen=features.winlen,
        winstep=features.winstep,
        nfft=features.nfft,
        preemph=features.preemph,
        ceplifter=features.ceplifter,
        normalize=features.normalize,
    )


def ctc_min_frames(labels) -> int:
    """Fewest time steps CTC needs for ``labels``: one per label plus a blank between repeats."""
    repeats = sum(1 for a, b in zip(labels, labels[1:], strict=False) if a == b)
    return len(labels) + repeats
