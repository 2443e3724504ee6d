"""A transducer's predictor and joiner, as icefall builds them (issue 47).

- ``StatelessPredictor``: icefall's stateless "decoder". It sees only the last ``context_size`` labels: their
  embeddings (the blank's is zero: it stands for "no label yet") and a grouped 1-D convolution over them,
  then ReLU. No recurrent state, so decoding carries only the last labels and the same labels always give
  the same output (a search can cache it). ``context_size`` 1 is a bigram: the convolution is left out.
- ``Joiner``: the encoder's frames and the predictor's outputs each projected to ``joint_dim``, added for
  every pair, tanh, and a linear layer over the classes (the labels and the blank).

In training the predictor runs over the whole transcript at once (``over_transcripts``) and the joiner over
every pair of a frame and a label count (``Joiner.call``): the ``[batch, frames, labels + 1, classes]``
logits ``rnnt_loss`` scores. In decoding the predictor runs on windows of the last labels
(``over_contexts``) and the joiner on one frame against a few hypotheses (``Joiner.join``); both forms use
the same weights, and a test checks they agree.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def _init(seed: int):
    return keras.initializers.GlorotUniform(seed=seed)


class StatelessPredictor(keras.layers.Layer):
    """Labels ``[batch, length]`` -> ``[batch, length - context_size + 1, dim]``: one output per window of
    ``context_size`` consecutive labels (a valid convolution). ``groups`` divides ``dim`` (icefall uses
    ``dim / 4``)."""

    def __init__(
        self, n_classes: int, blank: int, dim: int, context_size: int, groups: int, seed: int, **kwargs
    ):
        super().__init__(**kwargs)
        if context_size < 1:
            raise ValueError(f"the predictor's context_size must be at least 1, got {context_size}")
        if dim % groups:
            raise ValueError(f"the predictor's dim {dim} is not a multiple of its groups {groups}")
        self.n_classes, self.blank, self.dim = n_classes, blank, dim
        self.context_size, self.groups = context_size, groups
        self.embedding = keras.layers.Embedding(
            n_classes,
            dim,
            embeddings_initializer=keras.initializers.RandomNormal(seed=seed),
            name="embedding",
        )
        self.kernel = None
        if context_size > 1:
            width = dim // groups
            self.kernel = self.add_weight(
                name="conv_kernel",
                shape=(context_size, groups, width, width),
                initializer=keras.initializers.GlorotUniform(seed=seed + 1),
            )

    def build(self, input_shape):
        """Make the embedding's weights."""
        self.embedding.build(input_shape)
        super().build(input_shape)

    def call(self, labels):
        """The outputs of every window of ``context_size`` labels in ``labels`` (see the class)."""
        labels = tf.cast(labels, tf.int32)
        embedded = self.embedding(labels) * tf.cast(labels != self.blank, self.compute_dtype)[..., None]
        if self.kernel is None:
            return tf.nn.relu(embedded)
        steps = tf.shape(labels)[1] - self.context_size + 1
        # window k of every output: the embeddings k places after the output's first label
        windows = tf.stack([embedded[:, k : k + steps] for k in range(self.context_size)], axis=2)
        batch = tf.shape(labels)[0]
        grouped = tf.reshape(windows, [batch, steps, self.context_size, self.groups, self.dim // self.groups])
        kernel = tf.cast(self.kernel, self.compute_dtype)
        out = tf.einsum("bscgi,cgio->bsgo", grouped, kernel)
        return tf.nn.relu(tf.reshape(out, [batch, steps, self.dim]))

    def over_transcripts(self, labels):
        """Training form: ``[batch, max_labels]`` -> ``[batch, max_labels + 1, dim]``, output ``u`` after the
        first ``u`` labels (the transcript with ``context_size`` blanks before it)."""
        start = tf.fill([tf.shape(labels)[0], self.context_size], self.blank)
        return self(tf.concat([start, tf.cast(labels, tf.int32)], axis=1))

    def over_contexts(self, contexts):
        """Decoding form: the last ``context_size`` labels of each hypothesis ``[n, context_size]`` (blanks
        before the first label) -> ``[n, dim]``."""
        return self(contexts)[:, 0]


class Joiner(keras.layers.Layer):
    """Encoder frames ``[batch, frames, encoder_dim]`` and predictor outputs ``[batch, labels + 1,
    predictor_dim]`` -> logits ``[batch, frames, labels + 1, n_classes]``."""

    def __init__(self, joint_dim: int, n_classes: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.encoder_projection = keras.layers.Dense(
            joint_dim, kernel_initializer=_init(seed), name="encoder_projection", dtype=policy
        )
        self.predictor_projection = keras.layers.Dense(
            joint_dim, kernel_initializer=_init(seed + 1), name="predictor_projection", dtype=policy
        )
        self.output_layer = keras.layers.Dense(
            n_classes, kernel_initializer=_init(seed + 2), name="output", dtype=policy
        )

    def build(self, input_shape):
        """Make the projections' and the output's weights from ``(encoder shape, predictor shape)``."""
        encoder_shape, predictor_shape = input_shape
        self.encoder_projection.build(encoder_shape)
        self.predictor_projection.build(predictor_shape)
        self.output_layer.build((None, self.encoder_projection.units))
        super().build(input_shape)

    def call(self, inputs):
        """Logits of every pair of a frame and a predictor output (training)."""
        encoder, predictor = inputs
        frames = self.encoder_projection(encoder)[:, :, None, :]
        labels = self.predictor_projection(predictor)[:, None, :, :]
        return self.output_layer(tf.tanh(frames + labels))

    def join(self, projected_frame, projected_predictor):
        """Logits ``[..., n_classes]`` of already projected frames and predictor outputs (decoding: the
        projections are computed once per frame and once per hypothesis)."""
        return self.output_layer(tf.tanh(projected_frame + projected_predictor))
