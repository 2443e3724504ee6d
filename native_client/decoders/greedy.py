"""Greedy (best path) CTC decoding: the most likely label of each frame, repeats merged, blanks dropped.
No language model; the client's intermediate transcripts and Evaluate's first figures use it."""

from __future__ import annotations

import numpy as np

from native_client.alphabet import Labels
from native_client.decoders import Decoder, DecoderSpec
from native_client.transcripts import Candidate, word_timings


def best_path(logits: np.ndarray, alphabet: Labels) -> str:
    """Argmax per frame over ``logits`` ``[time, classes]``, merge repeats, drop blanks; as text."""
    best = np.argmax(logits, axis=-1)
    if len(best) == 0:
        return ""
    keep = np.concatenate([[True], best[1:] != best[:-1]]) & (best != alphabet.blank_index)
    return alphabet.decode(best[keep])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32, C-contiguous (what the beam decoder reads)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    out = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return np.ascontiguousarray(out, dtype=np.float32)


class GreedyDecoder(Decoder):
    """Best-path CTC decoding, no language model."""

    name = "greedy"

    def __init__(self, alphabet: Labels):
        self.alphabet = alphabet

    @classmethod
    def from_spec(cls, spec: DecoderSpec) -> GreedyDecoder:
        """A greedy decoder over ``spec``'s alphabet; the LM and weights are not used, hot words refused."""
        if spec.settings.get("hot_words"):
            raise ValueError("hot words need a decoder with a language model; greedy decoding has none")
        return cls(spec.alphabet())

    def decode(self, logits: np.ndarray) -> str:
        """Text of ``logits`` ``[time, classes]``."""
        return best_path(logits, self.alphabet)

    def candidates(self, logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
        """The best path as the one candidate (greedy search has no others); its confidence is the sum
        of each frame's best log probability."""
        path = np.argmax(logits, axis=-1)
        probabilities = log_softmax(logits)
        confidence = float(np.sum(np.max(probabilities, axis=-1))) if len(logits) else 0.0
        words = word_timings(path, self.alphabet, seconds_per_frame, log_probs=probabilities)
        return [Candidate(self.decode(logits), confidence, words)]


DECODER = GreedyDecoder
