"""LibriSpeech (OpenSLR 12): ``<root>/<part>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt``, one
``<utterance id> <TRANSCRIPT>`` line per utterance, the audio in ``<utterance id>.flac`` beside it.

``path`` may be the ``LibriSpeech`` folder itself or the folder that holds it. The official splits
are the standard ones: train = the ``train-*`` parts present, dev = ``dev-clean``, test =
``test-clean`` (``dev-other``/``test-other`` when named).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from pipeline.data.importers import (
    CorpusImporter,
    Dropped,
    Row,
    Utterance,
    bad_encoding,
    sorted_dirs,
    text_lines,
    walk,
)

TRAIN_PARTS = ("train-clean-100", "train-clean-360", "train-other-500")
TRANSCRIPT_SUFFIX = ".trans.txt"


class LibriSpeech(CorpusImporter):
    """The LibriSpeech layout (parts of speaker/chapter folders with ``.trans.txt`` files and FLAC)."""

    name = "librispeech"

    def locate(self, path: Path) -> Path:
        """``path``, or ``path/LibriSpeech`` when that is where the parts are."""
        root = super().locate(path)
        inner = root / "LibriSpeech"
        return inner if inner.is_dir() and not self.parts(root, None) else root

    def parts(self, root: Path, options) -> list[str]:
        """Every folder of ``root`` whose name is a LibriSpeech part (``train-*``, ``dev-*``, ``test-*``)."""
        return [p.name for p in sorted_dirs(root) if p.name.startswith(("train-", "dev-", "test-"))]

    def default_splits(self, root: Path, options) -> dict[str, list[str]]:
        """train: the ``train-*`` parts present; dev: ``dev-clean``; test: ``test-clean``."""
        found = self.parts(root, options)
        return {
            "train": [p for p in found if p.startswith("train-")],
            "dev": [p for p in ("dev-clean",) if p in found],
            "test": [p for p in ("test-clean",) if p in found],
        }

    def listing(self, root: Path, parts: list[str], options) -> Iterator[os.DirEntry]:
        """The transcript and FLAC files of ``parts``."""
        for part in parts:
            yield from walk(root / part, (TRANSCRIPT_SUFFIX, ".flac"))

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """The utterances of ``part``, speaker by speaker and chapter by chapter (sorted)."""
        for speaker in sorted_dirs(root / part):
            for chapter in sorted_dirs(speaker):
                transcripts = chapter / f"{speaker.name}-{chapter.name}{TRANSCRIPT_SUFFIX}"
                if not transcripts.is_file():
                    yield Dropped(
                        str(chapter), "missing_transcript", f"no {transcripts.name} in this chapter"
                    )
                    continue
                yield from read_transcripts(transcripts, speaker.name, ".flac")


def read_transcripts(transcripts: Path, speaker: str, suffix: str) -> Iterator[Row]:
    """The rows of one ``.trans.txt`` (``<id> <text>`` per line), audio ``<id><suffix>`` beside it; a
    line that is not UTF-8 is dropped as ``bad_encoding``."""
    for number, line in text_lines(transcripts):
        source = f"{transcripts}:{number}"
        if isinstance(line, UnicodeDecodeError):
            yield bad_encoding(source, line)
            continue
        if not line.strip():
            continue
        ident, _, text = line.strip().partition(" ")
        if not text.strip():
            yield Dropped(source, "empty_transcript", f"utterance {ident} has no transcript")
            continue
        yield Utterance(str(transcripts.parent / f"{ident}{suffix}"), text, speaker, source)


IMPORTER = LibriSpeech()
