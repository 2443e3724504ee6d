"""Finding an implementation by name: the one lookup behind every extension point.

A name without a dot is a module of the project's own package for that kind
(``features.type: logfbank`` -> ``native_client.frontends.logfbank``); a dotted
name is any importable module (``features.type: mylab.frontends.pncc``), so a
user adds an implementation as one file of their own, without editing the
project. The module names its implementation in one attribute (``FRONTEND``,
``FAMILY``, ``DECODER``, ``IMPORTER``).
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


class PluginError(ValueError):
    """No implementation of that name; the message says where it was looked for and what exists."""


def builtin_names(package: str) -> list[str]:
    """The modules of ``package`` that are implementations (every module not starting with ``_``)."""
    module = importlib.import_module(package)
    return sorted(info.name for info in pkgutil.iter_modules(module.__path__) if not info.name.startswith("_"))


def find_plugin(package: str, name: str, attribute: str, what: str) -> object:
    """``attribute`` of the module ``name`` (relative to ``package`` unless dotted).

    Raises PluginError naming ``what`` (e.g. ``features.type``), the module looked
    for and the built-in names; an error inside the module itself is not hidden.
    """
    module_name = name if "." in name else f"{package}.{name}"
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise PluginError(f"{what}: {name!r} is not a module name; built in: {', '.join(builtin_names(package))}")
    try:
        module: ModuleType = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise PluginError(
                f"{what}: no module {module_name!r}; built in: {', '.join(builtin_names(package))}"
                f" (or the dotted name of an importable module of your own)"
            ) from None
        raise
    if not hasattr(module, attribute):
        raise PluginError(f"{what}: module {module_name!r} defines no {attribute}")
    return getattr(module, attribute)
