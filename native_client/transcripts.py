"""Candidate transcripts with word timings, as DeepSpeech's ``--extended``/``--json`` report them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from native_client.alphabet import Labels


@dataclass(frozen=True)
class WordTiming:
    """One word: its start and duration in seconds (CTC frames of its letters on the best path)."""

    word: str
    start_time: float
    duration: float


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
            "words": [
                {"word": w.word, "start_time": round(w.start_time, 3), "duration": round(w.duration, 3)}
                for w in self.words
            ],
        }


def word_timings(
    frame_labels: Sequence[int], alphabet: Labels, seconds_per_frame: float, first_frame: int = 0
) -> tuple[WordTiming, ...]:
    """Words of a per-frame label path (CTC: repeats merged, blanks dropped, the space separates words).
    A word starts at the frame of its first label and lasts until the frame of its last one; its text is
    its labels decoded (so a word of byte labels is its UTF-8 text; one whose bytes decode to nothing is
    left out). A language written without spaces has one word per stretch between pauses."""
    blank, space = alphabet.blank_index, alphabet.space_index
    words: list[WordTiming] = []
    letters: list[int] = []
    start = end = 0
    previous = blank

    def close() -> None:
        text = alphabet.decode(letters)
        if text:
            words.append(
                WordTiming(
                    text,
                    (first_frame + start) * seconds_per_frame,
                    (end - start + 1) * seconds_per_frame,
                )
            )
        letters.clear()

    for frame, label in enumerate(frame_labels):
        label = int(label)
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
