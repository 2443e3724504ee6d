"""The Import stage: one corpus of ``data.corpora`` -> its train/dev/test manifests, rejects and report.

The import (``pipeline.data.importing.import_corpus``) is written into a hidden staging folder beside
the output and renamed into place whole, so the output folder is either a finished import or absent:
a crash (or a kill) leaves at most a staging folder, which the next run removes. ``report.json``
records the size of every file written; ``import_intact`` compares them (a ``stat`` each, the corpus
is never read), so a manifest changed or truncated afterwards makes the import run again.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable

from pipeline.dag import Stage, imports_of, is_instance
from pipeline.data.importing import import_corpus
from pipeline.files import remove_leftovers, replace_directory
from pipeline.fingerprints import FingerprintInputs
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from pipeline.workdir import IMPORT_DIR, LEFTOVER_PATTERNS, ImportFiles

log = logging.getLogger(__name__)

# progress(rows read, rows kept, rows dropped, estimated fraction done)
ProgressFn = Callable[[int, int, int, float], None]


def _corpus_inputs(inputs: FingerprintInputs, params: dict) -> dict:
    """The corpus as resolved (its root, parts and options) and its files' names, sizes and modification
    times (``pipeline.data.importing.import_fingerprint``)."""
    return {"corpus": inputs.import_fingerprint(params["corpus"])}


STAGE = Stage(
    "import",
    "Import",
    params=("corpus", "task"),
    group="Imports",
    runs=lambda config, params: (
        is_instance(config, params)
        and any(
            node == "import" and p["corpus"] == params["corpus"] for node, p in imports_of(config, params)
        )
    ),
    derived=_corpus_inputs,
    directory=IMPORT_DIR,
    outputs=lambda layout, params: [layout.import_files(params["corpus"]).root],
)


def import_intact(files: ImportFiles) -> bool:
    """Whether ``files`` holds a finished import whose files have the sizes its report recorded."""
    try:
        recorded = json.loads(files.report.read_text(encoding="utf-8"))["files"]
        return all((files.root / name).stat().st_size == size for name, size in recorded.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def import_stage(layout: Layout, key: str, progress: ProgressFn | None = None) -> dict:
    """Import corpus ``key`` into its Import folder (``Layout.import_files``) unless a finished import is
    there; returns its report. Two pipelines sharing the import take turns (a lock on the folder)."""
    files = layout.import_files(key)
    with stage_lock(files.root):
        # This corpus's own leftovers are dead (its writers hold this lock); others' by their pid.
        remove_leftovers(files.root.parent, LEFTOVER_PATTERNS, locked_prefixes=(f".{files.root.name}.",))
        if import_intact(files):
            return json.loads(files.report.read_text(encoding="utf-8"))
        if files.root.exists():
            log.warning(
                "%s: an import with files other than its report recorded; importing again", files.root
            )
        plan = layout.import_plan(key)
        # The listing's audio files estimate the rows (exact for LibriSpeech and a folder; a corpus with
        # several utterances per file or files no split lists is reported as done at the end).
        expected = max(layout.import_listing(key).audio_files, 1)

        def report(read: int, kept: int, dropped: int) -> None:
            if progress is not None:
                progress(read, kept, dropped, min(read / expected, 0.99))

        staging = files.staging()
        shutil.rmtree(staging, ignore_errors=True)
        try:
            result = import_corpus(plan, staging, layout.converted_dir, report)
            replace_directory(staging, files.root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if progress is not None:
        progress(result["rows"], result["kept"], result["dropped"], 1.0)
    log.info(
        "Import %s: %d rows, %d kept, %d dropped %s; %s",
        key,
        result["rows"],
        result["kept"],
        result["dropped"],
        result["dropped_by_reason"],
        ", ".join(
            f"{split} {s['utterances']} ({s['hours']:.2f} h, {s['speakers']} speakers)"
            for split, s in result["splits"].items()
        ),
    )
    return result
