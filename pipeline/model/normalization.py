"""Global feature normalisation as a layer of the model (``features.normalize: global``).

The training set's mean and standard deviation per coefficient are two non-trainable weights of the
model, ``feature_normalization.mean`` and ``feature_normalization.std``: filled from the train caches'
recorded sums when a run starts, saved with every checkpoint (a resumed run restores them, a warm start
leaves them at the new run's statistics), and carried by every export, whose graph normalises the raw
features the client feeds it. No stage and no client handles the statistics apart from the model.

An all-zero input frame is padding (a batch's, or the zero frames past an utterance's edges a streaming
call takes) and stays zero, as it did when the statistics were applied before padding: training, whole
utterances and streaming calls all see the same numbers.

The pipeline adds the layer to the family's model after the family built it, so a family knows nothing of
it: every call of a family's forward pass, encoder or inference form goes through ``normalized``.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from native_client.cmvn import GlobalStats
from pipeline.model.added_layers import add_layer

NAME = "feature_normalization"


class FeatureNormalization(keras.layers.Layer):
    """``(x - mean) / std`` over the last axis of any input (frames or context windows), float32; an
    all-zero frame stays zero."""

    def __init__(self, n_input: int, stats: GlobalStats | None = None, **kwargs):
        super().__init__(name=NAME, dtype="float32", trainable=False, **kwargs)
        self.n_input = int(n_input)
        self.initial_stats = stats  # the weights' first values only: a restore replaces them

    def build(self, input_shape=None):
        """The two weights, made holding ``stats`` (a strategy of several workers then sends every worker
        the chief's), else the identity (mean 0, deviation 1) until ``set_statistics`` or a restore."""
        mean, std = ("zeros", "ones") if self.initial_stats is None else self.initial_stats.arrays()
        if self.initial_stats is not None and mean.shape != (self.n_input,):
            raise ValueError(f"statistics of {mean.shape[0]} coefficients for a model of {self.n_input}")
        self.mean = self.add_weight(shape=(self.n_input,), initializer=mean, trainable=False, name="mean")
        self.std = self.add_weight(shape=(self.n_input,), initializer=std, trainable=False, name="std")

    def call(self, features):
        """The normalised features, padding frames left at zero."""
        features = tf.cast(features, tf.float32)
        padding = tf.reduce_all(tf.equal(features, 0.0), axis=-1, keepdims=True)
        return tf.where(padding, tf.zeros_like(features), (features - self.mean) / self.std)


def add_normalization(model, n_input: int, stats: GlobalStats | None = None):
    """Give ``model`` (a family's built Keras model) its normalisation layer, holding ``stats`` (else the
    identity until ``set_statistics`` or a restore); returns the model."""

    def make():
        layer = FeatureNormalization(n_input, stats)
        layer.build()
        return layer

    add_layer(model, NAME, make)
    return model


def normalized(model, features):
    """``features`` as ``model`` takes them: normalised by its layer when it has one, else unchanged."""
    layer = getattr(model, NAME, None)
    return features if layer is None else layer(features)


def set_statistics(model, stats: GlobalStats) -> None:
    """Fill ``model``'s normalisation layer (every network's, in a multi-task model) with ``stats``, the
    standard deviation floored (``GlobalStats.arrays``). ValueError for a model without the layer or
    statistics of another width."""
    layers = _layers(model)
    if not layers or None in layers:
        raise ValueError("the model has no feature normalisation layer (features.normalize is not global)")
    mean, std = stats.arrays()
    for layer in layers:
        if mean.shape != tuple(layer.mean.shape):
            raise ValueError(f"statistics of {mean.shape[0]} coefficients for a model of {layer.n_input}")
        layer.mean.assign(mean)
        layer.std.assign(std)


def normalization_of(model) -> tuple | None:
    """(mean, standard deviation) float32 arrays of ``model``'s normalisation layer (a multi-task model's
    first network's: every network holds the same), None for a model without one."""
    layer = _layers(model)[0]
    return None if layer is None else (layer.mean.numpy(), layer.std.numpy())


def model_statistics(model) -> GlobalStats | None:
    """The statistics ``model``'s normalisation layer holds (after a restore, the checkpoint's), None for a
    model without one."""
    found = normalization_of(model)
    return None if found is None else GlobalStats(*(tuple(float(v) for v in a) for a in found))


def _layers(model) -> list:
    """The normalisation layer of each network of ``model`` (one, or a multi-task model's), None where
    a network has none."""
    return [getattr(network, NAME, None) for network in getattr(model, "networks", [model])]


def is_normalization_weight(name: str) -> bool:
    """Whether a checkpoint name (a single-task model's) is one of the normalisation layer's weights."""
    return name.split(".")[0] == NAME
