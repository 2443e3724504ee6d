"""WER/CER, greedy CTC decoding of logits, and best/worst sample reports.

The headline figure is the WER, or the CER where the language writes no spaces between its words
(``pipeline.data.text.has_word_spaces``, detected from the references): there a "word" is a clause, and
the WER is given beside it."""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import asdict, dataclass
from typing import TextIO

import numpy as np
from rapidfuzz.distance import Levenshtein

from native_client.alphabet import Labels
from native_client.decoders.greedy import best_path
from pipeline.data.text import has_word_spaces


@dataclass
class SampleResult:
    """One utterance: reference, hypothesis, its loss and error counts."""

    path: str
    reference: str
    hypothesis: str
    loss: float
    word_errors: int
    words: int
    char_errors: int
    chars: int

    @property
    def wer(self) -> float:
        """Word error rate of this sample."""
        return self.word_errors / max(self.words, 1)

    @property
    def cer(self) -> float:
        """Character error rate of this sample."""
        return self.char_errors / max(self.chars, 1)

    def to_dict(self) -> dict:
        """Plain data for JSON reports."""
        return {**asdict(self), "wer": self.wer, "cer": self.cer}


def greedy_decode(logits: np.ndarray, length: int, alphabet: Labels) -> str:
    """Best path over ``logits[:length]`` ``[time, classes]`` (``decoders.greedy.best_path``)."""
    return best_path(logits[:length], alphabet)


def score_sample(path: str, reference: str, hypothesis: str, loss: float) -> SampleResult:
    """Word and character edit distances of ``hypothesis`` against ``reference``."""
    ref_words, hyp_words = reference.split(), hypothesis.split()
    return SampleResult(
        path=path,
        reference=reference,
        hypothesis=hypothesis,
        loss=float(loss),
        word_errors=Levenshtein.distance(ref_words, hyp_words),
        words=len(ref_words),
        char_errors=Levenshtein.distance(reference, hypothesis),
        chars=len(reference),
    )


def headline_metric(references) -> str:
    """``cer`` when the references' language writes no spaces between words (Chinese, Japanese, Thai, ...),
    else ``wer``: the figure reports put first and TuneDecoder minimises."""
    return "wer" if has_word_spaces(references) else "cer"


def corpus_rates(results: list[SampleResult], headline: str | None = None) -> dict:
    """Corpus-level WER and CER (total errors over total reference length), mean loss, and ``headline``:
    which of the two leads (``headline_metric`` of the references unless given)."""
    words = sum(r.words for r in results)
    chars = sum(r.chars for r in results)
    losses = [r.loss for r in results if np.isfinite(r.loss)]
    return {
        "wer": sum(r.word_errors for r in results) / max(words, 1),
        "cer": sum(r.char_errors for r in results) / max(chars, 1),
        "loss": float(np.mean(losses)) if losses else float("nan"),
        "samples_count": len(results),
        "headline": headline or headline_metric(r.reference for r in results),
    }


def headline_text(rates: dict) -> str:
    """``WER 0.1234, CER 0.0567`` with the headline figure first (``corpus_rates``)."""
    order = ("cer", "wer") if rates.get("headline") == "cer" else ("wer", "cer")
    return ", ".join(f"{name.upper()} {rates[name]:.4f}" for name in order)


def best_and_worst(results: list[SampleResult], count: int, headline: str = "wer") -> dict:
    """The ``count`` best and worst samples by the ``headline`` rate (ties broken by loss), as plain data."""
    ranked = sorted(results, key=lambda r: (getattr(r, headline), r.loss))
    return {
        "best": [r.to_dict() for r in ranked[:count]],
        "worst": [r.to_dict() for r in ranked[::-1][:count]],
    }


def format_report(title: str, rates: dict, samples: dict) -> str:
    """A human-readable report: the rates and the best/worst samples (reference vs decoded)."""
    unspaced = " (no word spaces: CER first)" if rates.get("headline") == "cer" else ""
    count = rates["samples_count"]
    lines = [f"{title}: {headline_text(rates)}, loss {rates['loss']:.4f} ({count} samples){unspaced}"]
    order = ("cer", "wer") if rates.get("headline") == "cer" else ("wer", "cer")
    for kind in ("best", "worst"):
        if samples.get(kind):
            lines.append(f"-- {kind} samples --")
        for s in samples.get(kind, []):
            figures = " ".join(f"{name.upper()} {s[name]:.3f}" for name in order)
            lines.append(f"{figures} loss {s['loss']:.2f}  {s['path']}")
            lines.append(f"  src: {s['reference']}")
            lines.append(f"  res: {s['hypothesis']}")
    return "\n".join(lines)


class ScoreBoard:
    """A split's figures gathered utterance by utterance, so that nobody holds every result: corpus rates
    (as ``corpus_rates``), the ``count`` best and worst samples (as ``best_and_worst``, ties in index
    order) and, when ``sink`` is given, every result written to it as a JSON line (with its ``index``).
    Memory: the ``2 * count`` samples kept, whatever the number of utterances. ``headline``: the rate the
    samples are ranked by (``headline_metric``)."""

    def __init__(self, count: int, sink: TextIO | None = None, headline: str = "wer"):
        self.count = count
        self.sink = sink
        self.headline = headline
        self.samples = self.words = self.word_errors = self.chars = self.char_errors = 0
        self._loss_sum, self._losses = 0.0, 0
        self._best: list = []  # max-heap by key (negated): the count smallest keys
        self._worst: list = []  # min-heap by key: the count largest keys

    def add(self, index: int, result: SampleResult) -> None:
        """Count one utterance's result (``index``: its position in the split, for ties and the file)."""
        self.samples += 1
        self.words += result.words
        self.word_errors += result.word_errors
        self.chars += result.chars
        self.char_errors += result.char_errors
        if math.isfinite(result.loss):
            self._loss_sum += result.loss
            self._losses += 1
        row = result.to_dict()
        if self.sink is not None:
            self.sink.write(json.dumps({"index": int(index), **row}) + "\n")
        key = (getattr(result, self.headline), result.loss, int(index))
        if self.count:
            negated = (-key[0], -key[1], -key[2])
            if len(self._best) < self.count:
                heapq.heappush(self._best, (negated, row))
            elif negated > self._best[0][0]:
                heapq.heapreplace(self._best, (negated, row))
            if len(self._worst) < self.count:
                heapq.heappush(self._worst, (key, row))
            elif key > self._worst[0][0]:
                heapq.heapreplace(self._worst, (key, row))

    def rates(self) -> dict:
        """``corpus_rates`` of everything added."""
        return {
            "wer": self.word_errors / max(self.words, 1),
            "cer": self.char_errors / max(self.chars, 1),
            "loss": self._loss_sum / self._losses if self._losses else float("nan"),
            "samples_count": self.samples,
            "headline": self.headline,
        }

    def best_and_worst(self) -> dict:
        """``best_and_worst`` of everything added."""
        best = sorted(self._best, key=lambda item: item[0], reverse=True)
        worst = sorted(self._worst, key=lambda item: item[0], reverse=True)
        return {"best": [row for _, row in best], "worst": [row for _, row in worst]}
