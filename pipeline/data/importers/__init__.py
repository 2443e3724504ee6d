"""Corpus importers: one module per corpus layout (``data.corpora[].importer``), each naming its
implementation ``IMPORTER``; ``importer(name)`` finds a built-in one by module name or a user's by
dotted module path (see ``native_client.plugins``)."""

from __future__ import annotations

from native_client.plugins import find_plugin


def importer(name: str, what: str = "data.corpora[].importer"):
    """The importer named ``name`` (a module of this package, or a dotted module path)."""
    return find_plugin(__name__, name, "IMPORTER", what)
