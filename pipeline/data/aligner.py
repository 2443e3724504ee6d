"""The aligner model: an export of this project or a DeepSpeech/Coqui ``.tflite``, run by the client's
streaming runtime over a long recording, its log-posteriors written to a scratch file as they come.

Memory stays flat however long the recording: the audio is read in blocks, the model runs chunk by
chunk carrying its state (``native_client.stream``), and each chunk's log-probabilities go to disk at
once; the alignment reads them back a window at a time (``pipeline.data.align``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from native_client.audio import stream_for_model
from native_client.decoders.greedy import log_softmax
from native_client.metadata import ExportError
from native_client.model import Model
from native_client.stream import Utterance, run_calls
from native_client.text import TranscriptRejected, normalise_transcript

log = logging.getLogger(__name__)


class Aligner:
    """A loaded aligner: its labels (from the model's own metadata), its frame duration, and its
    posteriors over a recording."""

    def __init__(self, path: str | Path, threads: int = 1):
        self.path = Path(path)
        self.model = Model(path, threads=threads)
        metadata = self.model.metadata
        if metadata.transducer is not None:
            raise ExportError(
                f"{path}: a transducer export; alignment and cleaning read a CTC model's label scores per "
                f"frame (export a model trained with model.objective: ctc)"
            )
        self.alphabet = metadata.alphabet
        self.blank = self.alphabet.blank_index
        self.seconds_per_frame = metadata.seconds_per_label
        self._text = metadata.text
        self._index = {label: i for i, label in enumerate(getattr(self.alphabet, "labels", ()))}
        if not Utterance(self.model.runner).incremental:
            log.warning(
                "%s: this model does not stream (per-utterance normalisation, or no streaming form): each "
                "recording is held whole while it runs",
                path,
            )

    def normalise(self, text: str) -> str:
        """``text`` as the model's training normalised it (its export's ``data.text``; the alphabet's own
        rule for models that do not record it)."""
        if self._text is None:
            return self.alphabet.normalise(text)
        try:
            return normalise_transcript(text, self._text)
        except TranscriptRejected:  # no words, or digits its settings refuse: nothing to align
            return ""

    def labels(self, text: str) -> tuple[np.ndarray, set[str]]:
        """(the label indices of the normalised ``text``'s characters the alphabet has, the characters it
        lacks). A byte-output model takes every character, as its UTF-8 bytes."""
        text = self.normalise(text)
        if not self._index:  # byte outputs
            return np.asarray(self.alphabet.encode(text), np.int64), set()
        known = [self._index[ch] for ch in text if ch in self._index]
        return np.asarray(known, np.int64), {ch for ch in text if ch not in self._index}

    def posteriors(self, audio: str | Path, scratch: Path) -> np.ndarray:
        """The log-posteriors ``[frames, classes]`` of the whole recording ``audio`` (resampled to the
        model's rate when it has another), written to ``scratch`` as they come, and returned as a
        ``PosteriorsFile`` of it."""
        runner = self.model.runner
        utterance = Utterance(runner)
        frames = 0
        with open(scratch, "wb") as out:

            def run_ready() -> None:
                nonlocal frames
                for chunk in utterance.ready():
                    logits, utterance.state = run_calls(runner, (chunk,), utterance.state)
                    if len(logits):
                        log_softmax(np.asarray(logits, np.float32)).tofile(out)
                        frames += len(logits)

            for block in stream_for_model(audio, self.model.sample_rate, convert_rate=True):
                utterance.feed_audio(block)
                run_ready()
            utterance.finish()
            run_ready()
        return PosteriorsFile(scratch, frames, self.alphabet.n_classes)


class PosteriorsFile:
    """Log-posteriors ``[frames, classes]`` kept in a file, read a slice at a time (a memory map's pages
    would stay in the process's memory as they are read: hundreds of MB for hours of a byte model)."""

    def __init__(self, path: Path, frames: int, classes: int):
        self.path, self.frames, self.classes = Path(path), frames, classes

    def __len__(self) -> int:
        return self.frames

    @property
    def shape(self) -> tuple[int, int]:
        """``(frames, classes)``."""
        return self.frames, self.classes

    def __getitem__(self, frames: slice) -> np.ndarray:
        start, stop, step = frames.indices(self.frames)
        if step != 1:
            raise IndexError("posteriors are read in contiguous slices")
        count = max(0, stop - start) * self.classes
        values = np.fromfile(self.path, np.float32, count=count, offset=start * self.classes * 4)
        return values.reshape(-1, self.classes)
