"""Decoding a transducer (issue 47): greedy search and icefall's modified beam search, frame by frame, so
that a stream feeds encoder chunks as they come and asks for the best transcript at any time.

A search calls two parts of the model (``TransducerParts``): the predictor over the last
``context_size`` labels of each hypothesis, and the joiner of one encoder frame against those predictor
outputs. Both take projected vectors (the encoder's and the predictor's projections to the joiner's width
are computed once per frame and once per label history, not once per pair).

- ``GreedySearch``: at each frame the best class; a label is kept and the frame asked again, up to
  ``max_symbols`` labels a frame, until the blank wins.
- ``ModifiedBeamSearch`` (icefall's ``modified_beam_search``): at most one label a frame, which makes each
  frame one batched call over the ``beam`` hypotheses; the ``beam`` best extensions survive and
  hypotheses with the same labels are merged (their probabilities added).

A label's frame gives its word's timing; its probability, its word's confidence (``candidates``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from native_client.alphabet import Labels
from native_client.transcripts import Candidate, WordTiming


class TransducerParts(Protocol):
    """The predictor and joiner of a transducer, as a search calls them."""

    blank: int
    context_size: int

    def predict(self, contexts: np.ndarray) -> np.ndarray:
        """``[n, context_size]`` int32 label windows (blanks before the first label) -> ``[n, joint]``
        projected predictor outputs."""

    def join(self, frame: np.ndarray, predicted: np.ndarray) -> np.ndarray:
        """One projected encoder frame ``[joint]`` against ``[n, joint]`` predictor outputs -> logits
        ``[n, classes]``."""


@dataclass(frozen=True)
class Hypothesis:
    """Labels emitted so far, the frame and log probability of each, and the hypothesis's total log
    probability."""

    labels: tuple[int, ...] = ()
    frames: tuple[int, ...] = ()
    label_log_probs: tuple[float, ...] = ()
    log_prob: float = 0.0

    def context(self, size: int, blank: int) -> tuple[int, ...]:
        """The last ``size`` labels, blanks before the first."""
        padded = (blank,) * size + self.labels
        return padded[len(padded) - size :]

    def extended(self, label: int, frame: int, label_log_prob: float, log_prob: float) -> Hypothesis:
        """This hypothesis with ``label`` emitted at ``frame``."""
        return Hypothesis(
            self.labels + (label,), self.frames + (frame,), self.label_log_probs + (label_log_prob,), log_prob
        )


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class _Emitted:
    """A label a hypothesis emitted, with its frame and log probability, and the one emitted before it:
    a linked list, so extending a hypothesis copies nothing (a long utterance's labels are not copied at
    every frame)."""

    label: int
    frame: int
    log_prob: float
    before: _Emitted | None


@dataclass(frozen=True)
class _Path:
    """A hypothesis as the beam search keeps it: its last label (None before any), the id of its label
    sequence (the same id: the same labels; ``_Sequences``), its last ``context_size`` labels and its
    total log probability."""

    last: _Emitted | None
    sequence: int
    context: tuple[int, ...]
    log_prob: float

    def hypothesis(self) -> Hypothesis:
        """The ``Hypothesis`` this path stands for (its labels walked back from the last)."""
        emitted = []
        node = self.last
        while node is not None:
            emitted.append(node)
            node = node.before
        emitted.reverse()
        return Hypothesis(
            tuple(e.label for e in emitted),
            tuple(e.frame for e in emitted),
            tuple(e.log_prob for e in emitted),
            self.log_prob,
        )


class _Sequences:
    """An id for each label sequence a search makes (a trie: sequence ``id`` followed by ``label`` is
    one entry), so that hypotheses with the same labels are found in constant time, not by comparing
    their labels."""

    def __init__(self):
        self._ids: dict[tuple[int, int], int] = {}

    def extended(self, sequence: int, label: int) -> int:
        """The id of sequence ``sequence`` followed by ``label`` (0 is the empty sequence)."""
        return self._ids.setdefault((sequence, label), len(self._ids) + 1)


class GreedySearch:
    """The best class of each frame, up to ``max_symbols`` labels a frame."""

    def __init__(self, parts: TransducerParts, max_symbols: int = 4):
        if max_symbols < 1:
            raise ValueError(f"max_symbols must be at least 1, got {max_symbols}")
        self.parts, self.max_symbols = parts, max_symbols
        self.frame = 0
        self._labels: list[int] = []
        self._frames: list[int] = []
        self._label_log_probs: list[float] = []
        self._log_prob = 0.0
        self._context = (parts.blank,) * parts.context_size
        self._predicted = self._predict()

    def _predict(self) -> np.ndarray:
        return self.parts.predict(np.array([self._context], np.int32))

    def advance(self, frames: np.ndarray) -> None:
        """Search over the next projected encoder frames ``[n, joint]``."""
        blank = self.parts.blank
        for frame in frames:
            for _ in range(self.max_symbols):
                log_probs = _log_softmax(self.parts.join(frame, self._predicted))[0]
                best = int(np.argmax(log_probs))
                self._log_prob += float(log_probs[best])
                if best == blank:
                    break
                self._labels.append(best)
                self._frames.append(self.frame)
                self._label_log_probs.append(float(log_probs[best]))
                self._context = self._context[1:] + (best,)
                self._predicted = self._predict()
            self.frame += 1

    def hypotheses(self) -> list[Hypothesis]:
        """The one hypothesis greedy search keeps."""
        return [
            Hypothesis(tuple(self._labels), tuple(self._frames), tuple(self._label_log_probs), self._log_prob)
        ]


class ModifiedBeamSearch:
    """icefall's modified beam search: at most one label a frame, ``beam`` hypotheses kept."""

    def __init__(self, parts: TransducerParts, beam: int = 4):
        if beam < 1:
            raise ValueError(f"beam must be at least 1, got {beam}")
        self.parts, self.beam = parts, beam
        self.frame = 0
        self._sequences = _Sequences()
        self._beam = [_Path(None, 0, (parts.blank,) * parts.context_size, 0.0)]
        self._predicted = self._predict(self._beam)

    def _predict(self, paths: list[_Path]) -> np.ndarray:
        return self.parts.predict(np.array([path.context for path in paths], np.int32))

    def advance(self, frames: np.ndarray) -> None:
        """Search over the next projected encoder frames ``[n, joint]``."""
        blank = self.parts.blank
        for frame in frames:
            log_probs = _log_softmax(self.parts.join(frame, self._predicted))  # [beam, classes]
            totals = np.array([path.log_prob for path in self._beam])[:, None] + log_probs
            flat = totals.ravel()
            count = min(self.beam, flat.size)
            chosen = np.argpartition(-flat, count - 1)[:count]
            chosen = chosen[np.argsort(-flat[chosen], kind="stable")]
            merged: dict[int, tuple[_Path, int]] = {}  # by label sequence: the path, and its parent's row
            for index in chosen:
                row, label = divmod(int(index), log_probs.shape[1])
                parent, score = self._beam[row], float(flat[index])
                if label == blank:
                    child, source = replace(parent, log_prob=score), row
                else:
                    emitted = _Emitted(label, self.frame, float(log_probs[row, label]), parent.last)
                    sequence = self._sequences.extended(parent.sequence, label)
                    child, source = _Path(emitted, sequence, parent.context[1:] + (label,), score), -1
                known = merged.get(child.sequence)
                if known is None:
                    merged[child.sequence] = (child, source)
                else:
                    # the same labels by another path: probabilities add, the likelier path's timing stays
                    kept, kept_source = known
                    total = float(np.logaddexp(kept.log_prob, child.log_prob))
                    merged[child.sequence] = (replace(kept, log_prob=total), kept_source)
            self._beam = [path for path, _ in merged.values()]
            sources = [source for _, source in merged.values()]
            fresh = [path for path, source in zip(self._beam, sources, strict=True) if source < 0]
            computed = iter(self._predict(fresh)) if fresh else iter(())
            self._predicted = np.stack(
                [self._predicted[source] if source >= 0 else next(computed) for source in sources]
            )
            self.frame += 1

    def hypotheses(self) -> list[Hypothesis]:
        """The hypotheses kept, best first."""
        return [path.hypothesis() for path in sorted(self._beam, key=lambda path: -path.log_prob)]


def word_timings(
    hypothesis: Hypothesis, alphabet: Labels, seconds_per_frame: float, first_frame: int = 0
) -> tuple[WordTiming, ...]:
    """The words of ``hypothesis`` (split at the space label): each starts at its first label's frame and
    lasts to the end of its last label's; its confidence is the geometric mean of its labels'
    probabilities (the CTC decoders' definition, over labels instead of frames)."""
    words: list[WordTiming] = []
    letters: list[int] = []
    frames: list[int] = []
    scores: list[float] = []

    def close() -> None:
        text = alphabet.decode(letters)
        if text:
            words.append(
                WordTiming(
                    text,
                    (first_frame + frames[0]) * seconds_per_frame,
                    (frames[-1] - frames[0] + 1) * seconds_per_frame,
                    float(np.exp(np.mean(scores))),
                )
            )
        letters.clear(), frames.clear(), scores.clear()

    for label, frame, score in zip(
        hypothesis.labels, hypothesis.frames, hypothesis.label_log_probs, strict=True
    ):
        if label == alphabet.space_index:
            close()
        else:
            letters.append(label)
            frames.append(frame)
            scores.append(score)
    close()
    return tuple(words)


def candidates(
    hypotheses: list[Hypothesis], alphabet: Labels, count: int, seconds_per_frame: float
) -> list[Candidate]:
    """At most ``count`` distinct transcripts of ``hypotheses`` (best first), each with its log
    probability as confidence and its word timings; at least one (empty before any frame)."""
    found: list[Candidate] = []
    seen: set[str] = set()
    for hypothesis in hypotheses or [Hypothesis()]:
        text = alphabet.decode(list(hypothesis.labels))
        if text in seen:
            continue
        seen.add(text)
        found.append(
            Candidate(text, hypothesis.log_prob, word_timings(hypothesis, alphabet, seconds_per_frame))
        )
        if len(found) == count:
            break
    return found
