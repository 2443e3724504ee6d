"""Subtitles (SRT, WebVTT) from utterances and their words.

Utterances the length limit cut (``cut``) are joined with the next one into one run of words, so a
sentence is not broken at the cut. A run's words are grouped into cues of at most ``max_chars`` characters
and ``max_seconds`` (a word heard wholly outside the detected speech, clamped to its edge, never
starts a cue of its own); the first cue of a run starts where the voice activity detector heard its speech
start and the last one ends where it heard it end (those edges are sharper than CTC's letter spikes,
which fall anywhere in a letter); cue edges inside a run are the words' own times.
"""

from __future__ import annotations

from dataclasses import dataclass

from native_client.transcripts import Candidate

MAX_CHARS = 84  # two lines of 42, the usual limit
MAX_SECONDS = 7.0


@dataclass(frozen=True)
class Utterance:
    """One utterance of a long recording: its speech from ``start`` to ``end`` (seconds from the start of
    the file), its best candidate (word times from the start of the file) and whether the length limit
    cut it (``cut``) rather than a pause."""

    start: float
    end: float
    candidate: Candidate
    cut: bool = False


@dataclass(frozen=True)
class Cue:
    """One subtitle: from ``start`` to ``end`` seconds, its text."""

    start: float
    end: float
    text: str


def _runs(utterances: list[Utterance]) -> list[list[Utterance]]:
    """Utterances grouped so that a cut one and the next are in the same run."""
    runs: list[list[Utterance]] = []
    joined = False
    for utterance in utterances:
        if joined:
            runs[-1].append(utterance)
        else:
            runs.append([utterance])
        joined = utterance.cut
    return runs


def cues(
    utterances: list[Utterance], max_chars: int = MAX_CHARS, max_seconds: float = MAX_SECONDS
) -> list[Cue]:
    """The cues of ``utterances`` (see the module docstring); a run without words has none."""
    found: list[Cue] = []
    for run in _runs(utterances):
        # (word, start, end), each clamped to its utterance's speech
        words = [
            (
                w.word,
                min(max(w.start_time, u.start), u.end),
                min(max(w.start_time + w.duration, u.start), u.end),
            )
            for u in run
            for w in u.candidate.words
        ]
        if not words:
            continue
        groups: list[list[tuple]] = [[]]
        for word in words:
            group = groups[-1]
            text = " ".join(w for w, _, _ in group + [word])
            # A word wholly outside the detected speech (clamped to nothing) stays with its neighbours.
            long = bool(group) and (len(text) > max_chars or word[2] - group[0][1] > max_seconds)
            spans = word[2] > word[1] and any(end > start for _, start, end in group)
            if long and spans:
                groups.append([word])
            else:
                group.append(word)
        for index, group in enumerate(groups):
            start = run[0].start if index == 0 else group[0][1]
            end = run[-1].end if index == len(groups) - 1 else group[-1][2]
            found.append(Cue(start, max(end, start), " ".join(w for w, _, _ in group)))
    return found


def _timestamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def to_srt(found: list[Cue]) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, a blank line after each."""
    return "".join(
        f"{n}\n{_timestamp(c.start, ',')} --> {_timestamp(c.end, ',')}\n{c.text}\n\n"
        for n, c in enumerate(found, 1)
    )


def to_vtt(found: list[Cue]) -> str:
    """WebVTT: the ``WEBVTT`` header, then cues with ``HH:MM:SS.mmm`` times."""
    return "WEBVTT\n\n" + "".join(
        f"{_timestamp(c.start, '.')} --> {_timestamp(c.end, '.')}\n{c.text}\n\n" for c in found
    )
