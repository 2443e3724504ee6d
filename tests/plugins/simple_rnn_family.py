"""A model family of a user's own: a dense layer, a simple RNN and the output layer, with its own setting
``model.simple_rnn.units``; the streaming form steps the RNN's own cell weights over windows of one frame."""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf

from pipeline.config import family_option
from pipeline.model import ModelFamily, StateTensor, StreamingForm
from pipeline.model.family import WINDOWS, StreamInput


@dataclass(frozen=True)
class SimpleRnnSettings:
    """The test family's settings."""

    units: int = family_option(32, "Width of the dense layer and the RNN.", minimum=1, maximum=4096)


class SimpleRnnModel(keras.Model):
    """features [batch, time, n_input] -> logits [batch, time, n_classes]."""

    def __init__(self, config, n_input: int, n_classes: int, units: int, precision: str = "float32"):
        super().__init__(dtype=precision)
        self.model_config, self.n_input, self.units = config, n_input, units
        seed = config.random_seed
        self.front = keras.layers.Dense(
            units,
            activation="relu",
            name="front",
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed),
        )
        self.rnn = keras.layers.SimpleRNN(
            units,
            return_sequences=True,
            name="rnn",
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 1),
            recurrent_initializer=keras.initializers.Orthogonal(seed=seed + 2),
        )
        self.out = keras.layers.Dense(
            n_classes, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 3)
        )

    def call(self, features, training=False):
        """Logits of every frame."""
        return tf.cast(self.out(self.rnn(self.front(features))), tf.float32)


class SimpleRnnStreaming(StreamingForm):
    """The same layers; windows of one frame (no context)."""

    def _steps(self, x, h, steps):
        cell = self.model.rnn.cell
        projected = tf.matmul(x[0], cell.kernel) + cell.bias
        outputs = []
        for t in range(steps):
            h = tf.tanh(projected[t : t + 1] + tf.matmul(h, cell.recurrent_kernel))
            outputs.append(h)
        return tf.concat(outputs, 0)[None], h

    def step(self, windows, state):
        """``n_steps`` frames from ``state``."""
        x = self.model.front(windows[:, :, 0, :])
        outputs, state = self._steps(x, state, self.n_steps)
        return self.model.out(outputs), state

    def utterance(self, windows):
        """A whole utterance from a zero state."""
        return self.model(windows[:, :, 0, :])


class SimpleRnnFamily(ModelFamily):
    """Dense -> SimpleRNN -> Dense."""

    name = "simple_rnn"
    Settings = SimpleRnnSettings

    def build(self, config, n_input, n_classes, precision="float32"):
        """The model; ``model.simple_rnn.units`` wide."""
        model = SimpleRnnModel(config, n_input, n_classes, config.options.units, precision)
        model(tf.zeros([1, 1, n_input]))
        return model

    def stream_input(self, config, n_steps):
        """Windows of one frame (no context)."""
        return StreamInput(WINDOWS, n_steps)

    def state(self, config):
        """The RNN's output."""
        return (StateTensor("previous_state", "new_state", (1, config.options.units)),)

    def streaming(self, model, n_steps):
        """See ``SimpleRnnStreaming``."""
        return SimpleRnnStreaming(model, n_steps)

    def layers(self, model):
        """Input to output."""
        return ("front", "rnn", "out")


FAMILY = SimpleRnnFamily()
