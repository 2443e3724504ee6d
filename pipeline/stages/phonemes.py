"""The Phonemes stage of a ``targets: phonemes`` task: its ``of`` task's manifests, the transcripts as IPA.

Every row of each split the ``of`` task has (its manifests and its imports', in order) is written again
with its audio path made absolute, its segment columns kept, and its transcript normalised as the ``of``
task's transcripts are (``data.text``), then spoken as IPA by espeak-ng in that task's language
(``pipeline.data.phonemes``). A row left without phonemes (a malformed row, a transcript that normalises to
nothing) is written with an empty transcript, which Features rejects, so each split keeps its rows in their
order and ``data.limit_<split>`` takes the same utterances as for the ``of`` task. The directory is written
in a staging folder and renamed into place; its report is written last.
"""

from __future__ import annotations

import csv
import os
import shutil
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

from pipeline.config import Config
from pipeline.dag import SPLITS, Node, Stage, imports_of, is_instance, task_config
from pipeline.data.manifests import manifest_folder, manifest_rows
from pipeline.data.phonemes import check_voice, espeak_version, phoneme_voice, phonemize
from pipeline.data.text import TranscriptRejected, normalise_transcript
from pipeline.files import fsync_path, fsync_tree
from pipeline.fingerprints import FingerprintInputs
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from pipeline.reports import PhonemesReport, ReportError, read_report, write_report
from pipeline.workdir import PHONEMES_DIR, PhonemesFiles

COLUMNS = ("wav_filename", "wav_filesize", "transcript", "offset", "duration")
# Rows handed to espeak-ng at a time (only they are in memory).
BLOCK = 256


def _phonemes_upstream(config: Config, params: dict) -> list[Node]:
    """What the Phonemes stage reads: the imports of its ``of`` task."""
    return imports_of(config, {"task": task_config(config, params).phonemes_of})


def _phonemes_inputs(inputs: FingerprintInputs, params: dict) -> dict:
    """What a phonemes task's IPA manifests depend on beyond its upstream imports: its ``of`` task's
    manifest files (by content) and text settings (its language is the voice), the limits (only the
    rows they take are spoken). Not espeak-ng's version, which is the machine's: the stage's report
    records it (``phonemes_report.json``)."""
    config = inputs.config
    source = inputs.for_task(config.phonemes_of)
    return {
        "of": config.phonemes_of,
        "manifests": {
            split: [[path, inputs.input_digest(path)] for path in source.config.split_files(split)]
            for split in SPLITS
        },
        "text": source.config.data.text.to_dict(),
    }


STAGE = Stage(
    "phonemes",
    "Phonemes",
    params=("task",),
    upstream=_phonemes_upstream,
    runs=lambda config, params: is_instance(config, params) and bool(task_config(config, params).phonemes_of),
    derived=_phonemes_inputs,
    directory=PHONEMES_DIR,
    outputs=lambda layout, params: [layout.phonemes_files.root, layout.phonemes_files.staging],
)


def phonemes_intact(files: PhonemesFiles) -> bool:
    """Whether ``files`` holds a finished stage: its report, and every manifest it counted."""
    try:
        report = read_report(files.report, PhonemesReport)
    except ReportError:
        return False
    return all(files.manifest(split).is_file() for split in report.rows)


def phonemes_stage(layout: Layout, progress: Callable[[int], None] | None = None) -> PhonemesReport:
    """Write the IPA manifests of ``layout``'s task (a phonemes task's layout) unless they are there;
    returns the report. ``progress(rows)`` follows the rows written."""
    files = layout.phonemes_files
    with stage_lock(files.root):
        if phonemes_intact(files):
            return read_report(files.report, PhonemesReport)
        staging = PhonemesFiles(files.staging)
        shutil.rmtree(staging.root, ignore_errors=True)
        staging.root.mkdir(parents=True)
        try:
            report = _build(layout, staging, progress or (lambda rows: None))
        except BaseException:
            shutil.rmtree(staging.root, ignore_errors=True)
            raise
        shutil.rmtree(files.root, ignore_errors=True)
        fsync_tree(staging.root)
        staging.root.rename(files.root)
        fsync_path(files.root.parent)
    return report


def _rows(manifests, text) -> Iterator[tuple[list, str]]:
    """([audio path, size, offset, duration], normalised transcript or "") of every row of ``manifests``."""
    for manifest in manifests:
        folder = manifest_folder(manifest)
        for _, row in manifest_rows(manifest):
            name = row.get("wav_filename", "")
            audio = str(Path(name) if Path(name).is_absolute() or not name else folder / name)
            kept = [audio, row.get("wav_filesize", ""), row.get("offset", ""), row.get("duration", "")]
            try:
                transcript = "" if "_fields" in row else normalise_transcript(row.get("transcript", ""), text)
            except TranscriptRejected:
                transcript = ""
            yield kept, transcript


def _build(layout: Layout, staging: PhonemesFiles, progress: Callable[[int], None]) -> PhonemesReport:
    started = time.time()
    of = layout.config.phonemes_of
    source = layout.for_task(of)
    text = source.config.data.text
    voice = phoneme_voice(text.language)
    check_voice(voice)
    workers = layout.config.features.workers or os.cpu_count() or 1  # espeak-ng processes at once
    rows, empty, done = {}, {}, 0
    for split in SPLITS:
        if not source.config.has_split(split):
            continue
        rows[split] = empty[split] = 0
        with open(staging.manifest(split), "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            pending = _rows(source.source_manifests(split), text)
            while block := list(islice(pending, BLOCK)):
                spoken = phonemize((transcript for _, transcript in block), voice, workers)
                for ((audio, size, offset, duration), _), ipa in zip(block, spoken, strict=True):
                    writer.writerow([audio, size, ipa, offset, duration])
                    empty[split] += not ipa
                rows[split] += len(block)
                done += len(block)
                progress(done)
    report = PhonemesReport(
        fingerprint=layout.fingerprint("phonemes"),
        of=of,
        voice=voice,
        espeak=espeak_version(),
        rows=rows,
        empty=empty,
        wall_time_s=round(time.time() - started, 2),
    )
    write_report(staging.report, report)
    return report
