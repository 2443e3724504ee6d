"""The CTC loss: TensorFlow's C++ kernel (sparse labels) on CPU, dense labels on a GPU.

``tf.nn.ctc_loss`` with dense labels runs a pure-TensorFlow implementation.
Measured here on CPU (batch 16, about 850 frames and 180 labels per
utterance) it took 5.3 s where the C++ kernel took 0.12 s, and it saturated:
every utterance whose true loss was above 706.9 (-ln of the smallest double)
came out as exactly 706.9, with no gradient. The C++ kernel gives the dense
implementation's values where those are right (a test checks). TensorFlow
supports only dense labels on a GPU, so they stay dense there.
"""

from __future__ import annotations

import tensorflow as tf


def sparse_labels_supported() -> bool:
    """True unless a GPU is visible (where TensorFlow's CTC needs dense labels)."""
    return not tf.config.list_physical_devices("GPU")


def ctc_loss(
    labels: tf.Tensor,
    label_lengths: tf.Tensor,
    logits: tf.Tensor,
    logit_lengths: tf.Tensor,
    blank_index: int,
    sparse: bool,
) -> tf.Tensor:
    """Per-utterance CTC loss ``[batch]`` of ``logits`` ``[batch, time, classes]`` against the padded
    ``labels`` ``[batch, max_label]``. With ``sparse`` the blank must be the last class (as ours is)."""
    if not sparse:
        return tf.nn.ctc_loss(
            labels, logits, label_lengths, logit_lengths, logits_time_major=False, blank_index=blank_index
        )
    classes = logits.shape[-1]
    if classes is not None and blank_index != classes - 1:
        raise ValueError(
            f"the CTC kernel needs the blank as the last class ({classes - 1}), got {blank_index}"
        )
    mask = tf.sequence_mask(label_lengths, tf.shape(labels)[1])
    indices = tf.where(mask)
    values = tf.cast(tf.gather_nd(labels, indices), tf.int32)
    sparse_labels = tf.SparseTensor(indices, values, tf.cast(tf.shape(labels), tf.int64))
    return tf.nn.ctc_loss(sparse_labels, logits, None, logit_lengths, logits_time_major=False, blank_index=-1)
