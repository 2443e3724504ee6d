"""Cutting one long recording into utterances with its text: CTC segmentation over an aligner's posteriors.

``split_text`` cuts the recording's text into units (sentence ends and line breaks; a unit longer than
the longest utterance wanted is cut at word boundaries); ``align_units`` finds each unit's start and end
in the aligner's log-posteriors with the ``ctc-segmentation`` package (the implementation ESPnet and NeMo
use) and scores it; ``merge_units`` joins aligned neighbours of one line up to ``max_seconds``.

Written here, because the package lacks them:

- **Windows**: the package's dynamic programming holds a table of (band of frames) x (characters of
  the text), which for an hour of speech (about 50,000 characters) is gigabytes. ``align_units`` aligns
  a window of audio at a time (``WINDOW_S``) with the units the speaking rate says it holds, keeps all
  but the last unit found there and starts the next window where the last one kept ends: memory stays
  flat however long the recording. A window that holds none of its units is aligned again with up to
  eight times the text (what is read after an unread page is found, the page taken out); if it still
  holds none, half a window of audio is passed (or, when the text lags far behind, its first unit).
- **Text that is not in the audio**: CTC segmentation places every character of its text somewhere,
  so a paragraph that is never read squeezes into its neighbours' audio and spoils them. Within a window
  the worst unit below ``min_score`` is taken out and the window aligned again, until every unit left
  scores at least ``min_score``: the unread text is rejected, its neighbours keep their places.
- **Speech that is not in the text** (a talk the transcript leaves out, music): the package's path must
  cover every frame between two units with a blank or a character, whose log-probabilities in speech
  are very low, so it would rather squeeze the neighbours over the gap. Each unit is aligned after a
  "garbage" class of constant log-probability (``GARBAGE_LOG_PROB``) that can take any stretch of audio
  at that cost; where nothing fits in a whole window, the next one starts half a window on.
- **Boundaries and score**: the package's utterance boundaries pad up to 0.5 s into the neighbours'
  silence and score that padding too; here a unit runs from its first to its last character's frame,
  padded by ``PAD_S`` before and ``PAD_AFTER_S`` after into the silence around it (never past the middle
  of the gap to a neighbour),
  and its score is the package's measure over its own frames only: the lowest mean log-probability of
  the path over any ``SCORE_SPAN_S`` of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# Audio aligned at once; the band of frames the dynamic programming keeps per character; the share of a
# window the units given to it are expected to fill (at the recording's mean speaking rate).
WINDOW_S, BAND_S, WINDOW_FILL = 240.0, 60.0, 0.6
# The log-probability per frame of speech the text does not hold (a talk left out of a transcript, music):
# between two units the path may cross any stretch of audio at this cost, so that a stretch the text lacks
# does not pull its neighbours over it. Below a character's on the right path (about -1 for a trained
# model), above a pause's blank or space in speech (-5 and less).
GARBAGE_LOG_PROB = -4.0
# A unit found within this of a window's end may run past it: it waits for the next window.
EDGE_S = 1.0
# Silence kept before a unit's first character and after its last (at most half the gap to a neighbour): more
# after, as a character's spike comes early in its sound and a word's last sound may last a while.
PAD_S, PAD_AFTER_S = 0.15, 0.3
# A unit's score: the lowest mean log-probability over any stretch of this many seconds of its path.
SCORE_SPAN_S = 0.6
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026\u3002\uff01\uff1f])[\"'\u201d\u2019\u00bb)\]]*\s+")
_CLAUSE_END = re.compile(r"(?<=[,;:\u2014])\s+")


@dataclass(frozen=True)
class Unit:
    """A piece of a recording's text aligned as one: its text as written and the line it starts on."""

    text: str
    line: int


@dataclass(frozen=True)
class Aligned:
    """Where a unit was found: seconds from the start of the recording, and its score (a mean log
    probability: 0 is certain; ``min_score`` decides)."""

    start: float
    end: float
    score: float


def split_text(text: str, max_chars: int) -> list[Unit]:
    """The units of a recording's ``text``: each line's sentences (a line break always ends one); a
    sentence longer than ``max_chars`` characters is cut at clause ends, then at spaces, into pieces of at
    most that (a word longer than that stays whole)."""
    units = []
    for number, line in enumerate(text.splitlines(), 1):
        for sentence in _SENTENCE_END.split(line.strip()):
            units += [Unit(piece, number) for piece in _cut(sentence.strip(), max(1, max_chars))]
    return units


def _cut(text: str, max_chars: int) -> list[str]:
    """``text`` in pieces of at most ``max_chars`` characters, cut at clause ends first, then spaces."""
    if len(text) <= max_chars:
        return [text] if text else []
    for separator in (_CLAUSE_END, re.compile(r"\s+")):
        parts = [p for p in separator.split(text) if p]
        if len(parts) > 1:
            pieces, current = [], ""
            for part in parts:
                joined = f"{current} {part}" if current else part
                if current and len(joined) > max_chars:
                    pieces.append(current)
                    current = part
                else:
                    current = joined
            pieces.append(current)
            return [small for piece in pieces for small in _cut(piece, max_chars)]
    return [text]


def align_units(
    log_probs: np.ndarray,
    tokens: list[np.ndarray],
    blank: int,
    seconds_per_frame: float,
    min_score: float,
    space: int | None = None,
    window_s: float = WINDOW_S,
) -> list[Aligned | None]:
    """Where each unit (its label indices in ``tokens``, in order) lies in the recording whose aligner
    log-probabilities are ``log_probs`` ``[frames, classes]`` (may be a memory map: a window is read at a
    time), or None for a unit that is not found there (its score stays below ``min_score``, or it was
    taken out as text the audio does not hold). ``space``: the space label, when the alphabet has one
    (models emit it in pauses: each unit is aligned after one, see ``_segment``). See the module
    docstring. ``window_s``: the audio aligned at once."""
    frames = len(log_probs)
    window = max(1, round(window_s / seconds_per_frame))
    edge = round(EDGE_S / seconds_per_frame)
    rate = sum(len(t) for t in tokens) / max(frames, 1)  # labels per frame, over the whole recording
    before = np.cumsum([0] + [len(t) for t in tokens])  # labels before each unit
    found: list[Aligned | None] = [None] * len(tokens)
    first, start = 0, 0

    def align(units: list[int], begin: int, stop: int) -> tuple[list[int], dict[int, Aligned]]:
        return _align_window(
            log_probs[begin:stop], tokens, units, (blank, space), seconds_per_frame, min_score
        )

    while first < len(tokens):
        end = min(frames, start + window)
        last_window = end == frames
        budget = rate * (end - start) * WINDOW_FILL
        chosen = _units_for(tokens, first, budget, end - start, last_window)
        if not chosen:
            if last_window:  # the audio left cannot hold the next unit: the rest is not in it
                break
            first += 1  # one unit longer than a whole window: it cannot be aligned
            continue
        active, results = align(chosen, start, end)
        for factor in (2, 4, 8):
            if active:
                break
            # none found: the text may not be read here (a preface, a skipped page). With less of the
            # text, what is read before an unread tail is found; with more, what is read after an unread
            # page (which is then taken out).
            fewer = chosen[: max(1, len(chosen) // factor)]
            more = [] if last_window else _units_for(tokens, first, budget * factor, end - start, False)
            for units in (fewer, more):
                if units and units != chosen and not active:
                    active, results = align(units, start, end)
                    chosen = units if active else chosen
        # in a window that is not the last, a unit that may run past its end (its last unit, unless it is
        # the text's last, and one ending near the end) is aligned again in the next window
        ends_before = (end - start - edge) * seconds_per_frame
        kept = (
            active
            if last_window
            else [
                i
                for i in active
                if results[i].end < ends_before and (i != chosen[-1] or i == len(tokens) - 1)
            ]
        )
        if not kept and active and results[active[0]].start * 2 < window * seconds_per_frame:
            kept = active[:1]  # the only unit found, in the window's first half: nothing will cut it
        if kept:
            for index in kept:
                a = results[index]
                found[index] = Aligned(
                    a.start + start * seconds_per_frame, a.end + start * seconds_per_frame, a.score
                )
            # units taken out before the last one kept are not in the audio; later ones get another window
            first = len(tokens) if last_window else kept[-1] + 1
            start = max(start + 1, int(found[kept[-1]].end / seconds_per_frame))
        elif active:
            # found only where the window may cut them: the next window starts where the first of them
            # begins, and the units before it, not found in the audio before it, are not in the audio
            first = active[0]
            start = max(start + 1, int(results[active[0]].start / seconds_per_frame) - edge)
        elif last_window:  # none of them is in the audio left: the first is not
            first += 1
        elif before[first] / max(rate, 1e-9) + window < start:
            first += 1  # the text lags far behind the audio at the mean speaking rate: it is not read
        else:  # none of the text is in this stretch of audio (music, a talk the text leaves out): on
            start += max(1, window // 2)
    return found


def _units_for(
    tokens: list[np.ndarray], first: int, budget: float, frames: int, last_window: bool
) -> list[int]:
    """The units from ``first`` a window of ``frames`` takes: as many as the ``budget`` of labels holds (at
    least two, so that one is kept), or in the last window every one left; never more than its frames can
    hold (a CTC path takes a frame per label, one between repeats, and the separators between units)."""
    chosen, total, needed = [], 0, 2
    for index in range(first, len(tokens)):
        needed += min_frames(tokens[index]) + 3
        if needed > frames or (not last_window and len(chosen) >= 2 and total + len(tokens[index]) > budget):
            break
        chosen.append(index)
        total += len(tokens[index])
    return chosen


def _align_window(
    log_probs: np.ndarray,
    tokens: list[np.ndarray],
    chosen: list[int],
    blank_space: tuple[int, int | None],
    seconds_per_frame: float,
    min_score: float,
) -> tuple[list[int], dict[int, Aligned]]:
    """(the units of ``chosen`` kept, where each was found in this window): while some unit scores under
    ``min_score``, the one of them whose removal leaves the most units at or above it (of equals, the one
    that scored worst) is taken out and the window aligned again. Text that is not in the audio spoils its
    neighbours too; taking out a neighbour leaves the text still bad, taking out the text mends both."""
    window = np.ascontiguousarray(log_probs, dtype=np.float32)

    def align(units: list[int]) -> dict[int, Aligned]:
        try:
            placed = _segment(window, [tokens[i] for i in units], *blank_space, seconds_per_frame)
        except (AssertionError, IndexError):  # the package found no path (text too long for the audio)
            placed = [Aligned(0.0, 0.0, float("-inf"))] * len(units)
        return dict(zip(units, placed, strict=True))

    def merit(results: dict[int, Aligned]) -> tuple[int, float]:
        return sum(r.score >= min_score for r in results.values()), sum(r.score for r in results.values())

    active = list(chosen)
    results = align(active)
    while len(active) > 1:
        bad = [i for i in active if results[i].score < min_score]
        if not bad:
            break
        trials = {i: align([j for j in active if j != i]) for i in bad}
        best = max(merit(trials[i])[0] for i in bad)
        if best == 0:  # no single removal leaves a unit standing: nothing of this text is here
            break
        tied = [i for i in bad if merit(trials[i])[0] == best]
        if len(tied) > 1:  # a paragraph of unread text spoils a neighbour as much as either spoils the
            # other: look one removal further, then take the unit that scored worst
            removed = max(
                tied, key=lambda i: (_after_one_more(trials[i], align, min_score), -results[i].score)
            )
        else:
            removed = tied[0]
        active.remove(removed)
        results = trials[removed]
    return [i for i in active if results[i].score >= min_score], results


def _after_one_more(results: dict[int, Aligned], align, min_score: float) -> int:
    """The most units at or above ``min_score`` one more removal of a unit under it leaves (the units
    there are when none is under it)."""
    bad = [i for i, r in results.items() if r.score < min_score]
    if not bad or len(results) < 2:
        return sum(r.score >= min_score for r in results.values())
    return max(sum(r.score >= min_score for r in align([j for j in results if j != i]).values()) for i in bad)


def _segment(
    log_probs: np.ndarray, tokens: list[np.ndarray], blank: int, space: int | None, seconds_per_frame: float
) -> list[Aligned]:
    """One CTC segmentation of ``tokens`` (units in order) over ``log_probs``: each unit's place (its
    characters' frames padded into the silence around them, see the module docstring) and score.

    The package separates units by a blank; a model trained on sentences emits spaces in pauses, where a
    blank then scores as badly as a character, and the first character of a unit is entered anywhere in
    the pause before it. So each unit is aligned after a space, which takes the pause."""
    from ctc_segmentation import CtcSegmentationParameters, ctc_segmentation, prepare_token_list

    # a "speech not in the text" class of constant probability, which each unit is aligned after
    classes = log_probs.shape[1] + 1
    log_probs = np.concatenate(
        [log_probs, np.full((len(log_probs), 1), GARBAGE_LOG_PROB, np.float32)], axis=1
    )
    config = CtcSegmentationParameters(
        blank=blank,
        index_duration=seconds_per_frame,
        min_window_size=max(1, round(BAND_S / seconds_per_frame)),
        char_list=[str(i) for i in range(classes)],  # names for its trace only
    )
    before = [classes - 1] if space is None else [classes - 1, space]
    lead = len(before)
    tokens = [np.concatenate([before, t]) for t in tokens]
    ground_truth, begins = prepare_token_list(config, tokens)
    timings, char_probs, _ = ctc_segmentation(config, log_probs, ground_truth)
    span = max(1, round(SCORE_SPAN_S / seconds_per_frame))
    # the frame of each unit's first and last label (begins[k] is the blank before unit k)
    firsts = [round(timings[begins[k] + 1 + lead] / seconds_per_frame) for k in range(len(tokens))]
    lasts = [round(timings[begins[k + 1] - 1] / seconds_per_frame) for k in range(len(tokens))]
    found = []
    for k in range(len(tokens)):
        gap_before = (firsts[k] - lasts[k - 1]) * seconds_per_frame / 2 if k else PAD_S
        gap_after = (firsts[k + 1] - lasts[k]) * seconds_per_frame / 2 if k + 1 < len(tokens) else PAD_AFTER_S
        start = max(0.0, firsts[k] * seconds_per_frame - min(PAD_S, max(gap_before, 0.0)))
        end = min(
            len(log_probs) * seconds_per_frame,
            (lasts[k] + 1) * seconds_per_frame + min(PAD_AFTER_S, max(gap_after - seconds_per_frame, 0.0)),
        )
        found.append(Aligned(start, end, _score(char_probs[firsts[k] : lasts[k] + 1], span)))
    return found


def transcript_score(log_probs: np.ndarray, labels: np.ndarray, blank: int) -> float:
    """The log-probability of the best CTC path of ``labels`` through ``log_probs`` ``[frames, classes]``
    (the package's path: a frame in a character's state scores the better of it and the blank), per label;
    -inf when there are no labels or more than the frames can hold."""
    from ctc_segmentation import CtcSegmentationParameters, ctc_segmentation, prepare_token_list

    if not len(labels) or min_frames(labels) + 3 > len(log_probs):  # the package's path needs 3 more
        return float("-inf")
    config = CtcSegmentationParameters(
        blank=blank, min_window_size=len(log_probs), char_list=[str(i) for i in range(log_probs.shape[1])]
    )
    ground_truth, _ = prepare_token_list(config, [np.asarray(labels)])
    try:
        _, char_probs, _ = ctc_segmentation(config, np.ascontiguousarray(log_probs, np.float32), ground_truth)
    except (AssertionError, IndexError):  # no path: the transcript cannot be this audio's
        return float("-inf")
    return float(np.sum(char_probs)) / len(labels)


def min_frames(labels: np.ndarray) -> int:
    """The fewest frames a CTC path of ``labels`` takes: one per label, one more between repeats."""
    if not len(labels):
        return 0
    return len(labels) + int(np.count_nonzero(labels[1:] == labels[:-1]))


def _score(path_log_probs: np.ndarray, span: int) -> float:
    """The lowest mean of ``span`` consecutive values (the mean of all when there are fewer)."""
    if len(path_log_probs) == 0:
        return float("-inf")
    if len(path_log_probs) <= span:
        return float(path_log_probs.mean())
    sums = np.cumsum(np.concatenate([[0.0], path_log_probs.astype(np.float64)]))
    return float(((sums[span:] - sums[:-span]) / span).min())


def merge_units(
    units: list[Unit], found: list[Aligned | None], max_seconds: float
) -> list[tuple[list[int], Aligned]]:
    """Aligned neighbours of one line joined while the joined span lasts at most ``max_seconds``: (the
    indices of the units joined, their span with the lowest of their scores), in order."""
    merged: list[tuple[list[int], Aligned]] = []
    for index, aligned in enumerate(found):
        if aligned is None:
            continue
        if merged:
            indices, span = merged[-1]
            joinable = (
                indices[-1] == index - 1
                and units[indices[-1]].line == units[index].line
                and aligned.end - span.start <= max_seconds
            )
            if joinable:
                merged[-1] = (
                    [*indices, index],
                    Aligned(span.start, aligned.end, min(span.score, aligned.score)),
                )
                continue
        merged.append(([index], aligned))
    return merged
