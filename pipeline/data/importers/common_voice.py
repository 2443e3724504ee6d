"""Mozilla Common Voice, any release from v4 on: ``<root>/{train,dev,test,validated,...}.tsv`` and the
MP3 clips in ``<root>/clips/``; ``path`` is one language's folder (``cv-corpus-17.0-2024-03-15/fr``).

The TSVs are read by their header: only ``client_id`` (the speaker), ``path`` (the clip) and
``sentence`` are needed, whatever other columns a release adds (``up_votes``, ``accents``,
``variant``, ``locale``, ``segment``, ``sentence_id``, ``sentence_domain``, ...). Fields are split
on tabs alone: sentences hold unbalanced quotes and commas, so no quote character is special,
except that a field written whole in double quotes with doubled quotes inside (a CSV writer's
quoting) is unquoted. A clip name without a suffix gets ``.mp3`` (early releases).

Official splits: ``train``, ``dev``, ``test``. With ``train_from_validated: true`` the training
split is ``validated.tsv`` instead (several times larger), minus every clip of a speaker who has a
clip in ``dev.tsv`` or ``test.tsv`` (dropped as ``held_out_speaker``), so no voice is in two splits;
that hold-out applies whenever ``validated`` is imported, unless ``hold_out_dev_test_speakers: false``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.data.importers import (
    CorpusImporter,
    CorpusLayoutError,
    Dropped,
    Row,
    Utterance,
    bad_encoding,
    sorted_dirs,
    text_lines,
    walk,
)

NEEDED_COLUMNS = ("client_id", "path", "sentence")
KNOWN_PARTS = ("train", "dev", "test", "validated", "invalidated", "other")


@dataclass(frozen=True)
class CommonVoiceOptions:
    """Options of the Common Voice importer."""

    train_from_validated: bool = False  # train on validated.tsv (minus dev/test speakers), not train.tsv
    hold_out_dev_test_speakers: bool = True  # validated.tsv without the speakers of dev.tsv and test.tsv


class CommonVoice(CorpusImporter):
    """The Common Voice layout (TSVs beside a ``clips`` folder of MP3 files)."""

    name = "common_voice"
    SELECTIONS = frozenset({"held_out_speaker"})
    Options = CommonVoiceOptions

    def locate(self, path: Path) -> Path:
        """``path``, or its one language folder when ``path`` is a release folder holding just one."""
        root = super().locate(path)
        if self.parts(root, None):
            return root
        languages = [
            p for p in sorted_dirs(root) if (p / "validated.tsv").is_file() or (p / "train.tsv").is_file()
        ]
        return languages[0] if len(languages) == 1 else root

    def parts(self, root: Path, options) -> list[str]:
        """The TSVs present among the release's utterance lists (``reported.tsv`` etc. are not)."""
        return [part for part in KNOWN_PARTS if (root / f"{part}.tsv").is_file()]

    def default_splits(self, root: Path, options) -> dict[str, list[str]]:
        """The release's own train/dev/test TSVs (``validated`` for train with ``train_from_validated``)."""
        found = self.parts(root, options)
        train = "validated" if options.train_from_validated else "train"
        return {
            split: [part] if part in found else []
            for split, part in (("train", train), ("dev", "dev"), ("test", "test"))
        }

    def listing(self, root: Path, parts: list[str], options) -> Iterator[Path | os.DirEntry]:
        """The TSVs of ``parts`` (and dev/test when they hold speakers out) and the clips folder's files."""
        tsvs = set(parts)
        if "validated" in parts and options.hold_out_dev_test_speakers:
            tsvs |= {"dev", "test"}
        for part in sorted(tsvs):
            yield root / f"{part}.tsv"
        yield from walk(root / "clips")

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """The rows of ``<part>.tsv`` in file order."""
        held_out: set[str] = set()
        if part == "validated" and options.hold_out_dev_test_speakers:
            for other in ("dev", "test"):
                if (root / f"{other}.tsv").is_file():
                    held_out |= {row.speaker for row in read_tsv(root, other) if isinstance(row, Utterance)}
        for row in read_tsv(root, part):
            if isinstance(row, Utterance) and row.speaker in held_out:
                yield Dropped(
                    row.source, "held_out_speaker", "speaker has clips in dev.tsv or test.tsv", row.audio
                )
            else:
                yield row


def _unquote(field: str) -> str:
    if len(field) >= 2 and field[0] == field[-1] == '"' and '"' not in field[1:-1].replace('""', ""):
        return field[1:-1].replace('""', '"')
    return field


def read_tsv(root: Path, part: str) -> Iterator[Row]:
    """The rows of one Common Voice TSV as utterances (clips under ``root/clips``) or dropped rows."""
    tsv = root / f"{part}.tsv"
    if not tsv.is_file():
        raise CorpusLayoutError(f"{tsv}: no such file")
    lines = text_lines(tsv)
    _, header_line = next(lines, (1, ""))
    if isinstance(header_line, UnicodeDecodeError):
        raise CorpusLayoutError(f"{tsv}:1: the header is not UTF-8 text")
    header = header_line.split("\t")
    missing = [name for name in NEEDED_COLUMNS if name not in header]
    if missing:
        raise CorpusLayoutError(
            f"{tsv}:1: no column(s) {', '.join(missing)} in the header; a Common Voice TSV has "
            f"{', '.join(NEEDED_COLUMNS)} (found: {', '.join(header)})"
        )
    index = {name: header.index(name) for name in NEEDED_COLUMNS}
    for number, line in lines:
        source = f"{tsv}:{number}"
        if isinstance(line, UnicodeDecodeError):
            yield bad_encoding(source, line)
            continue
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            yield Dropped(
                source, "malformed_row", f"{len(fields)} tab-separated fields, expected {len(header)}"
            )
            continue
        clip = _unquote(fields[index["path"]]).strip()
        if not clip:
            yield Dropped(source, "malformed_row", "empty path field")
            continue
        if not Path(clip).suffix:
            clip += ".mp3"
        speaker = fields[index["client_id"]].strip()
        yield Utterance(str(root / "clips" / clip), _unquote(fields[index["sentence"]]), speaker, source)


IMPORTER = CommonVoice()
