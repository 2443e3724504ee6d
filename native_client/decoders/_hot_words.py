"""Hot words for the beam decoder: language models that add a boost to chosen words' scores.

DeepSpeech 0.9's ``--hot_words word:boost`` adds ``boost`` to the natural log of a
word's LM probability before the LM weight (``lm_alpha``) multiplies it; so do these
wrappers (KenLM's scores in flashlight are log10, so the boost is converted). Unlike
DeepSpeech's decoder, only the hot word itself is boosted (DeepSpeech also boosted
every word scored while a hot word was in the n-gram context), and a positive boost
also raises the word's look-ahead while it is being spelled, so the beam keeps a hot
word alive before it is complete (DeepSpeech's docs say a boosted word sharing no
prefix with the beam's hypotheses never appears).

flashlight-text lets a Python ``LM`` subclass stand in for KenLM; written by hand
because flashlight has no hot-word option. The wrapper sits in the search loop, so
it is used only when hot words are given, and it costs: on the sample test split
(bench/hot_words.py, a busy 2-core AMD EPYC) lexicon decoding took about 2x as long
(the LM is asked once per completed word), lexicon-free about 12x (it is asked for
every letter each hypothesis tries, about 140,000 times per audio second at beam 256,
each a call from C++ into Python).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from flashlight.lib.text.decoder import LM, LMState

from native_client.alphabet import Labels

LOG10_E = math.log10(math.e)  # a natural-log boost in KenLM's log10 units


def check_hot_words(hot_words: Mapping[str, float], alphabet: Labels) -> dict[str, float]:
    """``{word: boost}`` checked: one word each (no spaces), spelt with the alphabet's letters (any text
    with byte labels), a finite boost. Raises ValueError naming the first word that is not. The words
    are taken as they are: the client normalises them first (``native_client.export_decoder``)."""
    checked = {}
    for word, boost in hot_words.items():
        if not word or any(ch.isspace() for ch in word):
            raise ValueError(f"hot word {word!r}: expected one word without spaces")
        unknown = alphabet.unknown_characters(word)
        if unknown:
            raise ValueError(f"hot word {word!r}: characters not in the alphabet: {''.join(unknown)!r}")
        if not math.isfinite(float(boost)):
            raise ValueError(f"hot word {word!r}: boost {boost!r} is not a finite number")
        checked[word] = float(boost)
    return checked


class WordBoostLM(LM):
    """A word LM (lexicon decoding) whose score of each hot word carries its boost.

    ``boosts``: ``{word index in the decoder's word dictionary: boost in log10 units}``. The lexicon
    trie is built from this LM's scores, so its look-ahead carries the boosts too.
    """

    def __init__(self, base: LM, boosts: Mapping[int, float]):
        LM.__init__(self)
        self.base = base
        self.boosts = dict(boosts)

    def start(self, start_with_nothing: bool):
        """The base LM's start state."""
        return self.base.start(start_with_nothing)

    def score(self, state, token: int):
        """The base LM's next state and score, plus ``token``'s boost."""
        next_state, score = self.base.score(state, token)
        return next_state, score + self.boosts.get(token, 0.0)

    def finish(self, state):
        """The base LM's end-of-sentence state and score."""
        return self.base.finish(state)


class SpellingBoostLM(LM):
    """A character LM (lexicon-free decoding) that boosts hot words as they are spelt.

    Each label that continues a hot word with a positive boost earns that word's boost
    over its length (the largest such share when several hot words share the prefix);
    the word separator then settles the account: the whole boost if the letters since
    the last separator spell a hot word (negative boosts act only there), nothing
    otherwise (what was advanced is taken back). So a completed hot word gets exactly its
    boost, and a hypothesis that only began one gets nothing.

    States are this LM's own (a tree of ``LMState`` nodes, one per spelling, which the
    decoder compares by identity); each maps to the base LM's state and the letters of
    the current word. They are dropped when a new utterance starts.
    """

    def __init__(self, base: LM, alphabet: Labels, hot_words: Mapping[str, float]):
        LM.__init__(self)
        self.base = base
        self.separator = alphabet.space_index
        # Words as label sequences: a hot word is spelt label by label (a byte at a time with byte labels).
        self.boosts = {tuple(alphabet.encode(word)): boost * LOG10_E for word, boost in hot_words.items()}
        self.advance: dict[tuple[int, ...], float] = {}  # prefix -> look-ahead bonus it has earned
        for word, boost in self.boosts.items():
            if boost > 0:
                for end in range(1, len(word) + 1):
                    share = boost * end / len(word)
                    self.advance[word[:end]] = max(self.advance.get(word[:end], 0.0), share)
        # state -> (base LM state, letters of the current word, {token: (child, score)}): the decoder asks
        # for the same (state, token) again at every frame the hypothesis survives
        self._states: dict = {}

    def start(self, start_with_nothing: bool):
        """A fresh root state over the base LM's start state (forgetting the last utterance's states)."""
        root = LMState()
        self._states = {root: (self.base.start(start_with_nothing), (), {})}
        return root

    def _settle(self, word: tuple[int, ...]) -> float:
        return self.boosts.get(word, 0.0) - self.advance.get(word, 0.0)

    def score(self, state, token: int):
        """The base LM's score of ``token`` plus the change of the hot-word bonus it makes."""
        base_state, word, scored = self._states[state]
        known = scored.get(token)
        if known is not None:
            return known
        next_base, score = self.base.score(base_state, token)
        if token == self.separator:
            score, next_word = score + self._settle(word), ()
        else:
            next_word = (*word, token)
            score += self.advance.get(next_word, 0.0) - self.advance.get(word, 0.0)
        child = state.child(token)
        self._states[child] = (next_base, next_word, {})
        scored[token] = child, score
        return child, score

    def finish(self, state):
        """The base LM's end-of-sentence score, settling a last word that has no separator after it."""
        base_state, word, _ = self._states[state]
        end_state, score = self.base.finish(base_state)
        child = state.child(-1)
        self._states[child] = (end_state, (), {})
        return child, score + self._settle(word)
