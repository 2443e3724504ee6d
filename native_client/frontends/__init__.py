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

from native_client.frontends.base import FeaturePipeline, FrameStream, FrontEnd, setting
from native_client.plugins import find_plugin

__all__ = ["FeaturePipeline", "FrameStream", "FrontEnd", "frontend_class", "setting"]


def frontend_class(name: str, what: str = "features.type") -> type[FrontEnd]:
    """The front end named ``name``: a module of this package, or a dotted module path of one's own."""
    found = find_plugin(__name__, name, "FRONTEND", what)
    if not (isinstance(found, type) and issubclass(found, FrontEnd)):
        raise TypeError(f"{what}: {name!r}: FRONTEND must be a FrontEnd subclass, got {found!r}")
    return found
