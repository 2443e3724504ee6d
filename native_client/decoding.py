"""Turning logits into text. Greedy (best path) decoding; the beam search with a language model
lives in ``native_client.beam`` and offers the same ``decode(logits)`` method."""
from __future__ import annotations

import numpy as np

from native_client.alphabet import Alphabet


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
