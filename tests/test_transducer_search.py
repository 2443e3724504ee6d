"""Transducer decoding in the client (issue 47): greedy and modified beam search over a small random
predictor and joiner in numpy, against every alignment spelt out, fed whole or in chunks."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from native_client.alphabet import make_alphabet
from native_client.transducer_search import (
    GreedySearch,
    Hypothesis,
    ModifiedBeamSearch,
    candidates,
    word_timings,
)


class ToyParts:
    """A random stateless predictor (embeddings of the last two labels, the blank's zero) and joiner."""

    context_size = 2

    def __init__(self, classes: int, seed: int, joint: int = 6, blank_bias: float = 0.0):
        rng = np.random.default_rng(seed)
        self.blank = classes - 1
        self.embeddings = rng.normal(size=(classes, joint))
        self.embeddings[self.blank] = 0.0
        self.mix = rng.normal(size=(2, joint, joint))
        self.output = rng.normal(size=(joint, classes)) * 2
        self.output_bias = np.zeros(classes)
        self.output_bias[self.blank] = blank_bias
        self.calls = 0

    def predict(self, contexts):
        assert contexts.dtype == np.int32 and contexts.shape[1] == 2
        return np.tanh(sum(self.embeddings[contexts[:, k]] @ self.mix[k] for k in range(2)))

    def join(self, frame, predicted):
        self.calls += 1
        return np.tanh(frame + predicted) @ self.output + self.output_bias


def _frames(count: int, seed: int, joint: int = 6):
    return np.random.default_rng(seed).normal(size=(count, joint))


def _log_softmax(x):
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def _one_label_a_frame_totals(parts: ToyParts, frames) -> dict:
    """Every choice of blank or one label per frame spelt out; the total log probability of each label
    sequence (what modified beam search approximates, exactly when nothing is pruned)."""
    totals: dict = {}
    for choice in itertools.product(range(parts.blank + 1), repeat=len(frames)):
        labels, score = (), 0.0
        for frame, c in zip(frames, choice, strict=True):
            context = ((parts.blank,) * 2 + labels)[-2:]
            predicted = parts.predict(np.array([context], np.int32))
            score += _log_softmax(parts.join(frame, predicted))[0, c]
            if c != parts.blank:
                labels += (c,)
        totals[labels] = np.logaddexp(totals.get(labels, -np.inf), score)
    return totals


def test_an_unpruned_modified_beam_search_finds_every_sequence_s_total():
    parts = ToyParts(classes=3, seed=1)
    frames = _frames(4, seed=2)
    search = ModifiedBeamSearch(parts, beam=100)
    search.advance(frames)
    want = _one_label_a_frame_totals(parts, frames)
    found = {h.labels: h.log_prob for h in search.hypotheses()}
    assert set(found) == set(want)
    for labels, total in want.items():
        assert found[labels] == pytest.approx(total)
    best = search.hypotheses()[0]
    assert best.labels == max(want, key=want.get)


def test_a_beam_of_one_is_greedy_search_with_one_label_a_frame():
    parts = ToyParts(classes=5, seed=3)
    frames = _frames(30, seed=4)
    beam, greedy = ModifiedBeamSearch(parts, beam=1), GreedySearch(parts, max_symbols=1)
    beam.advance(frames)
    greedy.advance(frames)
    (one,), (best,) = beam.hypotheses(), greedy.hypotheses()
    assert (one.labels, one.frames) == (best.labels, best.frames)
    assert one.log_prob == pytest.approx(best.log_prob)
    assert best.labels  # the toy emits something


@pytest.mark.parametrize("make", [lambda p: GreedySearch(p, 3), lambda p: ModifiedBeamSearch(p, 4)])
def test_chunks_give_what_the_whole_utterance_gives(make):
    parts = ToyParts(classes=6, seed=5)
    frames = _frames(25, seed=6)
    whole, chunked = make(parts), make(parts)
    whole.advance(frames)
    for start in range(0, 25, 4):
        chunked.advance(frames[start : start + 4])
    assert chunked.hypotheses() == whole.hypotheses()


def test_greedy_search_emits_at_most_max_symbols_a_frame():
    parts = ToyParts(classes=4, seed=7, blank_bias=-50.0)  # the blank never wins
    search = GreedySearch(parts, max_symbols=3)
    search.advance(_frames(5, seed=8))
    best = search.hypotheses()[0]
    assert len(best.labels) == 15
    assert best.frames == tuple(f for f in range(5) for _ in range(3))


def test_a_greedy_search_that_always_sees_the_blank_emits_nothing():
    parts = ToyParts(classes=4, seed=9, blank_bias=50.0)
    search = GreedySearch(parts)
    search.advance(_frames(7, seed=10))
    assert search.hypotheses()[0].labels == ()
    assert parts.calls == 7  # one joiner call a frame


def test_words_take_their_labels_frames_and_probabilities():
    alphabet = make_alphabet("characters", (" ", "a", "b"))
    space, a, b = 0, 1, 2
    hypothesis = Hypothesis(
        labels=(a, b, space, b, b),
        frames=(2, 3, 5, 9, 9),
        label_log_probs=(np.log(0.5), np.log(0.5), 0.0, np.log(0.9), np.log(0.4)),
        log_prob=-3.0,
    )
    words = word_timings(hypothesis, alphabet, seconds_per_frame=0.04)
    assert [w.word for w in words] == ["ab", "bb"]
    assert words[0].start_time == pytest.approx(0.08) and words[0].duration == pytest.approx(0.08)
    assert words[1].start_time == pytest.approx(0.36) and words[1].duration == pytest.approx(0.04)
    assert words[0].confidence == pytest.approx(0.5) and words[1].confidence == pytest.approx(0.6)
    same_text = replace(hypothesis, log_prob=-4.0)
    other = Hypothesis((a,), (1,), (0.0,), -5.0)
    found = candidates([hypothesis, same_text, other], alphabet, 5, 0.04)
    assert [c.text for c in found] == ["ab bb", "a"]  # one candidate per text, the likelier
    assert found[0].confidence == -3.0
    assert [c.text for c in candidates([], alphabet, 3, 0.04)] == [""]


def test_settings_below_one_are_refused():
    parts = ToyParts(classes=3, seed=0)
    with pytest.raises(ValueError, match="max_symbols"):
        GreedySearch(parts, max_symbols=0)
    with pytest.raises(ValueError, match="beam"):
        ModifiedBeamSearch(parts, beam=0)
