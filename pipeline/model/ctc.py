"""The CTC loss: TensorFlow's C++ kernel on the host's CPU (also when the model runs on a GPU), an exact
log-space implementation of our own where that kernel cannot run (inside a ``training.jit_compile`` step).

TensorFlow has three CTC paths, and only one is right for long utterances:

- the C++ kernel (``tf.nn.ctc_loss`` with sparse labels, placed on a CPU): exact, fast. It has no XLA
  kernel, so it cannot run inside a ``jit_compile`` step.
- with sparse labels on a GPU, TensorFlow 2.21's implementation selector swaps in cuDNN's CTC
  (``ctc_ops._ctc_loss_op_cudnn``), which cuDNN limits to 256 labels per utterance.
- with dense labels, a pure-TensorFlow forward-backward (``ctc_ops.ctc_loss_dense``) that starts from
  ``log(1e-307)`` instead of minus infinity for impossible states: every utterance whose true loss is
  above 706.9 comes out as 706.9, with no useful gradient. Measured here on a CPU (batch 16, about 850
  frames and 180 labels) it also took 5.3 s where the kernel took 0.12 s.

So ``log_space_ctc_loss`` below is written by hand: the forward-backward recursion over the 2L + 1
states of the blank-extended label (three predecessors per state, not TensorFlow's dense S x S
transition matrix), in log space with true minus infinity, normalised at every frame (so posteriors
need no subtraction of huge numbers), and the gradient ``softmax - state posteriors`` given explicitly.
It is plain TensorFlow (``tf.scan``), so XLA compiles it and it runs on any device; a test checks its
values and gradients against the kernel and a float64 reference on a 1,500-frame, 300-label case.
"""

from __future__ import annotations

import tensorflow as tf

KERNEL = "kernel"
LOG_SPACE = "log_space"


def ctc_implementation(jit_compile: bool) -> str:
    """Which CTC to use: ``LOG_SPACE`` inside an XLA step (``jit_compile``), else ``KERNEL``, which runs on
    the host's CPU even where the model runs on a GPU (as DeepSpeech's did): there the log-space loss would
    be a per-frame ``tf.scan`` of about 110 small ops, one kernel launch each, likely more time than the
    model."""
    return LOG_SPACE if jit_compile else KERNEL


def ctc_loss(
    labels: tf.Tensor,
    label_lengths: tf.Tensor,
    logits: tf.Tensor,
    logit_lengths: tf.Tensor,
    blank_index: int,
    implementation: str,
) -> tf.Tensor:
    """Per-utterance CTC loss ``[batch]`` of ``logits`` ``[batch, time, classes]`` against the padded
    ``labels`` ``[batch, max_label]``, by ``implementation`` (``ctc_implementation``). The kernel needs
    the blank as the last class (as ours is)."""
    if implementation == LOG_SPACE:
        return log_space_ctc_loss(labels, label_lengths, logits, logit_lengths, blank_index)
    if implementation != KERNEL:
        raise ValueError(f"unknown CTC implementation {implementation!r}")
    classes = logits.shape[-1]
    if classes is not None and blank_index != classes - 1:
        raise ValueError(
            f"the CTC kernel needs the blank as the last class ({classes - 1}), got {blank_index}"
        )
    mask = tf.sequence_mask(label_lengths, tf.shape(labels)[1])
    indices = tf.where(mask)
    values = tf.cast(tf.gather_nd(labels, indices), tf.int32)
    sparse_labels = tf.SparseTensor(indices, values, tf.cast(tf.shape(labels), tf.int64))
    # The raw CTCLoss op, on the host's CPU. Not tf.nn.ctc_loss: it is a function call whose version
    # Grappler picks by each call's device, and its gradient's call lands on the tower's device, where a
    # GPU swaps in cuDNN's version (blank first: every gradient shifted by one class; 256 labels at most).
    with tf.device("/device:CPU:0"):
        return tf.compat.v1.nn.ctc_loss(sparse_labels, logits, logit_lengths, time_major=False)


def _logsumexp3(a: tf.Tensor, b: tf.Tensor, c: tf.Tensor) -> tf.Tensor:
    """log(exp(a) + exp(b) + exp(c)) elementwise; minus infinity stays minus infinity (never NaN)."""
    top = tf.maximum(tf.maximum(a, b), c)
    top = tf.where(tf.math.is_finite(top), top, tf.zeros_like(top))
    return top + tf.math.log(tf.exp(a - top) + tf.exp(b - top) + tf.exp(c - top))


def _normalise(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(x minus its logsumexp over the last axis, that logsumexp); an all minus-infinity row stays so."""
    total = tf.reduce_logsumexp(x, axis=-1)
    safe = tf.where(tf.math.is_finite(total), total, tf.zeros_like(total))
    return x - safe[..., None], total


def _shift(x: tf.Tensor, by: int, fill) -> tf.Tensor:
    """``x`` moved ``by`` places along the last axis (positive: to higher indices), ``fill`` in the gap."""
    pad = tf.fill(tf.concat([tf.shape(x)[:-1], [abs(by)]], 0), tf.cast(fill, x.dtype))
    return tf.concat([pad, x[..., :-by]], -1) if by > 0 else tf.concat([x[..., -by:], pad], -1)


def log_space_ctc_loss(
    labels: tf.Tensor,
    label_lengths: tf.Tensor,
    logits: tf.Tensor,
    logit_lengths: tf.Tensor,
    blank_index: int,
) -> tf.Tensor:
    """Per-utterance CTC loss ``[batch]``, exact at any length (see the module docstring), with its
    gradient with respect to ``logits`` ``[batch, time, classes]``. An utterance too short for its labels
    has an infinite loss (as the kernel gives) and a zero gradient (the step skips a non-finite loss)."""
    dtype = logits.dtype
    labels = tf.cast(labels, tf.int32)
    label_lengths = tf.cast(label_lengths, tf.int32)
    logit_lengths = tf.cast(logit_lengths, tf.int32)

    @tf.custom_gradient
    def loss_and_gradient(logits):
        logits32 = tf.cast(logits, tf.float32)
        batch, frames, classes = tf.shape(logits32)[0], tf.shape(logits32)[1], tf.shape(logits32)[2]
        minus_inf = tf.constant(-float("inf"), tf.float32)
        # The blank-extended label: blank, l1, blank, l2, ..., lL, blank.  [batch, states]
        blanks = tf.fill(tf.shape(labels), blank_index)
        extended = tf.reshape(tf.stack([blanks, labels], axis=2), [batch, -1])
        extended = tf.concat([extended, tf.fill([batch, 1], blank_index)], axis=1)
        states = tf.shape(extended)[1]
        position = tf.range(states)[None, :]
        state_count = 2 * label_lengths + 1  # [batch]
        valid = position < state_count[:, None]
        # A state may be entered from two back when it is a label that differs from the one before.
        skip = (extended != blank_index) & (extended != _shift(extended, 2, -1)) & (position >= 2)
        log_probs = tf.nn.log_softmax(logits32)  # [batch, time, classes]
        emit = tf.transpose(tf.gather(log_probs, extended, axis=2, batch_dims=1), [1, 0, 2])  # [time, b, s]
        emit = tf.where(valid[None], emit, minus_inf)
        frame = tf.range(frames)

        def forward(carry, emit_t):
            alpha, _ = carry
            entered = _logsumexp3(
                alpha, _shift(alpha, 1, minus_inf), tf.where(skip, _shift(alpha, 2, minus_inf), minus_inf)
            )
            return _normalise(entered + emit_t)

        start = tf.where(position == 0, 0.0, minus_inf) * tf.ones([batch, 1])
        alphas, scales = tf.scan(forward, emit, initializer=(start, tf.zeros([batch])))  # [t, b, s], [t, b]
        in_time = frame[:, None] < logit_lengths[None, :]  # [time, batch]
        last = tf.maximum(logit_lengths - 1, 0)
        final = tf.gather_nd(tf.transpose(alphas, [1, 0, 2]), tf.stack([tf.range(batch), last], 1))  # [b, s]
        # An alignment ends in the last label or the blank after it.
        is_end = (position == state_count[:, None] - 1) | (
            (position == state_count[:, None] - 2) & (label_lengths[:, None] > 0)
        )
        end = tf.where(is_end, final, minus_inf)
        scale_sum = tf.reduce_sum(
            tf.where(in_time, tf.cast(scales, tf.float64), tf.zeros_like(scales, tf.float64)), 0
        )
        log_likelihood = tf.cast(scale_sum, tf.float32) + tf.reduce_logsumexp(end, axis=1)
        loss = -log_likelihood

        def gradient(upstream):
            # beta_t(s): log P(the frames after t | state s at t), from the end states at each utterance's
            # last frame; normalised per frame like alpha.
            final_states = tf.where(is_end, 0.0, minus_inf)
            skip_ahead = _shift(skip, -2, False)
            emit_next = tf.concat([emit[1:], tf.fill([1, batch, states], minus_inf)], 0)

            def backward(beta_next, elements):
                t, emit_t1 = elements
                x = beta_next + emit_t1
                left = _logsumexp3(
                    x, _shift(x, -1, minus_inf), tf.where(skip_ahead, _shift(x, -2, minus_inf), minus_inf)
                )
                beta = tf.where(
                    (t == last)[:, None], final_states, tf.where((t < last)[:, None], left, minus_inf)
                )
                return _normalise(beta)[0]

            betas = tf.scan(
                backward, (frame, emit_next), initializer=tf.fill([batch, states], minus_inf), reverse=True
            )
            posterior, _ = _normalise(alphas + betas)
            occupancy = tf.where(in_time[:, :, None], tf.exp(posterior), 0.0)  # [time, batch, states]
            per_class = tf.einsum("tbs,bsc->btc", occupancy, tf.one_hot(extended, classes, dtype=tf.float32))
            grad = tf.exp(log_probs) - per_class
            usable = tf.math.is_finite(loss)[:, None, None] & tf.transpose(in_time)[:, :, None]
            grad = tf.where(usable, grad, 0.0) * tf.cast(upstream, tf.float32)[:, None, None]
            return tf.cast(grad, dtype)

        return tf.cast(loss, dtype), gradient

    return loss_and_gradient(logits)
