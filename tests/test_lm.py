"""The Kneser-Ney estimator, its ARPA in KenLM, and the beam search decoder."""

from __future__ import annotations

import math
import random
import unicodedata

import kenlm
import numpy as np
import pytest

from native_client.alphabet import Alphabet, load_alphabet
from native_client.decoders import DecoderSpec, build_decoder
from native_client.decoders.beam import BeamDecoder, BeamSettings
from native_client.decoders.greedy import best_path
from pipeline.lm.kneser_ney import BOS, UNK, estimate, write_arpa
from pipeline.lm.text import char_tokens
from tests.conftest import ALPHABET, SAMPLE

TOY = [["a", "b"], ["a", "b"], ["b"]]


def test_hand_computed_probabilities_on_a_toy_corpus():
    model = estimate(TOY, 2)
    assert model.fallback_orders == [1, 2]  # too few counts for the discount formula: lmplz's fallback
    # continuation counts a=1, b=2, </s>=1; D=(0.5, 1, 1.5); leftover 0.5 spread over 4 words
    assert model.prob[1][("a",)] == pytest.approx(0.25)
    assert model.prob[1][("b",)] == pytest.approx(0.375)
    assert model.prob[1][("</s>",)] == pytest.approx(0.25)
    assert model.prob[1][(UNK,)] == pytest.approx(0.125)
    assert model.prob[2][(BOS, "a")] == pytest.approx(1 / 3 + 0.5 * 0.25)
    assert model.prob[2][(BOS, "b")] == pytest.approx(1 / 6 + 0.5 * 0.375)
    assert model.prob[2][("a", "b")] == pytest.approx(0.5 + 0.5 * 0.375)
    assert model.prob[2][("b", "</s>")] == pytest.approx(0.5 + 0.5 * 0.25)
    assert model.backoff[1][(BOS,)] == pytest.approx(0.5) and model.backoff[1][("a",)] == pytest.approx(0.5)
    assert model.sentence_log10(["a", "b"]) == pytest.approx(math.log10((1 / 3 + 0.125) * 0.6875 * 0.625))


def _sample_sentences(count: int) -> list[list[str]]:
    lines = (SAMPLE / "lm_corpus.txt").read_text().splitlines()[:count]
    return [line.split() for line in lines if line.strip()]


@pytest.mark.parametrize("order", [1, 2, 3])
def test_probabilities_of_each_context_sum_to_one(order):
    model = estimate(_sample_sentences(300), order)
    vocabulary = [g[0] for g in model.prob[1]]
    contexts = [()] + [g for n in range(1, order) for g in list(model.prob[n])[:40]] + [(BOS,)]
    for context in contexts:
        if context and context[-1] == "</s>":
            continue
        total = sum(model.probability(w, context) for w in vocabulary)
        assert total == pytest.approx(1.0, abs=1e-9), context


def test_kenlm_reads_the_arpa_and_agrees(tmp_path):
    sentences = _sample_sentences(2000)
    model = estimate(sentences, 3)
    arpa = tmp_path / "lm.arpa"
    write_arpa(model, arpa)
    loaded = kenlm.Model(str(arpa))
    assert loaded.order == 3
    rng = random.Random(1)
    held_out = [line.split() for line in (SAMPLE / "lm_corpus.txt").read_text().splitlines()[5000:5050]]
    shuffled = [rng.sample(s, len(s)) for s in sentences[:50]]
    for words in sentences[:50] + held_out + shuffled + [["zebra", "unknown", "words"]]:
        assert loaded.score(" ".join(words), bos=True, eos=True) == pytest.approx(
            model.sentence_log10(words), abs=2e-5
        )


def _logits(text: str, alphabet: Alphabet, confusions: dict | None = None, sharp: float = 10.0) -> np.ndarray:
    """Frame logits spelling ``text`` with blanks between characters; ``confusions``
    {position: (other char, margin)} makes another character win at that position by ``margin``."""
    frames = []
    for position, ch in enumerate(text):
        row = np.zeros(alphabet.n_classes, np.float32)
        row[alphabet.labels.index(ch)] = sharp
        if confusions and position in confusions:
            other, margin = confusions[position]
            row[alphabet.labels.index(other)] = sharp + margin
        blank = np.zeros(alphabet.n_classes, np.float32)
        blank[alphabet.blank_index] = sharp
        frames += [row, row, blank]
    return np.stack(frames)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    sentences = [s.split() for s in ["the cat sat on the mat", "the cat ate", "a cat sat", "the dog sat"] * 5]
    word = estimate(sentences, 3)
    write_arpa(word, tmp / "words.arpa")
    chars = estimate([char_tokens(" ".join(s), load_alphabet(ALPHABET)) for s in sentences], 6)
    write_arpa(chars, tmp / "chars.arpa")
    vocabulary = sorted({w for s in sentences for w in s})
    return tmp / "words.arpa", tmp / "chars.arpa", vocabulary


@pytest.mark.parametrize("lexicon", [True, False])
def test_strong_lm_fixes_an_ambiguous_greedy_output(models, lexicon):
    words, chars, vocabulary = models
    alphabet = load_alphabet(ALPHABET)
    logits = _logits("the cat sat", alphabet, confusions={4: ("k", 0.5)}, sharp=4.0)
    assert best_path(logits, alphabet) == "the kat sat"
    decoder = BeamDecoder(
        alphabet,
        words if lexicon else chars,
        BeamSettings(beam_width=64, lm_alpha=2.0, lm_beta=0.0, lexicon=lexicon),
        vocabulary,
    )
    assert decoder.decode(logits) == "the cat sat"


@pytest.mark.parametrize("lexicon", [True, False])
def test_no_lm_weight_equals_greedy_on_clear_logits(models, lexicon):
    words, chars, vocabulary = models
    alphabet = load_alphabet(ALPHABET)
    decoder = BeamDecoder(
        alphabet,
        words if lexicon else chars,
        BeamSettings(beam_width=16, lm_alpha=0.0, lm_beta=0.0, lexicon=lexicon),
        vocabulary,
    )
    for text in ["the dog ate the cat", "a mat", "cat on the mat sat"]:
        logits = _logits(text, alphabet)
        assert decoder.decode(logits) == best_path(logits, alphabet) == text


@pytest.mark.parametrize("lexicon", [True, False])
def test_a_hot_word_changes_the_transcript(models, lexicon):
    """--hot_words: "kat" is not in the vocabulary and the LM prefers "cat", which the acoustics favour
    by a little; boosting "kat" makes it the transcript (lexicon: it joins the vocabulary, scored as
    <unk> plus the boost; lexicon-free: the boost is earned letter by letter). A negative boost
    suppresses a word. Boosts are natural-log units, as DeepSpeech's."""
    words, chars, vocabulary = models
    alphabet = load_alphabet(ALPHABET)
    logits = _logits("the kat sat", alphabet, confusions={4: ("c", 0.5)}, sharp=4.0)
    settings = BeamSettings(beam_width=64, lm_alpha=2.0, lm_beta=0.0, lexicon=lexicon)

    def decode(hot_words):
        return BeamDecoder(alphabet, words if lexicon else chars, settings, vocabulary, hot_words).decode(
            logits
        )

    assert decode(None) == decode({"kat": 0.0}) == "the cat sat"
    assert decode({"kat": 20.0}) == "the kat sat"
    assert decode({"cat": -20.0}) not in ("the cat sat", "the kat sat")  # suppressed
    assert decode({"dog": 20.0}) == "the cat sat"  # a boost alone does not make a word heard


def test_hot_words_are_checked_and_need_a_language_model(models):
    words, _, vocabulary = models
    alphabet = load_alphabet(ALPHABET)
    settings = BeamSettings(beam_width=8)
    for hot_words, message in [
        ({"ka t": 1.0}, "hot word 'ka t': expected one word without spaces"),
        ({"kät": 1.0}, "hot word 'kät': characters not in the alphabet: 'ä'"),
        ({"kat": float("nan")}, "hot word 'kat': boost nan is not a finite number"),
    ]:
        with pytest.raises(ValueError, match=f"^{message}$"):
            BeamDecoder(alphabet, words, settings, vocabulary, hot_words)
    spec = DecoderSpec("greedy", alphabet.labels, settings={"hot_words": {"kat": 1.0}})
    with pytest.raises(ValueError, match="hot words need a decoder with a language model"):
        build_decoder(spec)


def _byte_logits(labels, confusions: dict | None = None, sharp: float = 10.0) -> np.ndarray:
    """Frame logits spelling byte ``labels`` (a label per two frames, blanks between); ``confusions``
    {position: (other label, margin)} makes another byte win at that position by ``margin``."""
    frames = []
    for position, label in enumerate(labels):
        row = np.zeros(256, np.float32)
        row[label] = sharp
        if confusions and position in confusions:
            other, margin = confusions[position]
            row[other] = sharp + margin
        blank = np.zeros(256, np.float32)
        blank[255] = sharp
        frames += [row, row, blank]
    return np.stack(frames)


def test_lexicon_free_beam_search_over_a_byte_language_model(tmp_path):
    """Mandarin with byte outputs (issue 23): a byte LM of the training text (tokens as the LM stage
    writes them) repairs a byte the acoustic model got slightly wrong, which greedy decoding turns into
    an invalid sequence it drops; the beam decoder's transcripts are NFC text, never a raised error."""
    from native_client.alphabet import ByteAlphabet

    labels = ByteAlphabet()
    sentences = ["今天天气很好", "我们去学校", "今天我们去公园", "天气很好"] * 5
    write_arpa(estimate([char_tokens(s, labels) for s in sentences], 6), tmp_path / "bytes.arpa")
    spoken = labels.encode("今天天气")
    # the last byte of 气 (U+6C14: e6 b0 94) heard as 0xff, which no UTF-8 text holds: greedy decoding
    # drops the broken character
    logits = _byte_logits(spoken, confusions={len(spoken) - 1: (0xFF - 1, 0.5)})
    assert best_path(logits, labels) == "今天天"
    settings = BeamSettings(beam_width=32, lm_alpha=2.0, lm_beta=0.0, lexicon=False)
    decoder = BeamDecoder(labels, tmp_path / "bytes.arpa", settings)
    assert decoder.decode(logits) == "今天天气"
    noise = np.random.default_rng(0).normal(size=(60, 256)).astype(np.float32)
    assert unicodedata.is_normalized("NFC", decoder.decode(noise))


def test_a_character_cut_by_a_segment_boundary_is_kept(tmp_path, monkeypatch):
    """Issue 37 row 15: a long input is beam-searched in segments cut at pauses; with byte outputs a pause can
    fall between the bytes of one character (here 气, e6 b0 94, with a long blank after its first byte),
    and each side decoded alone held invalid UTF-8, so the character was dropped."""
    from native_client.alphabet import ByteAlphabet
    from native_client.decoders import beam
    from native_client.decoders.beam import pause_segments

    labels = ByteAlphabet()
    sentences = ["今天天气很好", "我们去学校", "今天我们去公园", "天气很好"] * 5
    write_arpa(estimate([char_tokens(s, labels) for s in sentences], 6), tmp_path / "bytes.arpa")
    logits = _byte_logits(labels.encode("今天天气"))
    first_byte_of_qi = 3 * 9  # its two frames, then a blank
    pause = np.repeat(logits[first_byte_of_qi + 2 : first_byte_of_qi + 3], 8, axis=0)
    logits = np.concatenate([logits[: first_byte_of_qi + 3], pause, logits[first_byte_of_qi + 3 :]])
    monkeypatch.setattr(beam, "SEGMENT_FRAMES", 40)  # the cut is made at 40 frames instead of 6,000
    (_, cut), _ = pause_segments(logits, (labels.blank_index, labels.space_index), 40)
    assert first_byte_of_qi + 2 < cut < first_byte_of_qi + 3 + len(pause)  # inside 气
    settings = BeamSettings(beam_width=32, lm_alpha=0.5, lm_beta=0.0, lexicon=False)
    decoder = BeamDecoder(labels, tmp_path / "bytes.arpa", settings)
    assert decoder.decode(logits) == "今天天气"
    (candidate,) = decoder.candidates(logits, 3, 0.02)
    assert candidate.text == "今天天气" and [(w.word, w.start_time) for w in candidate.words] == [
        ("今天天气", 0.0)
    ]
