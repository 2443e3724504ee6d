"""tf.data input from the feature cache: similar-length batches read from disk, a seeded order per epoch.

The run's batch plan is fixed: the cache is in length order, cut into global
batches of ``towers x per-tower batch`` consecutive utterances (little padding,
and each batch is one contiguous read); with ``training.max_batch_frames`` a
batch whose tower share would exceed that many frames is cut into smaller
consecutive steps. The order of the plan's batches is shuffled per epoch with
``shuffle_seed + epoch``, so any (epoch, step) position can be reproduced
exactly on resume. Each tower takes its slice of the global batch. With
``training.accumulate_batches`` N, N consecutive steps of the plan form one update
window (the update of one batch N times the size), and the epoch shuffles windows,
not steps: a window's batches always follow each other.

With ``training.bucket_growth`` each batch is padded to a fixed grid of shapes
(``pipeline.batches.buckets``): the plan's cuts use the padded frames, so a
bucket's batch size is fixed too.

Only the per-utterance index and the labels are in memory; each batch's
features are read from the cache file when tf.data makes the batch.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import tensorflow as tf

from native_client.cmvn import GlobalStats
from pipeline.batches.augment import augment_features, batch_seed
from pipeline.batches.buckets import ShapeGrid
from pipeline.batches.joint_cap import JointCap
from pipeline.config import AugmentConfig
from pipeline.features.cache import CacheIndex, damage_in

PARALLEL_BATCHES = 2  # batches read at once (more threads gain nothing: bench/input.py)
PREFETCH_BATCHES = 2  # batches ready ahead of the model


def batch_plan(
    lengths: np.ndarray,
    global_batch: int,
    towers: int,
    max_batch_frames: int = 0,
    grid: ShapeGrid | None = None,
    joint: JointCap | None = None,
) -> list[np.ndarray]:
    """The run's global batches (sample indices), in length order, before any shuffling.

    The last batch is filled up with the shortest utterances so every tower gets a
    full batch. With ``max_batch_frames``, a batch whose per-tower frames (tower
    batch x its longest utterance) exceed the cap is cut into consecutive steps of
    fewer utterances per tower (at least one), every step still split evenly over
    the towers. With ``grid`` the cap counts the batch's padded frames. With ``joint``
    (a transducer), a batch is also cut to the utterances a tower's joint scores hold
    (``JointCap.per_tower``, which raises ``JointTooLarge`` for an utterance too long alone).
    """
    order = np.argsort(lengths, kind="stable")
    n_batches = max(1, math.ceil(len(order) / global_batch))
    fill = n_batches * global_batch - len(order)
    indices = np.concatenate([order, np.resize(order, fill)]) if fill else order
    batches = list(indices.reshape(n_batches, global_batch))
    if not max_batch_frames and joint is None:
        return batches
    per_tower = global_batch // towers
    plan = []
    for batch in batches:
        fits = per_tower
        if max_batch_frames:
            longest = _padded(int(lengths[batch].max(initial=1)), grid) or 1
            fits = max(1, min(fits, max_batch_frames // longest))
        if joint is not None:
            fits = min(fits, joint.per_tower(batch))
        step = fits * towers
        plan.extend(batch[start : start + step] for start in range(0, global_batch, step))
    return plan


def plan_digest(plan: list[np.ndarray], accumulate: int = 1) -> int:
    """A 63-bit digest of a batch plan (which utterances form each step, in plan order, and with
    ``accumulate`` above 1 how many steps form an update window): two plans with the same digest give the
    same batches at every (epoch, step) position. Kept in the checkpoint."""
    digest = hashlib.sha256()
    for batch in plan:
        digest.update(len(batch).to_bytes(8, "little"))
        digest.update(np.asarray(batch, np.int64).tobytes())
    if accumulate > 1:
        digest.update(b"accumulate" + accumulate.to_bytes(8, "little"))
    return int.from_bytes(digest.digest()[:8], "little") >> 1


def epoch_windows(steps: int, epoch: int, seed: int, accumulate: int = 1) -> list[range]:
    """The update windows of a plan of ``steps`` steps in the order of ``epoch``: each window is
    ``accumulate`` consecutive plan steps (the last one may be shorter), windows shuffled with
    ``seed + epoch``. With ``accumulate`` 1 every step is its own window."""
    windows = [range(start, min(start + accumulate, steps)) for start in range(0, steps, accumulate)]
    return [windows[i] for i in np.random.default_rng(seed + epoch).permutation(len(windows))]


def epoch_batches(plan: list[np.ndarray], epoch: int, seed: int, accumulate: int = 1) -> list[np.ndarray]:
    """The plan's global batches in the order of ``epoch`` (windows of ``accumulate`` steps kept together)."""
    return [plan[i] for window in epoch_windows(len(plan), epoch, seed, accumulate) for i in window]


def _padded(longest: int, grid: ShapeGrid | None) -> int:
    """The frames of a batch whose longest utterance has ``longest``: on ``grid``, or ``longest``."""
    return grid.frames(longest) if grid is not None else longest


def eval_batches(
    lengths: np.ndarray,
    batch_size: int,
    max_batch_frames: int = 0,
    grid: ShapeGrid | None = None,
    joint: JointCap | None = None,
) -> list[np.ndarray]:
    """Every sample exactly once, in length order, in batches of at most ``batch_size`` (and, with
    ``max_batch_frames``, at most that many padded frames, on ``grid`` when given, unless one utterance
    alone is longer; with ``joint``, at most the utterances whose joint scores fit, ``batch_plan``)."""
    order = np.argsort(lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        size = min(batch_size, len(order) - start)
        if max_batch_frames:
            longest = _padded(int(lengths[order[start + size - 1]]), grid) or 1
            size = max(1, min(size, max_batch_frames // longest))
        if joint is not None:
            size = min(size, joint.per_tower(order[start : start + size]))
        batches.append(order[start : start + size])
        start += size
    return batches


class SplitReader:
    """A cached split as tf.data input: labels as tensors in memory, features read from disk per batch.

    The read is one ``tf.numpy_function`` per batch (a contiguous slice of the
    length-ordered cache), so tf.data makes batches in parallel threads and no
    Python code runs per sample. With ``grid`` a batch's frames and labels are padded to its shape on
    the grid (``pipeline.batches.buckets``), else to the batch's longest. ``readers``: the batches made
    at once (each read holds h5py's lock, the padding does not).
    """

    def __init__(self, index: CacheIndex, grid: ShapeGrid | None = None, readers: int = PARALLEL_BATCHES):
        label_lengths = np.array([len(label) for label in index.labels], np.int32)
        label_offsets = (
            np.concatenate([[0], np.cumsum(label_lengths, dtype=np.int64)[:-1]])
            if len(label_lengths)
            else np.zeros(0, np.int64)
        )
        flat_labels = np.concatenate(index.labels).astype(np.int32) if index.labels else np.zeros(0, np.int32)
        self.index = index
        self.grid = grid
        self.readers = readers
        self.n_input = index.n_input
        self.reader = index.reader()
        self.flat_labels = flat_labels  # [total_labels]
        self.label_offsets = label_offsets.astype(np.int64)
        self.label_lengths = label_lengths

    def gather(self, indices: tf.Tensor):
        """Padded batch of ``indices``: features ``[b, time, n_input]``, lengths, labels ``[b, max_label]``,
        label lengths, indices."""
        # One Python call a batch: the labels are cut and padded there too, where TensorFlow's ragged
        # gather cost more than the read (bench/input.py).
        features, lengths, labels, label_lengths = tf.numpy_function(
            self._read, [indices], (tf.float32, tf.int32, tf.int32, tf.int32), stateful=False
        )
        features = tf.ensure_shape(features, [None, None, self.n_input])
        lengths = tf.ensure_shape(lengths, [None])
        labels = tf.ensure_shape(labels, [None, None])
        label_lengths = tf.ensure_shape(label_lengths, [None])
        return features, lengths, labels, label_lengths, indices

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The features, lengths, labels and label lengths of ``indices``, padded to their shape on the
        grid, or to the longest utterance and label."""
        longest = int(self.index.lengths[indices].max(initial=0))
        label_lengths = self.label_lengths[indices]
        width = int(label_lengths.max(initial=0))
        if self.grid is not None and len(indices):
            features, lengths = self.reader.batch(indices, self.grid.frames(longest))
            width = max(width, self.grid.labels(longest))
        else:
            features, lengths = self.reader.batch(indices)
        labels = np.zeros((len(indices), width), np.int32)
        for row, (start, size) in enumerate(zip(self.label_offsets[indices], label_lengths, strict=True)):
            labels[row, :size] = self.flat_labels[start : start + size]
        return features, lengths, labels, label_lengths


def _flat(index_batches: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Batches of sample indices as one int32 array plus each batch's start and size."""
    sizes = np.array([len(b) for b in index_batches], np.int64)
    starts = (
        np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(sizes) else np.zeros(0, np.int64)
    )
    flat = np.concatenate(index_batches).astype(np.int32) if len(sizes) else np.zeros(0, np.int32)
    return flat, starts, sizes


def _sliced(flat, starts, sizes) -> tf.data.Dataset:
    """A dataset of ``flat[start:start + size]`` for each (start, size)."""
    return tf.data.Dataset.from_tensor_slices((starts, sizes)).map(
        lambda start, size: flat[start : start + size]
    )


def _batches(
    reader: SplitReader,
    indices: tf.data.Dataset,
    augment: AugmentConfig | None = None,
    stats: GlobalStats | None = None,
) -> tf.data.Dataset:
    """Batches (features, lengths, labels, label lengths, indices) of a dataset of sample-index arrays,
    in order. With ``augment`` (training), elements are (indices, epoch, step, tower) and the features
    are augmented with draws seeded by those (``stats``: the normalisation the model applies after)."""

    def make(batch, *position):
        features, lengths, labels, label_lengths, batch = reader.gather(batch)
        if augment is not None:
            seed = batch_seed(augment.seed, *position)
            features = augment_features(features, lengths, augment, seed, stats)
        return features, lengths, labels, label_lengths, batch

    # Fixed, small buffers: AUTOTUNE grows them towards half the machine's RAM when the model is the
    # slow side (measured: 3 GB for Evaluate on 2 h, when batches held their 19x context windows).
    batches = indices.map(make, num_parallel_calls=reader.readers, deterministic=True)
    return batches.prefetch(max(PREFETCH_BATCHES, reader.readers)).with_options(input_options())


def input_options() -> tf.data.Options:
    """The options of every batch pipeline: tf.data's autotuning off. Nothing here is AUTOTUNE, so it has
    nothing to tune, and a multi-device iterator's destructor waits for its model thread: in make test,
    gdb found the garbage collector stuck there for minutes, freeing a finished Trainer with towers."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def train_dataset(
    reader: SplitReader,
    plan: list[np.ndarray],
    n_replicas: int,
    replica_offset: int,
    local_replicas: int,
    first_epoch: int,
    start_step: int,
    end_epoch: int,
    seed: int,
    augment: AugmentConfig | None = None,
    accumulate: int = 1,
    stats: GlobalStats | None = None,
) -> tf.data.Dataset:
    """The per-replica batches of the local towers for epochs ``first_epoch`` (from ``start_step``) to
    ``end_epoch`` - 1.

    Elements come in step order and, within a step, in local replica order
    (what ``distribute_datasets_from_function`` hands to the towers). One
    dataset spans all epochs, so one iterator serves the whole run; each
    epoch's order is computed when tf.data reaches it, so memory holds one
    epoch's indices, not the run's. With ``augment`` (feature-level augmentation on), each tower's batch
    is augmented from a seed of (epoch, step in the epoch, tower). ``accumulate``: the steps of an update
    window (``epoch_batches``). ``stats``: the training set's statistics with ``features.normalize: global``
    (the augmentation masks and noise in the normalised scale the model sees).
    """

    def epoch_elements(epoch) -> tuple[np.ndarray, ...]:
        epoch = int(epoch)
        first = start_step if epoch == first_epoch else 0
        pieces, steps, towers = [], [], []
        for step, batch in enumerate(epoch_batches(plan, epoch, seed, accumulate)[first:], first):
            share = len(batch) // n_replicas
            for r in range(local_replicas):
                pieces.append(batch[(replica_offset + r) * share : (replica_offset + r + 1) * share])
                steps.append(step)
                towers.append(replica_offset + r)
        return (*_flat(pieces), np.array(steps, np.int64), np.array(towers, np.int64))

    def one_epoch(epoch):
        flat, starts, sizes, steps, towers = (
            tf.ensure_shape(t, [None])
            for t in tf.numpy_function(
                epoch_elements, [epoch], (tf.int32, tf.int64, tf.int64, tf.int64, tf.int64), stateful=False
            )
        )
        if augment is None:
            return _sliced(flat, starts, sizes)
        return tf.data.Dataset.from_tensor_slices((starts, sizes, steps, towers)).map(
            lambda start, size, step, tower: (flat[start : start + size], epoch, step, tower)
        )

    epochs = tf.data.Dataset.range(first_epoch, end_epoch)
    return _batches(reader, epochs.flat_map(one_epoch), augment, stats)


def eval_dataset(
    reader: SplitReader, batch_size: int, max_batch_frames: int = 0, joint: JointCap | None = None
) -> tf.data.Dataset:
    """Every sample once, in length-sorted batches (``eval_batches``)."""
    batches = eval_batches(reader.index.lengths, batch_size, max_batch_frames, reader.grid, joint)
    flat, starts, sizes = _flat(batches)
    return _batches(reader, _sliced(tf.constant(flat), tf.constant(starts), tf.constant(sizes)))


def checked(dataset: tf.data.Dataset):
    """Iterate ``dataset``, turning a damaged-cache error raised in the input pipeline into the reader's
    one-line CacheError."""
    iterator = iter(dataset)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as error:
            raise damage_in(error) or error from None
        yield item
