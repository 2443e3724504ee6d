"""The CTC loss (issue 26 H5): TensorFlow's C++ kernel on a CPU, our exact log-space CTC wherever the kernel
cannot run (a GPU, jit_compile). Both against TensorFlow's dense values where those are right, against a
float64 reference of our own, and on a long utterance where TensorFlow's dense CTC saturates."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from pipeline.model.ctc import KERNEL, LOG_SPACE, ctc_implementation, ctc_loss

BLANK = 28


def _batch(seed: int, time: int, labels: int, batch: int = 3, classes: int = 29):
    rng = np.random.default_rng(seed)
    logits = tf.constant(rng.normal(size=(batch, time, classes)).astype(np.float32))
    label_lengths = tf.constant(rng.integers(labels // 2, labels + 1, batch).astype(np.int32))
    padded = rng.integers(0, classes - 1, (batch, labels)).astype(np.int32)
    padded[np.arange(labels)[None, :] >= label_lengths.numpy()[:, None]] = 0
    lengths = np.full(batch, time, np.int32)
    lengths[-1] = time - time // 5  # a padded utterance
    return logits, tf.constant(padded), label_lengths, tf.constant(lengths)


def _loss_and_gradient(implementation, labels, label_lengths, logits, lengths, jit=False):
    @tf.function(jit_compile=jit)
    def run(logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = ctc_loss(labels, label_lengths, logits, lengths, BLANK, implementation)
        return loss, tape.gradient(loss, logits)

    loss, gradient = run(logits)
    return loss.numpy(), gradient.numpy()


def _reference(logits: np.ndarray, labels: list[int], frames: int, blank: int = BLANK):
    """float64 CTC loss and gradient of one utterance: the forward-backward recursion without scaling, in
    log space with numpy's logaddexp (independent of the implementation under test)."""
    x = logits[:frames].astype(np.float64)
    log_probs = x - np.logaddexp.reduce(x, axis=1, keepdims=True)
    extended = [blank]
    for label in labels:
        extended += [int(label), blank]
    states = len(extended)
    emit = log_probs[:, extended]
    skip = np.array(
        [s >= 2 and extended[s] != blank and extended[s] != extended[s - 2] for s in range(states)]
    )
    alpha = np.full((frames, states), -np.inf)
    alpha[0, :2] = emit[0, :2]
    for t in range(1, frames):
        a = alpha[t - 1]
        one = np.concatenate([[-np.inf], a[:-1]])
        two = np.where(skip, np.concatenate([[-np.inf, -np.inf], a[:-2]]), -np.inf)
        alpha[t] = np.logaddexp(np.logaddexp(a, one), two) + emit[t]
    beta = np.full((frames, states), -np.inf)
    beta[-1, -2:] = 0.0
    skip_ahead = np.concatenate([skip[2:], [False, False]])
    for t in range(frames - 2, -1, -1):
        b = beta[t + 1] + emit[t + 1]
        one = np.concatenate([b[1:], [-np.inf]])
        two = np.where(skip_ahead, np.concatenate([b[2:], [-np.inf, -np.inf]]), -np.inf)
        beta[t] = np.logaddexp(np.logaddexp(b, one), two)
    log_likelihood = np.logaddexp(alpha[-1, -1], alpha[-1, -2])
    posterior = np.exp(alpha + beta - log_likelihood)
    occupancy = np.zeros_like(log_probs)
    for s, label in enumerate(extended):
        occupancy[:, label] += posterior[:, s]
    gradient = np.zeros(logits.shape)
    gradient[:frames] = np.exp(log_probs) - occupancy
    return -log_likelihood, gradient


def test_the_kernel_gives_the_dense_values_and_gradients():
    logits, labels, label_lengths, lengths = _batch(0, time=60, labels=12)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        dense = tf.nn.ctc_loss(
            labels, logits, label_lengths, lengths, logits_time_major=False, blank_index=BLANK
        )
        sparse = ctc_loss(labels, label_lengths, logits, lengths, BLANK, KERNEL)
    np.testing.assert_allclose(sparse.numpy(), dense.numpy(), rtol=1e-5)
    # float32 sums in another order: measured at most 6e-5 apart
    np.testing.assert_allclose(
        tape.gradient(sparse, logits).numpy(), tape.gradient(dense, logits).numpy(), atol=1e-4
    )


def test_long_utterances_do_not_saturate():
    logits, labels, label_lengths, lengths = _batch(1, time=900, labels=180)
    sparse = ctc_loss(labels, label_lengths, logits, lengths, BLANK, KERNEL).numpy()
    assert np.all(np.isfinite(sparse)) and np.all(sparse > 1000)  # about 4 nats per frame of noise
    assert len(set(np.round(sparse, 3))) == 3


def test_the_implementation_follows_xla_and_the_kernel_runs_on_the_host_cpu():
    # No XLA kernel for the C++ op; outside XLA, on a GPU too, the C++ kernel on the host's CPU.
    assert ctc_implementation(jit_compile=False) == KERNEL
    assert ctc_implementation(jit_compile=True) == LOG_SPACE
    logits, labels, label_lengths, lengths = _batch(2, time=40, labels=8)

    @tf.function
    def on_a_gpu(logits):
        with tf.device("/device:GPU:0"):  # where a tower's model runs (traced only: no GPU needed)
            with tf.GradientTape() as tape:
                tape.watch(logits)
                loss = ctc_loss(labels, label_lengths, logits, lengths, BLANK, KERNEL)
            return loss, tape.gradient(loss, logits)

    graph = on_a_gpu.get_concrete_function(tf.TensorSpec(logits.shape, logits.dtype)).graph
    # tf.nn.ctc_loss is a call whose version Grappler picks by the call's device (cuDNN's on a GPU, blank
    # first), its gradient's call included: none may be in the graph, only the CPU's op, placed there.
    functions = graph.as_graph_def().library.function
    assert not [f.signature.name for f in functions if "ctc_loss_op" in f.signature.name]
    ctc = [op for op in graph.get_operations() if op.type == "CTCLoss"]
    assert len(ctc) == 1 and ctc[0].device.endswith("CPU:0"), [(op.type, op.device) for op in ctc]
    loss, grad = on_a_gpu(logits)  # runs on the CPU here: the same numbers as TensorFlow's own kernel
    with tf.GradientTape() as tape:
        tape.watch(logits)
        indices = tf.where(tf.sequence_mask(label_lengths, tf.shape(labels)[1]))
        values = tf.cast(tf.gather_nd(labels, indices), tf.int32)
        sparse = tf.SparseTensor(indices, values, tf.cast(tf.shape(labels), tf.int64))
        theirs = tf.nn.ctc_loss(sparse, logits, None, lengths, False, blank_index=-1)
    np.testing.assert_array_equal(loss.numpy(), theirs.numpy())
    np.testing.assert_array_equal(grad.numpy(), tape.gradient(theirs, logits).numpy())
    # the kind of op a step of each runs: one kernel, against a per-frame loop of many small ones
    log_space = tf.function(lambda x: ctc_loss(labels, label_lengths, x, lengths, BLANK, LOG_SPACE))
    ops = log_space.get_concrete_function(tf.TensorSpec(logits.shape, logits.dtype)).graph.as_graph_def()
    loop_ops = sum(len(f.node_def) for f in ops.library.function)
    assert loop_ops > 50, loop_ops


def _brute_force(logits: np.ndarray, labels: tuple, frames: int) -> float:
    """-log of the summed probability of every path over ``frames`` frames that collapses to ``labels``."""
    log_probs = logits[:frames] - np.logaddexp.reduce(logits[:frames], axis=1, keepdims=True)
    total = -np.inf
    for path in itertools.product(range(logits.shape[1]), repeat=frames):
        collapsed = [
            k for i, k in enumerate(path) if k != logits.shape[1] - 1 and (i == 0 or k != path[i - 1])
        ]
        if tuple(collapsed) == labels:
            total = np.logaddexp(total, sum(log_probs[t, k] for t, k in enumerate(path)))
    return -total


@pytest.mark.parametrize("labels", [(0,), (0, 1), (1, 1), (0, 1, 0)])
def test_log_space_ctc_is_every_path_summed(labels):
    """Tiny cases (3 classes, the last the blank, 5 frames, the last one padding): the loss against the sum
    over all 3^4 paths in float64, the gradient against that sum's finite differences."""
    rng = np.random.default_rng(len(labels))
    x = rng.normal(size=(5, 3))
    padded = tf.constant([list(labels) + [0] * (3 - len(labels))], tf.int32)

    def ours(values):
        loss = ctc_loss(
            padded,
            tf.constant([len(labels)]),
            tf.constant(values[None], tf.float32),
            tf.constant([4]),
            2,
            LOG_SPACE,
        )
        return loss

    with tf.GradientTape() as tape:
        logits = tf.constant(x[None], tf.float32)
        tape.watch(logits)
        loss = ctc_loss(padded, tf.constant([len(labels)]), logits, tf.constant([4]), 2, LOG_SPACE)
    gradient = tape.gradient(loss, logits).numpy()[0]
    expected = _brute_force(x, labels, 4)
    np.testing.assert_allclose(loss.numpy()[0], expected, rtol=1e-6)
    step = 1e-6
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += step
        down[index] -= step
        numeric[index] = (_brute_force(up, labels, 4) - _brute_force(down, labels, 4)) / (2 * step)
    np.testing.assert_allclose(gradient, numeric, atol=1e-5)
    assert not gradient[4].any()  # the padding frame
    assert ours(x).numpy()[0] == pytest.approx(expected, rel=1e-6)


def test_log_space_ctc_matches_the_kernel_and_a_float64_reference_on_a_padded_batch():
    logits, labels, label_lengths, lengths = _batch(2, time=80, labels=15)
    kernel = _loss_and_gradient(KERNEL, labels, label_lengths, logits, lengths)
    ours = _loss_and_gradient(LOG_SPACE, labels, label_lengths, logits, lengths)
    np.testing.assert_allclose(ours[0], kernel[0], rtol=1e-5)
    np.testing.assert_allclose(ours[1], kernel[1], atol=1e-4)
    for row in range(3):
        loss, gradient = _reference(
            logits.numpy()[row], labels.numpy()[row][: label_lengths.numpy()[row]], int(lengths.numpy()[row])
        )
        assert ours[0][row] == pytest.approx(loss, rel=1e-6)
        np.testing.assert_allclose(ours[1][row], gradient, atol=2e-6)


def test_an_utterance_too_short_for_its_labels_has_an_infinite_loss_and_no_gradient():
    logits = tf.constant(np.random.default_rng(3).normal(size=(2, 5, 29)).astype(np.float32))
    labels, label_lengths, lengths = (
        tf.constant([[1, 1, 3, 4], [2, 0, 0, 0]]),
        tf.constant([4, 1]),
        tf.constant([4, 5]),
    )
    loss, gradient = _loss_and_gradient(LOG_SPACE, labels, label_lengths, logits, lengths)
    assert np.isinf(loss[0]) and not gradient[0].any()  # 1, blank, 1, 3, 4 needs five frames
    assert np.isfinite(loss[1]) and loss[1] == pytest.approx(
        _loss_and_gradient(KERNEL, labels, label_lengths, logits, lengths)[0][1], rel=1e-6
    )


def test_a_long_utterance_of_blank_heavy_logits_is_exact_where_dense_ctc_saturates():
    """The issue's case: [1, 1500, 29] logits, 300 labels. Logits that favour the blank (what a model emits
    in its first epochs) make TensorFlow's dense CTC saturate near 706.9; the kernel and our log-space CTC,
    eager and under XLA, give the float64 reference's value, and ours its gradient more closely."""
    rng = np.random.default_rng(26)
    x = rng.normal(size=(1, 1500, 29)).astype(np.float32)
    x[..., BLANK] += 8.0
    labels = tf.constant(rng.integers(0, BLANK, (1, 300)).astype(np.int32))
    label_lengths, lengths, logits = tf.constant([300]), tf.constant([1500]), tf.constant(x)
    reference_loss, reference_gradient = _reference(x[0], labels.numpy()[0], 1500)
    dense = tf.function(
        lambda z: tf.nn.ctc_loss(
            labels, z, label_lengths, lengths, logits_time_major=False, blank_index=BLANK
        )
    )(logits)
    assert reference_loss > 1400 and float(dense.numpy()[0]) < 800  # the trap: dense CTC is far off
    kernel = _loss_and_gradient(KERNEL, labels, label_lengths, logits, lengths)
    for ours in (
        _loss_and_gradient(LOG_SPACE, labels, label_lengths, logits, lengths),
        _loss_and_gradient(LOG_SPACE, labels, label_lengths, logits, lengths, jit=True),
    ):
        assert ours[0][0] == pytest.approx(reference_loss, rel=1e-6)
        assert ours[0][0] == pytest.approx(kernel[0][0], rel=1e-5)
        ours_error = np.abs(ours[1][0] - reference_gradient).max()
        kernel_error = np.abs(kernel[1][0] - reference_gradient).max()
        assert ours_error < 1e-4 and ours_error <= kernel_error, (ours_error, kernel_error)
        np.testing.assert_allclose(ours[1], kernel[1], atol=2e-2)


@pytest.mark.slow
def test_a_jit_compiled_training_step_gives_the_exact_loss_of_a_long_utterance():
    """The training step with training.jit_compile (XLA: no C++ kernel) reports the kernel's loss for a
    1,500-frame utterance with 300 labels, from a model that favours the blank as models do early on: the
    dense CTC the step used before reported about 740."""
    import keras

    from pipeline.config import ModelConfig, TrainingConfig
    from pipeline.model import build_model
    from pipeline.model.deepspeech import DeepSpeechSettings
    from pipeline.model.heads import OneTask
    from pipeline.model.weights import named_weights
    from pipeline.train.step import TrainingStep

    rng = np.random.default_rng(5)
    element = (
        rng.normal(size=(1, 1500, 26)).astype(np.float32),
        np.array([1500], np.int32),
        rng.integers(0, BLANK, (1, 300)).astype(np.int32),
        np.array([300], np.int32),
        np.array([0], np.int64),
    )
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    losses = {}
    for jit in (False, True):
        with strategy.scope():
            model = build_model(
                ModelConfig(options=DeepSpeechSettings(n_hidden=16, dropout_rate=0.0)), 26, 29, "float32"
            )
            optimizer = keras.optimizers.Adam(1e-3)
            optimizer.build(model.trainable_variables)
        bias = named_weights(model)["layer_6.bias"]
        bias.assign(bias + tf.one_hot(BLANK, 29) * 8.0)
        training = TrainingConfig(jit_compile=jit)
        step = TrainingStep(OneTask(model), [1.0], [BLANK], optimizer, optimizer, strategy, training, 1)
        dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(element))
        result = step((0,), (next(iter(dataset)),), (dataset.element_spec,))
        assert result.finite and result.applied
        losses[jit] = result.loss
    assert losses[False] > 1000, losses  # the kernel: far above dense CTC's ceiling near 706.9
    assert losses[True] == pytest.approx(losses[False], rel=1e-5), losses
