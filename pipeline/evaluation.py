"""Running a model over a cached split: per-sample CTC loss and greedy transcripts."""
from __future__ import annotations

import tensorflow as tf

from native_client.alphabet import Alphabet
from pipeline.cache import CachedSplit
from pipeline.dataset import SplitTensors, eval_dataset
from pipeline.metrics import SampleResult, greedy_decode, score_sample


def make_forward(model, blank_index: int):
    """A compiled function: windows, lengths, labels, label lengths -> (logits ``[b, t, classes]``, per-sample loss)."""

    @tf.function(reduce_retracing=True)
    def forward(windows, lengths, labels, label_lengths):
        logits = model(windows, training=False)
        loss = tf.nn.ctc_loss(labels, logits, label_lengths, lengths, logits_time_major=False, blank_index=blank_index)
        return logits, loss

    return forward


def run_split(model, data: CachedSplit, alphabet: Alphabet, batch_size: int, n_context: int,
              forward=None, logits_sink: dict | None = None, tensors: SplitTensors | None = None) -> list[SampleResult]:
    """Every sample of ``data`` through ``model``; results in the cache's sample order.

    ``logits_sink``, when given, receives ``{index: logits [time, classes]}`` (for decoders).
    """
    forward = forward or make_forward(model, alphabet.blank_index)
    results: dict[int, SampleResult] = {}
    tensors = tensors or SplitTensors(data)
    for windows, lengths, labels, label_lengths, indices in eval_dataset(tensors, data.lengths, batch_size, n_context):
        logits, loss = forward(windows, lengths, labels, label_lengths)
        logits, loss, lengths = logits.numpy(), loss.numpy(), lengths.numpy()
        for row, index in enumerate(indices.numpy()):
            hypothesis = greedy_decode(logits[row], lengths[row], alphabet)
            results[int(index)] = score_sample(data.paths[index], data.transcripts[index], hypothesis, float(loss[row]))
            if logits_sink is not None:
                logits_sink[int(index)] = logits[row, :lengths[row]]
    return [results[i] for i in range(len(data))]
