"""The transducer objective (issue 47, in progress): RNN-T over a joiner's scores of every pair of an
encoder frame and a count of labels emitted so far.

What exists so far is its loss, ``rnnt_loss`` (the recursion is ``pipeline/model/rnnt.py``, imported when a
loss is computed, so that this module imports without TensorFlow as an objective module must), and the
stateless predictor and joiner (``pipeline/model/transducer_net.py``). The ``Objective`` seam takes a
network's per-frame scores, which a transducer does not have, so this module defines no ``OBJECTIVE`` yet
and ``model.objective: transducer`` is refused when the config loads.
"""

from __future__ import annotations


def rnnt_loss(logits, labels, logit_lengths, label_lengths, blank: int):
    """Per-utterance negative log-likelihood ``[batch]`` of the padded ``labels`` ``[batch, max_labels]``
    under the joiner's unnormalised outputs ``logits`` ``[batch, frames, max_labels + 1, classes]``
    (``logit_lengths`` frames and ``label_lengths`` labels each; ``blank`` any class index), exact, in log
    space; padding past each utterance's lengths gets zero gradient. Runs under XLA and on any device."""
    from pipeline.model.rnnt import rnnt_loss as loss

    return loss(logits, labels, logit_lengths, label_lengths, blank)
