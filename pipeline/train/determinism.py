"""``training.deterministic``: whether a training run's ops give the same bits every time.

On the CPU TensorFlow's ops are deterministic already, and the training draws
every random number from a seed it checkpoints, so a resumed run ends with the
weights of one never stopped. On a GPU some kernels (cuDNN's convolution and
LSTM backward passes, scatter and segment sums, ...) add in whatever order their
threads finish, unless TensorFlow's op determinism is on; and matmuls run in
TF32 (a 10-bit mantissa) on Ampere and later, float32 on older GPUs. ``exact``
turns op determinism on and TF32 off, so a run gives the same weights on every
run of the same GPU model and resumes bit for bit, at the cost of the slower
deterministic kernels; ``fast`` leaves both to TensorFlow's defaults; ``auto``
is ``exact`` without a GPU (whose kernels are deterministic already; the cost of the
switch there is not benchmarked) and ``fast`` with.
With op determinism on, an op without a deterministic kernel, or a random op
without a seed, raises instead of silently differing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf
from tensorflow.python.framework import config as tf_config


def wants_exact(mode: str, gpus: bool) -> bool:
    """Whether ``training.deterministic`` ``mode`` asks for deterministic ops where ``gpus`` says whether
    a GPU is visible."""
    return mode == "exact" or (mode == "auto" and not gpus)


@contextlib.contextmanager
def deterministic_ops(mode: str, gpus: bool) -> Iterator[bool]:
    """Within: op determinism as ``mode`` asks (``wants_exact``), and with ``gpus`` TF32 off when exact;
    yields whether the ops are deterministic. TensorFlow's settings are the process's: they are put back
    on the way out, so another stage run in this process (Evaluate, Transcribe) keeps its fast kernels."""
    exact = wants_exact(mode, gpus)
    determinism, tf32 = (
        tf_config.is_op_determinism_enabled(),
        tf.config.experimental.tensor_float_32_execution_enabled(),
    )
    _set(exact, tf32 and not (exact and gpus))
    try:
        yield exact
    finally:
        _set(determinism, tf32)


def ops_are_deterministic() -> bool:
    """Whether TensorFlow's op determinism is on now."""
    return tf_config.is_op_determinism_enabled()


def _set(determinism: bool, tf32: bool) -> None:
    """TensorFlow's op determinism and TF32 execution switched as given."""
    if determinism:
        tf.config.experimental.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()
    tf.config.experimental.enable_tensor_float_32_execution(tf32)


def record_session_determinism(state) -> None:
    """Fold this session's op determinism into the run's record, ``state.deterministic_ops`` (a
    ``TrainState``: -1 unrecorded, 0 some session ran without it, 1 every one with it). Called at a
    session's first step; a run resumed from a checkpoint from before the record stays unrecorded."""
    now, recorded = int(ops_are_deterministic()), int(state.deterministic_ops.numpy())
    if recorded >= 0:
        state.deterministic_ops.assign(min(recorded, now))
    elif int(state.global_step.numpy()) == 0:  # a new run
        state.deterministic_ops.assign(now)
