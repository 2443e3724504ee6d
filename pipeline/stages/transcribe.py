"""The Transcribe stage: one-shot transcription of a file with the export
(DeepSpeech's ``--one_shot_infer``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from native_client import open_model
from native_client.export_decoder import decoder_for_export
from pipeline.dag import SPLITS, Stage, exported, is_instance, task_param
from pipeline.data.manifests import find_reference
from pipeline.data.text import TranscriptRejected, normalise_transcript
from pipeline.files import write_json_atomic
from pipeline.layout import Layout
from pipeline.workdir import ExportFiles

log = logging.getLogger(__name__)


STAGE = Stage(
    "transcribe",
    "Transcribe",
    params=("audio", "task"),
    upstream=lambda config, params: [("export", task_param(params))],
    runs=lambda config, params: (
        bool(params["audio"]) and is_instance(config, params) and exported(config, params)
    ),
)


def stored_transcript(layout: Layout, export: ExportFiles, audio: str | Path) -> dict | None:
    """The record an earlier Transcribe kept for this very file (its content) and export, or None."""
    try:
        return json.loads(export.transcript(audio, layout.export_fingerprint).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def keep_transcript(layout: Layout, export: ExportFiles, audio: str | Path, record: dict) -> Path | None:
    """Write ``record`` to ``export.transcript(audio)``; returns the path, or None with a one-line warning
    when the export cannot be written (a read-only volume): the record is a convenience, the transcript
    has been printed already."""
    path = export.transcript(audio, layout.export_fingerprint)
    try:
        write_json_atomic(path, record)
    except OSError as error:
        log.warning("%s: the transcript is not kept (%s)", path, error.strerror or error)
        return None
    return path


def transcribe_stage(layout: Layout, export: ExportFiles, audio: str | Path) -> dict:
    """Transcribe ``audio`` with ``export`` (the decoder its metadata names, with its LM); returns the
    record: the text, timings and, when a manifest of the config lists the file, its reference transcript
    (``keep_transcript`` stores it).

    ``export`` is the config's current export (the Export stage's output), so the record is keyed on
    the config's export fingerprint."""
    # The config names the front end and the decoder: their modules (a user's own too) are trusted like the
    # config itself.
    allowed = (layout.config.features.type, layout.config.decoder.type)
    model = open_model(
        export.root,
        decoder_factory=lambda metadata: decoder_for_export(metadata, allowed=allowed),
        plugins=allowed,
    )
    result = model.transcribe_file(audio, convert_rate=layout.config.features.resample)
    manifests = [f for split in SPLITS for f in layout.source_manifests(split)]
    reference = find_reference(manifests, audio)
    if reference is not None:  # as Features made the training text of it (data.text)
        try:
            reference = normalise_transcript(reference, layout.config.data.text)
        except TranscriptRejected:
            pass
    record = {
        **result.to_dict(),
        "reference": reference,
        "decoder": model.decoder.name,
        "export": str(export.root),
        "model_version": model.metadata.model_version,
    }
    return record
