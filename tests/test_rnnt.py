"""The RNN-T loss (issue 47): values and gradients against a float64 reference on random cases, the
reference itself against every alignment spelt out, padding's zero gradient, any blank index, and XLA."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from pipeline.model.objectives.transducer import rnnt_loss


def _log_softmax(x: np.ndarray) -> np.ndarray:
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def _reference(logits: np.ndarray, labels: list[int], blank: int):
    """float64 loss and gradient of one utterance (``logits`` ``[T, U + 1, classes]``): the forward and
    backward recursions cell by cell, with numpy's logaddexp (independent of the diagonal scan)."""
    logp = _log_softmax(logits.astype(np.float64))
    frames, states = logp.shape[0], len(labels) + 1
    alpha = np.full((frames, states), -np.inf)
    alpha[0, 0] = 0.0
    for t in range(frames):
        for u in range(states):
            if t == u == 0:
                continue
            a = alpha[t - 1, u] + logp[t - 1, u, blank] if t > 0 else -np.inf
            b = alpha[t, u - 1] + logp[t, u - 1, labels[u - 1]] if u > 0 else -np.inf
            alpha[t, u] = np.logaddexp(a, b)
    total = alpha[-1, -1] + logp[-1, -1, blank]
    beta = np.full((frames, states), -np.inf)
    for t in reversed(range(frames)):
        for u in reversed(range(states)):
            if t == frames - 1 and u == states - 1:
                beta[t, u] = logp[t, u, blank]
                continue
            a = beta[t + 1, u] + logp[t, u, blank] if t < frames - 1 else -np.inf
            b = beta[t, u + 1] + logp[t, u, labels[u]] if u < states - 1 else -np.inf
            beta[t, u] = np.logaddexp(a, b)
    assert np.isclose(beta[0, 0], total)
    grad_logp = np.zeros_like(logp)
    for t in range(frames):
        for u in range(states):
            after_blank = beta[t + 1, u] if t < frames - 1 else (0.0 if u == states - 1 else -np.inf)
            grad_logp[t, u, blank] -= np.exp(alpha[t, u] + logp[t, u, blank] + after_blank - total)
            if u < states - 1:
                grad_logp[t, u, labels[u]] -= np.exp(
                    alpha[t, u] + logp[t, u, labels[u]] + beta[t, u + 1] - total
                )
    grad = grad_logp - np.exp(logp) * grad_logp.sum(axis=-1, keepdims=True)
    return -total, grad


def _every_alignment(logits: np.ndarray, labels: list[int], blank: int) -> float:
    """-log of the sum over every alignment, each spelt out: which of the T + U moves are the labels."""
    logp = _log_softmax(logits.astype(np.float64))
    frames, count = logp.shape[0], len(labels)
    paths = []
    # The last move is always the closing blank; the labels take ``count`` of the first T - 1 + U moves.
    for places in itertools.combinations(range(frames - 1 + count), count):
        t = u = 0
        score = 0.0
        for move in range(frames - 1 + count):
            if move in places:
                score += logp[t, u, labels[u]]
                u += 1
            else:
                score += logp[t, u, blank]
                t += 1
        paths.append(score + logp[t, u, blank])
    return -np.logaddexp.reduce(paths)


def _case(rng, frames: int, count: int, classes: int, blank: int):
    logits = rng.normal(scale=2.0, size=(frames, count + 1, classes))
    labels = [int(c) for c in rng.choice([c for c in range(classes) if c != blank], size=count)]
    return logits, labels


def _batched(cases, classes: int):
    """Padded batch tensors of ``cases`` ((logits, labels) each), padding filled with noise."""
    rng = np.random.default_rng(99)
    frames = max(c[0].shape[0] for c in cases)
    count = max(len(c[1]) for c in cases)
    logits = rng.normal(size=(len(cases), frames, count + 1, classes)).astype(np.float32) * 5
    labels = np.full((len(cases), count), 7, np.int32)
    for i, (x, y) in enumerate(cases):
        logits[i, : x.shape[0], : x.shape[1]] = x
        labels[i, : len(y)] = y
    lengths = np.array([c[0].shape[0] for c in cases], np.int32)
    label_lengths = np.array([len(c[1]) for c in cases], np.int32)
    return logits, labels, lengths, label_lengths


def _loss_and_gradient(logits, labels, lengths, label_lengths, blank, jit=False):
    @tf.function(jit_compile=jit)
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = rnnt_loss(x, labels, lengths, label_lengths, blank)
        return loss, tape.gradient(loss, x)

    loss, gradient = run(tf.constant(logits))
    return loss.numpy(), gradient.numpy()


@pytest.mark.parametrize("shape", [(1, 0), (1, 3), (3, 2), (4, 4), (5, 1)])
def test_the_reference_sums_every_alignment(shape):
    rng = np.random.default_rng(sum(shape))
    logits, labels = _case(rng, *shape, classes=5, blank=2)
    assert _reference(logits, labels, blank=2)[0] == pytest.approx(_every_alignment(logits, labels, 2))


def test_the_reference_gradient_is_the_loss_s_slope():
    rng = np.random.default_rng(3)
    logits, labels = _case(rng, 3, 2, classes=4, blank=0)
    _, grad = _reference(logits, labels, blank=0)
    step = 1e-6
    for index in [(0, 0, 0), (1, 1, 2), (2, 2, 0), (2, 0, 3)]:
        up, down = logits.copy(), logits.copy()
        up[index] += step
        down[index] -= step
        slope = (_reference(up, labels, 0)[0] - _reference(down, labels, 0)[0]) / (2 * step)
        assert grad[index] == pytest.approx(slope, abs=1e-6)


# (frames, labels): one frame; no labels; more labels than frames; several labels per frame; long.
SHAPES = [(1, 0), (1, 1), (1, 4), (6, 0), (2, 7), (9, 5), (40, 12)]


@pytest.mark.parametrize("blank", [0, 5, 11])
def test_loss_and_gradient_match_the_float64_reference_with_padding(blank):
    """One batch of every shape, padded to the longest with noise: each row's loss and gradient are the
    reference's, and the padding's gradient is exactly zero."""
    classes = 12
    rng = np.random.default_rng(blank)
    cases = [_case(rng, frames, count, classes, blank) for frames, count in SHAPES]
    logits, labels, lengths, label_lengths = _batched(cases, classes)
    loss, grad = _loss_and_gradient(logits, labels, lengths, label_lengths, blank)
    for i, (x, y) in enumerate(cases):
        want_loss, want_grad = _reference(x.astype(np.float32), y, blank)
        assert loss[i] == pytest.approx(want_loss, rel=1e-5, abs=1e-4)
        np.testing.assert_allclose(grad[i, : x.shape[0], : x.shape[1]], want_grad, atol=2e-5)
        padding = np.ones(grad.shape[1:], bool)
        padding[: x.shape[0], : x.shape[1]] = False
        assert not grad[i][padding].any()


def test_a_long_utterance_matches_the_reference_and_xla_gives_the_same():
    classes, blank = 30, 29
    rng = np.random.default_rng(7)
    x, y = _case(rng, 300, 80, classes, blank)
    logits, labels, lengths, label_lengths = _batched([(x, y)], classes)
    want_loss, want_grad = _reference(x.astype(np.float32), y, blank)
    for jit in (False, True):
        loss, grad = _loss_and_gradient(logits, labels, lengths, label_lengths, blank, jit=jit)
        assert loss[0] == pytest.approx(want_loss, rel=1e-5)
        np.testing.assert_allclose(grad[0], want_grad, atol=5e-5)


def test_an_utterance_without_frames_has_an_infinite_loss_and_no_gradient():
    rng = np.random.default_rng(5)
    cases = [_case(rng, 3, 2, 6, 0), _case(rng, 3, 1, 6, 0)]
    logits, labels, lengths, label_lengths = _batched(cases, 6)
    lengths[1] = 0
    loss, grad = _loss_and_gradient(logits, labels, lengths, label_lengths, 0)
    assert np.isfinite(loss[0]) and loss[1] == np.inf
    assert not grad[1].any()


def test_half_precision_logits_give_a_float32_loss():
    """Scores in bfloat16 or float16 (mixed precision) give the float32 loss of those rounded scores: a
    batch's summed loss would overflow float16."""
    rng = np.random.default_rng(8)
    x, y = _case(rng, 5, 3, 7, 6)
    logits, labels, lengths, label_lengths = _batched([(x, y)], 7)
    for dtype in (tf.bfloat16, tf.float16):
        half = rnnt_loss(tf.constant(logits, dtype), labels, lengths, label_lengths, 6)
        assert half.dtype == tf.float32
        rounded = tf.cast(tf.cast(logits, dtype), tf.float32).numpy()
        assert float(half[0]) == pytest.approx(_reference(rounded[0], y, 6)[0], rel=1e-5)


def test_a_tie_splits_the_gradient():
    """Two alignments of equal score: each gets half the gradient (a maximum that gave all of it to one
    would be wrong exactly there)."""
    logits = np.zeros((1, 2, 2, 3), np.float32)  # uniform scores: two alignments of one label, equal
    _, grad = _loss_and_gradient(logits, np.array([[0]], np.int32), np.array([2]), np.array([1]), 2)
    _, want = _reference(logits[0], [0], 2)
    np.testing.assert_allclose(grad[0], want, atol=1e-6)


def test_an_utterance_s_loss_is_the_same_whatever_pads_it():
    """A short utterance beside a long one whose frames make every move through its padding certain (a
    padded label is the blank): its loss and gradient are those it has alone. A diagonal scaled to a
    padding cell would leave its real cells far below 0, where float32 keeps fewer digits."""
    rng = np.random.default_rng(11)
    frames, labels, classes = 300, 60, 12
    alone = rng.standard_normal((1, 40, 11, classes)).astype(np.float32)
    target = rng.integers(0, classes - 1, (1, labels)).astype(np.int32)
    padded = np.zeros((2, frames, labels + 1, classes), np.float32)
    padded[..., 11] = 30.0  # the blank, certain: every move through the padding scores about 0
    padded[0, :40, :11] = alone[0]

    def loss_and_gradient(logits, targets, logit_lengths, label_lengths):
        logits = tf.constant(logits)
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = rnnt_loss(logits, targets, logit_lengths, label_lengths, 11)
            first = loss[0]
        return loss.numpy(), tape.gradient(first, logits).numpy()

    one, one_gradient = loss_and_gradient(alone, target[:, :10], [40], [10])
    both, both_gradient = loss_and_gradient(padded, np.repeat(target, 2, 0), [40, frames], [10, labels])
    assert both[0] == pytest.approx(one[0], rel=1e-6, abs=1e-4)
    np.testing.assert_allclose(both_gradient[0, :40, :11], one_gradient[0], atol=1e-6)
    assert not both_gradient[0, 40:].any() and not both_gradient[0, :, 11:].any()


def test_on_a_gpu_outside_xla_the_loss_alone_is_compiled_and_its_gradient_too():
    """A GPU step without ``training.jit_compile`` runs the loss as an XLA program of its own (the scan
    would be a kernel launch per op); a CPU step or an XLA step runs it as it is. Traced only inside a GPU
    device scope (no GPU here), then run on the CPU: the same numbers as the plain loss."""
    from pipeline.model.rnnt import compiled_alone, placed_rnnt_loss

    assert compiled_alone(False, "/job:localhost/replica:0/task:0/device:GPU:0")
    assert not compiled_alone(True, "/device:GPU:0") and not compiled_alone(False, "/device:CPU:0")
    assert not compiled_alone(False, "")
    rng = np.random.default_rng(4)
    logits = tf.constant(rng.standard_normal((2, 9, 5, 6)).astype(np.float32))
    labels, frames, counts = (
        tf.constant([[1, 2, 3, 4], [2, 2, 0, 0]]),
        tf.constant([9, 6]),
        tf.constant([4, 2]),
    )

    def step(device):
        @tf.function
        def run(logits):
            with tf.device(device), tf.GradientTape() as tape:
                tape.watch(logits)
                scores = tf.identity(logits)  # made in the device's scope, as a tower's joiner output is
                loss = placed_rnnt_loss(scores, labels, frames, counts, 5, jit_compile=False)
            return loss, tape.gradient(loss, logits)

        return run

    def compiled_functions(run):
        graph = run.get_concrete_function(tf.TensorSpec(logits.shape, logits.dtype)).graph.as_graph_def()
        return [
            f.signature.name
            for f in graph.library.function
            if f.attr.get("_XlaMustCompile", None) is not None
        ]

    on_gpu, on_cpu = step("/device:GPU:0"), step("/device:CPU:0")
    assert compiled_functions(on_gpu) and not compiled_functions(on_cpu)
    gpu_loss, gpu_gradient = on_gpu(logits)  # no GPU here: it runs on the CPU
    cpu_loss, cpu_gradient = on_cpu(logits)
    np.testing.assert_allclose(gpu_loss.numpy(), cpu_loss.numpy(), rtol=1e-5)
    np.testing.assert_allclose(gpu_gradient.numpy(), cpu_gradient.numpy(), atol=1e-5)
