"""Where a training step's time goes: the step, and its parts timed alone, at one geometry.

One batch of random features (``--batch`` utterances of ``--frames`` frames,
labels a sixth as long), the deepspeech family at ``--hidden`` units, on this
CPU. Timed, best of ``--repeats`` after a warm-up, each part its own compiled
function: the whole step (forward, CTC, backward, Adam), forward + backward
without the optimizer, the forward pass, forward + backward with the LSTM taken
out (the dense layers, windows, dropouts and CTC), CTC alone, and the LSTM
alone, with each ``model.deepspeech.lstm_kernel`` (fused, and Keras' layer as every step
ran it before).

    python bench/step_profile.py [--hidden 384] [--frames 150] [--batch 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import keras
import tensorflow as tf

from pipeline.config import ModelConfig
from pipeline.model import build_model
from pipeline.model.ctc import KERNEL, ctc_loss
from pipeline.model.deepspeech import DeepSpeechSettings
from pipeline.model.deepspeech_net import make_windows
from pipeline.model.fused_lstm import lstm_sequence

N_INPUT, N_CLASSES = 26, 29


def best_ms(run, repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``run`` (after one warm-up), results fetched, in ms."""
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        for tensor in tf.nest.flatten(run()):
            tensor.numpy()
        times.append(time.perf_counter() - started)
    return 1000 * min(times[1:])


def parts(hidden: int, frames: int, batch: int, lstm_kernel: str) -> dict:
    """The compiled parts of a step at this geometry (names -> zero-argument functions)."""
    model = build_model(
        ModelConfig(options=DeepSpeechSettings(n_hidden=hidden, lstm_kernel=lstm_kernel)), N_INPUT, N_CLASSES
    )
    optimizer = keras.optimizers.Adam(1e-3)
    blank = N_CLASSES - 1
    label_length = max(1, frames // 6)
    features = tf.random.stateless_normal([batch, frames, N_INPUT], seed=[1, 2])
    lengths = tf.fill([batch], frames)
    labels = tf.random.stateless_uniform([batch, label_length], [3, 4], 0, blank, dtype=tf.int32)
    label_lengths = tf.fill([batch], label_length)

    def loss_of(logits):
        return tf.reduce_sum(ctc_loss(labels, label_lengths, logits, lengths, blank, KERNEL)) / batch

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_of(model(features, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    @tf.function
    def forward_backward():
        with tf.GradientTape() as tape:
            loss = loss_of(model(features, training=True))
        return tape.gradient(loss, model.trainable_variables)

    @tf.function
    def forward():
        return model(features, training=True)

    outside = [v for v in model.trainable_variables if "lstm" not in v.path]

    @tf.function
    def without_lstm():
        with tf.GradientTape() as tape:
            logits = model.stack(make_windows(features, model.settings.n_context), lambda x: x, True)
            loss = loss_of(logits)
        return tape.gradient(loss, outside)

    logits = tf.random.stateless_normal([batch, frames, N_CLASSES], seed=[5, 6])

    @tf.function
    def ctc():
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = loss_of(logits)
        return tape.gradient(loss, logits)

    x = tf.random.stateless_normal([batch, frames, hidden], seed=[7, 8])
    cell = model.lstm.cell

    @tf.function
    def lstm():
        with tf.GradientTape() as tape:
            tape.watch(x)
            if model.fused_lstm:
                out = lstm_sequence(tf.transpose(x, [1, 0, 2]), cell.kernel, cell.recurrent_kernel, cell.bias)
            else:
                zeros = tf.zeros([batch, hidden])
                out = model.lstm(x, initial_state=[zeros, zeros], training=True)[0]
            loss = tf.reduce_sum(out)
        return tape.gradient(loss, [x, *model.lstm.trainable_variables])

    return {
        "step": step,
        "forward_backward": forward_backward,
        "forward": forward,
        "forward_backward_without_lstm": without_lstm,
        "ctc_forward_backward": ctc,
        "lstm_forward_backward": lstm,
    }


def main(argv=None) -> int:
    """Time every part with each LSTM kernel and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=384, help="model.deepspeech.n_hidden")
    parser.add_argument("--frames", type=int, default=150, help="frames per utterance (150: 3 s at 20 ms)")
    parser.add_argument("--batch", type=int, default=16, help="utterances per step")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per part (the best counts)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    figures = {}
    for kernel in ("fused", "layer"):
        for name, run in parts(args.hidden, args.frames, args.batch, kernel).items():
            if kernel == "layer" and name in ("forward_backward_without_lstm", "ctc_forward_backward"):
                continue  # the same computation as with the fused kernel
            figures[f"{kernel}_{name}_ms"] = round(best_ms(run, args.repeats), 1)
            print(f"{kernel:5s} {name:31s} {figures[f'{kernel}_{name}_ms']:9.1f} ms", flush=True)
    figures["step_ratio"] = round(figures["layer_step_ms"] / figures["fused_step_ms"], 2)
    print(json.dumps({"hidden": args.hidden, "frames": args.frames, "batch": args.batch, **figures}))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    raise SystemExit(main())
