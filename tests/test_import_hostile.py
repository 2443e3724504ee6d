"""What a hostile round found in the importers (issue 37, rows 2-5, 8-10, 12): audio changed at the same
size, piped Kaldi commands and where they run, symbolic links (duplicates and loops), transcripts that
are not UTF-8, tab-separated Kaldi tables, NaN segments, and TED-LIUM lines without a label."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import soundfile
import yaml

from pipeline.data.importing import CorpusSpec, import_fingerprint, plan_import
from tests import corpus_layouts
from tests.conftest import ALPHABET
from tests.test_importers import run

CP1252 = "Café crème".encode("cp1252")  # b"Caf\xe9 cr\xe8me": not UTF-8


def _rerecord(audio):
    """Overwrite the last samples of ``audio`` with other bytes: the same size, other content and a later
    modification time, as a file re-recorded at the same length is."""
    data = bytearray(audio.read_bytes())
    stat = audio.stat()
    data[-256:] = bytes(b ^ 0x55 for b in data[-256:])
    audio.write_bytes(bytes(data))
    os.utime(audio, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
    assert audio.stat().st_size == stat.st_size


# (importer, layout, the audio file to re-record relative to the path the layout returns)
LAYOUTS = {
    "librispeech": (corpus_layouts.librispeech, "LibriSpeech/dev-clean/84/121123/84-121123-0000.flac"),
    "mls": (corpus_layouts.mls, "dev/audio/1591/1127/1591_1127_000003.opus"),
    "common_voice": (lambda root: corpus_layouts.common_voice(root)[0], "clips/d1.mp3"),
    "tedlium": (corpus_layouts.tedlium, "legacy/dev/sph/Speaker1_2010X.sph"),
    "timit": (corpus_layouts.timit, "TIMIT/TEST/DR1/FADG0/SX4.WAV"),
    "mailabs": (corpus_layouts.mailabs, "by_book/male/elliot_miller/pink_fairy/wavs/pf_01_f000001.wav"),
    "kaldi": (corpus_layouts.kaldi, "../../audio/rec1.wav"),
    "folder": (corpus_layouts.folder, "alice/001.wav"),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_rerecorded_file_of_the_same_size_makes_a_new_import(tmp_path, name):
    """Row 2: every importer's listing covers every audio file it reads (Kaldi's named in wav.scp too)."""
    make, audio = LAYOUTS[name]
    path = make(tmp_path / "corpus")
    plan = plan_import(CorpusSpec(name, path, fractions={"train": 1.0}))
    before = import_fingerprint(plan)
    _rerecord((path / audio).resolve())
    assert import_fingerprint(plan) != before


def _kaldi_with_commands(tmp_path, extra: str):
    path = corpus_layouts.kaldi(tmp_path)
    (path / "wav.scp").write_text((path / "wav.scp").read_text() + extra)
    return path


def test_a_piped_command_runs_again_when_the_file_it_names_changes(tmp_path):
    """Row 2: the kept output of a piped command is keyed by the files the command names: a source that
    grew from 4 s to 6 s gives a new output (the old one was reused), and a new import fingerprint."""
    path = corpus_layouts.kaldi(tmp_path)
    options = {"run_commands": True}
    plan = plan_import(CorpusSpec("kaldi", path, fractions={"train": 1.0}, options=options))
    before = import_fingerprint(plan)
    run(tmp_path / "first", "kaldi", path, fractions={"train": 1.0}, options=options)
    corpus_layouts.tone(tmp_path / "audio" / "rec1.wav", 6.0, 400, subtype="PCM_16")
    assert import_fingerprint(plan) != before
    report, rows, _ = run(tmp_path / "second", "kaldi", path, fractions={"train": 1.0}, options=options)
    faster = [r for r in rows["train"] if r[1] == "faster"]
    assert len(faster) == 1
    outputs = sorted((tmp_path / "second" / "converted").iterdir())
    assert len(outputs) == 1 and abs(soundfile.info(outputs[0]).duration - 6.0 / 1.1) < 0.01


def test_a_command_that_names_no_file_runs_at_every_import(tmp_path):
    """Row 2: a command whose inputs the import cannot see (no word of it is a file) is never cached."""
    path = _kaldi_with_commands(tmp_path, "rec4 cd ../../audio && sox rec1.wav -t wav - speed 1.1 |\n")
    lines = (path / "segments").read_text() + "spk3-rec4-a rec4 0.00 -1\n"
    (path / "segments").write_text(lines)
    (path / "text").write_text((path / "text").read_text() + "spk3-rec4-a HIDDEN SOURCE\n")
    (path / "utt2spk").write_text((path / "utt2spk").read_text() + "spk3-rec4-a spk3\n")
    spec = {"fractions": {"train": 1.0}, "options": {"run_commands": True}}
    _, rows, rejects = run(tmp_path, "kaldi", path, **spec)
    assert rejects == [] and [r[1:4] for r in rows["train"] if r[4] == "spk3"] == [("hidden source", "", "")]
    corpus_layouts.tone(tmp_path / "audio" / "rec1.wav", 6.0, 400, subtype="PCM_16")
    _, rows, _ = run(tmp_path, "kaldi", path, **spec)
    hidden = next(r[0] for r in rows["train"] if r[4] == "spk3")
    assert abs(soundfile.info(tmp_path / "converted" / hidden).duration - 6.0 / 1.1) < 0.01


def test_commands_and_relative_paths_are_taken_in_the_data_directory(tmp_path, monkeypatch):
    """Row 9: a relative name in a command and a plain relative wav.scp path both mean a file beside the
    data directory, whatever the process's working directory."""
    path = corpus_layouts.kaldi(tmp_path)
    (path / "wav.scp").write_text(
        "rec1 ../../audio/rec1.wav\nrec2 flac -c -d -s ../../audio/rec2.flac |\n"
        "rec3 sox ../../audio/rec1.wav -t wav - speed 1.1 |\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    _, rows, rejects = run(tmp_path, "kaldi", path, fractions={"train": 1.0}, options={"run_commands": True})
    assert rejects == []
    assert [r[1] for r in rows["train"]] == ["first segment", "second segment", "from the flac", "faster"]


def test_kaldi_tables_separated_by_tabs(tmp_path):
    """Row 8: Kaldi's tables are split at any whitespace, tabs included."""
    spaced = corpus_layouts.kaldi(tmp_path / "spaces")
    tabbed = corpus_layouts.kaldi(tmp_path / "tabs")
    for name in ("wav.scp", "text", "segments", "utt2spk"):
        lines = (tabbed / name).read_text().splitlines()
        (tabbed / name).write_text("".join(line.replace(" ", "\t", 1) + "\n" for line in lines))
    (tabbed / "segments").write_text((tabbed / "segments").read_text().replace(" ", "\t \t"))
    _, expected, _ = run(tmp_path / "spaces", "kaldi", spaced, fractions={"train": 1.0})
    _, rows, rejects = run(tmp_path / "tabs", "kaldi", tabbed, fractions={"train": 1.0})
    assert rows == expected and len(rows["train"]) == 3
    assert rejects == [("piped_command", "data/train/wav.scp:3")]


def test_a_nan_in_kaldi_segments_is_dropped_with_a_reason(tmp_path):
    """Row 10: NaN start or end drops that segment (as inf and negative times are); the import goes on."""
    path = corpus_layouts.kaldi(tmp_path)
    (path / "segments").write_text(
        "spk1-rec1-a rec1 nan 1.50\nspk1-rec1-b rec1 1.50 NaN\n"
        "spk2-rec2-a rec2 0.50 2.50\nspk2-rec3-a rec3 0 1\n"
    )
    report, rows, rejects = run(tmp_path, "kaldi", path, fractions={"train": 1.0})
    assert [r[1] for r in rows["train"]] == ["from the flac"]
    assert rejects[:2] == [("malformed_row", "data/train/text:1"), ("malformed_row", "data/train/text:2")]
    assert report["dropped_by_reason"]["malformed_row"] == 2


def test_a_symlinked_speaker_folder_is_imported_once(tmp_path):
    """Row 3: ``carol -> alice`` gives one row per real file (by resolved path), the duplicates counted in
    the report (not as rejects); no audio is in two splits whatever the speaker names say."""
    path = corpus_layouts.folder(tmp_path, speakers=40)
    (path / "carol").symlink_to(path / "alice", target_is_directory=True)
    (path / "speaker000" / "again.wav").symlink_to(path / "speaker001" / "a.wav")
    (path / "speaker000" / "again.txt").write_text("the same file again\n")
    report, rows, rejects = run(tmp_path, "folder", path, fractions={"train": 0.5, "test": 0.5})
    assert not any("carol" in r[4] for split in rows for r in rows[split])
    assert report["duplicate_audio"] == 3 and report["dropped_by_reason"]["duplicate_audio"] == 3
    assert sorted(reason for reason, _ in rejects) == ["duplicate_audio"] * 3 + ["missing_transcript"]
    assert all("duplicate_audio" not in found for found in report["rejected_by_split"].values())
    assert report["kept"] == 3 + 40 and report["kept"] + report["dropped"] == report["rows"]


def test_a_symlinked_file_and_its_target_in_two_splits_are_imported_once(tmp_path):
    """Row 3: the split check compares resolved audio: a file linked into another speaker's folder lands
    in one split only."""
    path = corpus_layouts.folder(tmp_path, speakers=40)
    resolved = {}
    for index in range(1, 40):
        link = path / f"speaker{index:03d}" / "linked.wav"
        link.symlink_to(path / "speaker000" / "a.wav")
        (link.with_suffix(".txt")).write_text("utterance of speaker 0\n")
    report, rows, _ = run(tmp_path, "folder", path, fractions={"train": 0.5, "test": 0.5})
    for split in rows:
        for name, _, _, _, speaker in rows[split]:
            resolved.setdefault(os.path.realpath(path / speaker / name), set()).add(split)
    assert all(len(splits) == 1 for splits in resolved.values())
    assert report["duplicate_audio"] == 39


def _loop_config(tmp_path):
    path = corpus_layouts.folder(tmp_path)
    (path / "alice" / "loop").symlink_to(path, target_is_directory=True)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "paths": {"work_dir": str(tmp_path / "work"), "alphabet": str(ALPHABET)},
                "data": {"corpora": [{"importer": "folder", "path": str(path)}]},
            }
        )
    )
    return path, config


def test_a_symlink_loop_is_one_line_naming_it(tmp_path):
    """Row 5: a link back up the tree is one line naming it, from the listing Luigi's complete() makes
    and from the import itself, never a traceback."""
    from pipeline.config import ConfigError
    from pipeline.config_loader import load_config
    from pipeline.data.importers import CorpusLayoutError
    from pipeline.data.importing import import_corpus
    from pipeline.layout import Layout, forget_corpus_listings

    path, config = _loop_config(tmp_path)
    forget_corpus_listings()
    layout = Layout(load_config(config))
    with pytest.raises(
        ConfigError, match=rf"data.corpora\[0\]: {path / 'alice' / 'loop'}: a symbolic link loop"
    ):
        layout.import_fingerprint(next(iter(layout.corpora)))
    forget_corpus_listings()
    with pytest.raises(CorpusLayoutError, match=rf"{path / 'alice' / 'loop'}: a symbolic link loop"):
        import_corpus(plan_import(CorpusSpec("folder", path)), tmp_path / "out")
    assert not (tmp_path / "out" / "report.json").exists()


def test_a_symlink_loop_fails_the_run_in_one_line(tmp_path):
    """Row 5 through the command: the Import task fails naming the loop; no traceback is printed."""
    path, config = _loop_config(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "Imports", "--config", str(config), "--local-scheduler"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"{path / 'alice' / 'loop'}: a symbolic link loop" in result.stderr


def _bad_text(path, line: int | None = None):
    """Make ``path`` CP1252 text: the whole file, or line ``line`` (1-based) with " café" added."""
    if line is None:
        path.write_bytes(CP1252 + b"\n")
        return
    lines = path.read_bytes().splitlines(keepends=True)
    lines[line - 1] = (lines[line - 1].decode("utf-8").rstrip("\r\n") + " café\n").encode("cp1252")
    path.write_bytes(b"".join(lines))


# importer: (layout, file to spoil relative to the layout's path, line or None for the whole file)
BAD_TEXT = {
    "folder": (corpus_layouts.folder, "alice/001.txt", None),
    "kaldi": (corpus_layouts.kaldi, "text", 3),
    "librispeech": (corpus_layouts.librispeech, "LibriSpeech/train-clean-100/19/198/19-198.trans.txt", 2),
    "mls": (corpus_layouts.mls, "train/transcripts.txt", 2),
    "mailabs": (corpus_layouts.mailabs, "by_book/female/judy_bieber/ozma/metadata.csv", 1),
    "timit": (corpus_layouts.timit, "TIMIT/TRAIN/DR1/FCJF0/SX4.TXT", None),
    "common_voice": (lambda root: corpus_layouts.common_voice(root)[0], "train.tsv", 3),
    "tedlium": (corpus_layouts.tedlium, "legacy/train/stm/Speaker0_2010X.stm", 2),
}


@pytest.mark.parametrize("name", sorted(BAD_TEXT))
def test_a_non_utf8_transcript_is_a_reject_naming_it(tmp_path, name):
    """Row 4: a transcript that is not UTF-8 is a ``bad_encoding`` reject naming its file (and line) in
    every importer, and only that row is lost: the rest of the corpus is imported as before."""
    make, spoiled, line = BAD_TEXT[name]
    spec = {"fractions": {"train": 1.0}} if name in ("folder", "kaldi", "mailabs") else {}
    clean, _, _ = run(tmp_path / "clean", name, make(tmp_path / "clean" / "corpus"), **spec)
    path = make(tmp_path / "bad" / "corpus")
    _bad_text(path / spoiled, line)
    report, _, rejects = run(tmp_path / "bad", name, path, **spec)
    source = str((path / spoiled).relative_to(tmp_path / "bad")) + (f":{line}" if line else "")
    assert ("bad_encoding", source) in rejects, rejects
    assert report["dropped_by_reason"]["bad_encoding"] == 1
    assert report["kept"] == clean["kept"] - 1 and report["rows"] == clean["rows"]


def test_a_byte_order_mark_is_fine(tmp_path):
    """Row 4: a UTF-8 byte-order mark before a transcript is not part of it."""
    path = corpus_layouts.folder(tmp_path)
    (path / "bob" / "001.txt").write_bytes(b"\xef\xbb\xbfBob speaks\n")
    (path / "alice" / "001.txt").write_bytes(b"\xef\xbb\xbfCaf\xc3\xa9\n")
    _, rows, rejects = run(tmp_path, "folder", path, fractions={"train": 1.0})
    assert [r[1] for r in rows["train"]] == ["café", "general kenobi", "bob speaks"]
    assert rejects == [("missing_transcript", "recordings/bob/002.wav")]


def test_the_bad_encoding_reject_says_what_is_wrong(tmp_path):
    """Row 4: the reject's detail names the file and the byte, and how to fix it."""
    import csv

    path = corpus_layouts.folder(tmp_path)
    _bad_text(path / "alice" / "001.txt")
    run(tmp_path, "folder", path, fractions={"train": 1.0})
    with open(tmp_path / "import" / "folder" / "rejects.csv", newline="", encoding="utf-8") as handle:
        found = [r for r in csv.DictReader(handle) if r["reason"] == "bad_encoding"]
    assert len(found) == 1 and found[0]["audio"] == str(path / "alice" / "001.wav")
    assert found[0]["detail"].startswith(f"{path / 'alice' / '001.txt'}: not UTF-8 text (byte 0xe9")


def test_tedlium_a_line_without_a_label_whose_first_word_is_unk(tmp_path):
    """Row 12: the STM columns decide: ``<unk>`` first on a line without a label is a word, so the
    segment is dropped with unk: drop (and loses only that word with unk: remove); a real label is not."""
    path = corpus_layouts.tedlium(tmp_path)
    stm = path / "legacy" / "train" / "stm" / "Speaker0_2010X.stm"
    stm.write_text(
        "Speaker0_2010X 1 Speaker0_2010X 0.00 1.50 <unk> was here\n"
        "Speaker0_2010X 1 Speaker0_2010X 1.50 3.00 <o,f0,male> <unk> again\n"
        "Speaker0_2010X 1 Speaker0_2010X 3.00 4.00 no label at all\n"
    )
    report, rows, rejects = run(tmp_path, "tedlium", path)
    assert [r[1] for r in rows["train"]] == ["no label at all"]
    assert [r for r in rejects if "Speaker0" in r[1]] == [
        ("unknown_word", "TEDLIUM_release-3/legacy/train/stm/Speaker0_2010X.stm:1"),
        ("unknown_word", "TEDLIUM_release-3/legacy/train/stm/Speaker0_2010X.stm:2"),
    ]
    _, rows, _ = run(tmp_path / "remove", "tedlium", path, options={"unk": "remove"})
    assert [r[1] for r in rows["train"]] == ["was here", "again", "no label at all"]
