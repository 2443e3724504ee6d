"""export.coqui_tflite: our models in the DeepSpeech 0.9 / Coqui STT .tflite layout, loaded back through the
client's DeepSpeech path."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest
import soundfile

from native_client import Model
from native_client.alphabet import load_alphabet
from native_client.decoders.greedy import log_softmax
from native_client.runtime import make_runner
from pipeline.config import ConfigError
from pipeline.config_loader import config_from_dict, load_config
from pipeline.export.coqui_tflite import write_coqui_tflite
from pipeline.features.frontend import feature_pipeline
from pipeline.layout import Layout
from pipeline.model import build_model
from pipeline.model.checkpoints import warm_start
from pipeline.stages.export import export_stage
from pipeline.stages.train import train_stage
from tests.conftest import ROOT, build_features, small_config_text

ARMENIAN = ROOT / "data" / "armenian"


def operators(path) -> dict:
    """{builtin or custom operator name: version} of a flatbuffer, and its weights' quantisation."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(path.read_bytes(), 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    found = {}
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        name = (
            code.CustomCode().decode()
            if code.CustomCode()
            else names[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        )
        found[name] = code.Version()
    return found


def test_the_armspeech_model_round_trips_bit_for_bit(armspeech_model, tmp_path):
    """.tflite -> init_from into the deepspeech family -> export.coqui_tflite -> the client: same numbers."""
    config = config_from_dict(
        {
            "paths": {"alphabet": str(ARMENIAN / "alphabet.txt")},
            "features": {"type": "deepspeech"},
            "export": {"coqui_tflite": True, "quantize": True},
            "decoder": {"beam_width": 500},
        }
    )
    alphabet = load_alphabet(ARMENIAN / "alphabet.txt")
    model = build_model(config.model, 26, alphabet.n_classes)
    warm_start(model, armspeech_model, 0, config, alphabet)
    path = tmp_path / "output_graph.tflite"
    write_coqui_tflite(model, feature_pipeline(config.features), alphabet, path, 16, 500, True)

    original, exported = Model(armspeech_model), Model(path)
    assert exported.metadata.alphabet == original.metadata.alphabet
    assert exported.metadata.decoder == {"beam_width": 500} and exported.metadata.raw["graph_version"] == 6
    for name in ("input_node", "previous_state_c", "previous_state_h", "input_samples"):
        assert list(exported.runner._inputs[name]["shape"]) == list(original.runner._inputs[name]["shape"])
    assert set(original.runner._outputs) - set(exported.runner._outputs) == {
        "Minimum_2",
        "Minimum_3",
        "metadata_language",
    }
    # Their runtimes' operators, at versions no newer than the published model's: fully connected version 3
    # (per-tensor int8 weights, float inputs), custom AudioSpectrogram and Mfcc.
    ours, theirs = operators(path), operators(armspeech_model)
    assert ours.keys() == theirs.keys() and ours["FULLY_CONNECTED"] == 3
    assert all(ours[name] <= theirs[name] for name in ours), (ours, theirs)
    for index in range(4):
        samples = soundfile.read(ARMENIAN / f"{index:02d}.flac", dtype="int16")[0]
        np.testing.assert_array_equal(exported.logits(samples), original.logits(samples))


def test_the_export_stage_writes_it_and_the_client_runs_it(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(
        small_config_text(tmp_path / "work", limit_train=8, limit_dev=4, limit_test=4, n_hidden=32)
    )
    path = tmp_path / "coqui.yaml"
    path.write_text(
        textwrap.dedent(f"""
        extends: base.yaml
        features: {{type: deepspeech, normalize: false}}
        training: {{epochs: 1}}
        export: {{coqui_tflite: true, card: {{language: hy-AM, license: CC-BY-4.0}}}}
        paths: {{export_dir: {tmp_path / "export"}}}
    """)
    )
    config = load_config(path)
    build_features(config, ("train", "dev"))
    train_stage(Layout(config))
    export = export_stage(Layout(config))
    coqui = export.root / "output_graph.tflite"
    assert coqui.is_file() and Model(export.root).metadata.files["coqui_tflite"] == "output_graph.tflite"
    assert Counter(op for op in operators(coqui))["Mfcc"] == 1

    ours, theirs = Model(export.root), Model(coqui)
    assert (
        theirs.metadata.n_context == ours.metadata.n_context
        and theirs.metadata.alphabet == ours.metadata.alphabet
    )
    # Their metadata_language comes from the model card, as the card's own front matter.
    assert theirs.metadata.raw["language"] == "hy-AM" == ours.metadata.raw["card"]["language"]
    rng = np.random.default_rng(1)
    windows = rng.normal(0, 5, (1, 16, 19, 26)).astype(np.float32)
    runner = make_runner(ours.metadata)
    state = tuple(rng.normal(0, 0.3, s["shape"]).astype(np.float32) for s in ours.metadata.state)
    ours_logits, ours_state = runner.step(windows, state)
    theirs_logits, theirs_state = theirs.runner.step(windows, state)  # the same (h, c) order
    np.testing.assert_allclose(theirs_logits, log_softmax(ours_logits), atol=1e-4)
    for a, b in zip(theirs_state, ours_state, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    clip = str(ROOT / "data" / "sample" / "test" / "00000.flac")
    result = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(coqui), "--audio", clip],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "section, values, message",
    [
        ("features", {"type": "mfcc"}, "features.type: the Coqui layout needs deepspeech"),
        ("features", {"type": "deepspeech", "normalize": True}, "features.normalize: their client does not"),
        (
            "features",
            {"type": "deepspeech", "filterbank_channels": 32},
            "keep the deepspeech front end's defaults",
        ),
        ("features", {"type": "deepspeech", "winlen": 0.0320625}, "not a whole number of milliseconds"),
    ],
)
def test_config_refuses_what_their_client_cannot_run(section, values, message):
    with pytest.raises(ConfigError) as error:
        config_from_dict({section: values, "export": {"coqui_tflite": True}})
    assert str(error.value).startswith("<dict>: export.coqui_tflite: features.") and message in str(
        error.value
    )


def test_config_refuses_byte_outputs_in_their_layout():
    with pytest.raises(ConfigError, match=r"export.coqui_tflite: .*model.output 'bytes'"):
        config_from_dict(
            {
                "features": {"type": "deepspeech", "normalize": False},
                "model": {"output": "bytes"},
                "export": {"coqui_tflite": True},
            }
        )
