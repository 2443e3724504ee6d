"""deepspeech-serve under hostile clients and at its end (issue 43): a request its client abandoned is
cancelled, the Host header is checked, /ready and /metrics answer, SIGTERM drains the open streams with
their results, and a second signal exits at once. Real servers on 127.0.0.1, real clients."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import WebSocketClosedError, websocket_connect

from tests.test_serve import CHUNK, CLIPS, Server, untrained_export


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A small untrained export (``tests.test_serve.untrained_export``)."""
    return untrained_export(tmp_path_factory.mktemp("lifecycle"), 64)


@pytest.fixture
def server(export):
    servers = []

    def start(*args: str) -> Server:
        servers.append(Server(export, *args))
        return servers[-1]

    yield start
    for running in servers:
        if running.process.poll() is None:
            running.stop()


async def _get(url: str, **headers) -> tuple[int, bytes, dict]:
    response = await AsyncHTTPClient().fetch(url, headers=headers, raise_error=False)
    return response.code, response.body, dict(response.headers)


def _long_wav(path: Path, seconds: float) -> Path:
    """``seconds`` of speech: the sample's test clips over and over, as one 16 kHz WAV."""
    clips = [soundfile.read(clip, dtype="int16")[0] for clip in CLIPS]
    audio = np.concatenate(clips)
    audio = np.tile(audio, int(np.ceil(seconds * 16000 / len(audio))))[: int(seconds * 16000)]
    soundfile.write(path, audio, 16000, subtype="PCM_16")
    return path


def test_the_host_header_ready_and_metrics(server):
    """Bound to loopback, a request naming another host (a DNS-rebinding page) is refused, /status, the
    WebSocket handshake and POST /stt alike; /ready and /metrics answer (issue 43, S14)."""
    running = server()

    async def main():
        forged = {"Host": f"attacker.example:{running.port}"}
        status = await _get(running.http + "/status", **forged)
        post = await AsyncHTTPClient().fetch(
            running.http + "/stt", method="POST", body=b"x", headers=forged, raise_error=False
        )
        with pytest.raises(Exception, match="403"):
            await websocket_connect(HTTPRequest(running.url, headers=forged))
        local = await _get(running.http + "/status", Host=f"localhost:{running.port}")
        ready = await _get(running.http + "/ready")
        metrics = await _get(running.http + "/metrics")
        return status, post.code, local, ready, metrics

    status, post, local, ready, metrics = asyncio.run(main())
    assert status[0] == 403 and "is not this server's" in json.loads(status[1])["error"], status
    assert post == 403
    assert local[0] == 200 and json.loads(local[1])["ready"] is True
    assert ready[0] == 200 and json.loads(ready[1]) == {"ready": True}
    text = metrics[1].decode()
    assert metrics[0] == 200 and metrics[2]["Content-Type"].startswith("text/plain"), metrics
    for name in (
        "deepspeech_serve_ready 1.0",
        "deepspeech_serve_streams 0.0",
        "deepspeech_serve_model_calls_total",
    ):
        assert name in text, text


def test_an_abandoned_post_is_cancelled_and_keeps_its_slot_until_then(server, tmp_path):
    """A client uploads minutes of audio and leaves: the server used to free its slot at once and
    transcribe it to the end anyway, so any number ran at once (issue 43, S1). Now its work stops: once
    /status counts it gone, the model runs no more of its chunks."""
    running = server("--max-post-seconds", "600", "--max-streams", "2")
    body = _long_wav(tmp_path / "long.wav", 590).read_bytes()

    async def main():
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        head = f"POST /stt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        while (await _status(running))["chunks"] == 0:  # the server is at work on it
            await asyncio.sleep(0.02)
        writer.close()
        deadline = time.monotonic() + 120
        while (await _status(running))["streams"]:
            assert time.monotonic() < deadline, "the abandoned request never ended"
            await asyncio.sleep(0.05)
        gone = (await _status(running))["chunks"]
        await asyncio.sleep(1.5)
        return gone, (await _status(running))["chunks"]

    gone, later = asyncio.run(main())
    assert later == gone, f"the model ran {later - gone} chunks of a request whose client had left"


async def _status(running: Server) -> dict:
    return json.loads((await _get(running.http + "/status"))[1])


def test_sigterm_drains_streams_with_their_results_and_requests_finish(server, tmp_path):
    """SIGTERM used to drop every stream and request: no last result, no close frame (issue 43, S9). Now
    a stream gets its last result and a 1001 close, a POST under way its answer, and the server exits 0."""
    running = server("--drain-seconds", "20")
    samples = soundfile.read(CLIPS[0], dtype="int16")[0]
    body = _long_wav(tmp_path / "post.wav", 20).read_bytes()

    async def main():
        ws = await websocket_connect(running.url)
        await ws.write_message(json.dumps({"config": {"sample_rate": 16000}}))
        for start in range(0, len(samples) // 2, CHUNK):
            await ws.write_message(samples[start : start + CHUNK].tobytes(), binary=True)
            await ws.read_message()
        post = asyncio.ensure_future(
            AsyncHTTPClient().fetch(
                running.http + "/stt", method="POST", body=body, raise_error=False, request_timeout=120
            )
        )
        while (await _status(running))["streams"] < 2:
            await asyncio.sleep(0.02)
        running.process.send_signal(signal.SIGTERM)
        replies = []
        while (message := await ws.read_message()) is not None:
            replies.append(json.loads(message))
        return replies, ws.close_code, ws.close_reason, await post

    replies, code, reason, post = asyncio.run(main())
    assert replies and "text" in replies[-1] and "partial" not in replies[-1], replies
    assert code == 1001 and reason == "the server is shutting down", (code, reason)
    assert post.code == 200 and "text" in json.loads(post.body), post.body
    assert running.process.wait(timeout=60) == 0


def test_a_second_signal_exits_at_once(server):
    """A second SIGTERM during the drain was swallowed (issue 43, S9)."""
    running = server("--drain-seconds", "30")

    async def main():
        # A WebSocket client that never answers the server's close frame: the drain waits for it.
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        writer.write(
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 101")
        while (await _status(running))["streams"] < 1:
            await asyncio.sleep(0.02)
        running.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        started = time.monotonic()
        running.process.send_signal(signal.SIGTERM)
        code = await asyncio.get_running_loop().run_in_executor(None, running.process.wait, 60)
        return code, time.monotonic() - started

    code, waited = asyncio.run(main())
    assert code == 1 and waited < 10, (code, waited)
    assert "a second signal: exiting now" in running.process.stderr.read()


async def _raw_websocket(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket handshake by hand, so that a test can send frames no library would."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 101")
    while (await reader.readline()) != b"\r\n":
        pass
    return reader, writer


def _frame(opcode: int, payload: bytes, final: bool = True) -> bytes:
    """One client frame (masked, as RFC 6455 wants)."""
    mask = b"\x01\x02\x03\x04"
    masked = (
        np.frombuffer(payload, np.uint8) ^ np.resize(np.frombuffer(mask, np.uint8), len(payload))
    ).tobytes()
    first = bytes([(0x80 if final else 0) | opcode])
    if len(payload) < 126:
        return first + bytes([0x80 | len(payload)]) + mask + masked
    if len(payload) < 1 << 16:
        return first + bytes([0x80 | 126]) + len(payload).to_bytes(2, "big") + mask + masked
    return first + bytes([0x80 | 127]) + len(payload).to_bytes(8, "big") + mask + masked


async def _server_frames(reader: asyncio.StreamReader, timeout: float) -> list[tuple[int, bytes]]:
    """The server's frames (opcode, payload) until its close frame, or until ``timeout``."""
    frames = []
    try:
        while True:
            head = await asyncio.wait_for(reader.readexactly(2), timeout)
            length = head[1] & 0x7F
            if length == 126:
                length = int.from_bytes(await reader.readexactly(2), "big")
            elif length == 127:
                length = int.from_bytes(await reader.readexactly(8), "big")
            frames.append((head[0] & 0x0F, await reader.readexactly(length)))
            if frames[-1][0] == 0x8:
                return frames
    except (TimeoutError, asyncio.IncompleteReadError):
        return frames


@pytest.mark.parametrize("flood", ["fragments", "pings"])
def test_floods_of_tiny_frames_are_refused(server, flood):
    """One-byte continuation frames and pings kept the event loop busy without ever counting as messages
    (issue 43, S4): now they are charged to a frame budget, and the connection is refused in one JSON
    error and a 1008 close."""
    running = server("--max-messages-per-s", "10")

    async def main():
        reader, writer = await _raw_websocket(running.port)
        if flood == "fragments":
            frames = [_frame(0x2, b"\x00", final=False)] + [_frame(0x0, b"\x00", final=False)] * 400
        else:
            frames = [_frame(0x9, b"p")] * 400
        writer.write(b"".join(frames))
        await writer.drain()
        return await _server_frames(reader, 10)

    frames = asyncio.run(main())
    errors = [json.loads(payload)["error"] for opcode, payload in frames if opcode == 0x1]
    assert any("frames a second" in error for error in errors), frames
    assert frames[-1][0] == 0x8 and int.from_bytes(frames[-1][1][:2], "big") == 1008, frames[-1:]


def test_one_address_cannot_hold_every_slot(server):
    """64 WebSockets from one client held every slot (issue 43, S3): an address gets its share."""
    running = server("--max-streams", "8", "--max-streams-per-client", "2")

    async def main():
        held = [await websocket_connect(running.url) for _ in range(2)]
        third = await websocket_connect(running.url)
        refused = json.loads(await third.read_message())
        post = await AsyncHTTPClient().fetch(
            running.http + "/stt", method="POST", body=b"x", raise_error=False
        )
        for ws in held:
            ws.close()
        return refused, third.close_code, post

    refused, code, post = asyncio.run(main())
    assert "too many streams from 127.0.0.1" in refused["error"] and code == 1013, refused
    assert post.code == 503 and "--max-streams-per-client" in json.loads(post.body)["error"]


def test_silence_counts_as_idle(server):
    """A client sending two bytes of silence now and then kept its slot for ever (issue 43, S3)."""
    running = server("--idle-timeout", "1")

    async def main():
        ws = await websocket_connect(running.url)
        await ws.write_message(json.dumps({"config": {"sample_rate": 16000}}))
        started = time.monotonic()
        while time.monotonic() - started < 10:
            try:
                await ws.write_message(b"\x00\x00", binary=True)
            except WebSocketClosedError:
                pass  # closed while this client slept: its error reply is there to read
            reply = await ws.read_message()
            if reply is None or "error" in json.loads(reply):
                return reply, time.monotonic() - started
            await asyncio.sleep(0.2)
        return None, None

    reply, after = asyncio.run(main())
    assert reply is not None and "only silence" in json.loads(reply)["error"], reply
    assert after < 5


def test_a_post_whose_body_stalls_is_dropped_at_the_idle_limit(server):
    """The body deadline was a total of hundreds of seconds, not an idle timer (issue 43, S3)."""
    running = server("--idle-timeout", "1")

    async def main():
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        writer.write(b"POST /stt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n" + b"x" * 10)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
        return answer, await _status(running)

    answer, status = asyncio.run(main())
    assert answer == b"" and status["streams"] == 0, (answer, status)


def test_sockets_past_the_cap_are_closed_as_they_come(server):
    """Connections before the upgrade were not limited: at the file descriptor limit Tornado's accept loop
    spun (issue 43, S7)."""
    running = server("--max-connections", "4")

    async def main():
        kept = [await asyncio.open_connection("127.0.0.1", running.port) for _ in range(4)]
        reader, _ = await asyncio.open_connection("127.0.0.1", running.port)
        closed = await asyncio.wait_for(reader.read(), 10)
        for _, writer in kept:
            writer.close()
        return closed

    assert asyncio.run(main()) == b""


def test_audio_is_budgeted_by_its_seconds_not_its_bytes(server):
    """A 1 MiB frame at 4000 Hz is 131 s of audio (over a second of the event loop's time); any number of
    them came at any pace (issue 43, S5). A message holds at most 32 s, a connection sends at most 8
    times real time after a burst of 32 s."""
    running = server("--max-messages-per-s", "1000")

    async def refused(rate: int, frame_seconds: float, frames: int) -> tuple[int, str]:
        ws = await websocket_connect(running.url, max_message_size=2**24)
        await ws.write_message(json.dumps({"config": {"sample_rate": rate}}))
        noise = np.random.default_rng(0).integers(-3000, 3000, int(rate * frame_seconds), dtype=np.int16)
        for sent in range(frames):
            await ws.write_message(noise.tobytes(), binary=True)
            reply = json.loads(await ws.read_message())
            if "error" in reply:
                return sent, reply["error"]
        return frames, ""

    async def main():
        return await refused(4000, 131, 1), await refused(16000, 4, 20)

    (huge, huge_error), (paced, paced_error) = asyncio.run(main())
    assert huge == 0 and "131.0 s of audio at 4000 Hz: at most 32 s a message" in huge_error, huge_error
    assert 8 <= paced < 20 and "faster than 8 times real time" in paced_error, (paced, paced_error)


def test_a_connections_audio_is_turned_into_model_input_off_the_event_loop(export, monkeypatch):
    """Resampling, the detector, features and partial transcripts of a message ran on the event loop's
    thread, stalling every other socket while they ran (issue 43, S5). They run on the audio threads now.
    In process, the real session, model and engine, each of those calls recording the thread it ran on."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from native_client.batching import batch_runner
    from native_client.model import open_model
    from native_client.server.app import Limits, Service
    from native_client.server.decoding import ThreadDecoding
    from native_client.server.engine import BatchEngine
    from native_client.server.session import RecognizerSession
    from native_client.stream import Utterance
    from native_client.vad import VadSettings

    ran_on: dict[str, set[int]] = {}

    def recorded(name, function):
        def call(*args, **kwargs):
            ran_on.setdefault(name, set()).add(threading.get_ident())
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(Utterance, "feed_audio", recorded("features", Utterance.feed_audio))
    clips = np.concatenate([soundfile.read(clip, dtype="int16")[0] for clip in CLIPS])
    rate = 11025  # resampled to the model's 16 kHz
    frame = (soxr.resample(clips.astype(np.float32) / 32768, 16000, rate)[: 30 * rate] * 32767).astype("<i2")

    async def main():
        model = open_model(export)
        engine = BatchEngine(batch_runner(model.runner), ThreadDecoding(model.decoder), 8)
        engine.start()
        service = Service(model, engine, Limits(), VadSettings(), audio_threads=ThreadPoolExecutor(2))
        session = RecognizerSession(service)
        session.configure({"sample_rate": rate})
        session.samples_of = recorded("resampling", session.samples_of)
        segmenter = session._utterances.segmenter
        segmenter.feed = recorded("detector", segmenter.feed)
        greedy = model.greedy
        monkeypatch.setattr(greedy, "decode", recorded("partials", greedy.decode))
        replies = [await session.audio(frame[i : i + rate].tobytes()) for i in range(0, len(frame), rate)]
        replies.append(await session.eof())
        await engine.stop()
        service.audio_threads.shutdown()
        return replies, threading.get_ident()

    replies, loop_thread = asyncio.run(main())
    assert any(reply.get("partial") for reply in replies) and replies[-1]["text"], replies[-1]
    assert set(ran_on) == {"resampling", "detector", "features", "partials"}, ran_on
    on_the_loop = sorted(name for name, threads in ran_on.items() if loop_thread in threads)
    assert not on_the_loop, f"{', '.join(on_the_loop)} ran on the event loop's thread"


def test_the_engines_death_fails_every_waiting_stream_and_turns_ready_off(export):
    """Should the engine's scheduling loop end (here: a chunk whose length cannot be read, outside the model
    call's own ``try``), every stream waiting on it gets an error at once, the ones of the batch under way
    included (they waited for ever: only the queue's were failed), later calls are refused, and the
    server reports itself not ready (issue 43, S8). In process: a real model and engine."""
    from native_client.batching import batch_runner
    from native_client.model import open_model
    from native_client.server.app import Limits, Service, is_ready
    from native_client.server.decoding import ThreadDecoding
    from native_client.server.engine import BatchEngine
    from native_client.stream import Chunk, Utterance

    class Unreadable(Chunk):
        @property
        def real(self):
            raise OverflowError("a chunk whose length cannot be read")

        @real.setter
        def real(self, value):
            pass

    async def main():
        model = open_model(export)
        engine = BatchEngine(batch_runner(model.runner), ThreadDecoding(model.decoder), 8)
        engine.start()
        service = Service(model, engine, Limits(), None)
        ready_before = is_ready(service)
        utterance = Utterance(model.runner)
        utterance.feed_audio(soundfile.read(CLIPS[0], dtype="int16")[0])
        utterance.finish()
        good = list(utterance.ready())
        bad = [Unreadable(good[0].inputs, 0)]
        jobs = [asyncio.create_task(engine.run(chunks, utterance.zero_state)) for chunks in (bad, good, good)]
        done, pending = await asyncio.wait(jobs, timeout=30)
        errors = [str(job.exception()) for job in done]
        with pytest.raises(RuntimeError, match="engine stopped"):
            await engine.run(good, utterance.zero_state)
        ready_after = is_ready(service)
        for job in pending:
            job.cancel()
        await engine.stop()
        return ready_before, len(pending), errors, ready_after

    ready_before, pending, errors, ready_after = asyncio.run(main())
    assert pending == 0, f"{pending} streams still wait on an engine that stopped"
    assert len(errors) == 3 and all("engine stopped" in error for error in errors), errors
    assert ready_before and not ready_after


def test_a_cancelled_connections_audio_work_ends_before_its_task_does():
    """A call on an audio thread cannot be stopped. When a client left mid-message, its task was cancelled
    at once while its call ran on: the slot was freed with work still running (any number of leaving
    clients kept the threads busy while holding no slot), and a drain could start the connection's
    ``eof`` on the other thread beside it. Now the cancelled task ends when its call does."""
    from concurrent.futures import ThreadPoolExecutor

    from native_client.server.app import to_the_end

    async def main():
        executor = ThreadPoolExecutor(1)
        gate, ran = threading.Event(), []

        def work():
            gate.wait(10)
            ran.append("done")

        task = asyncio.create_task(to_the_end(asyncio.get_running_loop().run_in_executor(executor, work)))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.2)
        ended_before_its_work = task.done()
        gate.set()
        await asyncio.wait([task])
        executor.shutdown()
        return ended_before_its_work, ran, task.cancelled()

    ended_before_its_work, ran, cancelled = asyncio.run(main())
    assert not ended_before_its_work, "the cancelled task ended while its call still ran"
    assert ran == ["done"] and cancelled


def test_audio_sent_ahead_of_real_time_waits_while_a_real_time_streams_audio_is_due(export):
    """A client may send audio faster than it plays (up to ``--max-audio-rate``), and four such clients
    were four times the model work of a real-time stream: served first come, first served, they held the
    real-time streams' partials back (the hostile benchmark's non-readers, 4.5x their p95). Now each job
    says when its audio is due, and one due far ahead runs only when nothing is due sooner. In process: a
    real model and engine, one chunk a call; the job sent ahead is queued first, with as many chunks."""
    from native_client.batching import batch_runner
    from native_client.model import open_model
    from native_client.server.decoding import ThreadDecoding
    from native_client.server.engine import BatchEngine
    from native_client.stream import Utterance

    async def main():
        model = open_model(export)
        engine = BatchEngine(batch_runner(model.runner), ThreadDecoding(model.decoder), 1)
        engine.start()
        utterance = Utterance(model.runner)
        utterance.feed_audio(soundfile.read(CLIPS[0], dtype="int16")[0])
        utterance.finish()
        chunks = list(utterance.ready())
        finished = []

        async def job(name, due):
            await engine.run(chunks, utterance.zero_state, due)
            finished.append(name)

        now = time.monotonic()
        ahead = asyncio.create_task(job("ahead", now + 3600))
        await asyncio.sleep(0)  # queued first
        real_time = asyncio.create_task(job("real time", now))
        await asyncio.wait_for(asyncio.gather(ahead, real_time), 60)
        await engine.stop()
        return len(chunks), finished

    count, finished = asyncio.run(main())
    assert count > 2, count
    assert finished == ["real time", "ahead"], finished


@pytest.mark.long  # half a minute of filling socket buffers
def test_a_client_that_never_reads_its_results_is_not_read_and_is_closed(server):
    """A client that sends audio and never reads its replies grew the server's memory without bound: the
    replies piled up in its write buffer (issue 43, S6). Now each reply is awaited: once the socket's
    buffers are full the server reads no more from that client, and it is closed at the idle limit, its
    slot freed, though the client goes on sending audible audio within its budgets (which kept it open
    for ever). A raw socket with a small receive buffer that never calls recv."""
    running = server("--idle-timeout", "2", "--no-vad", "--max-utterance", "0.5")
    noise = np.random.default_rng(0).integers(-3000, 3000, 1280, dtype=np.int16).tobytes()  # 0.08 s

    async def main():
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", running.port))
        await loop.sock_sendall(
            sock,
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        head = b""
        while b"\r\n\r\n" not in head:  # the handshake's answer is all this client ever reads
            head += await loop.sock_recv(sock, 1)
        await loop.sock_sendall(sock, _frame(0x1, b'{"config": {"words": true}}'))
        started, sending, freed_at, polls = time.monotonic(), True, None, 0
        while time.monotonic() - started < 90 and freed_at is None:
            if sending:  # audible audio within the budgets: never idle, never refused
                try:
                    await asyncio.wait_for(loop.sock_sendall(sock, _frame(0x2, noise)), 1.0)
                except TimeoutError:
                    sending = False  # every buffer on the way is full: the server reads no more of it
                except ConnectionResetError:
                    sending = False  # the server closed it
            polls += 1
            if polls % 10 == 0 and (await _status(running))["streams"] == 0:
                freed_at = time.monotonic() - started
            await asyncio.sleep(0.02)
        sock.close()
        return freed_at

    freed_at = asyncio.run(main())
    assert freed_at is not None, "the server kept a client that never read its replies for 90 s"


def test_a_refused_connection_is_read_no_further_when_it_goes_on_sending(server):
    """A connection the server refused was still read, its frames unmasked, until Tornado's 5-second close
    timeout: a client refused for its rate could go on pushing frames for that long. Now a client that is
    closing (a few frames in flight, then its close) gets the error and the close frame as before, and
    one that sends more than ``AFTER_CLOSE_BYTES`` after the close is read no further. Frames of 512 KiB,
    so that the frame budget (800 a second) would not stop the flood before 400 MiB."""
    running = server()
    block = _frame(0x2, bytes(60_000))
    big = _frame(0x2, bytes(512 << 10))

    async def refused(writer):
        writer.write(_frame(0x1, b"not json"))
        await writer.drain()

    async def closing():
        reader, writer = await _raw_websocket(running.port)
        await refused(writer)
        writer.write(block * 4)  # in flight when the refusal comes
        await writer.drain()
        frames = await _server_frames(reader, 10)
        writer.write(_frame(0x8, (1000).to_bytes(2, "big")))
        writer.close()
        return frames

    async def flooding():
        reader, writer = await _raw_websocket(running.port)
        await refused(writer)
        await asyncio.sleep(0.2)  # the refusal has been sent: every byte from now on comes after it
        sent = 0
        try:
            while sent < 2 << 30:
                writer.write(big)
                await asyncio.wait_for(writer.drain(), 3)
                sent += len(big)
        except (ConnectionError, TimeoutError):
            pass
        frames = await _server_frames(reader, 3)  # it stopped: the error and the close are still there
        writer.transport.abort()
        return sent, frames

    frames = asyncio.run(closing())
    errors = [json.loads(payload)["error"] for opcode, payload in frames if opcode == 0x1]
    assert errors and "text frame is not JSON" in errors[0], frames
    assert frames[-1][0] == 0x8 and int.from_bytes(frames[-1][1][:2], "big") == 1008, frames[-1:]
    sent, frames = asyncio.run(flooding())
    assert [opcode for opcode, _ in frames] == [0x1, 0x8], frames
    # what the server reads (1 MiB and a frame or two) plus what the two kernels' buffers can hold
    buffers = [
        int(Path(f"/proc/sys/net/ipv4/tcp_{kind}").read_text().split()[2]) for kind in ("rmem", "wmem")
    ]
    assert sent < (4 << 20) + sum(buffers) + 2 * len(big), f"{sent / 2**20:.0f} MiB read after the refusal"
