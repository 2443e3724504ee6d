"""The inference form of a trained model as a ``tf.Module``: what Export saves, freezes and converts.

For a family with a streaming form (``pipeline.model``) it wraps that form with fixed input signatures and
DeepSpeech's tensor names: ``input_node`` (what the family's ``stream_input`` says one call takes: context
windows ``[1, n_steps, window, n_input]`` for DeepSpeech, or frames ``[1, lookback + chunk + lookahead,
n_input]``),
the family's state tensors (``previous_state_h``/``_c`` for DeepSpeech) in and out, ``logits``. For a family
without one, the export's one signature is ``utterance``: a whole utterance's features ``[1, time,
n_input]`` in, its logits ``[1, time / stride, n_classes]`` out. Every signature takes raw features: a
model trained with ``features.normalize: global`` normalises them itself (``pipeline.model.normalization``).
"""

from __future__ import annotations

import json

import tensorflow as tf

from pipeline.model import StateTensor, model_family
from pipeline.model.family import WINDOWS, StreamInput
from pipeline.model.normalization import normalized

SIGNATURE = "stream"
UTTERANCE = "utterance"
# Many streams in one call: the inputs ``[batch, ...]``, each state ``[batch, ...]`` (``deepspeech-serve``
# steps every stream with a chunk ready at once). Only for families with a batched form.
BATCH_SIGNATURE = "stream_batch"
INPUT, FEATURES, LOGITS = "input_node", "features", "logits"
# A transducer's predictor and joiner (issue 47): the streaming signatures give the projected encoder frames
# (``logits`` is their name, ``joint_dim`` wide); a search calls these between two chunks.
PREDICT, JOIN = "predict", "join"
CONTEXTS, PREDICTED, FRAMES = "contexts", "predicted", "frames"


def input_shape(spec: StreamInput, n_input: int, batch: int | None = 1) -> list:
    """The shape of one streaming call's input (``time`` None: any number of steps)."""
    if spec.kind == WINDOWS:
        return [batch, spec.chunk, 2 * spec.context + 1, n_input]
    return [batch, spec.lookback + spec.chunk + spec.lookahead, n_input]


class InferenceGraph(tf.Module):
    """Streaming step (when the family has one), whole-utterance logits and metadata of a trained model."""

    def __init__(self, model, n_steps: int, metadata: dict):
        super().__init__(name="acoustic_model")
        config = model.model_config
        family = model_family(config.architecture)
        self.family, self.model = family, model
        self.form = family.streaming(model, n_steps)
        self.spec = family.stream_input(config, n_steps) if self.form is not None else None
        self.state_tensors = family.state(config) if self.form is not None else ()
        # The model's variables, tracked here so that the SavedModel holds them.
        self.weights = [variable.value for variable in model.weights]
        n_input = int(model.n_input)
        self.metadata_json = tf.constant(json.dumps(metadata, sort_keys=True))
        self.metadata = tf.function(lambda: {"metadata": self.metadata_json}, input_signature=[])
        self.stream = self.stream_batch = self.predict = self.join = None
        self.head = transducer_head(model)
        if self.head is not None:
            width = self.head.joint_dim
            self.predict = tf.function(
                self._predict,
                input_signature=[tf.TensorSpec([None, self.head.context_size], tf.int32, name=CONTEXTS)],
            )
            self.join = tf.function(
                self._join,
                input_signature=[
                    tf.TensorSpec([None, width], tf.float32, name=FRAMES),
                    tf.TensorSpec([None, width], tf.float32, name=PREDICTED),
                ],
            )
        if self.form is None:
            self.utterance = tf.function(
                self._features_utterance,
                input_signature=[tf.TensorSpec([1, None, n_input], tf.float32, name=FEATURES)],
            )
            return
        states = [tf.TensorSpec(s.shape, tf.float32, name=s.input) for s in self.state_tensors]
        self.stream = tf.function(
            self._stream,
            input_signature=[tf.TensorSpec(input_shape(self.spec, n_input), tf.float32, name=INPUT), *states],
        )
        if self.form.batched:
            batch_states = [
                tf.TensorSpec([None, *s.shape[1:]], tf.float32, name=s.input) for s in self.state_tensors
            ]
            self.stream_batch = tf.function(
                self._stream_batch,
                input_signature=[
                    tf.TensorSpec(input_shape(self.spec, n_input, None), tf.float32, name=INPUT),
                    *batch_states,
                ],
            )
        whole = input_shape(self.spec, n_input)
        whole[1] = None
        self.utterance = tf.function(
            self._utterance, input_signature=[tf.TensorSpec(whole, tf.float32, name=INPUT)]
        )

    def _stream(self, inputs, *state):
        logits, *new_state = self.form.step(normalized(self.model, inputs), *state)
        out = {LOGITS: tf.identity(logits, name=LOGITS)}
        for spec, value in zip(self.state_tensors, new_state, strict=True):
            out[spec.output] = tf.identity(value, name=spec.output)
        return out

    def _stream_batch(self, inputs, *state):
        logits, *new_state = self.form.batch_step(normalized(self.model, inputs), *state)
        out = {LOGITS: tf.identity(logits, name=LOGITS)}
        for spec, value in zip(self.state_tensors, new_state, strict=True):
            out[spec.output] = tf.identity(value, name=spec.output)
        return out

    def _predict(self, contexts):
        """The predictor's projection of each label window."""
        return {PREDICTED: tf.cast(self.head.predict(contexts), tf.float32)}

    def _join(self, frames, predicted):
        """The joiner's logits of each pair of a frame and a predictor output."""
        return {LOGITS: tf.cast(self.head.join(frames, predicted), tf.float32)}

    def signatures(self) -> dict:
        """The SavedModel's signatures: the streaming step (and its batched form when the family has one),
        the whole utterance, the metadata; a transducer's ``predict`` and ``join``."""
        found = {UTTERANCE: self.utterance, "metadata": self.metadata}
        if self.stream is not None:
            found[SIGNATURE] = self.stream
        if self.stream_batch is not None:
            found[BATCH_SIGNATURE] = self.stream_batch
        if self.head is not None:
            found[PREDICT], found[JOIN] = self.predict, self.join
        return found

    def _utterance(self, inputs):
        return {LOGITS: self.form.utterance(normalized(self.model, inputs))}

    def _features_utterance(self, features):
        logits = self.family.utterance(self.model, normalized(self.model, features))
        return {LOGITS: tf.identity(logits, name=LOGITS)}

    @property
    def main(self):
        """The function the frozen graph and the TFLite model hold: the streaming step, or the whole
        utterance for a family without a streaming form."""
        return self.stream if self.stream is not None else self.utterance

    def tensors(self) -> dict:
        """The tensor names a client needs (the export metadata's ``tensors``)."""
        return tensor_names(self.state_tensors, self.stream_batch is not None, self.stream is not None)


def transducer_head(model):
    """The model's transducer head (predictor and joiner), or None for a model without one."""
    from pipeline.model.transducer_net import TransducerHead

    head = getattr(model, "objective_head", None)
    return head if isinstance(head, TransducerHead) else None


def transducer_entry(head) -> dict:
    """The export metadata's ``transducer`` entry (format 7): the searches' settings and the signatures
    and tensor names of the predictor and the joiner."""
    return {
        "blank": int(head.blank),
        "context_size": int(head.context_size),
        "joint_dim": int(head.joint_dim),
        "max_symbols": int(head.max_symbols),
        "beam": 4,  # icefall's modified beam search's default
        "predict": {"signature": PREDICT, "input": CONTEXTS, "output": PREDICTED},
        "join": {"signature": JOIN, "frames": FRAMES, "predicted": PREDICTED, "output": LOGITS},
    }


def tensor_names(state: tuple[StateTensor, ...], batched: bool = False, streaming: bool = True) -> dict:
    """The export's tensor names for a family's ``state``: signature, input, logits, and the state list;
    ``batch_signature`` (the batched streaming signature's name, same tensor names) when ``batched``. Without
    a streaming form: the ``utterance`` signature over ``features``, no state."""
    if not streaming:
        return {"signature": UTTERANCE, "input": FEATURES, "logits": LOGITS, "state": []}
    names = {
        "signature": SIGNATURE,
        "input": INPUT,
        "logits": LOGITS,
        "state": [{"input": s.input, "output": s.output, "shape": list(s.shape)} for s in state],
    }
    if batched:
        names["batch_signature"] = BATCH_SIGNATURE
    return names
