"""The decoder interface: lookup by name (built-in or a user's module), DecodePool's spawned workers
building the decoder from its spec, and the client's DeepSpeech options (hot words, candidates,
--extended)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from native_client.__main__ import format_result, parse_args, parse_hot_words
from native_client.alphabet import load_alphabet
from native_client.decoders import Decoder, DecoderSpec, build_decoder, decoder_class
from native_client.decoders.beam import BeamDecoder
from native_client.decoders.greedy import GreedyDecoder, best_path
from native_client.model import Transcript
from native_client.plugins import PluginError
from native_client.transcripts import Candidate, WordTiming
from pipeline.config import ConfigError
from pipeline.config_loader import load_config
from pipeline.decode.pool import DecodePool
from pipeline.layout import Layout
from tests.conftest import ALPHABET
from tests.plugins.echo_decoder import EchoDecoder

ECHO = "tests.plugins.echo_decoder"


def _random_logits(alphabet, count: int = 9) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [
        rng.normal(size=(int(n), alphabet.n_classes)).astype(np.float32) * 4
        for n in rng.integers(5, 40, count)
    ]


def test_a_users_decoder_module_decodes_in_two_spawned_pool_workers():
    """DecodePool sends only the spec: each spawned worker finds the decoder by its dotted name, builds
    it, and re-weights it as TuneDecoder asks."""
    alphabet = load_alphabet(ALPHABET)
    logits = _random_logits(alphabet)
    spec = DecoderSpec(ECHO, alphabet.labels, settings={"lm_alpha": 0.5, "lm_beta": 1.5})
    with DecodePool(spec, workers=2, chunk=2) as pool:
        plain = pool.decode(iter(logits))
        reweighted = pool.decode(logits, weights=(2.0, -1.0))
    for texts, weights in [(plain, "0.5 1.5"), (reweighted, "2 -1")]:
        assert [text.split(" ", 1)[1] for text in texts] == [
            f"{weights} {best_path(item, alphabet).upper()}".strip() for item in logits
        ]
        pids = {int(text.split()[0]) for text in texts}
        assert os.getpid() not in pids  # decoded in the workers, not here
    with DecodePool(spec, workers=1) as pool:  # one worker: in this process, the same decoder
        assert [t.split(" ", 1)[1] for t in pool.decode(logits)] == [t.split(" ", 1)[1] for t in plain]


def test_decoders_are_found_by_name_and_wrong_names_are_named():
    assert decoder_class("beam") is BeamDecoder and decoder_class("greedy") is GreedyDecoder
    assert decoder_class(ECHO) is EchoDecoder and issubclass(EchoDecoder, Decoder)
    # a name read from someone else's file (an export): built-in ones, or dotted ones the user allows
    assert decoder_class("beam", allowed=()) is BeamDecoder
    assert decoder_class(ECHO, allowed=[ECHO]) is EchoDecoder
    with pytest.raises(
        PluginError, match=rf"^decoder.type: '{ECHO}' is a module of someone's own.*--allow-plugin"
    ):
        decoder_class(ECHO, allowed=())
    alphabet = load_alphabet(ALPHABET)
    assert isinstance(build_decoder(DecoderSpec("greedy", alphabet.labels)), GreedyDecoder)
    with pytest.raises(
        PluginError, match=r"^decoder.type: no module 'native_client.decoders.bean'; built in: beam, greedy"
    ):
        decoder_class("bean")
    with pytest.raises(PluginError, match=r"^decoder.type: module 'tests.plugins' defines no DECODER$"):
        decoder_class("tests.plugins")
    with pytest.raises(
        PluginError, match=r"^decoder.type: 'tests.plugins.factory_function': DECODER is <function DECODER"
    ):
        decoder_class("tests.plugins.factory_function")


def test_the_config_names_the_decoder_and_only_another_type_moves_the_fingerprints(write_config):
    base = Layout(load_config(write_config("decoder:\n  lm_builder: python\n", "beam.yaml")))
    same = Layout(load_config(write_config("decoder:\n  lm_builder: python\n  type: beam\n", "same.yaml")))
    echo = Layout(load_config(write_config(f"decoder:\n  lm_builder: python\n  type: {ECHO}\n", "echo.yaml")))
    assert echo.config.decoder.type == ECHO and base.config.decoder.type == "beam"
    fingerprints = [
        (layout.tune_fingerprint, layout.evaluate_fingerprint, layout.export_fingerprint)
        for layout in (base, same, echo)
    ]
    assert fingerprints[0] == fingerprints[1]  # existing work directories (all beam) keep theirs
    assert all(a != b for a, b in zip(fingerprints[0], fingerprints[2], strict=True))
    assert (echo.train_fingerprint, echo.lm_fingerprint) == (base.train_fingerprint, base.lm_fingerprint)
    with pytest.raises(
        ConfigError, match=r"bad.yaml: decoder.type: no decoder 'beams' \(a module of native_client/decoders/"
    ):
        load_config(write_config("decoder:\n  type: beams\n", "bad.yaml"))


def test_a_decoder_that_cannot_be_built_fails_the_pool_with_its_own_message():
    alphabet = load_alphabet(ALPHABET)
    spec = DecoderSpec("beam", alphabet.labels, lm=None, settings={})
    with DecodePool(spec, workers=2) as pool:
        with pytest.raises(ValueError, match="beam search needs a language model"):
            pool.decode(_random_logits(alphabet, 3))


def test_hot_words_option_parses_deepspeech_pairs():
    assert parse_hot_words("kat:10,dog:-2.5, cat:0") == {"kat": 10.0, "dog": -2.5, "cat": 0.0}
    assert parse_args(["--model", "m", "--audio", "a.wav", "--hot_words", "kat:10"]).hot_words == {
        "kat": 10.0
    }
    for bad in ["kat", "kat:", "kat:ten", ":1", "kat:1,", "kat:inf"]:
        with pytest.raises(Exception, match="expected word:boost pairs"):
            parse_hot_words(bad)


def test_candidate_transcripts_default_to_three_as_deepspeech():
    assert parse_args(["--model", "m", "--audio", "a.wav"]).candidate_transcripts == 3


def test_extended_prints_the_transcript_then_each_word_with_its_confidence():
    """--extended printed the best candidate's text only (DeepSpeech 0.9's client does); issue 35 wants the
    per-word confidence there as in --json: the text line, then per word its start, duration, confidence
    (``-`` when the decoder gives none) and the word, tab-separated; it still wins over --json."""
    words = (WordTiming("hi", 0.1, 0.2, 0.91234), WordTiming("you", 0.4, 0.3))
    result = Transcript(
        "a.wav", "hi you", 1.0, 0.1, (Candidate("hi you", -1.0, words), Candidate("hi", -2.0, ()))
    )
    lines = ["hi you", "0.100\t0.200\t0.9123\thi", "0.400\t0.300\t-\tyou"]
    assert format_result(result, extended=True) == "\n".join(lines)
    assert format_result(result, json_output=True, extended=True) == "\n".join(lines)
    assert format_result(result, extended=True, several=True) == "\n".join(["a.wav: hi you", *lines[1:]])
    assert format_result(result) == "hi you"
    assert '"transcripts": [{"text": "hi you"' in format_result(result, json_output=True)


def test_a_vocabulary_without_a_scorer_is_refused_in_one_line(tmp_path, capsys):
    """``--vocabulary`` names the words of a ``--scorer``: alone it would silently replace the export's own
    vocabulary, so the client refuses it before loading anything."""
    from native_client.__main__ import main

    words = tmp_path / "words.txt"
    words.write_text("a b c\n")
    assert main(["--model", str(tmp_path), "--audio", "x.wav", "--vocabulary", str(words)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--vocabulary" in error and "--scorer" in error


def test_an_unreadable_vocabulary_is_one_error_naming_it(tmp_path):
    """A directory or a non-UTF-8 file given as ``--vocabulary`` is a ValueError naming it (the client
    prints it as one line), not a traceback."""
    from native_client.export_decoder import _read_words

    binary = tmp_path / "words.bin"
    binary.write_bytes(b"\xff\xfe\x00abc")
    for path in (tmp_path, binary):
        with pytest.raises(ValueError, match=r"--vocabulary .*cannot read"):
            _read_words(path)
