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
