"""``deepspeech-serve``: serve an export (or a DeepSpeech/Coqui ``.tflite``) over WebSocket and HTTP.

    deepspeech-serve --model EXPORT [--host 127.0.0.1] [--port 2700] [--scorer ... | --no-scorer]
        [--max-streams N] [--max-frame-bytes N] [--max-messages-per-s N] [--idle-timeout S]
        [--max-batch N] [--no-vad] [--end-silence S] [--max-utterance S]

It binds to the loopback interface unless ``--host`` says otherwise, and prints where it listens (and
whether streams are batched) on one line once it accepts connections. docs/CLIENT.md "Serving" has the
protocol and the limits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from native_client.metadata import ExportError
from native_client.vad import VadError, VadSettings


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
    parser.add_argument("--backend", choices=("tflite", "saved_model", "frozen_graph"))
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the model (default 1)")
    parser.add_argument(
        "--scorer", help="language model instead of the export's own (as deepspeech-transcribe)"
    )
    parser.add_argument("--vocabulary", help="the words of a KenLM binary --scorer")
    parser.add_argument("--no-scorer", "--no_scorer", action="store_true", help="greedy decoding")
    parser.add_argument("--beam-width", "--beam_width", type=int)
    parser.add_argument("--lm-alpha", "--lm_alpha", type=float)
    parser.add_argument("--lm-beta", "--lm_beta", type=float)
    parser.add_argument("--allow-plugin", "--allow_plugin", action="append", default=[], metavar="MODULE")
    limits = parser.add_argument_group("limits (each refusal is a JSON error on that connection)")
    limits.add_argument("--max-streams", type=int, default=64, help="open WebSocket connections (default 64)")
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
        "--idle-timeout", type=float, default=30.0, help="seconds without a message (default 30)"
    )
    limits.add_argument(
        "--max-body-bytes", type=int, default=64 << 20, help="bytes of a POST /stt body (default 64 MiB)"
    )
    limits.add_argument(
        "--max-batch",
        type=int,
        default=64,
        help="streams stepped in one model call (default 64; 1 serves each stream with its own calls)",
    )
    vad = parser.add_argument_group("utterances (voice activity detection)")
    vad.add_argument("--no-vad", action="store_true", help="no detector: a connection is one utterance")
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


def load_model(args):
    """The model and its decoder, as ``deepspeech-transcribe`` loads them."""
    from native_client.__main__ import model_location
    from native_client.export_decoder import decoder_for_export
    from native_client.model import open_model

    overrides = {"beam_width": args.beam_width, "lm_alpha": args.lm_alpha, "lm_beta": args.lm_beta}
    factory = (
        None
        if args.no_scorer
        else (
            lambda metadata: decoder_for_export(
                metadata, args.scorer, overrides, args.allow_plugin, vocabulary_file=args.vocabulary
            )
        )
    )
    directory, backend = model_location(args.model, args.backend)
    model = open_model(
        directory,
        backend=backend,
        threads=args.threads,
        decoder_factory=factory,
        plugins=tuple(args.allow_plugin),
    )
    streaming = model.metadata.streaming
    if streaming is None or streaming["input"] != "windows":
        what = (
            "has no streaming form" if streaming is None else "streams chunks of frames, not context windows"
        )
        raise ExportError(f"{model.metadata.directory}: the server streams; this model {what}")
    return model


async def serve(args) -> None:
    """Load the model, listen, print the address, run until SIGINT/SIGTERM."""
    import tornado.httpserver
    import tornado.netutil

    from native_client.batching import BatchRunner, batch_runner
    from native_client.server.app import Limits, Service, make_app
    from native_client.server.engine import BatchEngine

    model = load_model(args)
    limits = Limits(
        max_streams=args.max_streams,
        max_frame_bytes=args.max_frame_bytes,
        max_messages_per_s=args.max_messages_per_s,
        idle_timeout_s=args.idle_timeout,
        max_body_bytes=args.max_body_bytes,
        max_batch=args.max_batch,
    )
    runner = batch_runner(model.runner) if args.max_batch > 1 else BatchRunner(model.runner)
    engine = BatchEngine(runner, limits.max_batch)
    service = Service(model, engine, limits, vad_settings(args))
    engine.start()
    server = tornado.httpserver.HTTPServer(make_app(service), max_body_size=limits.max_body_bytes)
    sockets = tornado.netutil.bind_sockets(args.port, args.host)
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    scope = (
        "loopback only; --host 0.0.0.0 to serve other machines"
        if args.host in ("127.0.0.1", "localhost", "::1")
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
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stop()
    await engine.stop()


def main(argv=None) -> int:
    """Run the server; exit 2 with one line on a model or setting that cannot be served."""
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if args.scorer and args.no_scorer:
        print("error: --scorer and --no-scorer contradict each other", file=sys.stderr)
        return 2
    for name in ("max_streams", "max_frame_bytes", "max_body_bytes", "max_batch"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if args.max_messages_per_s <= 0 or args.idle_timeout <= 0:
        print("error: --max-messages-per-s and --idle-timeout must be positive", file=sys.stderr)
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
