"""Multilingual LibriSpeech (OpenSLR 94): ``<root>/{train,dev,test}/transcripts.txt`` with one
``<speaker>_<book>_<utterance>\\t<transcript>`` line per utterance, the audio in
``<part>/audio/<speaker>/<book>/<id>.flac`` (``.opus`` in the Opus releases, read as they are).

``path`` is a language folder (``mls_french``, ``mls_english_opus``, ...). Official splits: the
three parts.
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

PARTS = ("train", "dev", "test")
AUDIO_SUFFIXES = (".flac", ".opus")


class MultilingualLibriSpeech(CorpusImporter):
    """The MLS layout (a ``transcripts.txt`` per part, audio by speaker and book)."""

    name = "mls"

    def parts(self, root: Path, options) -> list[str]:
        """The parts with a ``transcripts.txt``."""
        return [p.name for p in sorted_dirs(root) if (p / "transcripts.txt").is_file()]

    def default_splits(self, root: Path, options) -> dict[str, list[str]]:
        """train, dev and test: the parts of those names."""
        found = self.parts(root, options)
        return {split: [split] if split in found else [] for split in PARTS}

    def listing(self, root: Path, parts: list[str], options) -> Iterator[Path | os.DirEntry]:
        """Each part's ``transcripts.txt`` and audio files."""
        for part in parts:
            yield root / part / "transcripts.txt"
            yield from walk(root / part / "audio", AUDIO_SUFFIXES)

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """The lines of ``<part>/transcripts.txt`` in file order."""
        transcripts = root / part / "transcripts.txt"
        suffix = _audio_suffix(root / part / "audio")
        for number, line in text_lines(transcripts):
            source = f"{transcripts}:{number}"
            if isinstance(line, UnicodeDecodeError):
                yield bad_encoding(source, line)
                continue
            if not line.strip():
                continue
            ident, tab, text = line.partition("\t")
            fields = ident.split("_")
            if not tab or len(fields) != 3:
                yield Dropped(
                    source, "malformed_row", "expected <speaker>_<book>_<utterance><TAB><transcript>"
                )
                continue
            speaker, book, _ = fields
            audio = root / part / "audio" / speaker / book / f"{ident}{suffix}"
            yield Utterance(str(audio), text, speaker, source)


def _audio_suffix(audio: Path) -> str:
    """``.opus`` when the first audio file found is Opus, else ``.flac`` (one release is one format)."""
    for speaker in sorted_dirs(audio)[:1]:
        for book in sorted_dirs(speaker)[:1]:
            with os.scandir(book) as entries:
                for entry in entries:
                    if entry.name.endswith(".opus"):
                        return ".opus"
                    if entry.name.endswith(".flac"):
                        return ".flac"
    return ".flac"


IMPORTER = MultilingualLibriSpeech()
