"""M-AILABS speech data set: ``<root>/by_book/{male,female}/<speaker>/<book>/metadata.csv`` and
``<root>/by_book/mix/<book>/metadata.csv`` (several readers), each line
``<id>|<text>|<normalised text>``, the audio in ``wavs/<id>.wav`` beside it; ``path`` is one
language's folder (``en_US``, holding ``by_book``) or ``by_book`` itself.

There are no official splits: the import splits by speaker. A ``mix`` book counts as one speaker
(``mix/<book>``): its readers are not named, so a voice of a mix book may also read a named book.
The transcript is the normalised column (numbers written out) when the line has one
(``text_column: original`` takes the second column).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class MailabsOptions:
    """Options of the M-AILABS importer."""

    text_column: str = "normalized"  # normalized (third column, when present) or original (second)


class Mailabs(CorpusImporter):
    """The M-AILABS layout (books with ``metadata.csv`` and ``wavs/``, by gender and speaker)."""

    name = "mailabs"
    Options = MailabsOptions
    CHOICES = {"text_column": ("normalized", "original")}

    def locate(self, path: Path) -> Path:
        """The ``by_book`` folder: ``path/by_book`` or ``path`` itself."""
        root = super().locate(path)
        return root / "by_book" if (root / "by_book").is_dir() else root

    def parts(self, root: Path, options) -> list[str]:
        """The gender folders present (``female``, ``male``, ``mix``)."""
        return [p.name for p in sorted_dirs(root) if p.name in ("female", "male", "mix")]

    def listing(self, root: Path, parts: list[str], options) -> Iterator[os.DirEntry]:
        """The ``metadata.csv`` and WAV files of ``parts``."""
        for part in parts:
            yield from walk(root / part, ("metadata.csv", ".wav"))

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """The lines of every book's ``metadata.csv`` in ``part``, speaker by speaker, book by book."""
        if part == "mix":
            books = [(f"mix/{book.name}", book) for book in sorted_dirs(root / part)]
        else:
            books = [
                (speaker.name, book) for speaker in sorted_dirs(root / part) for book in sorted_dirs(speaker)
            ]
        for speaker, book in books:
            metadata = book / "metadata.csv"
            if not metadata.is_file():
                yield Dropped(str(book), "missing_transcript", "no metadata.csv in this book folder")
                continue
            yield from _read_metadata(metadata, speaker, options)


def _read_metadata(metadata: Path, speaker: str, options) -> Iterator[Row]:
    for number, line in text_lines(metadata):
        source = f"{metadata}:{number}"
        if isinstance(line, UnicodeDecodeError):
            yield bad_encoding(source, line)
            continue
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) < 2 or not fields[0].strip():
            yield Dropped(source, "malformed_row", "expected <id>|<text>|<normalised text>")
            continue
        text = (
            fields[2]
            if options.text_column == "normalized" and len(fields) > 2 and fields[2].strip()
            else fields[1]
        )
        audio = metadata.parent / "wavs" / f"{fields[0].strip()}.wav"
        yield Utterance(str(audio), text, speaker, source)


IMPORTER = Mailabs()
