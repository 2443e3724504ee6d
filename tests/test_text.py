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


# -- issue 23: every language --------------------------------------------------------------------------


def test_turkish_and_azerbaijani_fold_dotted_and_dotless_i():
    """tr/az lower-casing (SpecialCasing.txt): İ -> i, I -> ı, I + combining dot above -> i; every other
    language keeps Unicode's default (I -> i; İ -> i + U+0307, recomposed to nothing shorter by NFC)."""
    turkish = TextSettings(language="tr")
    assert normalise_transcript("İSTANBUL'da Işık", turkish) == "istanbul'da ışık"
    assert normalise_transcript("I\u0307yi", turkish) == "iyi"
    assert normalise_transcript("Iğdır", TextSettings(language="az-Latn")) == "ığdır"
    assert normalise_transcript("Işık", DEFAULT) == "işık"
    assert normalise_transcript("İyi", DEFAULT) == "i\u0307yi"


def test_german_sharp_s_and_upper_case():
    """Lower-casing keeps ß (str.lower's mapping; only upper-casing expands it) and folds umlauts."""
    assert normalise_transcript("GRÜẞE aus der STRAẞE, Straße", DEFAULT) == "grüße aus der straße straße"
    assert normalise_transcript("Die Straße", TextSettings(case="keep")) == "Die Straße"


def test_greek_final_sigma_and_cyrillic():
    assert normalise_transcript("ΟΔΟΣ Σοφίας", DEFAULT) == "οδος σοφίας"
    assert normalise_transcript("Привет, МИР! Ёлка.", DEFAULT) == "привет мир ёлка"


def test_chinese_punctuation_becomes_space_and_nfkc_folds_full_width():
    """CJK punctuation (。，！) are P* characters; NFKC turns full-width Latin and digits into ASCII."""
    assert normalise_transcript("今天天气很好。我们去公园！", DEFAULT) == "今天天气很好 我们去公园"
    assert normalise_transcript("ＡＢＣ１２３", TextSettings(normal_form="NFKC")) == "abc123"
    assert normalise_transcript("ＡＢＣ", DEFAULT) == "ａｂｃ"


def test_output_is_nfc_whatever_the_steps_do():
    """Lower-casing can decompose (İ -> i + U+0307); the result is renormalised."""
    for raw in ("İ", unicodedata.normalize("NFD", "Ñandú ÉTÉ"), "Å\u030a"):
        assert unicodedata.is_normalized("NFC", normalise_transcript(raw, DEFAULT))


def test_language_is_checked_and_the_client_ignores_the_digits_hook():
    with pytest.raises(ValueError, match=r"data\.text\.language: 'french' is not a BCP 47 code"):
        TextSettings(language="french").check()
    recorded = {**TextSettings(language="tr", digits="hook", digits_hook="nowhere.spell").to_dict(), "new": 1}
    client = TextSettings.for_client(recorded)
    assert client.language == "tr" and client.digits == "keep" and client.digits_hook == ""


def test_word_spaces_are_detected_from_the_letters():
    """CER leads where most letters belong to a script written without spaces; Latin words or digits
    inside Chinese text do not tip it, nor does a Chinese name inside English."""
    from pipeline.data.text import has_word_spaces

    assert not has_word_spaces(["今天天气很好", "我们用 GPU 训练"])
    assert not has_word_spaces(["สวัสดีครับ"]) and not has_word_spaces(["きょうはいいてんき"])
    assert has_word_spaces(["le café est prêt", "привет мир", "我 is a character"])
    assert has_word_spaces([]) and has_word_spaces(["123 456"])


def test_labels_a_normalisation_never_produces_are_found():
    """A hand-written alphabet with upper case or punctuation the text settings strip: dead classes."""
    from pipeline.data.text import unreachable_labels

    labels = tuple(" abcAB'-.")
    assert unreachable_labels(labels, DEFAULT) == ["A", "B", "-", "."]
    assert unreachable_labels(labels, TextSettings(case="keep", keep_punctuation="'-.")) == []
    assert unreachable_labels(tuple("iıİ"), TextSettings(language="tr")) == ["İ"]


def test_reports_lead_with_cer_where_the_references_have_no_word_spaces():
    """A Chinese utterance is one "word" to the WER (all or nothing); its CER is the figure that moves."""
    from pipeline.evaluation.metrics import best_and_worst, corpus_rates, format_report, score_sample

    chinese = [
        score_sample("a.wav", "今天天气很好", "今天天气不好", 1.0),
        score_sample("b.wav", "我们去学校", "我们去学校", 2.0),
    ]
    rates = corpus_rates(chinese)
    assert rates["headline"] == "cer" and rates["wer"] == 0.5 and rates["cer"] == 1 / 11
    text = format_report("Test", rates, best_and_worst(chinese, 1, rates["headline"]))
    assert text.startswith(
        "Test: CER 0.0909, WER 0.5000, loss 1.5000 (2 samples) (no word spaces: CER first)"
    )
    french = [score_sample("c.wav", "le café est prêt", "le café est pré", 1.0)]
    assert corpus_rates(french)["headline"] == "wer"
    assert format_report("Test", corpus_rates(french), {}).startswith("Test: WER 0.2500, CER 0.1250")


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("left\u200e to\u200f right", "left to right"),  # LRM, RLM
        ("\u202bשלום\u202c \u202ahello\u202c", "שלום hello"),  # embeddings and their pop
        ("\u202ename\u202d \u2066x\u2069 \u2067y\u2069 \u2068z\u2069", "name x y z"),  # overrides, isolates
        (
            "\u0627\u0644\u0639\u0631\u0628\u064a\u0629\u061c",
            "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
        ),  # ALM
        ("co\u200dop\u200cerate", "cooperate"),  # joiners between Latin letters mean nothing
        ("\u200cword\u200d", "word"),  # nor at a word's edge
        (
            "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
            "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
        ),  # Persian
        ("\u0645\u06cc\u200c \u0631\u0648\u0645", "\u0645\u06cc \u0631\u0648\u0645"),  # ZWNJ before a space
        ("\u0915\u094d\u200d\u0937", "\u0915\u094d\u200d\u0937"),  # Devanagari: half form with ZWJ kept
        ("\u0d7b\u0d4d\u200d\u0d31", "\u0d7b\u0d4d\u200d\u0d31"),  # Malayalam
        ("tag\U000e0041\U000e007f", "tag"),  # tag characters
    ],
)
def test_direction_and_format_characters_are_removed(raw, expected):
    """Issue 37 row 11: direction marks, embeddings, overrides, isolates and zero-width joiners survived
    normalisation, so that with ``alphabet: auto`` they became labels and a word holding one was another
    LM word; ZWNJ/ZWJ stay between letters of the scripts that spell with them (Persian, Indic)."""
    assert normalise_transcript(raw, DEFAULT) == expected
