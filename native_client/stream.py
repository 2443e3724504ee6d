"""Streaming recognition: feed audio in chunks of any size, ask for a transcript at any time."""

from __future__ import annotations

import numpy as np

from native_client.frontends import normalize_frames
from native_client.runtime import StepRunner
from native_client.windows import ready_windows, window_view


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


def run_windows(runner: StepRunner, windows: np.ndarray, state):
    """Run ``windows`` ``[time, window, n_input]`` through the model ``n_steps`` at a time;
    a short last call is zero-padded and only its real time steps are kept."""
    n_steps = runner.metadata.n_steps
    outputs = []
    for start in range(0, len(windows), n_steps):
        # Only this call's windows are materialised: ``windows`` may be a view of the frames.
        chunk = np.ascontiguousarray(windows[start : start + n_steps])
        real = len(chunk)
        if real < n_steps:
            chunk = np.concatenate([chunk, np.zeros((n_steps - real,) + chunk.shape[1:], chunk.dtype)])
        logits, state = runner.step(chunk[None], state)
        outputs.append(logits[:real])
    empty = np.zeros((0, runner.metadata.n_classes), np.float32)
    return (np.concatenate(outputs) if outputs else empty), state


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
        context = self._n_context
        self._pending = np.concatenate([self._pending, frames])
        if final:
            self._pending = np.concatenate(
                [self._pending, np.zeros((context, self._pending.shape[1]), np.float32)]
            )
        ready = len(self._pending) - 2 * context
        if not final:
            ready -= ready % self.runner.metadata.n_steps
        if ready <= 0:
            return
        windows = ready_windows(self._pending, 2 * context + 1, ready)
        logits, self._state = run_windows(self.runner, np.ascontiguousarray(windows), self._state)
        self._logits.append(logits)
        self._pending = self._pending[ready:]

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
