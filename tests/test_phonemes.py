"""A multitask ``targets: phonemes`` task's manifests: espeak-ng's IPA of its ``of`` task's transcripts."""

from __future__ import annotations

import csv
import shutil
import textwrap

import pytest

from pipeline.config_loader import load_config
from pipeline.data.phonemes import (
    PhonemizerError,
    check_voice,
    espeak_version,
    phoneme_voice,
    phonemes,
    phonemize,
)
from pipeline.layout import Layout
from pipeline.reports import PhonemesReport, read_report
from pipeline.stages.phonemes import phonemes_intact, phonemes_stage
from tests.corpus_factory import sample_rows

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")


def test_espeak_ngs_ipa_becomes_a_transcript_of_phonemes():
    # espeak-ng writes a clause per line, stress marks before syllables, liaison marks in French
    assert phonemes("ðə kˈæt sˈæt\nɔnðə mˈæt\n") == "ðə kæt sæt ɔnðə mæt"
    assert phonemes("lə- kafˈe ɛ pʁˈɛ\n") == "lə kafe ɛ pʁɛ"
    assert phonemes("ˈ\n") == ""
    assert list(phonemize(["the cat", "", "le café, la forêt"], "en-us", workers=2))[:2] == ["ðə kæt", ""]
    assert list(phonemize(["le café, la forêt"], "fr")) == ["lə kafe la foʁɛ"]
    assert phoneme_voice("en-US") == "en-us" and phoneme_voice("") == "en"
    with pytest.raises(PhonemizerError, match=r"espeak-ng has no voice 'xx-nowhere'"):
        check_voice("xx-nowhere")


def test_the_phonemes_stage_keeps_every_row_of_the_of_task_in_order(tmp_path):
    rows = sample_rows("train", 3)
    manifest = tmp_path / "en.csv"
    with open(manifest, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["wav_filename", "wav_filesize", "transcript"])
        writer.writerow([rows[0][0], rows[0][0].stat().st_size, "The CAT, sat!"])
        writer.writerow([rows[1][0], rows[1][0].stat().st_size, "  ...  "])  # nothing left: empty
        handle.write("only-one-field.wav\n")  # malformed: kept, empty, for Features to reject
        writer.writerow([rows[2][0].name, 0, rows[2][1]])  # relative to the manifest's folder: made absolute
    shutil.copy(rows[2][0], tmp_path / rows[2][0].name)
    path = tmp_path / "phones.yaml"
    path.write_text(
        textwrap.dedent(f"""
        paths: {{work_dir: {tmp_path / "work"}}}
        multitask:
          tasks:
            - {{name: en, data: {{train_files: [{manifest}], text: {{language: en-us}}}}}}
            - {{name: ph, targets: phonemes, of: en, export: false}}
        """)
    )
    layout = Layout(load_config(path)).for_task("ph")
    report = phonemes_stage(layout)
    assert isinstance(report, PhonemesReport) and phonemes_intact(layout.phonemes_files)
    assert (report.of, report.voice, report.rows, report.empty) == ("en", "en-us", {"train": 4}, {"train": 2})
    # espeak-ng's version is recorded here, not in the fingerprint (tests/test_machine_independence.py)
    assert report.espeak == espeak_version() and report.espeak.startswith("eSpeak NG text-to-speech: ")
    with open(layout.phonemes_files.manifest("train"), newline="", encoding="utf-8") as handle:
        written = list(csv.DictReader(handle))
    assert [row["transcript"] for row in written[:3]] == ["ðə kæt sæt", "", ""]
    assert written[0]["wav_filename"] == str(rows[0][0])
    assert written[3]["wav_filename"] == str(tmp_path / rows[2][0].name) and written[3]["transcript"]
    assert layout.split_manifests("train") == (str(layout.phonemes_files.manifest("train")),)
    assert layout.split_manifests("dev") == ()
    assert read_report(layout.phonemes_files.report, PhonemesReport) == report
    # the task's stages follow its of task's manifest
    before = (layout.fingerprint("phonemes"), layout.features_fingerprint("train"))
    with open(manifest, "a", encoding="utf-8") as handle:
        handle.write(f"{rows[0][0]},0,one more row\n")
    after = Layout(load_config(path)).for_task("ph")
    assert after.fingerprint("phonemes") != before[0] and after.features_fingerprint("train") != before[1]
