"""Importing one corpus: an importer's rows -> normalised, checked, split -> manifests + rejects + report.

``plan_import`` resolves a corpus entry (importer, root, options, which parts feed which split);
``import_fingerprint`` digests everything an import depends on, the corpus files by name, size and
modification time only (an order-free sum of per-file hashes, so a listing is streamed, never
sorted or held); ``import_corpus`` streams the rows once and writes, under one folder:

- ``train.csv``, ``dev.csv``, ``test.csv``: DeepSpeech manifests with absolute audio paths and the
  optional ``offset``/``duration`` columns (seconds, empty = the whole file) and ``speaker``;
- ``rejects.csv``: every dropped row, with its ``file:line``, reason and detail;
- ``report.json`` (last, so its presence means the rest is complete): rows kept and dropped by
  reason, the drops each split's ``data.max_reject_fraction`` counts, hours, utterances and
  speakers per split, and the size of each file written (so a damaged folder is noticed by a stat).

A dropped row is a *selection* when its reason is one of the importer's ``SELECTIONS`` (rows the
corpus leaves out by design or by the importer's options: Common Voice's held-out speakers,
TIMIT's dialect sentences, TED-LIUM's ignored segments) and a *reject* otherwise (a missing or
broken file, an unreadable row, an empty transcript, ...). Rejects are counted against the split
they would have gone to (``rejected_by_split``): the split of their part, or for speaker-hash
splits the speaker's split (``train`` for a row that names no speaker); the Features stage adds
them to that split's rejects when it checks ``data.max_reject_fraction``.

A row whose audio an earlier kept row already reads (the same resolved file and segment: a folder
or file reached twice through symbolic links) is dropped as ``duplicate_audio`` and counted in the
report, never as a reject: the same recording is never in two splits, whatever speaker or name the
second path gives it. That check holds a 64-bit digest per kept row (66 bytes each in a set).

Per row: the transcript goes through ``pipeline.data.text.normalise_transcript``; the audio header
is read (never the audio: ``native_client.audio.probe``) for its length and to drop missing, empty,
truncated and unreadable files; a file libsndfile cannot read is converted once
(``pipeline.data.convert``); a segment must lie inside its file; the split is the part's official
one or, for corpora without, the speaker's hash (``pipeline.data.splits``). Memory holds one row,
the speaker ids per split, the digests of the kept rows' audio, and a small cache of recent headers
(segments of one file come together).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import logging
import math
import os
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from native_client.audio import SEGMENT_END_TOLERANCE_S, AudioError, AudioInfo, probe
from pipeline.config import ConfigError
from pipeline.data.convert import command_output, converted_copy
from pipeline.data.importers import (
    CorpusImporter,
    CorpusLayoutError,
    Dropped,
    NoOptions,
    Utterance,
    check_parts,
    importer,
)
from pipeline.data.importers.folder import AUDIO_SUFFIXES
from pipeline.data.splits import DEFAULT_FRACTIONS, SPLITS, check_fractions, split_of
from pipeline.data.text import TextSettings, TranscriptRejected, normalise_transcript
from pipeline.files import atomic_path, write_json_atomic

log = logging.getLogger(__name__)

MANIFEST_COLUMNS = ("wav_filename", "wav_filesize", "transcript", "offset", "duration", "speaker")
REJECT_COLUMNS = ("source", "audio", "reason", "detail")
# The files of an import folder: a manifest per split, the rejects, and the report (written last).
REJECTS_NAME, REPORT_NAME = "rejects.csv", "report.json"
# The drop reason of a row whose audio (resolved path and segment) an earlier row of the import already
# took: the same file reached again through a symbolic link. Not a defect: never counted as a reject.
DUPLICATE = "duplicate_audio"
HEADER_CACHE = 64
# progress(rows read, rows kept, rows dropped)
ProgressFn = Callable[[int, int, int], None]


@dataclass(frozen=True)
class CorpusSpec:
    """One corpus to import: a ``data.corpora`` entry of the config.

    ``splits`` maps a split to the parts it takes; a split left out takes the importer's official
    parts, or, for a corpus without official splits, the import splits all its parts by speaker
    hash with ``fractions`` (unless some split is named: then only the named parts are imported)."""

    importer: str
    path: Path
    splits: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    fractions: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_FRACTIONS))
    options: Mapping[str, object] = field(default_factory=dict)
    text: TextSettings = TextSettings()
    salt: str = ""  # changes which speakers a hash split puts where


def corpus_spec(corpus, text: TextSettings) -> CorpusSpec:
    """The ``CorpusSpec`` of a ``data.corpora`` entry (``pipeline.config.CorpusConfig``) with ``data.text``:
    the splits it names, its fractions, salt and the importer's options."""
    return CorpusSpec(
        importer=corpus.importer,
        path=Path(corpus.path),
        splits=corpus.named_splits(),
        fractions=dict(corpus.split_fractions),
        options=dict(corpus.options),
        text=text,
        salt=corpus.salt,
    )


@dataclass(frozen=True)
class ImportPlan:
    """A resolved import: the importer, the corpus root, its options, and the parts of each split
    (``official``) or the parts split by speaker (``hashed``)."""

    spec: CorpusSpec
    importer: CorpusImporter
    root: Path
    options: object
    official: dict[str, tuple[str, ...]]
    hashed: tuple[str, ...]
    fractions: dict[str, float]

    @property
    def method(self) -> str:
        """``official`` (parts map to splits) or ``speaker_hash``."""
        return "speaker_hash" if self.hashed else "official"

    @property
    def parts(self) -> list[str]:
        """Every part this import reads, once each, in split order."""
        found = list(self.hashed)
        for split in SPLITS:
            found += [p for p in self.official.get(split, ()) if p not in found]
        return found


def manifest_name(split: str) -> str:
    """The file name of ``split``'s manifest in an import folder."""
    return f"{split}.csv"


def check_spec(spec: CorpusSpec, where: str = "data.corpora[]") -> tuple[CorpusImporter, object, dict]:
    """(importer, its options, the split fractions) of ``spec``, without looking at the corpus; ValueError
    naming ``where`` and the key for an unknown importer, option or split name, or bad fractions."""
    chosen = importer(spec.importer, f"{where}.importer")
    options = chosen.options(spec.options, where)
    fractions = check_fractions(spec.fractions, f"{where}.split_fractions")
    unknown = sorted(set(spec.splits) - set(SPLITS))
    if unknown:
        raise ValueError(f"{where}: unknown split(s) {', '.join(unknown)}; expected {', '.join(SPLITS)}")
    return chosen, options, fractions


def plan_import(spec: CorpusSpec, where: str = "data.corpora[]") -> ImportPlan:
    """Resolve ``spec``; ValueError/CorpusLayoutError naming ``where`` or the path when it cannot be
    imported (unknown importer, options or parts; a part in two splits; bad fractions). Lists the
    corpus root and its parts' folders only (cheap: no file below a part is looked at)."""
    chosen, options, fractions = check_spec(spec, where)
    root = chosen.locate(Path(spec.path))
    found = chosen.parts(root, options)
    defaults = chosen.default_splits(root, options)
    named = {split: tuple(parts) for split, parts in spec.splits.items() if parts is not None}
    if defaults is None and not named:
        if not found:
            raise CorpusLayoutError(f"{root}: no {chosen.name} corpus parts found here")
        return ImportPlan(spec, chosen, root, options, {}, tuple(found), fractions)
    official = {split: tuple(named.get(split, (defaults or {}).get(split, ()))) for split in SPLITS}
    for parts in official.values():
        check_parts(chosen.name, root, list(parts), found)
    seen: dict[str, str] = {}
    for split, parts in official.items():
        for part in parts:
            if part in seen:
                raise ValueError(f"{where}: part {part!r} is in both {seen[part]} and {split}: a split leak")
            seen[part] = split
    if not any(official.values()):
        raise CorpusLayoutError(f"{root}: no {chosen.name} parts for train, dev or test here; found: {found}")
    return ImportPlan(spec, chosen, root, options, official, (), fractions)


class Listing(NamedTuple):
    """What a listing of a corpus found: files, of which audio files (by suffix), and the order-free
    digest of their relative names, sizes and modification times."""

    files: int
    audio_files: int
    digest: str


def corpus_listing(
    chosen: CorpusImporter, root: Path, parts: tuple[str, ...], options: object = NoOptions()
) -> Listing:
    """List the files of ``parts`` (``CorpusImporter.listing``: names and ``stat`` only, no file is
    opened). Costs one ``stat`` per file, about 3.5 s per 100,000 files (bench/importers.py)."""
    total, count, audio = 0, 0, 0
    for entry in chosen.listing(root, list(parts), options):
        try:
            stat = entry.stat()
        except OSError:  # gone, a dangling or looping link: the import rejects the rows naming it
            continue
        path = Path(entry.path if hasattr(entry, "path") else entry)
        name = (
            path.relative_to(root) if path.is_relative_to(root) else path
        )  # Kaldi's audio may lie elsewhere
        digest = hashlib.blake2b(
            f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode(), digest_size=16
        ).digest()
        total = (total + int.from_bytes(digest, "big")) % 2**128
        count += 1
        audio += path.name.lower().endswith(AUDIO_SUFFIXES)
    return Listing(count, audio, f"{total:032x}")


# What an import makes of the same files and settings, as a number: raised whenever an importer's rows
# or the text normalisation change, so that an import made by older code is made again instead of being
# trusted. 2: one row per real audio file, bad_encoding rejects, format characters removed, TED-LIUM's
# STM label by column, NaN segments dropped, Kaldi's listing over its audio (issue 37).
IMPORT_VERSION = 2


def import_fingerprint(plan: ImportPlan, listing: Listing | None = None) -> str:
    """A digest of the import's settings, of the importers' version (``IMPORT_VERSION``) and of its
    corpus files' relative names, sizes and modification times (``listing``, made by ``corpus_listing``
    when not given: no file is opened)."""
    if listing is None:
        listing = corpus_listing(plan.importer, plan.root, tuple(plan.parts), plan.options)
    count, total = listing.files, listing.digest
    settings = {
        "importer": plan.importer.name or plan.spec.importer,
        "root": str(plan.root.resolve()),
        "options": repr(plan.options),
        "official": plan.official,
        "hashed": plan.hashed,
        "fractions": plan.fractions if plan.hashed else None,
        "salt": plan.spec.salt if plan.hashed else "",
        "text": asdict(plan.spec.text),
        "files": [count, total],
        "version": IMPORT_VERSION,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


class AudioHeaders:
    """The last ``HEADER_CACHE`` audio headers read (or their errors), and the converted copies made."""

    def __init__(self, convert_dir: Path | None):
        self.convert_dir = convert_dir
        self.cache: OrderedDict[str, tuple[str, AudioInfo | AudioError]] = OrderedDict()
        self.converted = 0

    def get(self, row: Utterance) -> tuple[str, AudioInfo]:
        """(the audio path to list, its header); AudioError when the audio cannot be used."""
        key = f"\0{row.command_dir}\0{row.command}" if row.command else row.audio
        if key not in self.cache:
            self.cache[key] = self._read(row)
            if len(self.cache) > HEADER_CACHE:
                self.cache.popitem(last=False)
        path, found = self.cache[key]
        if isinstance(found, AudioError):
            raise found
        return path, found

    def _read(self, row: Utterance) -> tuple[str, AudioInfo | AudioError]:
        try:
            if row.command:
                if self.convert_dir is None:
                    raise AudioError("piped_command", f"{row.audio}: no folder to keep a command's output in")
                path = str(command_output(row.command, self.convert_dir, Path(row.command_dir)))
                self.converted += 1
                return path, probe(path)
            try:
                return row.audio, probe(row.audio)
            except AudioError as error:
                if error.reason != "unreadable_audio" or self.convert_dir is None:
                    raise
                path = str(converted_copy(row.audio, self.convert_dir))
                self.converted += 1
                return path, probe(path)
        except AudioError as error:
            return row.audio, error


@dataclass
class _SplitTally:
    utterances: int = 0
    seconds: float = 0.0
    speakers: set = field(default_factory=set)


def import_corpus(
    plan: ImportPlan, out_dir: Path, convert_dir: Path | None = None, progress: ProgressFn | None = None
) -> dict:
    """Import the corpus of ``plan`` into ``out_dir`` (see the module docstring); returns the report.

    ``convert_dir`` keeps the converted copies of unreadable audio and piped commands' output
    (None: such rows are dropped as ``unreadable_audio``). A crash leaves no manifest half-written
    and no report, so a rerun starts again."""
    out_dir = Path(out_dir)
    tallies = {split: _SplitTally() for split in SPLITS}
    dropped: Counter[str] = Counter()
    rejected = {split: Counter() for split in SPLITS}  # the drops that are not selections, by reason
    headers = AudioHeaders(convert_dir)
    taken: set[int] = set()  # audio_identity of every row kept
    read = 0
    files = {REJECTS_NAME: REJECT_COLUMNS, **{manifest_name(s): MANIFEST_COLUMNS for s in SPLITS}}
    with contextlib.ExitStack() as stack:
        writers = {}
        for name, columns in files.items():
            tmp = stack.enter_context(atomic_path(out_dir / name))
            handle = stack.enter_context(open(tmp, "w", newline="", encoding="utf-8"))
            writers[name] = csv.writer(handle)
            writers[name].writerow(columns)

        def drop(source: str, audio: str, reason: str, detail: str, split: str) -> None:
            dropped[reason] += 1
            if reason not in plan.importer.SELECTIONS and reason != DUPLICATE:
                rejected[split][reason] += 1
            writers[REJECTS_NAME].writerow([source, audio, reason, detail])

        for part, official_split in part_splits(plan):
            for row in plan.importer.utterances(plan.root, part, plan.options):
                read += 1
                if progress is not None and read % 1000 == 0:
                    progress(read, sum(t.utterances for t in tallies.values()), sum(dropped.values()))
                if isinstance(row, Dropped):
                    drop(row.source, row.audio, row.reason, row.detail, official_split or "train")
                    continue
                split = official_split or split_of(row.speaker, plan.fractions, plan.spec.salt)
                identity = audio_identity(row)
                if identity in taken:
                    real = os.path.realpath(row.audio) if not row.command else row.audio
                    drop(row.source, row.audio, DUPLICATE, f"{real}: the same audio as an earlier row", split)
                    continue
                try:
                    transcript = normalise_transcript(row.transcript, plan.spec.text)
                    audio, info = headers.get(row)
                    duration = _segment_duration(info, row)
                except (TranscriptRejected, AudioError) as error:
                    drop(row.source, row.audio, error.reason, str(error), split)
                    continue
                size = Path(audio).stat().st_size
                if row.offset or row.duration is not None:
                    size = int(size * duration / info.duration)
                    segment = [f"{row.offset:g}", f"{duration:g}"]
                else:
                    segment = ["", ""]
                writers[manifest_name(split)].writerow([audio, size, transcript, *segment, row.speaker])
                taken.add(identity)
                tally = tallies[split]
                tally.utterances += 1
                tally.seconds += duration
                tally.speakers.add(row.speaker)
    report = _report(plan, tallies, dropped, rejected, read, headers.converted)
    report["files"] = {name: (out_dir / name).stat().st_size for name in files}
    write_json_atomic(out_dir / REPORT_NAME, report)
    if progress is not None:
        progress(read, report["kept"], report["dropped"])
    return report


def audio_identity(row: Utterance) -> int:
    """A 64-bit digest of the audio a row reads: the file's resolved path (or the command and where it
    runs) and the segment. Two rows with the same identity read the same audio."""
    where = f"\0{row.command_dir}\0{row.command}" if row.command else os.path.realpath(row.audio)
    key = f"{where}\0{row.offset!r}\0{row.duration!r}".encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def part_splits(plan: ImportPlan) -> list[tuple[str, str | None]]:
    """(part, its split or None for a speaker-hashed part), each part once."""
    pairs = [(part, None) for part in plan.hashed]
    for split in SPLITS:
        pairs += [(part, split) for part in plan.official.get(split, ())]
    return pairs


def _segment_duration(info: AudioInfo, row: Utterance) -> float:
    """The duration of the row's audio; AudioError("segment_out_of_range") when its segment is not
    inside the file (up to the tolerance the reader allows at the end)."""
    if math.isnan(row.offset) or (row.duration is not None and math.isnan(row.duration)):
        raise AudioError(
            "segment_out_of_range", f"{info.path}: the segment's start or length is not a number"
        )
    if not row.offset and row.duration is None:
        return info.duration
    end = info.duration if row.duration is None else row.offset + row.duration
    if row.offset < 0 or row.offset >= info.duration or end - info.duration > SEGMENT_END_TOLERANCE_S:
        raise AudioError(
            "segment_out_of_range",
            f"{info.path}: segment {row.offset:g} s to {end:g} s is not inside the audio "
            f"({info.duration:.3f} s)",
        )
    return min(end, info.duration) - row.offset


def _report(
    plan: ImportPlan,
    tallies: dict[str, _SplitTally],
    dropped: Counter,
    rejected: dict[str, Counter],
    read: int,
    converted: int,
) -> dict:
    shared = {}
    for i, first in enumerate(SPLITS):
        for second in SPLITS[i + 1 :]:
            both = tallies[first].speakers & tallies[second].speakers
            if both:
                shared[f"{first}/{second}"] = {"speakers": len(both), "examples": sorted(both)[:5]}
                log.warning(
                    "%s: %d speaker(s) are in both %s and %s (e.g. %s): the splits leak",
                    plan.root,
                    len(both),
                    first,
                    second,
                    ", ".join(sorted(both)[:3]),
                )
    kept = sum(t.utterances for t in tallies.values())
    return {
        "importer": plan.importer.name or plan.spec.importer,
        "root": str(plan.root),
        "split_method": plan.method,
        "parts": {split: list(plan.official.get(split, ())) for split in SPLITS}
        if plan.official
        else list(plan.hashed),
        "fractions": plan.fractions if plan.hashed else None,
        "rows": read,
        "kept": kept,
        "dropped": sum(dropped.values()),
        "dropped_by_reason": dict(dropped.most_common()),
        "selected": sum(n for reason, n in dropped.items() if reason in plan.importer.SELECTIONS),
        "duplicate_audio": dropped.get(DUPLICATE, 0),
        "rejected_by_split": {split: dict(rejected[split].most_common()) for split in SPLITS},
        "converted_audio_files": converted,
        "splits": {
            split: {
                "utterances": t.utterances,
                "hours": round(t.seconds / 3600, 6),
                "speakers": len(t.speakers),
            }
            for split, t in tallies.items()
        },
        "speakers_in_several_splits": shared,
    }


def corpus_error(error: ValueError, where: str, source: str) -> ConfigError:
    """A planning error of the corpus entry ``where`` (``data.corpora[1]``) as a one-line ConfigError
    naming the config file and the entry."""
    message = str(error) if str(error).startswith(where) else f"{where}: {error}"
    return ConfigError(f"{source}: {message}")
