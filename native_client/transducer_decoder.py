"""A transducer export's decoders (issue 47): the searches of ``native_client.transducer_search`` over the
export's own predictor and joiner signatures, behind the client's decoder interface.

A transducer's streaming signatures give the encoder's projected frames (``joint_dim`` wide) where a CTC
model's give label scores; everything that runs the encoder (``Stream``, ``Model``'s one-shot path, the
server's batched engine) is unchanged, and a ``TransducerDecoder`` turns those frames into text as a CTC
decoder turns logits into text: ``decode(frames)``, ``candidates(frames, count, seconds_per_frame)``.
``search()`` hands out a fresh search to feed chunk by chunk (the client's ``Stream`` does, so that an
intermediate transcript costs the new frames only).

The predictor and joiner are called through ``ExportParts``: its own interpreter of the export's TFLite
model (or the SavedModel's signatures), behind a lock, so that a search may run on another thread than
the encoder's (the server decodes on its decoding and audio threads while its engine runs the encoder).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from native_client.alphabet import Labels
from native_client.decoders import Decoder, DecoderSpec
from native_client.metadata import TransducerSpec
from native_client.transcripts import Candidate
from native_client.transducer_search import GreedySearch, ModifiedBeamSearch, candidates

# (signature, {input name: array}) -> {output name: array}
SignatureCall = Callable[[str, dict], dict]


class ExportParts:
    """The predictor and joiner of an export (``TransducerParts``) through ``call``, one call at a time."""

    def __init__(self, spec: TransducerSpec, call: SignatureCall, rows: int = 1, lock=None):
        self.spec = spec
        self.blank, self.context_size = spec.blank, spec.context_size
        self.rows = rows
        self._call = call
        self._lock = lock or threading.Lock()

    def with_rows(self, rows: int) -> ExportParts:
        """The same networks (and lock), each call padded to ``rows`` rows: a beam search's calls then
        keep one shape, and the interpreter does not reallocate its tensors when the beam's size
        changes."""
        return ExportParts(self.spec, self._call, rows, self._lock)

    def predict(self, contexts: np.ndarray) -> np.ndarray:
        """``[n, context_size]`` label windows -> ``[n, joint_dim]`` projected predictor outputs."""
        names = self.spec.predict
        count = len(contexts)
        inputs = {names["input"]: _padded(np.ascontiguousarray(contexts, np.int32), self.rows)}
        with self._lock:
            return np.asarray(self._call(names["signature"], inputs)[names["output"]])[:count]

    def join(self, frame: np.ndarray, predicted: np.ndarray) -> np.ndarray:
        """One projected encoder frame ``[joint_dim]`` against ``[n, joint_dim]`` predictor outputs ->
        logits ``[n, classes]``."""
        names = self.spec.join
        count = len(predicted)
        predicted = _padded(np.ascontiguousarray(predicted, np.float32), self.rows)
        inputs = {
            names["frames"]: np.ascontiguousarray(np.broadcast_to(frame, predicted.shape), np.float32),
            names["predicted"]: predicted,
        }
        with self._lock:
            return np.asarray(self._call(names["signature"], inputs)[names["output"]])[:count]


def _padded(rows: np.ndarray, size: int) -> np.ndarray:
    """``rows`` with copies of its first row up to ``size`` rows (as they are when there are as many or
    more, or none)."""
    if len(rows) >= size or not len(rows):
        return rows
    return np.concatenate([rows, np.repeat(rows[:1], size - len(rows), axis=0)])


class TransducerDecoder(Decoder):
    """Greedy search (``beam`` None; at most ``max_symbols`` labels a frame) or icefall's modified beam
    search (``beam`` hypotheses) over a transducer export's projected encoder frames. No language model:
    shallow fusion is not built (docs/TRAINING.md "The transducer")."""

    def __init__(self, parts: ExportParts, alphabet: Labels, beam: int | None = None, max_symbols: int = 4):
        self.parts, self.alphabet = parts.with_rows(beam or 1), alphabet
        self.beam, self.max_symbols = beam, max_symbols
        self.name = "transducer-greedy" if beam is None else f"transducer-beam{beam}"

    @classmethod
    def from_spec(cls, spec: DecoderSpec) -> TransducerDecoder:
        """Refused: a transducer's decoder calls its export's own networks (``open_model`` builds it)."""
        raise ValueError("a transducer's decoder is built from its export (open_model), not from a spec")

    def search(self) -> GreedySearch | ModifiedBeamSearch:
        """A fresh search, to be fed the encoder's frames as they come (``advance``)."""
        if self.beam is None:
            return GreedySearch(self.parts, self.max_symbols)
        return ModifiedBeamSearch(self.parts, self.beam)

    def decode(self, logits: np.ndarray) -> str:
        """The best transcript of the projected encoder frames ``logits`` ``[time, joint_dim]``."""
        return self.text(self._searched(logits))

    def text(self, search) -> str:
        """The best transcript a search has found so far."""
        return self.alphabet.decode(list(search.hypotheses()[0].labels))

    def candidates(self, logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
        """At most ``count`` distinct transcripts, best first, with their log probabilities and word
        timings (greedy search has one)."""
        return self.found(self._searched(logits), count, seconds_per_frame)

    def found(self, search, count: int, seconds_per_frame: float) -> list[Candidate]:
        """``candidates`` of a search already fed."""
        return candidates(search.hypotheses(), self.alphabet, count, seconds_per_frame)

    def _searched(self, frames: np.ndarray):
        """A fresh search fed all of ``frames``."""
        search = self.search()
        search.advance(np.asarray(frames, np.float32))
        return search


def transducer_decoders(
    spec: TransducerSpec, call: SignatureCall, alphabet: Labels, beam: int | None = None
) -> tuple[TransducerDecoder, TransducerDecoder]:
    """(greedy search, modified beam search of ``beam`` hypotheses, the export's default when None) of an
    export, sharing one ``ExportParts``."""
    parts = ExportParts(spec, call)
    return (
        TransducerDecoder(parts, alphabet, None, spec.max_symbols),
        TransducerDecoder(parts, alphabet, beam or spec.beam, spec.max_symbols),
    )


class GreedyPartials:
    """The greedy partial transcripts of one utterance after another (the server's): for a transducer, one
    search per utterance fed only the frames new since the last partial, so that an utterance's partials
    cost its frames once; another decoder decodes the frames so far each time (``decode``)."""

    def __init__(self, greedy: Decoder):
        self.greedy = greedy
        self._of = None  # the utterance the search is of
        self._search = None
        self._fed = 0

    def forget(self) -> None:
        """Let go of the utterance the search is of (it ended)."""
        self._of, self._search, self._fed = None, None, 0

    def text(self, utterance) -> str:
        """The partial of ``utterance`` (a ``native_client.stream.Utterance``) from its frames so far."""
        frames = utterance.logits()
        if not isinstance(self.greedy, TransducerDecoder):
            return self.greedy.decode(frames)
        if utterance is not self._of:
            self._of, self._search, self._fed = utterance, self.greedy.search(), 0
        self._search.advance(frames[self._fed :])
        self._fed = len(frames)
        return self.greedy.text(self._search)
