"""Finding wrong transcripts: every utterance of a split scored against a model, the suspect ones left out.

Each utterance gets two scores from the model (``Aligner``: an export of this project or a DeepSpeech/Coqui
``.tflite``): the greedy **CER** of the model's transcript against the row's (both in the model's text
normalisation), and the **score**, the log-probability of the row's transcript's best CTC path per
character (``pipeline.data.align.transcript_score``). A row is ``suspect_transcript`` when its CER is above
``max_cer`` or its score below ``min_score``. A row whose audio cannot be read is passed on as it is,
for Features to reject with its reason; a malformed row (its fields not the header's) is left out as
``malformed_row`` and counted against ``data.max_reject_fraction`` as Features would count it.

``score_rows`` streams rows and scores; the stage (``pipeline.stages.clean``) keeps them in a journal a
rerun resumes from, then writes the cleaned manifests and the files a person reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rapidfuzz.distance import Levenshtein

from native_client.audio import AudioError, load_checked
from native_client.decoders.greedy import log_softmax
from pipeline.data.align import transcript_score
from pipeline.data.manifests import manifest_folder, manifest_rows, row_segment

SUSPECT = "suspect_transcript"
SCORED = "scored"
MALFORMED = "malformed_row"
# More of a split than this judged suspect means the model does not fit the data (another language,
# another alphabet): the stage stops rather than drop most of the corpus.
MAX_SUSPECT_SHARE = 0.5
# ... judged on splits of at least this many rows (two suspects of three prove nothing).
MIN_ROWS_FOR_SHARE = 20


@dataclass(frozen=True)
class Scored:
    """One manifest row and what the model made of it: ``verdict`` is ``scored`` (then ``judge`` makes it
    ``keep`` or ``suspect_transcript``), ``malformed_row`` (left out, as Features would reject it) or
    ``unscored`` (passed on unjudged: its audio is for Features to judge; ``detail`` says why)."""

    split: str
    source: str  # file:line
    audio: str  # absolute
    size: str
    transcript: str
    offset: str
    duration: str
    speaker: str
    heard: str  # the model's greedy transcript
    cer: float
    score: float
    verdict: str
    detail: str = ""


def _one_line(value):
    """A journal field on one line (a line break as a space)."""
    return " ".join(value.splitlines()) if isinstance(value, str) else value


def split_rows(split: str, manifests: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    """(``file:line``, row with an absolute ``wav_filename``) of every row of ``manifests``, in order."""
    for manifest in manifests:
        base = manifest_folder(manifest)
        for line, row in manifest_rows(manifest):
            name = row.get("wav_filename", "")
            if name and not Path(name).is_absolute():
                row = {**row, "wav_filename": str(base / name)}
            yield f"{manifest}:{line}", row


def score_row(split: str, source: str, row: dict, model) -> Scored:
    """The scores of one row against ``model`` (a ``pipeline.data.aligner.Aligner``); its ``verdict`` is
    ``scored`` (``judge`` says more), ``unscored`` or ``malformed_row``."""
    # one line per row in the stage's journal: a line break in a field is a space (transcripts' whitespace
    # is one space once normalised anyway)
    row = {key: _one_line(value) for key, value in row.items()}
    fields = {
        "split": split,
        "source": source,
        "audio": row.get("wav_filename", ""),
        "size": row.get("wav_filesize", ""),
        "transcript": row.get("transcript", ""),
        "offset": row.get("offset", "") or "",
        "duration": row.get("duration", "") or "",
        "speaker": row.get("speaker", "") or "",
    }
    if "_fields" in row:  # its columns cannot be told apart: written on, it would be another row
        detail = f"{row['_fields']} fields, the header has {row['_expected']}"
        return Scored(**fields, heard="", cer=math.nan, score=math.nan, verdict=MALFORMED, detail=detail)
    try:
        offset, duration = row_segment(row)
        samples = load_checked(
            fields["audio"], model.model.sample_rate, offset=offset, duration=duration, convert_rate=True
        )
    except (AudioError, ValueError, OSError) as error:
        return Scored(
            **fields, heard="", cer=math.nan, score=math.nan, verdict="unscored", detail=_one_line(str(error))
        )
    logits = model.model.logits(samples)
    heard = _one_line(model.model.greedy.decode(logits))
    expected = model.normalise(fields["transcript"])
    cer = Levenshtein.distance(heard, expected) / max(len(expected), 1)
    labels, _ = model.labels(fields["transcript"])
    score = transcript_score(log_softmax(logits), labels, model.blank)
    return Scored(**fields, heard=heard, cer=cer, score=score, verdict=SCORED)


def judge(scored: Scored, max_cer: float, min_score: float) -> str:
    """``suspect_transcript`` for a scored row whose CER is above ``max_cer`` or score below ``min_score``,
    ``keep`` for another scored row, else the row's own verdict (``unscored``, ``malformed_row``)."""
    if scored.verdict != SCORED:
        return scored.verdict
    return SUSPECT if scored.cer > max_cer or scored.score < min_score else "keep"
