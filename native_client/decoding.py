"""Turning logits into text. Greedy (best path) decoding; the beam search with a language model
lives in ``native_client.beam`` and offers the same ``decode(logits)`` method."""

from __future__ import annotations

import numpy as np

from native_client.alphabet import Alphabet
from native_client.transcripts import Candidate, word_timings


def best_path(logits: np.ndarray, alphabet: Alphabet) -> str:
    """Argmax per frame over ``logits`` ``[time, classes]``, merge repeats, drop blanks."""
    best = np.argmax(logits, axis=-1)
    if len(best) == 0:
        return ""
    keep = np.concatenate([[True], best[1:] != best[:-1]]) & (best != alphabet.blank_index)
    return alphabet.decode(best[keep])


class GreedyDecoder:
    """Best-path CTC decoding, no language model."""

    name = "greedy"

    def __init__(self, alphabet: Alphabet):
        self.alphabet = alphabet

    def decode(self, logits: np.ndarray) -> str:
        """Text of ``logits`` ``[time, classes]``."""
        return best_path(logits, self.alphabet)

    def candidates(self, logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
        """The best path as the one candidate (greedy search has no others); its confidence is the sum
        of each frame's best log probability."""
        path = np.argmax(logits, axis=-1)
        confidence = float(np.sum(np.max(log_softmax(logits), axis=-1))) if len(logits) else 0.0
        return [
            Candidate(self.decode(logits), confidence, word_timings(path, self.alphabet, seconds_per_frame))
        ]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32, C-contiguous (what the beam decoder reads)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    out = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return np.ascontiguousarray(out, dtype=np.float32)
