"""Builds small corpora on disk for tests: good rows from the sample corpus plus every kind of bad row."""

from __future__ import annotations

import csv
import shutil
import wave
from pathlib import Path

import numpy as np
import soundfile

from tests.conftest import SAMPLE


def sample_rows(split: str = "train", count: int = 4) -> list[tuple[Path, str]]:
    """(audio path, transcript) of the first ``count`` rows of a sample split."""
    with open(SAMPLE / f"{split}.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))[:count]
    return [(SAMPLE / row["wav_filename"], row["transcript"]) for row in rows]


def write_manifest(
    path: Path, rows: list[tuple[str, str]], header=("wav_filename", "wav_filesize", "transcript")
) -> Path:
    """Write a DeepSpeech CSV; rows are (file name relative to the CSV, transcript)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for name, transcript in rows:
            file = path.parent / name
            writer.writerow([name, file.stat().st_size if file.exists() else 0, transcript])
    return path


def bad_corpus(folder: Path) -> tuple[Path, dict[str, str]]:
    """A manifest with 3 good rows and one row of each bad kind;
    returns (csv, {file name: expected reason})."""
    folder.mkdir(parents=True, exist_ok=True)
    rows, expected = [], {}
    for index, (audio, transcript) in enumerate(sample_rows(count=3)):
        name = f"good{index}.flac"
        shutil.copy(audio, folder / name)
        rows.append((name, transcript))
    speech, rate = soundfile.read(sample_rows(count=1)[0][0], dtype="int16")

    def bad(name, transcript, reason):
        rows.append((name, transcript))
        expected[name] = reason

    bad("missing.wav", "where is it", "missing_file")
    with wave.open(str(folder / "header_only.wav"), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(16000)
    assert (folder / "header_only.wav").stat().st_size == 44
    bad("header_only.wav", "nothing here", "empty_audio")
    soundfile.write(folder / "rate8k.wav", speech[::2], 8000, subtype="PCM_16")
    bad("rate8k.wav", "too slow a rate", "wrong_sample_rate")
    soundfile.write(folder / "stereo.wav", np.stack([speech, speech], axis=1), rate, subtype="PCM_16")
    bad("stereo.wav", "two channels", "too_many_channels")
    (folder / "noise.wav").write_bytes(b"this is not audio at all" * 10)
    bad("noise.wav", "not audio", "unreadable_audio")
    shutil.copy(sample_rows(count=1)[0][0], folder / "accents.flac")
    bad("accents.flac", "café naïve", "unknown_characters")
    soundfile.write(folder / "short.wav", speech[:1600], rate, subtype="PCM_16")
    bad(
        "short.wav",
        "this transcript is far too long for a tenth of a second of audio",
        "too_short_for_transcript",
    )
    shutil.copy(sample_rows(count=1)[0][0], folder / "silent_text.flac")
    bad("silent_text.flac", "   ", "empty_transcript")
    manifest = write_manifest(folder / "bad.csv", rows)
    with open(manifest, "a") as handle:
        handle.write("onlyonefield.wav\n")
    expected["onlyonefield.wav"] = "malformed_row"
    return manifest, expected
