"""The Conformer-CTC family's layers (``pipeline/model/conformer.py`` declares the family).

Every layer takes the batch's valid-frame mask: padded frames are zeroed before each convolution and
masked out of attention, so an utterance gives the same logits alone (the export's one-shot form) as in a
padded batch (training, evaluation).
"""

from __future__ import annotations

import keras
import tensorflow as tf


def _mask(x, valid):
    """``x`` ``[batch, time, ...]`` with the frames past each row's length zeroed."""
    return (
        x * tf.cast(valid, x.dtype)[:, :, None]
        if x.shape.rank == 3
        else x * tf.cast(valid, x.dtype)[:, :, None, None]
    )


def _valid(lengths, time):
    return tf.sequence_mask(lengths, time)


class Subsampling(keras.layers.Layer):
    """Stride-2 3x3 convolutions over (time, frequency) with ReLU, ``log2(factor)`` of them, then a linear
    projection of each output frame's channels and frequencies to ``d_model``."""

    def __init__(self, factor: int, channels: int, d_model: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.steps = max(0, factor.bit_length() - 1)
        init = lambda i: keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
        self.convs = [
            keras.layers.Conv2D(
                channels,
                3,
                strides=2,
                padding="valid",
                activation="relu",
                name=f"conv_{i}",
                kernel_initializer=init(i),
                dtype=self.dtype_policy,
            )
            for i in range(self.steps)
        ]
        self.project = keras.layers.Dense(
            d_model, name="project", kernel_initializer=init(10), dtype=self.dtype_policy
        )

    def call(self, features, lengths):
        """``(x [batch, time', d_model], lengths')``."""
        x = features[..., None]  # [batch, time, freq, 1]
        for conv in self.convs:
            x = _mask(x, _valid(lengths, tf.shape(x)[1]))
            # one zero frame and frequency each side, then valid: output i sees inputs 2i-1..2i+1 whatever
            # the padded length (TensorFlow's "same" pads odd and even lengths differently)
            x = conv(tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]]))
            lengths = (lengths + 1) // 2
        x = _mask(x, _valid(lengths, tf.shape(x)[1]))
        batch, time = tf.shape(x)[0], tf.shape(x)[1]
        x = tf.reshape(x, [batch, time, x.shape[2] * x.shape[3]])
        return self.project(x), lengths


def rotary(x, positions):
    """Rotary position embedding of ``x`` ``[batch, heads, time, width]``: each pair of channels rotated by
    ``position * 10000^(-2i/width)``."""
    width = x.shape[-1]
    inverse = 1.0 / (10000.0 ** (tf.range(0, width, 2, dtype=tf.float32) / width))
    angles = tf.cast(positions, tf.float32)[:, None] * inverse[None, :]  # [time, width/2]
    cos, sin = tf.cast(tf.cos(angles), x.dtype), tf.cast(tf.sin(angles), x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = tf.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return tf.reshape(rotated, tf.shape(x))


class Block(keras.layers.Layer):
    """One conformer block: x + FF/2, + MHSA (rotary), + convolution module, + FF/2, layer norm."""

    def __init__(self, settings, seed: int, **kwargs):
        super().__init__(**kwargs)
        d, policy = settings.d_model, self.dtype_policy
        self.heads, self.width = settings.heads, d // settings.heads
        init = lambda i: keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731

        def dense(name, units, i, activation=None):
            return keras.layers.Dense(
                units, activation=activation, name=name, kernel_initializer=init(i), dtype=policy
            )

        def norm(name):
            return keras.layers.LayerNormalization(epsilon=1e-5, name=name, dtype=policy)

        def drop(name, rate, i):
            return keras.layers.Dropout(rate, seed=seed + 100 + i, name=name, dtype=policy)

        inner = d * settings.ff_mult
        self.ff1 = [
            norm("ff1_norm"),
            dense("ff1_in", inner, 1, "silu"),
            drop("ff1_drop_in", settings.dropout, 1),
            dense("ff1_out", d, 2),
            drop("ff1_drop", settings.dropout, 2),
        ]
        self.attention_norm = norm("attention_norm")
        self.qkv = dense("qkv", 3 * d, 3)
        self.attention_out = dense("attention_out", d, 4)
        self.attention_drop = drop("attention_drop", settings.attention_dropout, 3)
        self.attention_out_drop = drop("attention_out_drop", settings.dropout, 4)
        self.conv_norm = norm("conv_norm")
        self.conv_in = dense("conv_in", 2 * d, 5)  # pointwise, then GLU
        self.depthwise = keras.layers.DepthwiseConv1D(
            settings.conv_kernel,
            padding="same",
            name="depthwise",
            depthwise_initializer=init(6),
            dtype=policy,
        )
        self.depthwise_norm = norm("depthwise_norm")
        self.conv_out = dense("conv_out", d, 7)
        self.conv_drop = drop("conv_drop", settings.dropout, 5)
        self.ff2 = [
            norm("ff2_norm"),
            dense("ff2_in", inner, 8, "silu"),
            drop("ff2_drop_in", settings.dropout, 6),
            dense("ff2_out", d, 9),
            drop("ff2_drop", settings.dropout, 7),
        ]
        self.out_norm = norm("out_norm")

    def _feed_forward(self, layers, x, training):
        norm, inner, drop_in, outer, drop = layers
        return drop(outer(drop_in(inner(norm(x)), training=training)), training=training)

    def _attention(self, x, valid, training):
        batch, time = tf.shape(x)[0], tf.shape(x)[1]
        qkv = tf.reshape(self.qkv(self.attention_norm(x)), [batch, time, 3, self.heads, self.width])
        q, k, v = (tf.transpose(qkv[:, :, i], [0, 2, 1, 3]) for i in range(3))  # [batch, heads, time, width]
        positions = tf.range(time)
        q, k = rotary(q, positions), rotary(k, positions)
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32) / float(self.width) ** 0.5
        scores += (1.0 - tf.cast(valid, tf.float32))[:, None, None, :] * -1e9  # no attention to padding
        weights = self.attention_drop(tf.cast(tf.nn.softmax(scores, axis=-1), x.dtype), training=training)
        out = tf.reshape(
            tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3]), [batch, time, self.heads * self.width]
        )
        return self.attention_out_drop(self.attention_out(out), training=training)

    def _convolution(self, x, valid, training):
        a, b = tf.split(self.conv_in(self.conv_norm(x)), 2, axis=-1)
        x = _mask(a * tf.sigmoid(b), valid)  # GLU; the padding zero, as past an utterance's edges
        x = tf.nn.silu(self.depthwise_norm(self.depthwise(x)))
        return self.conv_drop(self.conv_out(x), training=training)

    def call(self, x, valid, training=False):
        """``x [batch, time, d_model]`` -> the same shape."""
        x = x + 0.5 * self._feed_forward(self.ff1, x, training)
        x = x + self._attention(x, valid, training)
        x = x + self._convolution(x, valid, training)
        x = x + 0.5 * self._feed_forward(self.ff2, x, training)
        return self.out_norm(x)


class ConformerModel(keras.Model):
    """``call(features [batch, time, n_input], lengths=None)`` -> logits ``[batch, ceil(time / subsampling),
    n_classes]`` float32 (without ``lengths``, every frame is real: one utterance)."""

    def __init__(self, config, n_input: int, n_classes: int, precision: str = "float32", **kwargs):
        super().__init__(dtype=precision, **kwargs)
        self.model_config, self.n_input, self.n_classes = config, n_input, n_classes
        settings, seed = config.options, config.random_seed
        self.subsampling = Subsampling(
            settings.subsampling,
            settings.subsampling_channels,
            settings.d_model,
            seed,
            name="subsampling",
            dtype=precision,
        )
        self.input_drop = keras.layers.Dropout(
            settings.dropout, seed=seed + 50, name="input_drop", dtype=precision
        )
        self.blocks = [
            Block(settings, seed + 1000 * (i + 1), name=f"block_{i}", dtype=precision)
            for i in range(settings.layers)
        ]
        self.output_layer = keras.layers.Dense(
            n_classes,
            name="output",
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 7),
            dtype=precision,
        )

    def call(self, features, lengths=None, training=False):
        """Logits of the subsampled frames."""
        return tf.cast(self.output_layer(self.encode(features, lengths, training)), tf.float32)

    def encode(self, features, lengths=None, training=False):
        """The last block's output ``[batch, ceil(time / subsampling), d_model]``: what the output layer
        (or, in multi-task training, a task's head) reads."""
        if lengths is None:
            lengths = tf.fill([tf.shape(features)[0]], tf.shape(features)[1])
        x, lengths = self.subsampling(features, lengths)
        valid = _valid(lengths, tf.shape(x)[1])
        x = self.input_drop(x, training=training)
        for block in self.blocks:
            x = block(x, valid, training=training)
        return x
