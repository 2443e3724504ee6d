"""What a model family provides: the interface ``pipeline/model/<name>.py`` implements.

A family declares, in its one module:

- its settings: ``Settings``, a frozen dataclass whose fields carry the schema's metadata (``doc``, ``min``,
  ``max``: ``pipeline.config.family_option``), written under ``model.<name>:`` in a config, documented in
  docs/CONFIGURATION.md and range-checked when the config loads;
- its output rate: ``stride`` feature frames per output label and ``output_lengths(feature_lengths)``,
  which the objective's loss, the Features stage's too-short check, the export's metadata and the
  client's word timings all use;
- its forward pass (``forward``), whose output the objective (``model.objective``, ``objective.py``)
  scores: a family knows no loss; a family whose inference restricts each label's context (chunked
  attention) says so (``limits_context``) and gives the full-context computation too, whose figures
  Evaluate reports beside; and, optionally, its encoder and output layer apart (``encode``,
  ``output_layer``), for one head per task in multi-task training;
- its inference forms: ``utterance`` (a whole utterance, what every export carries) and, when it has one,
  ``streaming`` with ``stream_input`` (what one streaming call takes: context windows, or a chunk of
  frames with a look-ahead) and ``state`` (named tensors of any shape, carried between calls).

The family module itself must import without TensorFlow (the config loader reads ``Settings`` from it):
the built-in families keep their layers in a sibling module (``deepspeech_net.py``) imported when a model
is built.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

from pipeline.config import ModelConfig

WINDOWS, FRAMES = "windows", "frames"


@dataclass(frozen=True)
class StateTensor:
    """One state tensor of the streaming form: its input and output names in the export and its shape
    (batch 1 first, any shape after). The client starts every utterance with zeros and feeds each output
    back."""

    input: str
    output: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class StreamInput:
    """What one call of a streaming form takes. ``kind`` ``windows``: ``[1, chunk, 2 * context + 1,
    n_input]`` context windows (DeepSpeech's ``input_node``), zero frames past the utterance's edges;
    ``frames``: ``[1, lookback + chunk + lookahead, n_input]`` feature frames: the ``lookback`` frames
    before the chunk (zero before the utterance), the chunk's, and ``lookahead`` frames after it (zero
    after the utterance); call ``k``'s chunk starts at frame ``k * chunk``. ``chunk`` is in feature
    frames (``export.n_steps`` unless the family fixes it); a call emits ``chunk / stride`` labels."""

    kind: str
    chunk: int
    context: int = 0
    lookahead: int = 0
    lookback: int = 0

    def to_dict(self) -> dict:
        """The export metadata's ``streaming`` entry."""
        return {
            "input": self.kind,
            "chunk": self.chunk,
            "context": self.context,
            "lookahead": self.lookahead,
            "lookback": self.lookback,
        }


class StreamingForm(abc.ABC):
    """The streaming form of a trained model, over the training model's own layers.

    ``step`` runs one call (``n_steps`` frames' worth of input, as the family's ``stream_input`` says)
    with the state carried in and out (what the export's streaming signature and TFLite run); ``utterance``
    runs any number of steps from a zero state, on the same kind of input.
    """

    def __init__(self, model, n_steps: int):
        self.model = model
        self.n_steps = int(n_steps)

    def variables(self) -> list:
        """The TensorFlow variables the form reads (the Keras model's own), for a module that saves it."""
        return [variable.value for variable in self.model.weights]

    @abc.abstractmethod
    def step(self, inputs, *state) -> tuple:
        """``(logits [1, n_steps / stride, n_classes], *new_state)`` for one call's input."""

    @abc.abstractmethod
    def utterance(self, inputs):
        """Logits ``[1, time, n_classes]`` of a whole utterance's input, from a zero state."""

    # Families whose streaming form can step several independent streams in one call set this and
    # implement ``batch_step``; the export then carries a batched streaming signature.
    batched: bool = False

    def batch_step(self, inputs, *state) -> tuple:
        """``(logits [batch, n_steps, n_classes], *new_state)`` for the inputs of ``batch`` independent
        streams, each state ``[batch, ...]`` (row ``i`` is stream ``i``'s): the same numbers as ``step`` on
        each stream alone."""
        raise NotImplementedError(f"{type(self).__name__} has no batched step")


class ModelFamily(abc.ABC):
    """A family of acoustic models chosen by ``model.architecture``."""

    name: str
    # The family's own settings (a frozen dataclass, fields made with ``pipeline.config.family_option``),
    # read from ``model.<name>:``; None for a family that has none.
    Settings: ClassVar[type | None] = None

    def settings(self, config: ModelConfig):
        """The family's settings in ``config``: its ``Settings`` from ``model.<name>:`` (``config.options``,
        the defaults in a section built without the config loader); None for a family without them."""
        if self.Settings is None:
            return None
        return config.options if isinstance(config.options, self.Settings) else self.Settings()

    def check(self, config: ModelConfig) -> None:
        """ValueError (one line, naming the key) for settings that are wrong together; called when the
        config loads. Default: nothing to check beyond each field's range."""
        return None

    @abc.abstractmethod
    def build(self, config: ModelConfig, n_input: int, n_classes: int, precision: str = "float32"):
        """The training model, weights made: ``forward`` runs it; its ``model_config`` attribute is
        ``config`` and its ``n_input`` the feature size."""

    # -- the output rate -----------------------------------------------------------------------------
    def stride(self, config: ModelConfig) -> int:
        """Feature frames per output label (1: one label per frame, DeepSpeech). The Features stage's
        fingerprint holds it, since its too-short check depends on it."""
        return 1

    def output_lengths(self, config: ModelConfig, feature_lengths):
        """Output labels of utterances of ``feature_lengths`` frames (an int, a numpy array or a tensor):
        ``ceil(frames / stride)``, what ``same``-padded strided layers give."""
        stride = self.stride(config)
        return feature_lengths if stride == 1 else (feature_lengths + stride - 1) // stride

    def min_feature_frames(self, config: ModelConfig, outputs: int) -> int:
        """The fewest feature frames whose output length is at least ``outputs``."""
        frames = max(0, int(outputs) * self.stride(config) - self.stride(config) + 1)
        while int(self.output_lengths(config, frames)) < outputs:
            frames += 1
        return frames

    # -- training and evaluation ---------------------------------------------------------------------
    def forward(self, model, features, lengths, training: bool, full_context: bool = False):
        """``(logits [batch, time', n_classes] float32, output lengths [batch])`` of padded ``features``
        ``[batch, time, n_input]`` whose rows hold ``lengths`` real frames: without ``training``, the
        computation the export runs; ``full_context`` (only for a family that ``limits_context``): each
        label seeing the whole utterance."""
        return model(features, training=training), self.output_lengths(model.model_config, lengths)

    def limits_context(self, config: ModelConfig) -> bool:
        """Whether inference restricts each label's context (a chunked attention): Evaluate then reports
        ``forward(..., full_context=True)``'s figures beside the headline ones. Default: no."""
        return False

    # -- heads (multi-task training with multitask.sharing: heads) ------------------------------------
    def encode(self, model, features, lengths, training: bool):
        """``(hidden [batch, time', d], output lengths [batch])``: the model up to its output layer, which
        maps ``hidden`` to the logits (``forward`` is ``output_layer(model)`` over it, in float32). A family
        that gives it trains several tasks over one encoder with a head each (``multitask.sharing: heads``,
        ``pipeline.model.heads``). Default: none."""
        raise NotImplementedError(f"the {self.name} family has no encoder/head split")

    def output_layer(self, model):
        """The layer that maps ``encode``'s output to the logits (a Keras ``Dense``: the heads of other tasks
        are made from its configuration with their own number of classes)."""
        raise NotImplementedError(f"the {self.name} family has no encoder/head split")

    @property
    def has_heads(self) -> bool:
        """Whether the family gives ``encode`` and ``output_layer`` (one head per task)."""
        return type(self).encode is not ModelFamily.encode

    # -- inference -----------------------------------------------------------------------------------
    def utterance(self, model, features):
        """Logits ``[1, time', n_classes]`` of a whole utterance's features ``[1, time, n_input]``: the
        one-shot form every export carries."""
        return model(features, training=False)

    def stream_input(self, config: ModelConfig, n_steps: int) -> StreamInput | None:
        """What one streaming call takes, or None when the family has no streaming form (the client then
        transcribes whole utterances only)."""
        return None

    def state(self, config: ModelConfig) -> tuple[StateTensor, ...]:
        """The state the streaming form carries between calls (none without a streaming form)."""
        return ()

    def streaming(self, model, n_steps: int) -> StreamingForm | None:
        """The streaming form of a trained ``model`` (the same layer objects, inference only), or None."""
        return None

    def import_weights(self, source, config, alphabet=None) -> dict | None:
        """Weights of a model trained elsewhere (another toolkit's checkpoint or export) that
        ``training.init_from`` names, as ``{weight name: array}`` in this family's names; None when ``source``
        is not such a model (it is then read as this project's checkpoint). ``config`` (the whole Config,
        or None) and ``alphabet`` (the run's, or None) let it refuse a model that does not fit: ValueError
        naming what differs. Default: no foreign models."""
        return None

    def fold_normalization(self, weights: dict, mean, std) -> dict:
        """``weights`` (``import_weights``'s, of a model trained on raw features) changed so that the model
        gives the same outputs on features normalised with ``mean`` and ``std`` (float32 arrays, one value
        per coefficient): what a warm start from a foreign model needs under ``features.normalize:
        global``. Default: ValueError (the family cannot)."""
        raise ValueError(
            f"the {self.name} family cannot fold global normalisation into a model trained on raw "
            f"features; set features.normalize: false"
        )

    @abc.abstractmethod
    def layers(self, model) -> tuple[str, ...]:
        """The model's layers from input to output, as the first part of its weight names
        (``layer_1`` in ``layer_1.kernel``): ``training.drop_source_layers`` re-initialises the last ones."""
