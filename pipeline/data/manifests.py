"""CSV manifests (DeepSpeech format): parse, resolve paths, check transcripts, collect rejects.

A relative ``wav_filename`` is relative to the folder of the manifest's real file: a manifest reached
through a symbolic link finds its audio where the manifest itself lives (``manifest_folder``).

Besides ``wav_filename,wav_filesize,transcript``, a manifest may carry ``offset`` and ``duration``
(seconds; empty = from the start / to the end): the row is then that segment of the file, as a
lhotse supervision is (an importer writes them for TED-LIUM's talks and Kaldi's ``segments``).

Every transcript goes through the one text normalisation (``data.text``, ``native_client.text``) before
the alphabet judges it.
"""

from __future__ import annotations

import csv
import hashlib
import io
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


def manifest_folder(manifest: str | Path) -> Path:
    """The folder relative audio paths of ``manifest`` start from: the folder of its real file (symbolic
    links followed), so that a manifest linked from elsewhere still finds the audio beside it."""
    return Path(manifest).resolve().parent


def read_manifests(
    files, limit: int, alphabet: Labels, text: TextSettings, digests: dict[str, str] | None = None
) -> tuple[list[Sample], list[Reject]]:
    """Read every CSV of a split, keep at most ``limit`` rows (0 = all) in file order, normalise the
    transcripts (``text``), check them against ``alphabet`` and check the audio files are there.

    Audio content is checked later, while features are computed. A row whose audio file an earlier row
    of the split already lists is rejected as ``duplicate`` (training on it twice would weight it double).
    ``digests``, when given, receives the SHA-256 of the bytes of each manifest as it was read (the whole
    file, also past ``limit``), so a caller can tell whether what it read is what it fingerprinted.
    """
    samples: list[Sample] = []
    rejects: list[Reject] = []
    first_listed: dict[tuple, str] = {}
    rows = 0
    for manifest in files:
        manifest = Path(manifest)
        digest = hashlib.sha256() if digests is not None else None
        reader = _rows(manifest, digest)
        for line, row in reader:
            if limit and rows >= limit:
                break
            rows += 1
            source = f"{manifest}:{line}"
            result = _check_row(row, manifest_folder(manifest), source, alphabet, text)
            if isinstance(result, Sample):
                key = (str(Path(result.audio_path).resolve()), result.offset, result.duration)
                if key in first_listed:
                    result = Reject(
                        source, result.audio_path, "duplicate", f"already listed at {first_listed[key]}"
                    )
                else:
                    first_listed[key] = source
            (samples if isinstance(result, Sample) else rejects).append(result)
        reader.close()  # closing the file digests the rest of it
        if digest is not None:
            digests[str(manifest)] = digest.hexdigest()
        if limit and rows >= limit:
            break
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


def manifest_rows(manifest: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, row) of every row of a manifest, its columns by name, streamed; a row with the wrong
    number of fields has ``_fields`` (and what it has of the columns). CorpusError for a header without
    the required columns."""
    yield from _rows(Path(manifest))


class _HashingReader(io.RawIOBase):
    """A binary file whose bytes are added to ``digest`` as they are read (to the end when closed), so a
    manifest is digested in the same pass that parses it (hashlib has no reader of its own)."""

    def __init__(self, raw, digest):
        self._raw, self._digest = raw, digest

    def readable(self) -> bool:
        """Always readable."""
        return True

    def readinto(self, buffer) -> int:
        """Read into ``buffer``, digesting what came."""
        count = self._raw.readinto(buffer)
        if count:
            self._digest.update(memoryview(buffer)[:count])
        return count

    def close(self) -> None:
        """Digest the rest of the file (rows past a limit), then close it."""
        if not self.closed:
            for block in iter(lambda: self._raw.read(1 << 20), b""):
                self._digest.update(block)
            self._raw.close()
        super().close()


def _rows(manifest: Path, digest=None):
    """Yield (line number, row dict) of one CSV; raise CorpusError if the header lacks a column.
    ``digest`` (a hashlib object), when given, receives every byte of the file."""
    try:
        raw = open(manifest, "rb")
    except OSError as error:
        raise CorpusError(f"{manifest}: cannot read manifest: {error.strerror}") from error
    binary = io.BufferedReader(_HashingReader(raw, digest)) if digest is not None else raw
    # utf-8-sig: spreadsheet programs save CSVs with a byte-order mark before the header.
    handle = io.TextIOWrapper(binary, encoding="utf-8-sig", newline="")
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise CorpusError(f"{manifest}: empty manifest, expected a header {','.join(REQUIRED_COLUMNS)}")
        header = [name.strip() for name in header]
        missing = [name for name in REQUIRED_COLUMNS if name not in header]
        if missing:
            raise CorpusError(
                f"{manifest}:1: header lacks column(s) {', '.join(missing)}; "
                f"expected {','.join(REQUIRED_COLUMNS)}"
            )
        for row in reader:
            if not row:
                continue
            yield (
                reader.line_num,
                (
                    dict(zip(header, row, strict=False))
                    if len(row) == len(header)
                    else {
                        "_fields": len(row),
                        "_expected": len(header),
                        **dict(zip(header, row, strict=False)),
                    }
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
        offset, duration = row_segment(row)
    except ValueError as error:
        return Reject(source, str(path), "malformed_row", str(error))
    try:
        filesize = int(row["wav_filesize"])
    except ValueError:
        filesize = path.stat().st_size
    return Sample(
        str(path), filesize, transcript, tuple(alphabet.encode(transcript)), source, offset, duration
    )


def row_segment(row: dict) -> tuple[float, float | None]:
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
    kept: int | None = None,
) -> None:
    """Raise CorpusError naming the split and the top reasons if more than ``max_fraction`` of its
    ``total`` rows were rejected, or if no utterance is left (``kept`` 0: an empty split would score a
    perfect WER, or fail deep inside training), whatever the limit.

    ``earlier``: rows rejected for this split before its manifests were written (an Import's rejects,
    by reason), listed in ``earlier_reports``; they count in the rows and in the rejects."""
    earlier = earlier or Counter()
    total += sum(earlier.values())
    if total == 0:
        raise CorpusError(f"split {split!r} has no rows: check data.{split}_files and data.corpora")
    reasons = Counter(r.reason for r in rejects) + earlier
    rejected = sum(reasons.values())
    fraction = rejected / total
    top = ", ".join(f"{reason} ({count})" for reason, count in reasons.most_common(3))
    where = ", ".join(str(p) for p in (report, *earlier_reports))
    if kept == 0:
        raise CorpusError(
            f"split {split!r}: no usable rows, all {total} rejected; "
            f"top reasons: {top or 'none'}; see {where}"
        )
    if fraction > max_fraction:
        raise CorpusError(
            f"split {split!r}: {rejected} of {total} rows rejected "
            f"({fraction:.1%} > data.max_reject_fraction {max_fraction:.1%}); top reasons: {top}; see {where}"
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
                path = Path(name) if Path(name).is_absolute() else manifest_folder(manifest) / name
                if path.resolve() == target:
                    return row.get("transcript")
        except CorpusError:
            continue
    return None
