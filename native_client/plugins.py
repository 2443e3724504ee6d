"""Finding an implementation by name: the one lookup behind every extension point.

A name without a dot is a module of the project's own package for that kind
(``features.type: logfbank`` -> ``native_client.frontends.logfbank``); a dotted
name is any importable module (``features.type: mylab.frontends.pncc``), so a
user adds an implementation as one file of their own, without editing the
project. The module names its implementation in one attribute (``FRONTEND``,
``FAMILY``, ``DECODER``, ``IMPORTER``); helper modules of a package start with
``_``.

A dotted name read from a file someone else made (an export's metadata) would
let that file choose code to import: such callers pass ``allowed`` and only
names in it (and built-in ones) are loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType


class PluginError(ValueError):
    """No implementation of that name; the message says where it was looked for and what exists."""


def builtin_names(package: str, attribute: str) -> list[str]:
    """The modules of ``package`` whose source defines ``attribute``: the built-in implementations.
    Read from the source files, not imported (importing a model family loads TensorFlow)."""
    spec = importlib.util.find_spec(package)
    found = []
    for info in pkgutil.iter_modules(spec.submodule_search_locations):
        if info.name.startswith("_"):
            continue
        source = Path(info.module_finder.path) / f"{info.name}.py"
        text = source.read_text(encoding="utf-8") if source.is_file() else ""
        if re.search(rf"^{attribute}\s*[:=]", text, re.M):
            found.append(info.name)
    return sorted(found)


def module_of(package: str, name: str) -> str:
    """The module a name stands for: ``<package>.<name>`` for a built-in name, the name itself when dotted."""
    return name if "." in name else f"{package}.{name}"


def plugin_exists(package: str, name: str) -> bool:
    """Whether the module ``name`` stands for can be found, without importing it."""
    if not name or not all(part.isidentifier() for part in name.split(".")):
        return False
    try:
        return importlib.util.find_spec(module_of(package, name)) is not None
    except (ImportError, ValueError):
        return False


def find_plugin(
    package: str, name: str, attribute: str, what: str, allowed: Iterable[str] | None = None
) -> object:
    """``attribute`` of the module ``name`` (relative to ``package`` unless dotted).

    Raises PluginError naming ``what`` (e.g. ``features.type``), the module looked
    for and the built-in names; an error inside the module itself (a dependency it
    lacks, say) is not hidden. With ``allowed``, a dotted name must be in it.
    """
    builtins = lambda: ", ".join(builtin_names(package, attribute)) or "none"  # noqa: E731
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise PluginError(f"{what}: {name!r} is not a module name; built in: {builtins()}")
    module_name = module_of(package, name)
    if allowed is not None and "." in name and name not in set(allowed):
        raise PluginError(
            f"{what}: {name!r} is a module of someone's own, not a built-in one ({builtins()}); "
            f"load it only if you trust it (the client's --allow-plugin {name})"
        )
    try:
        module: ModuleType = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise PluginError(
                f"{what}: no module {module_name!r}; built in: {builtins()}"
                f" (or the dotted name of an importable module of your own)"
            ) from None
        raise
    if not hasattr(module, attribute):
        raise PluginError(f"{what}: module {module_name!r} defines no {attribute}")
    return getattr(module, attribute)
