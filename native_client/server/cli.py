"""``deepspeech-serve``: serve an export (or a DeepSpeech/Coqui ``.tflite``) over WebSocket and HTTP.

    deepspeech-serve --model EXPORT [--host 127.0.0.1] [--port 2700] [--scorer ... | --no-scorer]
        [--max-streams N] [--max-frame-bytes N] [--max-messages-per-s N] [--idle-timeout S]
        [--max-post-seconds S] [--max-batch N] [--no-vad] [--end-silence S] [--max-utterance S]
        [--allow-origin ORIGIN ...] [--drain-seconds S] [--decode-processes N]
        [--audio-threads N]

It binds to the loopback interface unless ``--host`` says otherwise, and prints where it listens (and
whether streams are batched) on one line once it accepts connections. On SIGTERM or SIGINT it stops
listening and drains: each open stream gets its last result and a 1001 close, the requests under way
finish, for at most ``--drain-seconds``; a second signal exits at once. docs/CLIENT.md "Serving" has the
protocol and the limits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import resource
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from native_client.metadata import ExportError
from native_client.model_options import open_model_for, option_problem
from native_client.runtime import BACKENDS
from native_client.vad import VadError, VadSettings

MIN_UPLOAD_BYTES_PER_S = 128 << 10  # 1 Mbit/s: a slower POST /stt upload is dropped
# The addresses that keep the server on this machine (it then checks requests' Host header).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# SIGTERM's drain: at most this long (a container runtime's grace period is often 30 s), then the
# connections left get this long to close.
MAX_DRAIN_SECONDS, CLOSE_WAIT_S = 30.0, 5.0


def parse_args(argv=None) -> argparse.Namespace:
    """The server's arguments."""
    parser = argparse.ArgumentParser(
        prog="deepspeech-serve",
        description="Serve a model over WebSocket (vosk-server's protocol) and POST /stt.",
    )
    parser.add_argument(
        "--model", required=True, help="export directory, model file or DeepSpeech/Coqui .tflite"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    parser.add_argument(
        "--port", type=int, default=2700, help="port (default 2700, vosk-server's; 0: any free)"
    )
    parser.add_argument("--backend", choices=BACKENDS)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the model (default 1)")
    parser.add_argument(
        "--scorer", help="language model instead of the export's own (as deepspeech-transcribe)"
    )
    parser.add_argument("--vocabulary", help="the words of a KenLM binary --scorer")
    parser.add_argument("--no-scorer", "--no_scorer", action="store_true", help="greedy decoding")
    parser.add_argument("--beam-width", "--beam_width", type=int)
    parser.add_argument("--lm-alpha", "--lm_alpha", type=float)
    parser.add_argument("--lm-beta", "--lm_beta", type=float)
    parser.add_argument(
        "--decode-processes",
        type=int,
        default=1,
        help="processes decoding results with the language model (beam search), each loading it once "
        "(default 1)",
    )
    parser.add_argument(
        "--audio-threads",
        type=int,
        default=2,
        help="threads turning the connections' audio into model input (resampling, voice activity, "
        "features, partial transcripts), off the event loop's (default 2)",
    )
    parser.add_argument("--allow-plugin", "--allow_plugin", action="append", default=[], metavar="MODULE")
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page's origin (scheme://host[:port]) that may use the server from a browser; repeat "
        "for several. Without it only pages on this machine (a loopback origin) and programs (no Origin) may",
    )
    limits = parser.add_argument_group("limits (each refusal is a JSON error on that connection)")
    limits.add_argument(
        "--max-streams",
        type=int,
        default=64,
        help="open WebSocket connections and POST /stt requests in progress (default 64)",
    )
    limits.add_argument(
        "--max-streams-per-client",
        type=int,
        help="of --max-streams, the ones one address may hold (default a quarter of --max-streams: no "
        "client takes every slot)",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        help="open sockets, before and after a WebSocket upgrade; more are closed as they come (default "
        "4 x --max-streams + 256, kept 64 below the open-file limit)",
    )
    limits.add_argument(
        "--max-frame-bytes", type=int, default=1 << 20, help="bytes of one message (default 1 MiB)"
    )
    limits.add_argument(
        "--max-messages-per-s",
        type=float,
        default=100.0,
        help="messages a second per connection (default 100)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        help="seconds without a message (audio that is only silence does not count), or without a byte of a "
        "request's headers or body (default 30)",
    )
    limits.add_argument(
        "--max-body-bytes", type=int, default=64 << 20, help="bytes of a POST /stt body (default 64 MiB)"
    )
    limits.add_argument(
        "--max-post-seconds",
        type=float,
        default=600.0,
        help="seconds of audio in a POST /stt body (default 600)",
    )
    limits.add_argument(
        "--drain-seconds",
        type=float,
        default=10.0,
        help="on SIGTERM or SIGINT, seconds the open streams and requests get to finish (their results "
        "sent, then closed); a second signal exits at once (default 10, at most 30)",
    )
    limits.add_argument(
        "--max-audio-rate",
        type=float,
        default=8.0,
        help="seconds of audio a connection may send a second, after a burst of 32 s (default 8: eight "
        "times real time; at least 1)",
    )
    limits.add_argument(
        "--max-batch",
        type=int,
        default=64,
        help="streams stepped in one model call (default 64; 1 serves each stream with its own calls)",
    )
    vad = parser.add_argument_group("utterances (voice activity detection)")
    vad.add_argument(
        "--no-vad",
        action="store_true",
        help="no detector: a connection is one utterance, cut every --max-utterance seconds",
    )
    vad.add_argument(
        "--end-silence", type=float, default=0.5, help="a pause this long ends an utterance (default 0.5 s)"
    )
    vad.add_argument(
        "--max-utterance", type=float, default=30.0, help="longest utterance in seconds (default 30)"
    )
    vad.add_argument("--vad-aggressiveness", type=int, default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--verbose", action="store_true", help="log each refusal and the batch sizes")
    return parser.parse_args(argv)


def vad_settings(args) -> VadSettings | None:
    """The detector's settings from the arguments (None with ``--no-vad``)."""
    if args.no_vad:
        return None
    soft = min(VadSettings.soft_max_s, args.max_utterance * 2 / 3)
    settings = VadSettings(
        aggressiveness=args.vad_aggressiveness,
        end_silence_s=args.end_silence,
        soft_max_s=soft,
        max_utterance_s=args.max_utterance,
    )
    settings.check()
    return settings


def origin_problem(origin: str) -> str | None:
    """What is wrong with an ``--allow-origin`` value (it must be ``scheme://host[:port]``, as a browser
    sends it), or None."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query:
        return f"--allow-origin {origin!r}: expected scheme://host[:port], as a browser sends it"
    return None


def derived_defaults(args):
    """``args`` with the defaults that follow from others: ``--max-streams-per-client`` a quarter of
    ``--max-streams``, ``--max-connections`` 4 x ``--max-streams`` + 256 kept 64 below the open-file
    limit."""
    if args.max_streams_per_client is None:
        args.max_streams_per_client = max(1, args.max_streams // 4)
    if args.max_connections is None:
        files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        headroom = files - 64 if files != resource.RLIM_INFINITY else 1 << 20
        args.max_connections = max(1, min(4 * args.max_streams + 256, headroom))
    return args


def settings_problem(args) -> str | None:
    """What is wrong with the server's arguments, as one line without the ``error: `` prefix, or None.
    The model options are checked as ``deepspeech-transcribe`` checks them (``model_options``)."""
    if problem := option_problem(args):
        return problem
    if not 0 <= args.port <= 65535:  # Tornado would listen on the port modulo 65536
        return f"--port {args.port}: expected 0 to 65535 (0: any free port)"
    names = ("max_streams", "max_streams_per_client", "max_connections", "max_frame_bytes", "max_body_bytes")
    for name in (*names, "max_batch", "decode_processes", "audio_threads"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    for name in ("max_messages_per_s", "idle_timeout", "max_post_seconds", "max_utterance", "end_silence"):
        value = getattr(args, name)
        if not math.isfinite(value) or value <= 0:
            return f"--{name.replace('_', '-')} {value}: expected a finite number above 0"
    if not 0 <= args.drain_seconds <= MAX_DRAIN_SECONDS:  # NaN fails both
        return f"--drain-seconds {args.drain_seconds}: expected 0 to {MAX_DRAIN_SECONDS:g}"
    if not args.max_audio_rate >= 1:  # NaN fails too
        return f"--max-audio-rate {args.max_audio_rate}: expected at least 1 (real time)"
    if args.max_messages_per_s < 1:  # the budget holds a second's worth: under one message, none fits
        return f"--max-messages-per-s {args.max_messages_per_s}: expected at least 1"
    for origin in args.allow_origin:
        if problem := origin_problem(origin):
            return problem
    try:
        vad_settings(args)
    except VadError as error:
        return str(error)
    return None


async def serve(args) -> None:
    """Load the model, listen, print the address, run until SIGINT/SIGTERM."""
    import tornado.httpserver
    import tornado.netutil

    from native_client.__main__ import model_location
    from native_client.batching import BatchRunner, batch_runner
    from native_client.server.app import CappedHTTPServer, Limits, Service, drain, make_app
    from native_client.server.decoding import ProcessDecoding, ThreadDecoding
    from native_client.server.engine import BatchEngine

    model = open_model_for(args, model_location)
    if model.metadata.streaming is None:
        raise ExportError(f"{model.metadata.directory}: the server streams; this model has no streaming form")
    limits = Limits(
        max_streams=args.max_streams,
        max_streams_per_client=args.max_streams_per_client,
        max_frame_bytes=args.max_frame_bytes,
        max_messages_per_s=args.max_messages_per_s,
        idle_timeout_s=args.idle_timeout,
        max_body_bytes=args.max_body_bytes,
        max_post_seconds=args.max_post_seconds,
        max_batch=args.max_batch,
        max_audio_rate=args.max_audio_rate,
    )
    runner = batch_runner(model.runner) if args.max_batch > 1 else BatchRunner(model.runner)
    decoding = (
        ProcessDecoding(model.decoder_spec, tuple(args.allow_plugin), args.decode_processes)
        if model.decoder_spec is not None
        else ThreadDecoding(model.decoder)
    )
    engine = BatchEngine(runner, decoding, limits.max_batch)
    service = Service(
        model,
        engine,
        limits,
        vad_settings(args),
        max_utterance_s=args.max_utterance,
        origins=frozenset(origin.rstrip("/").lower() for origin in args.allow_origin),
        loopback_only=args.host in LOOPBACK_HOSTS,
        audio_threads=ThreadPoolExecutor(args.audio_threads, thread_name_prefix="audio"),
    )
    engine.start()
    # Tornado's defaults wait an hour for a request's headers and forever for its body. Headers (and the
    # next request on a kept connection) get the idle limit; Tornado's body timeout is for the whole
    # body, so it is the idle limit plus the largest body at MIN_UPLOAD_BYTES_PER_S.
    server = CappedHTTPServer(
        make_app(service),
        max_connections=args.max_connections,
        service=service,
        max_body_size=limits.max_body_bytes,
        idle_connection_timeout=limits.idle_timeout_s,
        body_timeout=limits.idle_timeout_s + limits.max_body_bytes / MIN_UPLOAD_BYTES_PER_S,
    )
    sockets = tornado.netutil.bind_sockets(args.port, args.host)
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    scope = (
        "loopback only; --host 0.0.0.0 to serve other machines"
        if args.host in LOOPBACK_HOSTS
        else "reachable from other machines: no authentication, put it behind a proxy that has some"
    )
    batching = (
        f"batched up to {limits.max_batch} streams a call"
        if runner.batched
        else "one model call per stream (the model has no batched signature)"
        if args.max_batch > 1
        else "one model call per stream (--max-batch 1)"
    )
    print(
        f"deepspeech-serve: listening on ws://{args.host}:{port}/ and http://{args.host}:{port}/stt "
        f"({scope}); {batching}; decoder {model.decoder.name}",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            print("deepspeech-serve: a second signal: exiting now", file=sys.stderr, flush=True)
            os._exit(1)
        print(
            f"deepspeech-serve: stopping: the open streams get {args.drain_seconds:g} s to finish "
            "(a second signal exits now)",
            file=sys.stderr,
            flush=True,
        )
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    await stop.wait()
    server.stop()  # no new connections
    await drain(service, args.drain_seconds)
    try:
        await asyncio.wait_for(server.close_all_connections(), CLOSE_WAIT_S)
    except TimeoutError:
        pass
    await engine.stop()
    service.audio_threads.shutdown(wait=False, cancel_futures=True)


def main(argv=None) -> int:
    """Run the server; exit 2 with one line on a model or setting that cannot be served."""
    args = derived_defaults(parse_args(argv))
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if problem := settings_problem(args):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args))
    except (ExportError, ValueError, FileNotFoundError, VadError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the port is taken, the address is not this machine's
        print(f"error: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
