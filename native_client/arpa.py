"""Reading the word list of an ARPA language model."""

from __future__ import annotations

from pathlib import Path

SPECIAL = ("<s>", "</s>", "<unk>")


def arpa_unigrams(path: str | Path) -> list[str]:
    """The words of an ARPA file's unigram section, in file order, without ``<s>``, ``</s>``, ``<unk>``."""
    words, inside = [], False
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line == "\\1-grams:":
                inside = True
            elif inside and line.startswith("\\"):
                break
            elif inside and line:
                fields = line.split()
                if len(fields) >= 2 and fields[1] not in SPECIAL:
                    words.append(fields[1])
    return words


def arpa_counts(path: str | Path) -> dict[str, int]:
    """The n-gram counts of an ARPA file's header (``{"1": ..., "2": ...}``), read without the rest."""
    counts = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line.startswith("ngram "):
                order, count = line[len("ngram ") :].split("=")
                counts[order.strip()] = int(count)
            elif line.startswith("\\1-grams:"):
                break
    return counts


def is_arpa(path: str | Path) -> bool:
    """True for an ARPA text file (it starts with ``\\data\\``), False for a KenLM binary."""
    with open(path, "rb") as handle:
        return handle.read(64).lstrip().startswith(b"\\data\\")
