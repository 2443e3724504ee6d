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
from native_client.server.engine import BatchEngine
from native_client.stream import Utterance
from native_client.utterances import UtteranceLoop
from native_client.vad import Cutter
from tests.conftest import ROOT, SAMPLE

CLIP = SAMPLE / "test" / "00000.flac"


def _conformer_export(out):
    """An untrained tiny Conformer (chunks of 3 labels of 4 frames, look-back frames), TFLite."""
    import tensorflow as tf

    from pipeline.config_loader import load_config
    from pipeline.features.frontend import feature_pipeline
    from pipeline.layout import Layout
    from pipeline.model import build_model
    from pipeline.model.weights import named_weights
    from pipeline.stages.export import export_stage
    from tests.test_conformer_stream import TINY

    config = load_config(
        ROOT / "configs" / "sample.yaml",
        {
            "paths": {"work_dir": str(out / "work"), "export_dir": str(out / "export")},
            "features": {"type": "mfcc", "normalize": False},
            "model": {
                "architecture": "conformer",
                "conformer": {**TINY, "subsampling": 4, "chunk_frames": 3, "left_chunks": 2},
            },
        },
    )
    model = build_model(config.model, feature_pipeline(config.features).feature_size, 29)
    prefix = tf.train.Checkpoint(weights=named_weights(model)).write(str(out / "ckpt" / "untrained"))
    return export_stage(Layout(config), checkpoint=prefix, with_lm=False).root


@pytest.fixture(scope="module", params=["deepspeech", "conformer"])
def export(request, tmp_path_factory):
    """A small untrained export of each streaming kind."""
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "deepspeech":
        from tests.test_serve import untrained_export

        return untrained_export(out, 64), StreamInput.WINDOWS
    return _conformer_export(out), StreamInput.FRAMES


def _server_side(model: Model, pieces: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """The server's path over ``pieces``: the voice-activity loop (no detector: one utterance) and the
    batching engine on the client's runner; the logits after each piece and those of the ended utterance."""

    async def main():
        engine = BatchEngine(BatchRunner(model.runner))
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
                if loop.utterance is not None:
                    partial.append(loop.utterance.logits().copy())
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
    utterance, taken = Utterance(model.runner), []
    for start in range(0, len(samples), 1777):
        utterance.feed_audio(samples[start : start + 1777])
        run_ready(model.runner, utterance)
        taken.append(utterance.take_logits())
    utterance.finish()
    run_ready(model.runner, utterance)
    taken.append(utterance.take_logits())
    assert sum(1 for part in taken if len(part)) > 2
    np.testing.assert_array_equal(np.concatenate(taken), utterance.logits())
