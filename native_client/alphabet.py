"""The alphabet: a text file of labels, text <-> label indices, normalisation.

File format (as DeepSpeech): one character per line; lines starting with
``#`` are comments; ``\\#`` stands for a literal ``#``. The CTC blank is not
in the file: it is the extra last class, so ``n_classes == len(alphabet) + 1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_WHITESPACE = re.compile(r"\s+")


class AlphabetError(ValueError):
    """A transcript or an alphabet file does not fit the rules."""


@dataclass(frozen=True)
class Alphabet:
    """An ordered set of characters; index ``i`` is the label of ``labels[i]``."""

    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.labels:
            raise AlphabetError("alphabet is empty")
        seen = set()
        for label in self.labels:
            if len(label) != 1:
                raise AlphabetError(f"alphabet label {label!r} is not a single character")
            if label in seen:
                raise AlphabetError(f"alphabet label {label!r} appears twice")
            seen.add(label)

    @property
    def size(self) -> int:
        """Number of characters (without the CTC blank)."""
        return len(self.labels)

    @property
    def blank_index(self) -> int:
        """Index of the CTC blank: the extra last class."""
        return len(self.labels)

    @property
    def n_classes(self) -> int:
        """Number of model outputs: characters plus the blank."""
        return len(self.labels) + 1

    def normalise(self, text: str) -> str:
        """Lower-case (when the alphabet has no upper case), fold whitespace runs to one space, strip."""
        if not any(label.isupper() for label in self.labels):
            text = text.lower()
        return _WHITESPACE.sub(" ", text).strip()

    def unknown_characters(self, text: str) -> list[str]:
        """Characters of ``text`` (already normalised) that are not in the alphabet, sorted."""
        known = set(self.labels)
        return sorted({ch for ch in text if ch not in known})

    def encode(self, text: str) -> list[int]:
        """Normalise ``text`` and map it to label indices; raises AlphabetError naming unknown characters."""
        text = self.normalise(text)
        unknown = self.unknown_characters(text)
        if unknown:
            listed = ", ".join(repr(ch) for ch in unknown)
            raise AlphabetError(f"characters not in the alphabet: {listed} (in {text!r})")
        index = {label: i for i, label in enumerate(self.labels)}
        return [index[ch] for ch in text]

    def decode(self, labels) -> str:
        """Map label indices back to text; the blank and out-of-range indices are dropped."""
        return "".join(self.labels[i] for i in labels if 0 <= int(i) < len(self.labels))

    def to_text(self) -> str:
        """The alphabet in its file format (no comments)."""
        return "".join(("\\#" if label == "#" else label) + "\n" for label in self.labels)


def parse_alphabet(text: str, source: str = "<string>") -> Alphabet:
    """Parse the alphabet file format; errors name ``source`` and the line."""
    labels = []
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if line.startswith("#"):
            continue
        if line == "":
            continue
        if line == "\\#":
            line = "#"
        if len(line) != 1:
            raise AlphabetError(f"{source}:{number}: expected one character per line, got {line!r}")
        if line in labels:
            raise AlphabetError(f"{source}:{number}: character {line!r} appears twice")
        labels.append(line)
    if not labels:
        raise AlphabetError(f"{source}: no characters in the alphabet file")
    return Alphabet(tuple(labels))


def load_alphabet(path: str | Path) -> Alphabet:
    """Read an alphabet file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise AlphabetError(f"{path}: cannot read alphabet file: {error.strerror}") from error
    return parse_alphabet(text, str(path))
