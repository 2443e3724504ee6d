"""A model's features from its export metadata: the front end it names, with its settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from native_client.cmvn import stats_from_metadata
from native_client.frontends import FeaturePipeline, frontend_class, normalize_mode
from native_client.ranges import SAMPLE_RATE, Range, check_fields, value_problem


def features_from_metadata(entry: dict, plugins: Iterable[str] = ()) -> FeaturePipeline:
    """The feature pipeline of an export's ``features`` entry (``type``, ``sample_rate``, ``normalize``
    (with ``global``, the training set's ``mean`` and ``std`` per coefficient) and the front end's
    settings; format 1 exports, without ``type``, are python_speech_features MFCC).
    A front end of someone's own (a dotted ``type``) is loaded only when named in ``plugins``: the
    metadata must not choose code to import. Each setting is checked against its type and range (those of
    the config), so that an edited file cannot make a front end of 3,000,000 filters. Raises ValueError,
    KeyError or PluginError naming what is missing or wrong."""
    values = dict(entry)
    name = values.pop("type", "mfcc")
    sample_rate, normalize = values.pop("sample_rate"), values.pop("normalize", False)
    mean, std = values.pop("mean", None), values.pop("std", None)
    for key, value, expected in (("type", name, Range(str)), ("sample_rate", sample_rate, SAMPLE_RATE)):
        if problem := value_problem(value, expected):
            raise ValueError(f"{key}: {problem}")
    normalize_mode(normalize)
    if normalize != "global" and (mean is not None or std is not None):
        raise ValueError(f"mean, std: only with normalize: global (normalize is {normalize!r})")
    frontend = frontend_class(name, "features.type", allowed=plugins)
    known = {f.name for f in dataclasses.fields(frontend.Settings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"features: {', '.join(unknown)} are not settings of the {name} front end")
    check_fields(frontend.Settings, values, "")
    pipeline = FeaturePipeline(frontend(frontend.Settings(**values), sample_rate), normalize, name)
    if normalize == "global":
        if mean is None or std is None:
            raise ValueError(
                "normalize: global, but the mean and std lists (the training set's statistics) are missing"
            )
        pipeline = pipeline.with_stats(stats_from_metadata(mean, std, pipeline.feature_size))
    return pipeline
