"""The Alphabet stage (``paths.alphabet: auto``): built from the normalised training transcripts, rare
characters left out and reported with the rows they cost, digest-checked, fingerprinted, in the DAG."""

from __future__ import annotations

import csv
import unicodedata
from pathlib import Path

import pytest

from pipeline.config_loader import config_from_dict
from pipeline.dag import upstream
from pipeline.layout import Layout
from pipeline.model.labels import alphabet_intact, model_alphabet
from pipeline.reports import AlphabetReport, ReportError, read_report
from pipeline.stages.alphabet import alphabet_stage
from tests.conftest import SAMPLE

SENTENCES = [
    "Le café est prêt.",
    unicodedata.normalize("NFD", "L'ÉLÈVE a noté"),
    "Où est la forêt ?",
    unicodedata.normalize("NFD", "Noël à la plage"),
]
# Each sentence twice (in both normal forms), then one ø (below a minimum count of 2, on line 10) and a row
# of nothing but digits and punctuation (rejected: the configs here reject digits).
FRENCH = [
    *SENTENCES,
    *(unicodedata.normalize("NFD", s) for s in SENTENCES),
    "Noël à la forêt, Søren",
    "1 2 3 !",
]


def _manifest(path: Path, transcripts: list[str]) -> Path:
    """A manifest of ``transcripts``; the Alphabet stage reads only the transcripts, so one sample clip
    stands for every row."""
    clip = SAMPLE / "test" / "00000.flac"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["wav_filename", "wav_filesize", "transcript"])
        writer.writerows((str(clip), clip.stat().st_size, text) for text in transcripts)
    return path


def _config(tmp_path: Path, **data):
    manifest = _manifest(tmp_path / "train.csv", data.pop("transcripts", FRENCH))
    return config_from_dict(
        {
            "paths": {"work_dir": str(tmp_path / "work"), "alphabet": "auto"},
            "data": {"train_files": [str(manifest)], "text": {"digits": "reject"}, **data},
        }
    )


def test_the_alphabet_holds_each_letter_once_whatever_the_normal_form(tmp_path):
    layout = Layout(_config(tmp_path))
    report = alphabet_stage(layout)
    alphabet = model_alphabet(layout.config, layout.alphabet)
    assert alphabet.labels[0] == " " and list(alphabet.labels[1:]) == sorted(alphabet.labels[1:])
    assert set(alphabet.labels) == set(" 'acefglnoprstvàèéêëøù")
    assert report.labels == alphabet.size and report.rows == 10 and report.rows_rejected == {"digits": 1}
    assert not report.dropped and report.rows_lost == 0
    assert [c["char"] for c in report.characters] == list(alphabet.labels)
    assert {c["char"]: c["count"] for c in report.characters}["é"] == 6
    assert layout.alphabet == layout.alphabet_files.alphabet and alphabet_intact(layout.alphabet_files)
    assert alphabet_stage(layout) == report  # intact: read back, not rebuilt


def test_characters_under_the_minimum_are_left_out_with_the_rows_they_cost(tmp_path):
    layout = Layout(_config(tmp_path, alphabet_min_count=2))
    report = alphabet_stage(layout)
    assert "ø" not in model_alphabet(layout.config, layout.alphabet).labels
    assert report.dropped == [
        {
            "char": "ø",
            "codepoint": "U+00F8",
            "name": "LATIN SMALL LETTER O WITH STROKE",
            "count": 1,
            "rows": 1,
        }
    ]
    assert report.rows_lost == 1 and report.rows_lost_examples == [f"{tmp_path / 'train.csv'}:10"]
    saved = read_report(layout.alphabet_files.report, AlphabetReport)
    assert saved.dropped[0]["char"] == "ø" and saved.min_count == 2


def test_an_edited_alphabet_is_refused_naming_the_file_and_rebuilt(tmp_path):
    layout = Layout(_config(tmp_path))
    alphabet_stage(layout)
    files = layout.alphabet_files
    files.alphabet.write_text(files.alphabet.read_text(encoding="utf-8") + "x\n", encoding="utf-8")
    assert not alphabet_intact(files)
    with pytest.raises(
        ReportError, match=rf"{files.alphabet}: its SHA-256 differs .*make rerun STAGE=Alphabet"
    ):
        model_alphabet(layout.config, layout.alphabet)
    alphabet_stage(Layout(layout.config))
    assert "x" not in model_alphabet(layout.config, layout.alphabet).labels


def test_no_training_text_is_a_clear_error(tmp_path):
    layout = Layout(_config(tmp_path, transcripts=["1 2", "?"]))
    with pytest.raises(ValueError, match=r"paths.alphabet: auto found no training transcripts .*2 rows read"):
        alphabet_stage(layout)
    assert not layout.alphabet_files.report.exists()


def test_fingerprints_follow_the_text_settings_and_the_stage_is_upstream_of_the_readers(tmp_path):
    config = _config(tmp_path)
    layout = Layout(config)
    for stage, params in (
        ("features", {"split": "train"}),
        ("features", {"split": "test"}),
        ("lm", {}),
        ("train", {}),
        ("export", {}),
        ("evaluate", {}),
    ):
        assert ("alphabet", {}) in upstream(config, stage, params), stage
    kept_case = Layout(_config(tmp_path, text={"digits": "reject", "case": "keep"}))
    min_count = Layout(_config(tmp_path, alphabet_min_count=3))
    fingerprints = {
        layout.fingerprint("alphabet"),
        kept_case.fingerprint("alphabet"),
        min_count.fingerprint("alphabet"),
    }
    assert len(fingerprints) == 3
    assert layout.features_fingerprint("test") != min_count.features_fingerprint("test")  # through upstream
    # A hand-written alphabet or byte outputs: no Alphabet stage.
    assert not any(
        name == "alphabet" for name, _ in upstream(config_from_dict({}), "features", {"split": "train"})
    )
    as_bytes = config_from_dict({"paths": {"alphabet": "auto"}, "model": {"output": "bytes"}})
    assert (
        not as_bytes.alphabet_auto
        and type(model_alphabet(as_bytes, Layout(as_bytes).alphabet)).__name__ == "ByteAlphabet"
    )
