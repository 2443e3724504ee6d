"""A model family of a user's own that emits one label per 4 feature frames: stacks of 4 frames through a
dense layer, a simple RNN and the output layer (``model.subsample4.units``). Its streaming form takes chunks
of frames (a multiple of 4) and carries the RNN's state, so the export and the client must read the stride,
the input kind and the state from the family and the metadata."""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf

from pipeline.config import family_option
from pipeline.model import ModelFamily, StateTensor, StreamingForm
from pipeline.model.family import FRAMES, StreamInput

STRIDE = 4


@dataclass(frozen=True)
class Subsample4Settings:
    """The test family's settings."""

    units: int = family_option(32, "Width of the dense layer and the RNN.", minimum=1, maximum=4096)


def stacked(features):
    """``[batch, time, n]`` -> ``[batch, ceil(time / 4), 4 n]``, zero frames after the end."""
    batch, time, width = tf.shape(features)[0], tf.shape(features)[1], features.shape[-1]
    padded = tf.pad(features, [[0, 0], [0, (-time) % STRIDE], [0, 0]])
    return tf.reshape(padded, [batch, -1, STRIDE * width])


class Subsample4Model(keras.Model):
    """features [batch, time, n_input] -> logits [batch, ceil(time / 4), n_classes]."""

    def __init__(self, config, n_input: int, n_classes: int, precision: str = "float32"):
        super().__init__(dtype=precision)
        self.model_config, self.n_input = config, n_input
        units, seed = config.options.units, config.random_seed
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
        """Logits of every stack of 4 frames."""
        return tf.cast(self.out(self.rnn(self.front(stacked(features)))), tf.float32)


class Subsample4Streaming(StreamingForm):
    """The same layers over one chunk of frames, the RNN's cell stepped from the state carried in."""

    def step(self, frames, state):
        """``n_steps`` frames -> ``n_steps / 4`` labels and the new state."""
        x = self.model.front(stacked(frames))
        cell = self.model.rnn.cell
        projected = tf.matmul(x[0], cell.kernel) + cell.bias
        outputs = []
        for t in range(self.n_steps // STRIDE):
            state = tf.tanh(projected[t : t + 1] + tf.matmul(state, cell.recurrent_kernel))
            outputs.append(state)
        return self.model.out(tf.concat(outputs, 0)[None]), state

    def utterance(self, frames):
        """A whole utterance from a zero state."""
        return self.model(frames)


class Subsample4Family(ModelFamily):
    """Stacks of 4 frames -> Dense -> SimpleRNN -> Dense."""

    name = "subsample4"
    Settings = Subsample4Settings

    def build(self, config, n_input, n_classes, precision="float32"):
        """The model, ``model.subsample4.units`` wide."""
        model = Subsample4Model(config, n_input, n_classes, precision)
        model(tf.zeros([1, STRIDE, n_input]))
        return model

    def stride(self, config):
        """4 frames per label."""
        return STRIDE

    def stream_input(self, config, n_steps):
        """Chunks of ``n_steps`` frames, no look-ahead."""
        return StreamInput(FRAMES, n_steps)

    def state(self, config):
        """The RNN's output."""
        return (StateTensor("previous_state", "new_state", (1, config.options.units)),)

    def streaming(self, model, n_steps):
        """See ``Subsample4Streaming``."""
        return Subsample4Streaming(model, n_steps)

    def layers(self, model):
        """Input to output."""
        return ("front", "rnn", "out")


FAMILY = Subsample4Family()
