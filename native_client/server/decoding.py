"""Where the server decodes results: beam search in worker processes, greedy decoding on a thread.

flashlight's beam search holds the GIL for the whole decode, so run on a thread of the server's process
it stalls the event loop (``/status`` took seconds while a wide beam decoded a long utterance). With a
language model, results are decoded in ``ProcessDecoding``'s spawned worker processes instead: each
builds the decoder once from the ``DecoderSpec`` the server's own was built from (its LM, lexicon, beam
width, weights, hot words), and receives logits as numpy arrays and sends back ``Candidate`` lists.
Greedy decoding (no LM) is cheap and stays on a thread (``ThreadDecoding``); so do a transducer's
searches, which call its export's networks (one thread: the streams' final searches wait for each other).

This module imports no TensorFlow, Tornado or model runtime: it is what a spawned worker imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import multiprocessing
import signal
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor

import numpy as np

from native_client.decoders import Decoder, DecoderSpec, decoder_class
from native_client.transcripts import Candidate

log = logging.getLogger(__name__)

_worker: dict = {}  # in a worker process only: its decoder, or the error building it raised


def _start_worker(spec: DecoderSpec, allowed: tuple[str, ...]) -> None:
    """A worker's initializer: build its decoder once. A failure is kept and raised by every task, so
    the request sees the error instead of a pool that breaks and is rebuilt for ever."""
    # Ctrl-C (and a service manager's SIGTERM) reaches the whole process group: the server drains and
    # stops its workers itself; and a server that dies (SIGKILL, a second signal's os._exit) takes them
    # along, instead of leaving them blocked on their queue with the LM loaded.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    try:
        _worker["decoder"] = decoder_class(spec.type, "decoder.type", allowed).from_spec(spec)
    except Exception as error:
        _worker["error"] = error


def _die_with_parent() -> None:
    """Linux: ask for SIGKILL when the parent process dies (``prctl(PR_SET_PDEATHSIG)``); elsewhere
    nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _worker_candidates(logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
    """In a worker: the candidates of ``logits`` by the worker's decoder."""
    if "error" in _worker:
        raise _worker["error"]
    return _worker["decoder"].candidates(logits, count, seconds_per_frame)


def _worker_ready() -> None:
    """In a worker: nothing, once its decoder is built (or raise its error)."""
    if "error" in _worker:
        raise _worker["error"]


class ThreadDecoding:
    """Decodes with ``decoder`` on one thread of this process: for decoders that hold the GIL briefly."""

    def __init__(self, decoder: Decoder):
        self.decoder = decoder
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="decode")

    def start(self) -> None:
        """Nothing to start."""

    async def candidates(self, logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
        """The decoder's candidates; one not started yet is dropped when the caller is cancelled."""
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, self.decoder.candidates, logits, count, seconds_per_frame
        )

    async def stop(self) -> None:
        """Stop the thread, waiting for a decode under way without blocking the event loop."""
        shutdown = functools.partial(self._thread.shutdown, wait=True, cancel_futures=True)
        await asyncio.get_running_loop().run_in_executor(None, shutdown)


class ProcessDecoding:
    """Decodes in ``workers`` spawned processes, each with the decoder ``spec`` describes (``allowed``: the
    plug-in modules it may import, the server's ``--allow-plugin``).

    A decode is handed to a process only when one is free, so one whose caller is cancelled before
    then (its connection closed) is never started. A worker that dies (killed, out of memory) fails
    the decodes under way with a RuntimeError, and the pool is replaced by a new one (its workers load
    the LM again) for the next."""

    def __init__(self, spec: DecoderSpec, allowed: tuple[str, ...] = (), workers: int = 1):
        self.spec = spec
        self.allowed = tuple(allowed)
        self.workers = max(1, int(workers))
        self._pool: ProcessPoolExecutor | None = None
        self._free: asyncio.Semaphore | None = None
        self.restarts = 0

    def _new_pool(self) -> ProcessPoolExecutor:
        # spawn: the server has threads (the model's, Tornado's resolver), and forking after threads is
        # unsafe; a spawned worker imports this module and the decoder only.
        pool = ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(self.spec, self.allowed),
        )
        for _ in range(self.workers):  # load the LM now rather than on the first result
            pool.submit(_worker_ready).add_done_callback(self._warmed)
        return pool

    @staticmethod
    def _warmed(future: Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            error = future.exception()
            if not isinstance(error, BrokenProcessPool):  # a dead worker is reported by its requests
                log.error("a decoding process cannot build its decoder: %s", error)

    def start(self) -> None:
        """Start the worker processes (they load the decoder in the background)."""
        self._free = asyncio.Semaphore(self.workers)
        self._pool = self._new_pool()

    async def candidates(self, logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
        """The candidates of ``logits`` from a worker process. RuntimeError when the worker died."""
        loop = asyncio.get_running_loop()
        await self._free.acquire()  # cancelled here: never submitted
        try:
            pool, future = self._submit(np.ascontiguousarray(logits), count, seconds_per_frame)
        except BaseException:
            self._free.release()
            raise
        # The process stays taken until its decode ends, even when the caller stops waiting for it.
        future.add_done_callback(lambda _: _call_soon(loop, self._free.release))
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:
            self._replace(pool)
            raise RuntimeError("a decoding process died while decoding this result") from None

    def _submit(self, *args) -> tuple[ProcessPoolExecutor, Future]:
        """(the pool, the future of ``_worker_candidates(*args)`` in it); a pool found broken (a worker
        died while idle) is replaced and the decode given to the new one."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("the decoding processes are stopped (the server is shutting down)")
        try:
            return pool, pool.submit(_worker_candidates, *args)
        except BrokenProcessPool:
            self._replace(pool)
        try:
            return self._pool, self._pool.submit(_worker_candidates, *args)
        except BrokenProcessPool:
            raise RuntimeError("the decoding processes cannot start") from None

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """A new pool for ``broken`` (once, however many requests saw it break)."""
        if self._pool is not broken:
            return
        log.error("a decoding process died: starting new ones")
        self.restarts += 1
        broken.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()

    async def stop(self) -> None:
        """Stop the worker processes, waiting for decodes under way without blocking the event loop."""
        pool, self._pool = self._pool, None
        if pool is not None:
            shutdown = functools.partial(pool.shutdown, wait=True, cancel_futures=True)
            await asyncio.get_running_loop().run_in_executor(None, shutdown)


def _call_soon(loop: asyncio.AbstractEventLoop, callback) -> None:
    """``callback`` on ``loop`` from any thread; nothing once the loop is closed (the server stopped)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass
