"""The RNN-T (transducer) loss, exact, in log space, written by hand because TensorFlow ships none.

A transducer's joiner scores every pair of an encoder frame ``t`` and a count ``u`` of labels emitted so
far: ``logits[b, t, u, k]``. An alignment walks the ``T x (U + 1)`` lattice from ``(0, 0)``: the blank moves
to the next frame, label ``u + 1`` moves to the next count on the same frame, and the walk ends with a blank
out of ``(T - 1, U)``. The loss is ``-log`` of the sum over every walk (Graves, 2012).

The forward variable ``alpha(t, u)`` depends only on ``alpha(t - 1, u)`` and ``alpha(t, u - 1)``, so every
cell of one anti-diagonal ``t + u = n`` is computed at once from the one before: a ``tf.scan`` of
``T + U`` steps of a few elementwise ops over ``[batch, U + 1]``, which XLA compiles and any device runs.
The lattice is skewed once so that diagonal ``n`` is one row (``_skewed``). Each diagonal is scaled so
that its largest cell is 0 and the scales are summed apart: unscaled, the cells of a long utterance reach
-1000 and float32 keeps too few digits of them (gradients off by 1e-3 relative on 300 frames). The
gradient is TensorFlow's own through the scan (the scales held constant, which leaves it exact). The
moves into the cells an utterance's lengths leave out are impossible, so the padding neither reaches its
loss (zero gradient) nor sets a diagonal's scale: an utterance's loss is the same in any batch.
Impossible cells hold a large finite negative number, not minus infinity, so that no
``log(0)`` (and no NaN gradient) arises where two impossible paths meet.

icefall's pruned RNN-T (k2) and NeMo's Numba kernel compute the same quantity; neither runs in
TensorFlow, and TensorFlowASR's, the one that did, is no longer kept up.
"""

from __future__ import annotations

import tensorflow as tf

# The log-probability of an impossible cell: far below any real path, finite so that gradients stay finite.
IMPOSSIBLE = -1.0e30


def _log_add(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """log(exp(a) + exp(b)) elementwise, with an exact, finite gradient for any finite inputs (the larger
    term is 1 after the shift, so the sum is at least 1)."""
    top = tf.stop_gradient(tf.maximum(a, b))
    return top + tf.math.log(tf.exp(a - top) + tf.exp(b - top))


def _skewed(x: tf.Tensor, fill: float) -> tf.Tensor:
    """``x`` ``[batch, T, U1]`` as its anti-diagonals ``[T + U1 - 1, batch, U1]``: ``out[n, b, u] =
    x[b, n - u, u]``, ``fill`` where ``n - u`` is outside ``[0, T)``. Row ``u`` of ``x``'s transpose,
    padded to ``W = T + U1`` and read in rows of ``W - 1``, comes out shifted right by ``u``."""
    batch, frames, states = tf.shape(x)[0], tf.shape(x)[1], tf.shape(x)[2]
    width = frames + states
    rows = tf.transpose(x, [0, 2, 1])  # [batch, U1, T]
    rows = tf.concat([rows, tf.fill([batch, states, states], tf.cast(fill, x.dtype))], axis=2)
    flat = tf.reshape(rows, [batch, states * width])[:, : states * (width - 1)]
    return tf.transpose(tf.reshape(flat, [batch, states, width - 1]), [2, 0, 1])


def rnnt_loss(
    logits: tf.Tensor,
    labels: tf.Tensor,
    logit_lengths: tf.Tensor,
    label_lengths: tf.Tensor,
    blank: int,
) -> tf.Tensor:
    """Per-utterance negative log-likelihood ``[batch]`` of the padded ``labels`` ``[batch, max_labels]``
    under a transducer's unnormalised joiner outputs ``logits`` ``[batch, frames, max_labels + 1,
    classes]``; utterance ``b`` has ``logit_lengths[b]`` frames and ``label_lengths[b]`` labels, and
    ``blank`` is any class index. Computed and returned in float32 whatever ``logits``' dtype (a sum of
    utterances' losses overflows float16); an utterance of no frames has an infinite loss (and no
    gradient)."""
    logits = tf.cast(logits, tf.float32)
    labels = tf.cast(labels, tf.int32)
    logit_lengths = tf.cast(logit_lengths, tf.int32)
    label_lengths = tf.cast(label_lengths, tf.int32)
    batch, frames = tf.shape(logits)[0], tf.shape(logits)[1]
    states, max_labels = tf.shape(logits)[2], tf.shape(labels)[1]
    labels = tf.where(tf.sequence_mask(label_lengths, max_labels), labels, blank)  # padding: any class

    log_probs = tf.nn.log_softmax(logits)  # [batch, T, U1, classes]
    blank_scores = log_probs[..., blank]  # [batch, T, U1]
    # The score of emitting label u + 1 from count u, at every frame.  [batch, T, U]
    next_label = tf.broadcast_to(labels[:, None, :, None], [batch, frames, max_labels, 1])
    label_scores = tf.gather(log_probs[:, :, :max_labels], next_label, axis=3, batch_dims=3)[..., 0]
    label_scores = tf.concat([label_scores, tf.fill([batch, frames, 1], IMPOSSIBLE)], axis=2)

    # Moves out of an utterance's own cells only: the padding's cells stay impossible, so that they can
    # never be a diagonal's largest cell (their scores are whatever the padded frames give, and a scale
    # taken from them would leave the real cells far below 0, where float32 keeps too few digits).
    frames_in = tf.sequence_mask(logit_lengths, frames)[:, :, None]  # [batch, T, 1]
    blank_moves = tf.where(tf.sequence_mask(logit_lengths - 1, frames)[:, :, None], blank_scores, IMPOSSIBLE)
    label_moves = tf.where(
        frames_in & tf.sequence_mask(label_lengths, states)[:, None, :], label_scores, IMPOSSIBLE
    )
    blank_diagonals = _skewed(blank_moves, IMPOSSIBLE)  # [n, batch, U1]
    label_diagonals = _skewed(label_moves, IMPOSSIBLE)
    impossible_column = tf.fill([batch, 1], IMPOSSIBLE)

    def next_diagonal(carry, moves):
        alpha, _ = carry
        by_blank, by_label = moves  # the moves out of the previous diagonal's cells
        from_below = tf.concat([impossible_column, (alpha + by_label)[:, :-1]], axis=1)
        entered = _log_add(alpha + by_blank, from_below)
        scale = tf.stop_gradient(tf.reduce_max(entered, axis=1))
        return entered - scale[:, None], scale

    start = tf.concat([tf.zeros([batch, 1]), tf.fill([batch, states - 1], IMPOSSIBLE)], axis=1)
    later, scales = tf.scan(
        next_diagonal, (blank_diagonals[:-1], label_diagonals[:-1]), initializer=(start, tf.zeros([batch]))
    )
    alphas = tf.concat([start[None], later], axis=0)  # [T + U1 - 1, batch, U1], each diagonal's top at 0
    scale_sums = tf.concat([tf.zeros([1, batch]), tf.cumsum(scales, axis=0)], axis=0)  # [T + U1 - 1, batch]

    last_frame = tf.maximum(logit_lengths - 1, 0)
    rows = tf.range(batch)
    diagonal = last_frame + label_lengths
    final = tf.gather_nd(alphas, tf.stack([diagonal, rows, label_lengths], axis=1))
    final += tf.gather_nd(scale_sums, tf.stack([diagonal, rows], axis=1))
    closing_blank = tf.gather_nd(blank_scores, tf.stack([rows, last_frame, label_lengths], axis=1))
    loss = -(final + closing_blank)
    loss = tf.where(logit_lengths > 0, loss, tf.fill([batch], float("inf")))
    return loss


def compiled_alone(jit_compile: bool, device: str) -> bool:
    """Whether the loss runs as an XLA program of its own (``device``: where its scores are, as
    TensorFlow names it): on a GPU outside an XLA step, where each of the scan's ~100 small ops a diagonal
    would be a kernel launch (``bench/transducer_loss.py``: about 75,000 a batch of 10 s utterances). On
    a CPU the plain scan costs about what XLA's does and compiles nothing per batch shape; inside an XLA
    step (``jit_compile``) it is compiled with the step."""
    return not jit_compile and "GPU" in device.upper()


def placed_rnnt_loss(
    logits: tf.Tensor,
    labels: tf.Tensor,
    logit_lengths: tf.Tensor,
    label_lengths: tf.Tensor,
    blank: int,
    jit_compile: bool,
) -> tf.Tensor:
    """``rnnt_loss``, as its own XLA program where ``compiled_alone`` says so (its gradient too), else as
    it is."""
    if not compiled_alone(jit_compile, logits.device):
        return rnnt_loss(logits, labels, logit_lengths, label_lengths, blank)

    # The loss and its gradient as one XLA program, the gradient handed back explicitly: a scan's
    # gradient cannot come from outside the program that ran it (its TensorLists do not cross XLA's
    # boundary). Made where the step is traced: no state kept between runs.
    def loss_and_gradient(scores):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            loss = rnnt_loss(scores, labels, logit_lengths, label_lengths, blank)
        return loss, tape.gradient(loss, scores)

    compiled = tf.function(loss_and_gradient, jit_compile=True, autograph=False)

    @tf.custom_gradient
    def loss_of(scores):
        loss, gradient = compiled(scores)

        def backward(upstream):  # utterances are independent: row b's gradient is its loss's
            return gradient * tf.cast(upstream, gradient.dtype)[:, None, None, None]

        return loss, backward

    return loss_of(logits)
