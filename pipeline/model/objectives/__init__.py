"""Training objectives: one module per ``model.objective``, each defining ``OBJECTIVE``.

To add one, write ``pipeline/model/objectives/<name>.py`` (or a module of your own, named by its dotted
path in ``model.objective``) defining ``OBJECTIVE = YourObjective()``, an ``Objective``
(``pipeline.model.objective``).
"""

from __future__ import annotations

from native_client.plugins import find_plugin
from pipeline.model.objective import Objective

__all__ = ["Objective", "model_objective"]


def model_objective(name: str) -> Objective:
    """The objective named by ``model.objective`` (a module of this package or a dotted module path)."""
    found = find_plugin(__name__, name, "OBJECTIVE", "model.objective")
    if not isinstance(found, Objective):
        raise TypeError(f"model.objective: {name!r}: OBJECTIVE must be an Objective instance, got {found!r}")
    return found
