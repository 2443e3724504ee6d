"""Transcript normalisation: the one place where every importer's raw text becomes training text.

``normalise_transcript(text, settings)`` applies, in this order:

1. the Unicode normal form (``normal_form``, NFC by default: NFD-accented text, as some tools
   write it, becomes the same characters as NFC text);
2. removal of invisible characters (byte-order marks, zero-width spaces, soft hyphens, word
   joiners) and control characters (tabs, line breaks become spaces); zero-width joiners and
   non-joiners are kept, since Persian and Indic scripts need them;
3. typographic apostrophes (U+2019, U+02BC, U+2018) as ``'``;
4. the digits policy (``digits``): ``keep``; ``reject`` (the row is dropped as ``digits``); or
   ``hook``: ``digits_hook`` names a function ``module.function`` (or ``module:function``) taking
   and returning a string, called on the text when it holds a digit, before case and punctuation
   are touched (so that ``$3.50`` can become ``three dollars fifty``); a row that still holds a
   digit afterwards is dropped as ``digits``;
5. case (``case``): ``lower`` (``str.lower``, which keeps ``ß``) or ``keep``;
6. punctuation: every character of the Unicode categories P* (punctuation) and S* (symbols)
   becomes a space, except those in ``keep_punctuation`` (default ``'``, which words like
   ``don't`` need); an apostrophe left standing alone is removed;
7. whitespace: runs collapsed to one space, ends stripped; an empty result is dropped as
   ``empty_transcript``.

Characters outside the alphabet are not judged here: the Features stage rejects those rows
(``unknown_characters``) against the configured alphabet. Issue 23 (languages) extends
``TextSettings`` (NFKC, locale-aware case for Turkish, a punctuation set per language) through
the same function.
"""

from __future__ import annotations

import importlib
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

NORMAL_FORMS = ("NFC", "NFKC")
CASES = ("lower", "keep")
DIGIT_POLICIES = ("keep", "reject", "hook")
# Invisible characters that only get in the way: BOM, zero-width space, soft hyphen, word joiner.
INVISIBLE = dict.fromkeys(map(ord, "\ufeff\u200b\u00ad\u2060"), None)
APOSTROPHES = str.maketrans({"\u2019": "'", "\u02bc": "'", "\u2018": "'"})
_SPACES = re.compile(r"\s+")
_LONE_APOSTROPHES = re.compile(r"(?<!\w)'+(?!\w)")


class TranscriptRejected(ValueError):
    """A transcript that cannot be used; ``reason`` is a short code for reports, the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class TextSettings:
    """How raw corpus transcripts are normalised (``data.text`` in the config)."""

    normal_form: str = field(
        default="NFC",
        metadata={
            "doc": "Unicode normal form of transcripts: NFC, or NFKC (also folds ligatures and widths)."
        },
    )
    case: str = field(default="lower", metadata={"doc": "lower (str.lower, which keeps ß) or keep."})
    keep_punctuation: str = field(
        default="'",
        metadata={
            "doc": "Punctuation and symbol characters kept as they are; every other one becomes a space."
        },
    )
    digits: str = field(
        default="keep",
        metadata={
            "doc": "Transcripts with digits: keep, reject (dropped as digits), or hook (digits_hook "
            "rewrites them)."
        },
    )
    digits_hook: str = field(
        default="",
        metadata={
            "doc": "With digits: hook, a function module.function(text) -> text, e.g. spelling out numbers."
        },
    )

    def check(self, where: str = "data.text") -> None:
        """Raise ValueError naming the key when a setting has no meaning."""
        for key, value, allowed in (
            ("normal_form", self.normal_form, NORMAL_FORMS),
            ("case", self.case, CASES),
            ("digits", self.digits, DIGIT_POLICIES),
        ):
            if value not in allowed:
                raise ValueError(f"{where}.{key}: {value!r} is not one of {', '.join(allowed)}")
        if self.digits == "hook":
            if not self.digits_hook:
                raise ValueError(f"{where}.digits_hook: digits is 'hook' but no function is named")
            digits_hook(self.digits_hook, where)


@lru_cache(maxsize=8)
def digits_hook(name: str, where: str = "data.text") -> Callable[[str], str]:
    """The function ``module.function`` (or ``module:function``) named by ``digits_hook``."""
    module_name, _, function = name.replace(":", ".").rpartition(".")
    if not module_name:
        raise ValueError(f"{where}.digits_hook: {name!r} is not module.function")
    try:
        found = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{where}.digits_hook: cannot load {name!r}: {error}") from None
    if not callable(found):
        raise ValueError(f"{where}.digits_hook: {name!r} is not a function")
    return found


def _is_punctuation(char: str, keep: str) -> bool:
    return char not in keep and unicodedata.category(char)[0] in "PS"


def normalise_transcript(text: str, settings: TextSettings) -> str:
    """The training form of a raw transcript (see the module docstring for the steps and their order).

    Raises TranscriptRejected with reason ``digits`` or ``empty_transcript``."""
    text = unicodedata.normalize(settings.normal_form, text).translate(INVISIBLE).translate(APOSTROPHES)
    text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    if settings.digits != "keep" and any(c.isdigit() for c in text):
        if settings.digits == "hook":
            text = unicodedata.normalize(settings.normal_form, digits_hook(settings.digits_hook)(text))
        if any(c.isdigit() for c in text):
            raise TranscriptRejected(
                "digits", f"transcript holds digits (data.text.digits: {settings.digits}): {text!r}"
            )
    if settings.case == "lower":
        text = text.lower()
    text = "".join(" " if _is_punctuation(c, settings.keep_punctuation) else c for c in text)
    if "'" in text:
        text = _LONE_APOSTROPHES.sub(" ", text)
    text = _SPACES.sub(" ", text).strip()
    if not text:
        raise TranscriptRejected("empty_transcript", "transcript is empty after normalisation")
    return text
