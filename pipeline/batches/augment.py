"""Feature-level augmentation inside the tf.data graph: SpecAugment-style masks and feature noise.

Every draw comes from stateless random ops seeded by (``augment.seed``, epoch,
step, tower), so a batch is augmented the same way whenever it is made: a
resumed run sees exactly what an uninterrupted one saw, and the cache is never
touched. Only the training split passes through here.
"""

from __future__ import annotations

import tensorflow as tf

from native_client.cmvn import GlobalStats
from pipeline.config import AugmentConfig


def batch_seed(base: int, epoch: tf.Tensor, step: tf.Tensor, replica: tf.Tensor) -> tf.Tensor:
    """The stateless seed ``[2]`` of one tower's batch at (epoch, step)."""
    seed = tf.constant([base, 0], tf.int64)
    for value in (epoch, step, replica):
        seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(value, tf.int64))
    return seed


def _masks(seed, count: int, max_width, size, batch: int, lengths=None):
    """``[batch, size]`` True where one of ``count`` random bands per row lies; a band's width is uniform in
    [0, max_width] (per row when ``max_width`` is a vector) and it starts inside the row's length."""
    if count == 0:
        return tf.zeros([batch, size], tf.bool)
    widths_seed, starts_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    max_width = tf.cast(tf.broadcast_to(max_width, [batch]), tf.float32)[:, None]
    limit = tf.cast(lengths if lengths is not None else tf.fill([batch], size), tf.float32)[:, None]
    widths = tf.floor(tf.random.stateless_uniform([batch, count], widths_seed) * (max_width + 1.0))
    starts = tf.floor(
        tf.random.stateless_uniform([batch, count], starts_seed) * tf.maximum(limit - widths, 1.0)
    )
    positions = tf.cast(tf.range(size), tf.float32)[None, None, :]
    inside = (positions >= starts[:, :, None]) & (positions < (starts + widths)[:, :, None])
    return tf.reduce_any(inside, axis=1)


def augment_features(
    features: tf.Tensor,
    lengths: tf.Tensor,
    settings: AugmentConfig,
    seed: tf.Tensor,
    stats: GlobalStats | None = None,
) -> tf.Tensor:
    """``features`` ``[batch, time, n_input]`` with frequency masks, time masks (each at most
    ``time_mask_fraction`` of its utterance) and Gaussian noise on the real frames, all drawn from
    ``seed``. Padding frames stay zero. A masked value is 0 and the noise's deviation
    ``feature_noise_std``, in the model's input: with ``stats`` (``features.normalize: global``, which the
    model applies after this), 0 is the training set's mean and the deviation is in units of its own."""
    shape = tf.shape(features)
    batch, time, n_input = shape[0], shape[1], shape[2]
    freq_seed, time_seed, noise_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    real = tf.sequence_mask(lengths, time)[:, :, None]
    mean, scale = (0.0, 1.0) if stats is None else (tf.constant(a, features.dtype) for a in stats.arrays())
    masked = tf.zeros_like(features, tf.bool)
    if settings.freq_masks:
        freq = _masks(freq_seed, settings.freq_masks, min(settings.freq_mask_max, 10**6), n_input, batch)
        masked |= freq[:, None, :]
    if settings.time_masks:
        widest = tf.minimum(
            tf.cast(settings.time_mask_max, tf.float32),
            tf.floor(settings.time_mask_fraction * tf.cast(lengths, tf.float32)),
        )
        masked |= _masks(time_seed, settings.time_masks, widest, time, batch, lengths)[:, :, None]
    augmented = tf.where(masked & real, mean + tf.zeros_like(features), features)  # padding never masked
    if settings.feature_noise_std:
        augmented += (
            tf.cast(real, features.dtype)
            * scale
            * tf.random.stateless_normal(
                shape, noise_seed, stddev=settings.feature_noise_std, dtype=features.dtype
            )
        )
    return augmented
