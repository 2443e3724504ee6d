"""training.deterministic: TensorFlow's op determinism (and TF32) as the mode asks, for the training run
only."""

from __future__ import annotations

import pytest
import tensorflow as tf

from pipeline.train.determinism import deterministic_ops, ops_are_deterministic, wants_exact


def test_auto_is_exact_without_a_gpu_and_fast_with_one():
    assert [wants_exact(mode, gpus=False) for mode in ("auto", "exact", "fast")] == [True, True, False]
    assert [wants_exact(mode, gpus=True) for mode in ("auto", "exact", "fast")] == [False, True, False]


def test_the_settings_hold_inside_and_are_put_back_after():
    """exact: op determinism on (an unseeded random op then raises instead of differing run to run), and
    with GPUs TF32 off; fast: off even where the process had it on; both put back, an error included."""
    assert not ops_are_deterministic() and tf.config.experimental.tensor_float_32_execution_enabled()
    with deterministic_ops("exact", gpus=True) as exact:
        assert exact and ops_are_deterministic()
        assert not tf.config.experimental.tensor_float_32_execution_enabled()
        with pytest.raises(RuntimeError, match="seed"):
            tf.random.uniform([2])
        with deterministic_ops("fast", gpus=True) as inner:
            assert not inner and not ops_are_deterministic()
        assert ops_are_deterministic()
    with pytest.raises(ValueError, match="inside"):
        with deterministic_ops("auto", gpus=False):
            assert ops_are_deterministic() and tf.config.experimental.tensor_float_32_execution_enabled()
            raise ValueError("inside")
    assert not ops_are_deterministic() and tf.config.experimental.tensor_float_32_execution_enabled()


@pytest.mark.long  # three sessions of Train a case: make test sits close to its 20 minutes
@pytest.mark.parametrize(
    "first, then, reopened, recorded",
    [("exact", "exact", "fast", True), ("fast", "exact", "exact", False), ("exact", "fast", "exact", False)],
)
def test_the_report_says_whether_every_session_that_trained_was_exact(
    small_config, first, then, reopened, recorded
):
    """One epoch in ``first`` mode, a second in ``then`` mode (the key moves no fingerprint: the same
    run), then a session in ``reopened`` mode that finds nothing left to train: the report's
    ``deterministic_ops`` is whether every session that trained had op determinism on. It used to be
    the last session's: true after a fast epoch resumed exact, false once a fast session only looked."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.stages.train import train_stage
    from tests.conftest import build_features

    def run(mode: str, epochs: int, name: str):
        extra = f"training:\n  epochs: {epochs}\n  validation_epochs: 0\n  deterministic: {mode}\n"
        config = load_config(small_config(name, limit_train=8, extra=extra))
        build_features(config, ("train", "dev"))  # Train reads its dev split
        return Layout(config), train_stage(Layout(config))

    layout, report = run(first, 1, "first.yaml")
    assert report.deterministic_ops is (first == "exact")
    again, report = run(then, 2, "then.yaml")
    assert again.train_run.root == layout.train_run.root and report.epochs_completed == 2
    assert report.deterministic_ops is recorded
    _, report = run(reopened, 2, "reopened.yaml")
    assert report.epochs_completed == 2 and report.deterministic_ops is recorded
