"""The Clean stage (``data.clean``, off unless its model is set): every utterance of the cleaned splits
(``data.clean.splits``, default train and dev) scored against a model, the suspect transcripts left out of
the manifests the later stages read.

It reads each cleaned split's manifests as the data gives them (``data.<split>_files`` and every corpus's,
imported or aligned) and writes, in ``clean/<fingerprint>/``: a manifest per cleaned split (absolute audio
paths, segments and speakers kept, the transcripts as written), ``rejects.csv`` (the suspect rows:
``wav_filename,reason,cer,score,...``), ``scores.csv`` (every row's scores, worst first: the file a person
reads to fix a corpus) and ``report.json`` (last). Alphabet, Features and the LanguageModel then read the
cleaned manifest of a cleaned split (``Layout.split_manifests``); a split not cleaned is read as before.

Resumable at the row it stopped at: every row's scores go to a scores file (``clean/scores-<key>.csv``,
flushed as it goes), whose key is the model's and the data's but not the thresholds'; a rerun keeps the
rows it holds and scores on from the next, and a config with other thresholds judges the same scores
without scoring again. The outputs are written in a staging folder and renamed into place whole. Its
fingerprint: ``data.clean``, the scoring model's digest and the fingerprints of what gives the manifests
(imports, alignments; ``data.*_files`` by their digests).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import astuple, fields
from pathlib import Path

from pipeline.dag import Stage, is_instance, sources_of, task_config
from pipeline.data.clean import (
    MALFORMED,
    MAX_SUSPECT_SHARE,
    MIN_ROWS_FOR_SHARE,
    SUSPECT,
    Scored,
    judge,
    score_row,
    split_rows,
)
from pipeline.data.importing import MANIFEST_COLUMNS, REPORT_NAME, manifest_name
from pipeline.digests import model_digest
from pipeline.files import remove_leftovers, replace_directory, write_json_atomic
from pipeline.fingerprints import FingerprintInputs
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from pipeline.stages.imports import import_intact
from pipeline.workdir import CLEAN_DIR, LEFTOVER_PATTERNS

log = logging.getLogger(__name__)

REJECT_COLUMNS = (
    "wav_filename",
    "reason",
    "cer",
    "score",
    "transcript",
    "heard",
    "offset",
    "duration",
    "source",
)
SCORE_COLUMNS = (
    "split",
    "verdict",
    "cer",
    "score",
    "wav_filename",
    "offset",
    "duration",
    "transcript",
    "heard",
    "source",
)
JOURNAL_COLUMNS = tuple(f.name for f in fields(Scored))
# progress(rows scored, rows in all)
ProgressFn = Callable[[int, int], None]


def _clean_inputs(inputs: FingerprintInputs, params: dict) -> dict:
    """The scoring model's digest (or its config's Export fingerprint), and the manifests of
    ``data.*_files`` of the cleaned splits by content (the corpora's come in as their stages'
    fingerprints)."""
    config = task_config(inputs.config, params)
    clean = config.data.clean
    return {
        "model": inputs.model_fingerprint(clean.model),
        "files": {
            split: [inputs.input_digest(path) for path in config.split_files(split)] for split in clean.splits
        },
    }


STAGE = Stage(
    "clean",
    "Clean",
    params=("task",),
    upstream=lambda config, params: sources_of(config, params),
    runs=lambda config, params: (
        is_instance(config, params)
        and bool(task_config(config, params).data.clean.model)
        and not task_config(config, params).phonemes_of
    ),
    derived=_clean_inputs,
    directory=CLEAN_DIR,
    outputs=lambda layout, params: [layout.clean_files.root, layout.clean_files.journal],
)


def clean_stage(layout: Layout, progress: ProgressFn | None = None) -> dict:
    """Score the cleaned splits (the rows the scores file lacks) and write the Clean folder, unless a
    finished one is there; returns its report."""
    files = layout.clean_files
    clean = layout.config.data.clean
    with stage_lock(files.root):
        remove_leftovers(files.root.parent, LEFTOVER_PATTERNS, locked_prefixes=(f".{files.root.name}.",))
        if import_intact(files):
            return json.loads(files.report.read_text(encoding="utf-8"))
        manifests = {split: layout.source_manifests(split) for split in clean.splits}
        # one cheap pass over the manifests for the progress bar's total (scoring costs a thousand times more)
        rows = sum(1 for split in clean.splits for _ in split_rows(split, manifests[split]))
        with stage_lock(files.journal):  # another config with other thresholds shares the scores
            done = _journal_rows(
                files.journal
            )  # rows scored before (by a killed run, or for other thresholds)
            if done < rows:
                _score(layout, manifests, files.journal, done, rows, progress)
            if progress is not None:
                progress(rows, rows)
            staging = files.staging()
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            try:
                report = _write_outputs(files.journal, staging, clean)
                _check_share(report, files.journal, layout.config.source)
                path = layout.model_path(clean.model)
                report["model"] = {"path": str(path), "digest": model_digest(path)}
                report["scores"] = files.journal.name
                names = ["rejects.csv", "scores.csv", *(manifest_name(s) for s in clean.splits)]
                report["files"] = {name: (staging / name).stat().st_size for name in names}
                write_json_atomic(staging / REPORT_NAME, report)
                replace_directory(staging, files.root)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    log.info(
        "Clean: %s",
        ", ".join(f"{s} {r['rejected']} of {r['rows']} rejected" for s, r in report["splits"].items()),
    )
    return report


def _score(layout: Layout, manifests: dict, journal_path: Path, done: int, rows: int, progress) -> None:
    """Score the rows after the first ``done`` of the cleaned splits into the scores file (flushed every
    50 rows)."""
    from native_client.metadata import ExportError
    from pipeline.config import ConfigError
    from pipeline.data.aligner import Aligner

    clean = layout.config.data.clean
    try:
        model = Aligner(layout.model_path(clean.model))
    except (ExportError, OSError, ValueError) as error:
        raise ConfigError(f"{layout.config.source}: data.clean.model: {clean.model}: {error}") from None
    total = done
    with open(journal_path, "a", newline="", encoding="utf-8") as handle:
        journal = csv.writer(handle)
        if done == 0:
            handle.truncate(0)
            journal.writerow(JOURNAL_COLUMNS)
        seen = 0
        for split in clean.splits:
            for source, row in split_rows(split, manifests[split]):
                seen += 1
                if seen <= done:
                    continue
                journal.writerow(astuple(score_row(split, source, row, model)))
                total += 1
                if total % 50 == 0:
                    handle.flush()
                    os.fsync(handle.fileno())
                    if progress is not None:
                        progress(total, rows)


def _check_share(report: dict, journal: Path, source: str) -> None:
    """ConfigError (one line, final) when a split lost more than ``MAX_SUSPECT_SHARE`` of its rows: the
    model does not fit the data. The scores stay in the journal it names."""
    from pipeline.config import ConfigError

    for split, counts in report["splits"].items():
        if counts["rows"] >= MIN_ROWS_FOR_SHARE and counts["rejected"] > MAX_SUSPECT_SHARE * counts["rows"]:
            raise ConfigError(
                f"{source}: data.clean: {counts['rejected']} of {counts['rows']} rows of {split} scored as "
                f"suspect: is data.clean.model a model of this data's language and alphabet? (every row's "
                f"scores: {journal})"
            )


def _journal_rows(journal: Path) -> int:
    """The rows a journal holds whole (a torn last line, from a kill mid-write, is cut off; a journal of
    other columns, from another version, is started again)."""
    try:
        with open(journal, "rb+") as handle:
            data = handle.read()
            whole = data[: data.rfind(b"\n") + 1]
            header = whole.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
            handle.truncate(len(whole) if header == ",".join(JOURNAL_COLUMNS) else 0)
    except FileNotFoundError:
        return 0
    with open(journal, newline="", encoding="utf-8") as handle:
        return max(0, sum(1 for _ in csv.reader(handle)) - 1)


def _write_outputs(journal: Path, out: Path, clean) -> dict:
    """The cleaned manifests, rejects and scores (worst first) from the journal; the report's counts."""
    counts = {split: Counter() for split in clean.splits}
    order: list[tuple[tuple, int]] = []  # (sort key, the row's byte offset in the journal)
    handles = {
        split: open(out / manifest_name(split), "w", newline="", encoding="utf-8") for split in clean.splits
    }
    try:
        writers = {split: csv.writer(h) for split, h in handles.items()}
        for writer in writers.values():
            writer.writerow(MANIFEST_COLUMNS)
        with open(out / "rejects.csv", "w", newline="", encoding="utf-8") as rejects_handle:
            rejects = csv.writer(rejects_handle)
            rejects.writerow(REJECT_COLUMNS)
            for offset, row in _journal(journal):
                row = dataclasses.replace(row, verdict=judge(row, clean.max_cer, clean.min_score))
                counts[row.split]["rows"] += 1
                if row.verdict in (SUSPECT, MALFORMED):
                    counts[row.split]["rejected" if row.verdict == SUSPECT else "malformed"] += 1
                    rejects.writerow(
                        [
                            row.audio,
                            row.verdict,
                            _number(row.cer),
                            _number(row.score),
                            row.transcript,
                            row.heard,
                            row.offset,
                            row.duration,
                            row.source,
                        ]
                    )
                else:
                    counts[row.split]["unscored" if row.verdict == "unscored" else "kept"] += 1
                    writers[row.split].writerow(
                        [row.audio, row.size, row.transcript, row.offset, row.duration, row.speaker]
                    )
                cer = -1.0 if math.isnan(row.cer) else row.cer
                score = math.inf if math.isnan(row.score) else row.score
                order.append(((row.verdict not in (SUSPECT, MALFORMED), -cer, score), offset))
    finally:
        for handle in handles.values():
            handle.close()
    order.sort()
    with open(journal, "rb") as source, open(out / "scores.csv", "w", newline="", encoding="utf-8") as target:
        writer = csv.writer(target)
        writer.writerow(SCORE_COLUMNS)
        for _, offset in order:
            source.seek(offset)
            row = _parse(next(csv.reader([source.readline().decode("utf-8")])))
            row = dataclasses.replace(row, verdict=judge(row, clean.max_cer, clean.min_score))
            writer.writerow(
                [
                    row.split,
                    row.verdict,
                    _number(row.cer),
                    _number(row.score),
                    row.audio,
                    row.offset,
                    row.duration,
                    row.transcript,
                    row.heard,
                    row.source or row.detail,
                ]
            )
    return {
        "thresholds": {"max_cer": clean.max_cer, "min_score": clean.min_score},
        # what Features counts against data.max_reject_fraction: the rows it would have rejected itself
        "rejected_by_split": {
            split: ({MALFORMED: c["malformed"]} if c["malformed"] else {}) for split, c in counts.items()
        },
        "splits": {
            split: {key: c[key] for key in ("rows", "kept", "rejected", "malformed", "unscored")}
            for split, c in counts.items()
        },
    }


def _journal(journal: Path):
    """(byte offset, Scored) of every row of the journal."""
    with open(journal, "rb") as handle:
        handle.readline()
        while True:
            offset = handle.tell()
            line = handle.readline()
            if not line:
                return
            yield offset, _parse(next(csv.reader([line.decode("utf-8")])))


def _parse(values: list[str]) -> Scored:
    """A journal row back as a ``Scored``."""
    row = dict(zip(JOURNAL_COLUMNS, values, strict=True))
    return Scored(**{**row, "cer": float(row["cer"]), "score": float(row["score"])})


def _number(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.3f}"
