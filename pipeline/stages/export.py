"""Export: the best-dev checkpoint as SavedModel, frozen GraphDef and TFLite (and ONNX), with metadata and
the model card.

The export is assembled in a hidden staging directory inside its destination, with
a manifest of every file's SHA-256 and size, and published only when complete: each
of its files and folders is exchanged with the old one in one step (``metadata.json``
last), so a crash never leaves a half export that a client or a rerun would trust,
and no file of it is ever missing. Publishing touches only what an export writes:
other files in ``paths.export_dir`` (numbered versions, a user's own) stay, and the
directory itself is never renamed, so it may be a mount point.

With ``export.versioned`` each export claims the next number by creating its
directory (``mkdir`` is atomic, on NFS too): two exports at once never share a
number. Every export holds the lock inside its destination (``locks.stage_lock``)
while it runs, so its staging directory is removed by another run only when it
is dead, whichever machine it ran on.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from native_client.metadata import MANIFEST_NAME, METADATA_NAME, write_manifest
from pipeline.dag import Stage, alphabet_of, decoding_of, exported, is_instance, task_param
from pipeline.decode.settings import decoder_settings
from pipeline.export.coqui_tflite import write_coqui_tflite
from pipeline.export.model_card import card_language, write_model_card
from pipeline.features.frontend import feature_pipeline
from pipeline.files import publish_entries, remove_leftovers
from pipeline.layout import Layout
from pipeline.lm.files import lm_built
from pipeline.locks import in_use, lock_path, stage_lock
from pipeline.model import model_family
from pipeline.model.labels import model_alphabet
from pipeline.reports import report_to_dict, write_report
from pipeline.workdir import EXPORT_STAGING_PREFIX, LEFTOVER_PATTERNS, ExportFiles

log = logging.getLogger(__name__)


STAGE = Stage(
    "export",
    "Export",
    params=("task",),
    upstream=lambda config, params: [
        ("train", {}),
        *decoding_of(config, params),
        *alphabet_of(config, params),
        *([("evaluate", task_param(params))] if config.export.card.evaluation else []),
    ],
    runs=lambda config, params: is_instance(config, params) and exported(config, params),
)


def claim_version(root: Path) -> int:
    """The next free version number below ``root``, claimed by creating its directory: of two exports
    claiming at once, one gets the number and the other the next one."""
    root.mkdir(parents=True, exist_ok=True)
    numbers = [int(p.name) for p in root.iterdir() if p.name.isdigit()]
    version = max(numbers, default=0) + 1
    while True:
        try:
            (root / str(version)).mkdir()
            return version
        except FileExistsError:
            version += 1


def remove_abandoned_versions(root: Path) -> list[Path]:
    """Remove numbered versions below ``root`` that a killed export claimed and never finished: no
    ``metadata.json``, a lock file that no live process holds. (A claim without a lock file yet is a
    starting export and is left alone.)"""
    removed = []
    for version in root.iterdir() if root.is_dir() else ():
        lock = lock_path(version, inside=True)
        if (
            version.name.isdigit()
            and version.is_dir()
            and not (version / METADATA_NAME).exists()
            and lock.exists()
            and in_use(version) is None
        ):
            shutil.rmtree(version, ignore_errors=True)
            removed.append(version)
    if removed:
        log.info("Removed versions killed exports left unfinished: %s", ", ".join(str(p) for p in removed))
    return removed


def export_stage(
    layout: Layout,
    checkpoint: str | Path | None = None,
    on_status: Callable[[str, float], None] = lambda message, percent: None,
    with_lm: bool | None = None,
) -> ExportFiles:
    """Export the best-dev checkpoint (or ``checkpoint``, or with ``export.average`` and no ``checkpoint``
    the average of several) to ``paths.export_dir``; returns the export.

    With ``export.versioned`` each export goes to a new numbered directory below it. The
    LanguageModel stage's LM and vocabulary are copied in (``with_lm=None``: when it has run). A task's
    layout of a multi-task config exports that task: the shared encoder with its head (or network), its
    alphabet, LM and decoder settings, ``"task"`` in ``metadata.json``, under ``<export_dir>/<task>``.
    """
    root = layout.export_root
    root.mkdir(parents=True, exist_ok=True)
    version = None
    if layout.config.export.versioned:
        remove_abandoned_versions(root)
        version = claim_version(root)
    destination = layout.export_destination(version)
    with stage_lock(destination.root, inside=True):
        # Every export into this directory stages under this lock: the staging directories found now are dead.
        remove_leftovers(destination.root, LEFTOVER_PATTERNS, locked_prefixes=(EXPORT_STAGING_PREFIX,))
        metadata = _export(layout, destination, version, checkpoint, on_status, with_lm)
    on_status(f"exported to {destination.root}", 100)
    log.info("Exported %s (step %s) to %s", metadata.checkpoint, metadata.global_step, destination.root)
    return destination


def _export(layout, destination: ExportFiles, version, checkpoint, on_status, with_lm):
    """Assemble the export in a staging directory inside ``destination`` and publish it there."""
    # TensorFlow is loaded here, not when the DAG reads this module's declaration.
    import tensorflow as tf

    from pipeline.export.inference_graph import (
        SIGNATURE,
        InferenceGraph,
        tensor_names,
        transducer_entry,
        transducer_head,
    )
    from pipeline.export.onnx_export import write_onnx
    from pipeline.export.writers import build_metadata, copy_language_model, write_frozen_graph, write_tflite
    from pipeline.model.averaging import stage_model

    config = layout.config
    staging = ExportFiles(destination.staging())
    shutil.rmtree(staging.root, ignore_errors=True)
    staging.root.mkdir(parents=True)
    try:
        on_status("loading the trained model", 0)
        alphabet = model_alphabet(layout.config, layout.alphabet)
        n_input = feature_pipeline(config.features).feature_size
        model, prefix, averaging = stage_model(
            config, layout.train_run, checkpoint, n_input, alphabet.n_classes
        )
        family = model_family(config.model.architecture)
        form = family.streaming(model, config.export.n_steps)
        batched = form is not None and form.batched
        names = tensor_names(family.state(config.model) if form else (), batched, form is not None)
        head = transducer_head(model)
        metadata = build_metadata(
            config,
            alphabet,
            prefix,
            version or 1,
            n_input,
            names,
            train_report=layout.train_run.report,
            fingerprint=layout.export_fingerprint,
            train_fingerprint=layout.train_fingerprint,
            transducer=transducer_entry(head) if head is not None else None,
        )
        graph = InferenceGraph(model, config.export.n_steps, report_to_dict(metadata))
        on_status("writing the SavedModel", 10)
        tf.saved_model.save(
            graph,
            str(staging.file("saved_model")),
            signatures=graph.signatures(),
        )
        on_status("freezing the graph", 40)
        frozen = write_frozen_graph(graph, staging.file("frozen_graph"))
        on_status("converting to TFLite" + (" (int8 dynamic range)" if config.export.quantize else ""), 55)
        write_tflite(
            staging.file("saved_model"),
            staging.file("tflite"),
            config.export.quantize,
            batched,
            names["signature"],
            transducer=head is not None,
        )
        if config.export.onnx:
            if not names["state"] and names["signature"] != SIGNATURE:
                raise ValueError(
                    f"{config.source}: export.onnx: the {config.model.architecture} family has no streaming "
                    f"form; model.onnx holds the streaming step only (set export.onnx: false)"
                )
            on_status("converting to ONNX", 70)
            write_onnx(staging.file("saved_model"), staging.file("onnx"))
        if config.export.coqui_tflite:
            on_status("converting to the Coqui STT layout", 75)
            write_coqui_tflite(
                model,
                feature_pipeline(config.features),
                alphabet,
                staging.file("coqui_tflite"),
                config.export.n_steps,
                config.decoder.beam_width,
                config.export.quantize,
                card_language(config),
            )
        if alphabet.output == "characters":  # byte labels need no file
            staging.file("alphabet").write_text(alphabet.to_text(), encoding="utf-8")
        decoder = None
        # a transducer reads no LM (shallow fusion is not built): an LM built for the same data stays out
        if head is None and (with_lm or (with_lm is None and lm_built(layout.lm))):
            on_status("copying the language model", 90)
            settings = decoder_settings(config, layout.tune_report)
            decoder = copy_language_model(config, layout.lm, settings, staging)
        on_status("writing metadata", 95)
        metadata = dataclasses.replace(metadata, frozen_graph=frozen, decoder=decoder)
        card = write_model_card(
            config,
            metadata,
            staging.root,
            train_report=layout.train_run.report,
            evaluation_report=layout.evaluation_report(layout.evaluate_dir),
            average=averaging and averaging.to_dict(),
        )
        metadata = dataclasses.replace(metadata, card=card)
        write_report(staging.metadata, metadata)
        write_manifest(staging.root)
        publish_entries(
            staging.root,
            destination.root,
            last=(MANIFEST_NAME, METADATA_NAME),
            replaced=destination.written_entries(),
        )
    finally:
        shutil.rmtree(staging.root, ignore_errors=True)
    return metadata
