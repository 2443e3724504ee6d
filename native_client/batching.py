"""Many streams, one model call: utterances cut into model-sized chunks, and runners that step a batch.

``Utterance`` does what ``native_client.stream.Stream`` does for one utterance (features block by
block, context windows, ``n_steps`` windows per call, the last call zero-padded) but does not run the
model: it hands out its ready chunks and takes their logits back, so that a scheduler
(``native_client.server.engine``) can put the chunks of many utterances into one call. Its logits equal
``Stream``'s (and so the one-shot client's) chunk for chunk.

``batch_runner`` picks how a batch is run: the export's batched streaming signature
(``tensors["batch_signature"]``: windows ``[batch, n_steps, window, n_input]``, each state ``[batch, ...]``)
through TFLite or the SavedModel, or, for a model without one (older exports, the frozen graph,
DeepSpeech/Coqui ``.tflite`` files), one batch-1 call per stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from native_client.frontends import normalize_frames
from native_client.runtime import SavedModelRunner, StepRunner, TFLiteRunner, _tflite_interpreter
from native_client.windows import ready_windows, window_view


@dataclass
class Chunk:
    """``n_steps`` windows ``[n_steps, window, n_input]`` of one utterance, ``real`` of them not padding."""

    windows: np.ndarray
    real: int


def _chunks_of(windows: np.ndarray, n_steps: int) -> list[Chunk]:
    """``windows`` cut into ``n_steps`` chunks, the last one zero-padded (as ``stream.run_windows``)."""
    chunks = []
    for start in range(0, len(windows), n_steps):
        part = np.ascontiguousarray(windows[start : start + n_steps], dtype=np.float32)
        real = len(part)
        if real < n_steps:
            part = np.concatenate([part, np.zeros((n_steps - real,) + part.shape[1:], np.float32)])
        chunks.append(Chunk(part, real))
    return chunks


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
        self._pending = np.zeros((self._context, metadata.n_input), np.float32)
        self._all_frames: list[np.ndarray] = []
        self._ready: list[Chunk] = []
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
                self._ready.extend(self.rerun())
            return
        context = self._context
        self._pending = np.concatenate([self._pending, frames])
        if final:
            self._pending = np.concatenate(
                [self._pending, np.zeros((context, self._pending.shape[1]), np.float32)]
            )
        ready = len(self._pending) - 2 * context
        if not final:
            ready -= ready % self.n_steps
        if ready <= 0:
            return
        self._ready.extend(_chunks_of(ready_windows(self._pending, 2 * context + 1, ready), self.n_steps))
        self._pending = self._pending[ready:]

    @property
    def incremental(self) -> bool:
        """Whether chunks are ready as audio arrives (no per-utterance normalisation)."""
        return not self._normalize

    def rerun(self) -> list[Chunk]:
        """All chunks of the audio so far, normalised with its statistics so far, to run from a zero
        state (exports with normalisation; what ``Stream.intermediate_decode`` runs)."""
        frames = np.concatenate(self._all_frames) if self._all_frames else np.zeros((0, 1), np.float32)
        if len(frames) == 0:
            return []
        return _chunks_of(window_view(normalize_frames(frames), self._context), self.n_steps)

    def ready(self) -> list[Chunk]:
        """The chunks ready to run, in order (handed out once)."""
        ready, self._ready = self._ready, []
        return ready

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


class BatchRunner:
    """Steps several streams at once: ``step(windows [batch, n_steps, window, n_input], states)`` with one
    state tuple per stream; returns logits ``[batch, n_steps, n_classes]`` and the new state tuples.
    This base class makes one batch-1 call per stream (models without a batched signature)."""

    batched = False

    def __init__(self, runner: StepRunner):
        self.runner = runner
        self.metadata = runner.metadata

    def step(self, windows: np.ndarray, states: list[tuple]) -> tuple[np.ndarray, list[tuple]]:
        """See the class docstring."""
        logits, new_states = [], []
        for row, state in zip(windows, states, strict=True):
            out, new_state = self.runner.step(row[None], state)
            logits.append(out)
            new_states.append(new_state)
        return np.stack(logits), new_states


def _bucket(batch: int) -> int:
    """The batch size a call is padded to: a power of two, so that a batch of any size reuses one of a
    few tensor allocations (a TFLite resize reallocates every tensor)."""
    return 1 << max(0, batch - 1).bit_length()


class _SignatureBatchRunner(BatchRunner):
    """The batched streaming signature (``tensors["batch_signature"]``) of a TFLite or SavedModel export."""

    batched = True

    def __init__(self, runner: StepRunner, call):
        super().__init__(runner)
        self._call = call

    def step(self, windows, states):
        """See ``BatchRunner``."""
        names, specs = self.metadata.tensors, self.metadata.state
        batch = len(windows)
        size = _bucket(batch)
        if size > batch:
            windows = np.concatenate([windows, np.zeros((size - batch,) + windows.shape[1:], np.float32)])
        inputs = {names["input"]: np.ascontiguousarray(windows, dtype=np.float32)}
        for index, spec in enumerate(specs):
            rows = [state[index] for state in states]
            rows.extend(np.zeros_like(rows[0]) for _ in range(size - batch))
            inputs[spec["input"]] = np.concatenate(rows)
        out = self._call(inputs)
        logits = np.asarray(out[names["logits"]])[:batch]
        new = [np.asarray(out[spec["output"]]) for spec in specs]
        return logits, [tuple(value[i : i + 1].copy() for value in new) for i in range(batch)]


def batch_runner(runner: StepRunner) -> BatchRunner:
    """The runner for batches of streams on ``runner``'s model: its batched signature when the export has
    one and the backend runs it (TFLite, SavedModel), else one batch-1 call per stream."""
    signature = runner.metadata.tensors.get("batch_signature")
    if signature and isinstance(runner, TFLiteRunner):
        # An interpreter of its own: while a signature runner holds an interpreter, LiteRT refuses the
        # plain ``invoke`` that ``TFLiteRunner`` makes.
        interpreter = _tflite_interpreter(str(runner.metadata.path("tflite")), runner.threads)
        if signature in interpreter.get_signature_list():
            call = interpreter.get_signature_runner(signature)
            return _SignatureBatchRunner(runner, lambda inputs: call(**inputs))
    if signature and isinstance(runner, SavedModelRunner) and signature in runner.loaded.signatures:
        function = runner.loaded.signatures[signature]
        return _SignatureBatchRunner(
            runner, lambda inputs: {k: v.numpy() for k, v in function(**inputs).items()}
        )
    return BatchRunner(runner)
