"""The transducer's loss beside CTC's: time of loss + gradient, and the ops a step dispatches one at a time.

One batch of random scores, ``--batch`` utterances of ``--frames`` encoder frames and ``--labels`` labels
over ``--classes`` classes (the sample's characters: 29): the RNN-T loss over the joiner's ``[batch,
frames, labels + 1, classes]`` scores, without and with XLA, beside CTC over ``[batch, frames, classes]``
(TensorFlow's kernel, the baseline of the ratios, and the exact log-space CTC under XLA). Each is a
compiled function timed best of ``--repeats`` after a warm-up, on this CPU.

The op counts are of the traced graph outside XLA (``pipeline.train.graph_ops``), a loop's body counted
once; ``launches`` adds the body's ops times its iterations: on a GPU roughly one kernel launch each,
which is what makes a per-frame scan slow there (issue 45 F2). Prints the CPU line first; the last line
is one JSON object.

    python bench/transducer_loss.py [--batch 16] [--frames 250] [--labels 120] [--classes 29]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import tensorflow as tf

from pipeline.model.ctc import KERNEL, LOG_SPACE, ctc_loss
from pipeline.model.objectives.transducer import rnnt_loss
from pipeline.train.graph_ops import ops_outside_xla


def _loop_body_ops(graph_def) -> int:
    """The ops of the largest ``While`` body in ``graph_def``'s library (the recursion's step)."""
    bodies = [len(f.node_def) for f in graph_def.library.function if "body" in f.signature.name.lower()]
    return max(bodies, default=0)


def _timed(function, argument, repeats: int) -> float:
    function(argument)  # trace and compile
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        loss, gradient = function(argument)
        loss.numpy(), gradient.numpy()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    """Time each loss and count its ops; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--frames", type=int, default=250)
    parser.add_argument("--labels", type=int, default=120)
    parser.add_argument("--classes", type=int, default=29)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    rng = np.random.default_rng(0)
    blank = args.classes - 1
    labels = tf.constant(rng.integers(0, blank, (args.batch, args.labels)), tf.int32)
    label_lengths = tf.constant(rng.integers(args.labels // 2, args.labels + 1, args.batch), tf.int32)
    frames = tf.constant(rng.integers(args.frames * 3 // 4, args.frames + 1, args.batch), tf.int32)
    joint = tf.constant(rng.normal(size=(args.batch, args.frames, args.labels + 1, args.classes)), tf.float32)
    per_frame = tf.constant(rng.normal(size=(args.batch, args.frames, args.classes)), tf.float32)

    def with_gradient(loss_of, jit: bool):
        def run(scores):
            with tf.GradientTape() as tape:
                tape.watch(scores)
                loss = tf.reduce_sum(loss_of(scores))
            return loss, tape.gradient(loss, scores)

        # XLA's program called from a plain function, as the training step calls its compiled part: the
        # call is one op of the outer graph
        return tf.function(tf.function(run, jit_compile=True) if jit else run)

    cases = {
        "ctc_kernel": (lambda s: ctc_loss(labels, label_lengths, s, frames, blank, KERNEL), False, per_frame),
        "ctc_log_space_xla": (
            lambda s: ctc_loss(labels, label_lengths, s, frames, blank, LOG_SPACE),
            True,
            per_frame,
        ),
        "rnnt": (lambda s: rnnt_loss(s, labels, frames, label_lengths, blank), False, joint),
        "rnnt_xla": (lambda s: rnnt_loss(s, labels, frames, label_lengths, blank), True, joint),
    }
    figures = {}
    for name, (loss_of, jit, scores) in cases.items():
        function = with_gradient(loss_of, jit)
        seconds = _timed(function, scores, args.repeats)
        graph = function.get_concrete_function(scores).graph.as_graph_def()
        uncompiled = with_gradient(loss_of, False).get_concrete_function(scores).graph.as_graph_def()
        figures[name] = {"seconds": round(seconds, 4), "ops_outside_xla": ops_outside_xla(graph)}
        if not jit:
            body = _loop_body_ops(uncompiled)
            iterations = args.frames + args.labels if name.startswith("rnnt") else 0
            figures[name]["loop_body_ops"] = body
            if iterations:
                figures[name]["launches"] = (
                    ops_outside_xla(graph) + 2 * body * iterations
                )  # forward + backward
    baseline = figures["ctc_kernel"]["seconds"]
    for name, entry in figures.items():
        entry["x_ctc_kernel"] = round(entry["seconds"] / baseline, 2)
        print(f"{name:20s} {entry['seconds'] * 1000:9.1f} ms  {entry['x_ctc_kernel']:6.2f}x  {entry}")
    shape = {k: getattr(args, k) for k in ("batch", "frames", "labels", "classes")}
    joint_mib = args.batch * args.frames * (args.labels + 1) * args.classes * 4 / 2**20
    print(json.dumps({"shape": shape, "joint_tensor_mib": round(joint_mib, 1), "figures": figures}))


if __name__ == "__main__":
    main()
