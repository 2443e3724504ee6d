"""Running a model over a cached split: per-sample loss (the model's objective) and greedy transcripts,
logits handed on as they come."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from native_client.alphabet import Labels
from pipeline.batches.buckets import shape_grid
from pipeline.batches.dataset import SplitReader, checked, eval_dataset
from pipeline.batches.joint_cap import JointCap
from pipeline.evaluation.metrics import SampleResult, greedy_decode, score_sample
from pipeline.features.cache import CacheIndex
from pipeline.model import model_family
from pipeline.model.normalization import normalized
from pipeline.model.objective import objective_loss
from pipeline.model.objectives import model_objective

# on_logits(sample index, logits [time, classes])
LogitsSink = Callable[[int, np.ndarray], None]


def make_forward(run, objective, blank_index: int, head=None):
    """A compiled function: features, lengths, labels, label lengths -> (logits ``[b, t, outputs]``,
    per-sample loss, output lengths, greedy labels or None): ``run(features, lengths)`` gives the logits
    and output lengths, the ``objective`` (``pipeline.model.objective``) scores them with its ``head``
    and gives its greedy labels (``best_labels``; None: the CTC best path of the logits)."""

    @tf.function(reduce_retracing=True)
    def forward(features, lengths, labels, label_lengths):
        logits, output_lengths = run(features, lengths)
        loss = objective_loss(
            objective, labels, label_lengths, logits, output_lengths, blank_index, False, head
        )
        best = objective.best_labels(logits, output_lengths, blank_index, head)
        return logits, loss, output_lengths, best

    return forward


def model_forward(model, blank_index: int, full_context: bool = False):
    """``make_forward`` of a trained model (its config's family and objective): the computation the export
    runs, or with ``full_context`` (a family that ``limits_context``) the one where every label sees the
    whole utterance."""
    family = model_family(model.model_config.architecture)
    context = {"full_context": True} if full_context else {}

    def run(features, lengths):
        return family.forward(model, normalized(model, features), lengths, training=False, **context)

    objective = model_objective(model.model_config.objective)
    return make_forward(run, objective, blank_index, getattr(model, "objective_head", None))


def run_split(
    model,
    data: CacheIndex,
    alphabet: Labels,
    batch_size: int,
    forward=None,
    on_logits: LogitsSink | None = None,
    reader: SplitReader | None = None,
    max_batch_frames: int = 0,
    bucket_growth: float = 0.0,
    on_result: Callable[[int, SampleResult], None] | None = None,
    joint: JointCap | None = None,
) -> list[SampleResult] | None:
    """Every sample of ``data`` through ``model``; results in the cache's sample order.

    ``on_logits``, when given, receives each sample's logits as its batch is
    done (for decoders), so no caller has to hold a split's logits in memory.
    ``on_result(index, result)``, when given, receives each sample's result instead of the returned list
    (None then), so no caller has to hold a split's results either. ``max_batch_frames`` and
    ``bucket_growth``: the batches' cap and shape grid (``training``'s keys), when no ``reader`` is given;
    ``joint``: a transducer's cap on its joint scores (``pipeline.batches.joint_cap``).
    """
    forward = forward or model_forward(model, alphabet.blank_index)
    results: list[SampleResult | None] = [None] * len(data) if on_result is None else []
    reader = reader or SplitReader(data, shape_grid(data, bucket_growth))
    for features, lengths, labels, label_lengths, indices in checked(
        eval_dataset(reader, batch_size, max_batch_frames, joint)
    ):
        logits, loss, lengths, best = forward(features, lengths, labels, label_lengths)
        logits, loss, lengths = logits.numpy(), loss.numpy(), lengths.numpy()
        best = None if best is None else best.numpy()
        for row, index in enumerate(indices.numpy()):
            if best is None:
                hypothesis = greedy_decode(logits[row], lengths[row], alphabet)
            else:
                hypothesis = alphabet.decode(best[row][best[row] >= 0])
            result = score_sample(data.paths[index], data.transcripts[index], hypothesis, float(loss[row]))
            if on_result is None:
                results[int(index)] = result
            else:
                on_result(int(index), result)
            if on_logits is not None:
                on_logits(int(index), logits[row, : lengths[row]])
    return results if on_result is None else None
