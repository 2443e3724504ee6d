"""A transducer's export and its client (issue 47): the predictor and joiner are signatures of the SavedModel
and the int8 TFLite model beside the chunked encoder step; the client's searches over them equal the
training graph's, a stream fed in 0.1 s pieces ends with the one-shot text, and the server streams and
batches it. An untrained model (random weights) makes a different string for every clip, so any
difference shows in the text."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from native_client.metadata import ExportError, load_metadata, write_manifest
from native_client.model import Model, open_model
from native_client.stream import Stream
from native_client.transducer_decoder import TransducerDecoder
from tests.conftest import ROOT, SAMPLE
from tests.test_serve import Server, _status, _stream

CLIPS = [SAMPLE / "test" / f"{i:05d}.flac" for i in range(4)]
TENTH = 1600  # 0.1 s at 16 kHz
TINY = {
    "conformer": {"d_model": 32, "heads": 2, "layers": 1, "conv_kernel": 5, "ff_mult": 2},
    "transducer": {"predictor_dim": 16, "predictor_groups": 4, "joint_dim": 24},
}


def _config(out: Path, normalize: bool = False, **export):
    from pipeline.config_loader import load_config

    return load_config(
        ROOT / "configs" / "sample-transducer.yaml",
        {
            "paths": {"work_dir": str(out / "work"), "export_dir": str(out / "export")},
            "features": {"normalize": normalize},
            "model": TINY,
            "export": {"quantize": True, **export},
        },
    )


def _untrained(out: Path, normalize: bool = False) -> tuple[Path, str]:
    """An untrained tiny transducer Conformer exported by the real Export code (int8 TFLite), and the
    checkpoint it came from."""
    import tensorflow as tf

    from pipeline.features.frontend import feature_pipeline
    from pipeline.layout import Layout
    from pipeline.model import build_model
    from pipeline.model.checkpoints import named_weights
    from pipeline.stages.export import export_stage

    config = _config(out, normalize)
    model = build_model(config.model, feature_pipeline(config.features).feature_size, 29)
    prefix = tf.train.Checkpoint(weights=named_weights(model)).write(str(out / "ckpt" / "untrained"))
    return export_stage(Layout(config), checkpoint=prefix, with_lm=False).root, prefix


@pytest.fixture(scope="module")
def untrained(tmp_path_factory) -> tuple[Path, str]:
    """``_untrained`` without normalisation: the encoder streams."""
    return _untrained(tmp_path_factory.mktemp("transducer"))


@pytest.fixture(scope="module")
def export(untrained) -> Path:
    return untrained[0]


def _samples(clip: Path) -> np.ndarray:
    return soundfile.read(clip, dtype="int16")[0]


def test_the_export_holds_the_predictor_and_joiner_and_its_metadata_says_so(export):
    metadata = load_metadata(export)
    assert metadata.raw["format_version"] == 7
    spec = metadata.transducer
    assert (spec.blank, spec.context_size, spec.joint_dim, spec.beam) == (28, 2, 24, 4)
    assert metadata.output_width == 24 and metadata.n_classes == 29
    assert not metadata.decoder
    from native_client.litert import InterpreterModel

    tflite = InterpreterModel(str(metadata.path("tflite")), 1)
    assert {"stream", "stream_batch", "predict", "join"} <= tflite.signatures()
    predicted = tflite.run("predict", {"contexts": np.array([[28, 28], [28, 3]], np.int32)})["predicted"]
    assert predicted.shape == (2, 24)
    logits = tflite.run("join", {"frames": np.zeros((2, 24), np.float32), "predicted": predicted})["logits"]
    assert logits.shape == (2, 29)
    card = (export / "MODEL_CARD.md").read_text()
    assert "Objective: transducer (RNN-T): a stateless predictor over the last 2 labels" in card
    assert "modified beam search (beam 4)" in card


def test_the_full_size_transducer_config_is_en_conformer_s_encoder():
    from pipeline.config_loader import load_config

    config = load_config(ROOT / "configs" / "en-transducer.yaml")
    conformer = load_config(ROOT / "configs" / "en-conformer.yaml")
    assert config.model.objective == "transducer" and config.model.options == conformer.model.options
    assert (config.model.transducer.joint_dim, config.export.quantize, config.export.onnx) == (
        256,
        True,
        False,
    )


def test_the_client_s_greedy_search_is_the_training_graph_s(untrained):
    """The SavedModel's encoder frames searched by the client (its predictor and joiner signatures) and by
    the head's batched TensorFlow greedy search that validates in training: the same labels."""
    import tensorflow as tf

    from pipeline.model import build_model
    from pipeline.model.checkpoints import named_weights

    export, prefix = untrained
    client = open_model(export, backend="saved_model")
    model = build_model(_config(export.parent.parent).model, client.metadata.n_input, 29)
    tf.train.Checkpoint(weights=named_weights(model)).read(prefix).expect_partial()
    head = model.objective_head
    texts = set()
    for clip in CLIPS:
        frames = client.logits(_samples(clip))
        found = head.greedy(tf.constant(frames[None]), tf.constant([len(frames)]), head.max_symbols)
        labels = [int(label) for label in found.numpy()[0] if label >= 0]
        search = client.greedy.search()
        search.advance(frames)
        assert list(search.hypotheses()[0].labels) == labels, clip
        texts.add(client.greedy.decode(frames))
    assert len(texts) == len(CLIPS)


@pytest.mark.parametrize("backend", ["tflite", "saved_model"])
def test_a_stream_fed_in_tenths_of_a_second_ends_with_the_one_shot_text(export, backend):
    model = open_model(export, backend=backend)
    assert model.beam_search is not None and model.beam_search.beam == 4
    for clip in CLIPS:
        samples = _samples(clip)
        frames = model.logits(samples)
        greedy, beam = model.greedy.decode(frames), model.beam_search.decode(frames)
        stream = Stream(model.runner, model.beam_search, model.greedy)
        partials = []
        for start in range(0, len(samples), TENTH):
            stream.feed_audio(samples[start : start + TENTH])
            partials.append(stream.intermediate_decode())
        assert stream.finish() == beam, clip
        assert stream.intermediate_decode() == greedy
        # greedy search only extends its one hypothesis: every partial is the start of the final text
        assert all(greedy.startswith(partial) for partial in partials) and len(set(partials)) > 2
        found = Model(export, backend=backend, decoder=model.beam_search).transcribe_file(clip, candidates=3)
        assert found.text == beam and 1 < len(found.candidates) <= 3
        assert len({c.text for c in found.candidates}) == len(found.candidates)
        for word in found.candidates[0].words:
            assert 0 <= word.start_time and word.start_time + word.duration <= found.duration_s + 0.2
            assert 0 < word.confidence <= 1


def test_a_per_utterance_normalised_transducer_searches_once_its_frames_are_final(tmp_path):
    """Per-utterance normalisation: nothing streams, partials rerun the audio so far from zero, and the
    search runs over the frames at the end; the stream's final text is still the one-shot text."""
    from native_client.stream import Utterance

    model = open_model(_untrained(tmp_path, normalize=True)[0])
    assert not Utterance(model.runner).incremental
    for clip in CLIPS[:2]:
        samples = _samples(clip)
        frames = model.logits(samples)
        stream = Stream(model.runner, model.beam_search, model.greedy)
        partials = []
        for start in range(0, len(samples), 8 * TENTH):
            stream.feed_audio(samples[start : start + 8 * TENTH])
            partials.append(stream.intermediate_decode())
        assert partials[-1] and len(set(partials)) > 1
        assert stream.finish() == model.beam_search.decode(frames)
        assert stream.intermediate_decode() == model.greedy.decode(frames)


def _client(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "native_client", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=180,
    )


def test_the_command_line_client_decodes_with_beam_search_and_ignores_a_scorer(export, tmp_path):
    model = open_model(export)
    clip = CLIPS[1]
    beam = model.beam_search.decode(model.logits(_samples(clip)))
    result = _client("--model", str(export), "--audio", str(clip))
    assert result.returncode == 0 and result.stdout.strip() == beam, result.stderr
    greedy = _client("--model", str(export), "--audio", str(clip), "--no-scorer")
    assert greedy.stdout.strip() == model.greedy.decode(model.logits(_samples(clip)))
    arpa = tmp_path / "lm.arpa"
    arpa.write_text("\\data\\\nngram 1=1\n\n\\1-grams:\n-1.0\ta\n\n\\end\\\n")
    # the LM's options: the transducer's search ignores them, which the client says once
    ignored = _client(
        "--model", str(export), "--audio", str(clip), "--scorer", str(arpa), "--lm_alpha", "0.5"
    )
    warnings = [line for line in ignored.stderr.splitlines() if line.startswith("warning:")]
    assert ignored.returncode == 0 and ignored.stdout.strip() == beam, ignored.stderr
    assert warnings == [
        "warning: --scorer, --lm_alpha: ignored: this export is a transducer, whose search reads no language "
        "model (shallow fusion is not built)"
    ]
    refused = _client("--model", str(export), "--audio", str(clip), "--beam_width", "2000")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode != 0 and len(errors) == 1, refused.stderr
    assert "--beam_width: a transducer's beam search keeps at most 1024" in errors[0]
    narrow = _client("--model", str(export), "--audio", str(clip), "--beam_width", "1")
    parts = model.beam_search.parts
    one = TransducerDecoder(parts, model.metadata.alphabet, 1, 4).decode(model.logits(_samples(clip)))
    assert narrow.returncode == 0 and narrow.stdout.strip() == one


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "beam"])
def test_the_server_streams_and_batches_the_transducer(export, greedy):
    """Eight streams at once, the encoder batched: each ends with the one-shot text of the decoder the
    server was started with (greedy with --no-scorer; else the export's modified beam search)."""
    model = open_model(export)
    decoder = model.greedy if greedy else model.beam_search
    one_shot = {clip: Model(export, decoder=decoder).transcribe_file(clip).text for clip in CLIPS}
    assert one_shot == {clip: decoder.decode(model.logits(_samples(clip))) for clip in CLIPS}
    running = Server(export, greedy=greedy)
    try:

        async def main():
            clips = [CLIPS[i % len(CLIPS)] for i in range(8)]
            results = await asyncio.gather(*(_stream(running.url, clip) for clip in clips))
            return clips, results, await _status(running)

        clips, results, status = asyncio.run(main())
    finally:
        running.stop()
    assert f"decoder {decoder.name}" in running.banner
    for clip, (text, replies, _) in zip(clips, results, strict=True):
        assert text == one_shot[clip], clip
        assert any(reply.get("partial") for reply in replies)
    assert status["largest_batch"] > 1 and status["streams"] == 0


def test_what_a_transducer_export_cannot_do_is_one_line(export, tmp_path):
    from pipeline.config import ConfigError
    from pipeline.data.aligner import Aligner

    with pytest.raises(ExportError, match=r"frozen_graph backend holds the encoder only"):
        Model(export, backend="frozen_graph")
    from native_client.decoders.greedy import GreedyDecoder

    ctc = GreedyDecoder(load_metadata(export).alphabet)
    with pytest.raises(ExportError, match=r"decodes with its own searches .* not with the greedy decoder"):
        Model(export, decoder=ctc)
    with pytest.raises(ExportError, match=r"not with the greedy decoder"):
        open_model(export, decoder_factory=lambda metadata: ctc)
    with pytest.raises(ExportError, match=r"a transducer export; alignment and cleaning read a CTC"):
        Aligner(export)
    for key in ("onnx", "coqui_tflite"):
        with pytest.raises(ConfigError, match=rf"export\.{key}: .* a transducer's predictor and joiner"):
            _config(tmp_path, **{key: True})
    from native_client.export_decoder import decoder_for_export

    assert open_model(export, decoder_factory=decoder_for_export).decoder.name == "transducer-beam4"
    with pytest.raises(ValueError, match=r"lm.arpa: this export is a transducer, whose search reads no"):
        decoder_for_export(load_metadata(export), scorer=tmp_path / "lm.arpa")
    raw = json.loads((export / "metadata.json").read_text())
    for damage, says in (
        (lambda m: m["transducer"].update(blank=27), r"transducer\.blank: "),
        (lambda m: m["transducer"].update(context_size=0), r"transducer\.context_size: "),
        (lambda m: m["transducer"]["join"].pop("frames"), r"transducer\.join: expected the names"),
        (lambda m: m.update(format_version=6), r"transducer: a format 7 entry in a format 6 export"),
        (lambda m: m.update(decoder={"lm": "lm.arpa"}), r"decoder\.lm: a transducer's search reads no"),
        (
            lambda m: m["transducer"].update(context_size=3),
            r"transducer\.predict\.input: 'contexts' is shaped",
        ),
        (lambda m: m["transducer"]["join"].update(output="scores"), r"transducer\.join\.output: join has no"),
        (
            lambda m: m["transducer"]["predict"].update(signature="p"),
            r"transducer\.predict\.signature: the model has",
        ),
    ):
        edited = tmp_path / "edited"
        shutil.rmtree(edited, ignore_errors=True)
        shutil.copytree(export, edited)
        entry = json.loads(json.dumps(raw))
        damage(entry)
        (edited / "metadata.json").write_text(json.dumps(entry))
        write_manifest(edited)
        for backend in ("tflite", "saved_model"):
            with pytest.raises(ExportError, match=rf"{edited / 'metadata.json'}: {says}"):
                Model(edited, backend=backend)
