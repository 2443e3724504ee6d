"""Export: the best-dev checkpoint as SavedModel, frozen GraphDef and TFLite, with metadata.

The export is assembled in a hidden staging directory beside its destination, with
a manifest of every file's SHA-256 and size, and exchanged with the old export in
one step only when complete: a crash never leaves a half export that a client or a
rerun would trust, and the export path is never missing.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from native_client.metadata import write_manifest
from pipeline.export.inference_graph import SIGNATURE, InferenceGraph, tensor_names
from pipeline.export.writers import build_metadata, copy_language_model, write_frozen_graph, write_tflite
from pipeline.features.frontend import feature_pipeline
from pipeline.files import remove_leftovers, replace_directory
from pipeline.layout import LEFTOVER_PATTERNS, ExportFiles, Layout
from pipeline.lm.files import lm_built
from pipeline.model import model_family
from pipeline.model.checkpoints import load_trained_model, resolve_checkpoint
from pipeline.reports import write_report
from pipeline.stages.alphabet import model_alphabet

log = logging.getLogger(__name__)


def export_stage(
    layout: Layout,
    checkpoint: str | Path | None = None,
    on_status: Callable[[str, float], None] = lambda message, percent: None,
    with_lm: bool | None = None,
) -> ExportFiles:
    """Export the best-dev checkpoint (or ``checkpoint``) to ``paths.export_dir``; returns the export.

    With ``export.versioned`` each export goes to a new numbered directory below it. The
    LanguageModel stage's LM and vocabulary are copied in (``with_lm=None``: when it has run).
    """
    config = layout.config
    version = max(layout.export_versions(), default=0) + 1 if config.export.versioned else None
    destination = layout.export_destination(version)
    staging = ExportFiles(destination.staging())
    remove_leftovers(destination.root.parent, LEFTOVER_PATTERNS)
    shutil.rmtree(staging.root, ignore_errors=True)
    staging.root.mkdir(parents=True)
    try:
        on_status("loading the best-dev checkpoint", 0)
        alphabet = model_alphabet(layout)
        prefix = resolve_checkpoint(checkpoint or layout.train_run.best)
        n_input = feature_pipeline(config.features).feature_size
        model = load_trained_model(config, prefix, n_input, alphabet.n_classes)
        names = tensor_names(model_family(config.model.architecture).state(config.model))
        metadata = build_metadata(layout, alphabet, prefix, version or 1, n_input, names)
        graph = InferenceGraph(model, config.export.n_steps, dataclasses.asdict(metadata))
        on_status("writing the SavedModel", 10)
        tf.saved_model.save(
            graph,
            str(staging.file("saved_model")),
            signatures={SIGNATURE: graph.stream, "utterance": graph.utterance, "metadata": graph.metadata},
        )
        on_status("freezing the graph", 40)
        frozen = write_frozen_graph(graph, staging.file("frozen_graph"))
        on_status("converting to TFLite" + (" (int8 dynamic range)" if config.export.quantize else ""), 55)
        write_tflite(staging.file("saved_model"), staging.file("tflite"), config.export.quantize)
        if alphabet.output == "characters":  # byte labels need no file
            staging.file("alphabet").write_text(alphabet.to_text(), encoding="utf-8")
        decoder = None
        if with_lm or (with_lm is None and lm_built(layout)):
            on_status("copying the language model", 90)
            decoder = copy_language_model(layout, staging)
        on_status("writing metadata", 95)
        metadata = dataclasses.replace(metadata, frozen_graph=frozen, decoder=decoder)
        write_report(staging.metadata, metadata)
        write_manifest(staging.root)
        replace_directory(staging.root, destination.root)
    except BaseException:
        shutil.rmtree(staging.root, ignore_errors=True)
        raise
    on_status(f"exported to {destination.root}", 100)
    log.info("Exported %s (step %s) to %s", prefix, metadata.global_step, destination.root)
    return destination
