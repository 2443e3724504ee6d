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
- the network it trains: the width of the family's output layer (``output_width``: the classes for CTC)
  and, optionally, layers of its own after it (``build_head``: a transducer's predictor and joiner), which
  the model holds as ``objective_head`` and checkpoints with the family's weights;
- its greedy transcripts (``best_labels``) where the CTC best path does not apply;
- what the trained network emits (``emits``), which the decoders, the export and the client read:
  ``ctc``, per-frame label scores with the blank as the last class, is the one the decoders read; the
  config loader refuses another, except the built-in transducer, whose export and client carry its
  predictor and joiner (preflight refuses TuneDecoder for it: ``tasks/preflight.py``
  ``check_objective_reach``).

The objective module should import without TensorFlow (the Features stage reads ``min_outputs``): the
built-in CTC keeps its loss in a sibling module (``pipeline/model/ctc.py``) imported when a loss is built.
"""

from __future__ import annotations

import abc
from typing import ClassVar

CTC_OUTPUT = "ctc"
TRANSDUCER_OUTPUT = "transducer"


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

    def output_width(self, config, n_classes: int) -> int:
        """The width of the family network's output layer for ``n_classes`` labels (the blank included):
        ``n_classes``, the label scores, unless the objective reads something else (``config``: the
        ``ModelConfig``)."""
        return n_classes

    def build_head(self, config, n_classes: int, precision: str):
        """The objective's own layers after the family's output (a Keras layer, built), or None."""
        return None

    def best_labels(self, outputs, output_lengths, blank_index: int, head):
        """Greedy transcripts as label indices ``[batch, max]``, -1 where no label is (anywhere in a row: the
        labels are those >= 0, in order), a TensorFlow computation; None where the CTC best path of
        ``outputs`` (the label scores) is the transcript."""
        return None

    @abc.abstractmethod
    def loss(
        self, labels, label_lengths, logits, logit_lengths, blank_index: int, jit_compile: bool, head=None
    ):
        """Per-utterance loss ``[batch]`` of ``logits`` ``[batch, time, output_width]`` (``logit_lengths``
        real frames each) against the padded ``labels`` ``[batch, max_label]``; ``jit_compile``: it runs
        inside an XLA cluster (``training.jit_compile``); ``head``: the model's ``build_head`` layers,
        passed only to an objective that has them (``objective_loss``). An utterance the loss cannot score
        is infinite (the step skips a non-finite loss)."""

    @abc.abstractmethod
    def min_outputs(self, labels) -> int:
        """The fewest output labels an utterance needs for the transcript ``labels`` (label indices)."""


def objective_loss(
    objective: Objective,
    labels,
    label_lengths,
    logits,
    logit_lengths,
    blank_index: int,
    jit_compile: bool,
    head,
):
    """``objective.loss``, ``head`` passed only when the model has one: an objective of one's own written
    for the six-argument ``loss`` (before heads) keeps working."""
    extra = {"head": head} if head is not None else {}
    return objective.loss(labels, label_lengths, logits, logit_lengths, blank_index, jit_compile, **extra)
