"""The client runs DeepSpeech 0.7+/Coqui STT .tflite models: the armspeech 0.1.4 model, on espeak-ng Armenian.

The reference is DeepSpeech's native client written out here from its streaming code (coqui-ai/STT
native_client/stt.cc and tflitemodelstate.cc): features through the model's own MFCC subgraph one
window at a time, nine zero frames of context on each side, the samples after the last whole window
as one more zero-padded window, 16 windows per call with the LSTM state carried.
"""

from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import soundfile

from native_client import Model
from native_client.alphabet import Alphabet, load_alphabet
from native_client.deepspeech_tflite import deserialize_alphabet, is_deepspeech_tflite
from native_client.metadata import ExportError
from pipeline.evaluation.metrics import corpus_rates, score_sample
from tests.conftest import ROOT
from tests.scorer_factory import write_scorer_package

ARMENIAN = ROOT / "data" / "armenian"


def clips() -> list[tuple[str, np.ndarray, str]]:
    with open(ARMENIAN / "clips.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [
        (
            str(ARMENIAN / r["wav_filename"]),
            soundfile.read(ARMENIAN / r["wav_filename"], dtype="int16")[0],
            r["transcript"],
        )
        for r in rows
    ]


def native_client_probabilities(path, samples: np.ndarray) -> np.ndarray:
    """What DeepSpeech's native client feeds its decoder for ``samples`` (int16)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    given = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    made = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    audio = samples.astype(np.float32) * np.float32(1.0 / (1 << 15))

    def mfcc(window):
        padded = np.zeros(512, np.float32)
        padded[: len(window)] = window
        interpreter.set_tensor(given["input_samples"], padded)
        interpreter.invoke()
        return interpreter.get_tensor(made["mfccs"]).reshape(26)

    whole = 0 if len(audio) < 512 else 1 + (len(audio) - 512) // 320
    frames = [mfcc(audio[i * 320 : i * 320 + 512]) for i in range(whole)]
    frames.append(mfcc(audio[whole * 320 :]))  # flushBuffers: what is left in the audio buffer
    zeros = [np.zeros(26, np.float32)] * 9
    frames = np.stack(zeros + frames + zeros)
    windows = np.stack([frames[i : i + 19] for i in range(len(frames) - 18)])
    state_c, state_h = np.zeros((1, 2048), np.float32), np.zeros((1, 2048), np.float32)
    out = []
    for start in range(0, len(windows), 16):
        batch = np.zeros((1, 16, 19, 26), np.float32)
        chunk = windows[start : start + 16]
        batch[0, : len(chunk)] = chunk
        interpreter.set_tensor(given["input_node"], batch)
        interpreter.set_tensor(given["previous_state_c"], state_c)
        interpreter.set_tensor(given["previous_state_h"], state_h)
        interpreter.invoke()
        out.append(interpreter.get_tensor(made["logits"])[: len(chunk)].copy())
        state_c, state_h = (
            interpreter.get_tensor(made["new_state_c"]),
            interpreter.get_tensor(made["new_state_h"]),
        )
    return np.concatenate(out)


@pytest.fixture(scope="module")
def model(armspeech_model):
    return Model(armspeech_model)


def test_the_file_is_recognised_and_described_by_its_metadata_outputs(model, armspeech_model, tmp_path):
    assert is_deepspeech_tflite(armspeech_model)
    (tmp_path / "other.tflite").write_bytes(b"not a flatbuffer")
    assert not is_deepspeech_tflite(tmp_path / "other.tflite") and not is_deepspeech_tflite(tmp_path)
    meta = model.metadata
    assert meta.alphabet == load_alphabet(ARMENIAN / "alphabet.txt") and meta.alphabet.labels[0] == " "
    assert (meta.n_context, meta.n_input, meta.n_steps, meta.n_classes) == (9, 26, 16, 41)
    frontend = meta.features.frontend
    assert (frontend.name, frontend.frame_length, frontend.frame_step, frontend.settings.final_window) == (
        "deepspeech",
        512,
        320,
        True,
    )
    assert meta.features.sample_rate == 16000 and not meta.features.normalize
    assert meta.decoder == {"beam_width": 500} and meta.tflite_quantized and meta.raw["graph_version"] == 6


def test_logits_are_the_native_clients_probabilities_bit_for_bit(model, armspeech_model):
    _, samples, _ = clips()[0]
    expected = np.log(
        np.maximum(native_client_probabilities(armspeech_model, samples), np.finfo(np.float32).tiny)
    )
    ours = model.logits(samples)
    assert ours.shape == expected.shape == (1 + (len(samples) - 512) // 320 + 1, 41)
    np.testing.assert_array_equal(ours, expected)


def test_streaming_in_any_chunks_equals_one_shot_and_decodes_as_it_goes(model):
    _, samples, _ = clips()[1]
    whole = model.logits(samples)
    rng = np.random.default_rng(5)
    stream, start, partial = model.create_stream(), 0, []
    while start < len(samples):
        size = int(rng.integers(1, 4000))
        stream.feed_audio(samples[start : start + size])
        start += size
        partial.append(stream.intermediate_decode())
    np.testing.assert_array_equal(stream.flush(), whole)
    assert partial[-1] and model.greedy.decode(whole).startswith(partial[-1][: len(partial[-1]) // 2])


def test_the_cli_transcribes_from_any_directory_greedy_and_with_a_scorer(armspeech_model, tmp_path):
    from pipeline.lm.kneser_ney import estimate, write_arpa

    texts = [text for _, _, text in clips()]
    arpa = tmp_path / "lm.arpa"
    write_arpa(estimate([t.split() for t in texts], 3), arpa)
    audio = [path for path, _, _ in clips()]
    command = [sys.executable, "-m", "native_client", "--model", str(armspeech_model), "--json"]
    greedy = subprocess.run(
        command + sum((["--audio", a] for a in audio), []), cwd=tmp_path, capture_output=True, text=True
    )
    assert greedy.returncode == 0, greedy.stderr
    greedy_results = [json.loads(line) for line in greedy.stdout.splitlines()]
    assert [r["audio"] for r in greedy_results] == audio and all(r["text"] for r in greedy_results)
    for word in greedy_results[0]["transcripts"][0]["words"]:  # word timings on the model's 20 ms steps
        assert abs(word["start_time"] / 0.02 - round(word["start_time"] / 0.02)) < 1e-6
    beam = subprocess.run(
        command
        + ["--scorer", str(arpa), "--lm_alpha", "1.0", "--lm_beta", "1.0"]
        + sum((["--audio", a] for a in audio), []),
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert beam.returncode == 0, beam.stderr
    beam_texts = [json.loads(line)["text"] for line in beam.stdout.splitlines()]
    vocabulary = {w for t in texts for w in t.split()}
    assert all(set(t.split()) <= vocabulary for t in beam_texts)

    def cer(found):
        return corpus_rates([score_sample("", ref, hyp, 0.0) for ref, hyp in zip(texts, found, strict=True)])[
            "cer"
        ]

    assert cer(beam_texts) < cer([r["text"] for r in greedy_results]) / 2


def test_a_kenlm_binary_scorer_takes_a_vocabulary(armspeech_model, tmp_path):
    from pipeline.lm.kenlm_tools import find_tools
    from pipeline.lm.kneser_ney import estimate, write_arpa

    tools = find_tools()
    if tools is None:
        pytest.skip("KenLM's build_binary is not installed (make kenlm)")
    texts = [text for _, _, text in clips()]
    write_arpa(estimate([t.split() for t in texts], 3), tmp_path / "lm.arpa")
    subprocess.run(
        [str(tools["build_binary"]), str(tmp_path / "lm.arpa"), str(tmp_path / "lm.binary")],
        check=True,
        capture_output=True,
    )
    (tmp_path / "words.txt").write_text(
        "\n".join(sorted({w for t in texts for w in t.split()})), encoding="utf-8"
    )
    path = clips()[2][0]
    command = [
        sys.executable,
        "-m",
        "native_client",
        "--model",
        str(armspeech_model),
        "--audio",
        path,
        "--scorer",
        str(tmp_path / "lm.binary"),
    ]
    missing = subprocess.run(command, capture_output=True, text=True)
    assert missing.returncode == 2 and "--vocabulary names a word list" in missing.stderr
    found = subprocess.run(
        command + ["--vocabulary", str(tmp_path / "words.txt")], capture_output=True, text=True
    )
    assert found.returncode == 0 and found.stdout.strip(), found.stderr


def test_serialised_alphabets_are_read_and_damaged_ones_refused():
    def serialise(labels):
        out = struct.pack("<H", len(labels))
        for i, label in enumerate(labels):
            data = label.encode()
            out += struct.pack("<HH", i, len(data)) + data
        return out

    assert deserialize_alphabet(serialise([" ", "ա", "բ"]), "m").labels == (" ", "ա", "բ")
    with pytest.raises(ExportError, match="m: metadata_alphabet is not a serialised alphabet"):
        deserialize_alphabet(serialise([" ", "ա"])[:-1], "m")
    with pytest.raises(ExportError, match="multi-character or byte labels"):
        deserialize_alphabet(serialise([" ", "ու"]), "m")


def test_a_deepspeech_scorer_package_is_read_with_its_words_and_weights(model, armspeech_model, tmp_path):
    from native_client.scorer_package import ScorerPackageError, is_scorer_package, read_scorer_package
    from pipeline.lm.kenlm_tools import find_tools
    from pipeline.lm.kneser_ney import estimate, write_arpa

    tools = find_tools()
    if tools is None:
        pytest.skip("KenLM's build_binary is not installed (make kenlm)")
    texts = [text for _, _, text in clips()]
    words = sorted({w for t in texts for w in t.split()})
    write_arpa(estimate([t.split() for t in texts], 3), tmp_path / "lm.arpa")
    # As DeepSpeech's generate_lm.py builds it: without the vocabulary strings (-v).
    subprocess.run(
        [str(tools["build_binary"]), "-v", "trie", str(tmp_path / "lm.arpa"), str(tmp_path / "lm.binary")],
        check=True,
        capture_output=True,
    )
    package = tmp_path / "hy.scorer"
    write_scorer_package(tmp_path / "lm.binary", words, model.metadata.alphabet, 0.75, 1.25, package)
    assert is_scorer_package(package) and not is_scorer_package(tmp_path / "lm.binary")
    read = read_scorer_package(package, model.metadata.alphabet)
    assert read.words == tuple(words) and (read.alpha, read.beta) == (0.75, 1.25)
    assert read.lm_alpha == pytest.approx(0.75 * 2.302585093)

    command = [
        sys.executable,
        "-m",
        "native_client",
        "--model",
        str(armspeech_model),
        "--scorer",
        str(package),
    ]
    result = subprocess.run(
        command + sum((["--audio", p] for p, _, _ in clips()), []), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    found = [line.split(": ", 1)[1] for line in result.stdout.splitlines()]
    assert all(set(t.split()) <= set(words) for t in found)
    cer = corpus_rates([score_sample("", ref, hyp, 0.0) for ref, hyp in zip(texts, found, strict=True)])[
        "cer"
    ]
    assert cer < 0.25

    english = tmp_path / "other.scorer"  # the labels of another, larger alphabet
    write_scorer_package(
        tmp_path / "lm.binary", words, load_alphabet(ARMENIAN / "alphabet.txt"), 0.75, 1.25, english
    )
    small = Alphabet(tuple(" աբգ"))
    with pytest.raises(
        ScorerPackageError, match="beyond the model's alphabet of 4: a package built for another"
    ):
        read_scorer_package(english, small)
