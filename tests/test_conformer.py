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

from native_client import ExportError, Model
from native_client.audio import load_for_model
from pipeline.config import ConfigError
from pipeline.config_loader import config_from_dict, load_config
from pipeline.layout import Layout
from pipeline.model import build_model, model_family
from pipeline.model.checkpoints import load_trained_model
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
    base, hidden = (
        _conformer(),
        config_from_dict({"model": {"architecture": "conformer", "conformer": TINY, "n_hidden": 7}}),
    )
    assert Layout(base).train_fingerprint == Layout(hidden).train_fingerprint
    assert Layout(base).train_fingerprint != Layout(_conformer(layers=3)).train_fingerprint
    # 4 frames a label: the too-short check keeps other utterances than DeepSpeech's
    assert Layout(base).features_fingerprint("train") != Layout(config_from_dict({})).features_fingerprint(
        "train"
    )
    assert Layout(_conformer(subsampling=1)).features_fingerprint("train") == Layout(
        config_from_dict({})
    ).features_fingerprint("train")


@pytest.mark.parametrize("subsampling", [1, 2, 4, 8])
def test_an_utterance_gives_the_same_logits_alone_and_in_a_padded_batch(subsampling):
    config = _conformer(subsampling=subsampling)
    model, family = build_model(config.model, 26, 29), model_family("conformer")
    rng = np.random.default_rng(0)
    lengths = [37, 50, 41]
    batch = np.zeros((3, 50, 26), np.float32)
    for row, length in enumerate(lengths):
        batch[row, :length] = rng.standard_normal((length, 26))
    logits, output_lengths = family.forward(model, batch, tf.constant(lengths), training=False)
    assert list(output_lengths.numpy()) == [-(-n // subsampling) for n in lengths]
    for row, length in enumerate(lengths):
        alone = model(batch[row : row + 1, :length]).numpy()[0]
        assert alone.shape[0] == output_lengths[row]
        np.testing.assert_allclose(logits.numpy()[row, : len(alone)], alone, atol=1e-5)


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
    assert metadata["stride"] == 4 and metadata["streaming"] is None and metadata["tensors"]["state"] == []
    samples = load_for_model(CLIP, 16000)
    for backend in ("tflite", "saved_model", "frozen_graph"):
        model = Model(export, backend=backend)
        frames = model.metadata.features.frames(samples)
        checkpoint = load_trained_model(config, Layout(config).train_run.best, frames.shape[1], 29)
        expected = checkpoint(frames[None]).numpy()[0]
        assert len(expected) == -(-len(frames) // 4)
        # int8 weights in the TFLite model: close, not equal
        atol = 0.5 if backend == "tflite" else 1e-4
        np.testing.assert_allclose(model.logits(samples), expected, atol=atol)
        assert model.transcribe_file(CLIP).duration_s > 0
    with pytest.raises(ExportError, match="has no streaming form; transcribe whole utterances"):
        model.create_stream()
    cli = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(CLIP), "--json"],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    words = json.loads(cli.stdout)["transcripts"][0]["words"]
    assert all(word["duration"] >= 0.04 - 1e-9 for word in words)  # a label is 4 frames of 10 ms
    assert model.metadata.seconds_per_label == pytest.approx(0.04)
