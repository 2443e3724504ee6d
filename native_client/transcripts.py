"""Candidate transcripts with word timings, as DeepSpeech's ``--extended``/``--json`` report them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from native_client.alphabet import Labels


@dataclass(frozen=True)
class WordTiming:
    """One word: its start and duration in seconds (CTC frames of its letters on the best path) and its
    confidence (see ``word_timings``; None when the decoder gave no probabilities)."""

    word: str
    start_time: float
    duration: float
    confidence: float | None = None

    def to_dict(self) -> dict:
        """``word``, ``start_time``, ``duration`` and, when known, ``confidence``."""
        out = {
            "word": self.word,
            "start_time": round(self.start_time, 3),
            "duration": round(self.duration, 3),
        }
        if self.confidence is not None:
            out["confidence"] = round(self.confidence, 4)
        return out


@dataclass(frozen=True)
class Candidate:
    """One transcript, its confidence (the decoder's total log score: higher is surer) and its words."""

    text: str
    confidence: float
    words: tuple[WordTiming, ...]

    def to_dict(self) -> dict:
        """DeepSpeech's JSON form: confidence and words with start_time and duration."""
        return {
            "text": self.text,
            "confidence": round(self.confidence, 4),
            "words": [w.to_dict() for w in self.words],
        }


def word_timings(
    frame_labels: Sequence[int],
    alphabet: Labels,
    seconds_per_frame: float,
    first_frame: int = 0,
    log_probs: np.ndarray | None = None,
) -> tuple[WordTiming, ...]:
    """Words of a per-frame label path (CTC: repeats merged, blanks dropped, the space separates words).
    A word starts at the frame of its first label and lasts until the frame of its last one; its text is
    its labels decoded (so a word of byte labels is its UTF-8 text; one whose bytes decode to nothing is
    left out). A language written without spaces has one word per stretch between pauses.

    Confidence (with ``log_probs``, the acoustic model's log-softmax ``[time, n_classes]`` of these frames):
    the geometric mean, over the word's frames (first to last label, blanks between them included), of the
    probability the model gave the path's label at that frame: 1.0 when the model was certain of every
    frame of the word, near 0 when the search chose labels the model thought unlikely (the language
    model's doing). One definition for every decoder, the client's ``--json`` and the server's ``conf``."""
    blank, space = alphabet.blank_index, alphabet.space_index
    words: list[WordTiming] = []
    letters: list[int] = []
    start = end = 0
    previous = blank

    labels = [int(label) for label in frame_labels]

    def close() -> None:
        text = alphabet.decode(letters)
        if text:
            confidence = None
            if log_probs is not None:
                chosen = log_probs[np.arange(start, end + 1), labels[start : end + 1]]
                confidence = float(np.exp(np.mean(chosen)))
            words.append(
                WordTiming(
                    text,
                    (first_frame + start) * seconds_per_frame,
                    (end - start + 1) * seconds_per_frame,
                    confidence,
                )
            )
        letters.clear()

    for frame, label in enumerate(labels):
        if label == space:
            close()
        elif 0 <= label < blank:
            if label != previous:
                if not letters:
                    start = frame
                letters.append(label)
            end = frame
        previous = label
    close()
    return tuple(words)
