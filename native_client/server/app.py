"""``deepspeech-serve``'s Tornado application: the WebSocket endpoint (vosk-server's protocol, see
``session``) and ``POST /stt``.

Tornado serves both WebSocket and HTTP from one event loop and is already installed (Luigi's scheduler
uses it): no second server library, and its WebSocket code handles the framing, masking, fragmentation
and the frame-size limit. The model runs on a thread of its own (``engine``), so the event loop keeps
reading and answering sockets while it computes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tornado.web
import tornado.websocket

from native_client.audio import AudioError, stream_for_model
from native_client.batching import Utterance
from native_client.model import Model, Transcript
from native_client.server.engine import BatchEngine
from native_client.server.session import ProtocolError, RecognizerSession
from native_client.vad import VadSettings

log = logging.getLogger(__name__)

# WebSocket close codes (RFC 6455 7.4.1)
NORMAL, POLICY, TOO_BIG, TRY_LATER, UNSUPPORTED = 1000, 1008, 1009, 1013, 1003


@dataclass(frozen=True)
class Limits:
    """What one client may ask of the server; each refusal is a JSON error on that connection only."""

    max_streams: int = 64  # open WebSocket connections; more are refused
    max_frame_bytes: int = 1 << 20  # one WebSocket message (32 s of 16 kHz audio)
    max_messages_per_s: float = 100.0  # per connection, in any one-second burst
    idle_timeout_s: float = 30.0  # a connection silent this long is closed
    max_body_bytes: int = 64 << 20  # a POST /stt body
    max_batch: int = 64  # streams stepped in one model call


@dataclass
class Service:
    """What every connection shares: the model, the engine, the limits and the VAD settings (None: no
    detector, a connection is one utterance ended by eof)."""

    model: Model
    engine: BatchEngine
    limits: Limits
    vad: VadSettings | None
    partial_interval_s: float = 1.0
    open_streams: int = 0


class _Protocol(tornado.websocket.WebSocketProtocol13):
    """Tornado's protocol, with a JSON error sent before it closes a connection for a too-large frame."""

    def close(self, code=None, reason=None):
        """See ``WebSocketProtocol13.close``."""
        if code == TOO_BIG and not self.server_terminated:
            limit = self.params.max_message_size
            error = {"error": f"frame larger than the limit of {limit} bytes (--max-frame-bytes)"}
            try:
                self._write_frame(True, 0x1, json.dumps(error).encode())
            except Exception:  # the stream is gone already
                pass
        super().close(code, reason)


class RecognizeHandler(tornado.websocket.WebSocketHandler):
    """One WebSocket connection: vosk-server's protocol (see ``native_client.server.session``)."""

    def initialize(self, service: Service):
        """Tornado's hook: the shared service."""
        self.service = service
        self.session: RecognizerSession | None = None
        self.counted = False
        self.task: asyncio.Task | None = None
        self.idle_handle = None
        self.tokens = service.limits.max_messages_per_s
        self.last_refill = time.monotonic()
        self.finished = False

    def check_origin(self, origin):
        """Any origin: the server is for programs (vosk's clients send none or their own)."""
        return True

    def get_websocket_protocol(self):
        """Tornado's protocol with the JSON error for too-large frames (``_Protocol``)."""
        protocol = super().get_websocket_protocol()
        if protocol is not None:
            protocol = _Protocol(self, False, protocol.params)
        return protocol

    def open(self):
        """Count the connection against ``max_streams``; refuse it past the limit."""
        service = self.service
        if service.open_streams >= service.limits.max_streams:
            self.refuse(f"too many streams: the server takes {service.limits.max_streams} at once", TRY_LATER)
            return
        service.open_streams += 1
        self.counted = True
        self.session = RecognizerSession(service)
        self.set_nodelay(True)
        self.touch()

    def touch(self) -> None:
        """Restart the idle timer."""
        loop = asyncio.get_running_loop()
        if self.idle_handle is not None:
            self.idle_handle.cancel()
        self.idle_handle = loop.call_later(self.service.limits.idle_timeout_s, self.idle)

    def idle(self) -> None:
        """The idle timer fired: close unless a message is being answered."""
        if self.task is not None and not self.task.done():
            self.touch()
            return
        self.refuse(f"idle for {self.service.limits.idle_timeout_s:g} s: closing", POLICY)

    def refuse(self, message: str, code: int) -> None:
        """Send ``{"error": message}`` and close the connection with ``code``."""
        if self.finished:
            return
        self.finished = True
        log.info("refused %s: %s", self.request.remote_ip, message)
        try:
            self.write_message(json.dumps({"error": message}))
        except tornado.websocket.WebSocketClosedError:
            return
        self.close(code, message[:120])

    def rate_allows(self) -> bool:
        """The per-connection message budget (a token bucket refilled at ``max_messages_per_s``)."""
        limit = self.service.limits.max_messages_per_s
        now = time.monotonic()
        self.tokens = min(limit, self.tokens + (now - self.last_refill) * limit)
        self.last_refill = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    async def on_message(self, message):
        """Tornado awaits this before reading the next message: one reply per message, in order."""
        if self.finished or self.session is None:
            return
        self.touch()
        if not self.rate_allows():
            self.refuse(
                f"more than {self.service.limits.max_messages_per_s:g} messages a second "
                "(send larger frames: 0.1 to 0.5 s of audio each)",
                POLICY,
            )
            return
        self.task = asyncio.get_running_loop().create_task(self.answer(message))
        try:
            await self.task
        except asyncio.CancelledError:
            return
        self.touch()

    async def answer(self, message) -> None:
        """Process one message and send its reply (or refuse it)."""
        session = self.session
        try:
            if isinstance(message, bytes):
                self.send(await session.audio(message))
                return
            if session.text_message(message) == "eof":
                self.send(await session.eof())
                self.finished = True
                self.close(NORMAL)
        except ProtocolError as error:
            self.refuse(str(error), UNSUPPORTED if isinstance(message, bytes) else POLICY)
        except tornado.websocket.WebSocketClosedError:
            pass

    def send(self, reply: dict) -> None:
        """Write one reply (a closed connection is ignored: its client left)."""
        try:
            self.write_message(json.dumps(reply, ensure_ascii=False))
        except tornado.websocket.WebSocketClosedError:
            pass

    def on_close(self):
        """Release the stream: its pending chunks are dropped from the engine."""
        if self.idle_handle is not None:
            self.idle_handle.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.counted:
            self.service.open_streams -= 1
            self.counted = False


class SttHandler(tornado.web.RequestHandler):
    """``POST /stt``: an audio file as the body (any format the client reads, any rate: resampled);
    answers the client's ``--json`` object. ``?candidates=N`` (default 3, as the client)."""

    def initialize(self, service: Service):
        """Tornado's hook: the shared service."""
        self.service = service

    def fail(self, status: int, message: str) -> None:
        """A JSON error response."""
        self.set_status(status)
        self.finish({"error": message})

    async def post(self):
        """Transcribe the body (see the class docstring)."""
        try:
            count = int(self.get_query_argument("candidates", "3"))
        except ValueError:
            count = 0
        if not 1 <= count <= 10:
            self.fail(400, "candidates: expected a whole number from 1 to 10")
            return
        started = time.perf_counter()
        model, engine = self.service.model, self.service.engine
        with tempfile.TemporaryDirectory(prefix="stt-") as directory:
            path = Path(directory) / "audio"
            path.write_bytes(self.request.body)
            utterance = Utterance(model.runner)
            try:
                for block in stream_for_model(path, model.sample_rate, convert_rate=True, block_seconds=5.0):
                    utterance.feed_audio(block)
                    await self._run(utterance)
            except AudioError as error:
                self.fail(400, str(error).replace(str(path), "request body"))
                return
        utterance.finish()
        await self._run(utterance)
        seconds = model.metadata.seconds_per_label
        found = await engine.decode(model.decoder.candidates, utterance.logits(), count, seconds)
        result = Transcript(
            audio="request body",
            text=found[0].text,
            duration_s=utterance.samples / model.sample_rate,
            processing_s=time.perf_counter() - started,
            candidates=tuple(found),
        )
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(result.to_dict(), ensure_ascii=False))

    async def _run(self, utterance: Utterance) -> None:
        logits, state = await self.service.engine.run(utterance.ready(), utterance.state)
        utterance.accept(logits, state)


class StatusHandler(tornado.web.RequestHandler):
    """``GET /status``: open streams and the engine's counters (model calls, chunks, largest batch)."""

    def initialize(self, service: Service):
        """Tornado's hook: the shared service."""
        self.service = service

    def get(self):
        """The counters as JSON."""
        stats = self.service.engine.stats
        self.finish(
            {
                "streams": self.service.open_streams,
                "batched": self.service.engine.runner.batched,
                "calls": stats.calls,
                "chunks": stats.chunks,
                "largest_batch": stats.largest_batch,
            }
        )


def make_app(service: Service) -> tornado.web.Application:
    """The application: WebSocket at ``/`` (vosk-server's path), ``POST /stt``, ``GET /status``."""
    handlers = [("/", RecognizeHandler), ("/stt", SttHandler), ("/status", StatusHandler)]
    return tornado.web.Application(
        [(path, handler, {"service": service}) for path, handler in handlers],
        websocket_max_message_size=service.limits.max_frame_bytes,
    )
