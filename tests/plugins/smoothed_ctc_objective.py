"""An objective of a user's own: CTC with label smoothing. Each utterance's loss is
``(1 - WEIGHT) * CTC + WEIGHT * (the cross-entropy of its frames' posteriors against a uniform one,
summed over its frames)``, so it differs measurably from plain CTC on the same weights. It needs of the
data what CTC needs (its ``min_outputs`` and ``too_short_rule`` are CTC's), so it shares CTC's feature
caches. Like every objective module it imports without TensorFlow, which only its loss needs. Its
``loss`` takes the six arguments of an objective without a head of its own (no ``head``), which the
trainer still calls so."""

from __future__ import annotations

from pipeline.model.objectives.ctc import CTC

WEIGHT = 0.1


class SmoothedCTC(CTC):
    """CTC with label smoothing towards the uniform distribution."""

    name = "tests.plugins.smoothed_ctc_objective"

    def loss(self, labels, label_lengths, logits, logit_lengths, blank_index: int, jit_compile: bool):
        """``(1 - WEIGHT)`` CTC plus ``WEIGHT`` times the summed per-frame uniform cross-entropy."""
        import tensorflow as tf

        ctc = super().loss(labels, label_lengths, logits, logit_lengths, blank_index, jit_compile)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
        frames = tf.sequence_mask(logit_lengths, tf.shape(logits)[1], tf.float32)
        uniform = -tf.reduce_sum(tf.reduce_mean(log_probs, axis=-1) * frames, axis=1)
        return (1 - WEIGHT) * ctc + tf.cast(WEIGHT * uniform, ctc.dtype)


OBJECTIVE = SmoothedCTC()
