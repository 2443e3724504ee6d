"""A model's features from its export metadata: the front end it names, with its settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from native_client.frontends import FeaturePipeline, frontend_class


def features_from_metadata(entry: dict, plugins: Iterable[str] = ()) -> FeaturePipeline:
    """The feature pipeline of an export's ``features`` entry (``type``, ``sample_rate``, ``normalize``
    and the front end's settings; format 1 exports, without ``type``, are python_speech_features MFCC).
    A front end of someone's own (a dotted ``type``) is loaded only when named in ``plugins``: the
    metadata must not choose code to import. Raises ValueError, KeyError or PluginError naming what is
    missing or wrong."""
    values = dict(entry)
    name = values.pop("type", "mfcc")
    sample_rate, normalize = values.pop("sample_rate"), values.pop("normalize", False)
    frontend = frontend_class(name, "features.type", allowed=plugins)
    known = {f.name for f in dataclasses.fields(frontend.Settings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"features: {', '.join(unknown)} are not settings of the {name} front end")
    return FeaturePipeline(frontend(frontend.Settings(**values), sample_rate), normalize, name)
