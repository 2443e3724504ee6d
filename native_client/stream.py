"""Streaming recognition: feed audio in chunks of any size, ask for a transcript at any time.

``Utterance`` is the one definition of how an utterance's audio becomes model calls (features block by
block, context windows, ``n_steps`` windows per call, the last call zero-padded); it does not run the
model but hands out its ready chunks and takes their logits back. ``Stream`` runs them at once on one
runner (the client); the server's scheduler (``native_client.server.engine``) puts the chunks of many
utterances into one call. So the two are equal chunk for chunk, by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from native_client.frontends import normalize_frames
from native_client.runtime import StepRunner
from native_client.windows import ready_windows, window_view


@dataclass
class Chunk:
    """``n_steps`` windows ``[n_steps, window, n_input]`` of one utterance, ``real`` of them not padding."""

    windows: np.ndarray
    real: int


class Chunks(Sequence):
    """``windows`` ``[time, window, n_input]`` cut into ``n_steps`` chunks, the last one zero-padded. A
    chunk is materialised when it is asked for: ``windows`` may be a view of the frames (19x smaller)."""

    def __init__(self, windows: np.ndarray, n_steps: int):
        self.windows = windows
        self.n_steps = n_steps

    def __len__(self) -> int:
        return -(-len(self.windows) // self.n_steps)

    def __getitem__(self, index):
        if isinstance(index, slice):
            raise TypeError("Chunks takes one index at a time")
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(index)
        start = index * self.n_steps
        part = np.ascontiguousarray(self.windows[start : start + self.n_steps], dtype=np.float32)
        real = len(part)
        if real < self.n_steps:
            part = np.concatenate([part, np.zeros((self.n_steps - real,) + part.shape[1:], np.float32)])
        return Chunk(part, real)


def run_window_chunks(runner: StepRunner, chunks: Sequence[Chunk], state):
    """Logits ``[time, n_classes]`` of ``chunks`` run in order from ``state`` (padding steps dropped), and
    the state after them."""
    outputs = []
    for chunk in chunks:
        logits, state = runner.step(chunk.windows[None], state)
        outputs.append(logits[: chunk.real])
    empty = np.zeros((0, runner.metadata.n_classes), np.float32)
    return (np.concatenate(outputs) if outputs else empty), state


def run_windows(runner: StepRunner, windows: np.ndarray, state):
    """Run ``windows`` ``[time, window, n_input]`` through the model ``n_steps`` at a time;
    a short last call is zero-padded and only its real time steps are kept."""
    return run_window_chunks(runner, Chunks(windows, runner.metadata.n_steps), state)


def run_frames(runner: StepRunner, frames: np.ndarray, state=None):
    """Logits ``[time, n_classes]`` of feature ``frames`` ``[time, n_input]`` for a whole utterance, and the
    final state: the export's streaming form call by call (context windows with zero context past both
    edges, or chunks of frames; the last call zero-padded), or, for a model without one, its one-shot
    ``utterance``."""
    streaming = runner.metadata.streaming
    if streaming is None:
        return runner.utterance(frames), ()
    state = state or runner.zero_state()
    if streaming["input"] == "frames":
        return run_chunks(runner, frames, state)
    return run_windows(runner, window_view(frames, runner.metadata.n_context), state)


def run_chunks(runner: StepRunner, frames: np.ndarray, state, end: int | None = None):
    """Run ``frames`` ``[time, n_input]`` through a streaming form that takes chunks of frames: each call
    ``chunk + lookahead`` frames from where the last one started plus ``chunk``, zero frames past the
    utterance's end; of a short last chunk only its real frames' labels are kept. ``end`` (a multiple of
    the chunk): run the chunks before it only, their look-ahead read from ``frames`` (a stream's middle)."""
    metadata = runner.metadata
    chunk, lookahead = metadata.streaming["chunk"], metadata.streaming["lookahead"]
    room = -len(frames) % chunk + lookahead
    padded = np.concatenate([frames, np.zeros((room, metadata.n_input), np.float32)]).astype(np.float32)
    outputs = []
    for start in range(0, len(frames) if end is None else end, chunk):
        logits, state = runner.step(
            np.ascontiguousarray(padded[start : start + chunk + lookahead])[None], state
        )
        outputs.append(logits[: metadata.output_length(min(chunk, len(frames) - start))])
    empty = np.zeros((0, metadata.n_classes), np.float32)
    return (np.concatenate(outputs) if outputs else empty), state


def take_ready_windows(pending: np.ndarray, frames: np.ndarray, context: int, n_steps: int, final: bool):
    """``frames`` added to the frames still ``pending`` (at the end, with the zero context after the
    utterance): the context windows ready to run (a whole number of ``n_steps`` calls unless ``final``),
    or None, and the frames still pending. One rule for the client's ``Stream`` and the server's
    ``Utterance``."""
    pending = np.concatenate([pending, frames])
    if final:
        pending = np.concatenate([pending, np.zeros((context, pending.shape[1]), np.float32)])
    ready = len(pending) - 2 * context
    if not final:
        ready -= ready % n_steps
    if ready <= 0:
        return None, pending
    return ready_windows(pending, 2 * context + 1, ready), pending[ready:]


class Utterance:
    """One utterance's audio turned into model chunks; the caller runs them and hands back the logits.

    ``feed_audio`` int16 samples, take the ``ready()`` chunks, run them in order from ``state`` and call
    ``accept`` with their logits and the new state. ``finish`` makes the rest ready (zero-padded).
    Exports with per-utterance normalisation need the whole utterance's statistics: nothing is ready before
    ``finish`` (``rerun`` gives the chunks of the audio so far, for a partial result from a zero state).
    """

    def __init__(self, runner: StepRunner):
        metadata = runner.metadata
        self.n_steps = metadata.n_steps
        self.n_classes = metadata.n_classes
        self._context = metadata.n_context
        self._normalize = metadata.features.normalize
        self._frames = metadata.features.frontend.stream()
        # frames still needed as context, starting with the zero frames before the utterance
        self._pending = np.zeros((self._context, metadata.n_input), np.float32)
        self._all_frames: list[np.ndarray] = []
        self._ready: list[np.ndarray] = []  # windows ready to run, each block a whole number of chunks
        self._logits: list[np.ndarray] = []
        self.state = runner.zero_state()
        self.samples = 0
        self.finished = False

    def feed_audio(self, samples: np.ndarray) -> None:
        """Add int16 mono samples at the model's rate."""
        if self.finished:
            raise RuntimeError("feed_audio after finish")
        samples = np.asarray(samples).reshape(-1)
        self.samples += samples.size
        self._add_frames(self._frames.feed(samples), final=False)

    def finish(self) -> None:
        """End of the utterance: the last frames, zero context after them, the last chunk padded."""
        if self.finished:
            raise RuntimeError("the utterance is already finished")
        self._add_frames(self._frames.finish(), final=True)
        self.finished = True

    def _add_frames(self, frames: np.ndarray, final: bool) -> None:
        if self._normalize:
            self._all_frames.append(frames)
            if final:
                self._ready.append(self._rerun_windows())
            return
        windows, self._pending = take_ready_windows(self._pending, frames, self._context, self.n_steps, final)
        if windows is not None:
            self._ready.append(windows)

    @property
    def incremental(self) -> bool:
        """Whether chunks are ready as audio arrives (no per-utterance normalisation)."""
        return not self._normalize

    def _rerun_windows(self) -> np.ndarray:
        frames = [f for f in self._all_frames if len(f)]
        if not frames:
            return np.zeros((0, 2 * self._context + 1, self._pending.shape[1]), np.float32)
        return window_view(normalize_frames(np.concatenate(frames)), self._context)

    def rerun(self) -> Chunks:
        """All chunks of the audio so far, normalised with its statistics so far, to run from a zero
        state (exports with normalisation: a partial transcript)."""
        return Chunks(self._rerun_windows(), self.n_steps)

    def ready(self) -> Chunks:
        """The chunks ready to run, in order (handed out once)."""
        ready, self._ready = self._ready, []
        if not ready:
            windows = np.zeros((0, 2 * self._context + 1, self._pending.shape[1]), np.float32)
        else:  # every block but the last is a whole number of chunks: the cuts are the same
            windows = ready[0] if len(ready) == 1 else np.concatenate(ready)
        return Chunks(windows, self.n_steps)

    def accept(self, logits: np.ndarray, state: tuple) -> None:
        """The logits ``[time, n_classes]`` (padding steps dropped) and the state after the chunks handed
        out by ``ready``."""
        self._logits.append(np.asarray(logits))
        self.state = state

    def logits(self) -> np.ndarray:
        """Logits ``[time, n_classes]`` of the chunks run so far."""
        if not self._logits:
            return np.zeros((0, self.n_classes), np.float32)
        if len(self._logits) > 1:  # keep one array: a long utterance is many chunks
            self._logits = [np.concatenate(self._logits)]
        return self._logits[0]


class Stream:
    """One utterance being recognised. ``feed_audio`` int16 chunks, ``intermediate_decode`` any time,
    ``finish`` once.

    Without per-utterance normalisation the model runs as audio arrives, ``n_steps`` time
    steps at a time, carrying the recurrent state. With it (``features.normalize`` in the export),
    features need the whole utterance's statistics: the stream keeps the frames and runs the
    model when a transcript is asked for, normalising with the statistics so far; ``finish``
    then equals one-shot transcription exactly. A model without a streaming form (``streaming``
    null in its metadata) is run the same way, over the whole utterance at once (``Model`` makes such a
    stream only for a caller that asks for the transcript at the end).
    """

    def __init__(self, runner: StepRunner, decoder, intermediate_decoder=None):
        self.runner = runner
        self.decoder = decoder
        self.intermediate_decoder = intermediate_decoder or decoder
        metadata = runner.metadata
        self._whole = metadata.features.normalize or metadata.streaming is None
        self._normalize = metadata.features.normalize
        self._chunked = metadata.streaming is not None and metadata.streaming["input"] == "frames"
        self._frames = metadata.features.frontend.stream()
        self._n_context = metadata.n_context
        # frames still needed as context, starting with the zero frames before the utterance (windows), or
        # the frames of the next call (chunks of frames)
        self._pending = np.zeros((0 if self._chunked else metadata.n_context, metadata.n_input), np.float32)
        self._all_frames = []
        self._logits = []
        self._state = runner.zero_state()
        self._finished = False
        self.samples = 0

    def feed_audio(self, chunk: np.ndarray) -> None:
        """Add int16 mono samples at the model's sample rate."""
        if self._finished:
            raise RuntimeError("feed_audio after finish")
        chunk = np.asarray(chunk).reshape(-1)
        self.samples += chunk.size
        self._add_frames(self._frames.feed(chunk), final=False)

    def _add_frames(self, frames: np.ndarray, final: bool) -> None:
        if self._whole:
            self._all_frames.append(frames)
            return
        if self._chunked:
            self._add_chunks(frames, final)
            return
        n_steps = self.runner.metadata.n_steps
        windows, self._pending = take_ready_windows(self._pending, frames, self._n_context, n_steps, final)
        if windows is None:
            return
        logits, self._state = run_windows(self.runner, np.ascontiguousarray(windows), self._state)
        self._logits.append(logits)

    def _add_chunks(self, frames: np.ndarray, final: bool) -> None:
        """Frames for a streaming form over chunks of frames: each full chunk with its look-ahead runs as
        soon as it is there; at the end, the rest (``run_chunks``)."""
        self._pending = np.concatenate([self._pending, frames])
        streaming = self.runner.metadata.streaming
        chunk, lookahead = streaming["chunk"], streaming["lookahead"]
        ready = 0 if final else max(0, (len(self._pending) - lookahead) // chunk * chunk)
        if final:
            logits, self._state = run_chunks(self.runner, self._pending, self._state)
            self._pending = self._pending[:0]
        elif ready:  # the frames of ``ready // chunk`` calls, each with its look-ahead, all present
            logits, self._state = run_chunks(self.runner, self._pending, self._state, end=ready)
            self._pending = self._pending[ready:]
        else:
            return
        self._logits.append(logits)

    def _normalised_logits(self) -> np.ndarray:
        frames = (
            np.concatenate(self._all_frames)
            if self._all_frames
            else np.zeros((0, self.runner.metadata.n_input), np.float32)
        )
        if len(frames) == 0:
            return np.zeros((0, self.runner.metadata.n_classes), np.float32)
        logits, _ = run_frames(self.runner, normalize_frames(frames) if self._normalize else frames)
        return logits

    def logits(self) -> np.ndarray:
        """Logits ``[time, n_classes]`` of the audio so far."""
        if self._whole:
            return self._normalised_logits()
        return (
            np.concatenate(self._logits)
            if self._logits
            else np.zeros((0, self.runner.metadata.n_classes), np.float32)
        )

    def intermediate_decode(self) -> str:
        """Transcript of the audio so far (the intermediate decoder; greedy unless configured)."""
        return self.intermediate_decoder.decode(self.logits())

    def flush(self) -> np.ndarray:
        """End the utterance: run the last (zero-padded) frames; returns the logits of the whole of it."""
        if self._finished:
            raise RuntimeError("the stream is already finished")
        self._add_frames(self._frames.finish(), final=True)
        self._finished = True
        return self.logits()

    def finish(self) -> str:
        """Flush the last (zero-padded) frames and return the final transcript."""
        return self.decoder.decode(self.flush())
