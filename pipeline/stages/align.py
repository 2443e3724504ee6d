"""The Align stage: a corpus of long recordings with their whole text (``importer: recordings``) -> its
train/dev/test manifests of utterances, rejects and report, in ``align/<corpus>-<fingerprint>/``.

Each recording (listed, split and checked as the ``folder`` importer's audio files are: its speaker's
split, whole) is run through the aligner model named by the corpus's ``align.model``
(``pipeline.data.aligner``: the client's streaming runtime, posteriors to a scratch file) and its text
cut into utterances by CTC segmentation (``pipeline.data.align``). Its manifests have Import's columns
and a ``score``; Features reads them as it reads an import's, offsets and all.

Rejected and counted (``rejects.csv``, ``report.json``): a recording that cannot be used (missing or
non-UTF-8 text, unreadable audio, a text with no words, a text in a script the aligner's alphabet lacks,
a text longer than its audio could hold), each in one line naming the file, the rest of the corpus going
on; an utterance whose text the audio does not hold or whose score is under ``align.min_score``
(``misaligned``, not counted against ``data.max_reject_fraction``: an unread preface is not a defect).

Resumable at the recording it stopped at: each recording's result is kept in ``.<folder>.aligned/`` beside
the output as soon as it is found, and a rerun takes it from there; the output is written in a staging
folder and renamed into place whole, its report last.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from native_client.audio import AudioError
from pipeline.dag import Stage, imports_of, is_instance
from pipeline.data.align_recording import MISALIGNED, align_recording
from pipeline.data.importers import Dropped, Utterance
from pipeline.data.importing import (
    DUPLICATE,
    MANIFEST_COLUMNS,
    REJECTS_NAME,
    REPORT_NAME,
    AudioHeaders,
    audio_identity,
    manifest_name,
    part_splits,
)
from pipeline.data.splits import SPLITS, split_of
from pipeline.digests import model_digest
from pipeline.files import atomic_path, remove_leftovers, replace_directory, write_json_atomic
from pipeline.fingerprints import FingerprintInputs
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from pipeline.stages.imports import import_intact
from pipeline.workdir import ALIGN_DIR, LEFTOVER_PATTERNS, ImportFiles

log = logging.getLogger(__name__)

COLUMNS = (*MANIFEST_COLUMNS, "score")
REJECT_COLUMNS = ("source", "audio", "reason", "detail", "offset", "duration", "score")
# progress(recordings done, recordings in all (an estimate), hours of audio aligned)
ProgressFn = Callable[[int, int, float], None]


def _align_inputs(inputs: FingerprintInputs, params: dict) -> dict:
    """The recordings and their texts (names, sizes, modification times: the import fingerprint, which
    holds the ``align`` settings too) and the aligner model's digest."""
    return {
        "corpus": inputs.import_fingerprint(params["corpus"]),
        "aligner": inputs.model_fingerprint(inputs.aligner(params["corpus"])),
    }


STAGE = Stage(
    "align",
    "Align",
    params=("corpus", "task"),
    group="Alignments",
    runs=lambda config, params: (
        is_instance(config, params)
        and ("align", {"corpus": params["corpus"]}) in _corpus_nodes(config, params)
    ),
    derived=_align_inputs,
    directory=ALIGN_DIR,
    outputs=lambda layout, params: [
        layout.align_files(params["corpus"]).root,
        aligned_dir(layout.align_files(params["corpus"])),
    ],
)


def _corpus_nodes(config, params: dict) -> list:
    return [(name, {"corpus": p["corpus"]}) for name, p in imports_of(config, params)]


def aligned_dir(files: ImportFiles) -> Path:
    """Where the recordings aligned so far are kept until the output is whole (a rerun resumes there)."""
    return files.root.with_name(f".{files.root.name}.aligned")


def align_stage(layout: Layout, key: str, progress: ProgressFn | None = None) -> dict:
    """Align corpus ``key`` into its Align folder unless a finished one is there; returns its report."""
    files = layout.align_files(key)
    with stage_lock(files.root):
        remove_leftovers(files.root.parent, LEFTOVER_PATTERNS, locked_prefixes=(f".{files.root.name}.",))
        if import_intact(files):
            return json.loads(files.report.read_text(encoding="utf-8"))
        plan = layout.import_plan(key)
        model = layout.model_path(layout.aligner(key))
        from native_client.metadata import ExportError
        from pipeline.config import ConfigError
        from pipeline.data.aligner import Aligner

        try:
            aligner = Aligner(model)
        except (ExportError, OSError, ValueError) as error:
            where = f"data.corpora[{layout.corpora[key][0]}].align.model"
            raise ConfigError(f"{layout.config.source}: {where}: {model}: {error}") from None
        done = aligned_dir(files)
        done.mkdir(parents=True, exist_ok=True)
        staging = files.staging()
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            expected = max(layout.import_listing(key).audio_files, 1)
            report = _align_corpus(plan, aligner, staging, done, layout.converted_dir, expected, progress)
            report["aligner"] = {"model": str(model), "digest": model_digest(model)}
            report["files"] = {
                name: (staging / name).stat().st_size
                for name in (REJECTS_NAME, *(manifest_name(s) for s in SPLITS))
            }
            write_json_atomic(staging / REPORT_NAME, report)
            replace_directory(staging, files.root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(done, ignore_errors=True)
    log.info(
        "Align %s: %d recordings (%.2f h), %d utterances kept, %d dropped %s",
        key,
        report["recordings"],
        report["hours"],
        report["kept"],
        report["dropped"],
        report["dropped_by_reason"],
    )
    return report


def _align_corpus(
    plan, aligner, out_dir: Path, done: Path, convert_dir: Path, expected: int, progress
) -> dict:
    """Every recording of ``plan`` aligned (or taken from ``done``) into the manifests and rejects of
    ``out_dir``; the report (without its file sizes). As Import does: a format libsndfile cannot read is
    converted once into ``convert_dir``, and the same recording reached twice (a symbolic link) is taken
    once (``duplicate_audio``, not a reject)."""
    headers, taken = AudioHeaders(convert_dir), set()
    dropped, rejected = Counter(), {split: Counter() for split in SPLITS}
    tallies = {
        split: {"utterances": 0, "seconds": 0.0, "recordings": 0, "speakers": set()} for split in SPLITS
    }
    recordings, seconds = 0, 0.0
    with (
        open(out_dir / REJECTS_NAME, "w", newline="", encoding="utf-8") as rejects_handle,
        _Manifests(out_dir) as manifests,
    ):
        rejects = csv.writer(rejects_handle)
        rejects.writerow(REJECT_COLUMNS)
        for part, official in part_splits(plan):
            for row in plan.importer.utterances(plan.root, part, plan.options):
                if isinstance(row, Dropped):
                    split = official or "train"
                    result = _dropped(row.source, row.audio, row.reason, row.detail)
                else:
                    split = official or split_of(row.speaker, plan.fractions, plan.spec.salt)
                    result = _recording_result(row, plan, aligner, done, headers, taken)
                recordings += 1
                seconds += result["seconds"]
                for reject in result["rejects"]:
                    rejects.writerow(reject)
                    dropped[reject[2]] += 1
                    if reject[2] not in (MISALIGNED, DUPLICATE):
                        rejected[split][reject[2]] += 1
                tally = tallies[split]
                for utterance in result.get("utterances", ()):
                    manifests.write(split, [*utterance[:5], row.speaker, utterance[5]])
                    tally["utterances"] += 1
                    tally["seconds"] += float(utterance[4])
                    tally["speakers"].add(row.speaker)
                tally["recordings"] += bool(result.get("utterances"))
                if progress is not None:
                    progress(recordings, max(expected, recordings), seconds / 3600)
    kept = sum(t["utterances"] for t in tallies.values())
    return {
        "importer": plan.importer.name,
        "root": str(plan.root),
        "recordings": recordings,
        "hours": round(seconds / 3600, 6),
        "kept": kept,
        "dropped": sum(dropped.values()),
        "dropped_by_reason": dict(dropped.most_common()),
        "rejected_by_split": {split: dict(rejected[split].most_common()) for split in SPLITS},
        "splits": {
            split: {
                "utterances": t["utterances"],
                "hours": round(t["seconds"] / 3600, 6),
                "recordings": t["recordings"],
                "speakers": len(t["speakers"]),
            }
            for split, t in tallies.items()
        },
    }


class _Manifests:
    """The train/dev/test manifests of an Align folder, written through temporary names."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir

    def __enter__(self):
        import contextlib

        self._stack = contextlib.ExitStack()
        self.writers = {}
        for split in SPLITS:
            tmp = self._stack.enter_context(atomic_path(self.out_dir / manifest_name(split)))
            handle = self._stack.enter_context(open(tmp, "w", newline="", encoding="utf-8"))
            self.writers[split] = csv.writer(handle)
            self.writers[split].writerow(COLUMNS)
        return self

    def write(self, split: str, row: list) -> None:
        """One utterance of ``split``."""
        self.writers[split].writerow(row)

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)


def _dropped(source: str, audio: str, reason: str, detail: str) -> dict:
    """The result of a row that is no recording to align."""
    return {"rejects": [[source, audio, reason, detail, "", "", ""]], "seconds": 0}


def _recording_result(row: Utterance, plan, aligner, done: Path, headers: AudioHeaders, taken: set) -> dict:
    """The utterances and rejects of one recording: kept in ``done`` from an earlier run, else aligned
    now and kept there at once (a rerun after a crash resumes after it)."""
    identity = audio_identity(row)
    if identity in taken:
        real = os.path.realpath(row.audio)
        return _dropped(row.source, row.audio, DUPLICATE, f"{real}: the same audio as an earlier recording")
    taken.add(identity)
    key = hashlib.blake2b(f"{row.audio}\0{row.source}".encode(), digest_size=12).hexdigest()
    kept = done / f"{key}.json"
    try:
        return json.loads(kept.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    try:
        audio, info = headers.get(row)
    except AudioError as error:
        return _dropped(row.source, row.audio, error.reason, str(error))
    with tempfile.TemporaryDirectory(dir=done) as scratch:
        result = align_recording(
            row, audio, info, plan.spec.text, plan.options.align, aligner, Path(scratch) / "posteriors"
        )
    write_json_atomic(kept, result)
    return result
