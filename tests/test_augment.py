"""Feature augmentation: seeded by (seed, epoch, step, tower), bounded as configured, training split only."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from pipeline.batches.augment import augment_features, batch_seed
from pipeline.batches.dataset import SplitReader, batch_plan, eval_dataset, train_dataset
from pipeline.config import AugmentConfig
from pipeline.config_loader import load_config
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from tests.conftest import build_features

MASKS = AugmentConfig(freq_masks=2, freq_mask_max=5, time_masks=2, time_mask_max=30, time_mask_fraction=0.2)


def _batch(rows=4, time=120, n_input=26):
    features = tf.constant(
        np.random.RandomState(0).uniform(1.0, 2.0, (rows, time, n_input)).astype(np.float32)
    )
    lengths = tf.constant([120, 90, 60, 20], tf.int32)
    return features * tf.sequence_mask(lengths, time, dtype=tf.float32)[:, :, None], lengths


def test_masks_are_reproducible_from_the_position_and_bounded():
    features, lengths = _batch()
    one = augment_features(features, lengths, MASKS, batch_seed(7, 3, 11, 0)).numpy()
    again = augment_features(features, lengths, MASKS, batch_seed(7, 3, 11, 0)).numpy()
    other = augment_features(features, lengths, MASKS, batch_seed(7, 3, 12, 0)).numpy()
    np.testing.assert_array_equal(one, again)
    assert not np.array_equal(one, other)
    original = features.numpy()
    for row, length in enumerate(lengths.numpy()):
        masked = (one[row, :length] == 0) & (original[row, :length] != 0)
        frames = masked.all(axis=1)  # time-masked frames
        coefficients = masked.all(axis=0)  # frequency-masked coefficients
        assert coefficients.sum() <= 2 * 5
        # each time mask covers at most min(30, 0.2 x length) frames; two masks at most twice that
        assert frames.sum() <= 2 * min(30, int(0.2 * length))
        assert (masked == (frames[:, None] | coefficients[None, :])).all()  # only whole bands are masked
        assert (one[row, length:] == 0).all()  # padding stays zero


def test_noise_touches_real_frames_only():
    features, lengths = _batch()
    noisy = augment_features(
        features, lengths, AugmentConfig(feature_noise_std=0.5), batch_seed(1, 0, 0, 0)
    ).numpy()
    difference = noisy - features.numpy()
    assert abs(difference[0].std() - 0.5) < 0.05
    assert (difference[3, 20:] == 0).all()


def test_with_global_normalisation_the_model_sees_what_augmenting_normalised_features_gave():
    """``features.normalize: global`` normalises in the model, after augmentation: masks set the
    training set's mean (0 once normalised) and the noise is in units of its deviation, so the model's
    input is what augmenting normalised frames gave (the masks and draws are the same); padding frames
    stay all zero, which the model keeps at zero."""
    from native_client.cmvn import GlobalStats
    from pipeline.model.normalization import FeatureNormalization

    features, lengths = _batch()
    stats = GlobalStats(tuple(np.linspace(1.2, 1.8, 26)), tuple(np.linspace(0.1, 2.0, 26)))
    layer = FeatureNormalization(26)
    layer.build()
    layer.mean.assign(np.float32(stats.mean))
    layer.std.assign(np.float32(stats.std))
    real = tf.sequence_mask(lengths, 120, dtype=tf.float32)[:, :, None]
    normalised = layer(features) * real
    settings = dataclasses.replace(MASKS, feature_noise_std=0.3)
    seed = batch_seed(7, 3, 11, 0)
    seen = layer(augment_features(features, lengths, settings, seed, stats)).numpy()
    expected = augment_features(normalised, lengths, settings, seed).numpy()
    np.testing.assert_allclose(seen, expected, atol=2e-5)
    assert (seen[3, 20:] == 0).all() and (expected[3, 20:] == 0).all()
    masked = augment_features(features, lengths, MASKS, seed, stats).numpy()
    changed = masked != features.numpy()
    assert changed.any() and (layer(masked).numpy()[changed] == 0).all()  # a masked value is the mean


def test_augmented_training_batches_resume_exactly_and_dev_batches_are_never_augmented(small_config):
    config = load_config(small_config(limit_train=40))
    build_features(config, ("train",))
    index = read_cache(Layout(config).features_cache("train"), config.features)
    reader = SplitReader(index)
    plan = batch_plan(index.lengths, 4, 1)

    def run(first_epoch, start_step, augment):
        return [
            w.numpy()
            for w, *_ in train_dataset(reader, plan, 1, 0, 1, first_epoch, start_step, 2, 1234, augment)
        ]

    plain, augmented = run(0, 0, None), run(0, 0, MASKS)
    assert len(plain) == len(augmented) == 2 * len(plan)
    assert sum(not np.array_equal(a, b) for a, b in zip(plain, augmented, strict=False)) > len(plan)
    np.testing.assert_array_equal(
        np.concatenate([a.ravel() for a in run(0, 0, MASKS)]), np.concatenate([a.ravel() for a in augmented])
    )
    resumed = run(1, 3, MASKS)  # a run resumed at epoch 1, step 3 sees the same augmented batches
    for a, b in zip(resumed, augmented[len(plan) + 3 :], strict=False):
        np.testing.assert_array_equal(a, b)
    # dev and test batches come from eval_dataset, which has no augmentation at all
    for features, lengths, _, _, indices in eval_dataset(reader, 4):
        for row, i in enumerate(indices.numpy()):
            np.testing.assert_array_equal(features.numpy()[row, : lengths[row]], index.reader().utterance(i))
