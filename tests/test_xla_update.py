"""Issue 45 F4: with ``training.jit_compile`` on one device, XLA compiles the whole step (forward,
backward, clipping, Adam, the shadow copies and the finiteness guard), so a step is a few launches and
not thousands of small ops, several per variable; the compiled update does what the plain one does."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from pipeline.config import TrainingConfig
from pipeline.config_loader import config_from_dict
from pipeline.model import build_model
from pipeline.model.heads import OneTask
from pipeline.train.graph_ops import ops_outside_xla
from pipeline.train.optimizer import optimizers
from pipeline.train.step import TrainingStep, compiles_the_update
from pipeline.train.tasks import Windows

BLANK = 28
TINY = {"d_model": 32, "heads": 2, "layers": 2, "conv_kernel": 5, "subsampling_channels": 8}
CONFORMER = {"architecture": "conformer", "conformer": {**TINY, "dropout": 0.0, "attention_dropout": 0.0}}
DEEPSPEECH = {"deepspeech": {"n_hidden": 16, "dropout_rate": 0.0}}


def _step(strategy, training: TrainingConfig, family: dict = CONFORMER, seed: int = 1):
    """A tiny model's training step (one task) on ``strategy``, its model, two batches to feed it (the
    second's gradient about three times the first's), their element spec and the Adam it updates with."""
    config = config_from_dict({"model": family})
    tf.keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = OneTask(build_model(config.model, 26, BLANK + 1))
        adam, applies, _ = optimizers(training, model.trainable_variables)
    # With accumulation: windows of two steps of one task, each step half its window's loss.
    windows = Windows(((0.25,),) * 4, (0.5,) * 4, frozenset({2, 4}))
    step = TrainingStep(model, [1.0], [BLANK], adam, applies, strategy, training, 4, lambda epoch: windows)
    step.start(0, 0)
    rng = np.random.default_rng(seed)
    batches = []
    for scale in (1.0, 3.0):
        element = (
            (scale * rng.normal(size=(2, 60, 26))).astype(np.float32),
            np.array([60, 44], np.int32),
            rng.integers(0, BLANK, (2, 4)).astype(np.int32),
            np.array([4, 3], np.int32),
            np.array([0, 1], np.int64),
        )
        dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(element))
        batches.append(next(iter(dataset)))
    return step, model, batches, dataset.element_spec, adam


def _weights(model) -> list[np.ndarray]:
    return [v.numpy().copy() for v in model.trainable_variables]


def test_on_one_device_xla_compiles_the_update_and_the_op_count_falls():
    """The traced step's ops that run one at a time on one device: more than 20 per variable without
    XLA (the model's and the update's), fewer than 50 in all with the whole step compiled."""
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    counts = {}
    for jit in (False, True):
        training = TrainingConfig(jit_compile=jit, clip_grad_norm=5.0)
        step, model, _, spec, _ = _step(one, training)
        counts[jit] = ops_outside_xla(step.traced_graph("step", (0,), (spec,)))
    variables = len(model.trainable_variables)
    assert compiles_the_update(TrainingConfig(jit_compile=True), one)
    assert counts[False] > 20 * variables, (counts, variables)
    assert counts[True] < 50, counts


def test_across_devices_only_the_forward_and_backward_pass_is_compiled():
    """A mirrored strategy (here of one device; with several, the same) merges into cross-replica
    context for the update, which XLA cannot hold: the update's ops stay outside, several per variable."""
    training = TrainingConfig(jit_compile=True)
    assert not compiles_the_update(training, tf.distribute.MirroredStrategy(["/cpu:0"]))
    step, model, _, spec, _ = _step(tf.distribute.MirroredStrategy(["/cpu:0"]), training)
    assert ops_outside_xla(step.traced_graph("step", (0,), (spec,))) > 5 * len(model.trainable_variables)


@pytest.mark.long  # six XLA compiles of a Conformer step: about 50 s each parameter
@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_compiled_update_moves_the_weights_as_the_separate_ops_did(accumulate):
    """Two updates with the update compiled (one device) and two with it as separate ops after the same
    compiled forward and backward pass (a mirrored strategy of that one device), from the same weights
    and batches, each update of one step or (``accumulate_batches: 2``) of a window of two: the same
    losses and, within float32 rounding of another fusion, the same weights after clipping and Adam.
    Clipping shows: the two updates' gradients differ in norm, which Adam's second update sees."""
    after, losses = {}, {}
    for name, strategy, clip in (
        ("separate", tf.distribute.MirroredStrategy(["/cpu:0"]), 0.5),
        ("compiled", tf.distribute.OneDeviceStrategy("/cpu:0"), 0.5),
        ("compiled, unclipped", tf.distribute.OneDeviceStrategy("/cpu:0"), 0.0),
    ):
        training = TrainingConfig(jit_compile=True, clip_grad_norm=clip, accumulate_batches=accumulate)
        step, model, (first, second), spec, _ = _step(strategy, training)
        before = _weights(model)
        feed = [first, second] if accumulate == 1 else [first, first, second, second]
        results = [step((0,), (batch,), (spec,)) for batch in feed]
        assert all(r.finite for r in results)
        assert [r.applied for r in results] == ([True, True] if accumulate == 1 else [False, True] * 2)
        losses[name], after[name] = [r.loss for r in results], _weights(model)
        assert any(not np.array_equal(a, b) for a, b in zip(before, after[name], strict=True))
    assert losses["compiled"] == pytest.approx(losses["separate"], rel=1e-5)
    for separate, compiled in zip(after["separate"], after["compiled"], strict=True):
        np.testing.assert_allclose(compiled, separate, rtol=1e-4, atol=1e-6)
    apart = max(
        np.abs(a - b).max() for a, b in zip(after["compiled"], after["compiled, unclipped"], strict=True)
    )
    assert apart > 1e-4, apart


@pytest.mark.parametrize("guarded", [True, False])
def test_a_compiled_update_that_makes_a_weight_non_finite_is_reverted(guarded):
    """An infinite learning rate makes the update non-finite: inside XLA the guard puts the weights back
    bit for bit and reports the update refused; without the guard (revert_nonfinite_updates: false)
    the update is applied, non-finite, as the plain step would."""
    training = TrainingConfig(jit_compile=True, revert_nonfinite_updates=guarded)
    step, model, (batch, _), spec, adam = _step(
        tf.distribute.OneDeviceStrategy("/cpu:0"), training, DEEPSPEECH
    )
    adam.learning_rate.assign(float("inf"))
    before = _weights(model)
    result = step((0,), (batch,), (spec,))
    assert result.finite  # the loss and gradients were: only the update is not
    if guarded:
        assert not result.applied
        for old, new in zip(before, _weights(model), strict=True):
            np.testing.assert_array_equal(new, old)
    else:
        assert result.applied
        assert not all(np.isfinite(w).all() for w in _weights(model))
