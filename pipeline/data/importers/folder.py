"""A folder of audio files, each with its transcript in a same-name ``.txt`` beside it
(``hello.flac`` + ``hello.txt``), in any sub-folders.

When the folder holds ``train/``, ``dev/`` and/or ``test/`` those are its parts and its official
splits; otherwise it is one part, ``all``, split by speaker. The speaker of a file is the first
folder under its part (``alice/day1/001.wav`` is alice's), or, for a file directly in the part,
the file's own name (nothing else tells who speaks: every such file is then its own speaker).

Audio files are those libsndfile reads (``.wav .flac .mp3 .ogg .opus .sph .aiff .au``) and those
converted once at import (``.wv .amr .m4a``, see ``pipeline.data.convert``). A ``.txt`` without
audio is ignored; audio without a ``.txt`` is dropped as ``missing_transcript``, and audio whose
``.txt`` is not UTF-8 as ``bad_encoding``. The transcript is the whole text file (lines joined by
spaces). Folders reached through symbolic links are read (a link back to a folder above it is an
error naming it); the same file reached twice is imported once (``pipeline.data.importing``).
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
    check_not_a_loop,
    folder_identity,
    read_text,
    sorted_dirs,
    walk,
)

AUDIO_SUFFIXES = (
    ".wav",
    ".flac",
    ".mp3",
    ".ogg",
    ".opus",
    ".sph",
    ".aif",
    ".aiff",
    ".au",
    ".wv",
    ".amr",
    ".m4a",
)
SPLIT_FOLDERS = ("train", "dev", "test")


@dataclass(frozen=True)
class FolderOptions:
    """Options of the folder importer."""

    audio_suffixes: tuple[str, ...] = AUDIO_SUFFIXES  # which files are audio (lower-case suffixes)


class Folder(CorpusImporter):
    """Audio files with same-name ``.txt`` transcripts."""

    name = "folder"
    Options = FolderOptions

    def parts(self, root: Path, options) -> list[str]:
        """``train``/``dev``/``test`` when present, else ``all`` (the whole folder)."""
        found = [p.name for p in sorted_dirs(root) if p.name in SPLIT_FOLDERS]
        return found or ["all"]

    def default_splits(self, root: Path, options) -> dict[str, list[str]] | None:
        """The ``train``/``dev``/``test`` folders when the folder has them, else None (split by speaker)."""
        found = self.parts(root, options)
        if found == ["all"]:
            return None
        return {split: [split] if split in found else [] for split in SPLIT_FOLDERS}

    def _part_folder(self, root: Path, part: str) -> Path:
        return root if part == "all" else root / part

    def listing(self, root: Path, parts: list[str], options) -> Iterator[os.DirEntry]:
        """The audio and ``.txt`` files of ``parts``."""
        for part in parts:
            yield from walk(self._part_folder(root, part), (*options.audio_suffixes, ".txt"))

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """Every audio file of ``part`` (folders and files in name order)."""
        folder = self._part_folder(root, part)
        yield from self._walk(folder, folder, options, frozenset({folder_identity(folder)}))

    def _walk(self, part_folder: Path, folder: Path, options, above: frozenset) -> Iterator[Row]:
        with os.scandir(folder) as entries:
            listed = sorted((entry.name, entry.is_dir()) for entry in entries)
        names = {name for name, _ in listed}
        for name, is_dir in listed:
            path = folder / name
            if is_dir:
                check_not_a_loop(path, above)
                yield from self._walk(part_folder, path, options, above | {folder_identity(path)})
                continue
            if not name.lower().endswith(tuple(options.audio_suffixes)):
                continue
            relative = path.relative_to(part_folder)
            speaker = relative.parts[0] if len(relative.parts) > 1 else path.stem
            transcript = Path(name).stem + ".txt"
            if transcript not in names:
                yield Dropped(str(path), "missing_transcript", f"no {transcript} beside it", str(path))
                continue
            text = read_text(folder / transcript)
            if isinstance(text, UnicodeDecodeError):
                yield bad_encoding(str(folder / transcript), text, str(path))
                continue
            yield Utterance(str(path), self.transcript(text), speaker, f"{folder / transcript}:1")

    def transcript(self, text: str) -> str:
        """The transcript of an audio file whose ``.txt`` holds ``text``: its lines joined by spaces."""
        return " ".join(line.strip() for line in text.splitlines())


IMPORTER = Folder()
