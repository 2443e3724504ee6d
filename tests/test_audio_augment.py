"""Audio-level augmentation: extra cached copies of the training split, seeded, fingerprinted, each with
its own duration and rejects."""

from __future__ import annotations

import csv

import numpy as np
import soundfile

from pipeline.config import AugmentConfig
from pipeline.config_loader import load_config
from pipeline.features.audio_augment import Variant, apply_variant, variants
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from pipeline.stages.features import features_stage


def _noise_dir(tmp_path):
    folder = tmp_path / "noise"
    folder.mkdir()
    soundfile.write(
        folder / "white.wav", (np.random.RandomState(0).randn(48000) * 2000).astype(np.int16), 16000
    )
    return folder


def test_a_copy_has_the_drawn_speed_gain_and_snr(tmp_path):
    noise = _noise_dir(tmp_path)
    tone = (np.sin(np.arange(32000) * 2 * np.pi * 440 / 16000) * 8000).astype(np.int16)
    assert len(apply_variant(tone, Variant(1, 1.25, 0.0), 16000)) == 25600  # 1.25x faster: 4/5 of the samples
    louder = apply_variant(tone, Variant(1, 1.0, 6.0), 16000)
    assert abs(20 * np.log10(np.abs(louder).max() / np.abs(tone).max()) - 6.0) < 0.05
    noisy = apply_variant(tone, Variant(1, 1.0, 0.0, str(noise / "white.wav"), 12.0, 0.3), 16000).astype(
        float
    )
    added = noisy - tone
    assert abs(10 * np.log10(np.mean(tone.astype(float) ** 2) / np.mean(added**2)) - 12.0) < 0.2
    settings = AugmentConfig(
        speed_factors=(0.9, 1.1), audio_copies=1, gain_db=3.0, noise_dir=str(noise), seed=5
    )
    drawn = variants(settings, 7, [str(noise / "white.wav")])
    assert [v.speed for v in drawn] == [0.9, 1.1, 1.0] and drawn == variants(
        settings, 7, [str(noise / "white.wav")]
    )
    assert drawn != variants(settings, 8, [str(noise / "white.wav")])
    assert all(abs(v.gain_db) <= 3.0 and 10.0 <= v.snr_db <= 30.0 for v in drawn)


def test_the_train_cache_holds_the_copies_and_only_its_fingerprint_moves(small_config, tmp_path):
    plain = load_config(small_config("plain.yaml", limit_train=6, extra="data:\n  max_duration_s: 2.5\n"))
    noise = _noise_dir(tmp_path)
    augmented = load_config(
        small_config(
            "aug.yaml",
            limit_train=6,
            extra=f"""
        augment:
          speed_factors: [0.9, 1.1]
          audio_copies: 1
          gain_db: 6
          noise_dir: {noise}
        data:
          max_duration_s: 2.5
    """,
        )
    )
    assert Layout(plain).features_fingerprint("dev") == Layout(augmented).features_fingerprint("dev")
    assert Layout(plain).features_fingerprint("train") != Layout(augmented).features_fingerprint("train")
    summary = features_stage(Layout(augmented), "train")
    index = read_cache(Layout(augmented).features_cache("train"), augmented.features)
    assert summary.kept + summary.rejected == 6 * 4
    originals = {p: d for p, d in zip(index.paths, index.durations, strict=False) if "#" not in p}
    for path, duration in zip(index.paths, index.durations, strict=False):
        if path.endswith("#1"):  # speed 0.9: 1/0.9 of the original's duration
            assert abs(duration - originals[path[:-2]] / 0.9) < 0.01
    # a slowed copy longer than data.max_duration_s is rejected on its own, named as the copy
    with open(Layout(augmented).rejects_report("train"), newline="") as handle:
        rejects = list(csv.DictReader(handle))
    copies = [r for r in rejects if "#" in r["wav_filename"]]
    assert copies and all(r["reason"] == "too_long" and "(copy " in r["source"] for r in copies), rejects
    again = tmp_path / "again.h5"
    Layout(augmented).features_cache("train").rename(again)
    features_stage(Layout(augmented), "train")
    rebuilt = read_cache(Layout(augmented).features_cache("train"), augmented.features)
    assert rebuilt.paths == read_cache(again, augmented.features).paths
    np.testing.assert_array_equal(
        rebuilt.reader().batch(np.arange(len(rebuilt)))[0],
        read_cache(again, augmented.features).reader().batch(np.arange(len(rebuilt)))[0],
    )
