"""The Conformer-CTC family: its settings, its output rate, padding that changes nothing, and the whole DAG
through a one-shot export and the client."""

from __future__ import annotations

import json
import subprocess
import sys

import luigi
import numpy as np
import pytest
import tensorflow as tf

from native_client import Model
from native_client.audio import load_for_model
from pipeline.config import ConfigError
from pipeline.config_loader import config_from_dict, load_config
from pipeline.evaluation.run import run_split
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from pipeline.model import build_model, model_family
from pipeline.model.checkpoints import load_trained_model
from pipeline.model.labels import model_alphabet
from pipeline.model.normalization import normalized
from tasks import Evaluate, Export
from tests.conftest import ROOT, SAMPLE

CLIP = SAMPLE / "test" / "00002.flac"
TINY = {"d_model": 32, "heads": 2, "layers": 2, "conv_kernel": 5, "subsampling_channels": 8}


def _conformer(**settings):
    return config_from_dict({"model": {"architecture": "conformer", "conformer": {**TINY, **settings}}})


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"heads": 3}, "model.conformer.heads: 3 heads do not split d_model 32"),
        ({"subsampling": 3}, "model.conformer.subsampling: expected 1, 2, 4 or 8, got 3"),
        ({"conv_kernel": 4}, "model.conformer.conv_kernel: expected an odd width, got 4"),
        ({"d_modle": 4}, "model.conformer.d_modle: unknown key; did you mean 'd_model'?"),
        ({"dropout": 1.5}, "model.conformer.dropout: expected a value at most 0.9, got 1.5"),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(settings, says):
    with pytest.raises(ConfigError, match=None) as error:
        _conformer(**settings)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_settings_of_a_family_not_chosen_are_neither_read_nor_fingerprinted():
    deepspeech = config_from_dict({"model": {"conformer": {"heads": 3}}})  # would not load as a conformer
    assert Layout(deepspeech).train_fingerprint == Layout(config_from_dict({})).train_fingerprint
    base = _conformer()
    with pytest.raises(ConfigError, match=r"model\.n_hidden: a setting of the deepspeech family"):
        config_from_dict({"model": {"architecture": "conformer", "conformer": TINY, "n_hidden": 7}})
    assert Layout(base).train_fingerprint != Layout(_conformer(layers=3)).train_fingerprint
    # 4 frames a label: the too-short check keeps other utterances than DeepSpeech's
    assert Layout(base).features_fingerprint("train") != Layout(config_from_dict({})).features_fingerprint(
        "train"
    )
    assert Layout(_conformer(subsampling=1)).features_fingerprint("train") == Layout(
        config_from_dict({})
    ).features_fingerprint("train")


@pytest.mark.parametrize("subsampling", [1, 2, 4, 8])
@pytest.mark.parametrize("full_context", [False, True])
def test_an_utterance_gives_the_same_logits_alone_and_in_a_padded_batch(subsampling, full_context):
    config = _conformer(subsampling=subsampling, chunk_frames=3)
    model, family = build_model(config.model, 26, 29), model_family("conformer")
    rng = np.random.default_rng(0)
    lengths = [37, 50, 41]
    batch = np.zeros((3, 50, 26), np.float32)
    for row, length in enumerate(lengths):
        batch[row, :length] = rng.standard_normal((length, 26))
    logits, output_lengths = family.forward(
        model, batch, tf.constant(lengths), training=False, full_context=full_context
    )
    assert list(output_lengths.numpy()) == [-(-n // subsampling) for n in lengths]
    for row, length in enumerate(lengths):
        one = batch[row : row + 1, :length]
        # alone: the export's one-shot form (chunked), or the model over the whole utterance
        alone = (model(one) if full_context else family.utterance(model, one)).numpy()[0]
        assert alone.shape[0] == output_lengths[row]
        np.testing.assert_allclose(logits.numpy()[row, : len(alone)], alone, atol=1e-5)


def test_a_label_sees_no_frame_after_its_chunk():
    """Causal subsampling and convolution, chunked attention: frames after a chunk change none of its
    labels (in full context they change them all)."""
    config = _conformer(subsampling=4, chunk_frames=3)
    model, family = build_model(config.model, 26, 29), model_family("conformer")
    frames = np.random.default_rng(1).standard_normal((1, 96, 26)).astype(np.float32)
    changed = frames.copy()
    changed[:, 36:] += 1.0  # from label 9 on: chunk 3 (labels 9-11) on
    before, after = family.utterance(model, frames).numpy()[0], family.utterance(model, changed).numpy()[0]
    np.testing.assert_array_equal(before[:9], after[:9])
    assert np.abs(before[9:] - after[9:]).min(axis=-1).max() > 0
    assert np.abs(model(frames).numpy()[0, :9] - model(changed).numpy()[0, :9]).max() > 1e-3


def test_the_full_size_config_is_nemo_medium_geometry():
    config = load_config(ROOT / "configs" / "en-conformer.yaml")
    settings = config.model.options
    assert (settings.d_model, settings.layers, settings.heads) == (256, 18, 4)
    model = build_model(config.model, 80, 29)
    assert 25e6 < sum(int(np.prod(v.shape)) for v in model.weights) < 35e6


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_float32_weights_and_logits(precision):
    model = build_model(_conformer().model, 26, 29, precision)
    assert all(v.dtype == "float32" for v in model.weights)
    assert model(tf.zeros([1, 20, 26])).dtype == tf.float32


@pytest.mark.usefixtures("tasks_in_process")
def test_a_conformer_trains_evaluates_exports_and_transcribes_one_shot(small_config):
    path = small_config(
        limit_train=12,
        limit_dev=4,
        limit_test=4,
        extra="""
            features:
              type: mfcc
            model:
              architecture: conformer
              conformer:
                {d_model: 32, heads: 2, layers: 2, conv_kernel: 5, subsampling: 4, subsampling_channels: 8}
            training:
              epochs: 1
            export:
              quantize: true
        """,
    )
    assert luigi.build([Evaluate(config=str(path)), Export(config=str(path))], local_scheduler=True)
    config = load_config(path)
    export = Layout(config).find_export().root
    metadata = json.loads((export / "metadata.json").read_text())
    assert metadata["stride"] == 4 and metadata["streaming"]["input"] == "frames"
    assert metadata["streaming"]["chunk"] == 32 and metadata["streaming"]["lookback"] == 3  # 8 labels of 4
    samples = load_for_model(CLIP, 16000)
    family = model_family("conformer")
    for backend in ("tflite", "saved_model", "frozen_graph"):
        model = Model(export, backend=backend)
        frames = model.metadata.features.frames(samples)
        checkpoint = load_trained_model(config, Layout(config).train_run.best, frames.shape[1], 29)
        expected = family.utterance(checkpoint, normalized(checkpoint, frames[None])).numpy()[
            0
        ]  # the chunked computation
        assert len(expected) == -(-len(frames) // 4)
        # int8 weights in the TFLite model: close, not equal
        atol = 0.5 if backend == "tflite" else 1e-4
        logits = model.logits(samples)
        np.testing.assert_allclose(logits, expected, atol=atol)
        stream = model.create_stream()
        for start in range(0, len(samples), 4321):
            stream.feed_audio(samples[start : start + 4321])
        np.testing.assert_allclose(stream.flush(), logits, atol=1e-6)
        assert model.transcribe_file(CLIP).duration_s > 0
    # Evaluate scores the chunked computation the client runs (its transcripts are the client's), and the
    # full-context one beside
    layout = Layout(config)
    report = json.loads(layout.evaluation_report(layout.evaluate_dir).read_text())
    assert report["cer_full_context"] is not None and report["wer_full_context"] is not None
    test_data = read_cache(layout.features_cache("test"), config.features)
    alphabet = model_alphabet(config, layout.alphabet)
    evaluated = {}
    run_split(checkpoint, test_data, alphabet, 8, on_logits=evaluated.__setitem__)
    model = Model(export, backend="saved_model")
    for index, path in enumerate(test_data.paths):
        np.testing.assert_allclose(model.logits(load_for_model(path, 16000)), evaluated[index], atol=1e-4)
    cli = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(CLIP), "--json"],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    words = json.loads(cli.stdout)["transcripts"][0]["words"]
    assert all(word["duration"] >= 0.04 - 1e-9 for word in words)  # a label is 4 frames of 10 ms
    assert model.metadata.seconds_per_label == pytest.approx(0.04)
