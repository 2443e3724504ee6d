"""The CTC objective (``model.objective: ctc``): connectionist temporal classification over the network's
per-frame label scores, the blank the last class. Its loss is ``pipeline.model.ctc`` (TensorFlow's kernel
on a CPU, an exact log-space CTC under XLA or on a GPU), imported when a loss is built, so that the
Features stage reads what CTC needs of the data without loading TensorFlow.
"""

from __future__ import annotations

from pipeline.model.objective import Objective


class CTC(Objective):
    """Connectionist temporal classification."""

    name = "ctc"
    too_short_rule = "ctc"

    def loss(
        self, labels, label_lengths, logits, logit_lengths, blank_index: int, jit_compile: bool, head=None
    ):
        """Per-utterance CTC loss: the kernel on a CPU without XLA, else the exact log-space CTC."""
        from pipeline.model.ctc import ctc_implementation, ctc_loss

        implementation = ctc_implementation(jit_compile)
        return ctc_loss(labels, label_lengths, logits, logit_lengths, blank_index, implementation)

    def min_outputs(self, labels) -> int:
        """One output label per label, plus a blank between repeats."""
        return ctc_min_frames(labels)


def ctc_min_frames(labels) -> int:
    """Fewest time steps CTC needs for ``labels``: one per label plus a blank between repeats."""
    repeats = sum(1 for a, b in zip(labels, labels[1:], strict=False) if a == b)
    return len(labels) + repeats


OBJECTIVE = CTC()
