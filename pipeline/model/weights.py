"""Model weights by name: the stable keys checkpoints store them under, and a digest of a model's weights.

Model weights are saved under explicit names (``weights/layer_1.kernel``)
rather than through Keras' object graph, so every weight (the LSTM's too) has
a stable, readable key that mismatch messages, warm starts and exports can use.
No TensorFlow import here: the names are read off the model's variables.
"""

from __future__ import annotations

import hashlib


def weight_name(variable) -> str:
    """Stable name of a model weight, e.g. ``layer_1.kernel`` or ``lstm.lstm_cell.recurrent_kernel``."""
    return ".".join(variable.path.split("/")[1:])


def named_weights(model) -> dict:
    """{name: variable} for every model weight (what checkpoints store under ``weights/``); a model that
    names its weights itself (``pipeline.model.heads.MultiTaskModel``) gives its own."""
    if hasattr(model, "named_weights"):
        return model.named_weights()
    return {weight_name(v): v for v in model.weights}


def rng_states(model) -> dict:
    """{path: variable} of the model's random-number state (Keras 3 Dropout's ``seed_generator_state``):
    in ``model.variables`` but not ``model.weights``, and needed for a resumed run to draw the same masks
    (a model that names them itself gives its own)."""
    if hasattr(model, "rng_states"):
        return model.rng_states()
    weights = {id(v) for v in model.weights}
    return {v.path.replace("/", "."): v for v in model.variables if id(v) not in weights}


def weights_digest(model) -> str:
    """SHA-256 over every weight's name and bytes, in name order (equal digests: identical models)."""
    digest = hashlib.sha256()
    for name, variable in sorted(named_weights(model).items()):
        digest.update(name.encode())
        digest.update(variable.numpy().tobytes())
    return digest.hexdigest()
