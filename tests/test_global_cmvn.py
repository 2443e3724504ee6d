"""``features.normalize: global``: the train split's statistics, computed once as its cache is written,
applied frame by frame in training, evaluation and the client; an export so trained streams incrementally."""

from __future__ import annotations

import json
import textwrap

import h5py
import numpy as np
import pytest

from native_client import Model, load_metadata
from native_client.audio import load_for_model
from native_client.stream import Utterance, run_calls
from pipeline.config import ConfigError
from pipeline.config_loader import config_from_dict, load_config
from pipeline.features.cache import CacheError, read_cache
from pipeline.features.cmvn import train_statistics
from pipeline.layout import Layout
from pipeline.stages.evaluate import evaluate_stage
from pipeline.stages.export import export_stage
from pipeline.stages.features import global_stats, split_cache
from pipeline.stages.train import train_stage
from tests.conftest import SAMPLE, build_features, small_config_text

CLIP = SAMPLE / "test" / "00000.flac"


def _frames(cache) -> np.ndarray:
    with h5py.File(cache, "r") as h5:
        return h5["features"][...]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny DeepSpeech trained on globally normalised features, evaluated and exported (float)."""
    directory = tmp_path_factory.mktemp("global")
    (directory / "base.yaml").write_text(
        small_config_text(directory / "work", limit_train=16, limit_dev=4, limit_test=4, n_hidden=48)
    )
    path = directory / "config.yaml"
    path.write_text(
        textwrap.dedent(f"""
        extends: base.yaml
        features:
          normalize: global
        training:
          epochs: 2
          learning_rate: 0.003
        paths:
          export_dir: {directory / "export"}
        """)
    )
    config = load_config(path)
    build_features(config, ("train", "dev", "test"))
    layout = Layout(config)
    train_stage(layout)
    report = evaluate_stage(layout, beam=False)
    return config, export_stage(layout, with_lm=False).root, report


def test_the_statistics_are_numpys_mean_and_std_over_the_train_cache(trained):
    config, _, _ = trained
    layout = Layout(config)
    frames = _frames(layout.features_cache("train")).astype(np.float64)
    stats = global_stats(layout)
    np.testing.assert_allclose(stats.mean, frames.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.std, frames.std(axis=0), rtol=1e-9, atol=1e-12)
    assert np.abs(frames.mean(axis=0)).max() > 5  # the cache holds the raw frames, not normalised ones
    # several caches (a multi-task config's train splits) pool their frames
    both = [layout.features_cache("train"), layout.features_cache("dev")]
    pooled = np.concatenate([_frames(cache) for cache in both]).astype(np.float64)
    np.testing.assert_allclose(train_statistics(both).mean, pooled.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(train_statistics(both).std, pooled.std(axis=0), rtol=1e-9, atol=1e-12)


def test_training_evaluation_and_the_client_see_identical_features(trained):
    """The test split as training's reader hands it to the model (train statistics applied at read), and
    the same file as the export's client computes it from its metadata: the very same numbers."""
    config, export, report = trained
    layout = Layout(config)
    test = split_cache(layout, "test")
    client = load_metadata(export).features
    assert client.normalize == "global" and client.stats == global_stats(layout)
    row = test.paths.index(str(CLIP))
    read = test.reader().utterance(row)
    np.testing.assert_array_equal(read, client.frames(load_for_model(CLIP, 16000)))
    assert abs(float(read.mean())) < 1.5 and 0.3 < float(read.std()) < 3  # roughly standardised
    assert np.isfinite(report.wer) and np.isfinite(report.loss)
    with pytest.raises(ValueError, match="the train split's statistics go with global normalisation"):
        read_cache(layout.features_cache("test"), config.features)


def test_a_global_export_streams_incrementally_and_ends_as_one_shot(trained):
    _, export, _ = trained
    metadata = json.loads((export / "metadata.json").read_text())
    assert metadata["features"]["normalize"] == "global" and len(metadata["features"]["mean"]) == 26
    model = Model(export)
    samples = load_for_model(CLIP, 16000)
    expected_logits = model.logits(samples)
    expected = model.transcribe(samples)
    for chunk in (137, 4000):
        stream, partials = model.create_stream(), []
        for start in range(0, len(samples), chunk):
            stream.feed_audio(samples[start : start + chunk])
            partials.append(len(stream.logits()))
        # the model ran as audio came: logits before the end, each prefix final
        assert 0 < partials[len(partials) // 2] < len(expected_logits)
        np.testing.assert_allclose(stream.logits(), expected_logits[: partials[-1]], atol=1e-5)
        assert stream.finish() == expected, chunk
        np.testing.assert_allclose(stream.logits(), expected_logits, atol=1e-5)
    # the server's utterance: its chunks are ready as audio comes, no rerun from the start
    utterance = Utterance(model.runner)
    assert utterance.incremental
    half = len(samples) // 2
    utterance.feed_audio(samples[:half])
    chunks = utterance.ready()
    assert len(chunks) > 0
    logits, state = run_calls(model.runner, chunks, utterance.state)
    utterance.accept(logits, state)
    utterance.feed_audio(samples[half:])
    utterance.finish()
    logits, state = run_calls(model.runner, utterance.ready(), utterance.state)
    utterance.accept(logits, state)
    np.testing.assert_allclose(utterance.logits(), expected_logits, atol=1e-5)


def test_the_config_takes_global_and_refuses_other_words_in_one_line():
    assert config_from_dict({"features": {"normalize": "global"}}).features.normalize == "global"
    for value, shown in ((1, "1"), ("globally", "'globally'")):
        with pytest.raises(
            ConfigError, match=rf"features.normalize: expected one of false, true, 'global', got {shown}"
        ):
            config_from_dict({"features": {"normalize": value}})


def test_global_moves_the_features_fingerprint_and_the_coqui_layout_refuses_it():
    fingerprints = {
        Layout(config_from_dict({"features": {"normalize": value}})).features_fingerprint("train")
        for value in (False, True, "global")
    }
    assert len(fingerprints) == 3
    with pytest.raises(ConfigError, match="export.coqui_tflite: features.normalize: their client does not"):
        config_from_dict(
            {"features": {"type": "deepspeech", "normalize": "global"}, "export": {"coqui_tflite": True}}
        )


def test_statistics_of_a_missing_train_cache_are_one_line_naming_it(tmp_path):
    missing = tmp_path / "train.h5"
    with pytest.raises(
        CacheError, match=rf"^{missing}: feature cache does not exist .*; run the Features task$"
    ):
        train_statistics([missing])


def test_a_multitask_config_pools_its_tasks_train_splits_into_one_set_and_trains(tmp_path):
    from tests.test_multitask_train import two_tasks

    config = two_tasks(tmp_path, extra="features: {normalize: global}\ntraining: {epochs: 1}\n")
    layout = Layout(config)
    caches = [layout.for_task(task).features_cache("train") for task in ("en", "fr")]
    pooled = np.concatenate([_frames(cache) for cache in caches]).astype(np.float64)
    stats = global_stats(layout.for_task("fr"))
    assert stats == global_stats(layout.for_task("en")) == global_stats(layout)
    np.testing.assert_allclose(stats.mean, pooled.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.std, pooled.std(axis=0), rtol=1e-9, atol=1e-12)
    assert len(_frames(caches[0])) != len(pooled)  # two caches, not one counted twice
    report = train_stage(layout)
    assert report.epochs_completed == 1 and np.isfinite(report.train_losses[0]["train_loss"])


def test_the_run_keeps_its_statistics_and_export_needs_no_train_cache_after_it(trained, tmp_path):
    """Train writes the statistics into its run before reading any split; Export (and Evaluate,
    TuneDecoder) read them from there: the numbers the checkpoints were trained with, even once the train
    cache is gone (gc of another config, a run copied to another machine). A damaged file is one line."""
    import shutil

    config, _, _ = trained
    layout = Layout(config)
    kept = layout.train_run.feature_stats
    entry = json.loads(kept.read_text())
    computed = train_statistics([layout.features_cache("train")])
    assert entry == computed.to_dict() and global_stats(layout) == computed
    cache = layout.features_cache("train")
    moved = tmp_path / "train.h5"
    shutil.move(cache, moved)
    try:
        assert global_stats(layout) == computed
        again = export_stage(layout, with_lm=False)
        assert json.loads(again.metadata.read_text())["features"]["mean"] == list(computed.mean)
    finally:
        shutil.move(moved, cache)
    saved = kept.read_text()
    try:
        kept.write_text('{"mean": [0.0], "std": ')
        with pytest.raises(
            CacheError, match=r"feature_stats\.json: the run's feature statistics do not read"
        ):
            global_stats(layout)
    finally:
        kept.write_text(saved)
