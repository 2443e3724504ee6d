"""The Conformer streamed: chunk masks, the streaming call over its caches against the chunked computation,
and the int8 TFLite export streamed by the client and served (batched) by the server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from native_client.alphabet import parse_alphabet
from native_client.audio import load_for_model
from native_client.batching import batch_runner
from native_client.decoders.greedy import GreedyDecoder
from native_client.model import Model
from pipeline.config_loader import config_from_dict, load_config
from pipeline.features.frontend import feature_pipeline
from pipeline.layout import Layout
from pipeline.model import build_model, model_family
from pipeline.model.weights import named_weights
from pipeline.stages.export import export_stage
from tests.conftest import ALPHABET, ROOT, SAMPLE

CLIPS = [SAMPLE / "test" / f"{i:05d}.flac" for i in range(4)]
TINY = {"d_model": 32, "heads": 2, "layers": 2, "conv_kernel": 5, "subsampling_channels": 8}
# The int8 TFLite model against the float one: dynamic-range int8 weights, float activations. Measured on
# the tiny untrained models here (logits up to about 4): 0.03 at most; what it keeps is the greedy text.
INT8_TOLERANCE = 0.15


def _config(**settings):
    return config_from_dict({"model": {"architecture": "conformer", "conformer": {**TINY, **settings}}})


def _calls(family, config, frames: np.ndarray) -> list[np.ndarray]:
    """The streaming form's inputs over ``frames`` ``[time, n_input]``: look-back, then whole chunks (zero
    frames before and after the utterance)."""
    spec = family.stream_input(config.model, 0)
    count = -(-len(frames) // spec.chunk)
    padded = np.zeros((spec.lookback + count * spec.chunk, frames.shape[1]), np.float32)
    padded[spec.lookback : spec.lookback + len(frames)] = frames
    return [padded[k * spec.chunk : k * spec.chunk + spec.lookback + spec.chunk] for k in range(count)]


def _stream(form, family, config, frames: np.ndarray, reset: bool = False) -> np.ndarray:
    """Logits of ``frames`` through the streaming form call by call (``reset``: zero caches at every call)."""
    zero = [tf.zeros(s.shape) for s in family.state(config.model)]
    state, outputs = zero, []
    for inputs in _calls(family, config, frames):
        logits, *state = form.step(inputs[None], *(zero if reset else state))
        outputs.append(logits.numpy()[0])
    return np.concatenate(outputs)[: -(-len(frames) // config.model.options.subsampling)]


def _clip_frames(subsampling: int = 4) -> tuple:
    config = _config(subsampling=subsampling)
    frames = feature_pipeline(config.features).frames(load_for_model(CLIPS[0], 16000))
    return config, frames


@pytest.mark.parametrize("subsampling, chunk, left", [(1, 3, 2), (2, 4, 1), (4, 3, 2), (8, 2, 3)])
def test_the_streaming_form_call_by_call_equals_the_chunked_computation(subsampling, chunk, left):
    config = _config(subsampling=subsampling, chunk_frames=chunk, left_chunks=left)
    family = model_family("conformer")
    model = build_model(config.model, 26, 29)
    frames = np.random.default_rng(0).standard_normal((203, 26)).astype(np.float32)
    expected = family.utterance(model, frames[None]).numpy()[0]
    assert len(expected) == -(-203 // subsampling)
    form = family.streaming(model, 0)
    np.testing.assert_allclose(_stream(form, family, config, frames), expected, atol=2e-5)
    # chunked is not full context: each label sees its chunk and `left` chunks before it only
    assert np.abs(model(frames[None]).numpy()[0] - expected).max() > 1e-2


def test_batched_streams_each_get_their_own_calls():
    config = _config(chunk_frames=3, left_chunks=2)
    family = model_family("conformer")
    model = build_model(config.model, 26, 29)
    form = family.streaming(model, 0)
    assert form.batched
    rng = np.random.default_rng(1)
    utterances = [rng.standard_normal((n, 26)).astype(np.float32) for n in (60, 24, 48)]
    calls = [_calls(family, config, frames) for frames in utterances]
    states = [[tf.zeros(s.shape) for s in family.state(config.model)] for _ in utterances]
    outputs: list[list] = [[] for _ in utterances]
    for step in range(max(len(c) for c in calls)):
        live = [i for i in range(len(calls)) if step < len(calls[i])]  # streams end at different calls
        inputs = np.stack([calls[i][step] for i in live])
        batch_state = [tf.concat([states[i][k] for i in live], 0) for k in range(len(states[0]))]
        logits, *new = form.batch_step(inputs, *batch_state)
        for row, i in enumerate(live):
            outputs[i].append(logits.numpy()[row])
            states[i] = [value[row : row + 1] for value in new]
    for frames, out in zip(utterances, outputs, strict=True):
        expected = family.utterance(model, frames[None]).numpy()[0]
        np.testing.assert_allclose(np.concatenate(out)[: len(expected)], expected, atol=2e-5)


def test_the_caches_carry_the_left_context_so_tokens_across_chunks_decode_as_in_one_call():
    config, frames = _clip_frames()
    family = model_family("conformer")
    model = build_model(config.model, frames.shape[1], 29)
    form = family.streaming(model, 0)
    greedy = GreedyDecoder(parse_alphabet(ALPHABET.read_text(), str(ALPHABET)))
    whole = family.utterance(model, frames[None]).numpy()[0]
    streamed = _stream(form, family, config, frames)
    reset = _stream(form, family, config, frames, reset=True)
    chunk = config.model.options.chunk_frames
    # an untrained model's labels run across chunk boundaries (a letter over several labels)
    path = whole.argmax(-1)
    split = [b for b in range(chunk, len(path), chunk) if path[b - 1] == path[b] != 28]
    assert split
    np.testing.assert_allclose(streamed, whole, atol=2e-5)
    assert greedy.decode(streamed) == greedy.decode(whole)
    # without the caches, the first chunk is the same and every later one is not
    np.testing.assert_allclose(reset[:chunk], whole[:chunk], atol=2e-5)
    differs = [np.abs(reset - whole)[k : k + chunk].max() for k in range(chunk, len(whole), chunk)]
    assert min(differs) > 1e-3, differs
    assert greedy.decode(reset) != greedy.decode(whole)


def test_dynamic_chunks_draw_full_context_and_small_chunks_reproducibly():
    config = _config()
    model = build_model(config.model, 26, 29)
    draws = [tuple(int(t) for t in model.draw_chunk()) for _ in range(200)]
    chunks = {chunk for chunk, full in draws if not full}
    fulls = sum(full for _, full in draws)
    assert 60 < fulls < 140
    assert chunks <= set(range(1, 26)) and len(chunks) > 20
    again = build_model(config.model, 26, 29)  # the same seed: the same draws (and a resumed run too)
    assert [tuple(int(t) for t in again.draw_chunk()) for _ in range(200)] == draws


def test_a_drawn_chunk_does_not_depend_on_what_an_utterance_is_batched_with():
    """Training's chunk draws: an utterance's logits are the same in a batch and in a part of it (what a
    tower gets of a global batch), draw for draw. The draw read the batch's longest utterance (two towers
    drew other chunks than one device for the same step), and the longest utterance's last chunk lacked
    the labels of zero frames the others' had."""
    config = _config(dropout=0.0, attention_dropout=0.0)
    family = model_family("conformer")
    whole, part = build_model(config.model, 26, 29), build_model(config.model, 26, 29)
    rng = np.random.default_rng(3)
    lengths = [150, 97, 61, 23]  # 38, 25, 16 and 6 labels
    batch = np.zeros((4, 150, 26), np.float32)
    for row, length in enumerate(lengths):
        batch[row, :length] = rng.standard_normal((length, 26))
    for _ in range(12):  # chunks and full context: the same random state in both models
        one, _ = family.forward(whole, batch, tf.constant(lengths), training=True)
        tower, _ = family.forward(part, batch[2:, :61], tf.constant(lengths[2:]), training=True)
        for row in (2, 3):
            labels = -(-lengths[row] // 4)
            np.testing.assert_allclose(tower.numpy()[row - 2, :labels], one.numpy()[row, :labels], atol=2e-5)


def test_the_training_step_with_drawn_chunks_compiles_with_xla():
    """training.jit_compile: the drawn chunk sizes shape nothing XLA must know (a batch padded to whole
    drawn chunks did not compile: 'shape ... depends on a stateful operation such as a random number
    generator'). XLA's random numbers are not the plain step's: its draws are others."""
    import keras

    from pipeline.config import TrainingConfig
    from pipeline.model.heads import OneTask
    from pipeline.train.step import task_gradients

    config = _config(dropout=0.0, attention_dropout=0.0)
    model = OneTask(build_model(config.model, 26, 29))
    step = task_gradients(model, (0,), [28], keras.optimizers.Adam(), TrainingConfig(jit_compile=True))
    features = tf.constant(np.random.default_rng(4).standard_normal((2, 90, 26)).astype(np.float32))
    batch = (features, tf.constant([90, 61]), tf.constant([[1, 2, 3], [4, 5, 0]]), tf.constant([3, 2]), None)
    losses = [float(step((batch,), tf.constant([0.5]))[2]) for _ in range(8)]
    assert np.isfinite(losses).all() and len(set(losses)) > 2, losses  # chunks and full context drawn


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """An untrained tiny Conformer (10 ms MFCC, 4x subsampling, chunks of 3 labels, 2 left chunks), int8
    TFLite with the batched signature, exported by the real Export code."""
    out = tmp_path_factory.mktemp("conformer-stream")
    config = load_config(
        ROOT / "configs" / "sample.yaml",
        {
            "paths": {"work_dir": str(out / "work"), "export_dir": str(out / "export")},
            "features": {"type": "mfcc", "normalize": False},
            "model": {
                "architecture": "conformer",
                "conformer": {**TINY, "subsampling": 4, "chunk_frames": 3, "left_chunks": 2},
            },
            "export": {"quantize": True},
        },
    )
    model = build_model(config.model, feature_pipeline(config.features).feature_size, 29)
    prefix = tf.train.Checkpoint(weights=named_weights(model)).write(str(out / "ckpt" / "untrained"))
    return export_stage(Layout(config), checkpoint=prefix, with_lm=False).root, model


def test_the_client_streams_an_exported_conformer_fed_any_number_of_samples(export):
    root, model = export
    metadata = json.loads((root / "metadata.json").read_text())
    assert metadata["streaming"] == {
        "input": "frames",
        "chunk": 12,
        "context": 0,
        "lookahead": 0,
        "lookback": 3,
    }
    assert metadata["n_steps"] == 12 and metadata["stride"] == 4
    names = [s["input"] for s in metadata["tensors"]["state"]]
    assert names == ["cache_count", "block_0_attention", "block_0_conv", "block_1_attention", "block_1_conv"]
    assert metadata["tensors"]["batch_signature"] == "stream_batch"
    samples = load_for_model(CLIPS[0], 16000)
    sizes = np.random.default_rng(2).integers(1, 3000, size=len(samples)).tolist()
    for backend in ("tflite", "saved_model", "frozen_graph"):
        client = Model(root, backend=backend)
        frames = client.metadata.features.frames(samples)
        chunked = model(frames[None], chunk=3).numpy()[0]
        one_shot = client.logits(samples)  # the streaming calls over the whole utterance
        np.testing.assert_allclose(one_shot, chunked, atol=INT8_TOLERANCE if backend == "tflite" else 2e-5)
        stream, start = client.create_stream(), 0
        for size in sizes:  # blocks of 1 to 3000 samples: chunks cut anywhere
            if start >= len(samples):
                break
            stream.feed_audio(samples[start : start + size])
            start += size
            partial = stream.logits()  # the labels so far are final: no look-ahead to revise them
            np.testing.assert_allclose(partial, one_shot[: len(partial)], atol=1e-6)
            assert stream.intermediate_decode() == client.greedy.decode(partial)
        assert 0 < len(partial) < len(one_shot)
        np.testing.assert_allclose(stream.flush(), one_shot, atol=1e-6)
        assert client.transcribe(samples) == client.greedy.decode(one_shot)


def test_the_tflite_client_of_a_conformer_keeps_litert_set_up_lines_off_stderr(export):
    """The Conformer's TFLite runs in LiteRT's Interpreter (the weight cache computed its int8 batched
    signature wrongly): its first call printed "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."."""
    root, _ = export
    result = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(root), "--audio", str(CLIPS[1])]
        + ["--no-scorer"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "XNNPACK delegate" not in result.stderr, result.stderr


def test_the_model_card_describes_the_conformer_not_deepspeechs_width(export):
    """The card said "conformer (n_hidden 384)": sample.yaml's DeepSpeech width, which a Conformer has not."""
    root, _ = export
    card = json.loads((root / "metadata.json").read_text())["card"]["model"]
    assert card["n_hidden"] is None
    assert card["settings"] == {
        **TINY,
        "subsampling": 4,
        "ff_mult": 4,
        "dropout": 0.1,
        "attention_dropout": 0.1,
        "chunk_frames": 3,
        "left_chunks": 2,
    }
    text = (root / "MODEL_CARD.md").read_text()
    assert "n_hidden" not in text
    assert "- Architecture: conformer (d_model 32, heads 2, layers 2, conv_kernel 5, subsampling 4," in text


def test_the_server_serves_a_conformer_batched(export):
    from tests.test_serve import Server
    from tests.test_serve import _stream as stream_clip

    root, _ = export
    one_shot = {clip: Model(root).transcribe_file(clip).text for clip in CLIPS}
    assert len(set(one_shot.values())) == len(CLIPS)
    runner = batch_runner(Model(root).runner)
    assert runner.batched
    server = Server(root)
    try:
        assert "batched up to 64 streams" in server.banner

        async def main():
            clips = [CLIPS[i % len(CLIPS)] for i in range(8)]
            return clips, await asyncio.gather(*(stream_clip(server.url, clip) for clip in clips))

        clips, results = asyncio.run(main())
    finally:
        server.stop()
    for clip, (text, _, _) in zip(clips, results, strict=True):
        assert text == one_shot[clip], clip


@pytest.mark.long
@pytest.mark.slow
def test_a_resumed_run_draws_the_same_chunks_as_an_uninterrupted_one(small_config, tmp_path):
    """The chunk sizes come from a random state kept in the checkpoint: one epoch, then a second in another
    process's run, ends with the weights of two epochs at once."""
    from pipeline.stages.train import train_stage
    from tests.conftest import build_features

    conformer = (
        "features: {type: mfcc, normalize: false}\nmodel:\n  architecture: conformer\n"
        "  conformer: {d_model: 32, heads: 2, layers: 2, conv_kernel: 5, subsampling_channels: 8,"
        " dropout: 0.0, attention_dropout: 0.0}\n"
    )

    def run(name: str, epochs: int, work: str):
        extra = (
            conformer + f"training: {{epochs: {epochs}, validation_epochs: 0}}\npaths: {{work_dir: {work}}}\n"
        )
        config = load_config(small_config(name, limit_train=12, limit_dev=4, extra=extra))
        build_features(config, ("train", "dev"))
        return train_stage(Layout(config))

    straight = run("straight.yaml", 2, tmp_path / "straight")
    assert run("first.yaml", 1, tmp_path / "resumed").epochs_completed == 1
    resumed = run("second.yaml", 2, tmp_path / "resumed")
    assert resumed.epochs_completed == straight.epochs_completed == 2
    assert resumed.weights_sha256 == straight.weights_sha256
