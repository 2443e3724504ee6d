"""pipeline/data/text.py: the one transcript normalisation every importer's rows go through."""

import sys
import types
import unicodedata

import pytest

from pipeline.data.text import TextSettings, TranscriptRejected, normalise_transcript

DEFAULT = TextSettings()


@pytest.mark.parametrize(
    "raw, expected",
    [
        ('Il a dit "non", puis il est parti.', "il a dit non puis il est parti"),
        (unicodedata.normalize("NFD", "Café NAÏVE"), "café naïve"),
        ("\ufeffHello\u200bworld", "helloworld"),
        ("L’homme d’affaires — «vite»!", "l'homme d'affaires vite"),
        ("well-known\tfact\r\n", "well known fact"),
        ("rock 'n' roll", "rock 'n' roll"),
        (" ' quoted ' ", "quoted"),
        ("Straße", "straße"),
        ("I have 3 cats & 2 dogs", "i have 3 cats 2 dogs"),
        ("Zwischen\u00a0Wörtern", "zwischen wörtern"),
    ],
)
def test_default_normalisation(raw, expected):
    """NFC, invisible characters out, typographic apostrophes as ', lower case, punctuation and
    symbols as spaces (apostrophes inside words kept), whitespace collapsed; digits kept."""
    assert normalise_transcript(raw, DEFAULT) == expected


def test_nfd_and_nfc_input_give_identical_text():
    """An NFD-accented transcript must become the very characters the alphabet lists (NFC)."""
    text = "Le café était fermé à Noël"
    nfd = unicodedata.normalize("NFD", text)
    assert nfd != text
    assert normalise_transcript(nfd, DEFAULT) == normalise_transcript(text, DEFAULT) == text.lower()


def test_empty_after_normalisation_is_rejected():
    with pytest.raises(TranscriptRejected) as error:
        normalise_transcript(" ... !? ", DEFAULT)
    assert error.value.reason == "empty_transcript"


def test_digits_rejected_or_passed_to_a_hook(monkeypatch):
    """digits: reject drops the row as ``digits``; digits: hook calls the named function first and
    rejects only what it leaves with digits."""
    with pytest.raises(TranscriptRejected, match="digits") as error:
        normalise_transcript("Room 101", TextSettings(digits="reject"))
    assert error.value.reason == "digits"
    assert normalise_transcript("No digits here", TextSettings(digits="reject")) == "no digits here"

    numbers = types.ModuleType("numbers_for_test")
    numbers.spell = lambda text: text.replace("101", "one oh one").replace("$3.50", "three dollars fifty")
    monkeypatch.setitem(sys.modules, "numbers_for_test", numbers)
    hooked = TextSettings(digits="hook", digits_hook="numbers_for_test.spell")
    hooked.check()
    assert (
        normalise_transcript("Room 101 costs $3.50.", hooked) == "room one oh one costs three dollars fifty"
    )
    with pytest.raises(TranscriptRejected) as error:
        normalise_transcript("Room 7", hooked)
    assert error.value.reason == "digits"


def test_case_keep_and_extra_kept_punctuation():
    settings = TextSettings(case="keep", keep_punctuation="'-")
    assert normalise_transcript("Jean-Luc's ship.", settings) == "Jean-Luc's ship"


def test_nfkc_folds_compatibility_characters():
    assert normalise_transcript("ﬁne ＷＩＤＥ", TextSettings(normal_form="NFKC")) == "fine wide"
    assert normalise_transcript("ﬁne", DEFAULT) == "ﬁne"


@pytest.mark.parametrize(
    "settings, message",
    [
        (TextSettings(normal_form="NFD"), "data.text.normal_form: 'NFD' is not one of NFC, NFKC"),
        (TextSettings(case="upper"), "data.text.case"),
        (TextSettings(digits="spell"), "data.text.digits"),
        (TextSettings(digits="hook"), "data.text.digits_hook: digits is 'hook' but no function is named"),
        (TextSettings(digits="hook", digits_hook="no_such_module_x.f"), "cannot load 'no_such_module_x.f'"),
    ],
)
def test_settings_are_checked_naming_the_key(settings, message):
    with pytest.raises(ValueError, match=message):
        settings.check()
