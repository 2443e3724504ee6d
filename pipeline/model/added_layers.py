"""Layers the pipeline adds to a family's built model (the feature normalisation, an objective's head), so
that the family contract does not change."""

from __future__ import annotations

from collections.abc import Callable

import keras


def add_layer(model, attribute: str, make: Callable[[], object]):
    """``make()``'s layer (built by ``make``) as ``model.<attribute>``, tracked with the model's own
    weights; returns it (None, and nothing added, when ``make`` gives None). Built inside the model's
    name scope, its weights are named ``<attribute's layer name>.<weight>`` like the model's own."""
    with keras.name_scope(model.name, caller=model):
        layer = make()
    if layer is None:
        return None
    # Keras locks a built model's state.
    model._tracker.unlock()
    try:
        setattr(model, attribute, layer)
    finally:
        model._tracker.lock()
    return layer
