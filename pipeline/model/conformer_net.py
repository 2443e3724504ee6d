"""The Conformer-CTC family's layers (``pipeline/model/conformer.py`` declares the family) and its streaming
form.

Every layer is causal or chunked, so that one chunk of labels can be computed from the frames up to its end
and a cache of what came before:

- the subsampling's stride-2 convolutions read no frame after their own: an utterance has ``subsampling -
  1`` zero frames before it (its look-back) and is padded with zero frames to whole labels after it;
- attention is masked to a label's own chunk and ``left_chunks`` chunks before it (``chunk`` given), or
  sees the whole utterance (full context); in a chunk, every label sees the whole chunk, so the last
  chunk of an utterance is padded with labels of zero frames (what a stream fed zero frames past the end
  computes) and its labels see them (in training, with a drawn chunk, they see none past the end);
- the depthwise convolution sees ``conv_kernel - 1`` labels before its own and none after.

So padding a batch changes no utterance's logits, and ``ConformerStreaming`` (one chunk a call, each
block's left keys and values and its convolution's last inputs carried as state) gives the logits of the
chunked computation over the whole utterance (``ConformerModel`` with ``chunk``).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from pipeline.model.family import StreamingForm

# ``ConformerModel.call``'s chunk in training (``Conformer.forward``): a chunk size drawn per batch.
DYNAMIC = "dynamic"

# Training draws chunk sizes of 1 to this many labels (WeNet's U2), or the full utterance.
MAX_DRAWN_CHUNK = 25
# Added to the attention scores of keys a query must not see.
MASKED = -1e9


def _mask(x, valid):
    """``x`` ``[batch, time, ...]`` with the frames past each row's length zeroed."""
    return x * tf.cast(valid, x.dtype)[:, :, None]


class Subsampling(keras.layers.Layer):
    """Stride-2 3x3 convolutions over (time, frequency) with ReLU, ``log2(factor)`` of them, then a linear
    projection of each output frame's channels and frequencies to ``d_model``. Output ``j`` reads input
    frames ``factor * j - (factor - 1)`` to ``factor * (j + 1) - 1``: the ``factor - 1`` frames before its
    own (``lookback``), none after."""

    def __init__(self, factor: int, channels: int, d_model: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.steps = max(0, factor.bit_length() - 1)
        self.factor = 1 << self.steps
        self.lookback = self.factor - 1
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

    def call(self, features):
        """``features [batch, lookback + factor * n, freq]`` (the frames before the first label's, then
        the labels') -> ``[batch, n, d_model]``."""
        x = features[..., None]  # [batch, time, freq, 1]
        for conv in self.convs:
            # a zero frequency each side; in time, the look-back: a layer's output i reads its inputs
            # 2i - 1 .. 2i + 1, and the look-back halves (2^k - 1 -> 2^(k-1) - 1) from layer to layer
            x = conv(tf.pad(x, [[0, 0], [0, 0], [1, 1], [0, 0]]))
        batch, time = tf.shape(x)[0], tf.shape(x)[1]
        x = tf.reshape(x, [batch, time, x.shape[2] * x.shape[3]])
        return self.project(x)


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


def attention_mask(lengths, time, chunk, left_chunks, full=None):
    """``(visible, valid)``: which keys each query sees ``[batch, 1, time, time]`` and the labels of each
    row that are computed as a lone utterance's, ``[batch, time]`` (booleans). With ``chunk``
    None, every query sees the labels before each row's ``lengths``; else a query sees its own chunk and
    ``left_chunks`` chunks before it, of the labels up to the end of the chunk of the row's last label
    (``full``, a boolean tensor, may turn the chunks off, as a drawn full-context batch does). A drawn
    batch (``full`` given: training) sees the labels up to each row's last one, as WeNet's mask: the
    batch is not padded to whole chunks of a drawn size (a shape XLA could not know), so a row's last
    chunk would otherwise reach past the longest row's end or not, by what the row is batched with."""
    if chunk is None:
        valid = tf.sequence_mask(lengths, time)
        return valid[:, None, None, :], valid
    chunk = tf.cast(chunk, lengths.dtype)
    reach = (lengths + chunk - 1) // chunk * chunk
    if full is not None:
        reach = lengths
        chunk = tf.where(full, tf.cast(time, lengths.dtype), chunk)
    block = tf.range(time, dtype=lengths.dtype) // chunk
    near = (block[None, :] <= block[:, None]) & (block[None, :] >= block[:, None] - left_chunks)
    valid = tf.sequence_mask(reach, time)
    return valid[:, None, None, :] & near[None, None], valid


class Block(keras.layers.Layer):
    """One conformer block: x + FF/2, + MHSA (rotary), + convolution module (causal), + FF/2, layer norm."""

    def __init__(self, settings, seed: int, **kwargs):
        super().__init__(**kwargs)
        d, policy = settings.d_model, self.dtype_policy
        self.heads, self.width = settings.heads, d // settings.heads
        self.history = settings.conv_kernel - 1  # labels before its own the convolution reads
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
            padding="valid",  # over the history before the labels: causal
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

    def _queries_keys_values(self, x):
        """``q, k, v`` ``[batch, heads, time, width]`` of ``x``, before rotary positions."""
        batch, time = tf.shape(x)[0], tf.shape(x)[1]
        qkv = tf.reshape(self.qkv(self.attention_norm(x)), [batch, time, 3, self.heads, self.width])
        return tuple(tf.transpose(qkv[:, :, i], [0, 2, 1, 3]) for i in range(3))

    def _attend(self, q, k, v, offset, visible, training):
        """Attention of queries ``q`` (at positions ``offset`` on) over keys ``k`` and values ``v`` (at
        positions 0 on): rotary scores depend on the distance only, so a stream's window of keys gives
        the scores of the whole utterance. ``visible``: the keys each query sees (``attention_mask``)."""
        batch, time = tf.shape(q)[0], tf.shape(q)[2]
        q = rotary(q, tf.range(time) + offset)
        k = rotary(k, tf.range(tf.shape(k)[2]))
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32) / float(self.width) ** 0.5
        # float32 whatever the precision: a finite mask (no row of -inf, so no NaN in padding)
        scores += (1.0 - tf.cast(visible, tf.float32)) * MASKED
        weights = self.attention_drop(tf.cast(tf.nn.softmax(scores, axis=-1), q.dtype), training=training)
        out = tf.reshape(
            tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3]), [batch, time, self.heads * self.width]
        )
        return self.attention_out_drop(self.attention_out(out), training=training)

    def _gated(self, x):
        """The convolution module's input: pointwise convolution and GLU."""
        a, b = tf.split(self.conv_in(self.conv_norm(x)), 2, axis=-1)
        return a * tf.sigmoid(b)

    def _convolution(self, gated, training):
        """The convolution module's output for ``gated`` ``[batch, history + time, d_model]`` (the
        ``history`` labels before the ``time`` ones first): ``[batch, time, d_model]``."""
        x = tf.nn.silu(self.depthwise_norm(self.depthwise(gated)))
        return self.conv_drop(self.conv_out(x), training=training)

    def call(self, x, visible, valid, training=False):
        """``x [batch, time, d_model]`` -> the same shape; ``visible`` masks attention (``attention_mask``),
        ``valid`` ``[batch, time]`` the labels the convolution reads (zero past them)."""
        x = x + 0.5 * self._feed_forward(self.ff1, x, training)
        q, k, v = self._queries_keys_values(x)
        x = x + self._attend(q, k, v, 0, visible, training)
        gated = _mask(self._gated(x), valid)
        x = x + self._convolution(tf.pad(gated, [[0, 0], [self.history, 0], [0, 0]]), training)
        x = x + 0.5 * self._feed_forward(self.ff2, x, training)
        return self.out_norm(x)

    def step(self, x, cache, history, visible):
        """One chunk ``x [batch, chunk, d_model]`` of a stream: ``cache`` ``[batch, 2, heads, left,
        width]`` holds the ``left`` keys (before rotary positions) and values before it, ``history``
        ``[batch, conv_kernel - 1, d_model]`` the convolution's inputs before it; ``visible`` ``[batch, 1,
        1, left + chunk]`` says which keys the stream has (not the cache's first zeros). Returns the
        output and the new caches."""
        chunk = tf.shape(x)[1]
        x = x + 0.5 * self._feed_forward(self.ff1, x, False)
        q, k, v = self._queries_keys_values(x)
        cache = tf.cast(cache, k.dtype)
        keys = tf.concat([cache[:, 0], k], axis=2)
        values = tf.concat([cache[:, 1], v], axis=2)
        x = x + self._attend(q, keys, values, tf.shape(cache)[3], visible, False)
        gated = tf.concat([tf.cast(history, x.dtype), self._gated(x)], axis=1)
        x = x + self._convolution(gated, False)
        x = x + 0.5 * self._feed_forward(self.ff2, x, False)
        new_cache = tf.stack([keys[:, :, chunk:], values[:, :, chunk:]], axis=1)
        return self.out_norm(x), new_cache, gated[:, chunk:]


class ConformerModel(keras.Model):
    """``call(features [batch, time, n_input], lengths=None, chunk=None)`` -> logits ``[batch, ceil(time /
    subsampling), n_classes]`` float32 (without ``lengths``, every frame is real: one utterance).
    ``chunk``: None for full context, a number of labels for the chunked computation, ``DYNAMIC`` for a
    chunk size drawn per call (training)."""

    def __init__(self, config, n_input: int, n_classes: int, precision: str = "float32", **kwargs):
        super().__init__(dtype=precision, **kwargs)
        self.model_config, self.n_input, self.n_classes = config, n_input, n_classes
        settings, seed = config.options, config.random_seed
        self.left_chunks = settings.left_chunks
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
        # The chunk sizes drawn in training: a checkpointed random state, so a resumed run draws the same.
        self.chunk_seed = keras.random.SeedGenerator(seed + 60, name="chunk_seed")

    def draw_chunk(self):
        """The chunk of a training batch, as WeNet U2 draws it but read from nothing in the batch: full
        context half the time, else a chunk of 1 to ``MAX_DRAWN_CHUNK`` labels, uniformly. WeNet's draw
        reads the batch's longest utterance: towers, each with part of a global batch, then drew other
        chunks than one device does for the same step. ``(chunk, full)`` tensors."""
        uniform = keras.random.uniform([], seed=self.chunk_seed)
        full = uniform >= 0.5
        drawn = tf.minimum(tf.cast(uniform * (2 * MAX_DRAWN_CHUNK), tf.int32), MAX_DRAWN_CHUNK - 1) + 1
        return drawn, full

    def call(self, features, lengths=None, training=False, chunk=None):
        """Logits of the subsampled frames (see the class docstring)."""
        return tf.cast(self.output_layer(self.encode(features, lengths, training, chunk)), tf.float32)

    def encode(self, features, lengths=None, training=False, chunk=None):
        """The last block's output ``[batch, ceil(time / subsampling), d_model]`` (``chunk`` as ``call``'s):
        what the output layer (or, in multi-task training, a task's head) reads."""
        factor = self.subsampling.factor
        time = tf.shape(features)[1]
        if lengths is None:
            lengths = tf.fill([tf.shape(features)[0]], time)
        lengths = tf.cast(lengths, tf.int32)
        features = _mask(features, tf.sequence_mask(lengths, time))
        labels = (time + factor - 1) // factor
        full, padded = None, labels
        if isinstance(chunk, str) and chunk == DYNAMIC:
            chunk, full = self.draw_chunk() if training else (None, None)
        elif chunk is not None:  # the last chunk's labels of zero frames, as a stream computes them
            padded = (labels + chunk - 1) // chunk * chunk
        features = tf.pad(features, [[0, 0], [self.subsampling.lookback, padded * factor - time], [0, 0]])
        x = self.subsampling(features)
        output_lengths = (lengths + factor - 1) // factor
        visible, valid = attention_mask(output_lengths, padded, chunk, self.left_chunks, full)
        x = self.input_drop(x, training=training)
        for block in self.blocks:
            x = block(x, visible, valid, training=training)
        return x[:, :labels]


class ConformerStreaming(StreamingForm):
    """The streaming form: one chunk of ``chunk_frames`` labels a call (``chunk_frames x subsampling``
    feature frames after the subsampling's ``subsampling - 1`` look-back frames), the attention caches
    and the convolutions' history as state (``Conformer.state``); any batch of independent streams."""

    batched = True

    def __init__(self, model, family):
        config = model.model_config
        super().__init__(model, family.stream_input(config, 0).chunk)
        settings = config.options
        self.labels = settings.chunk_frames
        self.left = settings.left_chunks * settings.chunk_frames

    def step(self, inputs, *state):
        """See ``batch_step`` (one stream)."""
        return self.batch_step(inputs, *state)

    def batch_step(self, inputs, count, *caches):
        """``inputs [batch, lookback + chunk, n_input]``, ``count [batch, 1]`` (labels in the caches so far,
        at most ``left``), then each block's attention cache and convolution history -> ``(logits [batch,
        chunk_frames, n_classes], new count, new caches...)``."""
        model = self.model
        x = model.subsampling(inputs)
        # cached key m is one of the stream's when m >= left - count (the newest ones are last)
        seen = tf.range(self.left, dtype=tf.float32)[None, :] >= self.left - count
        visible = tf.concat([seen, tf.ones_like(x[:, :, 0], tf.bool)], axis=1)[:, None, None, :]
        new = []
        for index, block in enumerate(model.blocks):
            x, cache, history = block.step(x, caches[2 * index], caches[2 * index + 1], visible)
            new += [tf.cast(cache, tf.float32), tf.cast(history, tf.float32)]
        logits = tf.cast(model.output_layer(x), tf.float32)
        return (logits, tf.minimum(count + self.labels, float(self.left)), *new)

    def utterance(self, inputs):
        """The chunked computation over a whole utterance's frames ``[1, time, n_input]``: the logits of
        the streaming calls over it, from a zero state."""
        return self.model(inputs, training=False, chunk=self.labels)
