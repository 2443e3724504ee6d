"""A decoder of a user's own, for tests: best path in capitals, prefixed by who decoded it.

``decode`` gives ``"<pid> <lm_alpha> <lm_beta> <TEXT>"``, so a test sees that this module decoded
an utterance, in which process, and with which weights (``reweighted`` changes them, as
TuneDecoder does). It reads its weights from ``spec.settings`` and needs no LM.
"""

from __future__ import annotations

import os

import numpy as np

from native_client.decoders import Decoder, DecoderSpec
from native_client.decoders.greedy import best_path
from native_client.transcripts import Candidate, word_timings


class EchoDecoder(Decoder):
    """Best path in capitals, after the process id and the LM weights."""

    name = "echo"

    def __init__(self, spec: DecoderSpec, lm_alpha: float, lm_beta: float):
        self.spec = spec
        self.alphabet = spec.alphabet()
        self.weights = (lm_alpha, lm_beta)

    @classmethod
    def from_spec(cls, spec: DecoderSpec) -> EchoDecoder:
        """An echo decoder with ``spec``'s weights (0, 0 when it has none)."""
        return cls(spec, spec.settings.get("lm_alpha", 0.0), spec.settings.get("lm_beta", 0.0))

    def decode(self, logits: np.ndarray) -> str:
        """``"<pid> <alpha> <beta> <BEST PATH IN CAPITALS>"``."""
        alpha, beta = self.weights
        return f"{os.getpid()} {alpha:g} {beta:g} {best_path(logits, self.alphabet).upper()}".strip()

    def candidates(self, logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
        """``count`` candidates, so a test sees how many its caller asked for: ``decode``'s text, then
        the same marked ``#2``, ``#3``, ...; each with the best path's word timings and a confidence
        falling by one per rank."""
        path = np.argmax(logits, axis=-1)
        words = word_timings(path, self.alphabet, seconds_per_frame)
        text = self.decode(logits)
        return [
            Candidate(text if rank == 1 else f"{text} #{rank}", -rank, words) for rank in range(1, count + 1)
        ]

    def reweighted(self, lm_alpha: float, lm_beta: float) -> EchoDecoder:
        """The same decoder reporting other weights."""
        return EchoDecoder(self.spec, lm_alpha, lm_beta)


DECODER = EchoDecoder
