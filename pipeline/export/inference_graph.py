"""The inference form of a trained model as a ``tf.Module``: what Export saves and converts.

The LSTM is written out step by step (``n_steps`` fixed) instead of a ``tf.while``
loop: TFLite cannot run the Keras LSTM's loop, and an explicit unroll lets the
input projection of all ``n_steps`` frames run as one matrix product, so only the
recurrent product is done frame by frame.
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

from pipeline.model.checkpoints import named_weights

SIGNATURE = "stream"
TENSORS = {
    "signature": SIGNATURE,
    "input": "input_node",
    "state_h": "previous_state_h",
    "state_c": "previous_state_c",
    "logits": "logits",
    "new_state_h": "new_state_h",
    "new_state_c": "new_state_c",
}


class InferenceGraph(tf.Module):
    """Streaming step and whole-utterance logits over copies of a trained model's weights."""

    def __init__(self, model, n_steps: int, metadata: dict):
        super().__init__(name="deepspeech")
        weights = {name: np.asarray(var.numpy()) for name, var in named_weights(model).items()}
        self.w = {
            name.replace(".", "_"): tf.Variable(value, trainable=False, name=name.replace(".", "_"))
            for name, value in weights.items()
        }
        self.clip = float(model.model_config.relu_clip)
        self.n_hidden = int(model.model_config.n_hidden)
        self.window = int(model.window)
        self.n_input = int(model.n_input)
        self.n_steps = int(n_steps)
        self.metadata_json = tf.constant(json.dumps(metadata, sort_keys=True))
        frame = [1, None, self.window, self.n_input]
        step = [1, self.n_steps, self.window, self.n_input]
        state = tf.TensorSpec([1, self.n_hidden], tf.float32)
        self.stream = tf.function(
            self._stream,
            input_signature=[
                tf.TensorSpec(step, tf.float32, name=TENSORS["input"]),
                tf.TensorSpec.from_spec(state, name=TENSORS["state_h"]),
                tf.TensorSpec.from_spec(state, name=TENSORS["state_c"]),
            ],
        )
        self.utterance = tf.function(
            self._utterance, input_signature=[tf.TensorSpec(frame, tf.float32, name=TENSORS["input"])]
        )
        self.metadata = tf.function(lambda: {"metadata": self.metadata_json}, input_signature=[])

    def _dense(self, x, layer, activation=True):
        y = tf.matmul(x, self.w[f"{layer}_kernel"]) + self.w[f"{layer}_bias"]
        return tf.minimum(tf.nn.relu(y), self.clip) if activation else y

    def _lstm_step(self, projected, h, c):
        z = projected + tf.matmul(h, self.w["lstm_lstm_cell_recurrent_kernel"])
        i, f, g, o = tf.split(z, 4, axis=-1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        return tf.sigmoid(o) * tf.tanh(c), c

    def _front(self, windows):
        time = tf.shape(windows)[1]
        x = tf.reshape(windows, [time, self.window * self.n_input])
        x = self._dense(self._dense(self._dense(x, "layer_1"), "layer_2"), "layer_3")
        return tf.matmul(x, self.w["lstm_lstm_cell_kernel"]) + self.w["lstm_lstm_cell_bias"]

    def _back(self, outputs):
        return self._dense(self._dense(outputs, "layer_5"), "layer_6", activation=False)

    def _stream(self, input_node, previous_state_h, previous_state_c):
        projected = self._front(input_node)
        h, c = previous_state_h, previous_state_c
        outputs = []
        for t in range(self.n_steps):
            h, c = self._lstm_step(projected[t : t + 1], h, c)
            outputs.append(h)
        logits = self._back(tf.concat(outputs, axis=0))
        return {
            TENSORS["logits"]: tf.identity(logits[None], name=TENSORS["logits"]),
            TENSORS["new_state_h"]: tf.identity(h, name=TENSORS["new_state_h"]),
            TENSORS["new_state_c"]: tf.identity(c, name=TENSORS["new_state_c"]),
        }

    def _utterance(self, input_node):
        projected = self._front(input_node)
        zeros = tf.zeros([1, self.n_hidden])

        def step(state, row):
            h, c = self._lstm_step(row[None], state[0], state[1])
            return h, c

        hs, _ = tf.scan(step, projected, initializer=(zeros, zeros))
        return {TENSORS["logits"]: self._back(hs[:, 0, :])[None]}
