"""CTC beam search with a KenLM language model, through flashlight-text (``decoder.type: beam``).

Two modes, as ``decoder.lexicon`` says:

- lexicon: words come from the vocabulary (a trie of their spellings) and the
  word n-gram LM scores each completed word; ``lm_beta`` is the score per word.
- lexicon-free: any spelling; a character n-gram LM scores every character
  (space written ``|``); ``lm_beta`` is the score per word boundary.

Hot words (``hot_words`` ``{word: boost}``, the client's ``--hot_words``) add their
boost to the word's LM score in both modes (see ``_hot_words``); with a lexicon, a hot
word missing from the vocabulary joins it, scored as the LM's ``<unk>`` plus its boost.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from native_client.alphabet import Labels
from native_client.decoders import Decoder, DecoderSpec
from native_client.decoders.greedy import log_softmax
from native_client.quiet import filtered_stderr
from native_client.transcripts import Candidate, word_timings

UNK_WORD = "<unk>"


@dataclass(frozen=True)
class BeamSettings:
    """Beam search settings (``decoder`` in the config and the export metadata)."""

    beam_width: int = 256
    beam_threshold: float = 15.0
    beam_size_token: int = 8
    lm_alpha: float = 1.5
    lm_beta: float = 2.25
    lexicon: bool = True

    @classmethod
    def from_dict(cls, values: dict) -> BeamSettings:
        """Settings from a mapping; unknown keys are ignored, missing ones keep their defaults."""
        return cls(**{name: values[name] for name in cls.__dataclass_fields__ if name in values})


# Frames decoded at once (60 s at 100 frames per second); a longer input is cut at pauses.
SEGMENT_FRAMES = 6000


def _checked_hot_words(hot_words: Mapping[str, float] | None, alphabet: Labels) -> dict[str, float]:
    if not hot_words:
        return {}
    from native_client.decoders._hot_words import check_hot_words

    return check_hot_words(hot_words, alphabet)


def pause_segments(logits: np.ndarray, quiet: Sequence[int], max_frames: int) -> list[tuple[int, int]]:
    """(start, stop) frame ranges of at most ``max_frames`` covering ``logits``: each cut is in the middle
    of the longest run of frames whose best label is in ``quiet`` (blank, space) within the second half
    of the range, or at its end when there is no such frame."""
    segments, start, total = [], 0, len(logits)
    while total - start > max_frames:
        low, high = start + max_frames // 2, start + max_frames
        is_quiet = np.isin(np.argmax(logits[low:high], axis=1), quiet)
        best_length, best_cut, run = 0, high, 0
        for offset, flag in enumerate(is_quiet):
            run = run + 1 if flag else 0
            if run > best_length:
                best_length, best_cut = run, low + offset - run // 2
        segments.append((start, best_cut))
        start = best_cut
    segments.append((start, total))
    return segments


# What KenLM writes to stderr while it reads an ARPA file: a hint to build a binary, the file's name, a
# progress bar. Informational; anything else it writes (an error) passes.
KENLM_NOISE = re.compile(
    r"^(Loading the LM will be faster if you build a binary file\.|Reading \S|-+5-+10-+|\*+$)"
)


def _load_kenlm(kenlm_class, path: str, dictionary):
    """KenLM's model of ``path``; ValueError naming the file when KenLM cannot read it (its own message
    may quote the file's bytes, which need not even be UTF-8)."""
    try:
        with filtered_stderr(KENLM_NOISE):  # an ARPA file's loading banner and progress bar
            return kenlm_class(path, dictionary)
    except (RuntimeError, ValueError) as error:  # UnicodeDecodeError is a ValueError
        detail = str(error).splitlines()[0][:200] if not isinstance(error, UnicodeDecodeError) else "not text"
        raise ValueError(f"{path}: KenLM cannot read this language model ({detail})") from None


def _label_starts(path: Sequence[int], blank: int) -> list[int]:
    """The frame where each label of a CTC frame path starts (repeats merged, blanks dropped)."""
    return [
        frame
        for frame, label in enumerate(path)
        if 0 <= label != blank and (frame == 0 or path[frame - 1] != label)
    ]


def _unfinished_character(labels: Sequence[int]) -> int:
    """How many of the byte labels (label ``i`` is byte ``i + 1``) at the end of ``labels`` begin a UTF-8
    character without finishing it; 0 when the last character is whole (or the bytes are no UTF-8)."""
    for back in range(1, min(4, len(labels)) + 1):
        byte = labels[-back] + 1
        if byte & 0xC0 != 0x80:  # not a continuation byte: the character's first byte
            length = 1 if byte < 0xC0 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if back < length else 0
    return 0


class BeamDecoder(Decoder):
    """Beam search over CTC logits with an n-gram LM (see the module docstring for the two modes)."""

    name = "beam+lm"

    def __init__(
        self,
        alphabet: Labels,
        lm_path: str | Path,
        settings: BeamSettings,
        vocabulary: Sequence[str] | None = None,
        hot_words: Mapping[str, float] | None = None,
    ):
        from flashlight.lib.text.decoder import SmearingMode, Trie
        from flashlight.lib.text.decoder.kenlm import KenLM
        from flashlight.lib.text.dictionary import Dictionary, create_word_dict

        if alphabet.space_index is None:
            raise ValueError("beam search needs the space character in the alphabet as the word separator")
        self.alphabet = alphabet
        self.settings = settings
        self.lm_path = str(lm_path)
        # One token per label (a character, or a byte as two hex digits; the space as ``|``): the
        # character LM's words, as the LanguageModel stage wrote them (``Labels.to_tokens``).
        self.tokens = [*alphabet.tokens, "<blank>"]
        self.space = alphabet.space_index
        self.blank = alphabet.blank_index
        token_dict = Dictionary(self.tokens)
        tokens_per_frame = min(settings.beam_size_token or len(self.tokens), len(self.tokens))
        hot = _checked_hot_words(hot_words, alphabet)
        self.hot_words = hot
        if settings.lexicon:
            if vocabulary is None:
                raise ValueError("lexicon decoding needs a vocabulary")
            words = [
                w
                for w in dict.fromkeys([*vocabulary, *hot])
                if w and " " not in w and not alphabet.unknown_characters(w)
            ]
            lexicon = {w: [list(w)] for w in words}
            lexicon[UNK_WORD] = [[]]
            self.word_dict = create_word_dict(lexicon)
            self.lm = _load_kenlm(KenLM, self.lm_path, self.word_dict)
            if hot:
                from native_client.decoders._hot_words import LOG10_E, WordBoostLM

                boosts = {self.word_dict.get_index(w): boost * LOG10_E for w, boost in hot.items()}
                self.lm = WordBoostLM(self.lm, boosts)
            trie = Trie(len(self.tokens), self.space)
            start = self.lm.start(False)
            unknown_score, unknown = self.lm.score(start, self.word_dict.get_index(UNK_WORD))[1], 0
            for word in words:
                index = self.word_dict.get_index(word)
                _, score = self.lm.score(start, index)
                unknown += score == unknown_score
                # Spellings end with the separator (space), as flashlight expects: a word ends when its
                # separator is read, so a last letter held over several frames stays one letter.
                trie.insert(alphabet.encode(word) + [self.space], index, score)
            if words and unknown > len(words) / 2:  # KenLM scores a word it lacks as <unk>
                raise ValueError(
                    f"{lm_path}: {unknown} of the {len(words)} vocabulary words are not in the language "
                    f"model: a vocabulary (or .scorer) made for another alphabet?"
                )
            trie.smear(SmearingMode.MAX)
            self.trie = trie  # the decoder only borrows it
            self.vocabulary_size = len(words)
        else:
            self.word_dict = None
            self.trie = None
            self.lm = _load_kenlm(KenLM, self.lm_path, token_dict)
            if hot:
                from native_client.decoders._hot_words import SpellingBoostLM

                self.lm = SpellingBoostLM(self.lm, alphabet, hot)
            self.vocabulary_size = None
        self.tokens_per_frame = tokens_per_frame
        self.decoder = self._make_decoder()

    @classmethod
    def from_spec(cls, spec: DecoderSpec) -> BeamDecoder:
        """The beam decoder over ``spec.lm`` with ``spec.settings`` (``BeamSettings`` keys and
        ``hot_words``); the vocabulary is read only for lexicon decoding."""
        if spec.lm is None:
            raise ValueError("beam search needs a language model, and none was given")
        settings = BeamSettings.from_dict(spec.settings)
        vocabulary = spec.words() if settings.lexicon else None
        return cls(spec.alphabet(), spec.lm, settings, vocabulary, spec.settings.get("hot_words"))

    def _make_decoder(self):
        """The flashlight decoder for ``self.settings`` over the loaded LM (and trie); cheap to make."""
        from flashlight.lib.text.decoder import (
            CriterionType,
            LexiconDecoder,
            LexiconDecoderOptions,
            LexiconFreeDecoder,
            LexiconFreeDecoderOptions,
        )

        settings = self.settings
        if self.word_dict is not None:
            options = LexiconDecoderOptions(
                beam_size=settings.beam_width,
                beam_size_token=self.tokens_per_frame,
                beam_threshold=settings.beam_threshold,
                lm_weight=settings.lm_alpha,
                word_score=settings.lm_beta,
                unk_score=-math.inf,
                sil_score=0.0,
                log_add=False,
                criterion_type=CriterionType.CTC,
            )
            return LexiconDecoder(
                options,
                self.trie,
                self.lm,
                self.space,
                self.blank,
                self.word_dict.get_index(UNK_WORD),
                [],
                False,
            )
        options = LexiconFreeDecoderOptions(
            beam_size=settings.beam_width,
            beam_size_token=self.tokens_per_frame,
            beam_threshold=settings.beam_threshold,
            lm_weight=settings.lm_alpha,
            sil_score=settings.lm_beta,
            log_add=False,
            criterion_type=CriterionType.CTC,
        )
        return LexiconFreeDecoder(options, self.lm, self.space, self.blank, [])

    def reweighted(self, lm_alpha: float, lm_beta: float) -> BeamDecoder:
        """The same decoder with other LM weights, sharing the loaded LM and trie (no reloading)."""
        other = copy.copy(self)
        other.settings = dataclasses.replace(self.settings, lm_alpha=lm_alpha, lm_beta=lm_beta)
        other.decoder = other._make_decoder()
        return other

    def decode(self, logits: np.ndarray) -> str:
        """The best transcript of ``logits`` ``[time, classes]``. Longer than ``SEGMENT_FRAMES``, the
        logits are cut at pauses and the segments decoded one after another: the decoder keeps state for
        every frame (about 19 KB each at beam 1024), which a two-hour recording would not fit."""
        return " ".join(text for text, _, _, _ in self._segments(logits) if text)

    def candidates(self, logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
        """Up to ``count`` distinct transcripts, best first, with confidence (the decoder's score) and word
        timings from each one's frame path. An input cut into segments (see ``decode``) has one candidate."""
        if len(logits) <= SEGMENT_FRAMES:
            return self._candidates(logits, count, seconds_per_frame, 0) or [Candidate("", 0.0, ())]
        parts = self._segments(logits)
        return [
            Candidate(
                " ".join(text for text, _, _, _ in parts if text),
                sum(score for _, score, _, _ in parts),
                tuple(
                    w
                    for _, _, first, path in parts
                    for w in word_timings(path, self.alphabet, seconds_per_frame, first)
                ),
            )
        ]

    def _segments(self, logits: np.ndarray) -> list[tuple[str, float, int, list[int]]]:
        """(text, score, first frame, frame path) of the best result of each segment of ``logits`` (see
        ``decode``). Lexicon-free over bytes, a cut can fall between the bytes of one character, which
        each side alone would drop as invalid UTF-8: then the frames of the word it is in (from the last
        space; the whole segment when there is none) move to the next segment, and decode there whole."""
        segments = pause_segments(logits, (self.blank, self.space), SEGMENT_FRAMES)
        parts, carry = [], []
        for index, (start, stop) in enumerate(segments):
            found = self._search(logits[start:stop])
            if not found:
                continue
            path = carry + list(found[0].tokens)[1 : stop - start + 1]  # the decoder pads one token first
            first, carry = start - len(carry), []
            if self.word_dict is not None:
                parts.append((self._text(found[0]), float(found[0].score), first, path))
                continue
            if self.alphabet.output == "bytes" and index < len(segments) - 1:
                starts = _label_starts(path, self.blank)
                if _unfinished_character([path[f] for f in starts]):
                    spaces = [f for f in starts if path[f] == self.space]
                    split = next(f for f in starts if f > spaces[-1]) if spaces else 0
                    path, carry = path[:split], path[split:]
            parts.append((self._path_text(path), float(found[0].score), first, path))
        return parts

    def _candidates(
        self, logits: np.ndarray, count: int, seconds_per_frame: float, first_frame: int
    ) -> list[Candidate]:
        found, seen = [], set()
        probabilities = log_softmax(np.asarray(logits, dtype=np.float32))
        for result in self._search(logits):
            text = self._text(result)
            if text in seen:
                continue
            seen.add(text)
            path = list(result.tokens)[1 : len(logits) + 1]  # the decoder pads one token before the frames
            found.append(
                Candidate(
                    text,
                    float(result.score),
                    word_timings(path, self.alphabet, seconds_per_frame, first_frame, probabilities),
                )
            )
            if len(found) == count:
                break
        return found

    def _text(self, result) -> str:
        if self.word_dict is not None:
            return " ".join(self.word_dict.get_entry(w) for w in result.words if w >= 0)
        labels = [t for t, _ in itertools.groupby(result.tokens) if 0 <= t != self.blank]
        return " ".join(self.alphabet.decode(labels).split())

    def _path_text(self, path: Sequence[int]) -> str:
        """The text of a frame path of lexicon-free decoding: repeats merged, blanks dropped."""
        labels = [t for t, _ in itertools.groupby(path) if 0 <= t != self.blank]
        return " ".join(self.alphabet.decode(labels).split())

    def _search(self, logits: np.ndarray) -> list:
        """The decoder's hypotheses for ``logits`` (one segment), best first."""
        if len(logits) == 0:
            return []
        emissions = log_softmax(np.asarray(logits, dtype=np.float32))
        if self.word_dict is not None:
            # One extra frame that is certainly a space ends the last word (see the trie spellings).
            closing = np.full((1, emissions.shape[1]), -1e4, np.float32)
            closing[0, self.space] = 0.0
            emissions = np.ascontiguousarray(np.concatenate([emissions, closing]))
        return self.decoder.decode(emissions.ctypes.data, emissions.shape[0], emissions.shape[1])


DECODER = BeamDecoder
