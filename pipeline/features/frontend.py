"""The training side of the feature front ends: the config's front end."""

from __future__ import annotations

from native_client.frontends import FeaturePipeline, frontend_class
from pipeline.config import FeaturesConfig


def feature_pipeline(features: FeaturesConfig) -> FeaturePipeline:
    """The features ``features`` describes: its front end (``features.type`` with its settings) at
    ``sample_rate``, normalised as ``normalize`` says (``global`` is the model's own layer, so these
    features are never normalised globally: ``pipeline.model.normalization``)."""
    frontend = frontend_class(features.type)(features.frontend, features.sample_rate)
    return FeaturePipeline(frontend, features.normalize, features.type)


def client_features(features: FeaturesConfig) -> FeaturePipeline:
    """The features a client computes for a model of ``features`` (the export records its ``to_dict()``):
    the front end's, normalised per utterance with ``normalize: true``, raw otherwise (with ``global`` the
    model normalises them itself)."""
    pipeline = feature_pipeline(features)
    if features.normalize != "global":
        return pipeline
    return FeaturePipeline(pipeline.frontend, False, pipeline.type_name)
