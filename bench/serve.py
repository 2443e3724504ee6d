"""Serving: how many real-time streams ``deepspeech-serve`` holds, batched and at batch 1, and long audio.

The model: the full-size int8 export at 20 ms frames (configs/en.yaml's geometry
with features.type deepspeech, as bench/infer.py builds it: untrained, since
weights do not change the speed), exported by the real Export code.

1. Profile (one thread): the time of one batch-1 streaming call of the TFLite
   model, the time of its per-frame recurrent matrix-vector work alone (a TFLite
   model of just the ``n_steps`` products ``h @ recurrent_kernel`` and the gates,
   int8 weights as the export has them), its share of the call, and the time per
   stream of the batched signature at growing batches: how much batching can
   save at most on this CPU (its L3 against the 16.8 MB recurrent kernel).
2. Streams: the server in a child process (``--no-vad --no-scorer``: every stream
   speaks all the time and every frame gets a greedy partial), N WebSocket clients
   in this process, each sending one model call's audio (n_steps frames: 320 ms)
   at real-time pace from a random phase, the speech of the sample's test clips.
   Latency of a partial: from the moment its frame's audio is due (real time) to
   the partial's arrival, so a client held back by a late reply counts its wait.
   The most streams with partial-latency p95 under 300 ms, found by doubling and
   then bisecting, for the batched server (``--max-batch 64``) and batch-1 serving
   (``--max-batch 1``) of the same export, and for the Coqui STT armspeech model
   (``make fetch-models``; its runtime has no batches) as the outside anchor.
3. Long audio: ``deepspeech-transcribe --format srt`` of a file of test clips and
   silences (60 minutes) in a child process; its peak RSS (goal: under 500 MiB).
4. Hostile clients: 16 well-behaved real-time streams beside four clients of one
   hostile kind at a time and of all kinds at once (bench/hostile_clients.py: slot
   hogs, one-byte fragment floods, clients that never read, 1 MiB frames at 4000
   Hz), each kind from an address of its own, in a process of their own (at
   ``--hostile-nice``), and alone before, between and after: the streams' p95
   partial latency each time over the median alone (goal: within 1.5x beside all of
   them), streams refused (goal: none), the hostile process's CPU and the server's
   peak RSS.

The first line is the CPU; the last line one JSON object. ``--quick`` runs every
part with tiny durations, to check that the script works (its figures mean nothing).

    python bench/serve.py [--quick] [--seconds 30] [--threads 1] [--long-minutes 60]
        [--hostile-streams 16] [--hostile-nice 0] [--parts profile streams long_audio hostile]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LATENCY_GOAL_MS = 300.0
PARTS = ("profile", "streams", "long_audio", "hostile")
FEATURES_20MS = {"type": "deepspeech", "winlen": 0.032, "winstep": 0.02}


def median_ms(call, repeats: int) -> float:
    """Median wall time of ``call()`` in ms, after two warm-up calls."""
    for _ in range(2):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1000 * float(np.median(times))


def recurrence_model(n_hidden: int, n_steps: int) -> bytes:
    """A TFLite model of the per-frame part of a streaming call alone: ``n_steps`` products of the state
    with a ``[n_hidden, 4 n_hidden]`` recurrent kernel and the LSTM gates, the input projection given;
    dynamic-range int8 as the export quantizes."""
    import tensorflow as tf

    kernel = tf.constant(np.random.default_rng(0).normal(0, 0.02, (n_hidden, 4 * n_hidden)), tf.float32)

    @tf.function(
        input_signature=[
            tf.TensorSpec([n_steps, 4 * n_hidden], tf.float32),
            tf.TensorSpec([1, n_hidden], tf.float32),
            tf.TensorSpec([1, n_hidden], tf.float32),
        ]
    )
    def recurrence(projected, h, c):
        for t in range(n_steps):
            z = projected[t : t + 1] + tf.matmul(h, kernel)
            i, f, g, o = tf.split(z, 4, axis=1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            h = tf.sigmoid(o) * tf.tanh(c)
        return h, c

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [recurrence.get_concrete_function()], recurrence
    )
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return converter.convert()


def profile(export: Path, threads: int, repeats: int, batches: tuple[int, ...]) -> dict:
    """Batch-1 call time, its recurrent matrix-vector part, and the batched signature's time per stream."""
    from native_client import Model
    from native_client.batching import batch_runner
    from native_client.litert import open_tflite

    model = Model(export, backend="tflite", threads=threads)
    meta = model.metadata
    n_hidden = int(meta.state[0]["shape"][-1])
    rng = np.random.default_rng(0)
    windows = rng.normal(0, 1, (1, meta.n_steps, 2 * meta.n_context + 1, meta.n_input)).astype(np.float32)
    state = model.runner.zero_state()
    call_ms = median_ms(lambda: model.runner.step(windows, state), repeats)

    with tempfile.NamedTemporaryFile(suffix=".tflite") as handle:
        handle.write(recurrence_model(n_hidden, meta.n_steps))
        handle.flush()
        # as the export runs: the kernel packed once
        recurrence = open_tflite(handle.name, threads, shared_weights=True)
    (signature,) = recurrence.signatures()
    feed = {
        name: rng.normal(0, 0.5, shape).astype(np.float32)
        for name, shape in recurrence.input_shapes(signature).items()
    }
    recurrent_ms = median_ms(lambda: recurrence.run(signature, feed), repeats)

    runner = batch_runner(model.runner)
    per_stream = {}
    for batch in batches:
        many = np.repeat(windows, batch, axis=0)
        states = [state] * batch
        per_stream[str(batch)] = round(
            median_ms(lambda m=many, s=states: runner.step(m, s), max(3, repeats // 4)) / batch, 2
        )
    return {
        "batch1_call_ms": round(call_ms, 2),
        "recurrent_matvec_ms": round(recurrent_ms, 2),
        "recurrent_share": round(recurrent_ms / call_ms, 3),
        "per_stream_ms_at_batch": per_stream,
        "batched_signature": runner.batched,
        "n_hidden": n_hidden,
        "n_steps": meta.n_steps,
    }


def speech(seconds: float) -> np.ndarray:
    """int16 speech at 16 kHz: the sample's test clips one after another, repeated to ``seconds``."""
    import soundfile

    clips = [
        soundfile.read(path, dtype="int16")[0] for path in sorted((ROOT / "data/sample/test").glob("*.flac"))
    ]
    audio = np.concatenate(clips)
    return np.resize(audio, int(seconds * 16000) + len(audio))  # longer by one pass: streams start apart


class Server:
    """``deepspeech-serve`` in a child process on a free loopback port."""

    def __init__(
        self, model: Path, max_batch: int, threads: int, streams: int, per_client: int | None = None
    ):
        command = [
            sys.executable,
            "-m",
            "native_client.server.cli",
            "--model",
            str(model),
            "--port",
            "0",
            "--threads",
            str(threads),
            "--max-batch",
            str(max_batch),
            "--max-streams",
            str(streams),
            "--max-streams-per-client",  # every well-behaved stream comes from this one address
            str(per_client or streams),
            "--no-vad",
            "--no-scorer",
            "--idle-timeout",
            "120",
        ]
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        for line in self.process.stderr:
            found = re.search(r"listening on ws://[^:]+:(\d+)/", line)
            if found:
                self.port = int(found.group(1))
                break
        else:
            raise SystemExit(f"deepspeech-serve did not start (exit {self.process.wait()})")
        # Its later messages are read (and dropped) so that a full pipe never blocks it.
        threading.Thread(target=lambda: sum(1 for _ in self.process.stderr), daemon=True).start()

    def close(self) -> None:
        """Stop the server (SIGTERM, as a service manager would)."""
        self.process.terminate()
        self.process.wait(timeout=60)


async def one_stream(
    url: str, audio: np.ndarray, frame: int, seconds: float, phase: float, start: float, out
):
    """One client: from ``start + phase``, a frame of ``frame`` samples every frame's duration (real time),
    each reply awaited; appends each partial's latency (ms, from its audio's due time) to ``out``."""
    from tornado.websocket import websocket_connect

    connection = await websocket_connect(url, max_message_size=1 << 24)
    period = frame / 16000
    frames = int(seconds / period)
    offset = random.Random(phase).randrange(0, len(audio) - frames * frame)
    await asyncio.sleep(max(0.0, start + phase - time.monotonic()))
    began = time.monotonic()
    for index in range(frames):
        due = began + (index + 1) * period  # the frame's last sample arrives now in real time
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        chunk = audio[offset + index * frame : offset + (index + 1) * frame]
        await connection.write_message(chunk.astype("<i2").tobytes(), binary=True)
        reply = await connection.read_message()
        if reply is None:
            raise RuntimeError("the server closed a stream")
        if "error" in json.loads(reply):
            raise RuntimeError(f"the server refused a stream: {reply}")
        if index > 0:  # the first frame also pays for the connection's first chunk setup
            out.append(1000 * (time.monotonic() - due))
    await connection.write_message('{"eof" : 1}')
    while await connection.read_message() is not None:
        pass


async def trial(port: int, streams: int, audio: np.ndarray, frame: int, seconds: float) -> float:
    """p95 partial latency (ms) of ``streams`` concurrent real-time streams for ``seconds``."""
    latencies: list[float] = []
    start = time.monotonic() + 0.5
    period = frame / 16000
    url = f"ws://127.0.0.1:{port}/"
    await asyncio.gather(
        *(
            one_stream(url, audio, frame, seconds, random.random() * period, start, latencies)
            for _ in range(streams)
        )
    )
    return float(np.percentile(latencies, 95))


def most_streams(model: Path, max_batch: int, threads: int, seconds: float, limit: int) -> dict:
    """The most streams (up to ``limit``) served with p95 partial latency under the goal: doubling, then
    bisecting between the last count that met it and the first that did not."""
    from native_client import Model

    meta = Model(model).metadata
    frame = int(round(meta.n_steps * meta.features.seconds_per_frame * 16000))
    audio = speech(seconds)
    server = Server(model, max_batch, threads, limit + 1)
    # Untimed: the first calls of a model (and of each batch size) pay for allocating and packing weights.
    asyncio.run(trial(server.port, 1, audio, frame, 3 * frame / 16000))
    tried = {}

    def run(count: int) -> bool:
        tried[count] = round(asyncio.run(trial(server.port, count, audio, frame, seconds)), 1)
        print(f"  {model.name} max_batch {max_batch}: {count} streams, p95 {tried[count]} ms", flush=True)
        return tried[count] < LATENCY_GOAL_MS

    try:
        good, bad, count = 0, None, 1
        while count <= limit:
            if run(count):
                good, count = count, count * 2
            else:
                bad = count
                break
        if bad is None and good < limit:  # met at every doubling below the limit: try the limit itself
            if run(limit):
                good = limit
            else:
                bad = limit
        while bad is not None and bad - good > max(1, good // 10):
            middle = (good + bad) // 2
            if run(middle):
                good = middle
            else:
                bad = middle
    finally:
        server.close()
    return {
        "streams": good,
        "p95_ms": tried.get(good),
        "frame_ms": round(1000 * frame / 16000),
        "tried": tried,
    }


async def tolerant_trial(port: int, streams: int, audio: np.ndarray, frame: int, seconds: float) -> tuple:
    """(p95 partial latency in ms, streams refused or closed) of ``streams`` real-time streams."""
    latencies: list[float] = []
    start = time.monotonic() + 0.5
    period = frame / 16000
    url = f"ws://127.0.0.1:{port}/"

    async def one(phase: float) -> bool:
        try:
            await one_stream(url, audio, frame, seconds, phase, start, latencies)
        except (RuntimeError, OSError):
            return False
        return True

    kept = await asyncio.gather(*(one(random.random() * period) for _ in range(streams)))
    return float(np.percentile(latencies, 95)) if latencies else None, kept.count(False)


def peak_rss_mib(pid: int) -> float:
    """A live process's peak resident set (``VmHWM``), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return round(int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024, 1)


def beside_hostile(
    port: int, streams: int, audio, frame: int, seconds: float, per_kind: int, kinds, nice: int
) -> dict:
    """One trial of ``streams`` well-behaved streams beside ``per_kind`` clients of each of ``kinds`` (in a
    process of their own, at niceness ``nice``): the streams' p95 and refusals, the connections each kind
    opened and the share of one core the hostile process used."""
    clients = subprocess.Popen(
        ["nice", "-n", str(nice), sys.executable, str(ROOT / "bench" / "hostile_clients.py")]
        + ["--port", str(port), "--seconds", str(seconds + 3), "--per-kind", str(per_kind)]
        + ["--kinds", *kinds],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)  # the hostile clients are at it before the streams start
    p95, refused = asyncio.run(tolerant_trial(port, streams, audio, frame, seconds))
    report = json.loads(clients.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1])
    return {
        "p95_ms": round(p95, 1) if p95 is not None else None,
        "refused": refused,
        "connections": report["connections"],
        "sent_mib": report["sent_mib"],
        "hostile_cpu_share": round(report["cpu_s"] / (seconds + 3), 2),
    }


def hostile(model: Path, threads: int, seconds: float, streams: int, per_kind: int, nice: int) -> dict:
    """``streams`` well-behaved real-time streams (from 127.0.0.1) beside ``per_kind`` clients of each
    hostile kind alone and of all kinds at once (``hostile_clients``: slot hogs, fragment floods,
    non-readers, huge low-rate frames, each kind from an address of its own, in a process of their own at
    niceness ``nice``), and alone before, between and after those trials: the well-behaved streams' p95
    partial latency and refusals each time, each hostile trial's p95 over the median of the trials alone
    (one trial's p95 alone varies by 2x from run to run on a 2-core machine), and the server's peak RSS."""
    from hostile_clients import KINDS  # bench/, the folder of the script

    from native_client import Model

    meta = Model(model).metadata
    frame = int(round(meta.n_steps * meta.features.seconds_per_frame * 16000))
    audio = speech(seconds)
    server = Server(model, 64, threads, 64, per_client=streams)
    beside: dict = {}
    alone: list[float] = []
    refused_alone = 0

    def trial_alone() -> None:
        nonlocal refused_alone
        p95, refused = asyncio.run(tolerant_trial(server.port, streams, audio, frame, seconds))
        if p95 is None:
            raise SystemExit(f"every one of {streams} streams alone was refused: the server is not serving")
        alone.append(round(p95, 1))
        refused_alone += refused
        print(f"  {streams} streams alone: p95 {p95:.1f} ms, {refused} refused", flush=True)

    try:
        asyncio.run(trial(server.port, 1, audio, frame, 3 * frame / 16000))  # untimed warm-up
        trial_alone()
        for kinds in [(kind,) for kind in KINDS] + [KINDS]:
            name = kinds[0] if len(kinds) == 1 else "all"
            beside[name] = beside_hostile(server.port, streams, audio, frame, seconds, per_kind, kinds, nice)
            print(f"  beside {name}: {json.dumps(beside[name])}", flush=True)
            trial_alone()
        rss = peak_rss_mib(server.process.pid)
    finally:
        server.close()
    baseline = float(np.median(alone))
    for figures in beside.values():
        if figures["p95_ms"] is not None:
            figures["p95_ratio"] = round(figures["p95_ms"] / baseline, 2)
    return {
        "streams": streams,
        "hostile_per_kind": per_kind,
        "hostile_nice": nice,
        "p95_ms_alone": alone,
        "p95_ms_alone_median": round(baseline, 1),
        "refused_alone": refused_alone,
        "beside": beside,
        "p95_ratio": beside["all"].get("p95_ratio"),
        "server_peak_rss_mib": rss,
    }


def long_audio(export: Path, minutes: float, directory: Path) -> dict:
    """``deepspeech-transcribe --format srt`` of ``minutes`` of clips and silences: its peak RSS (``wait4``:
    the child is reaped here, not by Popen), wall time and cues."""
    import soundfile

    path = directory / "long.wav"
    clips = [soundfile.read(p, dtype="int16")[0] for p in sorted((ROOT / "data/sample/test").glob("*.flac"))]
    total, index, rng = int(minutes * 60 * 16000), 0, np.random.default_rng(0)
    with soundfile.SoundFile(path, "w", 16000, 1, "PCM_16") as out:  # written in pieces: bounded memory
        written = 0
        while written < total:
            silence = np.zeros(int(rng.uniform(0.5, 3) * 16000), np.int16)
            piece = np.concatenate([clips[index % len(clips)], silence])[: total - written]
            out.write(piece)
            written += len(piece)
            index += 1
    command = [
        sys.executable,
        "-m",
        "native_client",
        "--model",
        str(export),
        "--audio",
        str(path),
        "--format",
        "srt",
    ]
    output_path = directory / "long.srt"
    # A small launcher starts and reaps the client: a child forked from this process (TensorFlow loaded,
    # gigabytes) would report this process's peak RSS as its own.
    launcher = (
        "import os, subprocess, sys; p = subprocess.Popen(sys.argv[2:], stdout=open(sys.argv[1], 'w')); "
        "_, s, u = os.wait4(p.pid, 0); print(os.waitstatus_to_exitcode(s), u.ru_maxrss)"
    )
    started = time.perf_counter()
    with open(directory / "long.err", "w") as errors:
        result = subprocess.run(
            [sys.executable, "-c", launcher, str(output_path), *command],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    wall = time.perf_counter() - started
    code, max_rss_kib = (int(v) for v in result.stdout.split()[-2:])
    if code != 0:
        lines = (directory / "long.err").read_text().strip().splitlines()
        raise SystemExit(f"deepspeech-transcribe failed: {lines[-1] if lines else code}")
    return {
        "minutes": minutes,
        "cues": output_path.read_text().count(" --> "),
        "wall_s": round(wall, 1),
        "rtf": round(wall / (minutes * 60), 4),
        "peak_rss_mib": round(max_rss_kib / 1024, 1),
    }


def main(argv=None) -> int:
    """Export, profile, find the stream counts, transcribe the long file; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny durations: checks the script, not the machine"
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="length of one streams trial")
    parser.add_argument("--threads", type=int, default=1, help="the server's model threads (default 1)")
    parser.add_argument("--max-streams", type=int, default=256, help="the most streams tried")
    parser.add_argument("--long-minutes", type=float, default=60.0, help="length of the long-audio file")
    parser.add_argument(
        "--hostile-streams",
        type=int,
        default=16,
        help="well-behaved streams of the hostile part (default 16)",
    )
    parser.add_argument(
        "--hostile-nice",
        type=int,
        default=0,
        help="niceness of the hostile clients' process (default 0: they compete with the server for the "
        "CPU; 19: they take what it leaves idle, so a busy server also slows the attack)",
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        help="what to measure (default: all); e.g. --parts long_audio for the memory figure alone",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.max_streams, args.long_minutes, args.hostile_streams = 3.0, 2, 0.5, 2
    sys.path.insert(0, str(ROOT))
    from cpu_info import cpu_line  # bench/, the folder of the script
    from infer import export_untrained

    from data.fetch_models import missing_message, model_path

    print(cpu_line(), flush=True)
    anchor = model_path("armspeech")
    if "streams" in args.parts and not anchor.is_file():
        raise SystemExit(missing_message("armspeech"))
    figures: dict = {"quick": args.quick, "threads": args.threads, "latency_goal_ms": LATENCY_GOAL_MS}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        export = export_untrained(ROOT / "configs" / "en.yaml", tmp / "en_20ms", True, FEATURES_20MS)
        if "profile" in args.parts:
            batches = (1, 2, 4) if args.quick else (1, 2, 4, 8, 16, 32, 64)
            figures["profile"] = profile(export, args.threads, 5 if args.quick else 100, batches)
            print(f"profile: {json.dumps(figures['profile'])}", flush=True)
        if "streams" in args.parts:
            for name, model, max_batch in (
                ("batched", export, 64),
                ("batch1", export, 1),
                ("armspeech_batch1", anchor, 1),
            ):
                figures[name] = most_streams(model, max_batch, args.threads, args.seconds, args.max_streams)
                print(f"{name}: {figures[name]['streams']} streams", flush=True)
            figures["streams_ratio"] = round(
                figures["batched"]["streams"] / max(1, figures["batch1"]["streams"]), 2
            )
        if "hostile" in args.parts:
            figures["hostile"] = hostile(
                export, args.threads, args.seconds, args.hostile_streams, 4, args.hostile_nice
            )
            print(f"hostile: {json.dumps(figures['hostile'])}", flush=True)
        if "long_audio" in args.parts:
            figures["long_audio"] = long_audio(export, args.long_minutes, tmp)
            print(f"long audio: {json.dumps(figures['long_audio'])}", flush=True)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
