"""A transducer's predictor and joiner, as icefall builds them (issue 47).

- ``StatelessPredictor``: icefall's stateless "decoder". It sees only the last ``context_size`` labels: their
  embeddings (the blank's is zero: it stands for "no label yet") and a grouped 1-D convolution over them,
  then ReLU. No recurrent state, so decoding carries only the last labels and the same labels always give
  the same output (a search can cache it). ``context_size`` 1 is a bigram: the convolution is left out.
- ``TransducerHead``: the predictor and the joiner. The joiner adds the encoder's and the predictor's
  projections to ``joint_dim`` for every pair of a frame and a label count, applies tanh and a linear layer
  over the classes (the labels and the blank). The encoder's projection is the model family's own output
  layer, so the family network is unchanged: it emits ``joint_dim`` values a frame instead of label scores.

In training the predictor runs over the whole transcript at once (``over_transcripts``) and the joiner over
every pair (``TransducerHead.joint``): the ``[batch, frames, labels + 1, classes]`` logits ``rnnt_loss``
scores. In decoding the predictor runs on windows of the last labels (``TransducerHead.predict``) and the
joiner on one frame against a few hypotheses (``TransducerHead.join``); both forms use the same weights,
and a test checks they agree.
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
            embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0, seed=seed),  # as torch's
            name="embedding",
            dtype=self.dtype_policy,
        )
        self.seed = seed
        self.kernel = None

    def build(self, input_shape):
        """Make the embedding's and the convolution's weights."""
        self.embedding.build(input_shape)
        if self.context_size > 1:
            width = self.dim // self.groups
            self.kernel = self.add_weight(
                name="conv_kernel",
                shape=(self.context_size, self.groups, width, width),
                # Glorot over one group's fans: Keras counts a 4-D kernel's over all groups
                initializer=keras.initializers.VarianceScaling(
                    scale=float(self.groups), mode="fan_avg", distribution="uniform", seed=self.seed + 1
                ),
            )
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


class TransducerHead(keras.layers.Layer):
    """The predictor and joiner over an encoder whose output is already projected to ``joint_dim`` (the
    family's output layer is the joiner's encoder projection): the predictor's output projected to
    ``joint_dim``, added to the frame's, tanh, and a linear layer over the ``n_classes`` classes (the
    labels and the blank, ``blank``)."""

    def __init__(self, settings, n_classes: int, blank: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.n_classes, self.blank = n_classes, blank
        self.context_size, self.joint_dim = settings.context_size, settings.joint_dim
        self.max_symbols = settings.max_symbols
        self.predictor = StatelessPredictor(
            n_classes,
            blank,
            settings.predictor_dim,
            settings.context_size,
            settings.predictor_groups,
            seed,
            name="predictor",
            dtype=policy,
        )
        self.predictor_projection = keras.layers.Dense(
            settings.joint_dim, kernel_initializer=_init(seed + 2), name="predictor_projection", dtype=policy
        )
        self.output_layer = keras.layers.Dense(
            n_classes, kernel_initializer=_init(seed + 3), name="output", dtype=policy
        )

    def build(self, input_shape=None):
        """Make every weight (the head's input is labels: no shape is needed)."""
        self.predictor.build((None, self.context_size))
        self.predictor_projection.build((None, self.predictor.dim))
        self.output_layer.build((None, self.joint_dim))
        super().build(input_shape)

    def predict(self, contexts):
        """The last ``context_size`` labels of each hypothesis ``[n, context_size]`` -> projected predictor
        outputs ``[n, joint_dim]``."""
        return self.predictor_projection(self.predictor.over_contexts(contexts))

    def join(self, frames, predicted):
        """Logits ``[..., n_classes]`` of projected frames and projected predictor outputs (broadcast)."""
        return self.output_layer(tf.tanh(tf.cast(frames, self.compute_dtype) + predicted))

    def joint(self, frames, labels):
        """Training: logits ``[batch, frames, max_labels + 1, n_classes]`` of every frame of ``frames``
        ``[batch, frames, joint_dim]`` against every count of the padded ``labels`` ``[batch, max_labels]``
        emitted so far."""
        predicted = self.predictor_projection(self.predictor.over_transcripts(labels))
        return self.join(frames[:, :, None, :], predicted[:, None, :, :])

    def greedy(self, frames, lengths, max_symbols: int):
        """Greedy search of a batch: the best class of each frame, up to ``max_symbols`` labels a frame
        (``native_client.transducer_search.GreedySearch``, batched). Label indices ``[batch, frames x
        max_symbols]``, -1 where none was emitted (and past each utterance's ``lengths`` frames)."""
        batch, count = tf.shape(frames)[0], tf.shape(frames)[1]
        lengths = tf.cast(lengths, tf.int32)
        context = tf.fill([batch, self.context_size], self.blank)
        rows = tf.TensorArray(tf.int32, size=count)

        def frame_step(t, context, predicted, rows):
            active = t < lengths
            emitted = []
            for _ in range(max_symbols):
                best = tf.argmax(self.join(frames[:, t], predicted), axis=-1, output_type=tf.int32)
                active = active & (best != self.blank)
                emitted.append(tf.where(active, best, -1))
                moved = tf.concat([context[:, 1:], best[:, None]], axis=1)
                context = tf.where(active[:, None], moved, context)
                predicted = tf.where(active[:, None], self.predict(context), predicted)
            return t + 1, context, predicted, rows.write(t, tf.stack(emitted, axis=1))

        _, _, _, rows = tf.while_loop(
            lambda t, *_: t < count, frame_step, (0, context, self.predict(context), rows)
        )
        found = tf.transpose(rows.stack(), [1, 0, 2])  # [batch, frames, max_symbols]
        return tf.reshape(found, [batch, count * max_symbols])
