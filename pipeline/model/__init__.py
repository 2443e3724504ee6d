"""Model families: one module per ``model.architecture``, each defining ``FAMILY``.

A family gives the training model, its streaming form built from the *same*
layers, the recurrent state the export and the client carry between calls,
and the order of its layers (what ``training.drop_source_layers`` counts). To
add one, write ``pipeline/model/<name>.py`` (or a module of your own, named by
its dotted path in ``model.architecture``) defining ``FAMILY = YourFamily()``.
"""

from __future__ import annotations

from native_client.plugins import find_plugin
from pipeline.model.family import ModelFamily, StateTensor, StreamingForm

__all__ = ["ModelFamily", "StateTensor", "StreamingForm", "build_model", "model_family"]


def model_family(name: str) -> ModelFamily:
    """The family named by ``model.architecture`` (a module of this package or a dotted module path)."""
    found = find_plugin(__name__, name, "FAMILY", "model.architecture")
    if not isinstance(found, ModelFamily):
        raise TypeError(f"model.architecture: {name!r}: FAMILY must be a ModelFamily instance, got {found!r}")
    return found


def build_model(
    config, n_input: int, n_classes: int, precision: str = "float32", normalized: bool = False, stats=None
):
    """The training model of ``config`` (a ``ModelConfig``) with its weights made (deterministic per
    ``random_seed``): the family's network, its output layer as wide as the objective asks, and the
    objective's own layers as ``objective_head`` when it has some; ``precision`` is a Keras dtype
    policy, the variables stay float32. ``normalized`` (``features.normalize: global``): with the feature
    normalisation layer (``normalization.py``), holding ``stats`` (a ``GlobalStats``), else the identity
    until its statistics are set or restored."""
    from pipeline.model.objectives import model_objective

    objective = model_objective(config.objective)
    model = model_family(config.architecture).build(
        config, n_input, objective.output_width(config, n_classes), precision
    )
    from pipeline.model.added_layers import add_layer

    add_layer(model, "objective_head", lambda: objective.build_head(config, n_classes, precision))
    if normalized:
        from pipeline.model.normalization import add_normalization

        add_normalization(model, n_input, stats)
    return model
