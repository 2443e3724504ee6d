"""Hostile clients of ``deepspeech-serve``, for bench/serve.py's ``hostile`` part: each kind connects from
an address of its own on the loopback network (127.0.0.2 and up: Linux routes all of 127/8 to this
machine), speaks WebSocket by hand (so it can send what no library would), and starts again whenever the
server closes it, until the deadline.

- ``slot_hog``: holds a connection sending two bytes of silence every second.
- ``fragment_flood``: one-byte continuation frames as fast as the socket takes them.
- ``non_reader``: audio at eight times real time, never reading a reply.
- ``huge_frames``: 1 MiB frames at 4000 Hz (131 s of audio each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time

import numpy as np

KINDS = ("slot_hog", "fragment_flood", "non_reader", "huge_frames")
_MASK = b"\x11\x22\x33\x44"


def frame(opcode: int, payload: bytes, final: bool = True) -> bytes:
    """One masked client frame (RFC 6455) of any length."""
    head = bytes([(0x80 if final else 0) | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
    mask = np.frombuffer(_MASK * (size // 4 + 1), np.uint8)[:size]
    return head + _MASK + (np.frombuffer(payload, np.uint8) ^ mask).tobytes()


async def _connect(port: int, address: str):
    """A WebSocket opened by hand from ``address``: (reader, writer), or None when refused."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
        writer.write(
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await writer.drain()
        if not (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 101"):
            writer.close()
            return None
        while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b""):
            pass
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return None
    return reader, writer


async def _drain_replies(reader: asyncio.StreamReader) -> None:
    """Read and drop whatever the server sends, until it closes (or resets the connection)."""
    try:
        while await reader.read(65536):
            pass
    except OSError:
        pass


async def _session(kind: str, reader, writer, deadline: float, sent: dict) -> None:
    """One connection of a hostile client, until the server closes it or the deadline; ``sent[kind]``
    counts the frames' bytes it wrote (what the attack amounted to)."""
    silence = b"\x00\x00"
    noise = np.random.default_rng(0).integers(-3000, 3000, 5120, dtype=np.int16).tobytes()  # 0.32 s
    if kind != "fragment_flood":
        rate = 4000 if kind == "huge_frames" else 16000
        writer.write(frame(0x1, json.dumps({"config": {"sample_rate": rate}}).encode()))
    if kind != "non_reader":
        asyncio.ensure_future(_drain_replies(reader))
    started = True
    while time.monotonic() < deadline and not writer.is_closing() and not reader.at_eof():
        pause = 0.0
        if kind == "slot_hog":
            data, pause = frame(0x2, silence), 1.0
        elif kind == "fragment_flood":  # as fast as the socket takes them, without starving this process
            data = frame(0x2, b"\x00", final=False) if started else frame(0x0, b"\x00", final=False)
            started = False
        elif kind == "non_reader":
            data, pause = frame(0x2, noise), 0.04
        else:
            data = frame(0x2, bytes(1 << 20))
        writer.write(data)
        await asyncio.wait_for(writer.drain(), max(0.1, deadline - time.monotonic()))
        sent[kind] = sent.get(kind, 0) + len(data)
        await asyncio.sleep(pause)


async def hostile_client(
    kind: str, port: int, address: str, deadline: float, counts: dict, sent: dict
) -> None:
    """Run one hostile client of ``kind`` from ``address`` until ``deadline``, reconnecting whenever it is
    closed or refused; ``counts[kind]`` counts its connections, ``sent[kind]`` the bytes of its frames."""
    while time.monotonic() < deadline:
        opened = await _connect(port, address)
        counts[kind] = counts.get(kind, 0) + 1
        if opened is None:
            await asyncio.sleep(0.1)
            continue
        reader, writer = opened
        try:
            await _session(kind, reader, writer, deadline, sent)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
        await asyncio.sleep(0.05)


async def _run_all(port: int, seconds: float, per_kind: int, kinds: tuple[str, ...]) -> tuple[dict, dict]:
    deadline = time.monotonic() + seconds
    counts: dict = {}
    sent: dict = {}
    clients = [
        hostile_client(kind, port, f"127.0.0.{2 + KINDS.index(kind)}", deadline, counts, sent)
        for kind in kinds
        for _ in range(per_kind)
    ]
    await asyncio.gather(*clients)
    return counts, sent


def main(argv=None) -> int:
    """Run ``--per-kind`` clients of each of ``--kinds`` (default: every kind) against the server on
    ``--port`` for ``--seconds``; print, as JSON, how many connections each kind opened, the MiB of frames
    each sent and the CPU seconds this process used (on a machine the server shares, taken from it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--per-kind", type=int, default=4)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    args = parser.parse_args(argv)
    counts, sent = asyncio.run(_run_all(args.port, args.seconds, args.per_kind, tuple(args.kinds)))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report = {
        "connections": counts,
        "sent_mib": {kind: round(size / (1 << 20), 2) for kind, size in sent.items()},
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
