"""deepspeech-serve: vosk-server's protocol over a real WebSocket client, batched streams, limits, POST /stt;
the client's --vad and --format srt; per-word confidence."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile
import tornado.httpclient
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.websocket import websocket_connect

from native_client.alphabet import Alphabet
from native_client.batching import batch_runner
from native_client.model import open_model
from native_client.transcripts import word_timings
from tests.conftest import ROOT, SAMPLE

CLIPS = [SAMPLE / "test" / f"{i:05d}.flac" for i in range(8)]
CHUNK = 3200  # 0.2 s at 16 kHz, as vosk-server's test client sends


def untrained_export(out: Path, n_hidden: int) -> Path:
    """An untrained model of the sample geometry with ``n_hidden`` units (random weights: greedy decoding
    gives a different string of letters for every clip, so any difference in the logits shows in the
    text), unnormalised features (incremental streams), exported with the real Export code: TFLite with
    the batched signature."""
    import tensorflow as tf

    from pipeline.config_loader import load_config
    from pipeline.features.frontend import feature_pipeline
    from pipeline.layout import Layout
    from pipeline.model import build_model
    from pipeline.model.checkpoints import named_weights
    from pipeline.stages.export import export_stage

    config = load_config(
        ROOT / "configs" / "sample.yaml",
        {
            "paths": {"work_dir": str(out / "work"), "export_dir": str(out / "export")},
            "features": {"normalize": False},
            "model": {"n_hidden": n_hidden},
        },
    )
    model = build_model(config.model, feature_pipeline(config.features).feature_size, 29)
    prefix = tf.train.Checkpoint(weights=named_weights(model)).write(str(out / "ckpt" / "untrained"))
    return export_stage(Layout(config), checkpoint=prefix, with_lm=False).root


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A small untrained export (64 units; ``untrained_export``)."""
    return untrained_export(tmp_path_factory.mktemp("serve"), 64)


@pytest.fixture(scope="module")
def one_shot(export) -> dict[Path, str]:
    """The one-shot client's transcript of each clip (greedy)."""
    model = open_model(export)
    texts = {clip: model.transcribe_file(clip).text for clip in CLIPS}
    assert all(texts.values()) and len(set(texts.values())) == len(CLIPS)
    return texts


class Server:
    """``deepspeech-serve`` in a subprocess on a free loopback port; greedy unless given a ``scorer`` (or
    ``greedy`` False: the export's own decoder)."""

    def __init__(self, export: Path, *args: str, scorer: Path | None = None, greedy: bool = True):
        self.export = export
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "native_client.server.cli", "--model", str(export), "--port", "0"]
            + (["--scorer", str(scorer)] if scorer else ["--no-scorer"] if greedy else [])
            + list(args),
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        lines = []
        for line in self.process.stderr:
            lines.append(line)
            found = re.search(r"listening on ws://127\.0\.0\.1:(\d+)/", line)
            if found:
                self.port = int(found.group(1))
                self.banner = line
                break
        else:
            raise AssertionError("the server did not start:\n" + "".join(lines))
        self.url = f"ws://127.0.0.1:{self.port}/"
        self.http = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def server(export):
    servers = []

    def start(*args: str) -> Server:
        servers.append(Server(export, *args))
        return servers[-1]

    yield start
    for running in servers:
        running.stop()


async def _stream(url: str, clip: Path, config: dict | None = None) -> tuple[str, list[dict], list]:
    """Stream ``clip`` as vosk-server's test client does (a reply awaited after each frame); the joined
    text of the results, every reply, and what follows the eof result (None: the server closed)."""
    samples, rate = soundfile.read(clip, dtype="int16")
    ws = await websocket_connect(url)
    await ws.write_message(json.dumps({"config": config or {"sample_rate": rate}}))
    replies = []
    for start in range(0, len(samples), CHUNK):
        await ws.write_message(samples[start : start + CHUNK].tobytes(), binary=True)
        replies.append(json.loads(await ws.read_message()))
    await ws.write_message('{"eof" : 1}')
    replies.append(json.loads(await ws.read_message()))
    after = await ws.read_message()
    text = " ".join(r["text"] for r in replies if r.get("text"))
    return text, replies, after


async def _status(server: Server) -> dict:
    response = await AsyncHTTPClient().fetch(server.http + "/status")
    return json.loads(response.body)


def test_the_batched_signature_steps_each_stream_as_its_own_call(export):
    model = open_model(export)
    runner = batch_runner(model.runner)
    assert runner.batched
    meta = model.metadata
    rng = np.random.default_rng(0)
    windows = rng.normal(size=(5, meta.n_steps, 2 * meta.n_context + 1, meta.n_input)).astype(np.float32)
    states = [
        tuple(rng.normal(size=s.shape).astype(np.float32) for s in model.runner.zero_state())
        for _ in range(5)
    ]
    logits, new_states = runner.step(windows, states)
    for row, state, out, new in zip(windows, states, logits, new_states, strict=True):
        alone, alone_state = model.runner.step(row[None], state)
        np.testing.assert_allclose(out, alone, atol=1e-5)
        for a, b in zip(new, alone_state, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_sixteen_concurrent_streams_give_the_one_shot_text(export, one_shot, server):
    running = server()
    assert "loopback only" in running.banner and "batched" in running.banner

    async def main():
        clips = [CLIPS[i % len(CLIPS)] for i in range(16)]
        results = await asyncio.gather(*(_stream(running.url, clip) for clip in clips))
        return clips, results, await _status(running)

    clips, results, status = asyncio.run(main())
    for clip, (text, replies, after) in zip(clips, results, strict=True):
        assert text == one_shot[clip], clip
        assert after is None  # closed after the eof result, as vosk-server
        assert all(set(r) in ({"partial"}, {"result", "text"}) for r in replies)
        final = replies[-1]
        assert [w["word"] for w in final["result"]] == final["text"].split()
        for word in final["result"]:
            assert 0 <= word["conf"] <= 1 and 0 <= word["start"] <= word["end"]
    assert status["largest_batch"] > 1 and status["chunks"] > status["calls"]
    assert status["streams"] == 0


def test_resampled_stream_and_post_stt(export, one_shot, server):
    running = server()
    clip = CLIPS[0]
    samples, rate = soundfile.read(clip, dtype="int16")

    async def main():
        response = await AsyncHTTPClient().fetch(running.http + "/stt", method="POST", body=clip.read_bytes())
        try:
            await AsyncHTTPClient().fetch(running.http + "/stt", method="POST", body=b"not audio at all")
            bad = None
        except HTTPClientError as error:
            bad = error
        return json.loads(response.body), bad

    posted, bad = asyncio.run(main())
    client = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(clip), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    expected = json.loads(client.stdout)
    assert posted["text"] == expected["text"] == one_shot[clip]
    assert posted["transcripts"] == expected["transcripts"]
    assert set(posted) == set(expected)
    assert bad.code == 400 and "request body" in json.loads(bad.response.body)["error"]


KILLED_CLIENT = textwrap.dedent("""
    import asyncio, sys
    from tornado.websocket import websocket_connect

    async def main():
        ws = await websocket_connect(sys.argv[1])
        await ws.write_message(bytes(6400), binary=True)
        await ws.read_message()
        print("streaming", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())
""")


def test_refusals_drop_only_the_offending_connections(export, one_shot, server):
    running = server("--max-streams", "64", "--idle-timeout", "1", "--max-messages-per-s", "50")
    clip = CLIPS[1]

    async def refused(first, *rest) -> tuple[dict | None, int | None]:
        ws = await websocket_connect(running.url)
        for message in (first, *rest):
            await ws.write_message(message, binary=isinstance(message, bytes))
        reply = await ws.read_message()
        closing = await ws.read_message() if reply is not None else None
        return (json.loads(reply) if reply is not None else None), closing, ws.close_code

    async def idle() -> tuple[dict, None]:
        ws = await websocket_connect(running.url)
        return json.loads(await ws.read_message()), await ws.read_message()

    async def too_big():
        ws = await websocket_connect(running.url)
        try:
            await ws.write_message(bytes(100 << 20), binary=True)
        except Exception:  # the server may close before the frame is written
            pass
        reply = await ws.read_message()
        return reply, ws.close_code

    async def flood():
        ws = await websocket_connect(running.url)
        for _ in range(200):
            ws.write_message(bytes(2), binary=True)
        replies = []
        while (reply := await ws.read_message()) is not None:
            replies.append(json.loads(reply))
        return replies

    async def main():
        good = asyncio.ensure_future(_stream(running.url, clip))
        killed = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            KILLED_CLIENT,
            running.url,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert (await killed.stdout.readline()).strip() == b"streaming"
        killed.kill()
        await killed.wait()
        garbage = await refused("this is not json")
        unknown = await refused('{"config": {"sample_rate": 16000, "grammar": ["a"]}}')
        odd = await refused(bytes(3))
        rate = await refused('{"config": {"sample_rate": "fast"}}')
        zero = await refused('{"config": {"sample_rate": 0}}')
        big = await too_big()
        flooded = await flood()
        idlers = await asyncio.gather(*(idle() for _ in range(500)))
        text, _, after = await good
        while (status := await _status(running))["streams"]:  # the killed client's stream is released
            await asyncio.sleep(0.1)
        return garbage, unknown, odd, rate, zero, big, flooded, idlers, text, after, status

    garbage, unknown, odd, rate, zero, big, flooded, idlers, text, after, status = asyncio.run(main())
    assert "not JSON" in garbage[0]["error"] and garbage[1] is None
    assert "grammar" in unknown[0]["error"]
    assert "3 bytes" in odd[0]["error"]
    assert "sample_rate" in rate[0]["error"] and "sample_rate" in zero[0]["error"]
    # Tornado cuts the connection as soon as it reads the frame's header: the error (or the 1009 close)
    # reaches the client when it was read before the cut, else the client is simply dropped.
    reply, code = big
    assert reply is None or "frame larger" in json.loads(reply)["error"]
    assert code in (None, 1009)
    assert "messages a second" in flooded[-1]["error"]
    errors = [reply["error"] for reply, closing in idlers]
    assert all(closing is None for _, closing in idlers)
    assert all("too many streams" in e or "idle" in e for e in errors)
    assert any("too many streams" in e for e in errors) and any("idle" in e for e in errors)
    assert text == one_shot[clip] and after is None
    assert status["streams"] == 0
    assert running.process.poll() is None


def test_word_confidence_is_the_geometric_mean_of_the_path_probabilities():
    alphabet = Alphabet(tuple(" ab"))
    blank = alphabet.blank_index
    path = [1, 1, blank, 2, 0, 2]  # "ab b": word "ab" on frames 0-3, "b" on frame 5
    probabilities = np.full((6, alphabet.n_classes), 0.1)
    probabilities[np.arange(6), path] = [0.9, 0.8, 0.5, 0.6, 0.9, 0.3]
    words = word_timings(path, alphabet, 0.02, log_probs=np.log(probabilities))
    assert [w.word for w in words] == ["ab", "b"]
    assert words[0].confidence == pytest.approx((0.9 * 0.8 * 0.5 * 0.6) ** 0.25)
    assert words[1].confidence == pytest.approx(0.3)
    assert word_timings(path, alphabet, 0.02)[0].confidence is None


def test_srt_of_a_long_file_has_a_cue_at_each_clip(export, tmp_path):
    """Ten minutes: every test clip of the sample (65), each after 7 s of silence; the client with
    --format srt gives one cue per clip at the clip's time."""
    clips = sorted((SAMPLE / "test").glob("*.flac"))
    pieces, expected, at = [], [], 0
    rate = 16000
    for clip in clips:
        samples, clip_rate = soundfile.read(clip, dtype="int16")
        assert clip_rate == rate
        pieces += [np.zeros(int(7 * rate), np.int16), samples]
        at += int(7 * rate)
        expected.append((at / rate, (at + len(samples)) / rate))
        at += len(samples)
    pieces.append(np.zeros(2 * rate, np.int16))
    long_file = tmp_path / "long.flac"
    soundfile.write(long_file, np.concatenate(pieces), rate)
    assert at / rate > 590
    client = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(long_file)]
        + ["--format", "srt"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )

    def seconds(stamp: str) -> float:
        hours, minutes, rest = stamp.split(":")
        return int(hours) * 3600 + int(minutes) * 60 + float(rest.replace(",", "."))

    cues = re.findall(r"(\d+)\n(\S+) --> (\S+)\n(.+)\n\n", client.stdout)
    assert len(cues) == len(clips), client.stdout[:2000]
    for (_, start, end, text), (clip_start, clip_end) in zip(cues, expected, strict=True):
        assert abs(seconds(start) - clip_start) <= 0.3 and abs(seconds(end) - clip_end) <= 0.3, (start, end)
        assert text.strip()


def test_extended_shows_each_word_with_the_confidence_json_gives(export, capsys):
    """--extended printed the best transcript's text only; it now adds a line per word with the start,
    duration and confidence --json gives (POST /stt answers the same object)."""
    from native_client.__main__ import main as client

    for clip in CLIPS[:3]:
        assert client(["--model", str(export), "--audio", str(clip), "--json", "--no-scorer"]) == 0
        record = json.loads(capsys.readouterr().out)
        assert client(["--model", str(export), "--audio", str(clip), "--extended", "--no-scorer"]) == 0
        first, *lines = capsys.readouterr().out.splitlines()
        words = record["transcripts"][0]["words"]
        assert first == record["text"] and len(lines) == len(words) > 0
        for line, word in zip(lines, words, strict=True):
            start, duration, confidence, text = line.split("\t")
            assert (float(start), float(duration), float(confidence), text) == (
                word["start_time"],
                word["duration"],
                word["confidence"],
                word["word"],
            )


def test_the_shared_weights_runtime_gives_the_interpreters_outputs_bit_for_bit(export):
    """The export's TFLite model now runs through LiteRT's CompiledModel (XNNPACK with its weight cache,
    ``native_client.litert``); the Interpreter ran it before. Same kernels, the same numbers: both
    signatures, batches growing, shrinking and coming back (the compiled model is resized and keeps
    buffers per batch)."""
    from native_client.litert import InterpreterModel, SharedWeightsModel

    path = str(export / "model.tflite")
    compiled, interpreter = SharedWeightsModel(path, 1), InterpreterModel(path, 1)
    rng = np.random.default_rng(0)
    for signature, batch in [("stream", 1), ("stream_batch", 4), ("stream_batch", 1), ("stream", 1)] + [
        ("stream_batch", 2),
        ("stream_batch", 4),
    ]:
        feed = {
            name: rng.normal(0, 1, [batch, *shape[1:]]).astype(np.float32)
            for name, shape in compiled.input_shapes(signature).items()
        }
        got, expected = compiled.run(signature, feed), interpreter.run(signature, feed)
        assert set(got) == set(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{signature} {batch} {name}")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: bytes(b ^ 0x5A for b in data[:4096]) + data[4096:], id="garbage"),
        pytest.param(lambda data: b"", id="empty"),
    ],
)
def test_a_model_file_litert_cannot_read_is_one_line_naming_it(export, tmp_path, damage):
    """An export whose model.tflite LiteRT cannot read (a manifest rewritten over a damaged file: the
    manifest guards against accidents, not against this). LiteRT's CompiledModel does not verify the
    flatbuffer: the truncated file crashed the client (SIGSEGV, 5 runs in 6, stderr empty); the others
    ended in ``error: The model is not a valid Flatbuffer buffer``, naming no file, after the compiled
    model's environment logged its end. Now one error line that names the file."""
    from native_client.metadata import write_manifest

    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for item in ("metadata.json", "alphabet.txt"):
        (damaged / item).write_bytes((export / item).read_bytes())
    (damaged / "model.tflite").write_bytes(damage((export / "model.tflite").read_bytes()))
    write_manifest(damaged)
    result = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(damaged), "--audio", str(CLIPS[0])],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {damaged / 'model.tflite'}: "), result.stderr
    assert "DestroyAccelerator" not in result.stderr, result.stderr


def test_the_client_transcribes_with_stderr_closed(export, one_shot):
    """Run with file descriptor 2 closed (``2>&-``, as some daemon supervisors start programs), the
    client printed nothing and exited 1: the filter of LiteRT's set-up lines duplicated fd 2 and
    flushed ``sys.stderr`` (None then). With nothing to filter it now runs the model as it is; the
    Interpreter-based client worked so before."""
    command = [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(CLIPS[0])]
    result = subprocess.run(
        ["sh", "-c", '"$@" 2>&-', "sh", *command],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == one_shot[CLIPS[0]], result


@pytest.mark.parametrize("memfd", [True, False], ids=["linux", "no-memfd"])
def test_the_client_transcribes_without_a_writable_temporary_directory(export, one_shot, memfd):
    """On a read-only file system (a container's) there is no temporary directory: the TFLite client
    ended in ``error: [Errno 2] No such file or directory: '/nonexistent/tmp/tmp...'`` and transcribed
    nothing, because the filter of LiteRT's set-up lines captured stderr into a temporary file. It now
    captures into memory (``memfd_create``), still filtering; where that does not exist either, it runs
    unfiltered. (Python's ``tempfile.tempdir`` pointed nowhere stands for the read-only file system.)"""
    script = textwrap.dedent(f"""
        import os, sys, tempfile
        tempfile.tempdir = "/nonexistent/tmp"
        if not {memfd}:
            del os.memfd_create
        from native_client.__main__ import main
        sys.exit(main(["--model", {str(export)!r}, "--audio", {str(CLIPS[0])!r}]))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == one_shot[CLIPS[0]], result
    if memfd:  # still filtered: what is left is the two lines at the process's exit
        assert "Creating LiteRT environment" not in result.stderr, result.stderr


def test_long_audio_holds_the_model_once(export, tmp_path):
    """A 60-minute --format srt took 688 MiB with the full-size model, 512 MiB of it XNNPACK's copies of
    the LSTM's recurrent kernel: LiteRT's Interpreter gives XNNPACK no weight cache, so each of the
    streaming step's 16 unrolled operators (and the batched signature's 16) packed a copy of its own. With
    the cache each weight is packed once. Two untrained exports transcribe the same 3 minutes of clips and
    silences: the one with 512 units (12 MiB of float weights) may take at most three times its weights
    more than the one with 64 (measured: 16 MiB more; 154 MiB more before)."""
    from tests.conftest import run_with_peak_rss

    large = untrained_export(tmp_path / "large", 512)
    rate, pieces, rng = 16000, [], np.random.default_rng(0)
    clips = [soundfile.read(clip, dtype="int16")[0] for clip in sorted((SAMPLE / "test").glob("*.flac"))]
    while sum(len(p) for p in pieces) < 3 * 60 * rate:
        pieces += [clips[len(pieces) % len(clips)], np.zeros(int(rng.uniform(0.5, 3) * rate), np.int16)]
    audio = tmp_path / "three-minutes.wav"
    soundfile.write(audio, np.concatenate(pieces), rate)
    peaks = {}
    for name, model in (("small", export), ("large", large)):
        result, peaks[name] = run_with_peak_rss(
            [sys.executable, "-m", "native_client", "--model", str(model), "--audio", str(audio)]
            + ["--format", "srt"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert result.returncode == 0 and result.stdout.count(" --> ") > 20, result.stderr[-2000:]
    weights_mib = (large / "model.tflite").stat().st_size / 2**20
    assert peaks["large"] - peaks["small"] < 3 * weights_mib, (peaks, weights_mib)


# ---- the hostile round: option ranges, limits, origins, hostile frames


@pytest.mark.parametrize(
    "options, says",
    [
        (["--beam-width", "0"], "--beam_width: expected an integer of at least 1, got 0"),
        (["--lm-alpha", "nan"], "--lm_alpha: expected a finite number, got nan"),
        (["--threads", "0"], "--threads: expected an integer of at least 1, got 0"),
        (["--vocabulary", "words.txt"], "--vocabulary gives the words of a --scorer; name the KenLM"),
    ],
)
def test_the_server_refuses_the_model_options_the_client_refuses(tmp_path, capsys, options, says):
    """Its loader was a copy of the client's without the range checks: both now call one function."""
    from native_client.__main__ import main as client
    from native_client.server.cli import main as serve

    model = str(tmp_path / "no-export")
    assert serve(["--model", model, *options]) == 2
    served = capsys.readouterr().err
    assert client(["--model", model, "--audio", "x.wav", *options]) == 2
    transcribed = capsys.readouterr().err
    assert served == transcribed and served.count("\n") == 1 and served.startswith(f"error: {says}")


@pytest.mark.parametrize(
    "options, says",
    [
        (["--port", "70000"], "--port 70000: expected 0 to 65535"),
        (["--port", "-1"], "--port -1: expected 0 to 65535"),
        (["--max-utterance", "inf"], "--max-utterance inf: expected a finite number above 0"),
        (["--no-vad", "--max-utterance", "nan"], "--max-utterance nan: expected a finite number above 0"),
        (["--max-post-seconds", "0"], "--max-post-seconds 0.0: expected a finite number above 0"),
        (["--allow-origin", "*"], "--allow-origin '*': expected scheme://host[:port]"),
        (["--max-messages-per-s", "0.5"], "--max-messages-per-s 0.5: expected at least 1"),
    ],
)
def test_server_settings_out_of_range_are_one_line(tmp_path, capsys, options, says):
    """--port 70000 listened on 4464 (Tornado takes the port modulo 65536); --max-utterance inf crashed
    every connection with OverflowError."""
    from native_client.server.cli import main as serve

    assert serve(["--model", str(tmp_path / "no-export"), *options]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"error: {says}"), error


def test_vad_settings_must_be_finite():
    from native_client.vad import VadError, VadSettings

    for name, value in (("max_utterance_s", math.inf), ("end_silence_s", math.nan), ("pre_roll_s", -1.0)):
        with pytest.raises(VadError, match=f"vad {name} {value}: must be a finite number of seconds"):
            VadSettings(**{name: value}).check()


def test_without_vad_a_connection_is_cut_at_the_longest_utterance(export, server):
    """With --no-vad a connection was one utterance without a cap (its logits, and a normalised export's
    reruns, grew without limit): it is now cut every --max-utterance seconds, each cut a result."""
    running = server("--no-vad", "--max-utterance", "1")
    clip = CLIPS[2]  # 2.9 s: results at 1 s and 2 s, the rest at eof
    text, replies, after = asyncio.run(_stream(running.url, clip))
    results = [reply for reply in replies if "text" in reply]
    assert len(results) == 3 and replies[-1] is results[-1] and after is None
    starts = [word["start"] for reply in results for word in reply["result"]]
    assert starts == sorted(starts) and starts[-1] >= 2.0
    assert text == " ".join(reply["text"] for reply in results if reply["text"])


def _long_file(path: Path, clips: list[Path]) -> Path:
    """``clips``, each after 7 s of silence, and 2 s of silence at the end."""
    pieces = []
    for clip in clips:
        samples, rate = soundfile.read(clip, dtype="int16")
        pieces += [np.zeros(7 * rate, np.int16), samples]
    pieces.append(np.zeros(2 * rate, np.int16))
    soundfile.write(path, np.concatenate(pieces), rate)
    return path


@pytest.fixture(scope="module")
def guarded(export):
    """A server with one stream at a time, 45 s of audio a POST, a 1 s idle limit and one web origin."""
    running = Server(
        export,
        *("--max-streams", "1", "--max-post-seconds", "45", "--idle-timeout", "1"),
        *("--allow-origin", "https://app.example"),
    )
    yield running
    running.stop()


async def _post(url: str, body: bytes, **headers) -> tuple[int, dict, dict]:
    try:
        response = await AsyncHTTPClient().fetch(
            url, method="POST", body=body, headers=headers, request_timeout=600
        )
    except HTTPClientError as error:
        response = error.response
    return response.code, json.loads(response.body), dict(response.headers)


def test_a_long_post_is_decoded_utterance_by_utterance(export, guarded, tmp_path):
    """A POST /stt body was decoded as one utterance whatever its length (memory and CPU without bound):
    past --max-utterance it is cut by the detector as the client's --vad cuts it, and past
    --max-post-seconds it is refused."""
    long_file = _long_file(tmp_path / "long.flac", CLIPS[:4])  # 38 s
    too_long = _long_file(tmp_path / "too-long.flac", CLIPS[:6])  # 58 s

    async def main():
        return (
            await _post(guarded.http + "/stt", long_file.read_bytes()),
            await _post(guarded.http + "/stt", too_long.read_bytes()),
        )

    (code, posted, _), (too_long_code, refused, _) = asyncio.run(main())
    client = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(long_file)]
        + ["--vad", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    expected = json.loads(client.stdout)
    assert code == 200 and len(posted["utterances"]) == 4
    assert posted["utterances"] == expected["utterances"] and posted["text"] == expected["text"]
    assert too_long_code == 413
    assert refused == {"error": "request body: longer than 45 s of audio (the server's --max-post-seconds)"}


def test_posts_count_against_max_streams(guarded):
    """POST /stt was not counted: any number of them ran at once beside --max-streams WebSockets."""
    body = CLIPS[0].read_bytes()

    async def main():
        ws = await websocket_connect(guarded.url)
        refused = await _post(guarded.http + "/stt", body)
        ws.close()
        while (await _status(guarded))["streams"]:
            await asyncio.sleep(0.1)
        return refused, await _post(guarded.http + "/stt", body)

    (code, refused, _), (ok, posted, _) = asyncio.run(main())
    assert code == 503 and refused == {"error": "too many streams: the server takes 1 at once"}
    assert ok == 200 and posted["text"]


def test_only_loopback_and_allowed_origins_may_use_the_server(guarded):
    """check_origin returned True: any web page the user visited could drive the local server."""
    body = CLIPS[0].read_bytes()

    async def handshake(origin: str) -> int:
        request = tornado.httpclient.HTTPRequest(guarded.url, headers={"Origin": origin})
        try:
            ws = await websocket_connect(request)
        except HTTPClientError as error:
            return error.code
        ws.close()
        return 101

    async def main():
        origins = ("https://evil.example", "null", "http://localhost:8080", "http://127.0.0.1")
        shakes = [await handshake(origin) for origin in (*origins, "https://app.example")]
        posts = [
            await _post(guarded.http + "/stt", body, Origin=origin)
            for origin in ("https://evil.example", "https://app.example")
        ]
        return shakes, posts

    shakes, ((evil, refused, _), (allowed, posted, headers)) = asyncio.run(main())
    assert shakes == [403, 403, 101, 101, 101]
    assert evil == 403 and "origin 'https://evil.example' is not allowed" in refused["error"]
    assert (
        allowed == 200 and posted["text"] and headers["Access-Control-Allow-Origin"] == "https://app.example"
    )


def test_a_client_stalling_in_its_headers_is_dropped_at_the_idle_limit(guarded):
    """The HTTP server had no idle or body timeout: half a request held its connection for an hour."""

    async def main():
        reader, writer = await asyncio.open_connection("127.0.0.1", guarded.port)
        writer.write(b"POST /stt HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        await writer.drain()
        # A bound so that the old server fails the test instead of hanging it; the limit is 1 s.
        return await asyncio.wait_for(reader.read(), 120)

    assert asyncio.run(main()) == b""


def test_a_deeply_nested_text_frame_is_a_json_error(guarded):
    """'[' * 100000 raised RecursionError out of the message handler: no reply, a traceback."""

    async def main():
        while (await _status(guarded))["streams"]:  # the stream of another test may still be closing
            await asyncio.sleep(0.1)
        ws = await websocket_connect(guarded.url)
        await ws.write_message("[" * 100000)
        reply = await ws.read_message()
        return reply, (await ws.read_message() if reply is not None else None)

    reply, closed = asyncio.run(main())
    assert (
        reply is not None
        and json.loads(reply)["error"].startswith("text frame nests too deeply")
        and closed is None
    )


def _wav_claiming(path: Path, rate: int, seconds: float = 0.1) -> Path:
    """A 16 kHz WAV whose header is rewritten to claim ``rate`` Hz (and its byte rate to match)."""
    soundfile.write(path, np.zeros(int(16000 * seconds), np.int16), 16000, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    data[24:28] = rate.to_bytes(4, "little")
    data[28:32] = min(rate * 2, 2**32 - 1).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


def _strict_json(body: bytes) -> dict:
    """JSON as other languages parse it: NaN and Infinity are not JSON."""

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(body, parse_constant=refuse)


@pytest.mark.parametrize("rate", [1, 2**31 - 1])
def test_a_header_claiming_an_absurd_sample_rate_is_refused_naming_the_file(guarded, tmp_path, rate):
    """A WAV claiming 1 Hz became 16,000 times its length in audio; one claiming 2^31-1 Hz was read as one
    block (issue 43, S12). Both are one line, from the server and from the client."""
    wav = _wav_claiming(tmp_path / "forged.wav", rate)
    code, body, _ = asyncio.run(_post(guarded.http + "/stt", wav.read_bytes()))
    assert code == 400 and f"the header says {rate} Hz; expected 1000 to 384000 Hz" in body["error"], body
    result = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(guarded.export), "--audio", str(wav)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
    assert f"{wav}: the header says {rate} Hz" in result.stderr, result.stderr


def test_audio_that_resamples_to_nothing_answers_valid_json(guarded, tmp_path):
    """A few samples at 384 kHz resample to none: ``"rtf": NaN`` was not JSON (issue 43, S11)."""
    clip = tmp_path / "blip.wav"
    soundfile.write(clip, np.zeros(5, np.int16), 384000, subtype="PCM_16")
    code, body = asyncio.run(_raw_post(guarded.http + "/stt", clip.read_bytes()))
    found = _strict_json(body)
    assert code == 200 and found["rtf"] is None and found["text"] == "", found


async def _raw_post(url: str, body: bytes) -> tuple[int, bytes]:
    response = await AsyncHTTPClient().fetch(url, method="POST", body=body, raise_error=False)
    return response.code, response.body


def test_echoed_client_text_is_bounded_and_close_reasons_fit_a_frame(guarded):
    """A close reason of 120 'é' (240 bytes) made Tornado raise: no close frame; an unknown config key of
    any length was echoed back whole (issue 43, S10)."""

    async def refused(key: str) -> tuple[str, int | None, str | None]:
        while (await _status(guarded))["streams"]:  # the stream of another test may still be closing
            await asyncio.sleep(0.1)
        ws = await websocket_connect(guarded.url, max_message_size=2**24)
        await ws.write_message(json.dumps({"config": {key: 1}}))
        reply = await ws.read_message()
        closed = await ws.read_message()
        return reply, closed, ws.close_code, ws.close_reason

    for key in ("é" * 120, "x" * 200_000):
        reply, closed, code, reason = asyncio.run(refused(key))
        assert reply is not None and closed is None, reply
        assert len(reply.encode()) <= 4096 + 16 and json.loads(reply)["error"].startswith("config: "), reply
        assert code == 1008 and reason is not None and len(reason.encode()) <= 123, (code, reason)


def test_a_plain_transcription_prints_the_transcript_and_nothing_else(export, tmp_path):
    """With an ARPA scorer the client printed KenLM's loading banner and progress bar, and LiteRT's
    ``DestroyAccelerator`` lines at exit (issue 43, S15)."""
    from pipeline.lm.kneser_ney import estimate, write_arpa

    corpus = (SAMPLE / "lm_corpus.txt").read_text().splitlines()
    arpa = tmp_path / "lm.arpa"
    write_arpa(estimate([line.split() for line in corpus if line.strip()], 3), arpa)
    result = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(CLIPS[0])]
        + ["--scorer", str(arpa)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert len(result.stdout.splitlines()) == 1, result.stdout
