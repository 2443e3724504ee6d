"""One long recording and its whole text -> its utterances (offset, duration, transcript, score) and the
rows rejected, as the Align stage keeps them (a JSON-able dict).

The recording is refused whole, in one line naming the file, when it cannot be aligned at all: a text
with no words, a text in a script the aligner's alphabet lacks, a text that needs more frames than the
audio has (one per character, one between repeated ones and the separators: a CTC path cannot be
shorter), or audio that fails while it is read. Otherwise its text is cut into units
(``pipeline.data.align.split_text``) and aligned; a unit not found is rejected as ``misaligned`` with its
``file:line``, one whose text ``data.text`` refuses (digits, with ``digits: reject``) with that reason,
and one with no letters at all (a scene break's ``* * *``) is left out silently: it is not speech.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from native_client.audio import AudioError, AudioInfo
from pipeline.data.align import align_units, merge_units, min_frames, split_text
from pipeline.data.importers import Utterance
from pipeline.data.text import TextSettings, TranscriptRejected, normalise_transcript

MISALIGNED = "misaligned"
# A text whose characters the aligner's alphabet mostly lacks is in another script: the recording is refused.
MIN_KNOWN_SHARE = 0.5
# Characters per second of a slow reading: with ``max_seconds`` it says how long a sentence may be before
# it is cut (read faster, its pieces are shorter; neighbours are joined again up to ``max_seconds``).
SLOW_READING_CPS = 10.0


def align_recording(
    row: Utterance, audio: str, info: AudioInfo, text_settings: TextSettings, options, aligner, scratch: Path
) -> dict:
    """``{"seconds": the recording's length, "utterances": [[audio, size, transcript, offset, duration,
    score], ...], "rejects": [[source, audio, reason, detail, offset, duration, score], ...]}`` of the
    recording ``row`` whose audio is read from ``audio`` (its header ``info``: a converted copy when
    libsndfile cannot read the original)."""
    text_file = row.source.rsplit(":", 1)[0]
    units = split_text(row.transcript, max(1, round(options.max_seconds * SLOW_READING_CPS)))
    units = [u for u in units if any(ch.isalnum() for ch in u.text)]  # not speech: "* * *", "---"
    transcripts, labels, unknown, refused = [], [], set(), {}
    for index, unit in enumerate(units):
        try:
            transcripts.append(normalise_transcript(unit.text, text_settings))
        except TranscriptRejected as rejected:
            transcripts.append("")
            refused[index] = rejected
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
    needed = 2 + sum(min_frames(t) + 3 for t in labels)  # the separators and the space before each unit
    if needed > frames:
        return _refused(
            row,
            "text_longer_than_audio",
            f"{text_file}: its text needs at least {needed * aligner.seconds_per_frame:.1f} s of audio, "
            f"{row.audio} lasts {info.duration:.1f} s: is it the text of this recording?",
            info.duration,
        )
    try:
        log_probs = aligner.posteriors(audio, scratch)
    except AudioError as error:
        return _refused(row, error.reason, f"{row.audio}: {error}", info.duration)
    except (OSError, RuntimeError) as error:  # a file cut short or damaged past its header (libsndfile)
        return _refused(
            row, "unreadable_audio", f"{row.audio}: cannot be read to its end: {error}", info.duration
        )
    usable = [i for i, t in enumerate(labels) if len(t) and transcripts[i]]
    found = [None] * len(units)
    placed = align_units(
        log_probs,
        [labels[i] for i in usable],
        aligner.blank,
        aligner.seconds_per_frame,
        options.min_score,
        space=space,
    )
    for index, aligned in zip(usable, placed, strict=True):
        found[index] = aligned
    size = Path(audio).stat().st_size
    utterances = []
    for indices, span in merge_units(units, found, options.max_seconds):
        duration = span.end - span.start
        utterances.append(
            [
                audio,
                int(size * duration / info.duration),
                " ".join(transcripts[i] for i in indices),
                f"{span.start:.3f}",
                f"{duration:.3f}",
                f"{span.score:.3f}",
            ]
        )
    rejects = []
    for index, (unit, aligned) in enumerate(zip(units, found, strict=True)):
        if aligned is not None:
            continue
        where = f"{text_file}:{unit.line}"
        if index in refused:
            reason, detail = refused[index].reason, f"{where}: {refused[index]}"
        elif not len(labels[index]):
            reason, detail = (
                "alphabet_mismatch",
                f"{where}: {unit.text[:60]!r}: none of it is in the aligner's alphabet",
            )
        else:
            reason = MISALIGNED
            detail = (
                f"{where}: {unit.text[:60]!r}: not found in the audio "
                f"(or scoring under align.min_score {options.min_score:g})"
            )
        rejects.append([where, row.audio, reason, detail, "", "", ""])
    return {"seconds": info.duration, "utterances": utterances, "rejects": rejects}


def _refused(row: Utterance, reason: str, detail: str, seconds: float) -> dict:
    """The result of a recording refused whole."""
    return {
        "seconds": seconds,
        "utterances": [],
        "rejects": [[row.source.rsplit(":", 1)[0], row.audio, reason, detail, "", "", ""]],
    }
