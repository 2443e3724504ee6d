"""The model's output labels: an alphabet of characters, or UTF-8 bytes; text <-> label indices.

Two kinds, with one interface (what decoders, metrics, training and the export use):

- ``Alphabet``: characters from a text file. File format (as DeepSpeech): one character per line;
  lines starting with ``#`` are comments; ``\\#`` stands for a literal ``#``. Lines may end in LF, CRLF
  or CR, a byte-order mark before the first line is ignored, and each line is read in NFC (an ``é``
  written decomposed is the one character ``é``).
- ``ByteAlphabet``: the UTF-8 bytes of the text (``model.output: bytes``, DeepSpeech's
  ``--bytes_output_mode``), for scripts with thousands of characters. As DeepSpeech's and Coqui STT's
  UTF8Alphabet: 255 labels, label ``i`` being byte ``i + 1`` (NUL never occurs in text), so a bytes
  model has 256 classes with the blank, and theirs and ours read alike.

Both: the CTC blank is the extra last class (``n_classes == size + 1``); ``space_index`` is the label
of the space (the decoders' word separator), None when there is none; ``decode`` returns NFC text
(a byte sequence that is not valid UTF-8 is dropped, never raised); ``tokens`` names each label for a
language model (the space as ``|``, a byte as two hex digits).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_WHITESPACE = re.compile(r"\s+")
_LINE_ENDS = re.compile(r"\r\n|\r|\n")
# The word separator as a language model token (KenLM splits its text at spaces).
SPACE_TOKEN = "|"
OUTPUTS = ("characters", "bytes")


class AlphabetError(ValueError):
    """A transcript or an alphabet file does not fit the rules."""


@dataclass(frozen=True)
class Alphabet:
    """An ordered set of characters; index ``i`` is the label of ``labels[i]``."""

    labels: tuple[str, ...]

    output = "characters"

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
        object.__setattr__(self, "_index", {label: i for i, label in enumerate(self.labels)})

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

    @property
    def space_index(self) -> int | None:
        """The label of the space, None when the alphabet has none."""
        return self._index.get(" ")

    @property
    def tokens(self) -> tuple[str, ...]:
        """Each label's language-model token: the character, the space as ``SPACE_TOKEN``."""
        return tuple(SPACE_TOKEN if label == " " else label for label in self.labels)

    def normalise(self, text: str) -> str:
        """The alphabet's own light normalisation, for text that did not go through ``data.text``
        (``native_client.text``): NFC, lower case when the alphabet has no upper case, whitespace runs
        as one space, ends stripped. The pipeline and the client of a current export normalise with
        the ``data.text`` settings instead; this is the rule of exports written before they were
        recorded."""
        text = unicodedata.normalize("NFC", text)
        if not any(label.isupper() for label in self.labels):
            text = text.lower()
        return _WHITESPACE.sub(" ", text).strip()

    def unknown_characters(self, text: str) -> list[str]:
        """Characters of ``text`` (already normalised) that are not in the alphabet, sorted."""
        return sorted({ch for ch in text if ch not in self._index})

    def encode(self, text: str) -> list[int]:
        """Normalise ``text`` (``normalise``) and map it to label indices; raises AlphabetError naming
        unknown characters."""
        text = self.normalise(text)
        unknown = self.unknown_characters(text)
        if unknown:
            listed = ", ".join(repr(ch) for ch in unknown)
            raise AlphabetError(f"characters not in the alphabet: {listed} (in {text!r})")
        return [self._index[ch] for ch in text]

    def decode(self, labels: Iterable[int]) -> str:
        """Map label indices back to text (NFC); the blank and out-of-range indices are dropped."""
        return unicodedata.normalize(
            "NFC", "".join(self.labels[i] for i in map(int, labels) if 0 <= i < len(self.labels))
        )

    def to_tokens(self, text: str) -> list[str]:
        """``text`` (already normalised, every character in the alphabet) as language-model tokens."""
        return [SPACE_TOKEN if ch == " " else ch for ch in text]

    def to_text(self) -> str:
        """The alphabet in its file format (no comments)."""
        return "".join(("\\#" if label == "#" else label) + "\n" for label in self.labels)


@dataclass(frozen=True)
class ByteAlphabet:
    """UTF-8 bytes as labels (see the module docstring): label ``i`` is byte ``i + 1``."""

    output = "bytes"
    size = 255
    blank_index = 255
    n_classes = 256
    space_index = ord(" ") - 1

    @property
    def tokens(self) -> tuple[str, ...]:
        """Each label's language-model token: the byte as two hex digits, the space as ``SPACE_TOKEN``."""
        return tuple(SPACE_TOKEN if byte == 0x20 else f"{byte:02x}" for byte in range(1, 256))

    def normalise(self, text: str) -> str:
        """NFC, whitespace runs as one space, ends stripped (every text is encodable: no case rule)."""
        return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()

    def unknown_characters(self, text: str) -> list[str]:
        """Characters bytes cannot stand for: only NUL (a text of any script is encodable)."""
        return ["\x00"] if "\x00" in text else []

    def encode(self, text: str) -> list[int]:
        """The labels of ``text``'s UTF-8 bytes (after ``normalise``)."""
        text = self.normalise(text)
        if "\x00" in text:
            raise AlphabetError(f"NUL cannot be encoded as a byte label (in {text!r})")
        return [byte - 1 for byte in text.encode("utf-8")]

    def decode(self, labels: Iterable[int]) -> str:
        """The text of byte labels, NFC; the blank, out-of-range labels and every byte sequence that is not
        valid UTF-8 (a model can emit any bytes) are dropped, never raised."""
        data = bytes(i + 1 for i in map(int, labels) if 0 <= i < 255)
        return unicodedata.normalize("NFC", data.decode("utf-8", errors="ignore"))

    def to_tokens(self, text: str) -> list[str]:
        """``text`` as language-model tokens, one per UTF-8 byte."""
        tokens = self.tokens
        return [tokens[byte - 1] for byte in text.encode("utf-8") if byte]


# What every consumer of labels may rely on: ``Alphabet`` or ``ByteAlphabet``.
Labels = Alphabet | ByteAlphabet


def make_alphabet(output: str, labels: Iterable[str] = ()) -> Labels:
    """The labels of a model: ``ByteAlphabet`` for output bytes, else the ``Alphabet`` of ``labels``."""
    if output == "bytes":
        return ByteAlphabet()
    if output != "characters":
        raise AlphabetError(f"output {output!r} is not one of {', '.join(OUTPUTS)}")
    return Alphabet(tuple(labels))


def parse_alphabet(text: str, source: str = "<string>") -> Alphabet:
    """Parse the alphabet file format; errors name ``source`` and the line."""
    labels = []
    if text.startswith("\ufeff"):  # a byte-order mark, as Windows editors write
        text = text[1:]
    for number, line in enumerate(_LINE_ENDS.split(text), start=1):
        if line.startswith("#"):
            continue
        if line == "":
            continue
        if line == "\\#":
            line = "#"
        line = unicodedata.normalize("NFC", line)
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
    except UnicodeDecodeError as error:
        raise AlphabetError(
            f"{path}: not UTF-8 text (byte {error.start}): save the alphabet as UTF-8"
        ) from None
    return parse_alphabet(text, str(path))
