"""deepspeech-serve with a language model (issue 43, S2): beam search runs in worker processes, so a wide
beam over long utterances leaves the event loop free (``/status`` answers at once meanwhile), a decode
for a connection that closed is dropped, and a killed worker fails its requests, not the server. Real
servers on 127.0.0.1 with a KenLM scorer, real clients."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from tornado.httpclient import AsyncHTTPClient

from tests.conftest import SAMPLE
from tests.test_serve import Server, untrained_export
from tests.test_serve_hostile import _long_wav

# /status while beam search runs, measured on a 2-core AVX2 EPYC shared with other work: decoded in the
# server's process, p95 0.96 s and max 1.0 s; in the decoding processes, p95 0.01-0.02 s and max 0.1-0.2 s
# (the highest while the three bodies are read, features and voice activity computed on the event loop).
MAX_STATUS_P95_S, MAX_STATUS_S = 0.1, 0.5


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A small untrained export (``tests.test_serve.untrained_export``)."""
    return untrained_export(tmp_path_factory.mktemp("scorer"), 64)


@pytest.fixture(scope="module")
def scorer(tmp_path_factory) -> Path:
    """A word bigram ARPA of the sample's LM corpus (KenLM reads it; its unigrams are the lexicon)."""
    from pipeline.lm.kneser_ney import estimate, write_arpa

    path = tmp_path_factory.mktemp("lm") / "lm.arpa"
    lines = (SAMPLE / "lm_corpus.txt").read_text().splitlines()[:3000]
    write_arpa(estimate([line.split() for line in lines if line.strip()], 2), path)
    return path


@pytest.fixture
def server(export, scorer):
    servers = []

    def start(*args: str) -> Server:
        servers.append(Server(export, *args, scorer=scorer))
        return servers[-1]

    yield start
    for running in servers:
        if running.process.poll() is None:
            running.stop()


async def _get(url: str) -> tuple[int, bytes]:
    response = await AsyncHTTPClient().fetch(url, raise_error=False)
    return response.code, response.body


async def _post(url: str, body: bytes) -> tuple[int, dict]:
    response = await AsyncHTTPClient().fetch(
        url, method="POST", body=body, request_timeout=600, raise_error=False
    )
    return response.code, json.loads(response.body)


async def _poll_status(running: Server, stop: asyncio.Event) -> list[float]:
    """Seconds each ``/status`` took, asked every 20 ms until ``stop``."""
    latencies = []
    while not stop.is_set():
        started = time.perf_counter()
        code, _ = await _get(running.http + "/status")
        latencies.append(time.perf_counter() - started)
        assert code == 200
        await asyncio.sleep(0.02)
    return latencies


def test_a_wide_beam_search_leaves_the_event_loop_free(server, tmp_path):
    """Three 30 s POST /stt decoded with beam 1024 and the scorer: flashlight's decode holds the GIL, so
    run in the server's process it stalled everything else (a /status took seconds); in the decode
    worker processes /status answers within MAX_STATUS_S throughout."""
    running = server("--beam-width", "1024", "--max-post-seconds", "60")
    body = _long_wav(tmp_path / "long.wav", 30).read_bytes()

    async def main():
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_status(running, stop))
        results = await asyncio.gather(*(_post(running.http + "/stt", body) for _ in range(3)))
        stop.set()
        metrics = (await _get(running.http + "/metrics"))[1].decode()
        return results, await poller, metrics

    results, latencies, metrics = asyncio.run(main())
    p95, worst = np.percentile(latencies, 95), max(latencies)
    print(f"/status while decoding: {len(latencies)} asked, p95 {p95:.3f} s, max {worst:.3f} s")
    assert all(code == 200 and posted["text"] for code, posted in results), results
    assert "beam+lm" in running.banner
    decodes = next(line for line in metrics.splitlines() if line.startswith("deepspeech_serve_decodes_total"))
    assert float(decodes.split()[1]) >= 3
    assert p95 < MAX_STATUS_P95_S and worst < MAX_STATUS_S, (
        f"/status took up to {worst:.3f} s (p95 {p95:.3f} s) during beam search"
    )


def _decoding_processes(server_pid: int) -> list[int]:
    """The server's decoding worker processes (spawned children; not multiprocessing's tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == server_pid and b"spawn_main" in command:
            found.append(int(entry.name))
    return found


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_killed_decoding_process_fails_its_request_not_the_server(server, tmp_path):
    """The decoding process is killed mid-decode: the request it was decoding gets a one-line 503, a
    new process takes over, and the next request is answered (the server neither hangs nor dies)."""
    running = server("--beam-width", "1024")
    body = _long_wav(tmp_path / "clip.wav", 25).read_bytes()

    async def main():
        deadline = time.monotonic() + 60
        while not (workers := _decoding_processes(running.process.pid)):
            assert time.monotonic() < deadline, "no decoding process started"
            await asyncio.sleep(0.1)
        (worker,) = workers
        await asyncio.sleep(2)  # its decoder built (the LM loaded)
        idle = _cpu_seconds(worker)
        post = asyncio.create_task(_post(running.http + "/stt", body))
        while _cpu_seconds(worker) < idle + 0.3:  # a beam search under way
            assert not post.done(), await post
            await asyncio.sleep(0.02)
        os.kill(worker, signal.SIGKILL)
        failed = await post
        return worker, failed, await _post(running.http + "/stt", body)

    worker, (code, failed), (later_code, later) = asyncio.run(main())
    assert code == 503 and failed == {"error": "a decoding process died while decoding this result"}
    assert later_code == 200 and later["text"], later
    assert running.process.poll() is None
    assert worker not in _decoding_processes(running.process.pid)
