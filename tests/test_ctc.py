"""The CTC loss through TensorFlow's C++ kernel: the dense-label values where those are right, and no
saturation on long utterances."""

import numpy as np
import tensorflow as tf

from pipeline.train.ctc import ctc_loss


def _batch(seed: int, time: int, labels: int, batch: int = 3, classes: int = 29):
    rng = np.random.default_rng(seed)
    logits = tf.constant(rng.normal(size=(batch, time, classes)).astype(np.float32))
    label_lengths = tf.constant(rng.integers(labels // 2, labels + 1, batch).astype(np.int32))
    padded = rng.integers(0, classes - 1, (batch, labels)).astype(np.int32)
    padded[np.arange(labels)[None, :] >= label_lengths.numpy()[:, None]] = 0
    return logits, tf.constant(padded), label_lengths, tf.constant(np.full(batch, time, np.int32))


def test_the_kernel_gives_the_dense_values_and_gradients():
    logits, labels, label_lengths, lengths = _batch(0, time=60, labels=12)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        dense = ctc_loss(labels, label_lengths, logits, lengths, 28, sparse=False)
        sparse = ctc_loss(labels, label_lengths, logits, lengths, 28, sparse=True)
    np.testing.assert_allclose(sparse.numpy(), dense.numpy(), rtol=1e-5)
    # float32 sums in another order: measured at most 6e-5 apart
    np.testing.assert_allclose(
        tape.gradient(sparse, logits).numpy(), tape.gradient(dense, logits).numpy(), atol=1e-4
    )


def test_long_utterances_do_not_saturate():
    logits, labels, label_lengths, lengths = _batch(1, time=900, labels=180)
    sparse = ctc_loss(labels, label_lengths, logits, lengths, 28, sparse=True).numpy()
    assert np.all(np.isfinite(sparse)) and np.all(sparse > 1000)  # about 4 nats per frame of noise
    assert len(set(np.round(sparse, 3))) == 3
