import unicodedata

import pytest

from native_client.alphabet import Alphabet, AlphabetError, load_alphabet, parse_alphabet
from tests.conftest import ALPHABET


def test_sample_alphabet_has_space_letters_apostrophe():
    alphabet = load_alphabet(ALPHABET)
    assert alphabet.labels[0] == " "
    assert alphabet.size == 28
    assert alphabet.blank_index == 28
    assert alphabet.n_classes == 29


def test_round_trip_and_normalisation():
    alphabet = load_alphabet(ALPHABET)
    labels = alphabet.encode("  Don't   PANIC\t now ")
    assert alphabet.decode(labels) == "don't panic now"
    assert alphabet.decode(labels + [alphabet.blank_index]) == "don't panic now"


def test_unknown_characters_are_listed():
    alphabet = load_alphabet(ALPHABET)
    with pytest.raises(AlphabetError) as error:
        alphabet.encode("héllo, wörld!")
    message = str(error.value)
    for ch in ("'é'", "','", "'ö'", "'!'"):
        assert ch in message


def test_comments_and_escaped_hash():
    alphabet = parse_alphabet("# comment\na\n\\#\nb\n")
    assert alphabet.labels == ("a", "#", "b")
    assert parse_alphabet(alphabet.to_text()).labels == alphabet.labels


def test_bad_alphabet_files_name_the_line(tmp_path):
    path = tmp_path / "alphabet.txt"
    path.write_text("a\nbc\n")
    with pytest.raises(AlphabetError, match=r"alphabet.txt:2: expected one character"):
        load_alphabet(path)
    path.write_text("a\nb\na\n")
    with pytest.raises(AlphabetError, match=r"alphabet.txt:3: character 'a' appears twice"):
        load_alphabet(path)
    with pytest.raises(AlphabetError, match="cannot read"):
        load_alphabet(tmp_path / "missing.txt")


def test_upper_case_alphabet_keeps_case():
    alphabet = Alphabet(tuple("aAbB "))
    assert alphabet.normalise("Ab  B") == "Ab B"


# -- issue 23: files from any editor, any script; byte labels -------------------------------------------


def test_crlf_cr_and_a_byte_order_mark_read_as_lf(tmp_path):
    """Windows editors write CRLF and a BOM; old Mac files CR: the same alphabet each time."""
    labels = (" ", "a", "é", "#", "ß")
    body = ["# comment", " ", "a", "é", "\\#", "ß"]
    expected = Alphabet(labels)
    for name, text in (
        ("lf", "\n".join(body) + "\n"),
        ("crlf", "\ufeff" + "\r\n".join(body) + "\r\n"),
        ("cr", "\r".join(body)),
    ):
        path = tmp_path / f"{name}.txt"
        path.write_bytes(text.encode("utf-8"))
        assert load_alphabet(path) == expected, name


def test_a_decomposed_letter_in_the_file_is_one_label_and_bad_encodings_are_named(tmp_path):
    nfd = tmp_path / "nfd.txt"
    nfd.write_text(" \ne\u0301\nc\u0327\n", encoding="utf-8")
    assert load_alphabet(nfd).labels == (" ", "é", "ç")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(" \na\n\xe9\n".encode("latin-1"))
    with pytest.raises(AlphabetError, match=r"latin1\.txt: not UTF-8 text \(byte 4\)"):
        load_alphabet(latin1)
    with pytest.raises(AlphabetError, match=r"<string>:3: expected one character per line, got 'ab'"):
        parse_alphabet(" \r\nx\r\nab\r\n")


def test_alphabet_decoding_is_nfc_and_tokens_name_the_space():
    alphabet = Alphabet((" ", "e", "\u0301", "a"))  # a combining accent as its own label (NFD data)
    assert alphabet.decode([1, 2, 0, 3, 99, alphabet.blank_index]) == "é a"
    assert alphabet.space_index == 0 and alphabet.tokens == ("|", "e", "\u0301", "a")
    assert alphabet.to_tokens("a e") == ["a", "|", "e"]
    assert Alphabet(tuple("ab")).space_index is None


def test_byte_labels_round_trip_any_script():
    """DeepSpeech's UTF8Alphabet: 255 labels (byte i + 1), 256 classes with the blank; NFC in and out."""
    from native_client.alphabet import ByteAlphabet, make_alphabet

    labels = ByteAlphabet()
    assert (labels.size, labels.n_classes, labels.blank_index, labels.space_index) == (255, 256, 255, 31)
    for text in ("今天天气很好", "ışık yanıyor", "привет мир", "🙂 ok", unicodedata.normalize("NFD", "café")):
        encoded = labels.encode(text)
        assert all(0 <= label < 255 for label in encoded)
        assert labels.decode(encoded) == unicodedata.normalize("NFC", " ".join(text.split()))
    assert labels.encode("今") == [0xE4 - 1, 0xBB - 1, 0x8A - 1]
    assert labels.unknown_characters("任何文字 any text") == [] and labels.unknown_characters("a\x00") == [
        "\x00"
    ]
    assert make_alphabet("bytes") == labels and make_alphabet("characters", "ab").labels == ("a", "b")
    with pytest.raises(AlphabetError, match="output 'words' is not one of characters, bytes"):
        make_alphabet("words")


def test_invalid_byte_sequences_are_dropped_never_raised():
    """A model can emit any bytes: a lone continuation byte, a truncated character, an over-long form or a
    surrogate's encoding are dropped; the valid characters around them are kept."""
    from native_client.alphabet import ByteAlphabet

    labels = ByteAlphabet()

    def of(data: bytes) -> list[int]:
        return [byte - 1 for byte in data]

    jin, tian = "今".encode(), "天".encode()
    assert labels.decode(of(jin[:2] + tian)) == "天"  # truncated first character
    assert labels.decode(of(b"\x80" + jin + b"\xbf")) == "今"  # stray continuation bytes
    assert labels.decode(of(b"a\xc0\xafb\xed\xa0\x80c")) == "abc"  # over-long '/', a surrogate
    assert labels.decode(of(b"\xff\xfe") + [labels.blank_index, 400, -1]) == ""
    assert labels.decode([]) == ""
    assert labels.to_tokens("a 今") == ["61", "|", "e4", "bb", "8a"]
