"""The export's model card: MODEL_CARD.md and metadata.json's ``card``, filled from export.card and the
stages' reports, in the manifest of every export; its keys' place in the fingerprints and the DAG."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from native_client.metadata import ExportError, load_metadata, verify_manifest
from pipeline.config_loader import config_from_dict, load_config
from pipeline.dag import upstream
from pipeline.layout import Layout
from pipeline.reports import EvaluationReport, TrainReport, read_report
from pipeline.stages.evaluate import evaluate_stage
from pipeline.stages.export import export_stage
from pipeline.stages.language_model import language_model_stage
from pipeline.stages.train import train_stage
from tests.conftest import build_features, small_config_text

CARD = {
    "name": "sample-en",
    "version": "1.2.0",
    "language": "en-US",
    "license": "MPL-2.0",
    "author": "Example Lab",
    "contact": "asr@example.org",
    "description": "A tiny model of the synthetic sample corpus.",
    "training_data": "Sentences spoken by espeak-ng.",
}


def front_matter(path) -> dict:
    """The YAML between the card's two ``---`` lines."""
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained one epoch, its LM and Evaluate run (greedy and beam), and two configs: the
    plain one and one with export.card filled in (evaluation on)."""
    directory = tmp_path_factory.mktemp("card")
    (directory / "base.yaml").write_text(
        small_config_text(directory / "work", limit_train=8, limit_dev=4, limit_test=4, n_hidden=32)
    )
    plain = directory / "plain.yaml"
    plain.write_text(
        textwrap.dedent(f"""
        extends: base.yaml
        training: {{epochs: 1}}
        decoder: {{beam_width: 16}}
        paths: {{export_dir: {directory / "plain-export"}}}
        """)
    )
    card = directory / "card.yaml"
    card.write_text(
        "extends: plain.yaml\n"
        + yaml.safe_dump(
            {
                "export": {"card": {**CARD, "evaluation": True}},
                "paths": {"export_dir": str(directory / "out")},
            }
        )
    )
    config = load_config(plain)
    build_features(config)
    layout = Layout(config)
    train_stage(layout)
    language_model_stage(layout)
    evaluate_stage(layout, beam=True)
    return layout, Layout(load_config(card))


def test_the_card_holds_the_configured_fields_and_the_reports_figures(trained):
    plain, layout = trained
    assert layout.train_fingerprint == plain.train_fingerprint
    assert layout.evaluate_fingerprint == plain.evaluate_fingerprint
    export = export_stage(layout).root
    card_file = export / "MODEL_CARD.md"
    assert front_matter(card_file) == {
        "author": "Example Lab",
        "model_name": "sample-en",
        "model_version": "1.2.0",
        "contact_info": "asr@example.org",
        "license": "MPL-2.0",
        "language": "en-US",
        "runtime": "tflite",
    }
    metadata = load_metadata(export)
    card = metadata.raw["card"]
    assert metadata.files["model_card"] == "MODEL_CARD.md"
    train = read_report(layout.train_run.report, TrainReport)
    assert train.train_audio_hours > 0
    assert card["training_data"]["hours"] == round(train.train_audio_hours, 3)
    assert card["training_data"]["samples"] == train.train_samples == 8
    assert card["training"]["best_dev"]["wer"] == train.best_dev.wer
    evaluation = read_report(layout.evaluation_report(layout.evaluate_dir), EvaluationReport)
    assert card["evaluation"]["greedy"] == {"wer": evaluation.wer, "cer": evaluation.cer}
    assert card["evaluation"]["with_decoder"] == {"wer": evaluation.wer_lm, "cer": evaluation.cer_lm}
    assert card["evaluation"]["decoder"] == evaluation.decoder_lm
    assert card["evaluation"]["decoder"]["beam_width"] == 16
    text = card_file.read_text(encoding="utf-8")
    assert f"{train.train_audio_hours:.2f} hours in 8 utterances" in text
    assert "Test, beam decoder (" in text and f"WER {evaluation.wer_lm:.4f}" in text
    assert "Sentences spoken by espeak-ng." in text and CARD["description"] in text
    # In the manifest like every other file: an edited card is refused.
    verify_manifest(export)
    card_file.write_text(text.replace("MPL-2.0", "CC0-1.0"), encoding="utf-8")
    with pytest.raises(ExportError, match="MODEL_CARD.md"):
        verify_manifest(export)


def test_an_export_without_card_settings_has_a_card_too(trained):
    layout, _ = trained
    export = export_stage(layout).root
    assert front_matter(export / "MODEL_CARD.md") == {
        "author": "",
        "model_name": "plain",
        "model_version": "1",
        "contact_info": "",
        "license": "",
        "language": "und",
        "runtime": "tflite",
    }
    card = json.loads((export / "metadata.json").read_text())["card"]
    assert card["evaluation"] is None and card["training_data"]["manifests"] == ["train.csv"]
    assert (
        "Test: not in this card (`export.card.evaluation: false`)" in (export / "MODEL_CARD.md").read_text()
    )
    verify_manifest(export, ["MODEL_CARD.md"])


def test_the_card_refuses_figures_of_another_checkpoint(trained):
    _, layout = trained
    latest = read_report(layout.train_run.report, TrainReport).latest_checkpoint
    with pytest.raises(ValueError, match=r"evaluation.json: evaluates .*best.*the export is of .*ckpt"):
        export_stage(layout, checkpoint=latest)


def test_card_keys_left_unset_move_no_fingerprint_and_set_ones_move_the_exports_only():
    base = Layout(config_from_dict({}))
    same = Layout(config_from_dict({"export": {"card": {}, "onnx": False}}))
    assert same.export_fingerprint == base.export_fingerprint
    assert upstream(base.config, "export") == upstream(same.config, "export")
    for key, value in (("license", "MIT"), ("language", "de-DE"), ("evaluation", True)):
        other = Layout(config_from_dict({"export": {"card": {key: value}}}))
        assert other.export_fingerprint != base.export_fingerprint, key
        assert other.train_fingerprint == base.train_fingerprint
    assert ("evaluate", {}) in upstream(
        config_from_dict({"export": {"card": {"evaluation": True}}}), "export"
    )
    assert ("evaluate", {}) not in upstream(base.config, "export")
    assert Layout(config_from_dict({"export": {"onnx": True}})).export_fingerprint != base.export_fingerprint


def test_an_unknown_card_key_is_one_line_naming_it():
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=r"export.card.licence: unknown key; did you mean 'license'\?"):
        config_from_dict({"export": {"card": {"licence": "MIT"}}})
