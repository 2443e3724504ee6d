"""Feature front ends: one module per ``features.type``, shared by training and the client.

A front end turns int16 mono samples into float32 frames ``[frames, feature_size]``
and declares its settings as a frozen dataclass (its fields are the ``features.*``
keys it accepts, documented with ``setting``). Training computes the cache with it
and the export records ``type`` and the settings, so the client rebuilds the same
front end from the metadata: one definition of the numbers for both sides.

To add one, write ``native_client/frontends/<name>.py`` defining ``FRONTEND`` (a
``FrontEnd`` subclass), or a module of your own named by its dotted path in
``features.type``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from native_client.frontends._base import (
    FeaturePipeline,
    FrameStream,
    FrontEnd,
    normalize_frames,
    normalize_mode,
    setting,
)
from native_client.plugins import PluginError, find_plugin

__all__ = [
    "FeaturePipeline",
    "FrameStream",
    "FrontEnd",
    "frontend_class",
    "normalize_frames",
    "normalize_mode",
    "setting",
]

# Keys of the ``features`` section and of the metadata entry that are not a front end's own.
RESERVED = ("type", "sample_rate", "normalize", "mean", "std", "resample", "downmix", "workers")


def frontend_class(
    name: str, what: str = "features.type", allowed: Iterable[str] | None = None
) -> type[FrontEnd]:
    """The front end named ``name``: a module of this package, or a dotted module path of one's own
    (with ``allowed``, only one listed there). PluginError when it is none or not a proper front end."""
    found = find_plugin(__name__, name, "FRONTEND", what, allowed)
    if not (isinstance(found, type) and issubclass(found, FrontEnd)):
        raise PluginError(f"{what}: {name!r}: FRONTEND must be a FrontEnd subclass, got {found!r}")
    clashes = [f.name for f in dataclasses.fields(found.Settings) if f.name in RESERVED]
    if clashes:
        raise PluginError(
            f"{what}: {name!r}: its settings may not be named {', '.join(clashes)} "
            f"(keys of the features section itself)"
        )
    return found
