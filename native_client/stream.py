"""Streaming recognition: feed audio in chunks of any size, ask for a transcript at any time.

``Utterance`` is the one engine: the one definition of how an utterance's audio becomes model calls
(features block by block, then context windows, ``n_steps`` windows per call, or chunks of frames with
their look-back and look-ahead frames; the last call zero-padded; exports with per-utterance normalisation
rerun from the start, models without a streaming form run once over the whole). It does not run the model:
it hands out its ready chunks and takes their logits back. Its drivers only run chunks:

- ``run_ready`` runs them in order on one runner (the client's ``Stream``, ``Model``'s one-shot and
  ``--vad`` paths);
- the server's scheduler (``native_client.server.engine``) puts the ready chunks of many utterances into
  one batched call.

Voice activity (utterances cut at pauses) is ``native_client.utterances``, over this same engine.

A decoder that calls parts of the model between encoder chunks (a transducer's predictor and joiner)
needs no engine of its own: the encoder's output comes out chunk by chunk, ``Utterance.accept`` taking
each run's logits, and ``Utterance.take_logits`` hands out the ones accepted since its last call (an
utterance made with ``keep_new``). Such a decoder consumes them after each ``run_ready`` (or each
``await`` of the server's engine) and runs its own networks on them; the encoder's calls, batching and
state stay here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from native_client.frontends import normalize_frames
from native_client.metadata import StreamSpec
from native_client.runtime import StepRunner
from native_client.transducer_decoder import TransducerDecoder
from native_client.windows import ready_windows, window_view


@dataclass
class Chunk:
    """One streaming call's input: ``n_steps`` windows ``[n_steps, window, n_input]``, or frames ``[lookback
    + chunk + lookahead, n_input]``; of its labels, the first ``real`` are not padding. ``whole``: the
    frames ``[time, n_input]`` of a whole utterance for a model without a streaming form (its one-shot
    ``utterance`` signature; never batched, the server refuses such models)."""

    inputs: np.ndarray
    real: int
    whole: bool = False


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


class FrameChunks(Sequence):
    """``count`` calls of a streaming form over chunks of frames: ``frames`` holds the ``lookback`` frames
    before the first chunk, the chunks' frames (``real`` of them real, the rest zero) and the ``lookahead``
    frames after the last; call ``i`` takes ``frames[i * chunk : i * chunk + lookback + chunk +
    lookahead]``. A call is cut when it is asked for."""

    def __init__(self, frames: np.ndarray, streaming: StreamSpec, stride: int, count: int, real: int):
        self.frames = frames
        self.chunk, self.stride, self.count, self.real = streaming.chunk, stride, count, real
        self.width = streaming.width

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            raise TypeError("FrameChunks takes one index at a time")
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(index)
        start = index * self.chunk
        frames = np.ascontiguousarray(self.frames[start : start + self.width], dtype=np.float32)
        return Chunk(frames, -(-min(self.chunk, self.real - start) // self.stride))


class ChunkList(Sequence):
    """Several sequences of chunks, one after the other, as one."""

    def __init__(self, parts: list[Sequence[Chunk]]):
        self.parts = [part for part in parts if len(part)]
        self.ends = np.cumsum([len(part) for part in self.parts]).tolist()

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, index):
        if isinstance(index, slice):
            raise TypeError("ChunkList takes one index at a time")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        part = int(np.searchsorted(self.ends, index, side="right"))
        return self.parts[part][index - (self.ends[part - 1] if part else 0)]


def first_frames(metadata) -> np.ndarray:
    """What an utterance starts with before its first frame: the zero frames of the look-back (chunks of
    frames) or of the context before it (context windows)."""
    streaming = metadata.streaming
    if streaming is not None and streaming.frames:
        return np.zeros((streaming.lookback, metadata.n_input), np.float32)
    return np.zeros((metadata.n_context, metadata.n_input), np.float32)


def take_ready_frames(pending: np.ndarray, frames: np.ndarray, metadata, final: bool):
    """``frames`` added to the frames still ``pending`` (the first ones the chunk's look-back): the calls
    of a streaming form over chunks of frames that can run (each with its look-ahead; at the end, the
    rest, zero-padded), or None, and the frames still pending. One rule for the client's ``Stream`` and
    the server's ``Utterance``."""
    streaming = metadata.streaming
    chunk, lookback, lookahead = streaming.chunk, streaming.lookback, streaming.lookahead
    pending = np.concatenate([pending, frames]).astype(np.float32, copy=False)
    todo = len(pending) - lookback  # frames whose labels are not out yet
    if final:
        count = -(-todo // chunk)
        room = count * chunk + lookahead - todo
        padded = np.concatenate([pending, np.zeros((room, pending.shape[1]), np.float32)])
        return (FrameChunks(padded, streaming, metadata.stride, count, todo) if count else None), pending[:0]
    count = max(0, (todo - lookahead) // chunk)
    if not count:
        return None, pending
    ready = pending[: lookback + count * chunk + lookahead]
    return FrameChunks(ready, streaming, metadata.stride, count, count * chunk), pending[count * chunk :]


def run_calls(runner: StepRunner, chunks: Sequence[Chunk], state):
    """Logits ``[time, n_classes]`` of ``chunks`` run in order from ``state`` (padding labels dropped), and
    the state after them."""
    outputs = []
    for chunk in chunks:
        if chunk.whole:
            outputs.append(runner.utterance(chunk.inputs))
            continue
        logits, state = runner.step(chunk.inputs[None], state)
        outputs.append(logits[: chunk.real])
    empty = np.zeros((0, runner.metadata.output_width), np.float32)
    return (np.concatenate(outputs) if outputs else empty), state


def run_windows(runner: StepRunner, windows: np.ndarray, state):
    """Run ``windows`` ``[time, window, n_input]`` through the model ``n_steps`` at a time;
    a short last call is zero-padded and only its real time steps are kept."""
    return run_calls(runner, Chunks(windows, runner.metadata.n_steps), state)


def run_frames(runner: StepRunner, frames: np.ndarray, state=None):
    """Logits ``[time, n_classes]`` of feature ``frames`` ``[time, n_input]`` for a whole utterance, and the
    final state: the export's streaming form call by call (context windows with zero context past both
    edges, or chunks of frames; the last call zero-padded), or, for a model without one, its one-shot
    ``utterance``."""
    streaming = runner.metadata.streaming
    if streaming is None:
        return runner.utterance(frames), ()
    state = state or runner.zero_state()
    if streaming.frames:
        return run_chunks(runner, frames, state)
    return run_windows(runner, window_view(frames, runner.metadata.n_context), state)


def run_chunks(runner: StepRunner, frames: np.ndarray, state):
    """Run a whole utterance's ``frames`` ``[time, n_input]`` through a streaming form that takes chunks of
    frames (``take_ready_frames``: zero frames before and after the utterance); of a short last chunk
    only its real frames' labels are kept."""
    chunks, _ = take_ready_frames(first_frames(runner.metadata), frames, runner.metadata, final=True)
    return run_calls(runner, chunks or (), state)


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
    ``accept`` with their logits and the new state (``run_ready`` does it on one runner). ``finish`` makes
    the rest ready (zero-padded). Exports with per-utterance normalisation need the whole utterance's
    statistics, and a model without a streaming form runs once over all of it: nothing is ready before
    ``finish`` (``rerun`` gives the chunks of the audio so far, for a partial result from a zero state).
    Global normalisation is the graph's (format 6), or for a format 5 export applied to each frame as it
    comes: incremental either way.
    """

    def __init__(self, runner: StepRunner, keep_new: bool = False):
        metadata = runner.metadata
        self.metadata = metadata
        self.n_steps = metadata.n_steps
        self.n_classes = metadata.output_width  # values a time step: a transducer's joint_dim
        self._context = metadata.n_context
        self._streaming = metadata.streaming
        self._features = metadata.features
        self._normalize = metadata.features.per_utterance
        # the frames are kept and run at the end (or rerun for a partial)
        self._whole = self._normalize or self._streaming is None
        self._frames = metadata.features.frontend.stream()
        # frames still needed as context or look-back, starting with the zero frames before the utterance
        self._pending = first_frames(metadata)
        self._all_frames: list[np.ndarray] = []
        self._ready: list[Sequence[Chunk]] = []  # chunks ready to run, in order
        self._logits: list[np.ndarray] = []
        self._new: list[np.ndarray] = []  # the logits accepted since take_logits last handed them out
        self.zero_state = runner.zero_state()
        self.state = self.zero_state
        self.samples = 0
        self.finished = False
        self.keep_new = keep_new  # whether accept keeps the logits for take_logits (a driver that takes them)

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
        if not self._normalize:
            frames = self._features.normalise(frames)  # global statistics, frame by frame (or none)
        if self._whole:
            self._all_frames.append(frames)
            if final:
                self._ready.append(self.rerun())
            return
        if self._streaming.frames:
            chunks, self._pending = take_ready_frames(self._pending, frames, self.metadata, final)
        else:
            windows, self._pending = take_ready_windows(
                self._pending, frames, self._context, self.n_steps, final
            )
            chunks = None if windows is None else Chunks(windows, self.n_steps)
        if chunks is not None:
            self._ready.append(chunks)

    @property
    def incremental(self) -> bool:
        """Whether chunks are ready as audio arrives (a streaming form, no per-utterance normalisation;
        global normalisation is)."""
        return not self._whole

    def rerun(self) -> Sequence[Chunk]:
        """All chunks of the audio so far, normalised with its statistics so far (per-utterance
        normalisation), to run from ``zero_state``: a partial transcript of a non-incremental utterance."""
        frames = [f for f in self._all_frames if len(f)]
        if not frames:
            return ()
        frames = np.concatenate(frames)
        if self._normalize:
            frames = normalize_frames(frames)
        if self._streaming is None:
            return (
                Chunk(frames.astype(np.float32, copy=False), self.metadata.output_length(len(frames)), True),
            )
        if self._streaming.frames:
            chunks, _ = take_ready_frames(first_frames(self.metadata), frames, self.metadata, final=True)
            return chunks or ()
        return Chunks(window_view(frames, self._context), self.n_steps)

    def ready(self) -> Sequence[Chunk]:
        """The chunks ready to run, in order (handed out once)."""
        ready, self._ready = self._ready, []
        return ready[0] if len(ready) == 1 else ChunkList(ready)

    @property
    def has_ready(self) -> bool:
        """Whether ``ready`` would hand out a chunk."""
        return any(len(chunks) for chunks in self._ready)

    def accept(self, logits: np.ndarray, state: tuple) -> None:
        """The logits ``[time, n_classes]`` (padding steps dropped) and the state after the chunks handed
        out by ``ready`` (all of them, or the first ones of them: a driver may accept chunk by chunk)."""
        self._logits.append(np.asarray(logits))
        if self.keep_new:
            self._new.append(self._logits[-1])
        self.state = state

    def logits(self) -> np.ndarray:
        """Logits ``[time, n_classes]`` of the chunks run so far."""
        if not self._logits:
            return np.zeros((0, self.n_classes), np.float32)
        if len(self._logits) > 1:  # keep one array: a long utterance is many chunks
            self._logits = [np.concatenate(self._logits)]
        return self._logits[0]

    def take_logits(self) -> np.ndarray:
        """The logits accepted since the last call (the encoder's output as it comes: the hook of a
        decoder that runs parts of the model between chunks, see the module docstring)."""
        if not self.keep_new:
            raise RuntimeError("take_logits: this utterance was made without keep_new, so it keeps none")
        if not self._new:
            return np.zeros((0, self.n_classes), np.float32)
        new = self._new[0] if len(self._new) == 1 else np.concatenate(self._new)
        self._new = []
        return new


def run_ready(runner: StepRunner, utterance: Utterance) -> None:
    """Run ``utterance``'s ready chunks in order on ``runner``, accepting each one's logits and state as it
    comes (the synchronous driver: the client's)."""
    for chunk in utterance.ready():
        logits, state = run_calls(runner, (chunk,), utterance.state)
        utterance.accept(logits, state)


class Stream:
    """One utterance being recognised. ``feed_audio`` int16 chunks, ``intermediate_decode`` any time,
    ``finish`` once: an ``Utterance`` whose chunks run on one runner as they are ready, and decoders.

    Without per-utterance normalisation the model runs as audio arrives, ``n_steps`` time
    steps at a time, carrying the recurrent state (global normalisation is done frame by frame, by the
    graph or for a format 5 export by the client, so it streams too). With per-utterance normalisation
    (``features.normalize: true`` in the export), features need the whole utterance's statistics: the
    stream keeps the frames and runs the
    model when a transcript is asked for, normalising with the statistics so far; ``finish``
    then equals one-shot transcription exactly. A model without a streaming form (``streaming``
    null in its metadata) is run the same way, over the whole utterance at once (``Model`` makes such a
    stream only for a caller that asks for the transcript at the end).

    A transducer's decoders (``TransducerDecoder``) search frame by frame: each keeps a search that the
    encoder's new frames are fed to after every call, so an intermediate transcript costs the new frames
    only, and the final one equals the decoder's one-shot ``decode`` of all the frames.
    """

    def __init__(self, runner: StepRunner, decoder, intermediate_decoder=None):
        self.runner = runner
        self.decoder = decoder
        self.intermediate_decoder = intermediate_decoder or decoder
        searching = any(isinstance(d, TransducerDecoder) for d in (self.decoder, self.intermediate_decoder))
        self.utterance = Utterance(runner, keep_new=searching)
        self._searches: dict[TransducerDecoder, object] = {}  # a transducer decoder's search
        self._search(decoder)  # the final transcript's search runs as the audio comes (when it can)

    @property
    def samples(self) -> int:
        """Samples fed so far."""
        return self.utterance.samples

    def feed_audio(self, chunk: np.ndarray) -> None:
        """Add int16 mono samples at the model's sample rate."""
        self.utterance.feed_audio(chunk)
        self._run()

    def _run(self) -> None:
        """Run the ready chunks; their output goes on to the searches."""
        run_ready(self.runner, self.utterance)
        if not self.utterance.keep_new:
            return
        frames = self.utterance.take_logits()
        if len(frames):
            for search in self._searches.values():
                search.advance(frames)

    def _search(self, decoder):
        """``decoder``'s search fed every frame so far (made when first asked for: a one-shot
        transcription never feeds the intermediate decoder's), or None for a decoder that does not search
        frame by frame or an utterance whose frames are not final yet (per-utterance normalisation).
        ``_run`` hands every frame accepted to the searches there are, so a new one starts from all of
        them."""
        if not isinstance(decoder, TransducerDecoder) or not (
            self.utterance.incremental or self.utterance.finished
        ):
            return None
        if decoder not in self._searches:
            search = decoder.search()
            search.advance(self.utterance.logits())
            self._searches[decoder] = search
        return self._searches[decoder]

    def logits(self) -> np.ndarray:
        """Logits ``[time, n_classes]`` of the audio so far (a transducer's projected encoder frames)."""
        utterance = self.utterance
        if utterance.incremental or utterance.finished:
            return utterance.logits()
        logits, _ = run_calls(self.runner, utterance.rerun(), utterance.zero_state)
        return logits

    def _text(self, decoder) -> str:
        """``decoder``'s transcript of the audio so far (from its search when it has one)."""
        search = self._search(decoder)
        return decoder.text(search) if search is not None else decoder.decode(self.logits())

    def intermediate_decode(self) -> str:
        """Transcript of the audio so far (the intermediate decoder; greedy unless configured)."""
        return self._text(self.intermediate_decoder)

    def flush(self) -> np.ndarray:
        """End the utterance: run the last (zero-padded) frames; returns the logits of the whole of it."""
        if self.utterance.finished:
            raise RuntimeError("the stream is already finished")
        self.utterance.finish()
        self._run()
        return self.utterance.logits()

    def finish(self) -> str:
        """Flush the last (zero-padded) frames and return the final transcript."""
        self.flush()
        return self._text(self.decoder)

    def candidates(self, count: int, seconds_per_frame: float) -> list:
        """After ``flush``: at most ``count`` transcripts of the utterance, best first (the decoder's
        ``candidates``; a transducer's from the search fed as the audio came)."""
        search = self._search(self.decoder)
        if search is not None:
            return self.decoder.found(search, count, seconds_per_frame)
        return self.decoder.candidates(self.utterance.logits(), count, seconds_per_frame)
