"""Transcript text on the training side: the one normalisation (``native_client.text``, which the client
shares), and what the pipeline asks of text besides: whether a language writes spaces between its words.

``normalise_transcript`` and ``TextSettings`` are ``native_client.text``'s, re-exported here so that the
training code has one place to import text handling from.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from native_client.text import (
    CASES,
    DIGIT_POLICIES,
    NORMAL_FORMS,
    TextSettings,
    TranscriptRejected,
    digits_hook,
    lower,
    normalise_transcript,
)

__all__ = [
    "CASES",
    "DIGIT_POLICIES",
    "NORMAL_FORMS",
    "TextSettings",
    "TranscriptRejected",
    "digits_hook",
    "lower",
    "normalise_transcript",
    "UNSPACED_SCRIPTS",
    "unspaced_letter",
    "has_word_spaces",
    "unreachable_labels",
]

# Scripts written without spaces between words (their Unicode character names start so): Chinese
# characters, Japanese kana, Thai, Lao, Khmer, Myanmar, Tibetan.
UNSPACED_SCRIPTS = (
    "CJK UNIFIED IDEOGRAPH",
    "CJK COMPATIBILITY IDEOGRAPH",
    "HIRAGANA",
    "KATAKANA",
    "HALFWIDTH KATAKANA",
    "THAI",
    "LAO",
    "KHMER",
    "MYANMAR",
    "TIBETAN",
)


def unspaced_letter(char: str) -> bool:
    """Whether ``char`` is a letter of a script written without word spaces (``UNSPACED_SCRIPTS``)."""
    return unicodedata.category(char)[0] == "L" and unicodedata.name(char, "").startswith(UNSPACED_SCRIPTS)


def has_word_spaces(texts: Iterable[str]) -> bool:
    """Whether the language of ``texts`` separates its words by spaces: False when most of their letters
    belong to a script written without them (Chinese, Japanese, Thai, ...; see ``UNSPACED_SCRIPTS``).

    Where it is False a "word" is whatever lies between pauses or punctuation, so reports give the
    character error rate as their headline and the word error rate beside it (as Coqui STT did for its
    byte-output models). Detected from the text rather than configured: the same rule then holds for
    a corpus of any language without a key to forget; letters are counted, so Latin words or digits
    inside Chinese text do not tip it."""
    unspaced = letters = 0
    for text in texts:
        for char in text:
            if char.isascii():
                letters += char.isalpha()
            elif unicodedata.category(char)[0] == "L":
                letters += 1
                unspaced += unspaced_letter(char)
    return not letters or unspaced * 2 <= letters


def unreachable_labels(labels: Iterable[str], settings: TextSettings) -> list[str]:
    """Labels of a hand-written alphabet that text normalised with ``settings`` never holds: upper-case
    letters when ``case`` is ``lower``, punctuation and symbols ``keep_punctuation`` does not keep. The
    alphabet does not change the text (``data.text`` alone does), so they are dead classes; Features
    warns about them, naming the key that would bring them back."""
    found = []
    for label in labels:
        if label == " ":
            continue
        if settings.case == "lower" and lower(label, settings.language) != label:
            found.append(label)
        elif unicodedata.category(label)[0] in "PS" and label not in settings.keep_punctuation:
            found.append(label)
    return found
