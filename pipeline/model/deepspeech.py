"""The DeepSpeech acoustic model; the full-sequence and streaming forms share one set of layers.

Per time step: 3 clipped-ReLU dense layers over the flattened context window,
a unidirectional LSTM, a clipped-ReLU dense layer and linear logits over the
alphabet plus the CTC blank.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from pipeline.config import ModelConfig

LAYER_NAMES = ("layer_1", "layer_2", "layer_3", "lstm", "layer_5", "layer_6")


def dropout_rates(model: ModelConfig) -> tuple[float, ...]:
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


class AcousticModel(keras.Model):
    """DeepSpeech model. ``call`` takes ``[batch, time, window, n_input]`` windows and returns
    ``[batch, time, n_classes]`` logits; ``stream_step`` runs the same layers on a chunk with
    the LSTM state carried in and out."""

    def __init__(
        self, config: ModelConfig, n_input: int, n_classes: int, precision: str = "float32", **kwargs
    ):
        super().__init__(dtype=precision, **kwargs)
        self.model_config = config
        self.n_input = n_input
        self.n_classes = n_classes
        self.window = 2 * config.n_context + 1
        seed = config.random_seed
        clip = config.relu_clip
        rates = dropout_rates(config)

        def dense(name, units, index, activation=True):
            return keras.layers.Dense(
                units,
                name=name,
                dtype=precision,
                activation=(lambda x: tf.minimum(tf.nn.relu(x), clip)) if activation else None,
                kernel_initializer=keras.initializers.GlorotUniform(seed=seed + index),
                bias_initializer="zeros",
            )

        hidden = config.n_hidden
        self.layer_1 = dense("layer_1", hidden, 1)
        self.layer_2 = dense("layer_2", hidden, 2)
        self.layer_3 = dense("layer_3", hidden, 3)
        # Keras runs this LSTM with cuDNN on a GPU because it keeps the defaults cuDNN requires:
        # activation tanh, recurrent_activation sigmoid, recurrent_dropout 0, unroll False, use_bias True
        # (tests/test_model.py asserts them). Do not change them without giving up the fast kernel.
        self.lstm = keras.layers.LSTM(
            hidden,
            name="lstm",
            return_sequences=True,
            return_state=True,
            unit_forget_bias=True,
            dtype=precision,
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 4),
            recurrent_initializer=keras.initializers.GlorotUniform(seed=seed + 5),
        )
        self.layer_5 = dense("layer_5", hidden, 6)
        self.layer_6 = dense("layer_6", n_classes, 7, activation=False)
        self.dropouts = [
            keras.layers.Dropout(rate, seed=seed + 10 + i, dtype=precision) for i, rate in enumerate(rates)
        ]

    def _stack(self, windows, h, c, training):
        batch = tf.shape(windows)[0]
        time = tf.shape(windows)[1]
        x = tf.reshape(windows, [batch, time, self.window * self.n_input])  # [batch, time, 494]
        x = self.dropouts[0](self.layer_1(x), training=training)
        x = self.dropouts[1](self.layer_2(x), training=training)
        x = self.dropouts[2](self.layer_3(x), training=training)
        x = self.dropouts[4](x, training=training)
        x, h, c = self.lstm(x, initial_state=[h, c], training=training)
        x = self.dropouts[3](x, training=training)
        x = self.dropouts[5](self.layer_5(x), training=training)
        return self.layer_6(x), h, c  # [batch, time, n_classes]

    def zero_state(self, batch) -> tuple[tf.Tensor, tf.Tensor]:
        """The LSTM state at the start of an utterance."""
        zeros = tf.zeros([batch, self.model_config.n_hidden], dtype=self.compute_dtype)
        return zeros, zeros

    def call(self, windows, training=False):
        """Full-sequence logits ``[batch, time, n_classes]`` from windows ``[batch, time, window, n_input]``."""
        h, c = self.zero_state(tf.shape(windows)[0])
        logits, _, _ = self._stack(windows, h, c, training)
        return tf.cast(logits, tf.float32)  # softmax and CTC in float32 whatever the precision

    def stream_step(self, windows, state_h, state_c):
        """One streaming chunk: returns (logits, new state_h, new state_c); inference only."""
        return self._stack(windows, state_h, state_c, training=False)


def build_model(
    config: ModelConfig, n_input: int, n_classes: int, precision: str = "float32"
) -> AcousticModel:
    """Create the model and its weights (deterministic for a given ``random_seed``). ``precision`` is a
    Keras dtype policy (``mixed_bfloat16``, ``mixed_float16``): the variables stay float32 whatever it is."""
    model = AcousticModel(config, n_input, n_classes, precision)
    model(tf.zeros([1, 1, 2 * config.n_context + 1, n_input]))
    return model
