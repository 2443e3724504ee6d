"""TED-LIUM 3 (OpenSLR 51; release 2 has the same part layout): talks in NIST SPHERE
(``<part>/sph/<talk>.sph``), cut into utterances by the segments of ``<part>/stm/<talk>.stm``.

``path`` is ``TEDLIUM_release-3`` (or ``TEDLIUM_release2``). A part is any folder, at most two
levels down, holding ``sph/`` and ``stm/``: ``legacy/train``, ``legacy/dev``, ``legacy/test``,
``speaker-adaptation/...`` and ``data`` in release 3; ``train``, ``dev``, ``test`` in release 2.
Official splits: ``legacy/{train,dev,test}`` (or ``{train,dev,test}``).

An STM line is ``<talk> <channel> <speaker> <start> <end> [<label>] <words>``, read by its columns:
the sixth is the label when it is bracketed (``<o,f0,male>``) and not a bracketed word of the corpus
(``<unk>``, which is the first word of a line without a label). Segments whose
words are ``ignore_time_segment_in_scoring`` are not speech to learn and are skipped (counted as
``ignored_segment``); ``;;`` lines are comments. The words are TED-LIUM's tokenisation, undone
here before the shared normalisation: noise marks (``{NOISE}``, ``[LAUGHTER]``) removed; split
contractions joined (``it 's`` -> ``it's``, ``do n't`` -> ``don't``, ``' 60s`` -> ``'60s``);
``<unk>`` (a word the transcribers did not resolve) drops the segment by default (``unk: drop``,
counted as ``unknown_word``), because a transcript without the word no longer matches its audio,
or is deleted from the text (``unk: remove``, as Kaldi's recipe does).
"""

from __future__ import annotations

import math
import os
import re
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

IGNORED = "ignore_time_segment_in_scoring"
_NOISE = re.compile(r"\{[^}]*\}|\[[^\]]*\]")
_SPLIT_SUFFIX = re.compile(r"(\w) '(\w)")  # they 're -> they're
_SPLIT_NT = re.compile(r"(\w) n't\b")  # do n't -> don't (treebank style)
_DANGLING = re.compile(r"(^|\s)' (\w)")  # ' 60s -> '60s
# The optional sixth STM column: <category,category,...> (TED-LIUM writes <o,f0,male>). A word of
# the transcript can look the same (<unk>), so a field counts as the label only when it is not one
# of the corpus's bracketed words.
_LABEL = re.compile(r"^<[^<>\s]*>$")
BRACKETED_WORDS = frozenset({"<unk>"})


@dataclass(frozen=True)
class TedliumOptions:
    """Options of the TED-LIUM importer."""

    unk: str = "drop"  # drop: skip segments holding <unk>; remove: delete the token


class Tedlium(CorpusImporter):
    """The TED-LIUM layout (SPHERE talks and STM segment files per part)."""

    name = "tedlium"
    SELECTIONS = frozenset({"ignored_segment", "unknown_word"})
    Options = TedliumOptions
    CHOICES = {"unk": ("drop", "remove")}

    def parts(self, root: Path, options) -> list[str]:
        """Folders (at most two levels under ``root``) with ``sph/`` and ``stm/``, as relative names."""
        found = []
        for first in sorted_dirs(root):
            for folder in [first, *sorted_dirs(first)]:
                if (folder / "sph").is_dir() and (folder / "stm").is_dir():
                    found.append(folder.relative_to(root).as_posix())
        return found

    def default_splits(self, root: Path, options) -> dict[str, list[str]]:
        """``legacy/<split>`` (release 3) or ``<split>`` (release 2) for train, dev and test."""
        found = self.parts(root, options)
        splits = {}
        for split in ("train", "dev", "test"):
            splits[split] = [p for p in (f"legacy/{split}", split) if p in found][:1]
        return splits

    def listing(self, root: Path, parts: list[str], options) -> Iterator[os.DirEntry]:
        """The STM and SPHERE files of ``parts``."""
        for part in parts:
            yield from walk(root / part / "stm", (".stm",))
            yield from walk(root / part / "sph", (".sph",))

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """The segments of every STM file of ``part``, talk by talk (sorted)."""
        with os.scandir(root / part / "stm") as entries:
            stms = sorted(Path(e.path) for e in entries if e.name.endswith(".stm"))
        for stm in stms:
            yield from self._segments(stm, root / part / "sph", options)

    def _segments(self, stm: Path, sph: Path, options) -> Iterator[Row]:
        for number, line in text_lines(stm):
            source = f"{stm}:{number}"
            if isinstance(line, UnicodeDecodeError):
                yield bad_encoding(source, line)
                continue
            fields = line.split()
            if not fields or fields[0].startswith(";;"):
                continue
            if len(fields) < 5:
                yield Dropped(
                    source, "malformed_row", "expected <talk> <channel> <speaker> <start> <end> <words>"
                )
                continue
            talk, _, speaker, start, end, *words = fields
            audio = str(sph / f"{talk}.sph")
            if words and is_label(words[0]):
                words = words[1:]
            text = " ".join(words)
            if text == IGNORED:
                yield Dropped(source, "ignored_segment", IGNORED, audio)
                continue
            try:
                offset, stop = float(start), float(end)
                if not (math.isfinite(offset) and math.isfinite(stop)):
                    raise ValueError
            except ValueError:
                yield Dropped(
                    source, "malformed_row", f"start {start!r} or end {end!r} is not a finite number", audio
                )
                continue
            if stop <= offset:
                yield Dropped(
                    source, "malformed_row", f"segment ends ({stop}) before it starts ({offset})", audio
                )
                continue
            if "<unk>" in words:
                if options.unk == "drop":
                    yield Dropped(
                        source, "unknown_word", "<unk> in the transcript (tedlium unk: drop)", audio
                    )
                    continue
                text = " ".join(word for word in words if word != "<unk>")
            yield Utterance(audio, join_tokens(text), speaker, source, offset, round(stop - offset, 6))


def is_label(field: str) -> bool:
    """Whether ``field``, the sixth column of an STM line, is its optional label (``<o,f0,male>``)
    rather than the first word of the transcript (``<unk>``)."""
    return bool(_LABEL.match(field)) and field.lower() not in BRACKETED_WORDS


def join_tokens(text: str) -> str:
    """TED-LIUM words as written text: noise marks removed, split contractions joined."""
    text = _NOISE.sub(" ", text)
    text = _SPLIT_NT.sub(r"\1n't", text)
    text = _SPLIT_SUFFIX.sub(r"\1'\2", text)
    text = _DANGLING.sub(r"\1'\2", text)
    return " ".join(text.split())


IMPORTER = Tedlium()
