"""The inference form of a trained model as a ``tf.Module``: what Export saves, freezes and converts.

It wraps the model family's streaming form (``pipeline.model``) with fixed
input signatures and DeepSpeech's tensor names: ``input_node`` windows
``[1, n_steps, window, n_input]``, the family's state tensors
(``previous_state_h``/``_c`` for DeepSpeech) in and out, ``logits``.
"""

from __future__ import annotations

import json

import tensorflow as tf

from pipeline.model import StateTensor, model_family

SIGNATURE = "stream"
# Many streams in one call: windows ``[batch, n_steps, window, n_input]``, each state ``[batch, ...]``
# (``deepspeech-serve`` steps every stream with a chunk ready at once). Only for families with a batched form.
BATCH_SIGNATURE = "stream_batch"
INPUT, LOGITS = "input_node", "logits"


class InferenceGraph(tf.Module):
    """Streaming step, whole-utterance logits and metadata of a trained model."""

    def __init__(self, model, n_steps: int, metadata: dict):
        super().__init__(name="acoustic_model")
        config = model.model_config
        family = model_family(config.architecture)
        self.form = family.streaming(model, n_steps)
        self.state_tensors = family.state(config)
        # The model's variables, tracked here so that the SavedModel holds them.
        self.weights = self.form.variables()
        window = 2 * family.context(config) + 1
        n_input = int(model.n_input)
        self.metadata_json = tf.constant(json.dumps(metadata, sort_keys=True))
        states = [tf.TensorSpec(s.shape, tf.float32, name=s.input) for s in self.state_tensors]
        self.stream = tf.function(
            self._stream,
            input_signature=[tf.TensorSpec([1, n_steps, window, n_input], tf.float32, name=INPUT), *states],
        )
        self.stream_batch = None
        if self.form.batched:
            batch_states = [
                tf.TensorSpec([None, *s.shape[1:]], tf.float32, name=s.input) for s in self.state_tensors
            ]
            self.stream_batch = tf.function(
                self._stream_batch,
                input_signature=[
                    tf.TensorSpec([None, n_steps, window, n_input], tf.float32, name=INPUT),
                    *batch_states,
                ],
            )
        self.utterance = tf.function(
            self._utterance,
            input_signature=[tf.TensorSpec([1, None, window, n_input], tf.float32, name=INPUT)],
        )
        self.metadata = tf.function(lambda: {"metadata": self.metadata_json}, input_signature=[])

    def _stream(self, windows, *state):
        logits, *new_state = self.form.step(windows, *state)
        out = {LOGITS: tf.identity(logits, name=LOGITS)}
        for spec, value in zip(self.state_tensors, new_state, strict=True):
            out[spec.output] = tf.identity(value, name=spec.output)
        return out

    def _stream_batch(self, windows, *state):
        logits, *new_state = self.form.batch_step(windows, *state)
        out = {LOGITS: tf.identity(logits, name=LOGITS)}
        for spec, value in zip(self.state_tensors, new_state, strict=True):
            out[spec.output] = tf.identity(value, name=spec.output)
        return out

    def signatures(self) -> dict:
        """The SavedModel's signatures: the streaming step (and its batched form when the family has one),
        the whole utterance, the metadata."""
        found = {SIGNATURE: self.stream, "utterance": self.utterance, "metadata": self.metadata}
        if self.stream_batch is not None:
            found[BATCH_SIGNATURE] = self.stream_batch
        return found

    def _utterance(self, windows):
        return {LOGITS: self.form.utterance(windows)}

    def tensors(self) -> dict:
        """The tensor names a client needs (the export metadata's ``tensors``)."""
        return tensor_names(self.state_tensors, self.stream_batch is not None)


def tensor_names(state: tuple[StateTensor, ...], batched: bool = False) -> dict:
    """The export's tensor names for a family's ``state``: signature, input, logits, and the state list;
    ``batch_signature`` (the batched streaming signature's name, same tensor names) when ``batched``."""
    names = {
        "signature": SIGNATURE,
        "input": INPUT,
        "logits": LOGITS,
        "state": [{"input": s.input, "output": s.output, "shape": list(s.shape)} for s in state],
    }
    if batched:
        names["batch_signature"] = BATCH_SIGNATURE
    return names
