"""The training side of the feature front ends: the config's front end."""

from __future__ import annotations

from native_client.cmvn import GlobalStats
from native_client.frontends import FeaturePipeline, frontend_class
from pipeline.config import FeaturesConfig


def feature_pipeline(features: FeaturesConfig, stats: GlobalStats | None = None) -> FeaturePipeline:
    """The features ``features`` describes: its front end (``features.type`` with its settings) at
    ``sample_rate``, normalised as ``normalize`` says (``global``: with ``stats``, the train split's, when
    given); the export records its ``to_dict()``."""
    frontend = frontend_class(features.type)(features.frontend, features.sample_rate)
    return FeaturePipeline(frontend, features.normalize, features.type, stats)
