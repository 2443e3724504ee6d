"""What a model family provides: the interface ``pipeline/model/<name>.py`` implements."""

from __future__ import annotations

import abc
from dataclasses import dataclass

from pipeline.config import ModelConfig


@dataclass(frozen=True)
class StateTensor:
    """One recurrent state tensor of the streaming form: its input and output names in the export and
    its shape (batch 1). The client starts every utterance with zeros and feeds each output back."""

    input: str
    output: str
    shape: tuple[int, ...]


class StreamingForm(abc.ABC):
    """The inference form of a trained model, over the training model's own layers.

    ``step`` runs ``n_steps`` time steps with the state carried in and out (what
    the export's streaming signature and TFLite run); ``utterance`` runs any
    number of steps from a zero state. Both take context windows
    ``[1, time, 2 * context + 1, n_input]``, as DeepSpeech's exports do.
    """

    def __init__(self, model, n_steps: int):
        self.model = model
        self.n_steps = int(n_steps)

    def variables(self) -> list:
        """The TensorFlow variables the form reads (the Keras model's own), for a module that saves it."""
        return [variable.value for variable in self.model.weights]

    @abc.abstractmethod
    def step(self, windows, *state) -> tuple:
        """``(logits [1, n_steps, n_classes], *new_state)`` for windows ``[1, n_steps, window, n_input]``."""

    @abc.abstractmethod
    def utterance(self, windows):
        """Logits ``[1, time, n_classes]`` of a whole utterance's windows, from a zero state."""

    # Families whose streaming form can step several independent streams in one call set this and
    # implement ``batch_step``; the export then carries a batched streaming signature.
    batched: bool = False

    def batch_step(self, windows, *state) -> tuple:
        """``(logits [batch, n_steps, n_classes], *new_state)`` for windows ``[batch, n_steps, window,
        n_input]`` of ``batch`` independent streams, each state ``[batch, ...]`` (row ``i`` is stream
        ``i``'s): the same numbers as ``step`` on each stream alone."""
        raise NotImplementedError(f"{type(self).__name__} has no batched step")


class ModelFamily(abc.ABC):
    """A family of acoustic models chosen by ``model.architecture``."""

    name: str

    @abc.abstractmethod
    def build(self, config: ModelConfig, n_input: int, n_classes: int, precision: str = "float32"):
        """The training model, weights made: ``model(features [batch, time, n_input], training=...)``
        returns float32 logits ``[batch, time, n_classes]`` (the CTC blank is the last class)."""

    @abc.abstractmethod
    def context(self, config: ModelConfig) -> int:
        """Frames of context on each side of a time step in the streaming form's windows."""

    @abc.abstractmethod
    def state(self, config: ModelConfig) -> tuple[StateTensor, ...]:
        """The recurrent state the streaming form carries between calls."""

    @abc.abstractmethod
    def streaming(self, model, n_steps: int) -> StreamingForm:
        """The streaming form of a trained ``model`` (the same layer objects, inference only)."""

    def import_weights(self, source, config, alphabet=None) -> dict | None:
        """Weights of a model trained elsewhere (another toolkit's checkpoint or export) that
        ``training.init_from`` names, as ``{weight name: array}`` in this family's names; None when ``source``
        is not such a model (it is then read as this project's checkpoint). ``config`` (the whole Config,
        or None) and ``alphabet`` (the run's, or None) let it refuse a model that does not fit: ValueError
        naming what differs. Default: no foreign models."""
        return None

    @abc.abstractmethod
    def layers(self, model) -> tuple[str, ...]:
        """The model's layers from input to output, as the first part of its weight names
        (``layer_1`` in ``layer_1.kernel``): ``training.drop_source_layers`` re-initialises the last ones."""
