"""CSV manifests (DeepSpeech format): parse, resolve paths, check transcripts, collect rejects.

Besides ``wav_filename,wav_filesize,transcript``, a manifest may carry ``offset`` and ``duration``
(seconds; empty = from the start / to the end): the row is then that segment of the file, as a
lhotse supervision is (an importer writes them for TED-LIUM's talks and Kaldi's ``segments``).

Every transcript goes through the one text normalisation (``data.text``, ``native_client.text``) before
the alphabet judges it.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from native_client.alphabet import Labels
from pipeline.data.text import TextSettings, TranscriptRejected, normalise_transcript
from pipeline.files import atomic_path

REQUIRED_COLUMNS = ("wav_filename", "wav_filesize", "transcript")


class CorpusError(ValueError):
    """A manifest cannot be used at all, or a split has too many rejects."""


@dataclass(frozen=True)
class Sample:
    """One manifest row that passed the text checks; ``source`` is ``file:line``."""

    audio_path: str
    filesize: int
    transcript: str
    labels: tuple[int, ...]
    source: str
    offset: float = 0.0  # seconds into the file where the utterance starts
    duration: float | None = None  # seconds; None = to the end of the file


@dataclass(frozen=True)
class Reject:
    """A row that was not used, with a short reason code and a human-readable detail."""

    source: str
    audio_path: str
    reason: str
    detail: str


def read_manifests(
    files, limit: int, alphabet: Labels, text: TextSettings
) -> tuple[list[Sample], list[Reject]]:
    """Read every CSV of a split, keep at most ``limit`` rows (0 = all) in file order, normalise the
    transcripts (``text``), check them against ``alphabet`` and check the audio files are there.

    Audio content is checked later, while features are computed. A row whose audio file an earlier row
    of the split already lists is rejected as ``duplicate`` (training on it twice would weight it double).
    """
    samples: list[Sample] = []
    rejects: list[Reject] = []
    first_listed: dict[tuple, str] = {}
    rows = 0
    for manifest in files:
        manifest = Path(manifest)
        for line, row in _rows(manifest):
            if limit and rows >= limit:
                return samples, rejects
            rows += 1
            source = f"{manifest}:{line}"
            result = _check_row(row, manifest.parent, source, alphabet, text)
            if isinstance(result, Sample):
                key = (str(Path(result.audio_path).resolve()), result.offset, result.duration)
                if key in first_listed:
                    result = Reject(
                        source, result.audio_path, "duplicate", f"already listed at {first_listed[key]}"
                    )
                else:
                    first_listed[key] = source
            (samples if isinstance(result, Sample) else rejects).append(result)
    return samples, rejects


def iter_transcripts(files, limit: int, text: TextSettings) -> Iterator[tuple[str, str | TranscriptRejected]]:
    """(``file:line``, normalised transcript, or the TranscriptRejected saying why there is none) of each of
    the first ``limit`` rows (0 = all) of ``files``, streamed: one row in memory at a time. Rows with the
    wrong number of fields are skipped (Features rejects them)."""
    rows = 0
    for manifest in files:
        manifest = Path(manifest)
        for line, row in _rows(manifest):
            if limit and rows >= limit:
                return
            rows += 1
            if "_fields" in row:
                continue
            try:
                yield f"{manifest}:{line}", normalise_transcript(row.get("transcript", ""), text)
            except TranscriptRejected as rejected:
                yield f"{manifest}:{line}", rejected


def _rows(manifest: Path):
    """Yield (line number, row dict) of one CSV; raise CorpusError if the header lacks a column."""
    try:
        # utf-8-sig: spreadsheet programs save CSVs with a byte-order mark before the header.
        handle = open(manifest, newline="", encoding="utf-8-sig")
    except OSError as error:
        raise CorpusError(f"{manifest}: cannot read manifest: {error.strerror}") from error
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise CorpusError(f"{manifest}: empty manifest, expected a header {','.join(REQUIRED_COLUMNS)}")
        header = [name.strip() for name in header]
        missing = [name for name in REQUIRED_COLUMNS if name not in header]
        if missing:
            raise CorpusError(
                f"{manifest}:1: header lacks column(s) {', '.join(missing)}; expected {','.join(REQUIRED_COLUMNS)}"
            )
        for row in reader:
            if not row:
                continue
            yield (
                reader.line_num,
                (
                    dict(zip(header, row, strict=False))
                    if len(row) == len(header)
                    else {"_fields": len(row), "_expected": len(header), **dict(zip(header, row, strict=False))}
                ),
            )


def _check_row(row: dict, base: Path, source: str, alphabet: Labels, text: TextSettings) -> Sample | Reject:
    name = row.get("wav_filename", "")
    path = Path(name) if Path(name).is_absolute() else base / name
    if "_fields" in row:
        return Reject(
            source, str(path), "malformed_row", f"{row['_fields']} fields, expected {row['_expected']}"
        )
    if not path.is_file():
        return Reject(source, str(path), "missing_file", "audio file does not exist")
    try:
        transcript = normalise_transcript(row["transcript"], text)
    except TranscriptRejected as rejected:
        return Reject(source, str(path), rejected.reason, str(rejected))
    unknown = alphabet.unknown_characters(transcript)
    if unknown:
        return Reject(
            source,
            str(path),
            "unknown_characters",
            "characters not in the alphabet: " + " ".join(repr(c) for c in unknown),
        )
    try:
        offset, duration = _segment(row)
    except ValueError as error:
        return Reject(source, str(path), "malformed_row", str(error))
    try:
        filesize = int(row["wav_filesize"])
    except ValueError:
        filesize = path.stat().st_size
    return Sample(
        str(path), filesize, transcript, tuple(alphabet.encode(transcript)), source, offset, duration
    )


def _segment(row: dict) -> tuple[float, float | None]:
    """The row's (offset, duration) from the optional columns; ValueError naming a bad value."""
    values = []
    for column in ("offset", "duration"):
        text = (row.get(column) or "").strip()
        try:
            values.append(float(text) if text else None)
        except ValueError:
            raise ValueError(f"{column} {text!r} is not a number of seconds") from None
    offset, duration = values
    if (offset is not None and offset < 0) or (duration is not None and duration <= 0):
        raise ValueError(f"segment offset {offset}, duration {duration}: offset must be >= 0, duration > 0")
    return offset or 0.0, duration


def check_reject_fraction(
    split: str,
    total: int,
    rejects: list[Reject],
    max_fraction: float,
    report: Path,
    earlier: Counter | None = None,
    earlier_reports: tuple[Path, ...] = (),
) -> None:
    """Raise CorpusError naming the split and the top reasons if too many rows were rejected.

    ``earlier``: rows rejected for this split before its manifests were written (an Import's rejects,
    by reason), listed in ``earlier_reports``; they count in the rows and in the rejects."""
    earlier = earlier or Counter()
    total += sum(earlier.values())
    if total == 0:
        raise CorpusError(f"split {split!r} has no rows: check data.{split}_files and data.corpora")
    reasons = Counter(r.reason for r in rejects) + earlier
    rejected = sum(reasons.values())
    fraction = rejected / total
    if fraction > max_fraction:
        top = ", ".join(f"{reason} ({count})" for reason, count in reasons.most_common(3))
        where = ", ".join(str(p) for p in (report, *earlier_reports))
        raise CorpusError(
            f"split {split!r}: {rejected} of {total} rows rejected ({fraction:.1%} > data.max_reject_fraction "
            f"{max_fraction:.1%}); top reasons: {top}; see {where}"
        )


def write_rejects(path: Path, rejects: list[Reject]) -> None:
    """Write the rejects report (CSV: file, source, reason, detail) atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["wav_filename", "source", "reason", "detail"])
        for r in rejects:
            writer.writerow([r.audio_path, r.source, r.reason, r.detail])


def find_reference(manifests, audio: str | Path) -> str | None:
    """The transcript a manifest gives for ``audio`` (compared as resolved paths), or None."""
    target = Path(audio).resolve()
    for manifest in manifests:
        manifest = Path(manifest)
        try:
            for _, row in _rows(manifest):  # streamed: a manifest is never held whole
                name = row.get("wav_filename", "")
                path = Path(name) if Path(name).is_absolute() else manifest.parent / name
                if path.resolve() == target:
                    return row.get("transcript")
        except CorpusError:
            continue
    return None
