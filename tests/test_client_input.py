"""The client against what others hand it (issue 37 rows 6, 7 and 13): an edited ``metadata.json``, option
values the config refuses, audio that is not audio, a random file as ``--scorer``. Each is one line naming
the file (and the key or option), exit status 2 for the export and the options, never a traceback."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile

from native_client.__main__ import main
from native_client.audio import AudioError, stream_for_model
from native_client.export_decoder import decoder_for_export
from native_client.frontends.mfcc import MfccSettings
from native_client.metadata import ExportError, load_metadata, verify_manifest, write_manifest
from tests.conftest import ALPHABET, SAMPLE

LABELS = [
    line for line in ALPHABET.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")
]


def valid_metadata() -> dict:
    """A format 3 export's metadata.json as the Export stage writes it (MFCC features, beam search with a
    word LM), for a model of the sample alphabet."""
    return {
        "format": "luigi-deepspeech-export",
        "format_version": 3,
        "model_version": 1,
        "created_at": "2025-01-01T00:00:00+0000",
        "fingerprint": "0123456789ab",
        "architecture": "deepspeech",
        "features": {
            **dataclasses.asdict(MfccSettings()),
            "type": "mfcc",
            "sample_rate": 16000,
            "normalize": True,
        },
        "n_context": 9,
        "n_input": 26,
        "n_steps": 16,
        "n_classes": len(LABELS) + 1,
        "alphabet": LABELS,
        "files": {"tflite": "model.tflite", "alphabet": "alphabet.txt"},
        "tensors": {
            "signature": "stream",
            "input": "windows",
            "logits": "logits",
            "state": [
                {"input": "state_h", "output": "new_state_h", "shape": [1, 48]},
                {"input": "state_c", "output": "new_state_c", "shape": [1, 48]},
            ],
        },
        "tflite_quantized": False,
        "decoder": {
            "type": "beam",
            "lm": "lm.arpa",
            "vocabulary": "vocab.txt",
            "beam_width": 16,
            "lm_alpha": 0.5,
            "lm_beta": 1.0,
            "lexicon": True,
        },
        "output": "characters",
        "text": {"normal_form": "NFC", "case": "lower", "language": "", "keep_punctuation": "'"},
    }


def _global(**stats) -> dict:
    """The features entry of ``valid_metadata`` with global normalisation and ``stats`` over valid ones."""
    features = {**valid_metadata()["features"], "normalize": "global", "mean": [0.0] * 26, "std": [1.0] * 26}
    return {**features, **stats}


def write_export(directory: Path, raw: dict) -> Path:
    """An export directory holding ``raw`` as its metadata.json, the files it names, and a manifest that
    matches (as someone who edits the metadata would rewrite it)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metadata.json").write_text(json.dumps(raw), encoding="utf-8")
    for name in ("model.tflite", "alphabet.txt", "vocab.txt"):
        (directory / name).write_text("x\n")
    (directory / "lm.arpa").write_text("\\data\\\nngram 1=1\n\n\\1-grams:\n-1.0\t<unk>\n\n\\end\\\n")
    write_manifest(directory)
    return directory


def _set(raw: dict, key: str, value) -> dict:
    raw = copy.deepcopy(raw)
    *parents, last = key.split(".")
    entry = raw
    for parent in parents:
        entry = entry[parent]
    entry[last] = value
    return raw


def _one_line_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: "), error
    return error.strip()


def test_a_valid_metadata_is_read(tmp_path):
    metadata = load_metadata(write_export(tmp_path / "export", valid_metadata()))
    assert metadata.n_steps == 16 and metadata.decoder["beam_width"] == 16


def test_a_metadata_with_global_statistics_is_read_and_applied_frame_by_frame(tmp_path):
    mean, std = [float(i) for i in range(26)], [2.0] * 25 + [0.0]  # a constant coefficient: std 0
    raw = _set(valid_metadata(), "features", _global(mean=mean, std=std))
    features = load_metadata(write_export(tmp_path / "export", raw)).features
    assert features.normalize == "global" and not features.per_utterance
    assert features.to_dict()["mean"] == mean and features.to_dict()["std"] == std
    samples = soundfile.read(SAMPLE / "test" / "00000.flac", dtype="int16")[0]
    raw_frames = features.utterance_frames(samples)
    expected = (raw_frames - np.float32(mean)) / np.maximum(np.float32(std), np.float32(1e-6))
    np.testing.assert_array_equal(features.frames(samples), expected)


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("format_version", "3", "format_version: expected an integer of at least 1 and at most 7, got '3'"),
        ("format_version", None, "format_version: expected an integer"),
        ("model_version", "v1", "model_version: expected an integer of at least 0, got 'v1'"),
        ("files", "abc", "files: expected a mapping, got 'abc'"),
        ("tensors", 5, "tensors: expected a mapping, got 5"),
        ("n_steps", 0, "n_steps: expected an integer of at least 1, got 0"),
        ("alphabet", "abc", "alphabet: expected a list of characters"),
        ("decoder.beam_width", "wide", "decoder.beam_width: expected an integer of at least 1, got 'wide'"),
        ("decoder.beam_width", 0, "decoder.beam_width: expected an integer of at least 1, got 0"),
        ("decoder.beam_width", -3, "decoder.beam_width: expected an integer of at least 1, got -3"),
        ("decoder.lm_alpha", math.nan, "decoder.lm_alpha: expected a finite number, got nan"),
        ("decoder.lexicon", "yes", "decoder.lexicon: expected true or false, got 'yes'"),
        ("features.nfilt", 3_000_000, "features: nfilt: expected an integer of at least 1 and at most 1024"),
        ("features.sample_rate", "16k", "features: sample_rate: expected an integer of at least 1000"),
        ("decoder.lm", "/etc/passwd", "decoder.lm: '/etc/passwd' is not a file inside the export directory"),
        ("decoder.vocabulary", "../vocab.txt", "decoder.vocabulary: '../vocab.txt' is not a file inside"),
        ("files.tflite", "/etc/passwd", "files.tflite: '/etc/passwd' is not a file inside the export"),
        ("tensors.state", [{"input": "h", "output": "o", "shape": [1, 10**12]}], "tensors.state[0].shape:"),
        ("tensors.input", ["windows"], "tensors.input: expected a tensor name"),
        ("text.keep_punctuation", 5, "text.keep_punctuation: expected a string, got 5"),
        ("n_input", 40, "n_input is 40 but the features give 26 values per frame"),
        ("stride", 0, "stride: expected an integer of at least 1 and at most 64, got 0"),
        ("streaming", [16], "streaming: expected a mapping, got [16]"),
        ("streaming", {"input": "audio", "chunk": 16}, "streaming.input: expected one of windows, frames"),
        ("streaming", {"input": "frames", "chunk": 0}, "streaming.chunk: expected an integer of at least 1"),
        ("streaming", {"input": "windows", "chunk": 8, "context": 9, "lookahead": 0}, "must be n_steps"),
        ("streaming", None, "streaming: null (no streaming form) but tensors.state lists a state"),
        ("features.normalize", "yes", "features: normalize: expected true, false or global, got 'yes'"),
        ("features.normalize", 1, "features: normalize: expected true, false or global, got 1"),
        ("features.normalize", "global", "features: normalize: global, but the mean and std"),
        ("features.mean", [0.0] * 26, "features: mean, std: only with normalize: global"),
        (
            "features",
            _global(mean=[0.0] * 25),
            "features: mean: expected a list of 26 finite numbers, got 25",
        ),
        ("features", _global(mean="0"), "features: mean: expected a list of 26 finite numbers, got '0'"),
        ("features", _global(std=[1.0] * 25 + [math.nan]), "features: std[25]: expected a list of 26 finite"),
        ("features", _global(std=[1.0] * 25 + [-1.0]), "features: std[25]: a standard deviation cannot be"),
        ("features", _global(mean=[0.0] * 25 + [True]), "features: mean[25]: expected a list of 26 finite"),
    ],
)
def test_an_edited_metadata_is_one_line_naming_the_key(tmp_path, capsys, key, value, says):
    """Issue 37 rows 6 and 13: each of these gave a traceback (a MemoryError for 3,000,000 filters), or
    was used (KenLM opened /etc/passwd), or named no file."""
    export = write_export(tmp_path / "export", _set(valid_metadata(), key, value))
    error = _one_line_error(["--model", str(export), "--audio", "x.wav"], capsys)
    assert error.startswith(f"error: {export / 'metadata.json'}: ") and says in error, error


def test_global_statistics_in_a_format_6_metadata_are_refused(tmp_path, capsys):
    """Format 6 normalises in the graph: statistics in its features entry would be applied twice."""
    raw = _set(_set(valid_metadata(), "features", _global()), "format_version", 6)
    export = write_export(tmp_path / "export", raw)
    error = _one_line_error(["--model", str(export), "--audio", "x.wav"], capsys)
    assert "features: normalize: global is format 5's (the client normalised); a format 6" in error, error
    load_metadata(write_export(tmp_path / "five", _set(raw, "format_version", 5)))  # format 5: read
    bare = _set(raw, "features", {k: v for k, v in raw["features"].items() if k not in ("mean", "std")})
    error = _one_line_error(
        ["--model", str(write_export(tmp_path / "bare", bare)), "--audio", "x.wav"], capsys
    )
    assert "normalize: global is format 5's" in error, error  # not "the mean and std are missing"
    for normalization, normalize in (("yes", False), ("global", True)):
        odd = _set(_set(valid_metadata(), "normalization", normalization), "features.normalize", normalize)
        error = _one_line_error(
            ["--model", str(write_export(tmp_path / f"odd-{normalization}", odd)), "--audio", "x"], capsys
        )
        assert 'normalization: expected "global" (the graph normalises' in error, error


def test_a_deepspeech_front_end_of_three_million_channels_is_refused(tmp_path, capsys):
    raw = valid_metadata()
    raw["features"] = {"type": "deepspeech", "sample_rate": 16000, "normalize": False, "numcep": 26}
    raw["features"]["filterbank_channels"] = 3_000_000
    export = write_export(tmp_path / "export", raw)
    error = _one_line_error(["--model", str(export), "--audio", "x.wav"], capsys)
    assert "features: filterbank_channels: expected an integer of at least 1 and at most 1024" in error


def test_every_file_a_decoder_names_must_be_in_the_manifest(tmp_path):
    """One listed name let the others through (the check passed when any name matched)."""
    export = write_export(tmp_path / "export", valid_metadata())
    (export / "other.arpa").write_text("added after the manifest\n")
    verify_manifest(export, ["vocab.txt", "lm.arpa"])
    with pytest.raises(ExportError, match=r"manifest.json: lists no other.arpa; the export is damaged"):
        verify_manifest(export, ["other.arpa", "vocab.txt"])


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--beam_width", "0", "--beam_width: expected an integer of at least 1, got 0"),
        ("--beam_width", "-3", "--beam_width: expected an integer of at least 1, got -3"),
        ("--lm_alpha", "nan", "--lm_alpha: expected a finite number, got nan"),
        ("--lm_beta", "-inf", "--lm_beta: expected a finite number, got -inf"),
        ("--threads", "0", "--threads: expected an integer of at least 1, got 0"),
    ],
)
def test_client_options_outside_the_configs_ranges_are_refused(tmp_path, capsys, option, value, says):
    """Issue 37 row 7: --beam_width 0 printed an empty transcript with exit 0, where the config refuses it."""
    export = write_export(tmp_path / "export", valid_metadata())
    error = _one_line_error(["--model", str(export), "--audio", "x.wav", f"{option}={value}"], capsys)
    assert error == f"error: {says}"


def test_the_configs_decoder_ranges_are_the_clients():
    from native_client.ranges import DECODER_SETTINGS
    from pipeline.config import DecoderConfig

    fields = {f.name: f for f in dataclasses.fields(DecoderConfig)}
    for key, expected in DECODER_SETTINGS.items():
        assert fields[key].metadata.get("min") == expected.minimum, key


def test_audio_that_is_not_audio_is_one_line_naming_it(tmp_path):
    """Issue 37 row 13: NaN samples were cast to garbage with numpy's warning and transcribed (exit 0); a
    FIFO was an "empty file (0 bytes)"."""
    samples, rate = soundfile.read(SAMPLE / "test" / "00000.flac", dtype="float32")
    for name, bad in (("nan.wav", math.nan), ("inf.wav", math.inf)):
        poisoned = samples.copy()
        poisoned[rate // 2] = bad
        path = tmp_path / name
        soundfile.write(path, poisoned, rate, subtype="FLOAT")
        with pytest.raises(AudioError) as caught:
            list(stream_for_model(path, rate))
        assert caught.value.reason == "non_finite_audio"
        assert str(caught.value) == (
            f"{path}: the sample at 0.500 s is {bad}: not audio (a float file holding NaN or infinity)"
        )
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    with pytest.raises(AudioError, match=f"^{fifo}: is a FIFO \\(named pipe\\), not an audio file"):
        list(stream_for_model(fifo, rate))


def test_a_scorer_of_random_bytes_is_one_error_naming_it(tmp_path):
    """Issue 37 row 13: KenLM's error on random bytes was a UTF-8 decode error naming no file."""
    metadata = load_metadata(write_export(tmp_path / "export", valid_metadata()))
    scorer = tmp_path / "random.scorer"
    scorer.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError) as caught:
        decoder_for_export(metadata, scorer)
    assert str(caught.value).startswith(f"{scorer}: not a language model") and "\n" not in str(caught.value)
