"""Real corpora in, end to end (issue 22): a LibriSpeech-layout folder and a Common Voice MP3 release, made
of the sample corpus's speech, go through Import -> Features -> Train (tiny) -> LanguageModel -> Evaluate
from the corpus templates (configs/librispeech.yaml, configs/common_voice.yaml) with no CSV written by
hand: the LibriSpeech one as a user runs it (``deepspeech-train Evaluate --config``), the Common Voice one
through Luigi in this process."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import luigi
import pytest
import yaml

from pipeline.config_loader import load_config
from pipeline.features.cache import cache_summary
from pipeline.layout import Layout
from tasks import Evaluate
from tests import corpus_layouts
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tasks_in_process")]
SPLITS = ("train", "dev", "test")
COUNTS = {"train": 24, "dev": 8, "test": 8}


def _tiny(template: str, work_dir: Path, corpus: dict) -> dict:
    """A config extending a corpus template, with a tiny model and a quick LM and decoder."""
    return {
        "extends": str(ROOT / "configs" / template),
        "paths": {"work_dir": str(work_dir)},
        "data": {"corpora": [corpus]},
        "features": {"workers": 1},
        "model": {"n_hidden": 32, "dropout_rate": 0.0},
        "training": {"epochs": 1, "batch_size": 4, "dev_batch_size": 8, "report_count": 2},
        "early_stop": {"rule": "off"},
        "export": {"quantize": False},
        "augment": {"speed_factors": []},
        "decoder": {"lm_builder": "python", "lm_order": 3, "beam_width": 16},
    }


def _check_run(config_path: Path, key: str, speakers: dict[str, int], dropped: dict[str, int]) -> None:
    """The import's report and manifests (no speaker in two splits), the feature caches built from them,
    Evaluate's report, and no CSV anywhere but the stages' outputs."""
    config = load_config(config_path)
    assert config.data.train_files == config.data.dev_files == config.data.test_files == ()
    layout = Layout(config)
    files = layout.import_files(key)
    report = json.loads(files.report.read_text())
    assert report["dropped_by_reason"] == dropped
    assert {split: report["splits"][split]["utterances"] for split in SPLITS} == COUNTS
    assert {split: report["splits"][split]["speakers"] for split in SPLITS} == speakers
    assert report["speakers_in_several_splits"] == {}
    found = {}
    for split in SPLITS:
        with open(files.manifest(split), newline="", encoding="utf-8") as handle:
            found[split] = {row["speaker"] for row in csv.DictReader(handle)}
    assert len(set.union(*found.values())) == sum(len(s) for s in found.values()), found  # no speaker twice
    for split in SPLITS:
        assert cache_summary(layout.features_cache(split))["samples"] == COUNTS[split]
    evaluation = json.loads(Layout.evaluation_report(layout.evaluate_dir).read_text())
    assert {"wer", "cer", "loss", "wer_lm", "cer_lm"} <= set(evaluation)
    assert len(evaluation["samples"]) > 0
    work = Path(config.paths.work_dir)
    stray = [p for p in config_path.parent.rglob("*.csv") if work not in p.parents]
    assert stray == []


def test_librispeech_layout_end_to_end_from_the_command_line(tmp_path):
    corpus_layouts.librispeech_speech(tmp_path / "corpus", COUNTS)  # corpus/LibriSpeech/...
    config = tmp_path / "librispeech.yaml"
    config.write_text(
        yaml.safe_dump(
            _tiny(
                "librispeech.yaml",
                tmp_path / "work",
                {
                    "importer": "librispeech",
                    "path": "corpus",
                    "train": ["train-clean-100"],
                },
            )
        )
    )
    command = Path(sys.executable).parent / "deepspeech-train"
    run = [str(command)] if command.exists() else [sys.executable, "-m", "tasks.cli"]
    result = subprocess.run(
        [*run, "Evaluate", "--config", str(config), "--local-scheduler"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _check_run(config, "librispeech-corpus", {"train": 6, "dev": 2, "test": 2}, {})


def test_common_voice_mp3_release_end_to_end_through_luigi(tmp_path):
    """48 kHz MP3 clips resampled to 16 kHz by Features (the template's features.resample: true); one
    train row whose clip the release lost is dropped by the import (1 of 25: under
    data.max_reject_fraction)."""
    folder = corpus_layouts.common_voice_speech(tmp_path / "cv", COUNTS)
    config = tmp_path / "common_voice.yaml"
    config.write_text(
        yaml.safe_dump(
            _tiny(
                "common_voice.yaml",
                tmp_path / "work",
                {
                    "importer": "common_voice",
                    "path": str(folder.parent),  # the release folder: its one language is found
                },
            )
        )
    )
    assert luigi.build([Evaluate(config=str(config))], local_scheduler=True)
    _check_run(
        config,
        "common_voice-cv-corpus-17.0-2024-03-15",
        {"train": 6, "dev": 2, "test": 2},
        {"missing_file": 1},
    )
