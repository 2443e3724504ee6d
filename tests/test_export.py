"""Export and the native client: parity of the exported forms, streaming, metadata, CLI, tasks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import luigi
import numpy as np
import pytest
import soundfile

from native_client import ExportError, Model, load_metadata
from native_client.audio import load_for_model
from native_client.export_decoder import decoder_for_export
from native_client.metadata import write_manifest
from native_client.model import open_model
from native_client.windows import context_windows
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.lm.kneser_ney import estimate, write_arpa
from pipeline.model.checkpoints import load_trained_model
from pipeline.model.normalization import normalized
from pipeline.reports import TrainReport, read_report
from pipeline.stages.export import export_stage
from pipeline.stages.train import train_stage
from tasks import Export, Transcribe
from tests.conftest import ROOT, SAMPLE, build_features, small_config_text

CLIPS = [SAMPLE / "test" / f"{i:05d}.flac" for i in range(6)]
ECHO = "tests.plugins.echo_decoder"  # a decoder of the user's own (see tests/plugins)


def _trained_config(directory: Path, normalize: bool, epochs: int = 2, train: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    base = directory / "base.yaml"
    base.write_text(
        small_config_text(directory / "work", limit_train=16, limit_dev=4, limit_test=8, n_hidden=48)
    )
    path = directory / "config.yaml"
    path.write_text(
        textwrap.dedent(f"""
        extends: base.yaml
        features:
          normalize: {str(normalize).lower()}
        training:
          epochs: {epochs}
          learning_rate: 0.003
        paths:
          export_dir: {directory / "export"}
    """)
    )
    config = load_config(path)
    if not train:
        return path
    build_features(config, ("train", "dev", "test"))
    train_stage(Layout(config))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny trained model (normalised features, as configs/sample.yaml) and its float export."""
    path = _trained_config(tmp_path_factory.mktemp("normalized"), normalize=True)
    config = load_config(path)
    return config, export_stage(Layout(config)).root


@pytest.fixture(scope="module")
def trained_raw(tmp_path_factory):
    """A tiny trained model on unnormalised features: its stream runs incrementally."""
    path = _trained_config(tmp_path_factory.mktemp("raw"), normalize=False)
    config = load_config(path)
    return config, export_stage(Layout(config)).root


def _checkpoint_logits(config, samples):
    model = load_trained_model(config, Layout(config).train_run.root / "best", config.features.numcep, 29)
    features = load_metadata(Layout(config).export_root).features.frames(samples)
    return model(normalized(model, features[None])).numpy()[0]  # the model's own normalisation first


def test_all_exported_forms_give_the_checkpoint_logits(trained):
    config, export = trained
    assert {p.name for p in export.iterdir()} >= {
        "metadata.json",
        "saved_model",
        "output_graph.pb",
        "model.tflite",
        "alphabet.txt",
    }
    models = {
        backend: Model(export, backend=backend) for backend in ("tflite", "saved_model", "frozen_graph")
    }
    import tensorflow as tf

    utterance = tf.saved_model.load(str(export / "saved_model")).signatures["utterance"]
    for clip in CLIPS[:3]:
        samples = load_for_model(clip, 16000)
        reference = _checkpoint_logits(config, samples)
        assert reference.shape[0] > 50 and np.abs(reference).max() > 0.5  # over a second at 20 ms
        whole = models["tflite"].metadata.features.frames(samples)
        windows = context_windows(whole, config.model.options.n_context)[None]
        np.testing.assert_allclose(utterance(input_node=windows)["logits"].numpy()[0], reference, atol=1e-4)
        for backend, model in models.items():
            np.testing.assert_allclose(model.logits(samples), reference, atol=1e-4, err_msg=backend)


def test_quantised_tflite_agrees_with_float(trained, tmp_path):
    config, export = trained
    quantized_config = config.__class__(
        **{
            **config.__dict__,
            "export": config.export.__class__(quantize=True),
            "paths": config.paths.__class__(**{**config.paths.__dict__, "export_dir": str(tmp_path / "q")}),
        }
    )
    quantized = export_stage(Layout(quantized_config), checkpoint=Layout(config).train_run.best).root
    # The file holds the weights once and the op graphs of two signatures (stream, stream_batch): at
    # n_hidden 48 the graphs weigh about as much as the float weights, so int8 saves less than half.
    assert (quantized / "model.tflite").stat().st_size < 0.6 * (export / "model.tflite").stat().st_size
    assert load_metadata(quantized).tflite_quantized
    float_model, int8_model = Model(export), Model(quantized)
    agree = frames = 0
    for clip in CLIPS:
        samples = load_for_model(clip, 16000)
        a, b = float_model.logits(samples), int8_model.logits(samples)
        assert np.abs(a - b).max() < 0.1 * np.abs(a).max()
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        frames += len(a)
    assert agree / frames >= 0.95


@pytest.mark.parametrize("fixture", ["trained_raw", "trained"])
def test_stream_in_odd_chunks_equals_one_shot(fixture, request):
    _, export = request.getfixturevalue(fixture)
    model = Model(export)
    samples = load_for_model(CLIPS[0], 16000)
    expected_logits = model.logits(samples)
    expected = model.transcribe(samples)
    for chunk in (1, 137, len(samples)):
        stream = model.create_stream()
        intermediate = None
        for start in range(0, len(samples), chunk):
            stream.feed_audio(samples[start : start + chunk])
            if intermediate is None and start + chunk >= len(samples) // 2:
                intermediate = stream.intermediate_decode()
        assert stream.finish() == expected, chunk
        np.testing.assert_allclose(stream.logits(), expected_logits, atol=1e-5)
        assert isinstance(intermediate, str)
    if fixture == "trained_raw":  # incremental: logits exist before finish
        stream = model.create_stream()
        stream.feed_audio(samples[: len(samples) // 2])
        partial = stream.logits()
        assert 0 < len(partial) < len(expected_logits)
        np.testing.assert_allclose(partial, expected_logits[: len(partial)], atol=1e-5)


def test_metadata_round_trip(trained):
    config, export = trained
    metadata = load_metadata(export)
    assert metadata.fingerprint == Layout(config).export_fingerprint
    assert (
        metadata.features.frontend.settings == config.features.frontend
        and metadata.features.normalize is True
    )
    assert (
        metadata.features.to_dict()["type"] == "deepspeech"
        and metadata.n_context == config.model.options.n_context
    )
    assert metadata.features.seconds_per_frame == config.features.winstep
    assert metadata.n_steps == config.export.n_steps and [s["shape"] for s in metadata.state] == [[1, 48]] * 2
    assert "".join(metadata.alphabet.labels) == " abcdefghijklmnopqrstuvwxyz'"
    import tensorflow as tf

    embedded = tf.saved_model.load(str(export / "saved_model")).signatures["metadata"]()["metadata"].numpy()
    assert json.loads(embedded.decode())["fingerprint"] == metadata.fingerprint
    assert Layout(config).find_export().root == export


def test_export_metadata_carries_the_best_dev_figures_of_its_train_run(trained):
    config, export = trained
    train = read_report(Layout(config).train_run.report, TrainReport)
    raw = json.loads((export / "metadata.json").read_text())
    assert train.best_dev is not None
    assert raw["best_dev"] == {
        "epoch": train.best_dev.epoch,
        "dev_loss": train.best_dev.dev_loss,
        "wer": train.best_dev.wer,
        "cer": train.best_dev.cer,
    }
    assert raw["global_step"] == train.global_step


def test_client_refuses_an_export_without_metadata(trained, tmp_path):
    _, export = trained
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.tflite").write_bytes((export / "model.tflite").read_bytes())
    with pytest.raises(ExportError, match=r"bare: no metadata.json .*not a model export"):
        Model(bare)
    broken = tmp_path / "broken"
    broken.mkdir()
    raw = json.loads((export / "metadata.json").read_text())
    del raw["features"]
    (broken / "metadata.json").write_text(json.dumps(raw))
    with pytest.raises(
        ExportError, match=r"broken/manifest.json: missing, so the export's files cannot be verified"
    ):
        Model(broken)
    write_manifest(broken)  # a consistent but incomplete export: the key check names the key
    with pytest.raises(ExportError, match=r"broken/metadata.json: missing keys: features"):
        Model(broken)


def test_cli_prints_json_without_luigi_or_training_code(trained, tmp_path):
    _, export = trained
    samples, rate = soundfile.read(CLIPS[1], dtype="int16")
    low = tmp_path / "low.wav"
    soundfile.write(low, samples[::2], 8000)
    script = textwrap.dedent(f"""
        import sys
        from native_client.__main__ import main
        code = main(
            ["--model", {str(export)!r}, "--audio", {str(CLIPS[0])!r}, "--audio", {str(low)!r}, "--json"]
        )
        leaked = [m for m in ("luigi", "pipeline", "tasks", "tensorflow") if m in sys.modules]
        print("LEAKED", leaked)
        sys.exit(code)
    """)
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert run.returncode == 0, run.stderr  # the 8 kHz file is resampled, with a warning (as DeepSpeech)
    assert f"warning: {low}: sample rate 8000 Hz, resampling to the model's 16000 Hz" in run.stderr
    lines = run.stdout.strip().splitlines()
    record = json.loads(lines[0])
    assert set(record) == {"audio", "text", "duration_s", "processing_s", "rtf", "transcripts"}
    assert record["duration_s"] > 1 and record["transcripts"][0]["text"] == record["text"]
    assert lines[-1] == "LEAKED []"
    refused = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(low), "--no-resample"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert refused.returncode == 1
    assert f"{low}: sample rate 8000 Hz, expected 16000 Hz (without --no-resample" in refused.stderr


def test_deepspeech_style_client_options_and_word_timings(trained, tmp_path):
    """DeepSpeech's flags: --model as a .tflite file, underscore options, --candidate_transcripts, --json
    with words (start_time, duration) from the best path, --extended (the transcript), --version, clear
    audio errors."""
    _, export = trained
    command = [
        sys.executable,
        "-m",
        "native_client",
        "--model",
        str(export / "model.tflite"),
        "--audio",
        str(CLIPS[2]),
        "--json",
        "--beam_width",
        "64",
        "--lm_alpha",
        "0.5",
        "--lm_beta",
        "1.0",
        "--candidate_transcripts",
        "3",
    ]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    candidates = record["transcripts"]
    assert 1 <= len(candidates) <= 3 and len({c["text"] for c in candidates}) == len(candidates)
    assert candidates[0]["text"] == record["text"]  # (this tiny model's text may be empty: see the next test)
    assert [c["confidence"] for c in candidates] == sorted(
        (c["confidence"] for c in candidates), reverse=True
    )
    words = candidates[0]["words"]
    assert " ".join(w["word"] for w in words) == record["text"]
    assert all(w["duration"] > 0 for w in words)
    starts = [w["start_time"] for w in words]
    assert starts == sorted(starts)
    assert not words or starts[-1] + words[-1]["duration"] <= record["duration_s"] + 0.02
    extended = subprocess.run(
        [
            sys.executable,
            "-m",
            "native_client",
            "--model",
            str(export),
            "--audio",
            str(CLIPS[2]),
            "--no_scorer",
            "--extended",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    plain = subprocess.run(
        [
            sys.executable,
            "-m",
            "native_client",
            "--model",
            str(export),
            "--audio",
            str(CLIPS[2]),
            "--no_scorer",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    # --extended: the transcript, then per word its start, duration, confidence and the word
    assert extended.returncode == plain.returncode == 0
    first, *per_word = extended.stdout.splitlines()
    assert first == plain.stdout.strip() and " ".join(line.split("\t")[3] for line in per_word) == first
    version = subprocess.run(
        [sys.executable, "-m", "native_client", "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert (
        version.returncode == 0
        and "deepspeech-transcribe" in version.stdout
        and "export format 7" in version.stdout
    )
    empty, garbage = tmp_path / "empty.wav", tmp_path / "garbage.wav"
    empty.write_bytes(b"")
    garbage.write_text("not audio")
    errors = subprocess.run(
        [
            sys.executable,
            "-m",
            "native_client",
            "--model",
            str(export),
            "--no-scorer",
            "--audio",
            str(tmp_path / "missing.wav"),
            "--audio",
            str(empty),
            "--audio",
            str(garbage),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert errors.returncode == 1
    assert f"error: {tmp_path / 'missing.wav'}: no such file" in errors.stderr
    assert f"error: {empty}: empty file (0 bytes)" in errors.stderr
    assert f"error: {garbage}: cannot decode audio: not a sound file libsndfile reads" in errors.stderr


def test_export_is_atomic_and_versioned(trained, tmp_path, monkeypatch):
    config, export = trained
    before = (export / "metadata.json").read_text()
    import pipeline.export.writers as writers  # the export stage imports it when it runs

    def crash(*args, **kwargs):
        raise RuntimeError("converter died")

    monkeypatch.setattr(writers, "write_tflite", crash)
    with pytest.raises(RuntimeError, match="converter died"):
        export_stage(Layout(config))
    assert (export / "metadata.json").read_text() == before
    assert not [p for p in export.parent.iterdir() if p.name.startswith(".")]
    monkeypatch.undo()

    versioned = config.__class__(
        **{
            **config.__dict__,
            "export": config.export.__class__(versioned=True),
            "paths": config.paths.__class__(**{**config.paths.__dict__, "export_dir": str(tmp_path / "v")}),
        }
    )
    first = export_stage(Layout(versioned)).root
    second = export_stage(Layout(versioned)).root
    assert (first.name, second.name) == ("1", "2")
    assert load_metadata(tmp_path / "v").model_version == 2


@pytest.mark.usefixtures("tasks_in_process")
def test_transcribe_task_runs_export_and_prints_reference(tmp_path, capsys):
    path = _trained_config(tmp_path / "task", normalize=True, epochs=1, train=False)
    clip = CLIPS[2]
    assert luigi.build([Transcribe(config=str(path), audio=str(clip))], local_scheduler=True)
    assert Export(config=str(path)).complete()
    out = capsys.readouterr().out
    reference = [
        line for line in (SAMPLE / "test.csv").read_text().splitlines() if line.startswith("test/00002.flac")
    ][0].split(",")[2]
    assert f"reference:  {reference}" in out and "hypothesis: " in out
    record = json.loads(Path(Transcribe(config=str(path), audio=str(clip)).output().path).read_text())
    assert record["reference"] == reference and record["model_version"] == 1
    # Another decoder setting is another export: its Transcribe is not answered by the old record
    # (it used to be, so Export never ran again and the old export stayed).
    changed = path.with_name("changed-beam.yaml")
    changed.write_text(f"extends: {path.name}\ndecoder:\n  beam_width: 9\n")
    assert not Transcribe(config=str(changed), audio=str(clip)).complete()
    assert luigi.build([Transcribe(config=str(changed), audio=str(clip))], local_scheduler=True)
    assert load_metadata(Layout(load_config(changed)).export_root).decoder["beam_width"] == 9


def test_word_timings_come_from_the_frames_of_the_best_path(tmp_path):
    """Greedy and beam search report each word's first frame and length (10 ms frames), and up to N
    distinct candidates, best first."""
    from native_client.alphabet import load_alphabet
    from native_client.decoders.beam import BeamDecoder, BeamSettings
    from native_client.decoders.greedy import GreedyDecoder
    from pipeline.lm.kneser_ney import estimate, write_arpa
    from tests.conftest import ALPHABET

    alphabet = load_alphabet(ALPHABET)
    blank = alphabet.blank_index
    path = (
        [blank]
        + [alphabet.labels.index(c) for c in "hhi"]
        + [blank, alphabet.labels.index(" ")]
        + [alphabet.labels.index(c) for c in "youu"]
        + [blank]
    )
    logits = np.full((len(path), alphabet.n_classes), -10.0, np.float32)
    logits[np.arange(len(path)), path] = 10.0
    expected = [("hi", 0.01, 0.03), ("you", 0.06, 0.04)]
    greedy = GreedyDecoder(alphabet).candidates(logits, 3, 0.01)
    assert len(greedy) == 1 and greedy[0].text == "hi you"
    assert [(w.word, round(w.start_time, 3), round(w.duration, 3)) for w in greedy[0].words] == expected
    arpa = tmp_path / "lm.arpa"
    write_arpa(estimate([s.split() for s in ["hi you", "you hi", "hi", "you"]], 2), arpa)
    beam = BeamDecoder(alphabet, arpa, BeamSettings(beam_width=16, lm_alpha=0.5, lm_beta=0.0), ["hi", "you"])
    found = beam.candidates(logits, 3, 0.01)
    assert found[0].text == "hi you" == beam.decode(logits)
    assert [(w.word, round(w.start_time, 3), round(w.duration, 3)) for w in found[0].words] == expected
    assert len({c.text for c in found}) == len(found) <= 3
    assert [c.confidence for c in found] == sorted((c.confidence for c in found), reverse=True)


def _sample_arpa(path: Path, lines: int = 3000) -> Path:
    """A bigram ARPA of the first ``lines`` of the sample LM corpus."""
    text = (SAMPLE / "lm_corpus.txt").read_text().splitlines()[:lines]
    write_arpa(estimate([line.split() for line in text if line.strip()], 2), path)
    return path


def _client(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "native_client", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
    )


def test_the_client_decodes_with_the_decoder_its_export_names(trained, tmp_path):
    """The metadata's decoder entry names the decoder type (here a test-local module, as a user's own)
    and its settings; Model (through decoder_for_export) and the CLI build that decoder from them, the
    CLI's options overriding the settings. --json gives DeepSpeech's 3 candidates unless told."""
    _, export = trained
    copy = tmp_path / "export"
    shutil.copytree(export, copy)
    _sample_arpa(copy / "lm.arpa", 200)
    (copy / "vocab.txt").write_text("amen\n")
    metadata = json.loads((copy / "metadata.json").read_text())
    metadata["decoder"] = {
        "type": ECHO,
        "lm_alpha": 0.25,
        "lm_beta": 2.0,
        "beam_width": 8,
        "lexicon": True,
        "lm": "lm.arpa",
        "vocabulary": "vocab.txt",
    }
    (copy / "metadata.json").write_text(json.dumps(metadata))
    write_manifest(copy)

    # an export never chooses code to import: a user's module runs only when the user allows it
    with pytest.raises(
        ValueError, match=r"decoder.type: 'tests.plugins.echo_decoder' is a module of someone's own"
    ):
        open_model(copy, decoder_factory=decoder_for_export)
    refused = _client("--model", copy, "--audio", CLIPS[2])
    assert refused.returncode == 2 and "--allow-plugin tests.plugins.echo_decoder" in refused.stderr
    model = open_model(copy, decoder_factory=lambda m: decoder_for_export(m, allowed=[ECHO]))
    assert model.decoder.name == "echo"
    result = model.transcribe_file(CLIPS[2], candidates=2)
    greedy = Model(copy).transcribe_file(CLIPS[2]).text
    assert result.text == f"{os.getpid()} 0.25 2 {greedy.upper()}".strip()
    assert [c.text for c in result.candidates] == [result.text, result.text + " #2"]

    allow = ("--allow-plugin", ECHO)
    run = _client("--model", copy, "--audio", CLIPS[2], "--json", "--lm_alpha", "1.5", *allow)
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert record["text"].split(" ", 1)[1] == f"1.5 2 {greedy.upper()}".strip()
    assert len(record["transcripts"]) == 3  # DeepSpeech's default --candidate_transcripts
    extended = _client("--model", copy, "--audio", CLIPS[2], "--json", "--extended", *allow)
    assert extended.returncode == 0
    first, *per_word = extended.stdout.splitlines()
    assert first.split(" ", 1)[1] == f"0.25 2 {greedy.upper()}".strip()
    assert all(line.split("\t")[2] == "-" for line in per_word)  # this decoder gives no probabilities
    # a decoder module this machine does not have is named, with the file that asks for it
    metadata["decoder"]["type"] = "mylab.decoders.wfst"
    (copy / "metadata.json").write_text(json.dumps(metadata))
    write_manifest(copy)
    missing = _client("--model", copy, "--audio", CLIPS[2], "--allow-plugin", "mylab.decoders.wfst")
    assert missing.returncode == 2
    said = f"error: {copy / 'metadata.json'}: decoder.type: no module 'mylab.decoders.wfst'"
    assert any(line.startswith(said) for line in missing.stderr.splitlines()), missing.stderr


def test_client_hot_words_boost_words_through_the_language_model(trained, tmp_path):
    """--hot_words word:boost (DeepSpeech 0.9): a boosted word enters the beam search's transcript; the
    option is refused without a language model and names a word the alphabet cannot spell."""
    _, export = trained
    scorer = _sample_arpa(tmp_path / "lm.arpa")
    common = ["--model", export, "--audio", CLIPS[2], "--scorer", scorer, "--beam_width", "32"]
    plain = _client(*common)
    # (this tiny model's letters are nearly uniform: only a short word's letters are among the 8
    # tokens the search tries per frame, so the test boosts one)
    boosted = _client(*common, "--hot_words", "in:10,zebra:1")
    assert plain.returncode == boosted.returncode == 0, plain.stderr + boosted.stderr
    assert "in" not in plain.stdout.split() and "in" in boosted.stdout.split()
    refused = _client("--model", export, "--audio", CLIPS[2], "--no-scorer", "--hot_words", "unto:4")
    assert refused.returncode == 2 and "--hot_words" in refused.stderr and "--no-scorer" in refused.stderr
    no_lm = _client("--model", export, "--audio", CLIPS[2], "--hot_words", "unto:4")
    assert no_lm.returncode == 2 and f"--hot_words needs a language model: {export} has none" in no_lm.stderr
    # hot words are normalised as the training text was (data.text, recorded in the export): "Unto" is
    # "unto"; a character the alphabet lacks even then is refused, naming the word
    assert _client(*common, "--hot_words", "Unto:4").returncode == 0
    spelt = _client(*common, "--hot_words", "unté:4")
    assert spelt.returncode == 2
    assert "error: hot word 'unté': characters not in the alphabet: 'é'" in spelt.stderr
    malformed = _client(*common, "--hot_words", "unto")
    assert malformed.returncode == 2 and "expected word:boost pairs" in malformed.stderr
