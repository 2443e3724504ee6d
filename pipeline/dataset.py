"""tf.data input from the feature cache: similar-length batches, a seeded order per epoch, sharding.

A global batch is ``towers x per-tower batch`` consecutive utterances in
length order (little padding); the order of the global batches is shuffled
per epoch with ``shuffle_seed + epoch``, so any (epoch, step) position can be
reproduced exactly on resume. Each tower takes its slice of the global batch.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from pipeline.cache import CachedSplit
from pipeline.model import make_windows


def epoch_batches(lengths: np.ndarray, global_batch: int, epoch: int, seed: int) -> np.ndarray:
    """Sample indices ``[n_batches, global_batch]`` for one training epoch.

    Sorted by length; the last batch is filled up with the shortest
    utterances so every tower always gets a full batch.
    """
    order = np.argsort(lengths, kind="stable")
    n_batches = max(1, math.ceil(len(order) / global_batch))
    fill = n_batches * global_batch - len(order)
    indices = np.concatenate([order, np.resize(order, fill)]) if fill else order
    batches = indices.reshape(n_batches, global_batch)
    return batches[np.random.default_rng(seed + epoch).permutation(n_batches)]


def eval_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Every sample exactly once, in length order, in batches of at most ``batch_size``."""
    order = np.argsort(lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


class SplitTensors:
    """A cached split as TensorFlow tensors, with batches gathered and padded inside the graph.

    Everything stays in TensorFlow (no Python generator), so batches are made
    in parallel by tf.data without holding the GIL.
    """

    def __init__(self, data: CachedSplit):
        label_lengths = np.array([len(l) for l in data.labels], np.int32)
        label_offsets = np.concatenate([[0], np.cumsum(label_lengths, dtype=np.int64)[:-1]]) if len(label_lengths) else np.zeros(0, np.int64)
        flat_labels = np.concatenate(data.labels).astype(np.int32) if data.labels else np.zeros(0, np.int32)
        self.features = tf.constant(data.features)            # [total_frames, n_input]
        self.offsets = tf.constant(data.offsets.astype(np.int64))
        self.lengths = tf.constant(data.lengths.astype(np.int32))
        self.labels = tf.constant(flat_labels)                # [total_labels]
        self.label_offsets = tf.constant(label_offsets.astype(np.int64))
        self.label_lengths = tf.constant(label_lengths)
        self.n_input = data.features.shape[1]

    def gather(self, indices: tf.Tensor):
        """Padded batch of ``indices``: features ``[b, time, n_input]``, lengths, labels ``[b, max_label]``, label lengths, indices."""
        lengths = tf.gather(self.lengths, indices)
        starts = tf.gather(self.offsets, indices)
        rows = tf.ragged.range(starts, starts + tf.cast(lengths, tf.int64))
        features = tf.gather(self.features, rows).to_tensor(shape=[None, None, self.n_input])
        label_lengths = tf.gather(self.label_lengths, indices)
        label_starts = tf.gather(self.label_offsets, indices)
        label_rows = tf.ragged.range(label_starts, label_starts + tf.cast(label_lengths, tf.int64))
        labels = tf.gather(self.labels, label_rows).to_tensor()
        return features, lengths, labels, label_lengths, indices


def _batches_dataset(tensors: SplitTensors, index_batches, n_context: int) -> tf.data.Dataset:
    """A dataset of the batches listed in ``index_batches`` (arrays of sample indices, any sizes), in order."""
    sizes = np.array([len(b) for b in index_batches], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(sizes) else np.zeros(0, np.int64)
    flat = tf.constant(np.concatenate(index_batches).astype(np.int32) if len(sizes) else np.zeros(0, np.int32))

    def make(start, size):
        features, lengths, labels, label_lengths, indices = tensors.gather(flat[start:start + size])
        return make_windows(features, n_context), lengths, labels, label_lengths, indices

    dataset = tf.data.Dataset.from_tensor_slices((starts, sizes))
    return dataset.map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)


def train_dataset(tensors: SplitTensors, lengths: np.ndarray, per_replica_batch: int, n_replicas: int,
                  replica_offset: int, local_replicas: int, first_epoch: int, start_step: int, end_epoch: int,
                  seed: int, n_context: int) -> tf.data.Dataset:
    """The per-replica batches of the local towers for epochs ``first_epoch`` (from ``start_step``) to ``end_epoch`` - 1.

    Elements come in step order and, within a step, in local replica order
    (what ``distribute_datasets_from_function`` hands to the towers). One
    dataset spans all epochs, so one iterator serves the whole run.
    """
    global_batch = per_replica_batch * n_replicas
    batches = np.concatenate([epoch_batches(lengths, global_batch, epoch, seed)[start_step if epoch == first_epoch else 0:]
                              for epoch in range(first_epoch, end_epoch)])
    mine = batches[:, replica_offset * per_replica_batch:(replica_offset + local_replicas) * per_replica_batch]
    per_replica = mine.reshape(len(batches) * local_replicas, per_replica_batch)
    return _batches_dataset(tensors, list(per_replica), n_context)


def eval_dataset(tensors: SplitTensors, lengths: np.ndarray, batch_size: int, n_context: int) -> tf.data.Dataset:
    """Every sample once, in length-sorted batches, with context windows."""
    return _batches_dataset(tensors, eval_batches(lengths, batch_size), n_context)


def steps_per_epoch(n_samples: int, global_batch: int) -> int:
    """Training steps in one epoch."""
    return max(1, math.ceil(n_samples / global_batch))
