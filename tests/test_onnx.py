"""export.onnx: model.onnx (the streaming step, state in and out) converted by tf2onnx and run by
onnxruntime in the client; its logits against the TFLite export's, the CLI with --model model.onnx."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from native_client import Model
from native_client.metadata import verify_manifest
from native_client.runtime import OnnxRunner, TFLiteRunner
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.stages.export import export_stage
from pipeline.stages.train import train_stage
from tests.conftest import ROOT, SAMPLE, build_features, small_config_text

pytest.importorskip("tf2onnx", reason="the onnx extra is not installed (pip install -e '.[onnx]')")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install -e '.[onnx]')")

CLIPS = [SAMPLE / "test" / f"{i:05d}.flac" for i in range(3)]
# Float ONNX against float TFLite: the same arithmetic in another order (measured: 4e-7 at most on the
# sample geometry, logits up to 0.56).
FLOAT_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A tiny model trained one epoch, exported in float with export.onnx."""
    directory = tmp_path_factory.mktemp("onnx")
    (directory / "base.yaml").write_text(
        small_config_text(directory / "work", limit_train=8, limit_dev=4, limit_test=4, n_hidden=32)
    )
    path = directory / "onnx.yaml"
    path.write_text(
        textwrap.dedent(f"""
        extends: base.yaml
        training: {{epochs: 1}}
        export: {{onnx: true, quantize: false}}
        paths: {{export_dir: {directory / "export"}}}
        """)
    )
    config = load_config(path)
    build_features(config, ("train", "dev"))
    train_stage(Layout(config))
    return export_stage(Layout(config)).root


def test_the_onnx_models_logits_equal_the_tflite_exports(export):
    import soundfile

    assert (export / "model.onnx").is_file()
    verify_manifest(export, ["model.onnx"])
    default, onnx = Model(export), Model(export, backend="onnx")
    # An export that lists model.onnx still runs its TFLite model unless asked.
    assert isinstance(default.runner, TFLiteRunner) and isinstance(onnx.runner, OnnxRunner)
    assert onnx.metadata.files["onnx"] == "model.onnx"
    for clip in CLIPS:
        samples = soundfile.read(clip, dtype="int16")[0]
        ours, theirs = onnx.logits(samples), default.logits(samples)
        assert ours.shape == theirs.shape and ours.shape[0] > 16  # several calls: the state is carried
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=FLOAT_TOLERANCE)


def test_the_client_transcribes_with_model_onnx(export):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def transcribe(model) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "native_client", "--model", str(model), "--no-scorer"]
            + [arg for clip in CLIPS for arg in ("--audio", str(clip))],
            capture_output=True,
            text=True,
            env=env,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    text = transcribe(export / "model.onnx")
    assert text == transcribe(export) and len(text.splitlines()) == len(CLIPS)
    result = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export / "model.onnx"), "--backend", "tflite"]
        + ["--audio", str(CLIPS[0])],
        capture_output=True,
        text=True,
        env=env,
    )
    assert (
        result.returncode == 2
        and "model.onnx: a model of the onnx backend, but --backend tflite was given" in result.stderr
    )


def test_the_server_serves_model_onnx(export):
    """deepspeech-serve --model model.onnx: one batch-1 onnxruntime call per stream (the ONNX model has
    batch 1); POST /stt answers the client's --json object of the same model."""
    import json
    import re
    import urllib.request

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    model = str(export / "model.onnx")
    server = subprocess.Popen(
        [sys.executable, "-m", "native_client.server.cli", "--model", model, "--port", "0", "--no-scorer"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines = []
        for line in server.stderr:
            lines.append(line)
            if found := re.search(r"listening on ws://127\.0\.0\.1:(\d+)/", line):
                break
        else:
            raise AssertionError("the server did not start:\n" + "".join(lines))
        assert "one model call per stream (the model has no batched signature)" in line
        request = urllib.request.Request(
            f"http://127.0.0.1:{found.group(1)}/stt", data=CLIPS[1].read_bytes(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            posted = json.loads(response.read())
    finally:
        server.terminate()
        server.wait(timeout=30)
    client = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", model, "--no-scorer", "--json"]
        + ["--audio", str(CLIPS[1])],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    expected = json.loads(client.stdout)
    assert posted["text"] == expected["text"] and posted["transcripts"] == expected["transcripts"]


def test_a_streamed_conformer_converts_to_onnx(tmp_path):
    """The Conformer's streaming step (chunk with look-back frames, attention and convolution caches) through
    the same tf2onnx conversion: its one-shot and streamed logits equal the float TFLite model's."""
    import soundfile
    import tensorflow as tf

    from pipeline.features.frontend import feature_pipeline
    from pipeline.model import build_model
    from pipeline.model.weights import named_weights

    config = load_config(
        ROOT / "configs" / "sample.yaml",
        {
            "paths": {"work_dir": str(tmp_path / "work"), "export_dir": str(tmp_path / "export")},
            "features": {"type": "mfcc", "normalize": False},
            "model": {
                "architecture": "conformer",
                "conformer": {
                    "d_model": 32,
                    "heads": 2,
                    "layers": 2,
                    "conv_kernel": 5,
                    "subsampling_channels": 8,
                },
            },
            "export": {"onnx": True, "quantize": False},
        },
    )
    model = build_model(config.model, feature_pipeline(config.features).feature_size, 29)
    prefix = tf.train.Checkpoint(weights=named_weights(model)).write(str(tmp_path / "ckpt" / "untrained"))
    export = export_stage(Layout(config), checkpoint=prefix, with_lm=False).root
    onnx, default = Model(export, backend="onnx"), Model(export)
    samples = soundfile.read(CLIPS[0], dtype="int16")[0]
    theirs = default.logits(samples)
    assert len(theirs) > 3 * config.model.options.chunk_frames  # several calls: the caches are carried
    np.testing.assert_allclose(onnx.logits(samples), theirs, rtol=0, atol=FLOAT_TOLERANCE)
    stream = onnx.create_stream()
    for start in range(0, len(samples), 2345):
        stream.feed_audio(samples[start : start + 2345])
    np.testing.assert_allclose(stream.flush(), theirs, rtol=0, atol=FLOAT_TOLERANCE)
