"""A corpus importer of a user's own: ``<root>/<part>.tsv``, one line per utterance (clip, speaker and
transcript, separated by tabs), the audio in ``<root>/clips/<clip>``. Parts named ``train``, ``dev`` and
``test`` are the official splits; otherwise the import splits by speaker. A line without three fields is
dropped as ``malformed_row``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from pipeline.data.importers import CorpusImporter, Dropped, Row, Utterance, bad_encoding, text_lines, walk

SPLITS = ("train", "dev", "test")


class TsvPairs(CorpusImporter):
    """Tab-separated lists of clips with their speaker and transcript."""

    name = "tsv_pairs"

    def parts(self, root: Path, options) -> list[str]:
        """The ``.tsv`` files of ``root``, by name without the suffix."""
        return sorted(path.stem for path in root.glob("*.tsv"))

    def default_splits(self, root: Path, options) -> dict[str, list[str]] | None:
        """``train``, ``dev`` and ``test`` when all three are there; else None (split by speaker)."""
        found = self.parts(root, options)
        return {split: [split] for split in SPLITS} if set(SPLITS) <= set(found) else None

    def listing(self, root: Path, parts: list[str], options) -> Iterator[Path | os.DirEntry]:
        """The parts' lists and the clips folder's audio."""
        yield from (root / f"{part}.tsv" for part in parts)
        yield from walk(root / "clips", (".flac", ".wav"))

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """The lines of ``<part>.tsv``."""
        path = root / f"{part}.tsv"
        for number, line in text_lines(path):
            source = f"{path}:{number}"
            if isinstance(line, UnicodeDecodeError):
                yield bad_encoding(source, line)
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                yield Dropped(source, "malformed_row", f"expected clip, speaker and transcript, got {line!r}")
                continue
            clip, speaker, transcript = fields
            yield Utterance(str(root / "clips" / clip), transcript, speaker, source)


IMPORTER = TsvPairs()
