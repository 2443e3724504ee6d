"""The fused sequence LSTM is Keras' LSTM layer to float rounding, values and gradients, and the model
takes it or the layer by ``model.deepspeech.lstm_kernel`` with the same weights."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipeline.config import ModelConfig
from pipeline.model import build_model
from pipeline.model.deepspeech import DeepSpeechSettings
from pipeline.model.deepspeech_net import uses_fused_lstm
from pipeline.model.fused_lstm import lstm_sequence
from pipeline.model.weights import weights_digest


def _layer(units: int, inputs: int, seed: int = 3) -> keras.layers.LSTM:
    layer = keras.layers.LSTM(units, return_sequences=True, unit_forget_bias=True)
    layer.build((None, None, inputs))
    rng = np.random.default_rng(seed)
    for variable in layer.weights:  # a non-zero bias and weights large enough to saturate some gates
        variable.assign(rng.normal(0.0, 0.6, variable.shape).astype("float32"))
    return layer


@pytest.mark.parametrize(
    ("batch", "time", "inputs", "units"), [(3, 41, 7, 5), (1, 1, 4, 6), (2, 120, 16, 24)]
)
def test_values_and_gradients_equal_the_keras_layer(batch, time, inputs, units):
    layer = _layer(units, inputs)
    cell = layer.cell
    x = tf.random.stateless_normal([batch, time, inputs], seed=[1, 2])
    upstream = tf.random.stateless_normal(
        [batch, time, units], seed=[3, 4]
    )  # a loss that weighs every output

    def run(fused: bool):
        with tf.GradientTape() as tape:
            tape.watch(x)
            if fused:
                outputs = tf.transpose(
                    lstm_sequence(tf.transpose(x, [1, 0, 2]), cell.kernel, cell.recurrent_kernel, cell.bias),
                    [1, 0, 2],
                )
            else:
                outputs = layer(x)
            loss = tf.reduce_sum(outputs * upstream)
        return [outputs, *tape.gradient(loss, [x, cell.kernel, cell.recurrent_kernel, cell.bias])]

    for ours, keras_value in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(ours.numpy(), keras_value.numpy(), rtol=1e-5, atol=1e-5)


def test_an_empty_sequence_gives_no_outputs_and_zero_weight_gradients():
    layer = _layer(4, 3)
    cell = layer.cell
    x = tf.zeros([0, 2, 3])
    with tf.GradientTape() as tape:
        tape.watch(x)
        outputs = lstm_sequence(x, cell.kernel, cell.recurrent_kernel, cell.bias)
        loss = tf.reduce_sum(outputs)
    grads = tape.gradient(loss, [x, cell.kernel, cell.recurrent_kernel, cell.bias])
    assert outputs.shape == (0, 2, 4)
    assert all(float(tf.reduce_sum(tf.abs(g))) == 0.0 for g in grads)


@pytest.mark.parametrize("time", [0, 1, 23])
def test_under_xla_and_in_float16_it_matches_too(time):
    """The step compiles with XLA (training.jit_compile), an empty sequence included, and a mixed-precision
    policy's float16 inputs run against the float32 variables."""
    layer = _layer(6, 4)
    cell = layer.cell
    x = tf.random.stateless_normal([time, 3, 4], seed=[9, time])

    def outputs_and_grads(x, dtype):
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs = lstm_sequence(tf.cast(x, dtype), cell.kernel, cell.recurrent_kernel, cell.bias)
            loss = tf.reduce_sum(tf.cast(outputs, tf.float32) ** 2)
        return [outputs, *tape.gradient(loss, [x, cell.kernel, cell.recurrent_kernel, cell.bias])]

    eager = outputs_and_grads(x, tf.float32)
    compiled = tf.function(lambda x: outputs_and_grads(x, tf.float32), jit_compile=True)(x)
    half = outputs_and_grads(x, tf.float16)
    for ours, xla, low in zip(eager, compiled, half, strict=True):
        np.testing.assert_allclose(xla.numpy(), ours.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tf.cast(low, tf.float32).numpy(), ours.numpy(), rtol=2e-2, atol=2e-2)


def test_the_model_takes_either_kernel_with_the_same_weights_and_results():
    base = DeepSpeechSettings(n_hidden=16, dropout_rate=0.0)
    fused = build_model(ModelConfig(options=dataclasses.replace(base, lstm_kernel="fused")), 5, 7)
    layer = build_model(ModelConfig(options=dataclasses.replace(base, lstm_kernel="layer")), 5, 7)
    assert fused.fused_lstm and not layer.fused_lstm
    assert weights_digest(fused) == weights_digest(layer)
    assert [v.path.split("/", 1)[1] for v in fused.weights] == [
        v.path.split("/", 1)[1] for v in layer.weights
    ]
    features = tf.random.stateless_normal([2, 30, 5], seed=[5, 6])

    def logits_and_grads(model):
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = tf.reduce_sum(tf.nn.log_softmax(logits)[..., 0])
        return [logits, *tape.gradient(loss, model.trainable_variables)]

    for ours, theirs in zip(logits_and_grads(fused), logits_and_grads(layer), strict=True):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-5)


def test_auto_takes_the_layer_only_where_a_gpu_would_run_cudnn():
    assert uses_fused_lstm("auto", gpu=False)
    assert not uses_fused_lstm("auto", gpu=True)
    assert not uses_fused_lstm("auto", "mixed_float16", gpu=True)
    assert uses_fused_lstm("auto", "mixed_bfloat16", gpu=True)  # cuDNN's RNN has no bfloat16
    assert uses_fused_lstm("fused", gpu=True)
    assert not uses_fused_lstm("layer", gpu=False)


def _ops(function, *specs) -> set[str]:
    """Every op type of ``function``'s graph traced for ``specs``, the functions it calls included."""
    graph = function.get_concrete_function(*specs).graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return {node.op for node in nodes}


@pytest.mark.parametrize("kernel", ["auto", "layer"])
def test_where_a_gpu_is_visible_xla_steps_and_exports_never_carry_cudnns_lstm(monkeypatch, kernel):
    """Keras' LSTM traced where it sees a GPU emits ``CudnnRNNV3``, which XLA cannot compile (TF #99385)
    and which a SavedModel's CPU user cannot run. Made to see one here, the model traces cuDNN's kernel
    for a plain training step (so the test can tell), and never under ``jit_compile`` nor in the form
    every export carries."""
    import importlib

    from pipeline.model import model_family

    monkeypatch.setattr(
        importlib.import_module("keras.src.backend.tensorflow.rnn"), "_is_gpu_available", lambda: True
    )
    settings = DeepSpeechSettings(n_hidden=8, lstm_kernel=kernel)
    model = build_model(ModelConfig(options=settings), 5, 7)
    model.fused_lstm = uses_fused_lstm(kernel, gpu=True)  # as it decides where a GPU is visible
    spec = tf.TensorSpec([2, None, 5], tf.float32)
    assert "CudnnRNNV3" in _ops(tf.function(lambda x: model(x, training=True)), spec)
    assert "CudnnRNNV3" not in _ops(tf.function(lambda x: model(x, training=True), jit_compile=True), spec)
    # what the export's one-shot signature runs (InferenceGraph: the streaming form's, over windows)
    form = model_family("deepspeech").streaming(model, 4)
    windows = tf.TensorSpec([1, None, model.window, 5], tf.float32)
    assert "CudnnRNNV3" not in _ops(tf.function(form.utterance), windows)
