"""The scheduler that batches streams: every model call advances each stream that has a chunk ready.

Connections hand their ready chunks to ``BatchEngine.run`` and await the logits. One loop takes, in
turn, the next chunk of every waiting job (up to ``max_batch``), stacks them and makes one model call on
a thread of its own, so the event loop keeps reading and answering sockets meanwhile; jobs that arrive
during a call join the next one. A job with many chunks (a whole utterance rerun, a posted file)
advances one chunk per call like any other, so it never holds the others up for longer than a call.

Real time first: each job says when its audio is due (``RealTimeClock``: a stream's audio is due when
the audio before it has played), and a job due more than ``AHEAD_SLACK_S`` from now (its client sends
faster than real time, or a long posted file's later parts) joins a call only when no job is due: it
fills the time the model would otherwise idle, so that a stream speaking in real time waits at most for
the call under way (one job ahead at a time when the model has no batched form).
Results are decoded (``candidates``) outside the scheduling loop, by the ``decoding`` it is given
(``native_client.server.decoding``): beam search with a language model in worker processes, since
flashlight's search holds the GIL and on a thread of this process would stall the event loop and the
model calls alike; greedy decoding (no LM, cheap) on a thread. A decode whose caller is cancelled
before it starts is dropped; a decoding process that dies fails the results it was decoding, and new
processes take over.

A failed model call fails the jobs of its batch, not the server. Should the scheduling loop itself end
for any other reason, the failure is logged, every waiting job (and every later one) gets an error, and
``ready`` turns false, which ``/ready`` and ``/status`` report: never a server that answers its status
while its streams wait for ever.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from native_client.batching import BatchRunner
from native_client.server.decoding import ProcessDecoding, ThreadDecoding
from native_client.stream import Chunk
from native_client.transcripts import Candidate

log = logging.getLogger(__name__)

# How far ahead of now a chunk may be due and still count as real-time work: covers clients that send
# a second of audio at a time and the jitter of their sending.
AHEAD_SLACK_S = 1.0


class RealTimeClock:
    """When a stream's audio is due if it plays in real time: each piece is due once the audio before it
    has played, or now if that moment is past (a client that paused banks no time)."""

    def __init__(self):
        self._next = 0.0

    def advance(self, seconds: float) -> float:
        """The moment the next ``seconds`` of audio are due; the clock moves past them."""
        due = max(self._next, time.monotonic())
        self._next = due + seconds
        return due


@dataclass(eq=False)
class _Job:
    chunks: Sequence[Chunk]
    state: tuple
    future: asyncio.Future
    due: float  # when the job's audio is due (``time.monotonic``)
    done: int = 0
    logits: list = field(default_factory=list)


@dataclass
class EngineStats:
    """Counters since start: model calls and chunks run (their ratio is the mean batch)."""

    calls: int = 0
    chunks: int = 0
    largest_batch: int = 0
    decodes: int = 0
    decode_seconds: float = 0.0


class BatchEngine:
    """Runs the chunks of many streams through one ``BatchRunner`` and decodes their results with
    ``decoding`` (see the module docstring)."""

    def __init__(self, runner: BatchRunner, decoding: ProcessDecoding | ThreadDecoding, max_batch: int = 64):
        self.runner = runner
        self.decoding = decoding
        self.max_batch = max(1, int(max_batch))
        self.stats = EngineStats()
        self._jobs: deque[_Job] = deque()
        self._batch: list[_Job] = []  # the jobs taken from the queue for the call under way
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.failure: BaseException | None = None

    def start(self) -> None:
        """Start the loop on the running event loop, and the decoding."""
        self.decoding.start()
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        self._task.add_done_callback(self._ended)

    @property
    def ready(self) -> bool:
        """Whether the loop runs and takes jobs."""
        return self._task is not None and not self._task.done() and self.failure is None

    @property
    def queued(self) -> int:
        """Jobs waiting for a model call."""
        return len(self._jobs)

    async def stop(self) -> None:
        """Stop the loop, the model thread and the decoding, waiting for a call or decode under way without
        blocking the event loop."""
        if self._task is not None:
            self._task.cancel()
        shutdown = functools.partial(self._model_thread.shutdown, wait=True, cancel_futures=True)
        await asyncio.get_running_loop().run_in_executor(None, shutdown)
        await self.decoding.stop()

    def _ended(self, task: asyncio.Task) -> None:
        """The loop's task ended: a failure is logged and given to every waiting job."""
        if task.cancelled():
            error: BaseException = RuntimeError("the server is shutting down")
        else:
            error = task.exception() or RuntimeError("the engine's loop returned")
            log.error("the engine stopped: %s", error, exc_info=error)
        self.failure = error
        waiting, self._batch = [*self._batch, *self._jobs], []
        self._jobs.clear()
        for job in waiting:
            if not job.future.done():
                job.future.set_exception(RuntimeError(f"the server's engine stopped: {error}"))

    async def run(
        self, chunks: Sequence[Chunk], state: tuple, due: float | None = None
    ) -> tuple[np.ndarray, tuple]:
        """Logits ``[time, n_classes]`` of ``chunks`` (padding steps dropped) run in order from
        ``state``, and the state after them. ``due``: when their audio is due (``RealTimeClock``; default
        now). Cancelling the caller drops the job's remaining chunks. RuntimeError when the engine has
        stopped."""
        if not chunks:
            return np.zeros((0, self.runner.metadata.output_width), np.float32), state
        if not self.ready:
            raise RuntimeError(f"the server's engine stopped: {self.failure or 'not started'}")
        due = time.monotonic() if due is None else due
        job = _Job(chunks, state, asyncio.get_running_loop().create_future(), due)
        self._jobs.append(job)
        self._wakeup.set()
        try:
            return await job.future
        finally:
            if not job.future.done():
                job.future.cancel()

    async def candidates(self, logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
        """Up to ``count`` candidate transcripts of ``logits``, decoded off the event loop (one not started
        yet is dropped when the caller is cancelled). RuntimeError when a decoding process died."""
        started = time.perf_counter()
        try:
            return await self.decoding.candidates(logits, count, seconds_per_frame)
        finally:
            self.stats.decodes += 1
            self.stats.decode_seconds += time.perf_counter() - started

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._jobs:
                batch = self._batch = self._next_batch()
                if not batch:
                    continue
                try:
                    inputs = np.stack([job.chunks[job.done].inputs for job in batch])
                    states = [job.state for job in batch]
                    logits, new_states = await loop.run_in_executor(
                        self._model_thread, self.runner.step, inputs, states
                    )
                    if len(logits) != len(batch) or len(new_states) != len(batch):
                        raise ValueError(f"{len(logits)} outputs for a batch of {len(batch)}")
                except Exception as error:  # a model failure fails these jobs, not the server
                    log.exception("model call failed")
                    for job in batch:
                        if not job.future.done():
                            job.future.set_exception(RuntimeError(f"model call failed: {error}"))
                    continue
                self.stats.calls += 1
                self.stats.chunks += len(batch)
                self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
                for job, out, state in zip(batch, logits, new_states, strict=True):
                    job.logits.append(out[: job.chunks[job.done].real])
                    job.state = state
                    job.done += 1
                    if job.done == len(job.chunks):
                        if not job.future.done():
                            job.future.set_result((np.concatenate(job.logits), job.state))
                    elif not job.future.done():
                        self._jobs.append(job)
                self._batch = []

    def _next_batch(self) -> list[_Job]:
        """Up to ``max_batch`` live jobs, the earliest due first; jobs due more than ``AHEAD_SLACK_S`` from
        now only when none is due sooner, and then one only if the model has no batched form (each job is
        re-queued after its chunk)."""
        live = sorted((job for job in self._jobs if not job.future.done()), key=lambda job: job.due)
        horizon = time.monotonic() + AHEAD_SLACK_S
        due_now = sum(1 for job in live if job.due <= horizon)  # a prefix of ``live``
        ahead = len(live) if self.runner.batched else 1
        batch = live[: min(due_now or ahead, self.max_batch)]
        self._jobs = deque(live[len(batch) :])
        return batch
