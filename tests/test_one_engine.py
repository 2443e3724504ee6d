"""One stream engine (issue 43): the client's ``Stream`` and the server's path (the voice-activity loop's
``Utterance``s stepped by the ``BatchEngine``) give the same logits for the same audio fed in odd-sized
pieces, chunk for chunk, for a DeepSpeech export (context windows) and a Conformer's (chunks of frames);
the export's streaming entry is read as a typed ``StreamSpec``."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from native_client.audio import load_for_model
from native_client.batching import BatchRunner
from native_client.metadata import StreamInput, StreamSpec
from native_client.model import Model
from native_client.server.decoding import ThreadDecoding
from native_client.server.engine import BatchEngine
from native_client.stream import Utterance
from native_client.utterances import UtteranceLoop
from native_client.vad import Cutter
from tests.conftest import ROOT, SAMPLE

CLIP = SAMPLE / "test" / "00000.flac"


def _untrained_export(out, features: dict, model: dict):
    """An untrained export of the sample geometry with these ``features`` and ``model`` settings (random
    weights: any difference in the logits shows), TFLite with the batched signature."""
    import tensorflow as tf

    from pipeline.config_loader import load_config
    from pipeline.features.frontend import feature_pipeline
    from pipeline.layout import Layout
    from pipeline.model import build_model
    from pipeline.model.weights import named_weights
    from pipeline.stages.export import export_stage

    config = load_config(
        ROOT / "configs" / "sample.yaml",
        {
            "paths": {"work_dir": str(out / "work"), "export_dir": str(out / "export")},
            "features": features,
            "model": model,
        },
    )
    built = build_model(config.model, feature_pipeline(config.features).feature_size, 29)
    prefix = tf.train.Checkpoint(weights=named_weights(built)).write(str(out / "ckpt" / "untrained"))
    return export_stage(Layout(config), checkpoint=prefix, with_lm=False).root


@pytest.fixture(scope="module", params=["deepspeech", "conformer", "normalised"])
def export(request, tmp_path_factory):
    """A small untrained export of each streaming kind (windows, frames), and one normalised per utterance
    (nothing runs before the end; partials rerun the audio so far)."""
    from tests.test_conformer_stream import TINY

    out = tmp_path_factory.mktemp(request.param)
    if request.param == "conformer":
        conformer = {**TINY, "subsampling": 4, "chunk_frames": 3, "left_chunks": 2}
        features, model = (
            {"type": "mfcc", "normalize": False},
            {"architecture": "conformer", "conformer": conformer},
        )
        return _untrained_export(out, features, model), StreamInput.FRAMES
    normalize = request.param == "normalised"
    return _untrained_export(out, {"normalize": normalize}, {"n_hidden": 64}), StreamInput.WINDOWS


def _server_side(model: Model, pieces: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """The server's path over ``pieces``: the voice-activity loop (no detector: one utterance) and the
    batching engine on the client's runner; the logits after each piece and those of the ended utterance."""

    async def main():
        engine = BatchEngine(BatchRunner(model.runner), ThreadDecoding(model.decoder))
        engine.start()
        loop = UtteranceLoop(model.runner, Cutter(sum(len(p) for p in pieces) + 1))
        partial, ended = [], []
        try:
            for index, piece in enumerate(pieces):
                for step in loop.feed(piece, final=index == len(pieces) - 1):
                    if isinstance(step, Utterance):
                        logits, state = await engine.run(step.ready(), step.state)
                        step.accept(logits, state)
                    else:
                        ended.append(step)
                utterance = loop.utterance
                if utterance is not None and utterance.incremental:
                    partial.append(utterance.logits().copy())
                elif utterance is not None:  # the session's partial: a rerun of the audio so far
                    logits, _ = await engine.run(utterance.rerun(), utterance.zero_state)
                    partial.append(logits)
        finally:
            await engine.stop()
        assert len(ended) == 1
        return partial, ended[0].logits

    return asyncio.run(main())


def test_client_stream_and_server_utterance_give_identical_logits_fed_odd_pieces(export):
    root, kind = export
    model = Model(root)
    assert isinstance(model.metadata.streaming, StreamSpec) and model.metadata.streaming.input is kind
    raw = json.loads((root / "metadata.json").read_text())["streaming"]
    assert raw["input"] == kind.value  # the file's format is unchanged: a plain string
    samples = load_for_model(CLIP, 16000)
    sizes = np.random.default_rng(7).integers(1, 2500, size=len(samples)).tolist()
    pieces, start = [], 0
    for size in sizes:
        if start >= len(samples):
            break
        pieces.append(samples[start : start + size])
        start += size
    stream, client_partial = model.create_stream(), []
    for piece in pieces:
        stream.feed_audio(piece)
        client_partial.append(stream.logits().copy())
    client_final = stream.flush()
    server_partial, server_final = _server_side(model, pieces)
    # chunk for chunk: the same logits after every piece, not only at the end
    assert len(server_partial) == len(pieces) - 1
    for client, server in zip(client_partial, server_partial, strict=False):
        np.testing.assert_array_equal(client, server)
    assert 0 < len(client_partial[len(pieces) // 2]) < len(client_final)
    np.testing.assert_array_equal(client_final, server_final)
    np.testing.assert_allclose(client_final, model.logits(samples), atol=1e-5)


def test_an_utterance_hands_out_the_encoder_output_chunk_by_chunk(export):
    """The hook of a decoder that runs parts of the model between chunks (a transducer's): ``take_logits``
    gives the logits accepted since its last call, which add up to the utterance's."""
    from native_client.stream import run_ready

    root, _ = export
    model = Model(root)
    samples = load_for_model(CLIP, 16000)
    utterance, taken = Utterance(model.runner, keep_new=True), []
    for start in range(0, len(samples), 1777):
        utterance.feed_audio(samples[start : start + 1777])
        run_ready(model.runner, utterance)
        taken.append(utterance.take_logits())
    utterance.finish()
    run_ready(model.runner, utterance)
    taken.append(utterance.take_logits())
    # as the chunks run when the export streams; all at the end for one normalised per utterance
    parts = sum(1 for part in taken if len(part))
    assert parts > 2 if utterance.incremental else parts == 1
    np.testing.assert_array_equal(np.concatenate(taken), utterance.logits())


class _WholeOnly:
    """``runner``'s model as one without a streaming form: its metadata says none, and its ``utterance``
    runs the whole frames (here through the real streaming calls, which give the same logits)."""

    def __init__(self, runner):
        import dataclasses

        self.real = runner
        self.metadata = dataclasses.replace(runner.metadata, streaming=None)

    def zero_state(self):
        """No state: the model runs whole utterances."""
        return ()

    def step(self, inputs, state):
        """Never called for a model without a streaming form."""
        raise AssertionError("a streaming call on a model without a streaming form")

    def utterance(self, frames):
        """The whole utterance's logits."""
        from native_client.stream import run_frames

        return run_frames(self.real, frames)[0]


def test_a_model_without_a_streaming_form_runs_once_through_the_same_engine(export):
    """The client's ``Stream`` of such a model (``--vad``, ``transcribe_file``) is an ``Utterance`` that
    keeps its frames and runs them whole at the end; its partials rerun what came so far."""
    from native_client.decoders.greedy import GreedyDecoder
    from native_client.stream import Stream

    root, _ = export
    model = Model(root)
    runner = _WholeOnly(model.runner)
    samples = load_for_model(CLIP, 16000)
    stream = Stream(runner, GreedyDecoder(model.metadata.alphabet))
    assert not stream.utterance.incremental
    half = len(samples) // 2
    stream.feed_audio(samples[:999])
    stream.feed_audio(samples[999:half])
    partial = stream.logits()  # a rerun of the frames so far
    assert 0 < len(partial) <= len(model.logits(samples[:half]))
    stream.feed_audio(samples[half:])
    np.testing.assert_allclose(stream.flush(), model.logits(samples), atol=1e-5)


def test_the_sessions_partials_are_the_greedy_text_of_the_server_paths_logits(export):
    """The WebSocket session itself (``RecognizerSession`` on audio threads, over the engine) answers each
    piece with the greedy text of the logits the server's path has after it: an incremental export's from
    the utterance so far, made on the audio thread with the message's last step; a normalised one's from a
    rerun of the audio so far through the engine (every message here: ``partial_interval_s`` 0)."""
    from concurrent.futures import ThreadPoolExecutor

    from native_client.model import open_model
    from native_client.server.app import Limits, Service
    from native_client.server.session import RecognizerSession

    model = open_model(export[0])
    samples = load_for_model(CLIP, 16000)
    pieces = np.array_split(samples, 7)
    expected, _ = _server_side(model, pieces)

    async def main():
        engine = BatchEngine(BatchRunner(model.runner), ThreadDecoding(model.decoder))
        engine.start()
        threads = ThreadPoolExecutor(2)
        service = Service(
            model,
            engine,
            Limits(),
            None,
            max_utterance_s=600.0,
            partial_interval_s=0.0,
            audio_threads=threads,
        )
        session = RecognizerSession(service)
        try:
            return [await session.audio(piece.astype("<i2").tobytes()) for piece in pieces[:-1]]
        finally:
            await engine.stop()
            threads.shutdown()

    replies = asyncio.run(main())
    assert replies == [{"partial": model.greedy.decode(logits)} for logits in expected]
    assert any(reply["partial"] for reply in replies)  # random weights still emit some labels
