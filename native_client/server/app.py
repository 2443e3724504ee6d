"""``deepspeech-serve``'s Tornado application: the WebSocket endpoint (vosk-server's protocol, see
``session``) and ``POST /stt``.

Tornado serves both WebSocket and HTTP from one event loop and is already installed (Luigi's scheduler
uses it): no second server library, and its WebSocket code handles the framing, masking, fragmentation
and the frame-size limit. The model runs on a thread of its own and beam search in worker processes
(``engine``), so the event loop keeps reading and answering sockets while they compute.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import socket
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import tornado.httpserver
import tornado.iostream
import tornado.web
import tornado.websocket

from native_client.audio import AudioError, stream_for_model
from native_client.long_audio import SegmentJoiner
from native_client.model import Model, Transcript
from native_client.server.budget import TokenBucket
from native_client.server.engine import BatchEngine, RealTimeClock
from native_client.server.session import ProtocolError, RecognizerSession
from native_client.stream import Utterance
from native_client.utterances import UtteranceLoop, detector
from native_client.vad import VadSettings

log = logging.getLogger(__name__)

# WebSocket close codes (RFC 6455 7.4.1)
NORMAL, GOING_AWAY, POLICY, TOO_BIG, TRY_LATER, UNSUPPORTED = 1000, 1001, 1008, 1009, 1013, 1003
SHUTTING_DOWN = "the server is shutting down"
# Frames a connection may send a second, per message of its budget (fragments and pings count).
FRAMES_PER_MESSAGE = 8
# Audio whose peak is at most this (about -60 dBFS) is silence, not activity (``audible``).
SILENCE_PEAK = 32
# The kernel's send buffer of a WebSocket (it doubles it): replies are small, and a client that does not
# read them then holds this much of the kernel's memory, not the 4 MiB that autotuning grows it to.
SEND_BUFFER_BYTES = 16 << 10
# A close frame's reason: 125 bytes of payload less the 2-byte code (RFC 6455); an error reply's text,
# which may quote the client's own: bounded so that a client cannot make the server echo megabytes.
MAX_REASON_BYTES, MAX_ERROR_BYTES = 123, 4096
# What is read of a connection once the server has sent its close frame, beyond one frame: a client that
# is closing sends its close frame after the frames it had in flight, and its close completes the
# handshake. Past this, nothing more is read (nor unmasked) until Tornado's 5-second close timeout aborts
# the connection: a client cannot make a refused connection cost more than this, and one that is slow to
# close still has those seconds to read the error and the close frame before the abort's reset.
AFTER_CLOSE_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one client may ask of the server; each refusal is a JSON error on that connection only."""

    max_streams: int = 64  # open WebSocket connections; more are refused
    max_streams_per_client: int = 16  # of them, from one address
    max_frame_bytes: int = 1 << 20  # one WebSocket message (32 s of 16 kHz audio)
    max_messages_per_s: float = 100.0  # per connection, in any one-second burst
    idle_timeout_s: float = 30.0  # a connection silent this long is closed
    max_body_bytes: int = 64 << 20  # a POST /stt body
    max_post_seconds: float = 600.0  # audio in a POST /stt body
    max_batch: int = 64  # streams stepped in one model call
    # Audio a connection may send: this many seconds a second (8: eight times real time), a burst of up
    # to ``max_message_seconds`` at once and in any one message (the frame limit at 16 kHz).
    max_audio_rate: float = 8.0
    max_message_seconds: float = 32.0


@dataclass
class Service:
    """What every connection shares: the model, the engine, the limits, the VAD settings (None: no
    detector, a connection is one utterance cut every ``max_utterance_s``) and the web origins allowed
    besides loopback ones (``origin_allowed``). ``open_streams`` counts WebSocket connections and
    ``POST /stt`` requests in progress, against ``limits.max_streams``."""

    model: Model
    engine: BatchEngine
    limits: Limits
    vad: VadSettings | None
    max_utterance_s: float = 30.0
    origins: frozenset[str] = field(default_factory=frozenset)
    partial_interval_s: float = 1.0
    open_streams: int = 0
    # Bound to loopback only: requests must name this machine in their Host header (``host_allowed``).
    loopback_only: bool = False
    # Set on the first SIGTERM/SIGINT: new streams are refused, the open ones finish (``drain``).
    draining: bool = False
    sockets: set = field(default_factory=set)  # the open WebSocket handlers
    posts: set = field(default_factory=set)  # the POST /stt handlers in progress
    per_client: Counter = field(default_factory=Counter)  # open streams by address
    # The threads that turn a connection's audio into model chunks (``off_loop``); None: the loop's own.
    audio_threads: ThreadPoolExecutor | None = None

    async def off_loop(self, function, *args):
        """``function(*args)`` on the audio threads. Resampling, the detector, features and greedy partials
        hold the GIL in bursts of tens of milliseconds a message; on a thread of their own they leave it to
        the event loop at every switch interval (5 ms), so that sockets are read and answered meanwhile.
        A connection awaits each call before its next, so its state is never touched by two threads, and a
        cancelled caller ends only when its call has (``to_the_end``)."""
        call = functools.partial(function, *args)
        if self.audio_threads is None:
            return call()
        return await to_the_end(asyncio.get_running_loop().run_in_executor(self.audio_threads, call))

    async def steps_off_loop(self, steps: Iterator) -> AsyncIterator:
        """The steps of a generator (``UtteranceLoop.feed``'s), each one computed by ``off_loop``."""
        while (step := await self.off_loop(next, steps, None)) is not None:
            yield step

    def take_slot(self, address: str) -> str | None:
        """Count a stream from ``address``; what is wrong (one line) when the server or that address has
        no slot left, else None."""
        if self.open_streams >= self.limits.max_streams:
            return f"too many streams: the server takes {self.limits.max_streams} at once"
        if self.per_client[address] >= self.limits.max_streams_per_client:
            return (
                f"too many streams from {address}: the server takes {self.limits.max_streams_per_client} "
                "from one address at once (--max-streams-per-client)"
            )
        self.open_streams += 1
        self.per_client[address] += 1
        return None

    def free_slot(self, address: str) -> None:
        """The stream from ``address`` that ``take_slot`` counted has ended."""
        self.open_streams -= 1
        self.per_client[address] -= 1
        if self.per_client[address] <= 0:
            del self.per_client[address]


async def to_the_end(future: asyncio.Future):
    """``future``'s result. A call on a thread cannot be stopped: when the caller is cancelled, the
    cancellation waits for the call to end, so that a cancelled connection's work is over (and its state
    free) by the time its task is, and its slot is freed when the work is."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        raise


def origin_allowed(origin: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request with this ``Origin`` header may use the server: none (a program, not a browser),
    a page on this machine (http(s) on localhost or a loopback address), or one of ``allowed``
    (``--allow-origin``, lower case). Any other web page is refused: a page the user happens to visit
    must not drive a server on their machine."""
    if origin is None or origin.rstrip("/").lower() in allowed:
        return True
    try:
        parts = urlsplit(origin)
        host = parts.hostname
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(host) and names_this_machine(host)


def names_this_machine(host: str) -> bool:
    """Whether a host name (lower case, no port or brackets) is this machine's only: ``localhost``, a
    ``.localhost`` name, or a loopback address."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def audible(message) -> bool:
    """Whether a message counts as activity: any text message, or audio whose peak is above
    ``SILENCE_PEAK`` (a client sending digital silence holds a slot as an idle one would)."""
    if not isinstance(message, bytes):
        return True
    samples = np.frombuffer(message, "<i2", count=len(message) // 2)
    return samples.size > 0 and int(np.abs(samples.astype(np.int32)).max()) > SILENCE_PEAK


def host_allowed(host: str, loopback_only: bool) -> bool:
    """Whether a request's ``Host`` header names this server: any host when it listens beyond loopback;
    bound to loopback, only localhost names and loopback addresses (a web page on another name that
    resolves to 127.0.0.1, DNS rebinding, must not read it)."""
    if not loopback_only:
        return True
    name = host.strip().lower()
    if name.startswith("["):  # [::1]:port
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    return names_this_machine(name)


def refuse_host(handler: tornado.web.RequestHandler, service: Service) -> bool:
    """Answer 403 (a JSON error) and return True when the request's Host header is not this server's."""
    host = handler.request.headers.get("Host", "")
    if host_allowed(host, service.loopback_only):
        return False
    log.info("refused %s: host %s", handler.request.remote_ip, host[:80])
    handler.set_status(403)
    handler.finish({"error": f"host {host[:80]!r} is not this server's (it listens on loopback only)"})
    return True


class _Protocol(tornado.websocket.WebSocketProtocol13):
    """Tornado's protocol, with a JSON error sent before it closes a connection for a too-large frame,
    every frame read (a fragment, a ping) charged to the connection's frame budget, and at most
    ``AFTER_CLOSE_BYTES`` (and a frame) read once the server has closed."""

    closed_at: int | None = None  # the bytes read when the server sent its close frame

    async def _receive_frame(self) -> None:
        if not self.handler.frame_allowed():
            self.client_terminated = True  # read no more of it; the close frame is on its way
            return
        if self.server_terminated:
            if self.closed_at is None:
                self.closed_at = self._wire_bytes_in
            elif self._wire_bytes_in - self.closed_at > AFTER_CLOSE_BYTES:
                log.info("no more read of %s: it sent on after the close", self.handler.request.remote_ip)
                # Not client_terminated: the receive loop would end and abort at once, and the reset could
                # destroy the error and close frame before the client reads them.
                while not self.stream.closed():
                    await asyncio.sleep(0.25)
                return
        await super()._receive_frame()

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
        self.messages = TokenBucket(service.limits.max_messages_per_s)
        self.frames = TokenBucket(FRAMES_PER_MESSAGE * service.limits.max_messages_per_s)
        self.finished = False
        self.draining = False

    def check_origin(self, origin):
        """Tornado's hook, for a handshake with an Origin header: see ``origin_allowed`` (vosk's clients
        are programs and send none; a refused one gets Tornado's 403)."""
        allowed = origin_allowed(origin, self.service.origins)
        if not allowed:
            log.info("refused %s: origin %s", self.request.remote_ip, origin)
        return allowed

    def get_websocket_protocol(self):
        """Tornado's protocol with the JSON error for too-large frames (``_Protocol``)."""
        protocol = super().get_websocket_protocol()
        if protocol is not None:
            protocol = _Protocol(self, False, protocol.params)
        return protocol

    def prepare(self):
        """Before the handshake: the Host header (``host_allowed``)."""
        refuse_host(self, self.service)

    def open(self):
        """Count the connection against ``max_streams``; refuse it past the limit, or while draining."""
        service = self.service
        if service.draining or not service.engine.ready:
            self.refuse(SHUTTING_DOWN if service.draining else "the server is not ready", TRY_LATER)
            return
        if problem := service.take_slot(self.request.remote_ip):
            self.refuse(problem, TRY_LATER)
            return
        self.counted = True
        service.sockets.add(self)
        self.session = RecognizerSession(service)
        self.set_nodelay(True)
        self._cap_send_buffer()
        self.touch()

    def _cap_send_buffer(self) -> None:
        """Cap the kernel's send buffer (``SEND_BUFFER_BYTES``), so a client that does not read is found
        out before megabytes of replies wait for it. A client that reset the connection during the
        handshake leaves no socket (Tornado closes the stream and ``on_close`` follows): nothing to cap."""
        sock = self.ws_connection.stream.socket if self.ws_connection is not None else None
        if sock is None:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        except OSError:  # reset between the check and the call: the same as no socket
            pass

    async def drain(self) -> None:
        """The server is stopping: end the stream as ``eof`` would (its last result is sent), then close
        with 1001. The message being answered is finished first."""
        if self.finished or self.session is None:
            return
        self.draining = True  # no message read from now on starts an answer beside the eof below
        if self.task is not None and not self.task.done():
            await asyncio.wait([self.task])
        if self.finished or self.ws_connection is None:  # answered, or closed meanwhile
            return
        self.finished = True
        try:
            await self.send(await self.session.eof())
        except (ProtocolError, RuntimeError) as error:
            await self.send({"error": str(error)})
        self.close(GOING_AWAY, SHUTTING_DOWN)

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
        self.refuse(
            f"idle for {self.service.limits.idle_timeout_s:g} s (no message, or only silence): closing",
            POLICY,
        )

    def refuse(self, message: str, code: int) -> None:
        """Send ``{"error": message}`` and close the connection with ``code``."""
        if self.finished:
            return
        self.finished = True
        message = cut_utf8(message, MAX_ERROR_BYTES)  # it may quote what the client sent
        log.info("refused %s: %s", self.request.remote_ip, message)
        try:
            self.write_message(json.dumps({"error": message}))
        except tornado.websocket.WebSocketClosedError:
            return
        self.close(code, cut_utf8(message, MAX_REASON_BYTES))

    def rate_allows(self) -> bool:
        """The per-connection message budget (``max_messages_per_s``)."""
        return self.messages.take()

    def frame_allowed(self) -> bool:
        """The per-connection frame budget (``FRAMES_PER_MESSAGE`` times the message budget): fragments of
        one byte and pings cost the event loop as much as messages. Past it, the connection is refused."""
        if self.frames.take():
            return True
        self.refuse(
            f"more than {self.frames.rate:g} frames a second (fragments and pings count): closing", POLICY
        )
        return False

    async def on_message(self, message):
        """Tornado awaits this before reading the next message: one reply per message, in order. Only a
        text message or audible audio (``audible``) counts as activity against the idle limit."""
        if self.finished or self.draining or self.session is None:
            return
        active = audible(message)
        if active:
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
        if active:
            self.touch()

    async def answer(self, message) -> None:
        """Process one message and send its reply (or refuse it)."""
        session = self.session
        try:
            if isinstance(message, bytes):
                await self.send(await session.audio(message))
                return
            if session.text_message(message) == "eof":
                await self.send(await session.eof())
                self.finished = True
                self.close(NORMAL)
        except ProtocolError as error:
            self.refuse(str(error), UNSUPPORTED if isinstance(message, bytes) else POLICY)
        except RuntimeError as error:  # the engine stopped (the server is shutting down)
            self.refuse(str(error), TRY_LATER)
        except tornado.websocket.WebSocketClosedError:
            pass

    async def send(self, reply: dict) -> None:
        """Write one reply and wait until the socket has taken it: a client that does not read its replies
        is not read either (Tornado awaits ``on_message`` before it reads the next message), so its
        unread replies never pile up in the server; one that has not taken a reply within the idle limit
        is closed. A closed connection is ignored: its client left."""
        try:
            written = self.write_message(json.dumps(reply, ensure_ascii=False))
            await asyncio.wait_for(written, self.service.limits.idle_timeout_s)
        except TimeoutError:
            log.info("dropped %s: it does not read its results", self.request.remote_ip)
            self.finished = True
            self.close(POLICY, "not reading its results")
        except (tornado.websocket.WebSocketClosedError, tornado.iostream.StreamClosedError):
            pass

    def on_close(self):
        """Release the stream: its pending chunks are dropped from the engine, and its slot is freed once
        the message being answered has stopped (a call on an audio thread runs to its end)."""
        self.service.sockets.discard(self)
        if self.idle_handle is not None:
            self.idle_handle.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()
            self.task.add_done_callback(lambda _: self._free_slot())
        else:
            self._free_slot()

    def _free_slot(self) -> None:
        if self.counted:
            self.service.free_slot(self.request.remote_ip)
            self.counted = False


@tornado.web.stream_request_body
class SttHandler(tornado.web.RequestHandler):
    """``POST /stt``: an audio file as the body (any format the client reads, any rate: resampled);
    answers the client's ``--json`` object. ``?candidates=N`` (default 3, as the client).

    A request counts against ``max_streams`` from its headers on; its body goes to a temporary file as
    it arrives (never held whole in memory). Audio up to ``max_utterance_s`` is one utterance, exactly
    as the client transcribes a file; longer audio is cut into utterances by the detector (or every
    ``max_utterance_s`` with ``--no-vad``), each decoded and forgotten but for its words, as the client's
    ``--vad`` does, so memory stays bounded; past ``max_post_seconds`` of audio it is refused (413)."""

    def initialize(self, service: Service):
        """Tornado's hook: the shared service."""
        self.service = service
        self.counted = False
        self.directory: tempfile.TemporaryDirectory | None = None
        self.body = None
        self.count = 3
        self.work: asyncio.Task | None = None
        self.body_idle: asyncio.TimerHandle | None = None

    def fail(self, status: int, message: str) -> None:
        """A JSON error response."""
        self.set_status(status)
        self.finish({"error": message})

    def _origin(self) -> bool:
        """Refuse a web page's request whose origin is not allowed (403); an allowed one may read the
        answer (CORS headers)."""
        origin = self.request.headers.get("Origin")
        if not origin_allowed(origin, self.service.origins):
            self.fail(403, f"origin {origin[:80]!r} is not allowed (the server's --allow-origin)")
            return False
        if origin is not None:
            self.set_header("Access-Control-Allow-Origin", origin)
            self.set_header("Vary", "Origin")
        return True

    def options(self):
        """A browser's preflight before a POST with an audio content type."""
        if self._origin():
            self.set_header("Access-Control-Allow-Methods", "POST")
            self.set_header("Access-Control-Allow-Headers", "Content-Type")
            self.set_status(204)
            self.finish()

    async def prepare(self):
        """Before the body: the origin, the stream count and ``candidates``; open the body's file."""
        if refuse_host(self, self.service) or self.request.method != "POST" or not self._origin():
            return
        service = self.service
        if service.draining or not service.engine.ready:
            self.fail(503, SHUTTING_DOWN if service.draining else "the server is not ready")
            return
        try:
            self.count = int(self.get_query_argument("candidates", "3"))
        except ValueError:
            self.count = 0
        if not 1 <= self.count <= 10:
            self.fail(400, "candidates: expected a whole number from 1 to 10")
            return
        if problem := service.take_slot(self.request.remote_ip):
            self.fail(503, problem)
            return
        self.counted = True
        self.touch_body()
        self.directory = tempfile.TemporaryDirectory(prefix="stt-")
        self.body = open(Path(self.directory.name) / "audio", "wb")  # noqa: SIM115 (closed in post/on_finish)

    async def data_received(self, chunk: bytes):
        """A piece of the body, written on a worker thread (the event loop goes on serving)."""
        if self.body is not None and not self._finished:
            self.touch_body()
            await asyncio.get_running_loop().run_in_executor(None, self.body.write, chunk)

    async def post(self):
        """Transcribe the body (see the class docstring). The work is a task of its own, cancelled when the
        client leaves (``on_connection_close``) or the drain's time is up: its queued chunks are dropped
        and its decode never started; the request keeps its stream until then."""
        if self.body is None:
            return
        if self.body_idle is not None:
            self.body_idle.cancel()
            self.body_idle = None
        started = time.perf_counter()
        self.body.close()
        path = Path(self.body.name)
        self.service.posts.add(self)
        self.work = asyncio.get_running_loop().create_task(self._transcribe(path))
        try:
            found = await self.work
        except asyncio.CancelledError:
            return
        except AudioError as error:
            self.fail(400, str(error).replace(str(path), "request body"))
            return
        except RuntimeError as error:  # the engine stopped
            self.fail(503, str(error))
            return
        finally:
            self.service.posts.discard(self)
            self._release()
        if found is None or self._finished:  # refused for its length, or answered by the drain meanwhile
            return
        result, samples = found
        if not isinstance(result, SegmentJoiner):
            model = self.service.model
            out = Transcript(
                audio="request body",
                text=result[0].text,
                duration_s=samples / model.sample_rate,
                processing_s=time.perf_counter() - started,
                candidates=tuple(result),
            ).to_dict()
        else:
            out = result.result("request body", samples, time.perf_counter() - started).to_dict()
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(out, ensure_ascii=False))

    async def _transcribe(self, path: Path):
        """(candidates of the whole, or the ``SegmentJoiner`` of its utterances; samples), or None when it
        was refused for its length."""
        service = self.service
        model, rate = service.model, service.model.sample_rate
        longest = round(service.max_utterance_s * rate)
        cap = service.limits.max_post_seconds
        loop = asyncio.get_running_loop()
        blocks = stream_for_model(path, rate, convert_rate=True, block_seconds=5.0)
        kept: list[np.ndarray] | None = []  # the audio until it is longer than one utterance
        segments, samples = None, 0
        while (block := await to_the_end(loop.run_in_executor(None, next, blocks, None))) is not None:
            samples += len(block)
            if samples > cap * rate:
                blocks.close()
                self.fail(
                    413, f"request body: longer than {cap:g} s of audio (the server's --max-post-seconds)"
                )
                return None
            if kept is not None:
                kept.append(block)
                if samples <= longest:
                    continue
                # Longer than one utterance: cut it into utterances from its start.
                utterances = UtteranceLoop(model.runner, detector(rate, service.vad, longest))
                segments = _Segments(self, SegmentJoiner(rate), utterances)
                block, kept = np.concatenate(kept), None
            await segments.handle(block)
        if segments is None:  # one utterance, as the client transcribes a file
            utterance = Utterance(model.runner)
            await service.off_loop(_feed_whole, utterance, kept)
            await run_ready(service.engine, utterance)  # due from now on, as if it played
            seconds = model.metadata.seconds_per_label
            found = await service.engine.candidates(utterance.logits(), self.count, seconds)
            return found, samples
        await segments.handle(np.zeros(0, np.int16), final=True)
        return segments.joiner, samples

    def on_finish(self):
        """Release the request's stream and its file."""
        self._release()

    def on_connection_close(self):
        """The client left mid-request: its work is cancelled (``post`` then releases the stream), or,
        before its body was whole, the stream is released now (and Tornado's wait for the body ends)."""
        super().on_connection_close()
        if self.work is not None and not self.work.done():
            self.work.cancel()
        else:
            self._release()

    def abandon(self) -> None:
        """The drain's time is up: answer 503 and cancel the work."""
        if not self._finished:
            self.fail(503, f"{SHUTTING_DOWN}: the request did not finish in time")
        if self.work is not None:
            self.work.cancel()

    def touch_body(self) -> None:
        """(Re)start the body's idle timer: ``idle_timeout_s`` without a byte of it closes the request."""
        if self.body_idle is not None:
            self.body_idle.cancel()
        self.body_idle = asyncio.get_running_loop().call_later(
            self.service.limits.idle_timeout_s, self._body_stalled
        )

    def _body_stalled(self) -> None:
        log.info(
            "dropped %s: no byte of its body for %g s",
            self.request.remote_ip,
            self.service.limits.idle_timeout_s,
        )
        self.body_idle = None
        self.request.connection.close()
        self._release()

    def _release(self) -> None:
        if self.body_idle is not None:
            self.body_idle.cancel()
            self.body_idle = None
        if self.counted:
            self.service.free_slot(self.request.remote_ip)
            self.counted = False
        if self.body is not None:
            self.body.close()
        if self.directory is not None:
            self.directory.cleanup()
            self.directory = None


async def drain(service: Service, seconds: float) -> None:
    """Stop taking streams; end each open WebSocket stream as ``eof`` would (its result sent, then a 1001
    close) and let the POST requests under way finish, for at most ``seconds``; then close what is left
    (1001, or a 503 answer)."""
    service.draining = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    endings = [loop.create_task(handler.drain()) for handler in list(service.sockets)]
    while (service.sockets or service.posts) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    for task in endings:
        task.cancel()
    for handler in list(service.sockets):
        handler.finished = True
        handler.close(GOING_AWAY, SHUTTING_DOWN)
    for handler in list(service.posts):
        handler.abandon()


def cut_utf8(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (never inside a character), ``...`` marking a cut."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text
    return encoded[: limit - 3].decode("utf-8", "ignore") + "..."


def _feed_whole(utterance: Utterance, blocks: list[np.ndarray]) -> None:
    """All of a short body's audio into its one utterance, finished."""
    for block in blocks:
        utterance.feed_audio(block)
    utterance.finish()


async def run_ready(engine: BatchEngine, utterance: Utterance, due: float | None = None) -> None:
    """Run the utterance's ready chunks through the engine (``due``: see ``BatchEngine.run``)."""
    logits, state = await engine.run(utterance.ready(), utterance.state, due)
    utterance.accept(logits, state)


class _Segments:
    """The utterances of a long ``POST /stt`` body run through the engine one by one and joined."""

    def __init__(self, handler: SttHandler, joiner: SegmentJoiner, utterances: UtteranceLoop):
        self.handler = handler
        self.joiner = joiner
        self.utterances = utterances
        self.clock = RealTimeClock()  # a posted file's audio is due as if it played: streams go first

    async def handle(self, samples: np.ndarray, final: bool = False) -> None:
        """Feed ``samples`` to the detector: each ended utterance is decoded (its best candidate) and
        dropped."""
        service = self.handler.service
        model, engine = service.model, service.engine
        due = self.clock.advance(len(samples) / model.sample_rate)
        async for step in service.steps_off_loop(self.utterances.feed(samples, final)):
            if isinstance(step, Utterance):
                await run_ready(engine, step, due)
                continue
            seconds = model.metadata.seconds_per_label
            found = await engine.candidates(step.logits, 1, seconds)
            self.joiner.add(step.start, step.end, found[0])


class StatusHandler(tornado.web.RequestHandler):
    """``GET /status``: open streams and the engine's counters (model calls, chunks, largest batch)."""

    def initialize(self, service: Service):
        """Tornado's hook: the shared service."""
        self.service = service

    def prepare(self):
        """The Host header (``host_allowed``)."""
        refuse_host(self, self.service)

    def get(self):
        """The counters as JSON."""
        stats = self.service.engine.stats
        self.finish(
            {
                "ready": is_ready(self.service),
                "streams": self.service.open_streams,
                "batched": self.service.engine.runner.batched,
                "calls": stats.calls,
                "chunks": stats.chunks,
                "largest_batch": stats.largest_batch,
            }
        )


def is_ready(service: Service) -> bool:
    """Whether the server takes new streams: its engine runs and it is not draining."""
    return service.engine.ready and not service.draining


class ReadyHandler(StatusHandler):
    """``GET /ready``: 200 ``{"ready": true}`` while the server takes new streams, else 503 (its engine
    stopped, or it is draining after SIGTERM): what a load balancer or Kubernetes probe asks."""

    def get(self):
        """200 or 503."""
        ready = is_ready(self.service)
        self.set_status(200 if ready else 503)
        self.finish({"ready": ready})


class MetricsHandler(StatusHandler):
    """``GET /metrics``: the counters in Prometheus' text format (``server.metrics``)."""

    def get(self):
        """The exposition of the service's registry."""
        from native_client.server.metrics import exposition

        body, content_type = exposition(self.service, is_ready(self.service))
        self.set_header("Content-Type", content_type)
        self.finish(body)


class CappedHTTPServer(tornado.httpserver.HTTPServer):
    """Tornado's HTTP server with a cap on open sockets, below the process's file descriptor limit: a
    connection past it is closed as soon as it is accepted (at the limit itself Tornado's accept loop
    would spin, logging every failed accept)."""

    def initialize(self, *args, max_connections: int, service: Service, **kwargs):
        """Tornado's hook (``HTTPServer`` is configured, not constructed): the cap and the service."""
        super().initialize(*args, **kwargs)
        self.max_connections = max_connections
        self.service = service

    def handle_stream(self, stream, address):
        """Serve the connection, or close it at once past the cap."""
        # Tornado's own set of HTTP connections, plus the WebSocket streams, which it no longer counts.
        if len(self._connections) + len(self.service.sockets) >= self.max_connections:
            log.info("refused %s: %d connections open (--max-connections)", address[0], self.max_connections)
            stream.close()
            return
        super().handle_stream(stream, address)


def make_app(service: Service) -> tornado.web.Application:
    """The application: WebSocket at ``/`` (vosk-server's path), ``POST /stt``, ``GET /status``,
    ``/ready`` and ``/metrics``."""
    handlers = [
        ("/", RecognizeHandler),
        ("/stt", SttHandler),
        ("/status", StatusHandler),
        ("/ready", ReadyHandler),
        ("/metrics", MetricsHandler),
    ]
    return tornado.web.Application(
        [(path, handler, {"service": service}) for path, handler in handlers],
        websocket_max_message_size=service.limits.max_frame_bytes,
    )
