"""Interpolated modified Kneser-Ney n-gram estimation (Chen & Goodman 1998), written as ARPA.

The same model KenLM's ``lmplz`` builds (no pruning; unigrams interpolated with
the uniform distribution; ``<s>`` only as context), in pure Python. No pip
package ships ``lmplz``. Counts live in dicts: fine for millions of words, not
for billions (use KenLM's own tools for those and set ``decoder.lm_path``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # lmplz --discount_fallback


class LanguageModelError(ValueError):
    """Text that cannot make a language model of the requested order."""


@dataclass
class NGramModel:
    """Probabilities and backoffs per order:
    ``prob[n][ngram]`` and ``backoff[n][context]`` (natural values)."""

    order: int
    prob: list[dict] = field(default_factory=list)
    backoff: list[dict] = field(default_factory=list)
    discounts: list[tuple[float, float, float]] = field(default_factory=list)
    fallback_orders: list[int] = field(default_factory=list)

    def probability(self, word: str, context: tuple[str, ...]) -> float:
        """P(word | context) by the back-off form of the interpolated model (what ARPA readers do)."""
        context = tuple(context)[-(self.order - 1) :] if self.order > 1 else ()
        weight = 1.0
        while True:
            ngram = context + (word,)
            value = self.prob[len(ngram)].get(ngram)
            if value is not None:
                return weight * value
            if not context:
                return weight * self.prob[1][(UNK,)]
            weight *= self.backoff[len(context)].get(context, 1.0)
            context = context[1:]

    def sentence_log10(self, words: list[str]) -> float:
        """log10 P(words </s> | <s>), unknown words as ``<unk>``."""
        known = self.prob[1]
        tokens = [w if (w,) in known else UNK for w in words] + [EOS]
        history = [BOS]
        total = 0.0
        for token in tokens:
            total += math.log10(self.probability(token, tuple(history)))
            history.append(token)
        return total


def _count(sentences: Iterable[list[str]], order: int) -> list[dict]:
    counts = [None] + [defaultdict(int) for _ in range(order)]
    for words in sentences:
        tokens = [BOS] + list(words) + [EOS]
        for n in range(1, order + 1):
            table = counts[n]
            for i in range(len(tokens) - n + 1):
                table[tuple(tokens[i : i + n])] += 1
    return counts


def _adjusted_counts(raw: list[dict], order: int) -> list[dict]:
    """Highest order: raw counts. Lower orders: the number of distinct left extensions,
    except n-grams starting with <s>, which cannot be extended and keep their raw count."""
    adjusted = [None] * (order + 1)
    adjusted[order] = dict(raw[order])
    for n in range(order - 1, 0, -1):
        table = {ngram: count for ngram, count in raw[n].items() if ngram[0] == BOS}
        continuation = defaultdict(int)
        for longer in raw[n + 1]:
            continuation[longer[1:]] += 1
        for ngram, count in continuation.items():
            if ngram[0] != BOS:
                table[ngram] = count
        adjusted[n] = table
    return adjusted


def _discounts(counts: dict) -> tuple[tuple[float, float, float], bool]:
    t = [0] * 5
    for count in counts.values():
        if count <= 4:
            t[count] += 1
    try:
        y = t[1] / (t[1] + 2 * t[2])
        d = (1 - 2 * y * t[2] / t[1], 2 - 3 * y * t[3] / t[2], 3 - 4 * y * t[4] / t[3])
    except ZeroDivisionError:
        return FALLBACK_DISCOUNTS, True
    if not all(0 < value < k + 1 for k, value in enumerate(d)):
        return FALLBACK_DISCOUNTS, True
    return d, False


def estimate(sentences: Iterable[list[str]], order: int) -> NGramModel:
    """Estimate an interpolated modified Kneser-Ney model of ``order`` from tokenised sentences."""
    if order < 1:
        raise LanguageModelError(f"order must be at least 1, got {order}")
    raw = _count(sentences, order)
    if not raw[1]:
        raise LanguageModelError("no text to learn from")
    adjusted = _adjusted_counts(raw, order)
    model = NGramModel(order=order, prob=[None] * (order + 1), backoff=[None] * (order + 1))
    model.discounts = [None] * (order + 1)
    for n in range(1, order + 1):
        table = {k: v for k, v in adjusted[n].items() if k != (BOS,)}
        discounts, fell_back = _discounts(table)
        model.discounts[n] = discounts
        if fell_back:
            model.fallback_orders.append(n)
        totals = defaultdict(float)
        buckets = defaultdict(lambda: [0, 0, 0])
        for ngram, count in table.items():
            totals[ngram[:-1]] += count
            buckets[ngram[:-1]][min(count, 3) - 1] += 1
        model.prob[n] = {
            ngram: (count - discounts[min(count, 3) - 1]) / totals[ngram[:-1]]
            for ngram, count in table.items()
        }
        model.backoff[n - 1] = {
            context: sum(d * b for d, b in zip(discounts, buckets[context], strict=False)) / totals[context]
            for context in totals
        }
    _interpolate(model)
    return model


def _interpolate(model: NGramModel) -> None:
    """Turn discounted pseudo-probabilities into interpolated probabilities, lowest order first."""
    unigrams = model.prob[1]
    unigrams.setdefault((UNK,), 0.0)
    vocabulary = len(unigrams)  # every predictable word: the text's words, </s> and <unk>
    leftover = model.backoff[0][()]
    for ngram in unigrams:
        unigrams[ngram] += leftover / vocabulary
    for n in range(2, model.order + 1):
        lower = model.prob[n - 1]
        backoff = model.backoff[n - 1]
        for ngram in model.prob[n]:
            model.prob[n][ngram] += backoff[ngram[:-1]] * lower[ngram[1:]]
    # <s> is never predicted; ARPA lists it (as a context) with probability zero.
    unigrams.pop((BOS,), None)
    model.backoff[0] = {}


def write_arpa(model: NGramModel, path) -> None:
    """Write ``model`` in ARPA format (log10 values; ``<s>`` with -99 as KenLM writes it)."""
    order = model.order
    sections = []
    for n in range(1, order + 1):
        entries = dict(model.prob[n])
        if n == 1:
            entries[(BOS,)] = None
        lines = []
        for ngram in sorted(entries, key=lambda g: (g != (BOS,), g)):
            value = entries[ngram]
            logp = -99.0 if value is None else math.log10(value)
            line = f"{logp:.7g}\t{' '.join(ngram)}"
            if n < order:
                backoff = model.backoff[n].get(ngram)
                if backoff is not None and backoff > 0:
                    line += f"\t{math.log10(backoff):.7g}"
                elif n < order:
                    line += "\t0"
            lines.append(line)
        sections.append((n, lines))
    with open(path, "w", encoding="utf-8") as out:
        out.write("\\data\\\n")
        for n, lines in sections:
            out.write(f"ngram {n}={len(lines)}\n")
        for n, lines in sections:
            out.write(f"\n\\{n}-grams:\n")
            out.write("\n".join(lines))
            out.write("\n")
        out.write("\n\\end\\\n")
