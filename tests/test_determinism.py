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
