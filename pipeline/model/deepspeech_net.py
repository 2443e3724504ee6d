"""The DeepSpeech family's layers (``pipeline/model/deepspeech.py`` declares the family): its acoustic model,
and the streaming form that runs the same layers.

Per time step: 3 clipped-ReLU dense layers over the flattened context window,
a unidirectional LSTM, a clipped-ReLU dense layer and linear logits over the
alphabet plus the CTC blank. The training form takes features and makes the
context windows itself; the streaming form takes windows (DeepSpeech's
``input_node``) and carries the LSTM state, stepping the LSTM's own cell
weights ``n_steps`` times (TFLite cannot run Keras' while loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import keras
import tensorflow as tf

from pipeline.config import ModelConfig
from pipeline.model.family import StreamingForm
from pipeline.model.fused_lstm import lstm_sequence

if TYPE_CHECKING:
    from pipeline.model.deepspeech import DeepSpeechSettings


def dropout_rates(model: DeepSpeechSettings) -> tuple[float, ...]:
    """Dropout of layers 1..6 with DeepSpeech's defaults (2, 3, 6 follow ``dropout_rate``)."""
    base = model.dropout_rate
    pick = lambda value: base if value is None else value  # noqa: E731
    return (
        base,
        pick(model.dropout_rate2),
        pick(model.dropout_rate3),
        model.dropout_rate4,
        model.dropout_rate5,
        pick(model.dropout_rate6),
    )


def make_windows(features: tf.Tensor, n_context: int) -> tf.Tensor:
    """``[batch, time, n_input]`` -> ``[batch, time, 2*n_context+1, n_input]``, zeros past the edges."""
    padded = tf.pad(features, [[0, 0], [n_context, n_context], [0, 0]])
    return tf.signal.frame(padded, 2 * n_context + 1, 1, axis=1)


def uses_fused_lstm(lstm_kernel: str, precision: str = "float32", gpu: bool | None = None) -> bool:
    """Whether ``lstm_kernel`` runs the fused sequence LSTM: ``fused``; ``auto`` wherever Keras' layer
    would not run cuDNN's kernel well: no GPU visible (``gpu`` overrides asking TensorFlow), or bfloat16
    compute (cuDNN's RNN takes half, float and double only). Under XLA every call runs it
    (``AcousticModel.encode``)."""
    if lstm_kernel != "auto":
        return lstm_kernel == "fused"
    if precision == "mixed_bfloat16":
        return True
    return not (tf.config.list_physical_devices("GPU") if gpu is None else gpu)


def in_xla_context() -> bool:
    """Whether the graph being traced is compiled by XLA (a ``tf.function(jit_compile=True)`` or inside
    one), which has no kernel for the ``CudnnRNNV3`` op Keras' LSTM emits on a GPU: TensorFlow's functions
    mark their XLA graphs with this control-flow context, and Keras does not look (TF #99385)."""
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


class AcousticModel(keras.Model):
    """The DeepSpeech model of ``settings`` (``config``'s family settings): ``call(features [batch, time,
    n_input])`` -> logits ``[batch, time, n_classes]``."""

    def __init__(
        self,
        config: ModelConfig,
        settings: DeepSpeechSettings,
        n_input: int,
        n_classes: int,
        precision: str = "float32",
        **kwargs,
    ):
        super().__init__(dtype=precision, **kwargs)
        self.model_config = config
        self.settings = settings
        self.n_input = n_input
        self.n_classes = n_classes
        self.window = 2 * settings.n_context + 1
        seed, clip = config.random_seed, settings.relu_clip

        def dense(name, units, index, activation=True):
            return keras.layers.Dense(
                units,
                name=name,
                dtype=precision,
                activation=(lambda x: tf.minimum(tf.nn.relu(x), clip)) if activation else None,
                kernel_initializer=keras.initializers.GlorotUniform(seed=seed + index),
                bias_initializer="zeros",
            )

        hidden = settings.n_hidden
        self.layer_1 = dense("layer_1", hidden, 1)
        self.layer_2 = dense("layer_2", hidden, 2)
        self.layer_3 = dense("layer_3", hidden, 3)
        # Keras runs this LSTM with cuDNN on a GPU because it keeps the defaults cuDNN requires:
        # activation tanh, recurrent_activation sigmoid, recurrent_dropout 0, unroll False, use_bias True.
        # Do not change them without giving up the fast kernel.
        self.lstm = keras.layers.LSTM(
            hidden,
            name="lstm",
            return_sequences=True,
            return_state=True,
            unit_forget_bias=True,
            dtype=precision,
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 4),
            recurrent_initializer=keras.initializers.GlorotUniform(seed=seed + 5),
            use_cudnn=False if precision == "mixed_bfloat16" else "auto",
        )
        self.fused_lstm = uses_fused_lstm(settings.lstm_kernel, precision)
        self.layer_5 = dense("layer_5", hidden, 6)
        self.layer_6 = dense("layer_6", n_classes, 7, activation=False)
        self.dropouts = [
            keras.layers.Dropout(rate, seed=seed + 10 + i, dtype=precision)
            for i, rate in enumerate(dropout_rates(settings))
        ]

    def stack(self, windows, recurrence, training):
        """Logits ``[batch, time, n_classes]`` of windows ``[batch, time, window, n_input]``; the LSTM
        part is ``recurrence(x [batch, time, n_hidden]) -> outputs`` (the layer itself, or its cell
        stepped)."""
        return self.layer_6(self.hidden(windows, recurrence, training))

    def hidden(self, windows, recurrence, training):
        """What ``stack`` feeds the output layer: layer 5's output after its dropout ``[batch, time,
        n_hidden]``."""
        batch, time = tf.shape(windows)[0], tf.shape(windows)[1]
        x = tf.reshape(windows, [batch, time, self.window * self.n_input])  # [batch, time, 494]
        x = self.dropouts[0](self.layer_1(x), training=training)
        x = self.dropouts[1](self.layer_2(x), training=training)
        x = self.dropouts[2](self.layer_3(x), training=training)
        x = recurrence(self.dropouts[4](x, training=training))
        x = self.dropouts[3](x, training=training)
        return self.dropouts[5](self.layer_5(x), training=training)

    def call(self, features, training=False):
        """Full-sequence logits ``[batch, time, n_classes]`` (float32)
        of features ``[batch, time, n_input]``."""
        return tf.cast(self.layer_6(self.encode(features, training)), tf.float32)

    def fused_sequence(self, x):
        """The LSTM's outputs ``[batch, time, n_hidden]`` over ``x`` from a zero state, by the fused LSTM
        (``pipeline.model.fused_lstm``) with the layer's weights."""
        cell = self.lstm.cell
        time_major = lstm_sequence(tf.transpose(x, [1, 0, 2]), cell.kernel, cell.recurrent_kernel, cell.bias)
        return tf.transpose(time_major, [1, 0, 2])

    def encode(self, features, training=False):
        """Layer 5's output ``[batch, time, n_hidden]`` of features ``[batch, time, n_input]``: what the
        output layer (or, in multi-task training, a task's head) reads. The LSTM is the fused one when
        ``lstm_kernel`` chose it and under XLA; else Keras' layer (cuDNN on a GPU)."""
        zeros = tf.zeros([tf.shape(features)[0], self.settings.n_hidden], dtype=self.compute_dtype)
        fused = self.fused_lstm or in_xla_context()

        def recurrence(x):
            if fused:
                if not self.lstm.built:  # built here, in the model's scope, as calling it would
                    self.lstm.build(x.shape)
                return self.fused_sequence(x)
            return self.lstm(x, initial_state=[zeros, zeros], training=training)[0]

        return self.hidden(make_windows(features, self.settings.n_context), recurrence, training)


class DeepSpeechStreaming(StreamingForm):
    """The streaming form: the model's own layers, the LSTM's cell stepped frame by frame with its input
    projection computed once for all ``n_steps`` frames (only the recurrent product is per frame)."""

    def _lstm(self, x, h, c, steps: int):
        """The LSTM over ``x [1, steps, n_hidden]`` from state (h, c) with Keras' gate order (i, f, c, o)."""
        cell = self.model.lstm.cell
        projected = tf.matmul(x[0], cell.kernel) + cell.bias  # [steps, 4 * n_hidden]
        outputs = []
        for t in range(steps):
            z = projected[t : t + 1] + tf.matmul(h, cell.recurrent_kernel)
            i, f, g, o = tf.split(z, 4, axis=-1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            h = tf.sigmoid(o) * tf.tanh(c)
            outputs.append(h)
        return tf.concat(outputs, axis=0)[None], h, c

    def step(self, windows, state_h, state_c):
        """``(logits [1, n_steps, n_classes], new state_h, new state_c)``."""
        final = {}

        def recurrence(x):
            out, final["h"], final["c"] = self._lstm(x, state_h, state_c, self.n_steps)
            return out

        logits = self.model.stack(windows, recurrence, training=False)
        return logits, final["h"], final["c"]

    batched = True

    def batch_step(self, windows, state_h, state_c):
        """``(logits [batch, n_steps, n_classes], new state_h, new state_c)`` of ``batch`` streams at once:
        every matrix product reads its weights once for all of them (the recurrent kernel, read per frame,
        dominates a batch-1 step)."""
        final = {}
        cell = self.model.lstm.cell

        def recurrence(x):
            batch, width = tf.shape(x)[0], tf.shape(x)[2]
            flat = tf.matmul(tf.reshape(x, [-1, width]), cell.kernel) + cell.bias
            projected = tf.reshape(flat, [batch, self.n_steps, -1])  # [batch, steps, 4 * n_hidden]
            h, c, outputs = state_h, state_c, []
            for t in range(self.n_steps):
                z = projected[:, t] + tf.matmul(h, cell.recurrent_kernel)
                i, f, g, o = tf.split(z, 4, axis=-1)
                c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
                h = tf.sigmoid(o) * tf.tanh(c)
                outputs.append(h)
            final["h"], final["c"] = h, c
            return tf.stack(outputs, axis=1)

        logits = self.model.stack(windows, recurrence, training=False)
        return logits, final["h"], final["c"]

    def utterance(self, windows):
        """Logits ``[1, time, n_classes]`` of any number of windows (the fused LSTM's loop: the same on
        every device)."""
        return self.model.stack(windows, self.model.fused_sequence, False)
