"""Transcript normalisation: the one function every text of the project goes through.

Importers (corpus transcripts), Features (manifest transcripts), the Alphabet stage, the LM text,
Evaluate (its references come from Features) and the client (hot words, references) all call
``normalise_transcript(text, settings)`` with the ``data.text`` settings; an export records them
(``text`` in its metadata) so that the client applies the very settings training did. It lives here,
in the client's package, because the client imports nothing of the training code.

``normalise_transcript`` applies, in this order:

1. the Unicode normal form (``normal_form``, NFC by default: NFD-accented text, as some tools
   write it, becomes the same characters as NFC text);
2. removal of invisible characters: every format character (Unicode category Cf: byte-order marks,
   zero-width spaces, soft hyphens, word joiners, the direction marks U+200E/F and U+061C, the
   embeddings, overrides and isolates U+202A-E and U+2066-9, tags, ...), which would otherwise become
   labels and split LM words; control characters (tabs, line breaks) become spaces. The zero-width
   non-joiner and joiner (U+200C, U+200D) are kept between two letters or marks of a script whose
   spelling uses them (``JOINING_SCRIPTS``: Arabic, as in Persian, Urdu, Pashto or Sorani; Syriac,
   Thaana, N'Ko; the scripts of India and Sri Lanka, Devanagari to Sinhala; Mongolian), and removed
   elsewhere (between Latin letters, in emoji sequences, at a word's edge);
3. typographic apostrophes (U+2019, U+02BC, U+2018) as ``'``;
4. the digits policy (``digits``): ``keep``; ``reject`` (the row is dropped as ``digits``); or
   ``hook``: ``digits_hook`` names a function ``module.function`` (or ``module:function``) taking
   and returning a string, called on the text when it holds a digit, before case and punctuation
   are touched (so that ``$3.50`` can become ``three dollars fifty``); a row that still holds a
   digit afterwards is dropped as ``digits``;
5. case (``case``): ``lower`` or ``keep``. Lower-casing follows ``language``: ``tr`` and ``az``
   (Turkish, Azerbaijani) fold ``İ`` to ``i`` and ``I`` to ``ı`` as Unicode's SpecialCasing.txt says;
   every other language uses ``str.lower`` (Unicode's default mapping: ``ß`` stays, a final ``Σ``
   becomes ``ς``);
6. punctuation: every character of the Unicode categories P* (punctuation) and S* (symbols)
   becomes a space, except those in ``keep_punctuation`` (default ``'``, which words like
   ``don't`` need); an apostrophe left standing alone is removed;
7. whitespace: runs collapsed to one space, ends stripped; an empty result is dropped as
   ``empty_transcript``;
8. the normal form again (lower-casing can decompose: ``str.lower("İ")`` is ``i`` + U+0307).

Characters outside the alphabet are not judged here: the Features stage rejects those rows
(``unknown_characters``) against the alphabet (or an Alphabet stage builds the alphabet from the
normalised text). The alphabet never changes the text: a hand-written alphabet with upper-case
letters needs ``case: keep``, one with ``-`` needs ``keep_punctuation: "'-"``.
"""

from __future__ import annotations

import importlib
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache

NORMAL_FORMS = ("NFC", "NFKC")
CASES = ("lower", "keep")
DIGIT_POLICIES = ("keep", "reject", "hook")
# Languages whose lower-casing differs from Unicode's default (SpecialCasing.txt's conditional mappings).
DOTTED_I_LANGUAGES = ("tr", "az")
# The zero-width non-joiner and joiner: format characters that some scripts spell with.
JOINERS = "\u200c\u200d"
# Code point ranges of the scripts whose spelling uses them (see the module docstring, step 2): Arabic,
# Syriac, Arabic Supplement, Thaana, N'Ko, ... Arabic Extended (0600-08FF); Devanagari to Sinhala
# (0900-0DFF); Mongolian (1800-18AF); Arabic presentation forms (FB50-FDFF, FE70-FEFF).
JOINING_SCRIPTS = ((0x0600, 0x08FF), (0x0900, 0x0DFF), (0x1800, 0x18AF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF))
APOSTROPHES = str.maketrans({"\u2019": "'", "\u02bc": "'", "\u2018": "'"})
_SPACES = re.compile(r"\s+")
_LONE_APOSTROPHES = re.compile(r"(?<!\w)'+(?!\w)")
_LANGUAGE_TAG = re.compile(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*")
COMBINING_DOT_ABOVE = "\u0307"


class TranscriptRejected(ValueError):
    """A transcript that cannot be used; ``reason`` is a short code for reports, the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class TextSettings:
    """How transcripts are normalised (``data.text`` in the config, ``text`` in an export's metadata)."""

    normal_form: str = field(
        default="NFC",
        metadata={
            "doc": "Unicode normal form of transcripts: NFC, or NFKC (also folds ligatures and widths)."
        },
    )
    case: str = field(
        default="lower",
        metadata={
            "doc": "lower (by the rules of language: tr and az fold İ to i and I to ı; others as str.lower, "
            "which keeps ß) or keep."
        },
    )
    language: str = field(
        default="",
        metadata={
            "doc": "BCP 47 code of the transcripts' language (fr, tr, zh, ...); tr and az change "
            "lower-casing, and the export records it."
        },
    )
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
        if self.language and not _LANGUAGE_TAG.fullmatch(self.language):
            raise ValueError(
                f"{where}.language: {self.language!r} is not a BCP 47 code such as fr, tr or zh-CN"
            )
        if self.digits == "hook":
            if not self.digits_hook:
                raise ValueError(f"{where}.digits_hook: digits is 'hook' but no function is named")
            digits_hook(self.digits_hook, where)

    def to_dict(self) -> dict:
        """The settings as plain data (what an export's metadata records)."""
        return asdict(self)

    @classmethod
    def for_client(cls, values: Mapping) -> TextSettings:
        """The settings an export recorded, as the client applies them: the digits policy is left out
        (``keep``), since a digits hook is code the export would make the client import. Unknown keys
        are ignored; ValueError names a setting that has no meaning."""
        known = {f.name for f in fields(cls)} - {"digits", "digits_hook"}
        settings = cls(**{key: values[key] for key in known if key in values})
        settings.check("text")
        return settings


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


def _joins(char: str) -> bool:
    """Whether ``char`` is a letter or mark of a script that spells with ZWNJ/ZWJ (``JOINING_SCRIPTS``)."""
    code = ord(char)
    return unicodedata.category(char)[0] in "LM" and any(low <= code <= high for low, high in JOINING_SCRIPTS)


def _invisible_out(text: str) -> str:
    """Step 2 of the module docstring: format characters removed (a joiner kept between two letters of a
    script that spells with it), control characters as spaces."""
    out = []
    for index, char in enumerate(text):
        category = unicodedata.category(char)
        if category == "Cc":
            out.append(" ")
        elif category != "Cf" or (
            char in JOINERS
            and 0 < index < len(text) - 1
            and _joins(text[index - 1])
            and _joins(text[index + 1])
        ):
            out.append(char)
    return "".join(out)


def _is_punctuation(char: str, keep: str) -> bool:
    return char not in keep and unicodedata.category(char)[0] in "PS"


def _lower_dotted_i(text: str) -> str:
    """Turkish and Azerbaijani lower-casing of ``I``: SpecialCasing.txt's conditional mappings for tr/az
    (İ -> i; I followed by a combining dot above -> i, the dot dropped; any other I -> ı), then
    ``str.lower`` for the rest.

    Written by hand: these three rules are all Python's ``str.lower`` lacks for these languages, and an
    ICU binding (which has them) would be a compiled dependency of the client for three lines."""
    out, index = [], 0
    while index < len(text):
        char = text[index]
        if char == "\u0130":
            out.append("i")
        elif char == "I":
            # After_I / Not_Before_Dot: look past combining marks that are not "above" (class 230) for a dot.
            look = index + 1
            while look < len(text) and unicodedata.combining(text[look]) not in (0, 230):
                look += 1
            if look < len(text) and text[look] == COMBINING_DOT_ABOVE:
                out.append("i" + text[index + 1 : look])
                index = look + 1
                continue
            out.append("\u0131")
        else:
            out.append(char)
        index += 1
    return "".join(out).lower()


def lower(text: str, language: str = "") -> str:
    """``text`` in lower case by the rules of ``language`` (a BCP 47 code; see ``_lower_dotted_i``)."""
    if language.split("-")[0].lower() in DOTTED_I_LANGUAGES:
        return _lower_dotted_i(text)
    return text.lower()


def normalise_transcript(text: str, settings: TextSettings) -> str:
    """The training form of a raw transcript (see the module docstring for the steps and their order).

    Raises TranscriptRejected with reason ``digits`` or ``empty_transcript``."""
    text = _invisible_out(unicodedata.normalize(settings.normal_form, text)).translate(APOSTROPHES)
    if settings.digits != "keep" and any(c.isdigit() for c in text):
        if settings.digits == "hook":
            text = unicodedata.normalize(settings.normal_form, digits_hook(settings.digits_hook)(text))
        if any(c.isdigit() for c in text):
            raise TranscriptRejected(
                "digits", f"transcript holds digits (data.text.digits: {settings.digits}): {text!r}"
            )
    if settings.case == "lower":
        text = lower(text, settings.language)
    text = "".join(" " if _is_punctuation(c, settings.keep_punctuation) else c for c in text)
    if "'" in text:
        text = _LONE_APOSTROPHES.sub(" ", text)
    text = _SPACES.sub(" ", text).strip()
    if not text:
        raise TranscriptRejected("empty_transcript", "transcript is empty after normalisation")
    return unicodedata.normalize(settings.normal_form, text)


def nfc(text: str) -> str:
    """``text`` in Unicode's NFC (what the client prints, whatever the labels were)."""
    return unicodedata.normalize("NFC", text)
