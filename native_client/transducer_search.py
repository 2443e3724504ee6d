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
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class GreedySearch:
    """The best class of each frame, up to ``max_symbols`` labels a frame."""

    def __init__(self, parts: TransducerParts, max_symbols: int = 4):
        if max_symbols < 1:
            raise ValueError(f"max_symbols must be at least 1, got {max_symbols}")
        self.parts, self.max_symbols = parts, max_symbols
        self.hypothesis = Hypothesis()
        self.frame = 0
        self._predicted = self._predict(self.hypothesis)

    def _predict(self, hypothesis: Hypothesis) -> np.ndarray:
        context = hypothesis.context(self.parts.context_size, self.parts.blank)
        return self.parts.predict(np.array([context], np.int32))

    def advance(self, frames: np.ndarray) -> None:
        """Search over the next projected encoder frames ``[n, joint]``."""
        blank = self.parts.blank
        for frame in frames:
            for _ in range(self.max_symbols):
                log_probs = _log_softmax(self.parts.join(frame, self._predicted))[0]
                best = int(np.argmax(log_probs))
                score = self.hypothesis.log_prob + float(log_probs[best])
                if best == blank:
                    self.hypothesis = replace(self.hypothesis, log_prob=score)
                    break
                self.hypothesis = self.hypothesis.extended(best, self.frame, float(log_probs[best]), score)
                self._predicted = self._predict(self.hypothesis)
            self.frame += 1

    def hypotheses(self) -> list[Hypothesis]:
        """The one hypothesis greedy search keeps."""
        return [self.hypothesis]


class ModifiedBeamSearch:
    """icefall's modified beam search: at most one label a frame, ``beam`` hypotheses kept."""

    def __init__(self, parts: TransducerParts, beam: int = 4):
        if beam < 1:
            raise ValueError(f"beam must be at least 1, got {beam}")
        self.parts, self.beam = parts, beam
        self.frame = 0
        self._beam = [Hypothesis()]
        self._predicted = self._predict(self._beam)

    def _predict(self, hypotheses: list[Hypothesis]) -> np.ndarray:
        size, blank = self.parts.context_size, self.parts.blank
        contexts = np.array([h.context(size, blank) for h in hypotheses], np.int32)
        return self.parts.predict(contexts)

    def advance(self, frames: np.ndarray) -> None:
        """Search over the next projected encoder frames ``[n, joint]``."""
        blank = self.parts.blank
        for frame in frames:
            log_probs = _log_softmax(self.parts.join(frame, self._predicted))  # [beam, classes]
            totals = np.array([h.log_prob for h in self._beam])[:, None] + log_probs
            flat = totals.ravel()
            count = min(self.beam, flat.size)
            chosen = np.argpartition(-flat, count - 1)[:count]
            chosen = chosen[np.argsort(-flat[chosen], kind="stable")]
            merged: dict[tuple[int, ...], tuple[Hypothesis, int]] = {}
            for index in chosen:
                row, label = divmod(int(index), log_probs.shape[1])
                parent, score = self._beam[row], float(flat[index])
                if label == blank:
                    child = replace(parent, log_prob=score)
                else:
                    child = parent.extended(label, self.frame, float(log_probs[row, label]), score)
                known = merged.get(child.labels)
                if known is None:
                    merged[child.labels] = (child, row if label == blank else -1)
                else:
                    # the same labels by another path: probabilities add, the likelier path's timing stays
                    kept, source = known
                    total = float(np.logaddexp(kept.log_prob, child.log_prob))
                    merged[child.labels] = (replace(kept, log_prob=total), source)
            self._beam = [hypothesis for hypothesis, _ in merged.values()]
            sources = [source for _, source in merged.values()]
            fresh = [h for h, source in zip(self._beam, sources, strict=True) if source < 0]
            computed = iter(self._predict(fresh)) if fresh else iter(())
            self._predicted = np.stack(
                [self._predicted[source] if source >= 0 else next(computed) for source in sources]
            )
            self.frame += 1

    def hypotheses(self) -> list[Hypothesis]:
        """The hypotheses kept, best first."""
        return sorted(self._beam, key=lambda h: -h.log_prob)


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
