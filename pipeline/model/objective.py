"""What an objective provides: the interface ``pipeline/model/objectives/<name>.py`` implements.

A model is a family's network (``family.py``) trained for an objective, chosen by ``model.objective``
(``ctc``, the first; a module of one's own by its dotted name). The objective owns:

- its loss: per-utterance loss ``[batch]`` of the network's output against the transcripts, the same
  function in training, validation and evaluation;
- what it needs of the data: the fewest output labels an utterance must give for a transcript
  (``min_outputs``; the Features stage drops shorter utterances, counting the family's output rate), and
  the name of that rule (``too_short_rule``, declared by the class that defines ``min_outputs``; default
  that class's dotted name), which the Features fingerprint holds when it is not CTC's: an objective that
  inherits CTC's ``min_outputs`` shares CTC's feature caches, one that writes its own has caches of its
  own unless it declares the rule of the one it copies;
- what the trained network emits (``emits``), which the decoders, the export and the client read:
  ``ctc``, per-frame label scores with the blank as the last class, is the one they read today, and the
  config loader refuses another.

The objective module should import without TensorFlow (the Features stage reads ``min_outputs``): the
built-in CTC keeps its loss in a sibling module (``pipeline/model/ctc.py``) imported when a loss is built.
"""

from __future__ import annotations

import abc
from typing import ClassVar

CTC_OUTPUT = "ctc"


class Objective(abc.ABC):
    """The training objective chosen by ``model.objective``."""

    name: str
    emits: ClassVar[str] = CTC_OUTPUT
    too_short_rule: ClassVar[str | None] = None

    @property
    def data_rule(self) -> str:
        """The too-short rule's name as the Features fingerprint holds it: the ``too_short_rule`` of the
        class that defines ``min_outputs``, else that class's dotted name."""
        owner = next(cls for cls in type(self).__mro__ if "min_outputs" in vars(cls))
        return vars(owner).get("too_short_rule") or f"{owner.__module__}.{owner.__qualname__}"

    @abc.abstractmethod
    def loss(self, labels, label_lengths, logits, logit_lengths, blank_index: int, jit_compile: bool):
        """Per-utterance loss ``[batch]`` of ``logits`` ``[batch, time, classes]`` (``logit_lengths`` real
        frames each) against the padded ``labels`` ``[batch, max_label]``; ``jit_compile``: it runs inside
        an XLA cluster (``training.jit_compile``). An utterance the loss cannot score is infinite (the step
        skips a non-finite loss)."""

    @abc.abstractmethod
    def min_outputs(self, labels) -> int:
        """The fewest output labels an utterance needs for the transcript ``labels`` (label indices)."""
