"""``features.normalize: global``: the train split's statistics, computed once as its cache is written, are
weights of the model (``pipeline.model.normalization``): filled when a run starts, saved with its
checkpoints, carried by its export, whose client feeds raw features; an export so trained streams
incrementally, and exports of the earlier format (the client normalised) still run."""

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
from pipeline.model.checkpoints import load_trained_model
from pipeline.model.labels import model_alphabet
from pipeline.model.normalization import normalized
from pipeline.stages.evaluate import evaluate_stage
from pipeline.stages.export import export_stage
from pipeline.stages.train import train_stage
from tests.conftest import ROOT, SAMPLE, build_features, small_config_text

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
    stats = train_statistics([layout.features_cache("train")])
    np.testing.assert_allclose(stats.mean, frames.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.std, frames.std(axis=0), rtol=1e-9, atol=1e-12)
    assert np.abs(frames.mean(axis=0)).max() > 5  # the cache holds the raw frames, not normalised ones
    # several caches (a multi-task config's train splits) pool their frames
    both = [layout.features_cache("train"), layout.features_cache("dev")]
    pooled = np.concatenate([_frames(cache) for cache in both]).astype(np.float64)
    np.testing.assert_allclose(train_statistics(both).mean, pooled.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(train_statistics(both).std, pooled.std(axis=0), rtol=1e-9, atol=1e-12)


def test_the_model_holds_the_statistics_and_normalises_what_training_and_the_client_read(trained):
    """The trained checkpoint's normalisation weights are the train split's statistics; the test split as
    training's reader hands it over and as the export's client computes it are the same raw frames; the
    model normalises them as the statistics say, and leaves padding frames at zero."""
    config, export, report = trained
    layout = Layout(config)
    test = read_cache(layout.features_cache("test"), config.features)
    client = load_metadata(export).features
    assert client.normalize is False and client.stats is None  # the client computes raw features
    row = test.paths.index(str(CLIP))
    read = test.reader().utterance(row)
    np.testing.assert_array_equal(read, client.frames(load_for_model(CLIP, 16000)))
    assert np.abs(read.mean(axis=0)).max() > 5  # raw, as the front end computed them
    stats = train_statistics([layout.features_cache("train")])
    model = load_trained_model(config, layout.train_run.best, test.n_input, 29)
    layer = model.feature_normalization
    np.testing.assert_array_equal(layer.mean.numpy(), np.asarray(stats.mean, np.float32))
    np.testing.assert_array_equal(layer.std.numpy(), np.asarray(stats.std, np.float32))
    padded = np.concatenate([read, np.zeros((3, read.shape[1]), np.float32)])[None]
    seen = normalized(model, padded).numpy()[0]
    np.testing.assert_array_equal(seen[: len(read)], stats.apply(read))  # what the reader gave before
    assert not seen[len(read) :].any()  # padding stays zero
    assert abs(float(seen[: len(read)].mean())) < 1.5 and 0.3 < float(seen[: len(read)].std()) < 3
    assert np.isfinite(report.wer) and np.isfinite(report.loss)


def test_a_global_export_streams_incrementally_and_ends_as_one_shot(trained):
    _, export, _ = trained
    metadata = json.loads((export / "metadata.json").read_text())
    assert metadata["format_version"] == 6 and metadata["normalization"] == "global"
    assert metadata["features"]["normalize"] is False and "mean" not in metadata["features"]
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
    stats = train_statistics(caches)
    np.testing.assert_allclose(stats.mean, pooled.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.std, pooled.std(axis=0), rtol=1e-9, atol=1e-12)
    assert len(_frames(caches[0])) != len(pooled)  # two caches, not one counted twice
    report = train_stage(layout)
    assert report.epochs_completed == 1 and np.isfinite(report.train_losses[0]["train_loss"])
    for task in ("en", "fr"):  # one encoder, one set of statistics in the checkpoint
        view = config.task_view(task)
        classes = model_alphabet(view, layout.for_task(task).alphabet).n_classes
        model = load_trained_model(view, layout.train_run.best, 26, classes)
        np.testing.assert_array_equal(model.feature_normalization.mean.numpy(), np.float32(stats.mean))


def test_export_needs_no_train_cache_and_a_warm_start_takes_its_own_statistics(trained, tmp_path):
    """The statistics travel in the checkpoints: Export runs with the train cache gone (gc of another
    config, a run copied to another machine). A warm start (``training.init_from``) copies the weights but
    not the donor's statistics: the new run normalises with its own training set's."""
    import shutil

    config, export, _ = trained
    layout = Layout(config)
    cache = layout.features_cache("train")
    moved = tmp_path / "train.h5"
    shutil.move(cache, moved)
    try:
        again = export_stage(layout, with_lm=False)
        assert json.loads(again.metadata.read_text())["normalization"] == "global"
    finally:
        shutil.move(moved, cache)
    (tmp_path / "base.yaml").write_text(
        small_config_text(tmp_path / "work", limit_train=8, limit_dev=4, limit_test=4, n_hidden=48)
    )
    warm = tmp_path / "warm.yaml"
    warm.write_text(
        "extends: base.yaml\nfeatures: {normalize: global}\n"
        f"training: {{epochs: 1, init_from: {layout.train_run.best}}}\n"
    )
    warm_config = load_config(warm)
    build_features(warm_config, ("train", "dev"))
    warm_layout = Layout(warm_config)
    train_stage(warm_layout)
    own = train_statistics([warm_layout.features_cache("train")])
    donor = train_statistics([cache])
    assert own.mean != donor.mean  # 8 utterances, not 16
    model = load_trained_model(warm_config, warm_layout.train_run.best, 26, 29)
    np.testing.assert_array_equal(model.feature_normalization.mean.numpy(), np.float32(own.mean))


def test_a_normalising_checkpoint_is_refused_by_a_model_that_does_not_normalise(trained):
    """Loading (Evaluate, Export with a checkpoint given) or warm-starting from a run trained with global
    normalisation into a model without it would leave its statistics unread: one line each."""
    import dataclasses

    from pipeline.model import build_model
    from pipeline.model.checkpoints import CheckpointMismatchError, warm_start

    config, _, _ = trained
    layout = Layout(config)
    raw = dataclasses.replace(config, features=dataclasses.replace(config.features, normalize=False))
    with pytest.raises(
        CheckpointMismatchError, match="feature_normalization: in the checkpoint, not in the model"
    ):
        load_trained_model(raw, layout.train_run.best, 26, 29)
    with pytest.raises(CheckpointMismatchError, match="trained on globally normalised features"):
        warm_start(build_model(raw.model, 26, 29), layout.train_run.best, 0, raw)


def test_a_warm_start_from_a_run_on_raw_features_folds_the_statistics_in(tmp_path):
    """A run of this project that normalised nothing (its config.yaml says so), warm-started into a
    config with global normalisation, is folded as a DeepSpeech/Coqui model is: on normalised windows the
    new model's first layer gives what the source's gave on raw ones. A Conformer cannot fold: one line."""
    import dataclasses
    import shutil

    from native_client.cmvn import GlobalStats
    from native_client.windows import window_view
    from pipeline.model import build_model
    from pipeline.model.checkpoints import CheckpointMismatchError, warm_start
    from pipeline.model.normalization import set_statistics

    (tmp_path / "base.yaml").write_text(
        small_config_text(tmp_path / "work", limit_train=8, limit_dev=4, limit_test=4, n_hidden=32)
    )
    (tmp_path / "raw.yaml").write_text("extends: base.yaml\nfeatures: {normalize: false}\n")
    raw = load_config(tmp_path / "raw.yaml")
    build_features(raw, ("train", "dev"))
    run = Layout(raw).train_run
    train_stage(Layout(raw))
    source = load_trained_model(raw, run.best, 26, 29)
    frames = _frames(Layout(raw).features_cache("train"))[:300]
    stats = GlobalStats(tuple(map(float, frames.mean(0) + 1.0)), tuple(map(float, frames.std(0) * 2.0)))
    wanted = dataclasses.replace(raw, features=dataclasses.replace(raw.features, normalize="global"))
    model = build_model(wanted.model, 26, 29, normalized=True)
    set_statistics(model, stats)
    warm_start(model, run.best, 0, wanted)
    np.testing.assert_array_equal(model.feature_normalization.std.numpy(), np.float32(stats.std))
    n_context = raw.model.options.n_context
    inside = slice(n_context, -n_context)  # windows with no padding frame

    def first_layer(net, x):
        return net.layer_1(window_view(x, n_context)[inside].reshape(-1, 26 * (2 * n_context + 1))).numpy()

    theirs, ours = first_layer(source, frames), first_layer(model, stats.apply(frames))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)

    # The Train fingerprint says so; a copy of the run that says it normalised per utterance is not folded.
    from pipeline.fingerprints import derived_inputs
    from pipeline.workdir import trained_on_raw_features

    warm = dataclasses.replace(wanted, training=dataclasses.replace(wanted.training, init_from=str(run.best)))
    assert derived_inputs(Layout(warm), "train", {})["init_from"] == "raw features, folded"
    assert "init_from" not in derived_inputs(Layout(wanted), "train", {})
    copy = tmp_path / "copy"
    shutil.copytree(run.root, copy)
    resolved = (copy / "config.yaml").read_text()
    assert trained_on_raw_features(copy) and trained_on_raw_features(copy / "best")
    (copy / "config.yaml").write_text(resolved.replace("normalize: false", "normalize: true"))
    assert not trained_on_raw_features(copy)

    conformer = load_config(ROOT / "configs" / "sample-conformer.yaml")
    conformer = dataclasses.replace(conformer, features=dataclasses.replace(raw.features, normalize="global"))
    other = build_model(conformer.model, 26, 29, normalized=True)
    with pytest.raises(CheckpointMismatchError, match="cannot fold global normalisation"):
        warm_start(other, run.best, 0, conformer)


def test_an_export_of_the_earlier_format_still_runs_in_the_client():
    """tests/data/export-format-5: a tiny model exported by the release before the normalisation moved
    into the model (its metadata holds the mean and std, the client normalises): it loads, gives the logits
    that release's client gave (tests/data/export-format-5-logits.npy, computed by it) and streams
    incrementally as it did."""
    export = ROOT / "tests" / "data" / "export-format-5"
    metadata = json.loads((export / "metadata.json").read_text())
    assert metadata["format_version"] == 5 and len(metadata["features"]["mean"]) == 26
    model = Model(export)
    assert model.metadata.features.normalize == "global" and model.metadata.features.stats is not None
    samples = load_for_model(CLIP, 16000)
    expected = model.logits(samples)
    np.testing.assert_allclose(
        expected, np.load(ROOT / "tests" / "data" / "export-format-5-logits.npy"), atol=1e-5
    )
    assert isinstance(model.transcribe(samples), str)
    stream = model.create_stream()
    for start in range(0, len(samples), 4000):
        stream.feed_audio(samples[start : start + 4000])
    stream.finish()
    np.testing.assert_allclose(stream.logits(), expected, atol=1e-5)
