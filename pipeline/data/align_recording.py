"""One long recording and its whole text -> its utterances (offset, duration, transcript, score) and the
rows rejected, as the Align stage keeps them (a JSON-able dict).

The recording is refused whole, in one line naming the file, when it cannot be aligned at all: unreadable
audio, a text with no words, a text in a script the aligner's alphabet lacks, or a text that needs more
frames than the audio has (one per character and one between repeated ones: a CTC path cannot be shorter).
Otherwise its text is cut into units (``pipeline.data.align.split_text``), aligned, and each unit not
found is rejected as ``misaligned`` with its ``file:line``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from native_client.audio import AudioError, probe
from pipeline.data.align import align_units, merge_units, min_frames, split_text
from pipeline.data.importers import Utterance
from pipeline.data.text import TextSettings, TranscriptRejected, normalise_transcript

MISALIGNED = "misaligned"
# A text whose characters the aligner's alphabet mostly lacks is in another script: the recording is refused.
MIN_KNOWN_SHARE = 0.5
# Characters per second of the fastest reading expected: with ``max_seconds`` it says how long a unit of
# text may be before it is cut (an estimate: the alignment measures the real length).
FAST_READING_CPS = 20.0


def align_recording(row: Utterance, text_settings: TextSettings, options, aligner, scratch: Path) -> dict:
    """``{"seconds": the recording's length, "utterances": [[audio, size, transcript, offset, duration,
    score], ...], "rejects": [[source, audio, reason, detail, offset, duration, score], ...]}``."""
    text_file = row.source.rsplit(":", 1)[0]
    try:
        info = probe(row.audio)
    except AudioError as error:
        return _refused(row, error.reason, str(error), 0.0)
    units = split_text(row.transcript, max(1, round(options.max_seconds * FAST_READING_CPS)))
    transcripts, labels, unknown = [], [], set()
    for unit in units:
        try:
            transcripts.append(normalise_transcript(unit.text, text_settings))
        except TranscriptRejected:
            transcripts.append("")
        found, lacking = aligner.labels(unit.text)
        labels.append(found)
        unknown |= lacking
    space = aligner.alphabet.space_index
    known = sum(int(np.count_nonzero(t != space)) for t in labels)
    written = sum(len(aligner.normalise(u.text).replace(" ", "")) for u in units)
    if not any(transcripts) or written == 0:
        return _refused(row, "empty_transcript", f"{text_file}: the text has no words", info.duration)
    if known < MIN_KNOWN_SHARE * written:
        sample = "".join(sorted(unknown)[:8])
        return _refused(
            row,
            "alphabet_mismatch",
            f"{text_file}: most of its characters ({sample!r}, ...) are not in the aligner's alphabet: "
            "is the text in the language of the aligner model?",
            info.duration,
        )
    frames = int(info.duration / aligner.seconds_per_frame)
    needed = sum(min_frames(t) for t in labels)
    if needed > frames:
        return _refused(
            row,
            "text_longer_than_audio",
            f"{text_file}: its text needs at least {needed * aligner.seconds_per_frame:.1f} s of audio, "
            f"{row.audio} lasts {info.duration:.1f} s: is it the text of this recording?",
            info.duration,
        )
    log_probs = aligner.posteriors(row.audio, scratch)
    usable = [i for i, t in enumerate(labels) if len(t) and transcripts[i]]
    found = [None] * len(units)
    placed = align_units(
        log_probs,
        [labels[i] for i in usable],
        aligner.blank,
        aligner.seconds_per_frame,
        options.min_score,
        space=aligner.alphabet.space_index,
    )
    for index, aligned in zip(usable, placed, strict=True):
        found[index] = aligned
    del log_probs
    size = Path(row.audio).stat().st_size
    utterances = []
    for indices, span in merge_units(units, found, options.max_seconds):
        duration = span.end - span.start
        transcript = " ".join(transcripts[i] for i in indices)
        utterances.append(
            [
                row.audio,
                int(size * duration / info.duration),
                transcript,
                f"{span.start:.3f}",
                f"{duration:.3f}",
                f"{span.score:.3f}",
            ]
        )
    rejects = [
        [
            f"{text_file}:{unit.line}",
            row.audio,
            MISALIGNED,
            f"{text_file}:{unit.line}: {unit.text[:60]!r}: not found in the audio "
            f"(or scoring under align.min_score {options.min_score:g})",
            "",
            "",
            "",
        ]
        for unit, aligned in zip(units, found, strict=True)
        if aligned is None
    ]
    return {"seconds": info.duration, "utterances": utterances, "rejects": rejects}


def _refused(row: Utterance, reason: str, detail: str, seconds: float) -> dict:
    """The result of a recording refused whole."""
    return {
        "seconds": seconds,
        "utterances": [],
        "rejects": [[row.source.rsplit(":", 1)[0], row.audio, reason, detail, "", "", ""]],
    }
